//! The grace period between soft and hard delete: undo and reinstalls.
//!
//! With `[hard_delete] grace_period` > 0 the worker soft-deletes the tenant, writes
//! `progress.grace_until` and hands the job back `queued` until then (not an attempt). Meanwhile:
//! - [`undo`] (`deprov jobs undo`, `POST /v1/jobs/{id}/undo`) runs `[soft_delete] undo_statements`
//!   on the target and cancels the job;
//! - [`reinstall`] (a source's `restore_events`, `POST /v1/reinstallations`) does the same for the
//!   tenant's pending job, found through its requests.
//!
//! Both are refused once the hard delete has started: the worker stamps
//! `deprov.jobs.hard_delete_started_at` ([`mark_hard_delete_started`]) in the state database before
//! its first hard-delete statement, guarded by its lease, and an undo locks the job row and acts
//! only on a job no worker holds. So either the stamp is there (refused, and said so) or no
//! hard-delete statement ran and none will (the job ends `cancelled`).
//!
//! Order of the two databases: the job row is locked (state database), the undo statements commit
//! on the target, then the job's cancellation and the audit entry commit. If that last commit fails
//! the tenant is restored while the job is still pending: the undo statements must be idempotent,
//! and the undo can simply be repeated.

use sqlx::{PgConnection, PgExecutor, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit;
use crate::engine::{self, BatchLimits, EngineError};

/// The target side of an undo: where and what to run.
#[derive(Debug, Clone, Copy)]
pub struct UndoTarget<'a> {
    /// The target (application) database.
    pub pool: &'a PgPool,
    /// `[soft_delete] undo_statements`, `$1` = the tenant key.
    pub statements: &'a [String],
    /// Bounds of the undo transaction (`[hard_delete] lock_timeout` / `statement_timeout`).
    pub limits: BatchLimits,
}

impl<'a> UndoTarget<'a> {
    /// The undo as configured in `config`, on `pool`.
    pub fn new(pool: &'a PgPool, config: &'a crate::config::Config) -> Self {
        Self {
            pool,
            statements: &config.soft_delete.undo_statements,
            limits: BatchLimits::from(&config.hard_delete),
        }
    }
}

