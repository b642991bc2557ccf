//! The service: settings, start-up, HTTP serving and the in-process worker, graceful shutdown.
//!
//! [`Application::build`] loads the configuration, builds the pools, binds the listener (port 0 picks
//! a free port, for tests) and starts serving, and only then migrates the state database and checks
//! the target; [`Application::run_until_stopped`] serves until a [`CancellationToken`] fires.
//! [`shutdown_on_signals`] wires SIGTERM and Ctrl-C to such a token.
//!
//! A state database that is down at start-up does not stop deprov: the service serves at once
//! (`/healthz` 200, `/readyz` and intake 503 with `Retry-After`; while the start-up checks wait for
//! the database, up to a pool's acquire timeout, every `/v1/` route answers 503 without touching
//! it), applies its migrations in the background as soon as the database answers, and only then
//! becomes ready and starts its worker — no restart, no crash loop.
//! Migrating at start is refused under `DEPROV_POOLER_MODE=transaction` before any connection opens
//! (sqlx's migrator needs a session), so that background retry only ever migrates over a direct or
//! session-mode connection.
//! `deprov worker` serves `GET /metrics` (and `/healthz`) on `--metrics-listen` when given, also
//! from before its database checks.
//!
//! Start-up also checks the target database: `[tenant] root_table` must exist, and the target must
//! accept every configured statement ([`crate::sqlcheck`]); either failing stops the process with a
//! message naming the setting. A target that cannot be reached defers the statement check: it runs
//! in the background once the target answers, and the worker claims no job until it passed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::ConfigError;
use crate::db::PoolerMode;
use crate::http::{self, AppState};
use crate::telemetry::{self, collect::Collector};
use crate::worker::Worker;

mod start;

use start::{Prepared, check_databases, prepare, spawn_sql_check, spawn_worker};

/// Shortest accepted `DEPROV_OPERATOR_TOKEN`, in characters (as for source tokens).
pub const MIN_OPERATOR_TOKEN_LEN: usize = 16;

/// Settings of `deprov serve` and `deprov worker`: each flag is also an environment variable.
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    /// deprov's own state database (requests, jobs, kill switch), a `postgres://` URL.
    #[arg(long, env = "DEPROV_DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// The application database whose tenants are deleted (default: the state database).
    #[arg(long, env = "DEPROV_TARGET_URL", hide_env_values = true)]
    pub target_url: Option<String>,
    /// The TOML configuration file (see `deploy/example.toml`).
    #[arg(long, env = "DEPROV_CONFIG")]
    pub config: PathBuf,
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "DEPROV_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Bearer token of the operator routes (at least 16 characters); without one they answer 403.
    #[arg(long, env = "DEPROV_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<String>,
    /// Apply deprov's migrations to the state database at start (`--migrate=false` or
    /// `DEPROV_MIGRATE=0` to skip; accepts true/false, 1/0, yes/no, on/off).
    #[arg(long, env = "DEPROV_MIGRATE", default_value_t = true, num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new())]
    pub migrate: bool,
    /// Serve HTTP only; do not run the worker in this process (`DEPROV_NO_WORKER=1`; accepts
    /// true/false, 1/0, yes/no, on/off).
    #[arg(long, env = "DEPROV_NO_WORKER", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_worker: bool,
    /// `deprov worker` only: serve `GET /metrics` and `GET /healthz` on this address (port 0 picks a
    /// free port). Without it a worker process exposes no metrics. `deprov serve` serves `/metrics` on
    /// `--listen` and ignores this.
    #[arg(long, env = "DEPROV_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// `transaction` when the database URLs point at a transaction pooler (PgBouncer
    /// `pool_mode = transaction`): statements become unnamed (no prepared statements), and URLs
    /// with `options` and migrating at start are refused (see `docs/pgbouncer.md`).
    #[arg(long, env = "DEPROV_POOLER_MODE", value_enum, default_value_t = PoolerMode::Session)]
    pub pooler_mode: PoolerMode,
    /// A URL of the state database on which the worker `LISTEN`s for kill switch changes and queued
    /// jobs (an idle worker then claims a new job at once, not at its next poll): direct or
    /// through a session-mode pooler, never a transaction pooler (`LISTEN` needs a session). Default:
    /// `DEPROV_DATABASE_URL` in session mode; none in transaction mode, where workers then learn of
    /// changes by heartbeat (`[worker] heartbeat_interval`) and at every batch.
    #[arg(long, env = "DEPROV_NOTIFY_URL", hide_env_values = true)]
    pub notify_url: Option<String>,
}

