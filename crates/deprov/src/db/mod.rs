//! Isolated, bounded connection pools, and the shape of every statement deprov runs.
//!
//! ## Pools
//! deprov opens one pool per role — `intake` and `queue` on its state database, `target` on the
//! application database — each with its own `max_connections` and `acquire_timeout`, so deletion work
//! can never take the connections intake needs, and nothing waits without bound for a connection
//! (incident 3 in `shared/notes/incidents.md`). Every connection sets `application_name` to
//! `deprov-<role>` so operators can find deprov in `pg_stat_activity`.
//!
//! ## Every statement is bounded on the server, never by the caller
//! Every statement deprov runs is inside an explicit transaction opened by [`begin`], whose opening
//! message is one simple-protocol query `BEGIN; SET LOCAL lock_timeout = …; SET LOCAL
//! statement_timeout = …` ([`Bounds`]; the engine passes `[hard_delete]`'s values, the queue, intake
//! and health use [`Bounds::STATE`]). PostgreSQL then ends a statement that runs too long (SQLSTATE
//! 57014) or waits too long for a lock (55P03) by itself, with an ERROR: the transaction rolls back,
//! the connection survives and goes back to its pool. `SET LOCAL` lasts until the transaction ends, so
//! no setting outlives it on a pooled server connection.
//!
//! The opening also turns JIT compilation off (`SET LOCAL jit = off`): PostgreSQL compiles a
//! statement estimated above `jit_above_cost` before running it, and a cancel waits for the
//! compile ([`crate::sql::begin_bounded`]).
//!
//! The same opening sets `idle_in_transaction_session_timeout` ([`idle_in_transaction_timeout`]):
//! a transaction whose client stops sending (a frozen or partitioned worker) is ended by the server,
//! which closes that one session (FATAL 25P03) and rolls it back, instead of holding its row locks
//! until the client wakes up and possibly committing a batch after a kill switch was acknowledged.
//! deprov itself never idles in a transaction: each one is a few statements sent back to back.
//!
//! deprov never puts a client-side deadline around a statement. sqlx sends no cancel when a query
//! future is dropped: the statement runs on to completion (a write still commits) while the pool waits
//! for the connection, and closing the connection to cancel instead is the reconnect churn that took a
//! pooler down (`shared/notes/postgres-pooling.md`). A caller's deadline ends only the caller's wait:
//! HTTP handlers run in their own task, so the request timeout and a client hanging up leave the
//! handler's transaction to finish or fail by its server-side bounds (`crate::http`); the worker
//! awaits every statement. The waits that are bounded on the client are the ones that hold no
//! statement: `acquire_timeout` (waiting for a pool slot, the `test_before_acquire` ping, connecting).
//!
//! ## Behind PgBouncer in transaction mode
//! A transaction pooler hands a server connection to a client for one transaction and then to someone
//! else, so deprov keeps nothing on a connection outside a transaction:
//! - no session state: no plain `SET`, no session advisory locks, no `LISTEN`, no `options` startup
//!   parameter (PgBouncer 1.18 refuses it; [`PoolerMode::check_url`]);
//! - no named prepared statements: sqlx names them (`sqlx_s_N`, per client, so two clients sharing a
//!   server collide with `prepared statement "sqlx_s_1" already exists`) even with a statement cache
//!   of 0. deprov's statements go through [`query`], [`query_as`] and [`query_scalar`], which make
//!   them unnamed (`persistent(false)`) once [`PoolerMode::apply`] has seen transaction mode in this
//!   process; clippy (`disallowed-methods`, `clippy.toml`) keeps `sqlx::query*` out of the
//!   service modules. Directly, statements stay named and cached: an unnamed statement costs a
//!   second round trip and a parse every time, which cost 15–55 % of intake's throughput in runs
//!   on a 2-core machine;
//! - sqlx sends an unnamed statement as Parse/Describe/Sync, then Bind/Execute/Sync: outside a
//!   transaction PgBouncer may run the two halves on different servers. Inside [`begin`]'s
//!   transaction the server stays this client's until COMMIT or ROLLBACK.
//!
//! The one exception is sqlx's migrator (a session advisory lock and named statements), so under
//! `DEPROV_POOLER_MODE=transaction` deprov refuses to migrate through the pooler
//! ([`PoolerMode::allows_migrations`]). Transactions and `SET LOCAL` are the same in both modes; the
//! mode switches statements to unnamed and adds those checks.
//!
//! ## TCP keepalives
//! See [`keepalive`]: set on every new connection's socket in `after_connect`.
//!
//! ## Measured acquires
//! Every connection deprov takes from a pool goes through [`acquire`] (directly, or through [`begin`]),
//! which times the wait and counts acquire timeouts (sqlx reports neither); the pool's `after_connect`
//! hook counts new connections. Both feed [`crate::telemetry`] under the pool's [`PoolRole::label`].

