//! [`apply`]: the actions of a reconcile on what a [`Filter`] selects, paced (see the parent module).

use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Filter, JobRow, ORPHAN_SOURCE, Orphans, ReconcileError, Which, jobs_where, orphans};
use crate::engine::BatchLimits;
use crate::ids::DedupBasis;
use crate::queue::operator::{self, ActionError, Cancelled};
use crate::queue::{audit, intake};

/// Which actions [`apply`] takes.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Actions {
    /// Resume `held` jobs no engaged kill switch blocks.
    #[serde(default)]
    pub resume: bool,
    /// Retry `failed` jobs from their checkpoint.
    #[serde(default)]
    pub retry: bool,
    /// Cancel `queued`, `held` and `running` jobs (needs a narrowing filter).
    #[serde(default)]
    pub cancel: bool,
    /// Create jobs for orphans.
    #[serde(default)]
    pub create_orphan_jobs: bool,
}

/// One thing [`apply`] did (or, rolled back, would do).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Action {
    /// `resume`, `retry`, `cancel` or `create_orphan_job`.
    pub action: String,
    /// The job (for `create_orphan_job`: the job the orphan's request is attached to).
    pub job_id: Uuid,
    /// The tenant, when known.
    pub tenant_id: Option<String>,
    /// The job's state afterwards (`queued`, `held`, `cancelled`, `running` = cancel requested).
    pub state: String,
    /// When the job becomes claimable (RFC 3339), for released jobs.
    pub run_after: Option<String>,
}

/// A selected job [`apply`] left alone, and why.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Skipped {
    /// The action that was not taken.
    pub action: String,
    /// The job.
    pub job_id: Uuid,
    /// Why (e.g. the kill switch that still blocks it).
    pub why: String,
}

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Applied {
    /// Actions taken, released jobs in the order they become claimable.
    pub actions: Vec<Action>,
    /// Selected jobs left alone.
    pub skipped: Vec<Skipped>,
    /// The release rate used, jobs per second.
    pub rate: f64,
}

/// Who acts, why, and how fast released jobs become claimable.
#[derive(Debug, Clone)]
pub struct Acting<'a> {
    /// Recorded as the audit entries' actor (`cli:<name>`, `api:<name>`).
    pub actor: &'a str,
    /// Recorded as their reason.
    pub reason: &'a str,
    /// Jobs per second (> 0).
    pub rate: f64,
    /// `[worker] max_attempts` for jobs created for orphans.
    pub max_attempts: i32,
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Sets `run_after` of queued job `id` to the transaction's start + `slot / rate` seconds; returns it.
async fn pace(
    conn: &mut PgConnection,
    id: Uuid,
    slot: usize,
    rate: f64,
) -> Result<Option<OffsetDateTime>, sqlx::Error> {
    #[allow(clippy::cast_precision_loss)]
    let offset_ms = (slot as f64 / rate * 1000.0).round();
    crate::db::query_scalar(
        "UPDATE deprov.jobs SET run_after = now() + make_interval(secs => $2::float8 / 1000), \
         updated_at = now() WHERE id = $1 AND state = 'queued' RETURNING run_after",
    )
    .bind(id)
    .bind(offset_ms)
    .fetch_optional(&mut *conn)
    .await
}