/// Why an undo was not done.
#[derive(Debug, thiserror::Error)]
pub enum GraceError {
    /// No job with this ID.
    #[error("no job {0}")]
    NotFound(Uuid),
    /// The hard delete of the job started at this time: the rows are going or gone, nothing can
    /// be undone.
    #[error(
        "the hard delete of job {job} started at {at}: nothing to undo (rows are being or were deleted)"
    )]
    HardDeleteStarted {
        /// The job.
        job: Uuid,
        /// When its hard delete started.
        at: String,
    },
    /// The job's state does not allow it (running, completed).
    #[error("{0}")]
    Conflict(String),
    /// `[soft_delete] undo_statements` is empty.
    #[error("no [soft_delete] undo_statements are configured: a soft delete cannot be undone")]
    NotConfigured,
    /// The undo statements failed on the target (nothing was changed in the state database).
    #[error("the undo statements failed: {0}")]
    Engine(#[from] EngineError),
    /// State database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// What an undo did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Undone {
    /// The job, now `cancelled`.
    pub job_id: Uuid,
    /// Its state before.
    pub previous_state: String,
    /// The tenant whose soft delete was undone (`None`: the job had not resolved a tenant, so no
    /// soft delete had run).
    pub tenant_id: Option<String>,
    /// Whether the undo statements ran (a tenant, and undo statements configured).
    pub restored: bool,
    /// Rows the undo statements affected.
    pub restored_rows: u64,
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Stamps `hard_delete_started_at` (once) on job `id` held by `worker`, unless an operator asked to
/// cancel it. Run it before the first hard-delete statement of every run. Returns the stamp, or
/// `None` when the worker no longer holds the job or a cancel was requested: then it must not
/// start.
///
/// # Errors
/// Database errors.
pub async fn mark_hard_delete_started(
    db: impl PgExecutor<'_>,
    id: Uuid,
    worker: &str,
) -> Result<Option<OffsetDateTime>, sqlx::Error> {
    crate::db::query_scalar(
        "UPDATE deprov.jobs SET hard_delete_started_at = coalesce(hard_delete_started_at, now()), \
           updated_at = now() \
         WHERE id = $1 AND lease_owner = $2 AND state = 'running' AND cancel_requested_at IS NULL \
         RETURNING hard_delete_started_at",
    )
    .bind(id)
    .bind(worker)
    .fetch_optional(db)
    .await
}

#[derive(Debug, sqlx::FromRow)]
struct Locked {
    id: Uuid,
    state: String,
    tenant_id: Option<String>,
    hard_delete_started_at: Option<OffsetDateTime>,
    undone_at: Option<OffsetDateTime>,
}

/// Runs the undo statements for `job`'s tenant, cancels the job and records `action`.
async fn restore(
    conn: &mut PgConnection,
    target: UndoTarget<'_>,
    job: &Locked,
    actor: &str,
    action: &str,
    reason: &str,
) -> Result<Undone, GraceError> {
    // A key the undo statements cannot take was never soft-deleted: nothing to restore.
    let restored_rows = match &job.tenant_id {
        Some(tenant) if !target.statements.is_empty() => {
            engine::undo_soft_delete(target.pool, target.statements, tenant, &target.limits).await?
        }
        _ => None,
    };
    let (restored, rows) = (restored_rows.is_some(), restored_rows.unwrap_or(0));
    crate::db::query(
        "UPDATE deprov.jobs SET state = 'cancelled', finished_at = coalesce(finished_at, now()), \
           cancel_requested_at = coalesce(cancel_requested_at, now()), \
           undone_at = CASE WHEN $2 THEN now() ELSE undone_at END, \
           last_error = CASE WHEN $2 THEN 'soft delete undone: ' ELSE 'cancelled: ' END || $3, \
           progress = progress - 'grace_until' \
             || jsonb_build_object('note', CASE WHEN $2 THEN 'soft delete undone; the tenant is restored' \
                                                ELSE 'cancelled before any soft delete' END), \
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now() \
         WHERE id = $1",
    )
    .bind(job.id)
    .bind(restored)
    .bind(reason)
    .execute(&mut *conn)
    .await?;
    let undone = Undone {
        job_id: job.id,
        previous_state: job.state.clone(),
        tenant_id: job.tenant_id.clone(),
        restored,
        restored_rows: rows,
    };
    let details = serde_json::json!({
        "outcome": if restored { "undone" } else { "cancelled" },
        "previous_state": job.state, "tenant_id": job.tenant_id, "restored_rows": rows,
    });
    audit::record(
        &mut *conn,
        actor,
        action,
        Some(&format!("job:{}", job.id)),
        reason,
        &details,
    )
    .await?;
    Ok(undone)
}

/// Undoes job `id`'s soft delete and cancels it (see the module docs), recording `job.undo` by
/// `actor` for `reason`. Allowed for a `queued`, `held`, `failed` or `cancelled` job whose hard
/// delete has not started; run it in the caller's state-database transaction and commit.
///
/// # Errors
/// [`GraceError::HardDeleteStarted`] once the hard delete started; [`GraceError::Conflict`] for a
/// running or completed job; [`GraceError::NotConfigured`] without undo statements; not found,
/// target and database errors.
pub async fn undo(
    conn: &mut PgConnection,
    target: UndoTarget<'_>,
    id: Uuid,
    actor: &str,
    reason: &str,
) -> Result<Undone, GraceError> {
    if target.statements.is_empty() {
        return Err(GraceError::NotConfigured);
    }
    let job: Locked = crate::db::query_as(
        "SELECT id, state, tenant_id, hard_delete_started_at, undone_at FROM deprov.jobs \
         WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(GraceError::NotFound(id))?;
    if let Some(at) = job.hard_delete_started_at {
        return Err(GraceError::HardDeleteStarted {
            job: id,
            at: rfc3339(at),
        });
    }
    match job.state.as_str() {
        "queued" | "held" | "failed" | "cancelled" => {
            restore(conn, target, &job, actor, "job.undo", reason).await
        }
        "running" => Err(GraceError::Conflict(format!(
            "job {id} is running: a worker holds it right now. Cancel it (`deprov jobs cancel`), \
             then undo once it has ended cancelled"
        ))),
        other => Err(GraceError::Conflict(format!(
            "job {id} is {other} without having started a hard delete: nothing to undo"
        ))),
    }
}

/// What a reinstall did to the tenant's pending deletion.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Reinstalled {
    /// The pending job was cancelled and its soft delete undone (or it had not soft-deleted yet).
    Undone(Undone),
    /// A worker holds the job right now (before its hard delete): it stops before its next
    /// destructive statement and ends `cancelled`. Send the reinstall again to undo the soft delete.
    CancelRequested {
        /// The job.
        job_id: Uuid,
    },
    /// Other sources requested the tenant's pending deletion too: nothing changed, their requests
    /// still stand (an operator may cancel the job: `deprov jobs cancel`).
    RequestedByOthers {
        /// The job.
        job_id: Uuid,
        /// The other sources that requested it, by name.
        sources: Vec<String>,
    },
    /// The hard delete started: nothing to undo.
    TooLate {
        /// The job.
        job_id: Uuid,
        /// When its hard delete started (RFC 3339).
        hard_delete_started_at: String,
        /// Its state.
        state: String,
    },
    /// No deletion is pending for the tenant (none ever, or already undone, or completed without
    /// deleting anything).
    NothingPending {
        /// The tenant's latest job, if any.
        job_id: Option<Uuid>,
    },
}

/// The subject a reinstall names: as a deletion request of the same source would.
#[derive(Debug, Clone, Copy)]
pub struct ReinstallOf<'a> {
    /// `tenant`, `lookup` (`{source}:{value}`) or `vercel_installation`.
    pub subject_kind: &'a str,
    /// The subject as stored on the source's requests.
    pub subject: &'a str,
    /// The tenant key, when the subject is one.
    pub tenant: Option<&'a str>,
    /// The source reporting the reinstall: only a job this source requested is found, and only
    /// while no other source's request for it stands. `None`: the tenant's job, whoever asked
    /// (`[sources.NAME] reinstalls = "any"`).
    pub source: Option<&'a str>,
}

