//! Jobs: the unit of deletion work, leased by one worker at a time.
//!
//! States: `queued` → `running` → `completed` | `failed`; `held` while a kill switch blocks the job.
//! A running job carries a lease (`lease_owner`, `lease_expires_at`); its owner extends the lease at
//! every batch boundary (the heartbeat). A job whose lease expired is claimable again, so a lost worker's
//! job is taken over. Every state change by a worker is guarded by `lease_owner = $worker AND
//! state = 'running'`: a worker that lost its lease cannot overwrite what the new owner did.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgExecutor;
use time::OffsetDateTime;
use uuid::Uuid;

/// The channel of the `NOTIFY` sent when jobs become claimable — by [`wake_workers`] after intake
/// committed a new queued job, by [`wake_on_commit`] in an operator's retry, kill-switch release or
/// reconcile: idle workers listening on it claim at once instead of at their next poll. No payload.
pub const WAKE_CHANNEL: &str = "deprov_jobs";

/// Sends `NOTIFY deprov_jobs` ([`WAKE_CHANNEL`]) inside the caller's transaction, delivered when it
/// commits and never if it rolls back (PostgreSQL docs, NOTIFY). For the rare transactions that make
/// jobs claimable outside intake — an operator's retry, a kill-switch release, reconcile — where
/// the commit serialization a notification brings costs nothing. Identical notifications of one
/// transaction are delivered once.
///
/// # Errors
/// Database errors.
pub async fn wake_on_commit(db: impl PgExecutor<'_>) -> Result<(), sqlx::Error> {
    crate::db::query("SELECT pg_notify($1, '')")
        .bind(WAKE_CHANNEL)
        .execute(db)
        .await?;
    Ok(())
}

/// Sends `NOTIFY deprov_jobs` ([`WAKE_CHANNEL`]) in a transaction of its own, after (never inside)
/// the transaction that queued a job: PostgreSQL serializes the commits of transactions that sent a
/// notification (PostgreSQL docs, NOTIFY), so a notification inside intake's transaction would make
/// concurrent intakes commit one at a time. The commit is not durable (`synchronous_commit = off`):
/// a notification lost to a crash costs only the wait for the next poll.
///
/// # Errors
/// Database errors; the caller logs them (workers still poll).
pub async fn wake_workers(pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    let mut tx = crate::db::begin(pool, crate::db::Bounds::STATE.deferred()).await?;
    crate::db::query("SELECT pg_notify($1, '')")
        .bind(WAKE_CHANNEL)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// A job's lifecycle state (`deprov.jobs.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for a worker (possibly until `run_after`, after a retryable error).
    Queued,
    /// Waiting for the kill switch to be released.
    Held,
    /// Leased by a worker.
    Running,
    /// Finished: the tenant's rows are gone.
    Completed,
    /// Finished without deleting everything; `last_error` says why.
    Failed,
    /// Stopped by an operator (`deprov jobs cancel`); what was deleted stays deleted.
    Cancelled,
}

impl JobState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Held => "held",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses a stored or query-string name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => Self::Queued,
            "held" => Self::Held,
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

/// A job row (`deprov.jobs`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Job {
    /// Primary key (UUIDv7).
    pub id: Uuid,
    /// `tenant` or `vercel_installation`.
    pub subject_kind: String,
    /// The tenant key, or the installation ID awaiting lookup.
    pub subject: String,
    /// The resolved tenant key, once known.
    pub tenant_id: Option<String>,
    /// See [`JobState`].
    pub state: String,
    /// `resolve`, `soft_delete`, `hard_delete` or `done`.
    pub step: String,
    /// Times the job was claimed (including lease takeovers): the total, for display.
    pub attempts: i32,
    /// Claims since the job last advanced (see [`heartbeat`]): the ones `max_attempts` limits.
    pub stalled_attempts: i32,
    /// Claims in a row that advance nothing allowed before the job fails.
    pub max_attempts: i32,
    /// The latest error, if any.
    pub last_error: Option<String>,
    /// Hard-delete resume point (see `engine::Checkpoint`).
    pub checkpoint: Option<serde_json::Value>,
    /// Progress for operators (see `engine::Progress`).
    pub progress: serde_json::Value,
    /// When the job was created.
    pub created_at: OffsetDateTime,
    /// When a worker first claimed it.
    pub started_at: Option<OffsetDateTime>,
    /// When it reached `completed` or `failed`.
    pub finished_at: Option<OffsetDateTime>,
    /// Not claimable before this time.
    pub run_after: OffsetDateTime,
    /// The worker holding the lease.
    pub lease_owner: Option<String>,
    /// When the lease ends unless renewed.
    pub lease_expires_at: Option<OffsetDateTime>,
}

