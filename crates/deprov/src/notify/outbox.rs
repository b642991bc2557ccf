//! The outbox table (`deprov.outbox`): events written by a trigger in the transaction that finishes a
//! job (migration `0005_notifications.sql`), claimed and settled by dispatchers.
//!
//! Claims follow the job queue's pattern ([`crate::queue::jobs::claim`]): one statement picks due
//! rows `FOR UPDATE SKIP LOCKED`, counts an attempt and pushes `next_attempt_at` past the request
//! timeout (the claim's lease), so no other dispatcher claims the row while it is being delivered. The
//! outcome is recorded guarded by `attempts = <the claim's count> AND state = 'pending'`: a
//! dispatcher whose lease ran out (and whose row was claimed again) changes nothing.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgExecutor;
use time::OffsetDateTime;
use uuid::Uuid;

/// An outbox row's delivery state (`deprov.outbox.state`).
pub const STATES: [&str; 4] = ["pending", "delivered", "dead", "skipped"];

/// A claimed event, ready to send.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    /// The event ID: the `webhook-id` of every attempt.
    pub id: Uuid,
    /// `job.completed`, `job.failed` or `job.cancelled`.
    pub event_type: String,
    /// The job.
    pub job_id: Uuid,
    /// The body to send.
    pub payload: serde_json::Value,
    /// Attempts including this one (1 = first).
    pub attempts: i32,
}

/// One outbox row, for listings.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Event {
    /// The event ID (`webhook-id`).
    pub id: Uuid,
    /// Event type.
    pub event_type: String,
    /// The job.
    pub job_id: Uuid,
    /// `pending`, `delivered`, `dead` or `skipped`.
    pub state: String,
    /// Attempts started.
    pub attempts: i32,
    /// HTTP status of the latest attempt, if one answered.
    pub last_status: Option<i32>,
    /// Why the latest attempt failed.
    pub last_error: Option<String>,
    /// When the event was recorded (the job's terminal commit).
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Next attempt not before (pending only).
    #[serde(with = "time::serde::rfc3339")]
    pub next_attempt_at: OffsetDateTime,
    /// When it was delivered, went dead or was skipped.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// The body sent.
    pub payload: serde_json::Value,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Claims at most `limit` due pending events of the given `types` for `dispatcher`, leasing each for
/// `lease`, oldest due first.
///
/// # Errors
/// Database errors.
pub async fn claim(
    db: impl PgExecutor<'_>,
    dispatcher: &str,
    types: &[String],
    limit: u32,
    lease: Duration,
) -> Result<Vec<Claimed>, sqlx::Error> {
    crate::db::query_as(
        "WITH due AS ( \
           SELECT id FROM deprov.outbox \
           WHERE state = 'pending' AND next_attempt_at <= now() AND event_type = ANY($2) \
           ORDER BY next_attempt_at, id LIMIT $3 FOR UPDATE SKIP LOCKED) \
         UPDATE deprov.outbox o SET attempts = o.attempts + 1, claimed_by = $1, \
           next_attempt_at = now() + make_interval(secs => $4::float8 / 1000), updated_at = now() \
         FROM due WHERE o.id = due.id \
         RETURNING o.id, o.event_type, o.job_id, o.payload, o.attempts",
    )
    .bind(dispatcher)
    .bind(types)
    .bind(i64::from(limit))
    .bind(millis(lease))
    .fetch_all(db)
    .await
}

/// Marks pending events whose type is not in `types` as `skipped`; returns how many.
///
/// # Errors
/// Database errors.
pub async fn skip_others(db: impl PgExecutor<'_>, types: &[String]) -> Result<u64, sqlx::Error> {
    let r = crate::db::query(
        "UPDATE deprov.outbox SET state = 'skipped', finished_at = now(), updated_at = now() \
         WHERE state = 'pending' AND NOT (event_type = ANY($1))",
    )
    .bind(types)
    .execute(db)
    .await?;
    Ok(r.rows_affected())
}