impl Settings {
    /// Where the worker listens for kill switch changes (see [`Self::notify_url`]).
    pub fn listen_url(&self) -> Option<String> {
        match (&self.notify_url, self.pooler_mode) {
            (Some(url), _) => Some(url.clone()),
            (None, PoolerMode::Session) => Some(self.database_url.clone()),
            (None, PoolerMode::Transaction) => None,
        }
    }
}

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The configuration file is missing or invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A setting is invalid.
    #[error("setting {name}: {reason}")]
    Setting {
        /// The environment variable.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// `[tenant] root_table` or `key_column` does not exist in the target database.
    #[error("configuration key `tenant`: {0}")]
    Tenant(#[from] crate::engine::PlanError),
    /// The target database refuses configured statements (see [`crate::sqlcheck`]); each is named
    /// by its setting with the server's error.
    #[error(transparent)]
    Statements(#[from] crate::sqlcheck::Refused),
    /// A database URL does not parse.
    #[error("database URL: {0}")]
    Url(#[source] sqlx::Error),
    /// Migrating the state database failed.
    #[error("migrating the state database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Migrations are off (`--migrate false` / `DEPROV_MIGRATE=false`) and the state database lacks
    /// migrations of this build: the message names them and `deprov migrate`.
    #[error("{0}")]
    PendingMigrations(String),
    /// Binding or serving the listener failed.
    #[error("HTTP listener on {addr}: {source}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A unique worker name for leases: `<hostname>-<pid>-<random>`.
pub fn worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "deprov".into());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// A built service: bound and already serving HTTP, its start-up checks passed; run it with
/// [`Application::run_until_stopped`]. Dropped without being run, it stops serving.
#[derive(Debug)]
pub struct Application {
    address: SocketAddr,
    /// The HTTP server, serving since [`Application::build`] bound the listener.
    server: JoinHandle<std::io::Result<()>>,
    /// Stops `server` (gracefully) when dropped; [`Application::run_until_stopped`] disarms it.
    stop_serving: DropGuard,
    worker: Option<Worker>,
    state: AppState,
    /// `settings.migrate` (see `start::Prepared::apply_migrations`).
    apply_migrations: bool,
}

impl Application {
    /// Loads the configuration, builds the pools (which connect lazily), binds `settings.listen` and
    /// serves HTTP from then on; then migrates the state database when `settings.migrate` (else
    /// checks that no migration is pending) and checks the target database. Nothing waits on a
    /// database before the listener serves: while those checks run, `/healthz` answers 200 and
    /// `/readyz` and every `/v1/` route 503 with `Retry-After`, so a database that is down (the checks
    /// then wait up to a pool's acquire timeout) delays nothing but readiness, and the service starts
    /// anyway (`/readyz` answers 503 until the database answers and is migrated).
    ///
    /// # Errors
    /// [`AppError`]: bad configuration or settings, the address cannot be bound, a migration
    /// failure, or a start-up check refusing (the server is stopped first).
    pub async fn build(settings: Settings) -> Result<Self, AppError> {
        let operator = settings.operator_token.as_deref().filter(|t| !t.is_empty());
        if operator.is_some_and(|t| t.chars().count() < MIN_OPERATOR_TOKEN_LEN) {
            let reason = format!("must be at least {MIN_OPERATOR_TOKEN_LEN} characters");
            return Err(AppError::Setting {
                name: "DEPROV_OPERATOR_TOKEN",
                reason,
            });
        }
        crate::sources::oidc::install_crypto_provider();
        let prepared = prepare(&settings)?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(|source| AppError::Io {
                addr: settings.listen,
                source,
            })?;
        let address = listener.local_addr().map_err(|source| AppError::Io {
            addr: settings.listen,
            source,
        })?;
        let Prepared {
            config,
            pools,
            readiness,
            ..
        } = &prepared;
        let worker = (!settings.no_worker).then(|| {
            Worker::new(pools.clone(), config.clone(), worker_id())
                .with_notify_url(settings.listen_url())
                .with_sql_check(readiness.sql_check().clone())
        });
        let mut state = AppState::new(pools.clone(), config.clone(), operator)
            .with_readiness(readiness.clone());
        state.metrics = Arc::new(Collector::new(
            pools.clone(),
            worker.is_some(),
            config.metrics.read_timeout,
        ));
        let router = http::router(state.clone());
        let limits = config.intake.clone();
        let stop = CancellationToken::new();
        let serving = stop.clone();
        // hyper with connection-level limits (header time, idle keep-alive, header buffer); the
        // peer address is given to handlers as `ConnectInfo` (the rate limiter keys on it).
        let server =
            tokio::spawn(
                async move { http::serve::serve(listener, router, &limits, serving).await },
            );
        tracing::info!(%address, "deprov listening; checking its databases");
        if let Err(e) = check_databases(&settings, &prepared).await {
            stop.cancel();
            let _ = server.await;
            return Err(e);
        }
        Ok(Self {
            address,
            server,
            stop_serving: stop.drop_guard(),
            worker,
            state,
            apply_migrations: prepared.apply_migrations,
        })
    }

    /// The bound address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The bound port (useful with port 0).
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// Serves HTTP and runs the worker (unless `--no-worker`) until `cancel` fires, then stops
    /// accepting, lets in-flight requests finish, stops the worker at its next boundary, closes the
    /// pools (after handlers still running in their own tasks are done) and returns. Also runs, until
    /// then: pending migrations ([`Application::build`] on a database that was down), the rate
    /// limiter's cleanup, the metrics upkeep and the configured SQL's check when it is pending
    /// ([`crate::sqlcheck::check_until_passed`]).
    ///
    /// # Errors
    /// [`AppError::Io`] when serving fails.
    pub async fn run_until_stopped(self, cancel: CancellationToken) -> Result<(), AppError> {
        let Self {
            address,
            mut server,
            stop_serving,
            worker,
            state,
            apply_migrations,
        } = self;
        let stop_serving = stop_serving.disarm();
        let has_worker = worker.is_some();
        let worker = spawn_worker(
            worker,
            state.pools.queue.clone(),
            state.readiness.clone(),
            apply_migrations,
            cancel.child_token(),
        );
        if let Some(limit) = state.rate_limit.clone() {
            http::rate_limit::spawn_retain(cancel.child_token(), move || {
                http::rate_limit::retain_recent(&limit);
            });
        }
        if let Some(limit) = state.login_limit.clone() {
            http::rate_limit::spawn_retain(cancel.child_token(), move || limit.retain_recent());
        }
        let sql_check = spawn_sql_check(
            &state.pools,
            &state.config,
            state.readiness.sql_check(),
            cancel.child_token(),
        );
        telemetry::spawn_upkeep(cancel.child_token());
        tracing::info!(%address, worker = has_worker, "deprov serving");
        let served = tokio::select! {
            served = &mut server => served,
            () = cancel.cancelled() => {
                stop_serving.cancel();
                server.await
            }
        };
        let served = served.unwrap_or_else(|e| Err(std::io::Error::other(e)));
        cancel.cancel();
        if let Some(task) = worker
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "worker task ended abnormally");
        }
        if let Some(task) = sql_check {
            let _ = task.await;
        }
        // Waits for handlers still running in their own tasks, then ends every connection cleanly.
        state.pools.close().await;
        tracing::info!("deprov stopped");
        served.map_err(|source| AppError::Io {
            addr: address,
            source,
        })
    }
}

/// Runs only the worker (`deprov worker`) until `cancel` fires, with `GET /metrics` and
/// `GET /healthz` on `settings.metrics_listen` when set; `listen` and `operator_token` are ignored.
///
/// # Errors
/// [`AppError`] from loading the configuration, building pools, migrating (other than an unreachable
/// database, which is retried), or binding `metrics_listen`.
pub async fn run_worker(settings: Settings, cancel: CancellationToken) -> Result<(), AppError> {
    let prepared = prepare(&settings)?;
    let collector = Arc::new(Collector::new(
        prepared.pools.clone(),
        true,
        prepared.config.metrics.read_timeout,
    ));
    // Bound before the database checks, which wait for a database that is down.
    let serving = cancel.child_token();
    let metrics = match settings.metrics_listen {
        Some(addr) => Some(serve_metrics(addr, collector, serving.clone()).await?),
        None => None,
    };
    if let Err(e) = check_databases(&settings, &prepared).await {
        serving.cancel();
        if let Some(task) = metrics {
            let _ = task.await;
        }
        return Err(e);
    }
    let Prepared {
        config,
        pools,
        readiness,
        apply_migrations,
    } = prepared;
    telemetry::spawn_upkeep(cancel.child_token());
    let checking = spawn_sql_check(&pools, &config, readiness.sql_check(), cancel.child_token());
    let queue = pools.queue.clone();
    let worker = Worker::new(pools.clone(), config, worker_id())
        .with_notify_url(settings.listen_url())
        .with_sql_check(readiness.sql_check().clone());
    tracing::info!(worker = %worker.id, listening = worker.notify_url.is_some(), "deprov worker running");
    if let Some(task) = spawn_worker(
        Some(worker),
        queue,
        readiness,
        apply_migrations,
        cancel.clone(),
    ) {
        let _ = task.await;
    }
    cancel.cancel();
    if let Some(task) = checking {
        let _ = task.await;
    }
    if let Some(task) = metrics {
        let _ = task.await;
    }
    pools.close().await;
    Ok(())
}

/// Binds `addr` and serves `GET /metrics` and `GET /healthz` from `collector` until `cancel` fires
/// (the worker process's metrics endpoint). Logs the bound address.
///
/// # Errors
/// [`AppError::Io`] when `addr` cannot be bound.
pub async fn serve_metrics(
    addr: SocketAddr,
    collector: Arc<Collector>,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, AppError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Io { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AppError::Io { addr, source })?;
    tracing::info!(address = %bound, "worker metrics serving");
    let router = Router::new()
        .route("/metrics", axum::routing::get(http::metrics::metrics))
        .route("/healthz", axum::routing::get(http::health::healthz))
        .with_state(collector);
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "worker metrics listener failed");
        }
    }))
}

/// Cancels `cancel` on SIGTERM or Ctrl-C (SIGINT).
pub fn shutdown_on_signals(cancel: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot listen for SIGTERM");
                        let _ = ctrl_c.await;
                        cancel.cancel();
                        return;
                    }
                };
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutdown signal received");
        cancel.cancel();
    });
}
