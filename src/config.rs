//! The configuration file (`DEPROV_CONFIG`, TOML).
//!
//! Every table refuses unknown keys (`deny_unknown_fields`), durations are humantime strings
//! (`"50ms"`, `"5s"`, `"2h"`), and [`Config::from_toml`] validates values after parsing; every error
//! names the offending key. A full, commented example is `deploy/example.toml`; the README documents
//! each key.

mod access;
mod edge;
mod notify;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::sql::QualifiedName;
pub use access::OperatorTokensConfig;
pub use edge::{MetricsConfig, RateLimitConfig};
pub use notify::{EVENT_TYPES, NotificationsConfig, SigningKey};

/// Why the configuration was refused. Every message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// The path given in `DEPROV_CONFIG`.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown key, or a value of the wrong type (serde names the key and line).
    #[error("configuration: {0}")]
    Parse(#[from] toml::de::Error),
    /// A value parsed but is not allowed.
    #[error("configuration key `{key}`: {reason}")]
    Invalid {
        /// Dotted path of the key, e.g. `hard_delete.lock_timeout`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// The whole file, validated.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Who may request deletions, by source name (`[sources.NAME]`).
    #[serde(default)]
    pub sources: BTreeMap<String, SourceConfig>,
    /// Where a tenant's data starts.
    pub tenant: TenantConfig,
    /// Step 1: statements that hide the tenant at once.
    #[serde(default)]
    pub soft_delete: SoftDeleteConfig,
    /// Step 2: the batched hard delete.
    #[serde(default)]
    pub hard_delete: HardDeleteConfig,
    /// How fast the hard delete may go, and when it pauses for the target's sake.
    #[serde(default)]
    pub pacing: PacingConfig,
    /// The worker's leases, retries and polling.
    #[serde(default)]
    pub worker: WorkerConfig,
    /// Connection pools, one per role.
    #[serde(default)]
    pub pools: PoolsConfig,
    /// Request limits at the HTTP edge.
    #[serde(default)]
    pub intake: IntakeConfig,
    /// Vercel Marketplace partner API (`DELETE /v1/installations/{id}`); absent = route answers 404.
    pub vercel: Option<VercelConfig>,
    /// How `GET /metrics` reads gauges from the databases.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Signed HTTP callbacks when jobs finish (`[notifications]`); absent = events recorded, not sent.
    pub notifications: Option<NotificationsConfig>,
    /// How servers check operator tokens (`deprov tokens`).
    #[serde(default)]
    pub operator_tokens: OperatorTokensConfig,
    /// `deprov reconcile`: how fast released jobs become claimable.
    #[serde(default)]
    pub reconcile: ReconcileConfig,
}

/// `[reconcile]`: see [`crate::queue::reconcile`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileConfig {
    /// Jobs per second a reconcile releases (resumed, retried, created for orphans) when no
    /// `--rate` is given: the n-th released job becomes claimable n / rate seconds after the
    /// reconcile (default 2; 0.001..=1000).
    pub release_rate: f64,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        Self { release_rate: 2.0 }
    }
}

pub use crate::sources::SourceConfig;

/// `[tenant]`: the root of the foreign-key graph.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Schema-qualified root table, e.g. `app.accounts` (see [`QualifiedName::parse`]).
    pub root_table: String,
    /// The root's key column; `tenant_id` strings are cast to its type.
    pub key_column: String,
}

/// `[soft_delete]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoftDeleteConfig {
    /// Run in one transaction on the target, `$1` = the tenant key (bound with the type PostgreSQL
    /// infers for `$1`: text, an integer type or uuid). Must be idempotent: a retried job runs them again.
    #[serde(default)]
    pub statements: Vec<String>,
    /// Undo of the soft delete (`deprov jobs undo`, a reinstall during the grace period): run in
    /// one transaction on the target, `$1` = the tenant key, like `statements`. Must be idempotent.
    /// Empty = a soft delete cannot be undone (a reinstall then only cancels the pending job).
    #[serde(default)]
    pub undo_statements: Vec<String>,
    /// A statement without parameters returning, in its first column (text, an integer or uuid),
    /// the key of every tenant currently soft-deleted on the target. `deprov reconcile` reports
    /// such tenants without a job as orphans; without it orphans are "not configured".
    pub orphans: Option<String>,
}