// The one place the service calls sqlx's statement, transaction and acquire functions (clippy.toml).
#![allow(clippy::disallowed_methods)]

pub mod breaker;
pub mod errors;
pub mod keepalive;

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{FromRow, PgConnection, Postgres, SqlSafeStr, Transaction};

use crate::config::PoolConfig;
use crate::sql::{QualifiedName, SqlBuilder};

/// How deprov reaches its databases (`DEPROV_POOLER_MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PoolerMode {
    /// Directly, or through a pooler in session mode (PgBouncer `pool_mode = session`).
    #[default]
    Session,
    /// Through a transaction pooler (PgBouncer `pool_mode = transaction`): a server connection is
    /// this client's only for one transaction.
    Transaction,
}

/// Whether [`query`] and friends make unnamed statements; set for good by [`PoolerMode::apply`].
static UNNAMED_STATEMENTS: AtomicBool = AtomicBool::new(false);

impl PoolerMode {
    /// Makes this process's statements ([`query`], [`query_as`], [`query_scalar`]) unnamed from now
    /// on when `self` is `Transaction`; `Session` changes nothing. Process-wide and one-way on
    /// purpose: unnamed statements are correct everywhere, named ones only while no connection of
    /// this process goes through a transaction pooler. Call it before building such pools.
    pub fn apply(self) {
        if self == Self::Transaction {
            UNNAMED_STATEMENTS.store(true, Ordering::Relaxed);
        }
    }

    /// Whether statements are unnamed in this process (see [`Self::apply`]).
    pub fn unnamed_statements() -> bool {
        UNNAMED_STATEMENTS.load(Ordering::Relaxed)
    }

    /// Refuses what cannot pass the pooler: in transaction mode a URL with `options` (startup
    /// parameters other than a few tracked ones make PgBouncer 1.18 refuse the login; use `SET LOCAL`
    /// or `ALTER ROLE … SET` instead).
    ///
    /// # Errors
    /// The reason, for the setting named by the caller.
    pub fn check_url(self, options: &PgConnectOptions) -> Result<(), String> {
        if self == Self::Transaction && options.get_options().is_some_and(|o| !o.is_empty()) {
            return Err(
                "the URL sets `options`, which PgBouncer 1.18 cannot pass; set the server \
                        settings with ALTER ROLE … SET instead"
                    .into(),
            );
        }
        Ok(())
    }

    /// Whether deprov's migrations may run through this connection: not through a transaction pooler
    /// (sqlx's migrator holds a session advisory lock and uses named prepared statements).
    pub fn allows_migrations(self) -> bool {
        self == Self::Session
    }
}

/// Server-side bounds of one transaction (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `SET LOCAL lock_timeout`: the longest wait for one lock (SQLSTATE 55P03).
    pub lock_timeout: Duration,
    /// `SET LOCAL statement_timeout`: the longest one statement may run, lock waits included
    /// (SQLSTATE 57014).
    pub statement_timeout: Duration,
    /// `SET LOCAL synchronous_commit`: the server's default, `on` or `off`.
    pub commit: Commit,
    /// `SET LOCAL enable_seqscan`, `enable_bitmapscan`, `enable_indexonlyscan` = off: the planner
    /// reads through plain index scans where it can (for `engine::kill_dead_entries`, whose scan
    /// must visit the heap to mark dead index entries).
    pub plain_index_scans: bool,
}

