//! The scrape-time collector: pool gauges and the gauges read from the databases.
//!
//! Decision: database gauges are read **on scrape**, not by a background poller — a scrape sees the
//! queue as it is now, and nothing polls the databases when nobody scrapes. Each read is bounded so a
//! scrape never hangs on a database that is down or slow:
//! - the wait for a connection is cut at `[metrics] read_timeout` (a dropped acquire leaves nothing
//!   running);
//! - the statements run in one transaction opened by [`db::begin_on`] with lock and statement
//!   timeouts of `read_timeout` ([`db::Bounds`]), so the server ends them itself and the connection
//!   goes back to the pool intact;
//! - a last-resort client deadline of 3 × `read_timeout` covers a peer that stopped answering.
//!
//! A failed read leaves that database's gauges at their last known values, sets
//! `deprov_db_up{database}` to 0 and counts `deprov_db_read_errors_total{database}`; the scrape still
//! answers 200 with everything else. Concurrent scrapes share one read (a scrape that waited for
//! another's read uses its result).
//!
//! Statements go through [`db::query_as`] and friends inside that transaction, so they are unnamed
//! under `DEPROV_POOLER_MODE=transaction` and the reads work behind a transaction-mode pooler (see
//! [`crate::db`]).
//!
//! The state database is read through the `queue` pool (never `intake`, so scrapes never take
//! intake's connections); the target database (`deprov_target_lock_waiters`,
//! `deprov_target_replication_lag_seconds`) only by processes that run a worker, through the `target`
//! pool — an HTTP-only process (`--no-worker`) never connects to the target. The worker's pacer also
//! sets the target gauges whenever it reads them between batches.

use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use sqlx::PgPool;

use super::{
    DB_READ_ERRORS, DB_UP, JOBS, KILL_SWITCH, KILL_SWITCHES, NOTIFICATIONS,
    NOTIFICATIONS_OLDEST_PENDING, POOL_CONNECTIONS, POOL_MAX, QUEUE_OLDEST_AGE,
};
use crate::db::{self, PoolRole, Pools};
use crate::queue::JobState;

/// What one process exposes at `/metrics`.
#[derive(Debug)]
pub struct Collector {
    pools: Pools,
    read_target: bool,
    read_timeout: Duration,
    last_read: tokio::sync::Mutex<Option<Instant>>,
}