/// `[hard_delete]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HardDeleteConfig {
    /// Time between the soft delete and the start of the hard delete (default `0s`).
    #[serde(with = "humantime_serde")]
    pub grace_period: Duration,
    /// Rows of the first batch of every step, 1..=100000 (default 50: small, because a table's cost
    /// per row is unknown until measured); later batches are sized by time.
    pub batch_rows: u32,
    /// Upper bound on rows per batch, at least `batch_rows` (default 100000).
    pub max_batch_rows: u32,
    /// The longest a batch transaction should take (default 100ms): the size controller aims each
    /// batch at half of it. Must be below `statement_timeout`.
    #[serde(with = "humantime_serde")]
    pub max_batch_duration: Duration,
    /// `SET LOCAL lock_timeout` of every batch (default 50ms); must be below `statement_timeout`.
    #[serde(with = "humantime_serde")]
    pub lock_timeout: Duration,
    /// `SET LOCAL statement_timeout` of every batch (default 5s).
    #[serde(with = "humantime_serde")]
    pub statement_timeout: Duration,
    /// Estimated rows PostgreSQL's own cascade may delete per row a batch deletes (default 2000;
    /// 0 = always delete leaves first). Tables whose rows have few descendants are then deleted by
    /// their parents' batches through the cascade, visiting each row once (see `engine::absorb`).
    pub cascade_rows: u32,
    /// Most rows the cascade pre-check ([`crate::engine::simulate`]) may hold in memory, 1..=100000000
    /// (default 5000000): the rows the cascade would delete or update, plus those it looks up. Above
    /// it the job fails rather than guess whether the cascade would succeed.
    pub max_simulated_rows: u64,
    /// How often, at most, the job's checkpoint is written (default 1s; 0s = after every batch,
    /// each batch committing with `synchronous_commit = on`). Above 0s, batches commit with `SET
    /// LOCAL synchronous_commit = off` (PostgreSQL docs §30.4 "Asynchronous Commit"), and before
    /// each checkpoint deprov flushes them ([`crate::engine::flush`]), so every checkpoint names
    /// deletions already durable. A target that restarts or recovers from a crash between two
    /// checkpoints may lose the batches in between; the next batch or flush sees it
    /// ([`crate::engine::Incarnation`]) and the job resumes from the last checkpoint. The lease is
    /// renewed with the checkpoint, so a `worker.lease` under three times this shortens it to a
    /// third of the lease ([`Self::checkpoint_every`]).
    #[serde(with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// Before anything is deleted, run the tenant's cascading `DELETE` in a transaction that is
    /// always rolled back, bounded like a cascading batch, and refuse the job when PostgreSQL says
    /// it fails or deletes nothing ([`crate::engine::trial`]; default true). `false` for schemas
    /// whose delete triggers do something outside the database that must not happen twice.
    pub trial_cascade: bool,
    /// With `trial_cascade`: the trial commits when it succeeds, the soft-delete statements in
    /// the same transaction ([`crate::engine::whole`]; default true). A tenant whose whole
    /// cascade fits the trial's bound is then deleted by one transaction, as PostgreSQL's
    /// cascade deletes it, with no batches; a larger one rolls back and is deleted in batches.
    /// With a grace period it runs when the grace period ends, without the soft delete.
    pub whole_cascade: bool,
    /// What to do when the tenant's tables have user triggers on `DELETE`
    /// ([`crate::engine::trial::delete_triggers`]): `refuse` the job before anything is deleted
    /// (default), or `allow` them when they do not depend on the order rows go in.
    pub user_triggers: UserTriggers,
}

/// `[hard_delete] user_triggers`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserTriggers {
    /// Refuse a tenant whose tables have user `DELETE` triggers: deprov's leaves-first order is not
    /// the cascade's, and a trigger may see the difference.
    #[default]
    Refuse,
    /// Delete anyway: the operator vouches that the triggers do not depend on that order.
    Allow,
}