/// Takes `actions` on what `filter` selects (see the module docs), in the caller's transaction:
/// commit to apply, roll back for a dry run. Held and failed jobs are released first, oldest first,
/// in one paced sequence; then jobs are created for orphans (paced after them); then jobs are
/// cancelled.
///
/// # Errors
/// [`ReconcileError::Invalid`] for cancel together with resume/retry, or cancel without a narrowing
/// filter, or a rate ≤ 0; orphan and database errors.
pub async fn apply(
    conn: &mut PgConnection,
    target: &PgPool,
    orphans_sql: Option<&str>,
    limits: &BatchLimits,
    filter: &Filter,
    actions: Actions,
    acting: &Acting<'_>,
) -> Result<Applied, ReconcileError> {
    check(filter, actions, acting)?;
    let mut release = Release {
        acting,
        slot: 0,
        applied: Applied {
            actions: Vec::new(),
            skipped: Vec::new(),
            rate: acting.rate,
        },
    };
    let mut candidates: Vec<JobRow> = Vec::new();
    if actions.resume {
        candidates.extend(jobs_where(conn, filter, Which::Held).await?);
    }
    if actions.retry {
        candidates.extend(jobs_where(conn, filter, Which::Failed).await?);
    }
    candidates.sort_by_key(|j| (j.created_at, j.job_id));
    for job in candidates {
        if job.state == "held" {
            release.resume(conn, job).await?;
        } else {
            release.retry(conn, job).await?;
        }
    }
    if actions.create_orphan_jobs {
        let found = orphans(conn, target, orphans_sql, limits, filter).await?;
        let Orphans::Found { tenants } = found else {
            return Err(ReconcileError::Invalid(
                "create_orphan_jobs: no [soft_delete] orphans statement is configured".into(),
            ));
        };
        for tenant in tenants {
            release.create_orphan_job(conn, tenant).await?;
        }
    }
    if actions.cancel {
        release.cancel(conn, filter).await?;
    }
    // Once for the whole release, delivered on the caller's commit: idle workers claim the first
    // released job now, not at their next poll.
    if release.applied.actions.iter().any(|a| a.state == "queued") {
        crate::queue::jobs::wake_on_commit(&mut *conn).await?;
    }
    Ok(release.applied)
}

/// Refuses a rate that is not above 0, cancel together with another action, and cancel without a
/// narrowing filter.
fn check(filter: &Filter, actions: Actions, acting: &Acting<'_>) -> Result<(), ReconcileError> {
    if !(acting.rate.is_finite() && acting.rate > 0.0) {
        return Err(ReconcileError::Invalid("rate: must be above 0".into()));
    }
    if actions.cancel && (actions.resume || actions.retry || actions.create_orphan_jobs) {
        return Err(ReconcileError::Invalid(
            "cancel cannot be combined with resume, retry or create_orphan_jobs".into(),
        ));
    }
    if actions.cancel && !filter.is_narrow() {
        return Err(ReconcileError::Invalid(
            "cancel needs a filter (state, source, tenant, ids or received-between): it would cancel every job".into(),
        ));
    }
    Ok(())
}

/// One reconcile's actions as they are taken: what it did, and the next released job's place in
/// the paced sequence.
struct Release<'a> {
    acting: &'a Acting<'a>,
    /// The next release's position in the paced sequence.
    slot: usize,
    applied: Applied,
}

