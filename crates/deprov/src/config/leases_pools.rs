//! `[worker]` and `[pools]`: the worker's leases, retries and polling, and the bounded
//! connection pools of each role.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// `[worker]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// How long a claimed job stays leased without a heartbeat (default 30s).
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// How often an idle worker looks for work (default 500ms).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Attempts before a job ends `failed` (default 10).
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt, with full jitter (default 1s).
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    /// Largest retry delay (default 5m).
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// How often a running worker refreshes its row in `deprov.workers` and re-reads the kill
    /// switch version (default 1s). Without a `LISTEN` connection this is how fast an idle worker
    /// acknowledges a change.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// How long after its latest heartbeat a worker still counts as live (default 10s; at least
    /// twice `heartbeat_interval`). Live workers are the ones whose acknowledgement of a kill switch
    /// change is awaited.
    #[serde(with = "humantime_serde")]
    pub stale_after: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            max_attempts: 10,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            heartbeat_interval: Duration::from_secs(1),
            stale_after: Duration::from_secs(10),
        }
    }
}

impl WorkerConfig {
    /// `statement_timeout` is `[hard_delete] statement_timeout`: the lease must outlast a batch.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`]: a lease under 1s or not above `statement_timeout`, a zero
    /// interval, `stale_after` under twice `heartbeat_interval`, `max_attempts` outside 1..=1000,
    /// or a retry back-off out of order.
    pub(super) fn validate(&self, statement_timeout: Duration) -> Result<(), ConfigError> {
        if self.lease < Duration::from_secs(1) {
            return Err(invalid("worker.lease", "must be at least 1s"));
        }
        if self.lease <= statement_timeout {
            return Err(invalid(
                "worker.lease",
                "must exceed hard_delete.statement_timeout, or a slow batch loses its lease",
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(invalid("worker.poll_interval", "must be above 0"));
        }
        if self.heartbeat_interval.is_zero() {
            return Err(invalid("worker.heartbeat_interval", "must be above 0"));
        }
        if self.stale_after < self.heartbeat_interval * 2 {
            return Err(invalid(
                "worker.stale_after",
                "must be at least twice worker.heartbeat_interval",
            ));
        }
        if !(1..=1000).contains(&self.max_attempts) {
            return Err(invalid("worker.max_attempts", "must be between 1 and 1000"));
        }
        if self.backoff_base.is_zero() || self.backoff_max < self.backoff_base {
            return Err(invalid(
                "worker.backoff_max",
                "must be at least worker.backoff_base, which must be above 0",
            ));
        }
        Ok(())
    }
}

/// `[pools]`: one bounded pool per role, so intake never waits behind deletion work. Each key
/// left out keeps its pool's default (`[pools.target]` with only `max_connections` keeps 5s).
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "PoolsKeys")]
pub struct PoolsConfig {
    /// Intake (HTTP API) on the state database. Default 8 connections, 2s acquire timeout.
    pub intake: PoolConfig,
    /// Worker queue operations on the state database. Default 4 connections, 5s.
    pub queue: PoolConfig,
    /// Deletion work on the target database. Default 2 connections, 5s.
    pub target: PoolConfig,
}

impl Default for PoolsConfig {
    fn default() -> Self {
        Self {
            intake: PoolConfig {
                max_connections: 8,
                acquire_timeout: Duration::from_secs(2),
            },
            queue: PoolConfig {
                max_connections: 4,
                acquire_timeout: Duration::from_secs(5),
            },
            target: PoolConfig {
                max_connections: 2,
                acquire_timeout: Duration::from_secs(5),
            },
        }
    }
}

/// `[pools]` as written: any pool, any key may be left out.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct PoolsKeys {
    intake: PoolKeys,
    queue: PoolKeys,
    target: PoolKeys,
}

/// One `[pools.*]` table as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct PoolKeys {
    max_connections: Option<u32>,
    #[serde(with = "humantime_serde")]
    acquire_timeout: Option<Duration>,
}

impl PoolKeys {
    fn over(self, default: PoolConfig) -> PoolConfig {
        PoolConfig {
            max_connections: self.max_connections.unwrap_or(default.max_connections),
            acquire_timeout: self.acquire_timeout.unwrap_or(default.acquire_timeout),
        }
    }
}

impl From<PoolsKeys> for PoolsConfig {
    fn from(k: PoolsKeys) -> Self {
        let d = Self::default();
        Self {
            intake: k.intake.over(d.intake),
            queue: k.queue.over(d.queue),
            target: k.target.over(d.target),
        }
    }
}

/// One pool's bounds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Most connections the pool opens, 1..=100.
    pub max_connections: u32,
    /// Longest wait for a connection before failing fast (e.g. `2s`), 1ms..=60s.
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
}

impl PoolsConfig {
    /// # Errors
    /// [`ConfigError::Invalid`]: a pool's `max_connections` outside 1..=100 or `acquire_timeout`
    /// outside 1ms..=60s (naming the pool).
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (role, pool) in [
            ("intake", &self.intake),
            ("queue", &self.queue),
            ("target", &self.target),
        ] {
            if !(1..=100).contains(&pool.max_connections) {
                return Err(invalid(
                    format!("pools.{role}.max_connections"),
                    "must be between 1 and 100",
                ));
            }
            if pool.acquire_timeout.is_zero() || pool.acquire_timeout > Duration::from_secs(60) {
                return Err(invalid(
                    format!("pools.{role}.acquire_timeout"),
                    "must be between 1ms and 60s",
                ));
            }
        }
        Ok(())
    }
}