/// Why a scrape-time read failed.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("no connection within {0:?}")]
    Acquire(Duration),
    #[error("not answered within {0:?}")]
    Deadline(Duration),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl Collector {
    /// A collector over `pools`; `read_target` when this process runs a worker; each database read is
    /// bounded by `read_timeout` (see the module documentation).
    pub fn new(pools: Pools, read_target: bool, read_timeout: Duration) -> Self {
        super::install();
        Self {
            pools,
            read_target,
            read_timeout,
            last_read: tokio::sync::Mutex::new(None),
        }
    }

    /// Sets the pool gauges, reads the database gauges (bounded), and renders the registry as
    /// Prometheus text. Never fails: what could not be read is reported by `deprov_db_up`.
    pub async fn render(&self) -> String {
        for (role, pool) in [
            (PoolRole::Intake, &self.pools.intake),
            (PoolRole::Queue, &self.pools.queue),
            (PoolRole::Target, &self.pools.target),
        ] {
            let size = pool.size();
            let idle = u32::try_from(pool.num_idle()).unwrap_or(u32::MAX).min(size);
            let label = role.label();
            gauge!(POOL_CONNECTIONS, "pool" => label, "state" => "idle").set(f64::from(idle));
            gauge!(POOL_CONNECTIONS, "pool" => label, "state" => "in_use")
                .set(f64::from(size - idle));
            gauge!(POOL_MAX, "pool" => label).set(f64::from(pool.options().get_max_connections()));
        }
        self.read_databases().await;
        super::render()
    }

    async fn read_databases(&self) {
        let asked = Instant::now();
        let mut last = self.last_read.lock().await;
        if last.is_some_and(|done| done >= asked) {
            return; // another scrape read while this one waited
        }
        let state = self.bounded(&self.pools.queue, "state", read_state);
        if self.read_target {
            let target = self.bounded(&self.pools.target, "target", read_target);
            tokio::join!(state, target);
        } else {
            state.await;
        }
        *last = Some(Instant::now());
    }

    /// Runs `read` in a transaction on `pool` with the bounds of the module documentation and
    /// reports the outcome in `deprov_db_up{database}`.
    async fn bounded<F>(&self, pool: &PgPool, database: &'static str, read: F)
    where
        F: AsyncFnOnce(&mut sqlx::PgConnection) -> Result<(), sqlx::Error>,
    {
        let t = self.read_timeout;
        let work = async {
            let mut conn = tokio::time::timeout(t, db::acquire(pool))
                .await
                .map_err(|_| ReadError::Acquire(t))??;
            let mut tx = db::begin_on(&mut conn, db::Bounds::new(t, t)).await?;
            read(&mut tx).await?;
            tx.commit().await?;
            Ok::<(), ReadError>(())
        };
        let outcome = match tokio::time::timeout(t * 3, work).await {
            Ok(r) => r,
            Err(_) => Err(ReadError::Deadline(t * 3)),
        };
        match outcome {
            Ok(()) => gauge!(DB_UP, "database" => database).set(1.0),
            Err(e) => {
                tracing::warn!(database, error = %e, "metrics: database read failed");
                gauge!(DB_UP, "database" => database).set(0.0);
                counter!(DB_READ_ERRORS, "database" => database).increment(1);
            }
        }
    }
}

/// Every job state, so a state with no jobs reads 0 rather than its last count.
const JOB_STATES: [JobState; 6] = [
    JobState::Queued,
    JobState::Held,
    JobState::Running,
    JobState::Completed,
    JobState::Failed,
    JobState::Cancelled,
];

/// Jobs per state, the oldest claimable queued job's wait, the kill switches (global, and the
/// number of engaged source and tenant switches), and notification events per state.
async fn read_state(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    let counts = crate::queue::jobs::counts(&mut *conn).await?;
    let (age, engaged, sources, tenants): (f64, bool, i64, i64) = db::query_as(
        "SELECT coalesce((SELECT extract(epoch FROM now() - min(run_after))::float8 FROM deprov.jobs \
                          WHERE state = 'queued' AND run_after <= now()), 0), \
                (SELECT engaged FROM deprov.kill_switch), \
                (SELECT count(*) FROM deprov.kill_switch_scopes WHERE engaged AND scope = 'source'), \
                (SELECT count(*) FROM deprov.kill_switch_scopes WHERE engaged AND scope = 'tenant')",
    )
    .fetch_one(&mut *conn)
    .await?;
    for state in JOB_STATES {
        let n = counts
            .iter()
            .find(|(s, _)| s == state.as_str())
            .map_or(0, |(_, n)| *n);
        #[allow(clippy::cast_precision_loss)] // job counts stay far below 2^52
        gauge!(JOBS, "state" => state.as_str()).set(n as f64);
    }
    gauge!(QUEUE_OLDEST_AGE).set(age.max(0.0));
    gauge!(KILL_SWITCH).set(if engaged { 1.0 } else { 0.0 });
    #[allow(clippy::cast_precision_loss)] // switch counts stay far below 2^52
    let (sources, tenants) = (sources as f64, tenants as f64);
    gauge!(KILL_SWITCHES, "scope" => "source").set(sources);
    gauge!(KILL_SWITCHES, "scope" => "tenant").set(tenants);
    let (events, oldest) = crate::notify::outbox::counts(&mut *conn).await?;
    for (state, n) in events {
        #[allow(clippy::cast_precision_loss)] // event counts stay far below 2^52
        gauge!(NOTIFICATIONS, "state" => state).set(n as f64);
    }
    gauge!(NOTIFICATIONS_OLDEST_PENDING).set(oldest.max(0.0));
    Ok(())
}

/// Lock waiters and replication lag of the target (the gauges are set by the read itself).
async fn read_target(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    crate::worker::pacing::read_target_load(conn)
        .await
        .map(|_| ())
}