impl Release<'_> {
    /// Paces queued job `id` into the next slot ([`pace`]); returns its `run_after`.
    async fn pace_next(
        &mut self,
        conn: &mut PgConnection,
        id: Uuid,
    ) -> Result<Option<OffsetDateTime>, sqlx::Error> {
        let slot = self.slot;
        self.slot += 1;
        pace(conn, id, slot, self.acting.rate).await
    }

    /// Resumes held `job` unless a kill switch still blocks it (skipped, naming the switch); a
    /// job no longer held is left out.
    async fn resume(&mut self, conn: &mut PgConnection, job: JobRow) -> Result<(), ReconcileError> {
        if let Some(switch) = &job.blocked_by {
            self.applied.skipped.push(Skipped {
                action: "resume".into(),
                job_id: job.job_id,
                why: format!("kill switch {switch} is engaged"),
            });
            return Ok(());
        }
        let moved = crate::db::query(
            "UPDATE deprov.jobs SET state = 'queued', updated_at = now() \
             WHERE id = $1 AND state = 'held' AND deprov.job_blocked_by(id) IS NULL",
        )
        .bind(job.job_id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if moved == 0 {
            return Ok(());
        }
        let id = job.job_id;
        let run_after = self.pace_next(conn, id).await?;
        audit::record(
            &mut *conn,
            self.acting.actor,
            "job.resume",
            Some(&format!("job:{id}")),
            self.acting.reason,
            &serde_json::json!({"previous_state": "held", "new_state": "queued",
                "run_after": run_after.map(rfc3339), "via": "reconcile"}),
        )
        .await?;
        self.applied.actions.push(Action {
            action: "resume".into(),
            job_id: id,
            tenant_id: job.tenant_id,
            state: "queued".into(),
            run_after: run_after.map(rfc3339),
        });
        Ok(())
    }

    /// Retries failed `job` ([`operator::retry`]), paced when it is queued again; a refusal is
    /// skipped with its reason.
    async fn retry(&mut self, conn: &mut PgConnection, job: JobRow) -> Result<(), ReconcileError> {
        let acting = self.acting;
        match operator::retry(conn, job.job_id, acting.actor, acting.reason).await {
            Ok(state) => {
                let run_after = if state == "queued" {
                    self.pace_next(conn, job.job_id).await?
                } else {
                    None
                };
                self.applied.actions.push(Action {
                    action: "retry".into(),
                    job_id: job.job_id,
                    tenant_id: job.tenant_id,
                    state,
                    run_after: run_after.map(rfc3339),
                });
            }
            Err(ActionError::Db(e)) => return Err(e.into()),
            Err(e) => self.applied.skipped.push(Skipped {
                action: "retry".into(),
                job_id: job.job_id,
                why: e.to_string(),
            }),
        }
        Ok(())
    }

    /// Records a request for orphan `tenant` as intake would (source `reconcile`, keyed by the
    /// tenant and how many jobs it had, so a later orphan of the same tenant gets a new job),
    /// paced when it created a queued job.
    async fn create_orphan_job(
        &mut self,
        conn: &mut PgConnection,
        tenant: String,
    ) -> Result<(), ReconcileError> {
        let acting = self.acting;
        let earlier: i64 = crate::db::query_scalar(
            "SELECT count(*) FROM deprov.jobs WHERE tenant_id = $1 \
             OR (subject_kind = 'tenant' AND subject = $1)",
        )
        .bind(&tenant)
        .fetch_one(&mut *conn)
        .await?;
        let key = format!("orphan:{tenant}:{earlier}");
        let req = intake::NewRequest {
            source: ORPHAN_SOURCE.into(),
            basis: DedupBasis::ExternalId,
            dedup_key: key.clone(),
            subject_kind: intake::SubjectKind::Tenant,
            subject: tenant.clone(),
            external_id: Some(key),
            reason: Some(format!("orphan found by reconcile: {}", acting.reason)),
        };
        let accepted = intake::record(conn, &req, acting.max_attempts).await?;
        let run_after = if accepted.state == "queued" && !accepted.duplicate {
            self.pace_next(conn, accepted.job_id).await?
        } else {
            None
        };
        audit::record(
            &mut *conn,
            acting.actor,
            "job.create_orphan",
            Some(&format!("job:{}", accepted.job_id)),
            acting.reason,
            &serde_json::json!({"tenant_id": tenant, "request_id": accepted.request_id,
                "state": accepted.state, "duplicate": accepted.duplicate,
                "run_after": run_after.map(rfc3339)}),
        )
        .await?;
        self.applied.actions.push(Action {
            action: "create_orphan_job".into(),
            job_id: accepted.job_id,
            tenant_id: Some(tenant),
            state: accepted.state,
            run_after: run_after.map(rfc3339),
        });
        Ok(())
    }

    /// Cancels every queued, held or running job `filter` selects, oldest first
    /// ([`operator::cancel`]: a running job is asked to stop); a refusal is skipped with its reason.
    async fn cancel(
        &mut self,
        conn: &mut PgConnection,
        filter: &Filter,
    ) -> Result<(), ReconcileError> {
        let acting = self.acting;
        let ids: Vec<(Uuid, Option<String>)> = bind_filter!(
            crate::db::query_as(concat!(
                "SELECT j.id, j.tenant_id FROM deprov.jobs j \
                 WHERE j.state IN ('queued', 'held', 'running') AND ",
                job_filter!(),
                " ORDER BY j.created_at, j.id"
            )),
            filter
        )
        .fetch_all(&mut *conn)
        .await?;
        for (id, tenant_id) in ids {
            match operator::cancel(conn, id, acting.actor, acting.reason).await {
                Ok(outcome) => self.applied.actions.push(Action {
                    action: "cancel".into(),
                    job_id: id,
                    tenant_id,
                    state: if outcome == Cancelled::Now {
                        "cancelled"
                    } else {
                        "running"
                    }
                    .into(),
                    run_after: None,
                }),
                Err(ActionError::Db(e)) => return Err(e.into()),
                Err(e) => self.applied.skipped.push(Skipped {
                    action: "cancel".into(),
                    job_id: id,
                    why: e.to_string(),
                }),
            }
        }
        Ok(())
    }
}