/// Records a 2xx answer (`status`) to attempt `attempt` of event `id`. Returns `false` when the
/// claim was no longer this dispatcher's (nothing changed).
///
/// # Errors
/// Database errors.
pub async fn delivered(
    db: impl PgExecutor<'_>,
    id: Uuid,
    attempt: i32,
    status: u16,
) -> Result<bool, sqlx::Error> {
    let r = crate::db::query(
        "UPDATE deprov.outbox SET state = 'delivered', last_status = $3, last_error = NULL, \
           finished_at = now(), updated_at = now() \
         WHERE id = $1 AND attempts = $2 AND state = 'pending'",
    )
    .bind(id)
    .bind(attempt)
    .bind(i32::from(status))
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Records a failed attempt `attempt` of event `id` (`status` if the receiver answered): `dead` when
/// it was attempt `max_attempts` or the event is older than `max_age`, else `pending` again after
/// `retry_in`. Returns the new state, `None` when the claim was no longer this dispatcher's.
///
/// # Errors
/// Database errors.
#[allow(clippy::too_many_arguments)]
pub async fn failed(
    db: impl PgExecutor<'_>,
    id: Uuid,
    attempt: i32,
    status: Option<u16>,
    error: &str,
    max_attempts: u32,
    max_age: Duration,
    retry_in: Duration,
) -> Result<Option<String>, sqlx::Error> {
    crate::db::query_scalar(
        "WITH verdict AS ( \
           SELECT id, (attempts >= $5 OR created_at < now() - make_interval(secs => $6::float8 / 1000)) AS dead \
           FROM deprov.outbox WHERE id = $1 AND attempts = $2 AND state = 'pending') \
         UPDATE deprov.outbox o SET last_status = $3, last_error = $4, updated_at = now(), \
           state = CASE WHEN v.dead THEN 'dead' ELSE 'pending' END, \
           finished_at = CASE WHEN v.dead THEN now() END, \
           next_attempt_at = now() + make_interval(secs => $7::float8 / 1000) \
         FROM verdict v WHERE o.id = v.id \
         RETURNING o.state",
    )
    .bind(id)
    .bind(attempt)
    .bind(status.map(i32::from))
    .bind(error)
    .bind(i64::from(max_attempts))
    .bind(millis(max_age))
    .bind(millis(retry_in))
    .fetch_optional(db)
    .await
}

/// Time until the earliest pending event of `types` is due (zero when one is due now); `None` when
/// none is pending.
///
/// # Errors
/// Database errors.
pub async fn next_due(
    db: impl PgExecutor<'_>,
    types: &[String],
) -> Result<Option<Duration>, sqlx::Error> {
    let secs: Option<f64> = crate::db::query_scalar(
        "SELECT extract(epoch FROM min(next_attempt_at) - now())::float8 FROM deprov.outbox \
         WHERE state = 'pending' AND event_type = ANY($1)",
    )
    .bind(types)
    .fetch_one(db)
    .await?;
    Ok(secs.map(|s| Duration::from_secs_f64(s.clamp(0.0, 86_400.0))))
}

/// Events newest first, optionally of one state (see [`STATES`]); at most `limit` (1..=1000).
///
/// # Errors
/// Database errors.
pub async fn list(
    db: impl PgExecutor<'_>,
    state: Option<&str>,
    limit: i64,
) -> Result<Vec<Event>, sqlx::Error> {
    crate::db::query_as(
        "SELECT id, event_type, job_id, state, attempts, last_status, last_error, created_at, \
           next_attempt_at, finished_at, payload \
         FROM deprov.outbox WHERE ($1::text IS NULL OR state = $1) \
         ORDER BY created_at DESC, id DESC LIMIT $2",
    )
    .bind(state)
    .bind(limit.clamp(1, 1000))
    .fetch_all(db)
    .await
}

/// Sends a `dead` event again: `pending`, attempts reset, due now. With `id = None`, every dead
/// event. Returns the IDs re-queued.
///
/// # Errors
/// Database errors.
pub async fn redrive(db: impl PgExecutor<'_>, id: Option<Uuid>) -> Result<Vec<Uuid>, sqlx::Error> {
    crate::db::query_scalar(
        "UPDATE deprov.outbox SET state = 'pending', attempts = 0, next_attempt_at = now(), \
           finished_at = NULL, updated_at = now() \
         WHERE state = 'dead' AND ($1::uuid IS NULL OR id = $1) RETURNING id",
    )
    .bind(id)
    .fetch_all(db)
    .await
}

/// Events per state (every state of [`STATES`], 0 included) and the age in seconds of the oldest
/// pending event (0 when none): the `deprov_notifications` gauges.
///
/// # Errors
/// Database errors.
pub async fn counts(db: impl PgExecutor<'_>) -> Result<(Vec<(String, i64)>, f64), sqlx::Error> {
    let rows: Vec<(String, i64, f64)> = crate::db::query_as(
        "SELECT s.state, count(o.id), \
           coalesce(extract(epoch FROM now() - min(o.created_at)), 0)::float8 \
         FROM unnest($1::text[]) AS s(state) LEFT JOIN deprov.outbox o ON o.state = s.state \
         GROUP BY s.state ORDER BY s.state",
    )
    .bind(&STATES[..])
    .fetch_all(db)
    .await?;
    let oldest = rows
        .iter()
        .find(|(s, _, _)| s == "pending")
        .map_or(0.0, |r| r.2);
    Ok((rows.into_iter().map(|(s, n, _)| (s, n)).collect(), oldest))
}