impl HardDeleteConfig {
    /// The checkpoint interval in force under a `lease`: `checkpoint_interval`, at most a third of
    /// the lease (so a worker renews its lease at least three times within it).
    pub fn checkpoint_every(&self, lease: Duration) -> Duration {
        self.checkpoint_interval.min(lease / 3)
    }

    /// The `statement_timeout` bound of a batch transaction and of the trial cascade: ⅘ of
    /// `max_batch_duration`, at least `lock_timeout` + 1 ms, so that a batch slower than the
    /// sizing controller expected (a cascade larger than estimated, a stall) is cut short and
    /// retried smaller within the batch's time instead of holding its locks for longer. A step
    /// whose single row cannot be deleted within it gets the full `statement_timeout`
    /// (`worker::run::hard_delete`).
    pub fn batch_timeout(&self) -> Duration {
        (self.max_batch_duration * 4 / 5).max(self.lock_timeout + Duration::from_millis(1))
    }
}

impl Default for HardDeleteConfig {
    fn default() -> Self {
        Self {
            grace_period: Duration::ZERO,
            batch_rows: 50,
            max_batch_rows: 100_000,
            max_batch_duration: Duration::from_millis(100),
            lock_timeout: Duration::from_millis(50),
            statement_timeout: Duration::from_secs(5),
            cascade_rows: 2_000,
            max_simulated_rows: 5_000_000,
            checkpoint_interval: Duration::from_secs(1),
            trial_cascade: true,
            whole_cascade: true,
            user_triggers: UserTriggers::Refuse,
        }
    }
}

/// `[pacing]`: a rate limit on the hard delete and back-off when the target shows distress.
///
/// Distress is read from the target between batches, at most once per `check_interval`:
/// sessions waiting on a lock (`pg_stat_activity.wait_event_type = 'Lock'`, PostgreSQL docs §28.2.3)
/// and the largest `replay_lag` in `pg_stat_replication` (§28.2.4; none without standbys). A batch
/// that took longer than `hard_delete.max_batch_duration` is distress too. Under distress the worker
/// pauses between batches, `backoff` first and doubling while it lasts, up to `backoff_max`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PacingConfig {
    /// The largest share of wall time the hard delete may work (default 1 = no rest; 0.0001..=1):
    /// after each batch the worker rests `work × (1 − duty_cycle) / duty_cycle`, the work being
    /// everything since its last rest (batches, checkpoints). The same idea as gh-ost's
    /// `--nice-ratio` (`duty_cycle = 1 / (1 + nice_ratio)`). Unlike `rate_limit` it bounds the
    /// target's time spent on the deletion whatever a row costs.
    pub duty_cycle: f64,
    /// Most rows deleted per second, over all batches of a job (default 0 = unlimited). Enforced
    /// by a GCRA limiter (governor) with one second of burst.
    pub rate_limit: u32,
    /// Pause while more than this many target sessions wait on a lock (default 10; 0 = never).
    pub max_lock_waiters: u32,
    /// Pause while a standby's `replay_lag` exceeds this (default 10s; 0s = never).
    #[serde(with = "humantime_serde")]
    pub max_replication_lag: Duration,
    /// How often distress is read from the target (default 1s).
    #[serde(with = "humantime_serde")]
    pub check_interval: Duration,
    /// The first pause under distress (default 200ms).
    #[serde(with = "humantime_serde")]
    pub backoff: Duration,
    /// The longest pause (default 10s); a pause is also capped at a third of `worker.lease`, so a
    /// paused job keeps its lease.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
}

impl Default for PacingConfig {
    fn default() -> Self {
        Self {
            duty_cycle: 1.0,
            rate_limit: 0,
            max_lock_waiters: 10,
            max_replication_lag: Duration::from_secs(10),
            check_interval: Duration::from_secs(1),
            backoff: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
        }
    }
}

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

