//! Isolated, bounded connection pools.
//!
//! deprov opens one pool per role — `intake` and `queue` on its state database, `target` on the
//! application database — each with its own `max_connections` and `acquire_timeout`, so deletion work
//! can never take the connections intake needs, and nothing waits without bound for a connection
//! (incident 3 in `shared/notes/incidents.md`). Every connection sets `application_name` to
//! `deprov-<role>` so operators can find deprov in `pg_stat_activity`.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

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
}

/// Parses a `postgres://` URL.
///
/// # Errors
/// sqlx's parse error when the URL is malformed.
pub fn connect_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    PgConnectOptions::from_str(url)
}

/// Builds a lazily connecting pool: start-up never fails because the database is down; the first
/// acquire fails fast after `acquire_timeout` instead.
pub fn pool(options: &PgConnectOptions, role: PoolRole, bounds: &PoolConfig) -> PgPool {
    PgPoolOptions::new()
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