/// A reinstall of the tenant `of` names (see the module docs): finds the tenant's latest job (an
/// active one first) that `of.source` requested (any job of the tenant when `of.source` is
/// `None`), through its requests' subject and its resolved tenant — a source's reinstall never
/// reaches a deletion only other sources asked for, unless it may reach any — and:
/// - when other sources requested the job too: changes nothing ([`Reinstalled::RequestedByOthers`]:
///   their requests still stand; an operator may cancel the job);
/// - before its hard delete, not running (`queued`, `held`, or ended `cancelled` / `failed` and not
///   yet undone): cancels it and undoes its soft delete;
/// - running before its hard delete: asks it to cancel ([`Reinstalled::CancelRequested`]);
/// - after its hard delete started: [`Reinstalled::TooLate`].
///
/// Every outcome is recorded as `job.reinstall` (target `job:<id>`, or `subject:<subject>` when
/// there is no job) by `actor` for `reason`.
///
/// # Errors
/// Target and database errors.
pub async fn reinstall(
    conn: &mut PgConnection,
    target: UndoTarget<'_>,
    of: ReinstallOf<'_>,
    actor: &str,
    reason: &str,
) -> Result<Reinstalled, GraceError> {
    let job: Option<Locked> = crate::db::query_as(
        "SELECT id, state, tenant_id, hard_delete_started_at, undone_at FROM deprov.jobs j \
         WHERE ((j.subject_kind = $1 AND j.subject = $2) OR ($3::text IS NOT NULL AND j.tenant_id = $3) \
            OR j.id IN (SELECT job_id FROM deprov.deletion_requests WHERE subject_kind = $1 AND subject = $2)) \
           AND ($4::text IS NULL OR j.id IN (SELECT job_id FROM deprov.deletion_requests WHERE source = $4)) \
         ORDER BY (j.state IN ('queued', 'held', 'running')) DESC, j.created_at DESC, j.id DESC \
         LIMIT 1 FOR UPDATE",
    )
    .bind(of.subject_kind)
    .bind(of.subject)
    .bind(of.tenant)
    .bind(of.source)
    .fetch_optional(&mut *conn)
    .await?;
    let others: Vec<String> = match (&job, of.source) {
        (Some(job), Some(source)) if job.hard_delete_started_at.is_none() => {
            crate::db::query_scalar(
                "SELECT DISTINCT source FROM deprov.deletion_requests \
                 WHERE job_id = $1 AND source <> $2 ORDER BY source",
            )
            .bind(job.id)
            .bind(source)
            .fetch_all(&mut *conn)
            .await?
        }
        _ => Vec::new(),
    };
    let outcome = match &job {
        None => Reinstalled::NothingPending { job_id: None },
        Some(job) if !others.is_empty() => Reinstalled::RequestedByOthers {
            job_id: job.id,
            sources: others,
        },
        Some(job) => match (job.hard_delete_started_at, job.state.as_str()) {
            (Some(at), state) => Reinstalled::TooLate {
                job_id: job.id,
                hard_delete_started_at: rfc3339(at),
                state: state.to_owned(),
            },
            (None, "queued" | "held") => {
                return Ok(Reinstalled::Undone(
                    restore(conn, target, job, actor, "job.reinstall", reason).await?,
                ));
            }
            (None, "cancelled" | "failed") if job.undone_at.is_none() => {
                return Ok(Reinstalled::Undone(
                    restore(conn, target, job, actor, "job.reinstall", reason).await?,
                ));
            }
            (None, "running") => {
                crate::db::query(
                    "UPDATE deprov.jobs SET cancel_requested_at = coalesce(cancel_requested_at, now()), \
                     updated_at = now() WHERE id = $1",
                )
                .bind(job.id)
                .execute(&mut *conn)
                .await?;
                Reinstalled::CancelRequested { job_id: job.id }
            }
            (None, _) => Reinstalled::NothingPending {
                job_id: Some(job.id),
            },
        },
    };
    let target_label = match &job {
        Some(j) => format!("job:{}", j.id),
        None => format!("subject:{}", of.subject),
    };
    let details = serde_json::to_value(&outcome).unwrap_or_default();
    audit::record(
        &mut *conn,
        actor,
        "job.reinstall",
        Some(&target_label),
        reason,
        &details,
    )
    .await?;
    Ok(outcome)
}
