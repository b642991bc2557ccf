//! Making deferred batches durable ([`flush`]) and telling whether the target restarted since
//! ([`Incarnation`]).
//!
//! With `[hard_delete] checkpoint_interval` above zero, batches commit with
//! `synchronous_commit = off` ([`super::BatchLimits::deferred`]). A crash of the target server before
//! the WAL writer flushes them loses them (PostgreSQL docs §30.4, "Asynchronous Commit"). The worker
//! flushes before each checkpoint, so a checkpoint never names a lost batch; but a crash *between*
//! two batches goes unseen by the worker (its pool reconnects), and it would go on past rows that are
//! back. The flush therefore also reads the target's [`Incarnation`], and so does each batch while
//! deferred batches are not yet flushed ([`super::before_batch`], inside the batch's transaction): when
//! it differs from the one read at the last checkpoint, the server restarted or recovered from a
//! crash in between, and the worker goes back to that checkpoint instead of going on.

use sqlx::{PgConnection, PgPool};

use super::{BatchLimits, EngineError};

/// Which run of the target server answered: `pg_postmaster_start_time()` and
/// `pg_stat_bgwriter.stats_reset`, as text.
///
/// - A restart (clean or not), or a failover to another server, changes the start time.
/// - Crash recovery without a postmaster restart (a backend or the WAL writer killed: the postmaster
///   reinitializes shared memory and replays the WAL) keeps the start time but resets all cumulative
///   statistics, which sets `stats_reset` of the shared `bgwriter` statistics to the time of the reset
///   (PostgreSQL docs §28.2, "The Cumulative Statistics System": "When recovery is performed at
///   server start (e.g., after immediate shutdown, server crash …) all statistics counters are
///   reset"; seen on PostgreSQL 15: a backend killed by SIGKILL changed `stats_reset` and not the
///   start time; a clean restart changed the start time and not `stats_reset`).
///
/// An operator's `pg_stat_reset_shared('bgwriter')` also changes it: the worker then redoes the
/// batches since its last checkpoint, which is safe (deletes are idempotent). Both values are
/// readable by any role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incarnation {
    /// `pg_postmaster_start_time()::text`.
    pub started: String,
    /// `pg_stat_bgwriter.stats_reset::text` (`None` before any reset is recorded).
    pub stats_reset: Option<String>,
}

/// The `SELECT`-list columns of an [`Incarnation`], in its fields' order.
macro_rules! incarnation_columns {
    () => {
        "pg_postmaster_start_time()::text, (SELECT stats_reset::text FROM pg_stat_bgwriter)"
    };
}
pub(super) use incarnation_columns;

const INCARNATION: &str = concat!("SELECT ", incarnation_columns!());

/// `Ok` when the target is still `was`, else [`EngineError::TargetRestarted`] (see
/// [`super::before_batch`]).
pub(super) fn expect(was: &Incarnation, now: Incarnation) -> Result<(), EngineError> {
    if *was == now {
        Ok(())
    } else {
        Err(EngineError::TargetRestarted {
            was: was.clone(),
            now,
        })
    }
}

/// Reads the [`Incarnation`] of the server `conn` is connected to (one read-only statement).
async fn read(conn: &mut PgConnection) -> Result<Incarnation, sqlx::Error> {
    let (started, stats_reset): (String, Option<String>) =
        crate::db::query_as(INCARNATION).fetch_one(conn).await?;
    Ok(Incarnation {
        started,
        stats_reset,
    })
}

/// Reads the target's current [`Incarnation`], in a short read-only transaction under `limits`'
/// timeouts.
///
/// # Errors
/// Database errors.
pub async fn incarnation(
    target: &PgPool,
    limits: &BatchLimits,
) -> Result<Incarnation, sqlx::Error> {
    let bounds = crate::db::Bounds::new(limits.lock_timeout, limits.statement_timeout);
    let mut tx = crate::db::begin(target, bounds).await?;
    let now = read(&mut tx).await?;
    tx.commit().await?;
    Ok(now)
}

/// Makes every transaction committed on `target` so far durable, and returns the [`Incarnation`] of
/// the server that made them so (read in the same transaction): compare it with the one read when
/// the last checkpoint was written, to learn whether batches committed deferred in between may have
/// been lost.
///
/// One short transaction that writes a WAL record (`pg_logical_emit_message(true, 'deprov',
/// 'flush')`, PostgreSQL docs §9.27.6; any role may call it, at any `wal_level`) and commits with
/// `synchronous_commit = on`, so its COMMIT waits for the WAL flush up to its own commit record,
/// which follows every earlier commit record. (A transaction that writes no WAL commits without a
/// flush even with `synchronous_commit = on`, so taking a transaction ID alone would not do.)
/// Logical decoding consumers see the message with prefix `deprov`. The `pg_lsn` it returns is cast
/// to `text`: sqlx would look an unknown type up by a query of its own between Parse and Bind, which
/// drops an unnamed statement (SQLSTATE 26000) behind a transaction pooler. Locks nothing.
///
/// # Errors
/// Database errors.
pub async fn flush(target: &PgPool, limits: &BatchLimits) -> Result<Incarnation, sqlx::Error> {
    let bounds = crate::db::Bounds::new(limits.lock_timeout, limits.statement_timeout).durable();
    let mut tx = crate::db::begin(target, bounds).await?;
    crate::db::query("SELECT pg_logical_emit_message(true, 'deprov', 'flush')::text")
        .execute(&mut *tx)
        .await?;
    let now = read(&mut tx).await?;
    tx.commit().await?;
    Ok(now)
}
