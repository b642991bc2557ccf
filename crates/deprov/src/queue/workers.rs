//! Worker processes (`deprov.workers`): a heartbeat that defines "live", and the kill switch
//! version each has observed (its acknowledgement).
//!
//! A worker upserts its row every `[worker] heartbeat_interval`, setting `live_until = now() +
//! [worker] stale_after`; it is live while `live_until` is in the future and it has not stopped
//! (`stopped_at`, set at graceful shutdown). Readers (the API, the CLI) need no configuration: each
//! worker states how long its heartbeat holds. A worker records `observed_version` only once it acts
//! on that version: no destructive statement of its own, started on an older reading, is still
//! running (see `crate::worker` for how this is kept true). With both it records when its last
//! destructive statement ended (`last_destroyed_at`).

use std::time::Duration;

use sqlx::PgExecutor;
use time::OffsetDateTime;

/// A live worker as `GET /v1/kill-switch` shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LiveWorker {
    /// Its lease owner name (`hostname-pid-random`).
    pub id: String,
    /// When it started.
    pub started_at: OffsetDateTime,
    /// Its latest heartbeat.
    pub heartbeat_at: OffsetDateTime,
    /// The highest kill switch version it has acknowledged.
    pub observed_version: i64,
    /// When it acknowledged that version: the state database's `clock_timestamp()` as the
    /// acknowledgement was written, under the gate (so after its last destructive statement on an
    /// older reading ended, and never before [`Self::last_destroyed_at`] as written with it).
    pub observed_at: Option<OffsetDateTime>,
    /// Whether it holds a `LISTEN` connection (else it learns of changes by polling).
    pub listening: bool,
    /// When its last destructive statement ended, on the state database's clock, as of its latest
    /// heartbeat or acknowledgement; `None` when it has run none since it started.
    pub last_destroyed_at: Option<OffsetDateTime>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Milliseconds (fractional) since the worker's last destructive statement ended, as bound to the
/// `last_destroyed_at` expressions below (`NULL`: none yet).
fn since_ms(since_destroyed: Option<Duration>) -> Option<f64> {
    since_destroyed.map(|d| d.as_secs_f64() * 1000.0)
}

/// Registers or refreshes worker `id`: live for `stale_after` from now, its last destructive
/// statement ended `since_destroyed` ago (`None`: none since it started; a later time than the
/// recorded one replaces it, on the state database's clock). Returns the kill switch's latest
/// version, so the caller learns of a change it missed.
///
/// # Errors
/// Database errors.
pub async fn heartbeat(
    db: impl PgExecutor<'_>,
    id: &str,
    stale_after: Duration,
    listening: bool,
    since_destroyed: Option<Duration>,
) -> Result<i64, sqlx::Error> {
    crate::db::query_scalar(
        "INSERT INTO deprov.workers (id, live_until, listening, last_destroyed_at) \
         VALUES ($1, now() + make_interval(secs => $2::float8 / 1000), $3, \
           clock_timestamp() - make_interval(secs => $4::float8 / 1000)) \
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), live_until = EXCLUDED.live_until, \
           listening = EXCLUDED.listening, stopped_at = NULL, \
           last_destroyed_at = greatest(deprov.workers.last_destroyed_at, EXCLUDED.last_destroyed_at) \
         RETURNING (SELECT latest_version FROM deprov.kill_switch)",
    )
    .bind(id)
    .bind(millis(stale_after))
    .bind(listening)
    .bind(since_ms(since_destroyed))
    .fetch_one(db)
    .await
}

/// Records that worker `id` acts on kill switch `version` (never lowers it), with its last
/// destructive statement ended `since_destroyed` ago (as [`heartbeat`] records it). Returns whether
/// worker `id`'s row now shows `version` or later: `false` when it has no row yet (its first
/// heartbeat has not registered it), so the caller does not take the version as recorded.
///
/// # Errors
/// Database errors.
pub async fn observe(
    db: impl PgExecutor<'_>,
    id: &str,
    version: i64,
    since_destroyed: Option<Duration>,
) -> Result<bool, sqlx::Error> {
    crate::db::query_scalar(
        "WITH raised AS ( \
           UPDATE deprov.workers w SET observed_version = $2, observed_at = t.at, \
             last_destroyed_at = greatest(w.last_destroyed_at, \
               t.at - make_interval(secs => $3::float8 / 1000)) \
           FROM (SELECT clock_timestamp() AS at) t \
           WHERE w.id = $1 AND w.observed_version < $2 RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM raised) \
           OR EXISTS (SELECT 1 FROM deprov.workers WHERE id = $1 AND observed_version >= $2)",
    )
    .bind(id)
    .bind(version)
    .bind(since_ms(since_destroyed))
    .fetch_one(db)
    .await
}

/// Marks worker `id` stopped (graceful shutdown): it is no longer live.
///
/// # Errors
/// Database errors.
pub async fn stopped(db: impl PgExecutor<'_>, id: &str) -> Result<(), sqlx::Error> {
    crate::db::query("UPDATE deprov.workers SET stopped_at = now() WHERE id = $1")
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// The live workers, by ID.
///
/// # Errors
/// Database errors.
pub async fn live(db: impl PgExecutor<'_>) -> Result<Vec<LiveWorker>, sqlx::Error> {
    crate::db::query_as(
        "SELECT id, started_at, heartbeat_at, observed_version, observed_at, listening, \
           last_destroyed_at \
         FROM deprov.workers WHERE stopped_at IS NULL AND live_until > now() ORDER BY id",
    )
    .fetch_all(db)
    .await
}