impl Bounds {
    /// deprov's own statements on its state database (intake, queue, kill switch, operator reads,
    /// readiness): lock waits of at most 1 s, statements of at most 5 s. They touch a few rows by key,
    /// so reaching either means something else is wrong; the caller answers 503 or retries later.
    pub const STATE: Self = Self {
        lock_timeout: Duration::from_secs(1),
        statement_timeout: Duration::from_secs(5),
        commit: Commit::Default,
        plain_index_scans: false,
    };

    /// Bounds with the given timeouts, not durable.
    pub fn new(lock_timeout: Duration, statement_timeout: Duration) -> Self {
        Self {
            lock_timeout,
            statement_timeout,
            commit: Commit::Default,
            plain_index_scans: false,
        }
    }

    /// The same bounds with plain index scans preferred (see [`Self::plain_index_scans`]).
    pub fn plain_index_scans(self) -> Self {
        Self {
            plain_index_scans: true,
            ..self
        }
    }

    /// The same bounds with `synchronous_commit = on`.
    pub fn durable(self) -> Self {
        Self {
            commit: Commit::Durable,
            ..self
        }
    }

    /// The same bounds with `synchronous_commit = off` (see [`Commit::Deferred`]).
    pub fn deferred(self) -> Self {
        Self {
            commit: Commit::Deferred,
            ..self
        }
    }

    /// What a transaction under these bounds sets at `BEGIN` ([`crate::sql::begin_bounded`]),
    /// `idle_in_transaction_session_timeout` by [`idle_in_transaction_timeout`].
    pub fn opening(&self) -> crate::sql::Opening {
        crate::sql::Opening {
            lock: self.lock_timeout,
            statement: self.statement_timeout,
            idle: idle_in_transaction_timeout(self.statement_timeout),
            synchronous_commit: match self.commit {
                Commit::Default => None,
                Commit::Durable => Some(true),
                Commit::Deferred => Some(false),
            },
            plain_index_scans: self.plain_index_scans,
        }
    }
}

/// The `idle_in_transaction_session_timeout` of a transaction whose statements are bounded by
/// `statement_timeout`: the same, but at least 1 s, so a worker slowed by a busy machine (a few
/// milliseconds between statements) is never cut off. With the defaults (`[hard_delete]
/// statement_timeout` 5 s, `[worker] stale_after` 10 s) a frozen worker's batch is rolled back by
/// the server before `deprov kill-switch on --wait` stops waiting for that worker. PostgreSQL docs
/// §20.11.1.
pub fn idle_in_transaction_timeout(statement_timeout: Duration) -> Duration {
    statement_timeout.max(Duration::from_secs(1))
}

/// How a bounded transaction commits (`SET LOCAL synchronous_commit`, PostgreSQL docs §20.5.1 and
/// §30.4 "Asynchronous Commit").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// The server's (or role's) `synchronous_commit`: nothing is set.
    Default,
    /// `on`: the COMMIT returns only once the transaction is durable, whatever the server's default
    /// (intake promises that an answered request is stored).
    Durable,
    /// `off`: the COMMIT returns before its WAL is flushed (the WAL writer flushes it within
    /// 3 × `wal_writer_delay`); a server crash before then loses the transaction as a whole. For
    /// the hard delete's batches between checkpoints (`[hard_delete] checkpoint_interval`).
    Deferred,
}