impl Job {
    /// The parsed state.
    pub fn state(&self) -> JobState {
        JobState::parse(&self.state).unwrap_or(JobState::Failed)
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The columns of [`Job`]: the select list of every query that returns jobs (unqualified; a
/// query joining another relation names that relation's columns apart).
macro_rules! job_columns {
    () => {
        "id, subject_kind, subject, tenant_id, state, step, attempts, stalled_attempts, max_attempts, \
         last_error, checkpoint, progress, created_at, started_at, finished_at, run_after, \
         lease_owner, lease_expires_at"
    };
}

/// One job by ID.
///
/// # Errors
/// Database errors.
pub async fn get(db: impl PgExecutor<'_>, id: Uuid) -> Result<Option<Job>, sqlx::Error> {
    crate::db::query_as(concat!(
        "SELECT ",
        job_columns!(),
        " FROM deprov.jobs WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await
}

/// Jobs newest first, optionally of one state; at most `limit` (1..=1000).
///
/// # Errors
/// Database errors.
pub async fn list(
    db: impl PgExecutor<'_>,
    state: Option<JobState>,
    limit: i64,
) -> Result<Vec<Job>, sqlx::Error> {
    crate::db::query_as(concat!(
        "SELECT ",
        job_columns!(),
        " FROM deprov.jobs WHERE ($1::text IS NULL OR state = $1) \
         ORDER BY created_at DESC, id DESC LIMIT $2"
    ))
    .bind(state.map(JobState::as_str))
    .bind(limit.clamp(1, 1000))
    .fetch_all(db)
    .await
}

/// How long a job handed back `held` waits before a worker may look at it again when no switch
/// blocks it as stored (a tenant switch whose key matches only in the key column's form, or a
/// switch released while the job was being handed back): a re-check, not a busy loop.
pub const HELD_RECHECK: Duration = Duration::from_secs(5);

/// Hands back the `running` jobs whose lease expired (their worker is gone) while a kill switch
/// blocks them (`deprov.job_blocked_by`, the global switch included), which [`claim`] may not take
/// over: each becomes `held` (lease cleared, `run_after = now()`), so the release of its switch
/// queues it like any held job — or `cancelled` when an operator asked for its cancel
/// (`cancel_requested_at`). Without this such a job stayed `running` for as long as the switch was
/// engaged. Workers call it before every [`claim`]; a concurrent call skips the rows another
/// already moved (the `WHERE` is evaluated again on the locked row). Returns how many jobs moved.
///
/// # Errors
/// Database errors.
pub async fn hand_back_stranded(db: impl PgExecutor<'_>) -> Result<u64, sqlx::Error> {
    let r = crate::db::query(
        "UPDATE deprov.jobs SET \
           state = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'held' END, \
           finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END, \
           last_error = CASE WHEN cancel_requested_at IS NOT NULL \
             THEN 'cancelled by an operator while running (the lease of its worker had expired)' ELSE last_error END, \
           lease_owner = NULL, lease_expires_at = NULL, run_after = now(), updated_at = now() \
         WHERE state = 'running' AND lease_expires_at < now() AND deprov.job_blocked_by(id) IS NOT NULL",
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected())
}

/// Leases the oldest claimable job to `worker` for `lease`: a `queued` job whose `run_after` has come, a
/// `held` job no kill switch blocks any more as stored, [`HELD_RECHECK`] after it was handed back
/// (handed back `held` while its switch was being released, or held by a tenant switch written in
/// another form of the key, which the worker checks again),
/// or a `running` job whose lease expired (its worker is gone). No job a kill switch blocks is claimed
/// (`deprov.job_blocked_by`; such an expired job is handed back by [`hand_back_stranded`]); nothing
/// at all while the global switch is engaged. Increments `attempts` (the total) and
/// `stalled_attempts` (claims since the job last advanced, which [`heartbeat`] clears).
///
/// # Errors
/// Database errors.
pub async fn claim(
    db: impl PgExecutor<'_>,
    worker: &str,
    lease: Duration,
) -> Result<Option<Job>, sqlx::Error> {
    crate::db::query_as(concat!(
        "WITH next AS ( \
           SELECT id AS next_id FROM deprov.jobs \
           WHERE (((state = 'queued' OR state = 'held') AND run_after <= now()) \
                  OR (state = 'running' AND lease_expires_at < now())) \
             AND NOT (SELECT engaged FROM deprov.kill_switch) AND deprov.job_blocked_by(id) IS NULL \
           ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
         UPDATE deprov.jobs j SET state = 'running', attempts = j.attempts + 1, \
           stalled_attempts = j.stalled_attempts + 1, lease_owner = $1, \
           lease_expires_at = now() + make_interval(secs => $2::float8 / 1000), heartbeat_at = now(), \
           started_at = coalesce(j.started_at, now()), updated_at = now() \
         FROM next WHERE j.id = next.next_id \
         RETURNING ",
        job_columns!()
    ))
    .bind(worker)
    .bind(millis(lease))
    .fetch_optional(db)
    .await
}

/// Extends the lease and records progress, step and checkpoint: the heartbeat at every batch boundary.
/// Returns the job's `stalled_attempts` after the write, or `None` when `worker` no longer holds the
/// job (lease lost): the caller must stop at once.
///
/// A write that advances the job sets `stalled_attempts` to 0 in the same statement, so the advance
/// is counted even when the run is killed right after it. Compared with what the row holds, a
/// write advances when:
/// * `step` changes (the soft delete committed: `soft_delete` → `hard_delete`);
/// * `progress.rows_deleted` grows;
/// * the first checkpoint is written, or a checkpoint of the same plan (`plan`) names a later step,
///   or the same step at another `cursor` (keyset positions only move forward within a step).
///
/// A renewal that writes the stored checkpoint again, a checkpoint whose batch size shrank after a
/// timeout, or a checkpoint of a new plan back at its first step do not advance the job.
///
/// # Errors
/// Database errors.
pub async fn heartbeat(
    db: impl PgExecutor<'_>,
    id: Uuid,
    worker: &str,
    lease: Duration,
    step: &str,
    checkpoint: Option<&serde_json::Value>,
    progress: &serde_json::Value,
) -> Result<Option<i32>, sqlx::Error> {
    crate::db::query_scalar(
        "UPDATE deprov.jobs SET lease_expires_at = now() + make_interval(secs => $3::float8 / 1000), \
           heartbeat_at = now(), \
           stalled_attempts = CASE WHEN $4 <> step \
               OR coalesce(($6::jsonb ->> 'rows_deleted')::bigint, 0) \
                  > coalesce((progress ->> 'rows_deleted')::bigint, 0) \
               OR ($5::jsonb IS NOT NULL AND (checkpoint IS NULL \
                   OR ($5::jsonb ->> 'plan' = checkpoint ->> 'plan' \
                       AND (($5::jsonb ->> 'step')::bigint > (checkpoint ->> 'step')::bigint \
                            OR (($5::jsonb ->> 'step')::bigint = (checkpoint ->> 'step')::bigint \
                                AND $5::jsonb -> 'cursor' IS DISTINCT FROM checkpoint -> 'cursor'))))) \
             THEN 0 ELSE stalled_attempts END, \
           step = $4, checkpoint = $5, progress = $6, updated_at = now() \
         WHERE id = $1 AND lease_owner = $2 AND state = 'running' \
         RETURNING stalled_attempts",
    )
    .bind(id)
    .bind(worker)
    .bind(millis(lease))
    .bind(step)
    .bind(checkpoint)
    .bind(progress)
    .fetch_optional(db)
    .await
}

/// The tenant that an earlier request for the same subject as job `except` (a Vercel
/// installation, or a value a source's `tenant_lookup` resolves) was resolved to, when the job
/// deleting it has not completed (queued, held, running, failed or cancelled): the newest such
/// request's (`deletion_requests` by `subject_kind`, `subject`). `None` when there is none.
///
/// deprov's own record, read before the target's lookup: once the hard delete has emptied the
/// rows the lookup reads (an `installations` table below the tenant), the lookup finds no tenant
/// while the tenant still exists. A deletion that completed is not a reason to skip the lookup: a
/// later request for the subject may name a tenant created since.
///
/// # Errors
/// Database errors.
pub async fn unfinished_tenant_of_subject(
    db: impl PgExecutor<'_>,
    subject_kind: &str,
    subject: &str,
    except: Uuid,
) -> Result<Option<String>, sqlx::Error> {
    crate::db::query_scalar(
        "SELECT j.tenant_id FROM deprov.deletion_requests r JOIN deprov.jobs j ON j.id = r.job_id \
         WHERE r.subject_kind = $1 AND r.subject = $2 AND r.job_id <> $3 \
           AND j.tenant_id IS NOT NULL AND j.state <> 'completed' \
         ORDER BY r.received_at DESC LIMIT 1",
    )
    .bind(subject_kind)
    .bind(subject)
    .bind(except)
    .fetch_optional(db)
    .await
}

/// What [`resolve_tenant`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The job now deletes this tenant (re-keyed to `subject_kind = 'tenant'`), so later requests
    /// for the tenant attach to it.
    Rekeyed,
    /// Another active job already deletes the tenant: this job's requests were moved to it and this
    /// job completed as merged.
    MergedInto(Uuid),
    /// The worker no longer holds the job.
    LeaseLost,
}

/// Records the tenant a Vercel-installation job resolved to, keeping one active job per tenant: the
/// job is re-keyed to the tenant unless another active job deletes it already, in which case this
/// job's requests are re-pointed to that job (so their status follows it) and this job completes
/// as merged. Runs in one transaction bounded by [`crate::db::Bounds::STATE`].
///
/// # Errors
/// Database errors.
pub async fn resolve_tenant(
    pool: &sqlx::PgPool,
    id: Uuid,
    worker: &str,
    tenant_id: &str,
) -> Result<Resolved, sqlx::Error> {
    let mut tx = crate::db::begin(pool, crate::db::Bounds::STATE).await?;
    let other: Option<Uuid> = crate::db::query_scalar(
        "SELECT id FROM deprov.jobs WHERE subject_kind = 'tenant' AND subject = $1 \
         AND state IN ('queued', 'held', 'running') AND id <> $2 FOR UPDATE",
    )
    .bind(tenant_id)
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let outcome = match other {
        None => {
            let r = crate::db::query(
                "UPDATE deprov.jobs SET subject_kind = 'tenant', subject = $3, tenant_id = $3, updated_at = now() \
                 WHERE id = $1 AND lease_owner = $2 AND state = 'running'",
            )
            .bind(id)
            .bind(worker)
            .bind(tenant_id)
            .execute(&mut *tx)
            .await?;
            if r.rows_affected() == 1 {
                Resolved::Rekeyed
            } else {
                Resolved::LeaseLost
            }
        }
        Some(other) => {
            let r = crate::db::query(
                "UPDATE deprov.jobs SET state = 'completed', step = 'done', tenant_id = $3, finished_at = now(), \
                   lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), \
                   progress = progress || jsonb_build_object('note', 'merged into job ' || $4::text || ', which deletes the same tenant') \
                 WHERE id = $1 AND lease_owner = $2 AND state = 'running'",
            )
            .bind(id)
            .bind(worker)
            .bind(tenant_id)
            .bind(other)
            .execute(&mut *tx)
            .await?;
            if r.rows_affected() == 1 {
                crate::db::query(
                    "UPDATE deprov.deletion_requests SET job_id = $2 WHERE job_id = $1",
                )
                .bind(id)
                .bind(other)
                .execute(&mut *tx)
                .await?;
                Resolved::MergedInto(other)
            } else {
                Resolved::LeaseLost
            }
        }
    };
    tx.commit().await?;
    Ok(outcome)
}

/// How a worker hands a job back.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// All done: `completed`.
    Completed,
    /// Permanent error, or `max_attempts` claims in a row advanced nothing: `failed` with this error.
    Failed(String),
    /// Retryable error: `queued` again after `delay`, with this error recorded.
    RetryAfter(String, Duration),
    /// The kill switch is engaged: `held` until release.
    Held,
    /// Not an error: hand the job back `queued` until `delay` has passed (grace period, worker
    /// shutdown). The claim is not counted as an attempt (neither in `attempts` nor in
    /// `stalled_attempts`).
    Wait(Duration),
    /// An operator cancelled the job while it ran: `cancelled`.
    Cancelled,
}

/// Ends the worker's lease with `outcome`. Returns `false` when the worker no longer held the job (its
/// lease expired and another worker took it over): nothing is changed then. A completed job has
/// advanced, so its `stalled_attempts` is 0 (also when it was deleted in one transaction, with no
/// checkpoint written). A job an operator asked
/// to cancel while it ran ends `cancelled` instead of going back `queued` or `held` (e.g. when it
/// was handed back to wait out its grace period). A job whose `progress.hard_delete_started_at`
/// is set (an RFC 3339 time) while its `hard_delete_started_at` is not — a tenant deleted in one
/// transaction, whose start was never stamped apart — gets that time.
///
/// # Errors
/// Database errors.
pub async fn finish(
    db: impl PgExecutor<'_>,
    id: Uuid,
    worker: &str,
    outcome: &Outcome,
    progress: &serde_json::Value,
) -> Result<bool, sqlx::Error> {
    let (state, error, delay, uncount) = match outcome {
        Outcome::Completed => ("completed", None, Duration::ZERO, 0),
        Outcome::Failed(e) => ("failed", Some(e.as_str()), Duration::ZERO, 0),
        Outcome::RetryAfter(e, d) => ("queued", Some(e.as_str()), *d, 0),
        Outcome::Held => ("held", None, HELD_RECHECK, 1),
        Outcome::Wait(d) => ("queued", None, *d, 1),
        Outcome::Cancelled => (
            "cancelled",
            Some("cancelled by an operator while running"),
            Duration::ZERO,
            0,
        ),
    };
    let r = crate::db::query(
        "UPDATE deprov.jobs SET state = CASE WHEN cancel_requested_at IS NOT NULL AND $3 IN ('queued', 'held') \
             THEN 'cancelled' ELSE $3 END, \
           last_error = CASE WHEN $3 = 'completed' THEN NULL ELSE coalesce($4, last_error) END, \
           run_after = now() + make_interval(secs => $5::float8 / 1000), progress = $6, \
           step = CASE WHEN $3 = 'completed' THEN 'done' ELSE step END, \
           finished_at = CASE WHEN $3 IN ('completed', 'failed', 'cancelled') \
             OR cancel_requested_at IS NOT NULL THEN now() END, \
           attempts = attempts - $7, \
           stalled_attempts = CASE WHEN $3 = 'completed' THEN 0 ELSE greatest(stalled_attempts - $7, 0) END, \
           hard_delete_started_at = coalesce(hard_delete_started_at, \
             ($6->>'hard_delete_started_at')::timestamptz), \
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now() \
         WHERE id = $1 AND lease_owner = $2 AND state = 'running'",
    )
    .bind(id)
    .bind(worker)
    .bind(state)
    .bind(error)
    .bind(millis(delay))
    .bind(progress)
    .bind(uncount)
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Counts of jobs per state, for `/metrics`-style summaries and the demo.
///
/// # Errors
/// Database errors.
pub async fn counts(db: impl PgExecutor<'_>) -> Result<Vec<(String, i64)>, sqlx::Error> {
    crate::db::query_as("SELECT state, count(*) FROM deprov.jobs GROUP BY state ORDER BY state")
        .fetch_all(db)
        .await
}
