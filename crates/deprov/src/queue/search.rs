//! Reads for the operator console: jobs by filter, a job's requests, the queue's age, and the
//! latest checkpoint of a hard delete. Read-only; every action on jobs goes through
//! [`super::operator`], [`super::reconcile`] and [`super::grace`].

use sqlx::PgExecutor;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Job, JobState};

/// Which jobs [`jobs`] lists; every given part must match.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs with a request from this source.
    pub source: Option<String>,
    /// Only jobs of this tenant (resolved tenant key or subject).
    pub tenant: Option<String>,
    /// Only jobs with a request of this ID, external ID or deduplication key (a webhook's
    /// delivery ID, an `Idempotency-Key`).
    pub request: Option<String>,
}

/// Jobs matching `filter`, newest first; at most `limit` (1..=1000).
///
/// # Errors
/// Database errors.
pub async fn jobs(
    db: impl PgExecutor<'_>,
    filter: &JobFilter,
    limit: i64,
) -> Result<Vec<Job>, sqlx::Error> {
    crate::db::query_as(
        "SELECT id, subject_kind, subject, tenant_id, state, step, attempts, stalled_attempts, \
           max_attempts, last_error, checkpoint, progress, created_at, started_at, finished_at, \
           run_after, lease_owner, lease_expires_at \
         FROM deprov.jobs j \
         WHERE ($1::text IS NULL OR j.state = $1) \
           AND ($2::text IS NULL OR EXISTS (SELECT 1 FROM deprov.deletion_requests r \
                WHERE r.job_id = j.id AND r.source = $2)) \
           AND ($3::text IS NULL OR j.tenant_id = $3 OR j.subject = $3) \
           AND ($4::text IS NULL OR EXISTS (SELECT 1 FROM deprov.deletion_requests r \
                WHERE r.job_id = j.id AND (r.id::text = lower($4) OR r.external_id = $4 \
                  OR r.dedup_key = $4))) \
         ORDER BY j.created_at DESC, j.id DESC LIMIT $5",
    )
    .bind(filter.state.map(JobState::as_str))
    .bind(filter.source.as_deref())
    .bind(filter.tenant.as_deref())
    .bind(filter.request.as_deref())
    .bind(limit.clamp(1, 1000))
    .fetch_all(db)
    .await
}

/// A request attached to a job.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JobRequest {
    /// The deterministic request ID.
    pub id: Uuid,
    /// Its source.
    pub source: String,
    /// `external_id`, `idempotency_key`, `tenant_id` or `installation_id`.
    pub dedup_basis: String,
    /// The sender's ID for it (external ID, delivery ID), when it gave one.
    pub external_id: Option<String>,
    /// The sender's reason.
    pub reason: Option<String>,
    /// When it was first received.
    pub received_at: OffsetDateTime,
    /// Whether a kill switch held its job when it arrived.
    pub received_while_held: bool,
    /// Identical deliveries received later.
    pub duplicates: i32,
}

/// The requests of job `id`, oldest first.
///
/// # Errors
/// Database errors.
pub async fn requests(db: impl PgExecutor<'_>, id: Uuid) -> Result<Vec<JobRequest>, sqlx::Error> {
    crate::db::query_as(
        "SELECT id, source, dedup_basis, external_id, reason, received_at, received_while_held, \
           duplicates FROM deprov.deletion_requests WHERE job_id = $1 ORDER BY received_at, id",
    )
    .bind(id)
    .fetch_all(db)
    .await
}

/// The queue at a glance.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct QueueAge {
    /// When the oldest `queued` job was created.
    pub oldest_queued: Option<OffsetDateTime>,
    /// When the oldest `held` job was created.
    pub oldest_held: Option<OffsetDateTime>,
    /// The latest checkpoint (or lease renewal) of a job in its hard delete: when a worker last
    /// recorded committed batches. deprov keeps no time per destructive statement; this is the
    /// closest record of one.
    pub last_checkpoint: Option<OffsetDateTime>,
    /// The server's clock at the read.
    pub now: OffsetDateTime,
}