/// Takes a connection from `pool`, recording the wait in `deprov_db_pool_acquire_seconds` and a
/// [`sqlx::Error::PoolTimedOut`] in `deprov_db_pool_acquire_timeouts_total` (both labelled by pool).
/// Waits at most the pool's `acquire_timeout`. The one place deprov calls sqlx's `Pool::acquire`
/// (the rule check in `db/rule_tests.rs` allows it here only).
///
/// # Errors
/// sqlx's acquire errors: `PoolTimedOut` (no connection within `acquire_timeout`, which includes
/// connecting to a database that is down — and at once, while [`breaker`] knows it is down),
/// `PoolClosed`.
pub async fn acquire(pool: &PgPool) -> Result<PoolConnection<Postgres>, sqlx::Error> {
    let started = Instant::now();
    if !breaker::admit(pool) {
        // The database is down (see `breaker`): fail at once instead of waiting acquire_timeout.
        crate::telemetry::pool_acquired(pool_label(pool), started.elapsed(), true);
        return Err(sqlx::Error::PoolTimedOut);
    }
    let result = pool.acquire().await;
    let timed_out = matches!(result, Err(sqlx::Error::PoolTimedOut));
    if result.is_ok() || timed_out {
        breaker::record(pool, timed_out);
    }
    crate::telemetry::pool_acquired(pool_label(pool), started.elapsed(), timed_out);
    result
}

/// Whether `e` says the connection it came from is gone: an I/O, TLS or protocol error (the peer
/// closed the socket: "expected to read 5 bytes, got 0 bytes at EOF"), SQLSTATE class 08
/// (connection exception), 57P01–57P03 (the server is shutting down, crashed or is starting) or
/// 25P03 (the server ended an idle transaction's session). PostgreSQL docs, Appendix A.
pub fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|c| {
            use crate::sqlstate::*;
            is_connection_exception(&c)
                || matches!(
                    c.as_ref(),
                    ADMIN_SHUTDOWN
                        | CRASH_SHUTDOWN
                        | CANNOT_CONNECT_NOW
                        | IDLE_IN_TRANSACTION_SESSION_TIMEOUT
                )
        }),
        _ => false,
    }
}

/// Closes the connections idle in `pool` and returns how many it closed. Called once a connection
/// was found gone ([`connection_lost`]): after PgBouncer or PostgreSQL restarted, every connection
/// idle in the pool is almost always gone too, and through a transaction pooler none is pinged before
/// use ([`pool`]), so each would fail one more statement — for the worker, one more job run and one
/// more attempt per dead connection. The pool opens new ones when next asked (counted in
/// `deprov_db_connections_opened_total`); a connection in use is left to its holder.
pub fn discard_idle(pool: &PgPool) -> usize {
    let mut closed = 0;
    for _ in 0..pool.options().get_max_connections() {
        let Some(mut conn) = pool.try_acquire() else {
            break;
        };
        conn.close_on_drop();
        drop(conn);
        closed += 1;
    }
    closed
}

/// [`acquire`]s a connection from `pool` and opens a bounded transaction on it (one round trip,
/// simple protocol; see the module docs). Commit it; dropping it rolls back. The acquire wait is
/// recorded by [`acquire`]; the `BEGIN` round trip is not part of it.
///
/// # Errors
/// Pool acquire timeout, connection errors.
pub async fn begin(
    pool: &PgPool,
    bounds: Bounds,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    begin_acquired(acquire(pool).await?, bounds).await
}

/// [`begin`] on a connection already [`acquire`]d, for a caller that times the transaction
/// without the acquire wait (a batch's duration is how long it may hold locks).
///
/// # Errors
/// Connection errors.
pub async fn begin_acquired(
    conn: PoolConnection<Postgres>,
    bounds: Bounds,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    // What `Pool::begin_with` does after its acquire (sqlx-core 0.9).
    Transaction::begin(
        conn,
        Some(crate::sql::begin_bounded(&bounds.opening()).into_sql_str()),
    )
    .await
}

/// [`begin`] on a connection the caller already holds.
///
/// # Errors
/// Connection errors; [`sqlx::Error::InvalidSavePointStatement`] when already in a transaction.
pub async fn begin_on(
    conn: &mut PgConnection,
    bounds: Bounds,
) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
    use sqlx::Connection as _;
    conn.begin_with(crate::sql::begin_bounded(&bounds.opening()))
        .await
}