/// `[intake]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntakeConfig {
    /// Largest accepted request body in bytes (default 16384); larger bodies get 413.
    pub max_body_bytes: usize,
    /// Largest accepted request header, names + values in bytes, 1024..=1048576 (default 16384);
    /// larger gets 431 (see `http::serve`).
    pub max_header_bytes: usize,
    /// How long a client may take to send a request's header, and how long an idle keep-alive
    /// connection stays open, 100ms..=60s (default 5s); then the connection is closed.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Per-source request rate limit (`[intake.rate_limit]`).
    pub rate_limit: RateLimitConfig,
    /// Most deletion requests recorded in one durable transaction, 1..=1000 (default 32; 1 = one
    /// transaction per request). Requests that arrive together share a `COMMIT` and its WAL flush;
    /// a request on an idle service is never held back (see `queue::group_commit`).
    pub group_commit: usize,
    /// Writer tasks recording groups, each on its own intake connection, 1..=1000 (default 2; at
    /// most `[pools.intake] max_connections` run). Fewer writers make larger groups, and a group
    /// costs PostgreSQL little more than one request, so fewer writers record more requests/s at
    /// saturation but leave a stalled writer fewer peers. On `deprov bench intake` (128 clients,
    /// PgBouncer, a 2-core machine): 2 writers 7,788 requests/s, 4 writers 6,603/s, 8 writers
    /// 6,877/s; intake's p99 with the target saturated with lock waits stayed within 1.5× its
    /// baseline with 2 writers and exceeded it with 3, 4 and 8 (README "Known limits").
    pub group_writers: usize,
}

impl Default for IntakeConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 * 1024,
            max_header_bytes: 16 * 1024,
            header_timeout: Duration::from_secs(5),
            rate_limit: RateLimitConfig::default(),
            group_commit: 32,
            group_writers: 2,
        }
    }
}

/// `[vercel]`: the Marketplace partner API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VercelConfig {
    /// The `[sources.NAME]` whose credentials the partner API requests carry.
    pub source: String,
    /// Optional statement run by the worker on the target, `$1` = installation ID, returning the
    /// tenant key in its first column. Without it the installation ID is the tenant key.
    pub tenant_lookup: Option<String>,
}