/// Reads [`QueueAge`].
///
/// # Errors
/// Database errors.
pub async fn queue_age(db: impl PgExecutor<'_>) -> Result<QueueAge, sqlx::Error> {
    crate::db::query_as(
        "SELECT (SELECT min(created_at) FROM deprov.jobs WHERE state = 'queued') AS oldest_queued, \
           (SELECT min(created_at) FROM deprov.jobs WHERE state = 'held') AS oldest_held, \
           (SELECT max(heartbeat_at) FROM deprov.jobs WHERE step IN ('hard_delete', 'done')) \
             AS last_checkpoint, \
           now() AS now",
    )
    .fetch_one(db)
    .await
}

/// When job `id` last wrote its checkpoint (or renewed its lease), if ever.
///
/// # Errors
/// Database errors.
pub async fn checkpointed_at(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> Result<Option<OffsetDateTime>, sqlx::Error> {
    crate::db::query_scalar("SELECT heartbeat_at FROM deprov.jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await
        .map(Option::flatten)
}

/// Running jobs per engaged kill switch that blocks them (`global`, `source:<name>`,
/// `tenant:<key>`): jobs a switch has not stopped yet (each stops at its next batch boundary).
///
/// # Errors
/// Database errors.
pub async fn running_blocked(db: impl PgExecutor<'_>) -> Result<Vec<(String, i64)>, sqlx::Error> {
    crate::db::query_as(
        "SELECT b, count(*) FROM (SELECT deprov.job_blocked_by(id) AS b FROM deprov.jobs \
         WHERE state = 'running') r WHERE b IS NOT NULL GROUP BY b ORDER BY b",
    )
    .fetch_all(db)
    .await
}

/// A running job an engaged kill switch blocks, with the worker holding its lease.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct BlockedRunning {
    /// The job.
    pub job_id: Uuid,
    /// The switch that blocks it (`global`, `source:<name>`, `tenant:<key>`).
    pub blocked_by: String,
    /// The worker holding its lease.
    pub lease_owner: Option<String>,
    /// When its lease expires.
    pub lease_expires_at: Option<OffsetDateTime>,
    /// Whether that worker is live (heartbeat current, not stopped).
    pub owner_live: bool,
    /// That worker's latest heartbeat, if it ever sent one.
    pub owner_heartbeat_at: Option<OffsetDateTime>,
}

/// Running jobs an engaged kill switch blocks (at most 100, oldest first), each with its lease
/// holder and whether that worker is live: a job whose worker stopped heartbeating is held by a
/// lease no live worker will give up at a batch boundary.
///
/// # Errors
/// Database errors.
pub async fn running_blocked_jobs(
    db: impl PgExecutor<'_>,
) -> Result<Vec<BlockedRunning>, sqlx::Error> {
    crate::db::query_as(
        "SELECT r.id AS job_id, r.b AS blocked_by, r.lease_owner, r.lease_expires_at, \
           coalesce(w.stopped_at IS NULL AND w.live_until > now(), false) AS owner_live, \
           w.heartbeat_at AS owner_heartbeat_at \
         FROM (SELECT id, created_at, lease_owner, lease_expires_at, \
                 deprov.job_blocked_by(id) AS b \
               FROM deprov.jobs WHERE state = 'running') r \
         LEFT JOIN deprov.workers w ON w.id = r.lease_owner \
         WHERE r.b IS NOT NULL ORDER BY r.created_at, r.id LIMIT 100",
    )
    .fetch_all(db)
    .await
}

/// Per engaged tenant switch (`tenant:<key>`), the latest checkpoint (or lease renewal) of a hard
/// delete of that tenant's jobs: [`QueueAge::last_checkpoint`] scoped to the switch (read through
/// the `tenant_id` index; a source switch has no such index and is not scoped).
///
/// # Errors
/// Database errors.
pub async fn tenant_checkpoints(
    db: impl PgExecutor<'_>,
) -> Result<Vec<(String, Option<OffsetDateTime>)>, sqlx::Error> {
    crate::db::query_as(
        "SELECT 'tenant:' || s.key, (SELECT max(j.heartbeat_at) FROM deprov.jobs j \
           WHERE j.tenant_id = s.key AND j.step IN ('hard_delete', 'done')) \
         FROM deprov.kill_switch_scopes s WHERE s.engaged AND s.scope = 'tenant'",
    )
    .fetch_all(db)
    .await
}