/// A savepoint in the transaction already open on `conn` (from [`begin`] or [`begin_on`], whose
/// [`Bounds`] it shares): `SAVEPOINT`, then `RELEASE` on commit or `ROLLBACK TO SAVEPOINT` on
/// rollback or drop. A statement that fails inside it aborts only the savepoint, so the caller's
/// transaction goes on (the configured-SQL check retries a refused Describe this way).
///
/// # Errors
/// [`sqlx::Error::BeginFailed`] when `conn` is not in a transaction (no unbounded transaction is
/// ever opened here); connection errors.
pub async fn savepoint(conn: &mut PgConnection) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
    use sqlx::Connection as _;
    if !conn.is_in_transaction() {
        return Err(sqlx::Error::BeginFailed);
    }
    conn.begin().await
}

/// `sqlx::query`, unnamed in transaction pooler mode (see [`PoolerMode::apply`] and the module docs).
pub fn query<'q>(sql: impl SqlSafeStr) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(sql).persistent(!PoolerMode::unnamed_statements())
}

/// `sqlx::query_as`, unnamed in transaction pooler mode.
pub fn query_as<'q, O>(sql: impl SqlSafeStr) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_as(sql).persistent(!PoolerMode::unnamed_statements())
}

/// `sqlx::query_scalar`, unnamed in transaction pooler mode.
pub fn query_scalar<'q, O>(sql: impl SqlSafeStr) -> QueryScalar<'q, Postgres, O, PgArguments>
where
    (O,): for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_scalar(sql).persistent(!PoolerMode::unnamed_statements())
}

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
    /// A worker's `LISTEN` connection for kill switch changes (`crate::worker::presence`).
    Listener,
}

impl PoolRole {
    /// The `application_name` connections of this role carry.
    pub fn application_name(self) -> &'static str {
        match self {
            Self::Intake => "deprov-intake",
            Self::Queue => "deprov-worker",
            Self::Target => "deprov-target",
            Self::Cli => "deprov-cli",
            Self::Listener => "deprov-listener",
        }
    }

    /// The `pool` label of this role's metrics: `intake`, `queue`, `target`, `cli` (the names of
    /// `[pools.*]`), and `listener` (a worker's LISTEN connection).
    pub fn label(self) -> &'static str {
        match self {
            Self::Intake => "intake",
            Self::Queue => "queue",
            Self::Target => "target",
            Self::Cli => "cli",
            Self::Listener => "listener",
        }
    }

    /// The role whose connections carry `application_name`, if any.
    pub fn from_application_name(name: &str) -> Option<Self> {
        [
            Self::Intake,
            Self::Queue,
            Self::Target,
            Self::Cli,
            Self::Listener,
        ]
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

/// Parses a `postgres://` (or `postgresql://`) URL, as libpq does (PostgreSQL docs, *Connection
/// URIs*, 34.1.1.2).
///
/// # Errors
/// [`sqlx::Error::Configuration`] for another scheme (sqlx itself would take `mysql://h/db` as a
/// PostgreSQL host); sqlx's parse error when the URL is malformed.
pub fn connect_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    if !matches!(scheme.as_deref(), Some("postgres" | "postgresql")) {
        return Err(sqlx::Error::Configuration(
            "the database URL must start with postgres:// or postgresql://".into(),
        ));
    }
    PgConnectOptions::from_str(url)
}

/// Sets `statement_timeout` for the rest of the current transaction to `left` (whole ms, at least
/// 1): `set_config('statement_timeout', $1, true)`, the function form of `SET LOCAL`, the value
/// bound as a parameter. For a transaction whose statements share one budget (the trial cascade,
/// `crate::engine::trial`); like every bound, it ends with the transaction.
///
/// # Errors
/// Database errors.
pub async fn set_local_statement_timeout(
    conn: &mut PgConnection,
    left: Duration,
) -> Result<(), sqlx::Error> {
    query("SELECT set_config('statement_timeout', $1, true)")
        .bind(format!("{}ms", left.as_millis().max(1)))
        .execute(conn)
        .await
        .map(drop)
}

