//! Isolated, bounded connection pools.
//!
//! deprov opens one pool per role — `intake` and `queue` on its state database, `target` on the
//! application database — each with its own `max_connections` and `acquire_timeout`, so deletion work
//! can never take the connections intake needs, and nothing waits without bound for a connection
//! (incident 3 in `shared/notes/incidents.md`). Every connection sets `application_name` to
//! `deprov-<role>` so operators can find deprov in `pg_stat_activity`.
//!
//! Every connection deprov takes from a pool goes through [`acquire`] or [`begin`], which time the wait
//! and count acquire timeouts (sqlx reports neither); the pool's `after_connect` hook counts new
//! connections. Both feed [`crate::telemetry`] under the pool's [`PoolRole::label`].

use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use crate::config::PoolConfig;

/// Which pool a connection belongs to; also its `application_name` suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolRole {
    /// HTTP intake: writes deletion requests and jobs.
    Intake,
    /// The worker's queue operations: claim, heartbeat, checkpoint.
    Queue,
    /// Destructive work on the application database.
    Target,
    /// Operator commands run from the CLI.
    Cli,
}

impl PoolRole {
    /// The `application_name` connections of this role carry.
    pub fn application_name(self) -> &'static str {
        match self {
            Self::Intake => "deprov-intake",
            Self::Queue => "deprov-worker",
            Self::Target => "deprov-target",
            Self::Cli => "deprov-cli",
        }
    }

    /// The `pool` label of this role's metrics: `intake`, `queue`, `target`, `cli` (the names of
    /// `[pools.*]`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Intake => "intake",
            Self::Queue => "queue",
            Self::Target => "target",
            Self::Cli => "cli",
        }
    }

    /// The role whose connections carry `application_name`, if any.
    pub fn from_application_name(name: &str) -> Option<Self> {
        [Self::Intake, Self::Queue, Self::Target, Self::Cli]
            .into_iter()
            .find(|r| r.application_name() == name)
    }

    /// The role of a pool built by [`pool`] (read back from its `application_name`).
    pub fn of(pool: &PgPool) -> Option<Self> {
        pool.connect_options()
            .get_application_name()
            .and_then(Self::from_application_name)
    }
}

/// The `pool` metric label of `pool`: its role's [`PoolRole::label`], or `other` for a pool not built
/// by [`pool`].
pub fn pool_label(pool: &PgPool) -> &'static str {
    PoolRole::of(pool).map_or("other", PoolRole::label)
}

/// Takes a connection from `pool`, recording the wait in `deprov_db_pool_acquire_seconds` and a
/// [`sqlx::Error::PoolTimedOut`] in `deprov_db_pool_acquire_timeouts_total` (both labelled by pool).
/// Waits at most the pool's `acquire_timeout`.
///
/// # Errors
/// sqlx's acquire errors: `PoolTimedOut` (no connection within `acquire_timeout`, which includes
/// connecting to a database that is down), `PoolClosed`.
pub async fn acquire(pool: &PgPool) -> Result<PoolConnection<Postgres>, sqlx::Error> {
    let started = Instant::now();
    let result = pool.acquire().await;
    let timed_out = matches!(result, Err(sqlx::Error::PoolTimedOut));
    crate::telemetry::pool_acquired(pool_label(pool), started.elapsed(), timed_out);
    result
}

/// [`acquire`], then `BEGIN` on that connection: `pool.begin()` with the acquire measured. The wait
/// recorded is the acquire alone, not the `BEGIN` round trip.
///
/// # Errors
/// As [`acquire`], and the `BEGIN` statement's database errors.
pub async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let conn = acquire(pool).await?;
    // What `Pool::begin` does after its acquire (sqlx-core 0.9 `Pool::begin`).
    Transaction::begin(conn, None).await
}

/// Parses a `postgres://` URL.
///
/// # Errors
/// sqlx's parse error when the URL is malformed.
pub fn connect_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    PgConnectOptions::from_str(url)
}

/// Builds a lazily connecting pool: start-up never fails because the database is down; the first
/// acquire fails fast after `acquire_timeout` instead. Each new connection increments
/// `deprov_db_connections_opened_total{pool}` (the churn signal).
pub fn pool(options: &PgConnectOptions, role: PoolRole, bounds: &PoolConfig) -> PgPool {
    PgPoolOptions::new()
        .after_connect(move |_conn, _meta| {
            Box::pin(async move {
                crate::telemetry::connection_opened(role.label());
                Ok(())
            })
        })
        .max_connections(bounds.max_connections)
        .min_connections(0)
        .acquire_timeout(bounds.acquire_timeout)
        .idle_timeout(Duration::from_secs(300))
        .max_lifetime(Duration::from_secs(1800))
        .connect_lazy_with(options.clone().application_name(role.application_name()))
}

/// The three pools of a running service.
#[derive(Debug, Clone)]
pub struct Pools {
    /// State database, HTTP intake.
    pub intake: PgPool,
    /// State database, worker queue operations.
    pub queue: PgPool,
    /// Application (target) database, destructive work.
    pub target: PgPool,
}

impl Pools {
    /// Builds all three pools from the URLs and the `[pools]` bounds.
    ///
    /// # Errors
    /// When a URL does not parse.
    pub fn new(
        state_url: &str,
        target_url: &str,
        bounds: &crate::config::PoolsConfig,
    ) -> Result<Self, sqlx::Error> {
        let state = connect_options(state_url)?;
        let target = connect_options(target_url)?;
        Ok(Self {
            intake: pool(&state, PoolRole::Intake, &bounds.intake),
            queue: pool(&state, PoolRole::Queue, &bounds.queue),
            target: pool(&target, PoolRole::Target, &bounds.target),
        })
    }
}

/// Applies deprov's migrations (`migrations/`, embedded at build time) to the state database.
///
/// # Errors
/// Connection or migration failure.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    sqlx::migrate!("./migrations").run(pool).await
}