impl Config {
    /// Reads and validates the file at `path`. Source tokens given by `token_env` are resolved here.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key at fault.
    pub fn load(path: &str) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Parses and validates TOML text.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key at fault.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let mut config: Config = toml::from_str(text)?;
        for (name, source) in &mut config.sources {
            source.prepare(name)?;
        }
        if let Some(n) = &mut config.notifications {
            n.prepare()?;
        }
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        QualifiedName::parse(&self.tenant.root_table)
            .map_err(|r| invalid("tenant.root_table", r))?;
        if self.tenant.key_column.is_empty() {
            return Err(invalid("tenant.key_column", "must not be empty"));
        }
        let mut seen = BTreeMap::new();
        for (name, source) in &self.sources {
            let key = format!("sources.{name}");
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(invalid(
                    key,
                    "source names are 1..=64 characters of [A-Za-z0-9-_.]",
                ));
            }
            if source.scheme != crate::sources::Scheme::Bearer {
                continue;
            }
            let token = source.resolve_token().map_err(|r| invalid(&key, r))?;
            if token.len() < 16 {
                return Err(invalid(
                    format!("{key}.token"),
                    "must be at least 16 characters",
                ));
            }
            if let Some(other) = seen.insert(token, name.clone()) {
                return Err(invalid(
                    format!("{key}.token"),
                    format!("same token as sources.{other}: a token must name one source"),
                ));
            }
        }
        for (i, s) in self.soft_delete.statements.iter().enumerate() {
            if s.trim().is_empty() {
                return Err(invalid(
                    format!("soft_delete.statements[{i}]"),
                    "must not be empty",
                ));
            }
        }
        for (i, s) in self.soft_delete.undo_statements.iter().enumerate() {
            if s.trim().is_empty() {
                return Err(invalid(
                    format!("soft_delete.undo_statements[{i}]"),
                    "must not be empty",
                ));
            }
        }
        if self
            .soft_delete
            .orphans
            .as_deref()
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err(invalid("soft_delete.orphans", "must not be empty"));
        }
        let rate = self.reconcile.release_rate;
        if !(0.001..=1000.0).contains(&rate) {
            return Err(invalid(
                "reconcile.release_rate",
                "must be between 0.001 and 1000 (jobs per second)",
            ));
        }
        let hd = &self.hard_delete;
        if !(1..=100_000).contains(&hd.batch_rows) {
            return Err(invalid(
                "hard_delete.batch_rows",
                "must be between 1 and 100000",
            ));
        }
        if hd.max_batch_rows < hd.batch_rows || hd.max_batch_rows > 1_000_000 {
            return Err(invalid(
                "hard_delete.max_batch_rows",
                "must be between hard_delete.batch_rows and 1000000",
            ));
        }
        if !(1..=100_000_000).contains(&hd.max_simulated_rows) {
            return Err(invalid(
                "hard_delete.max_simulated_rows",
                "must be between 1 and 100000000",
            ));
        }
        if hd.statement_timeout.is_zero() || hd.statement_timeout > Duration::from_secs(600) {
            return Err(invalid(
                "hard_delete.statement_timeout",
                "must be between 1ms and 10m",
            ));
        }
        if hd.max_batch_duration < Duration::from_millis(1)
            || hd.max_batch_duration >= hd.statement_timeout
        {
            return Err(invalid(
                "hard_delete.max_batch_duration",
                "must be at least 1ms and below hard_delete.statement_timeout",
            ));
        }
        if hd.lock_timeout.is_zero() || hd.lock_timeout >= hd.statement_timeout {
            return Err(invalid(
                "hard_delete.lock_timeout",
                "must be above 0 and below hard_delete.statement_timeout",
            ));
        }
        let p = &self.pacing;
        if !(0.0001..=1.0).contains(&p.duty_cycle) {
            return Err(invalid(
                "pacing.duty_cycle",
                "must be from 0.0001 to 1 (the share of wall time the hard delete may work)",
            ));
        }
        if p.check_interval.is_zero() {
            return Err(invalid("pacing.check_interval", "must be above 0"));
        }
        if p.backoff.is_zero() {
            return Err(invalid("pacing.backoff", "must be above 0"));
        }
        if p.backoff_max < p.backoff {
            return Err(invalid(
                "pacing.backoff_max",
                "must be at least pacing.backoff",
            ));
        }
        let w = &self.worker;
        if w.lease < Duration::from_secs(1) {
            return Err(invalid("worker.lease", "must be at least 1s"));
        }
        if w.lease <= hd.statement_timeout {
            return Err(invalid(
                "worker.lease",
                "must exceed hard_delete.statement_timeout, or a slow batch loses its lease",
            ));
        }
        if w.poll_interval.is_zero() {
            return Err(invalid("worker.poll_interval", "must be above 0"));
        }
        if w.heartbeat_interval.is_zero() {
            return Err(invalid("worker.heartbeat_interval", "must be above 0"));
        }
        if w.stale_after < w.heartbeat_interval * 2 {
            return Err(invalid(
                "worker.stale_after",
                "must be at least twice worker.heartbeat_interval",
            ));
        }
        if !(1..=1000).contains(&w.max_attempts) {
            return Err(invalid("worker.max_attempts", "must be between 1 and 1000"));
        }
        if w.backoff_base.is_zero() || w.backoff_max < w.backoff_base {
            return Err(invalid(
                "worker.backoff_max",
                "must be at least worker.backoff_base, which must be above 0",
            ));
        }
        for (role, pool) in [
            ("intake", &self.pools.intake),
            ("queue", &self.pools.queue),
            ("target", &self.pools.target),
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
        if !(256..=10 * 1024 * 1024).contains(&self.intake.max_body_bytes) {
            return Err(invalid(
                "intake.max_body_bytes",
                "must be between 256 and 10485760",
            ));
        }
        if !(1..=1000).contains(&self.intake.group_commit) {
            return Err(invalid("intake.group_commit", "must be between 1 and 1000"));
        }
        if !(1..=1000).contains(&self.intake.group_writers) {
            return Err(invalid(
                "intake.group_writers",
                "must be between 1 and 1000",
            ));
        }
        if !(1024..=1024 * 1024).contains(&self.intake.max_header_bytes) {
            return Err(invalid(
                "intake.max_header_bytes",
                "must be between 1024 and 1048576",
            ));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(60))
            .contains(&self.intake.header_timeout)
        {
            return Err(invalid(
                "intake.header_timeout",
                "must be between 100ms and 60s",
            ));
        }
        self.intake.rate_limit.validate()?;
        self.metrics.validate()?;
        self.operator_tokens.validate()?;
        if let Some(v) = &self.vercel {
            match self.sources.get(&v.source).map(|s| s.scheme) {
                None => {
                    return Err(invalid(
                        "vercel.source",
                        format!("no [sources.{}] is configured", v.source),
                    ));
                }
                Some(crate::sources::Scheme::Bearer | crate::sources::Scheme::VercelOidc) => {}
                Some(other) => {
                    return Err(invalid(
                        "vercel.source",
                        format!(
                            "sources.{} has scheme {:?}; the partner API needs bearer or vercel-oidc",
                            v.source,
                            other.as_str()
                        ),
                    ));
                }
            }
            if v.tenant_lookup
                .as_deref()
                .is_some_and(|s| s.trim().is_empty())
            {
                return Err(invalid("vercel.tenant_lookup", "must not be empty"));
            }
        }
        Ok(())
    }

    /// The root table, parsed (validated at load).
    pub fn root_table(&self) -> QualifiedName {
        QualifiedName::parse(&self.tenant.root_table).expect("validated at load")
    }

    /// `(token, source name)` pairs for authenticating intake.
    pub fn source_tokens(&self) -> Vec<(String, String)> {
        self.sources
            .iter()
            .filter(|(_, s)| s.scheme == crate::sources::Scheme::Bearer)
            .map(|(name, s)| (s.resolve_token().expect("validated at load"), name.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [sources.billing]
        token = "billing-token-0123456789"
        [tenant]
        root_table = "app.accounts"
        key_column = "id"
    "#;

    #[test]
    fn minimal_file_gets_defaults() {
        let c = Config::from_toml(MINIMAL).unwrap();
        assert_eq!(c.hard_delete.batch_rows, 50);
        assert_eq!(c.hard_delete.cascade_rows, 2_000);
        assert_eq!(c.pacing.rate_limit, 0);
        assert_eq!(c.pacing.backoff, Duration::from_millis(200));
        assert_eq!(c.hard_delete.lock_timeout, Duration::from_millis(50));
        assert_eq!(c.pools.target.max_connections, 2);
        assert_eq!(c.root_table(), QualifiedName::new("app", "accounts"));
    }

    #[test]
    fn a_pool_key_left_out_keeps_its_pools_default() {
        let c = Config::from_toml(&format!(
            "{MINIMAL}\n[pools.target]\nmax_connections = 3\n[pools.intake]\nacquire_timeout = \"750ms\"\n"
        ))
        .unwrap();
        let p = &c.pools;
        assert_eq!(
            (p.target.max_connections, p.target.acquire_timeout),
            (3, Duration::from_secs(5))
        );
        assert_eq!(
            (p.intake.max_connections, p.intake.acquire_timeout),
            (8, Duration::from_millis(750))
        );
        assert_eq!(p.queue.max_connections, 4);
        let unknown = Config::from_toml(&format!("{MINIMAL}\n[pools.target]\nmax_conns = 3\n"));
        assert!(unknown.is_err(), "an unknown key is refused");
        let out_of_range =
            Config::from_toml(&format!("{MINIMAL}\n[pools.target]\nmax_connections = 0\n"));
        assert!(out_of_range.is_err(), "0 connections is refused");
    }

    #[test]
    fn reconcile_and_undo_keys_are_checked_and_named() {
        let c = Config::from_toml(MINIMAL).unwrap();
        assert_eq!(c.reconcile.release_rate, 2.0);
        assert!(c.soft_delete.undo_statements.is_empty() && c.soft_delete.orphans.is_none());
        for (extra, key) in [
            ("[reconcile]\nrelease_rate = 0.0", "reconcile.release_rate"),
            (
                "[reconcile]\nrelease_rate = 5000.0",
                "reconcile.release_rate",
            ),
            (
                "[soft_delete]\nundo_statements = [\" \"]",
                "soft_delete.undo_statements[0]",
            ),
            ("[soft_delete]\norphans = \"\"", "soft_delete.orphans"),
            (
                "[sources.shop]\ntoken = \"shop-token-0123456789ab\"\ndelete_events = [\"a\"]\nrestore_events = [\"a\"]",
                "sources.shop.restore_events",
            ),
        ] {
            let err = Config::from_toml(&format!("{MINIMAL}\n{extra}")).expect_err(extra);
            assert!(err.to_string().contains(key), "{extra}: {err}");
        }
    }

    #[test]
    fn the_deploy_example_is_valid() {
        let text = include_str!("../deploy/example.toml")
            .replace(
                "token_env = \"DEPROV_BILLING_TOKEN\"",
                "token = \"billing-token-0123456789\"",
            )
            .replace(
                "token_env = \"DEPROV_VERCEL_TOKEN\"",
                "token = \"vercel-token-0123456789\"",
            );
        let c = Config::from_toml(&text).unwrap();
        assert_eq!(c.root_table(), QualifiedName::new("app", "accounts"));
        assert_eq!(c.vercel.unwrap().source, "vercel");
        assert_eq!(c.soft_delete.statements.len(), 1);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = Config::from_toml(&format!("{MINIMAL}\n[hard_delete]\nbatch_rowz = 5\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("batch_rowz"), "{err}");
    }

    #[test]
    fn invalid_values_are_named() {
        let cases = [
            (
                "[hard_delete]\nlock_timeout = \"10s\"\nstatement_timeout = \"5s\"",
                "hard_delete.lock_timeout",
            ),
            ("[hard_delete]\nbatch_rows = 0", "hard_delete.batch_rows"),
            // Named as itself, not as the max_batch_duration it must exceed.
            (
                "[hard_delete]\nstatement_timeout = \"0s\"",
                "hard_delete.statement_timeout",
            ),
            (
                "[hard_delete]\nmax_simulated_rows = 0",
                "hard_delete.max_simulated_rows",
            ),
            ("[pacing]\nbackoff = \"0s\"", "pacing.backoff"),
            ("[pacing]\nduty_cycle = 0", "pacing.duty_cycle"),
            ("[pacing]\nduty_cycle = 1.5", "pacing.duty_cycle"),
            ("[pacing]\nduty_cycle = nan", "pacing.duty_cycle"),
            (
                "[pacing]\nbackoff = \"1s\"\nbackoff_max = \"100ms\"",
                "pacing.backoff_max",
            ),
            ("[pacing]\ncheck_interval = \"0s\"", "pacing.check_interval"),
            ("[hard_delete]\nlock_timeout = \"fast\"", "lock_timeout"),
            (
                "[pools.target]\nmax_connections = 0\nacquire_timeout = \"1s\"",
                "pools.target.max_connections",
            ),
            ("[vercel]\nsource = \"nobody\"", "vercel.source"),
            (
                "[intake.rate_limit]\nper_second = -1.0",
                "intake.rate_limit.per_second",
            ),
            ("[intake.rate_limit]\nburst = 0", "intake.rate_limit.burst"),
            ("[metrics]\nread_timeout = \"0s\"", "metrics.read_timeout"),
        ];
        for (extra, key) in cases {
            let err = Config::from_toml(&format!("{MINIMAL}\n{extra}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{extra:?} -> {err}");
        }
        let bad_root = MINIMAL.replace("app.accounts", "accounts");
        assert!(
            Config::from_toml(&bad_root)
                .unwrap_err()
                .to_string()
                .contains("tenant.root_table")
        );
        let short = MINIMAL.replace("billing-token-0123456789", "short");
        assert!(
            Config::from_toml(&short)
                .unwrap_err()
                .to_string()
                .contains("sources.billing.token")
        );
    }
}