/// A [`pool`] of one connection of its own for `role`, acquired within 5 s: for a one-off read of
/// the target at start or from the CLI, or for the kill-switch listener. The caller closes it.
pub fn single(options: &PgConnectOptions, role: PoolRole) -> PgPool {
    pool(
        options,
        role,
        &PoolConfig {
            max_connections: 1,
            acquire_timeout: Duration::from_secs(5),
        },
    )
}

/// Builds a lazily connecting pool: start-up never fails because the database is down; the first
/// acquire fails fast after `acquire_timeout` instead. Every new TCP connection gets
/// [`keepalive::Keepalive::DEFAULT`] in `after_connect`, and each new connection increments
/// `deprov_db_connections_opened_total{pool}` (the churn signal). Connections are pinged before use
/// (`test_before_acquire`) except once [`PoolerMode::apply`] has seen transaction mode: through a
/// transaction pooler that ping waits for a server and, cut off by `acquire_timeout`, makes the pooler
/// close that server.
pub fn pool(options: &PgConnectOptions, role: PoolRole, bounds: &PoolConfig) -> PgPool {
    let host = options.get_host().to_owned();
    let port = options.get_port();
    let tcp = options.get_socket().is_none() && !host.starts_with('/');
    PgPoolOptions::new()
        .max_connections(bounds.max_connections)
        .min_connections(0)
        .acquire_timeout(bounds.acquire_timeout)
        // Through a transaction pooler the pre-acquire ping (a Sync) waits in the pooler's queue for
        // a server like any statement; when `acquire_timeout` fires mid-ping sqlx drops the
        // connection and PgBouncer closes the server it had just assigned ("client disconnect while
        // server was not ready"): the churn this mode exists to prevent. A broken client connection
        // to the pooler is instead found by the `BEGIN` (a connection error, retried by callers).
        .test_before_acquire(!PoolerMode::unnamed_statements())
        .idle_timeout(Duration::from_secs(300))
        .max_lifetime(Duration::from_secs(1800))
        .after_connect(move |_, _| {
            let host = host.clone();
            Box::pin(async move {
                crate::telemetry::connection_opened(role.label());
                if tcp {
                    enable_keepalive(&host, port).await;
                }
                Ok(())
            })
        })
        .connect_lazy_with(options.clone().application_name(role.application_name()))
}

/// Sets keepalives on this process's sockets to `host:port` (the connection just made among them).
/// A failure is logged, not fatal: the connection works, only without keepalives.
async fn enable_keepalive(host: &str, port: u16) {
    let host = host.trim_matches(['[', ']']);
    let peers: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((host, port)).await {
        Ok(addrs) => addrs.collect(),
        Err(e) => {
            tracing::warn!(%host, error = %e, "cannot resolve the database host to set TCP keepalives");
            return;
        }
    };
    if let Err(e) = keepalive::enable_for_peers(&peers, &keepalive::Keepalive::DEFAULT) {
        tracing::warn!(error = %e, "cannot set TCP keepalives on database connections");
    }
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
        Ok(Self::from_options(&state, &target, bounds))
    }

    /// [`Self::new`] from parsed connection options (e.g. one server's options with another
    /// database).
    pub fn from_options(
        state: &PgConnectOptions,
        target: &PgConnectOptions,
        bounds: &crate::config::PoolsConfig,
    ) -> Self {
        Self {
            intake: pool(state, PoolRole::Intake, &bounds.intake),
            queue: pool(state, PoolRole::Queue, &bounds.queue),
            target: pool(target, PoolRole::Target, &bounds.target),
        }
    }
}

impl Pools {
    /// Closes all three pools: waits until every connection is back, then ends each gracefully
    /// (Terminate). Call before the process exits: a connection dropped while sqlx's release ping is
    /// in flight makes PgBouncer close its server connection ("client disconnect while server was
    /// not ready").
    pub async fn close(&self) {
        tokio::join!(self.intake.close(), self.queue.close(), self.target.close());
    }
}

/// Applies deprov's migrations (`migrations/`, embedded at build time) to the state database,
/// recording them in the history table [`migrations_table`] finds (on a fresh database, where
/// sqlx puts it: `_sqlx_migrations` in the first schema of the `search_path` that exists).
/// Before the migrator reads that history, the checksums recorded for the earlier text of
/// migrations whose comments changed (versions 2 to 6; their SQL is identical) are replaced with
/// the current files'; any other changed checksum is refused. A failed run releases the
/// migrator's session advisory lock before it returns.
///
/// # Errors
/// Connection or migration failure.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    let mut migrator = sqlx::migrate!("./migrations");
    let found = async {
        let mut tx = begin(pool, Bounds::STATE).await?;
        let table = migrations_table(&mut tx).await?;
        if let Some(table) = &table {
            let versions = adopt_reworded_checksums(&mut tx, table, &migrator).await?;
            if !versions.is_empty() {
                tracing::info!(
                    ?versions,
                    "recorded the checksums of migrations whose comments were reworded"
                );
            }
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(table)
    }
    .await
    .map_err(sqlx::migrate::MigrateError::Execute)?;
    if let Some(table) = found {
        migrator.dangerous_set_table_name(table.to_string());
    }
    let mut conn = acquire(pool)
        .await
        .map_err(sqlx::migrate::MigrateError::Execute)?;
    // `run_direct` is what `Migrator::run` calls once it holds a connection; called with ours,
    // the future stays `Send` where `run(&mut *conn)` trips over sqlx's `Acquire` lifetimes.
    let result = migrator.run_direct(None, &mut *conn, false).await;
    if result.is_err() {
        // sqlx's migrator takes a session advisory lock first and releases it only when it
        // succeeds: back in the pool, this connection would keep the lock, and every later
        // migration, from this process or another, would wait for it without end. Released here
        // before returning (deprov takes no other session advisory lock); a connection that cannot
        // release it is closed, and the server releases it when that session ends.
        if query("SELECT pg_advisory_unlock_all()")
            .execute(&mut *conn)
            .await
            .is_err()
        {
            let _ = conn.close().await;
        }
    }
    result
}

/// The SHA-384 checksums of the earlier text of the migrations whose comments changed, by version;
/// their SQL is identical to the current files'. sqlx refuses (`VersionMismatch`) a database whose
/// recorded checksum differs from the embedded file's, so [`migrate`] replaces each of these, where
/// it is exactly the recorded one, with the checksum of the current file
/// ([`adopt_reworded_checksums`]).
const REWORDED_MIGRATIONS: [(i64, &str); 5] = [
    (
        2,
        "e56045970f28b370f54974665eca801871d4ddbd74c0446165db68b1b3575adf0c4d630051ba628035bccd8da9691e96",
    ),
    (
        3,
        "ad39bd459fe230f61b6a26f525f21dfd3e57469a389a58c73818d638132b7e4df28328dcc33642c50b545efcf13879a7",
    ),
    (
        4,
        "f7a7574cf36187892170e85bd78e47dddfdc3fbc132674b26bb52b4c576cd7bcb2d982abd957d46a120269fe9d89f58c",
    ),
    (
        5,
        "13b4e1a2e7ff8e891fea5d9b2eb20e8bb102b9b9bdf7f0f3745cd2b5d5ee2558bd6e7a71c42c8b0f3751d151104778c8",
    ),
    (
        6,
        "0ff3d0ab9285e7deee6a43a3b13e838a3639b54aca3b2978e5dbcc32b64edf4dab3999a7db4595a7d417bcee16ce67c0",
    ),
];

/// In the migration history `table`, replaces the checksum of each migration of
/// [`REWORDED_MIGRATIONS`] with that of its file embedded in `migrator`, only where the recorded checksum is
/// exactly the earlier one: any other mismatch is left for the migrator to refuse. One statement;
/// run it in the caller's transaction, before the migrator reads the history. Returns the versions
/// changed, ascending.
///
/// # Errors
/// Connection and query errors.
async fn adopt_reworded_checksums(
    conn: &mut PgConnection,
    table: &QualifiedName,
    migrator: &sqlx::migrate::Migrator,
) -> Result<Vec<i64>, sqlx::Error> {
    let mut versions = Vec::new();
    let mut earlier = Vec::new();
    let mut current = Vec::new();
    for (version, checksum) in REWORDED_MIGRATIONS {
        let Some(migration) = migrator
            .iter()
            .find(|m| m.version == version && !m.migration_type.is_down_migration())
        else {
            continue;
        };
        versions.push(version);
        earlier.push(checksum);
        current.push(migration.checksum.to_vec());
    }
    let mut b = SqlBuilder::new();
    b.sql("UPDATE ").table(table).sql(
        " AS h SET checksum = r.current \
             FROM unnest($1::bigint[], $2::text[], $3::bytea[]) AS r (version, earlier, current) \
             WHERE h.version = r.version AND h.checksum = decode(r.earlier, 'hex') \
             RETURNING h.version",
    );
    let mut changed: Vec<i64> = query_scalar(b.build().as_query())
        .bind(versions)
        .bind(earlier)
        .bind(current)
        .fetch_all(&mut *conn)
        .await?;
    changed.sort_unstable();
    Ok(changed)
}

/// The table holding deprov's migration history: a `_sqlx_migrations` table, in whatever schema,
/// where this build's first migration is recorded as applied; `None` on a database deprov never
/// migrated. Found by its contents, not through the `search_path`: for a role named `deprov` the
/// `search_path`'s `"$user"` entry resolves to no schema before the first migration creates
/// schema `deprov`, and to that schema after it, so an unqualified `_sqlx_migrations` would name
/// another table on every later run (PostgreSQL docs, 5.9.3 "The Schema Search Path"). Run it in
/// a transaction ([`begin`]): through a transaction pooler, only a transaction keeps its
/// statements on one server connection.
///
/// # Errors
/// Connection and query errors.
pub async fn migrations_table(
    conn: &mut PgConnection,
) -> Result<Option<QualifiedName>, sqlx::Error> {
    let Some(first) = sqlx::migrate!("./migrations")
        .iter()
        .next()
        .map(|m| m.version)
    else {
        return Ok(None);
    };
    let schemas: Vec<String> = query_scalar(
        "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relname = '_sqlx_migrations' AND c.relkind IN ('r', 'p') ORDER BY n.nspname",
    )
    .fetch_all(&mut *conn)
    .await?;
    for schema in schemas {
        let table = QualifiedName::new(schema, "_sqlx_migrations");
        let mut b = SqlBuilder::new();
        b.sql("SELECT EXISTS (SELECT 1 FROM ")
            .table(&table)
            .sql(" WHERE version = $1 AND success)");
        let recorded: bool = query_scalar(b.build().as_query())
            .bind(first)
            .fetch_one(&mut *conn)
            .await?;
        if recorded {
            return Ok(Some(table));
        }
    }
    Ok(None)
}

/// The versions of deprov's migrations (embedded at build time) that the state database has not
/// applied successfully, ascending: all of them when it has no migration history yet
/// ([`migrations_table`]). One read-only transaction; works through a transaction pooler.
///
/// # Errors
/// Connection and query errors.
pub async fn pending_migrations(pool: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    let mut tx = begin(pool, Bounds::STATE).await?;
    let applied: Vec<i64> = match migrations_table(&mut tx).await? {
        Some(table) => {
            let mut b = SqlBuilder::new();
            b.sql("SELECT version FROM ")
                .table(&table)
                .sql(" WHERE success");
            query_scalar(b.build().as_query())
                .fetch_all(&mut *tx)
                .await?
        }
        None => Vec::new(),
    };
    tx.commit().await?;
    Ok(sqlx::migrate!("./migrations")
        .iter()
        .map(|m| m.version)
        .filter(|v| !applied.contains(v))
        .collect())
}

#[cfg(test)]
mod rule_tests;
