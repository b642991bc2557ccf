//! The service: settings, start-up, HTTP serving and the in-process worker, graceful shutdown.
//!
//! [`Application::build`] loads the configuration, builds the pools, optionally migrates the state
//! database and binds the listener (port 0 picks a free port, for tests); [`Application::run_until_stopped`]
//! serves until a [`CancellationToken`] fires. [`shutdown_on_signals`] wires SIGTERM and Ctrl-C to such a
//! token.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::db::{self, Pools};
use crate::http::{self, AppState};
use crate::worker::Worker;

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
    /// Serve HTTP only; do not run the worker in this process.
    #[arg(long, env = "DEPROV_NO_WORKER")]
    pub no_worker: bool,
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
    /// A database URL does not parse.
    #[error("database URL: {0}")]
    Url(#[source] sqlx::Error),
    /// Migrating the state database failed.
    #[error("migrating the state database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Binding or serving the listener failed.
    #[error("HTTP listener on {addr}: {source}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What a process needs besides HTTP: configuration and pools, with migrations applied if asked.
async fn prepare(settings: &Settings) -> Result<(Arc<Config>, Pools), AppError> {
    let config = Arc::new(Config::load(&settings.config.to_string_lossy())?);
    let target = settings
        .target_url
        .as_deref()
        .unwrap_or(&settings.database_url);
    let pools = Pools::new(&settings.database_url, target, &config.pools).map_err(AppError::Url)?;
    if settings.migrate {
        db::migrate(&pools.queue).await?;
    }
    check_tenant_root(&config, target).await?;
    Ok((config, pools))
}

/// Refuses to start when `[tenant] root_table` / `key_column` do not exist in the target database.
/// A target that cannot be reached within 5 s is not an error (deprov must start while the
/// database is down); the plan is checked again when a job runs.
/// It uses a connection of its own (`deprov-cli`), closed afterwards, so the target pool starts empty.
async fn check_tenant_root(config: &Config, target_url: &str) -> Result<(), AppError> {
    let root = config.root_table();
    let options = db::connect_options(target_url).map_err(AppError::Url)?;
    let bounds = crate::config::PoolConfig {
        max_connections: 1,
        acquire_timeout: std::time::Duration::from_secs(5),
    };
    let pool = db::pool(&options, db::PoolRole::Cli, &bounds);
    let check = crate::engine::load_plan(&pool, &root, &config.tenant.key_column);
    let result = match tokio::time::timeout(std::time::Duration::from_secs(6), check).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(crate::engine::EngineError::Plan(e))) => Err(AppError::Tenant(e)),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "target database not reachable at start; [tenant] is checked when a job runs");
            Ok(())
        }
        Err(_) => {
            tracing::warn!(
                "target database did not answer within 5 s; [tenant] is checked when a job runs"
            );
            Ok(())
        }
    };
    pool.close().await;
    result
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

/// A built, bound service, ready to run.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    address: SocketAddr,
    router: Router,
    limits: crate::config::IntakeConfig,
    worker: Option<Worker>,
}

impl Application {
    /// Loads the configuration, builds the pools, migrates the state database when
    /// `settings.migrate`, and binds `settings.listen`. Pools connect lazily: the service starts even
    /// when the state database is down (`/readyz` then answers 503).
    ///
    /// # Errors
    /// [`AppError`]: bad configuration or settings, migration failure, or the address cannot be bound.
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
        let (config, pools) = prepare(&settings).await?;
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
        let worker =
            (!settings.no_worker).then(|| Worker::new(pools.clone(), config.clone(), worker_id()));
        let limits = config.intake.clone();
        let router = http::router(AppState::new(pools, config, operator));
        Ok(Self {
            listener,
            address,
            router,
            limits,
            worker,
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
    /// accepting, lets in-flight requests finish, stops the worker at its next boundary and returns.
    ///
    /// # Errors
    /// [`AppError::Io`] when serving fails.
    pub async fn run_until_stopped(self, cancel: CancellationToken) -> Result<(), AppError> {
        let worker = self.worker.map(|w| {
            let token = cancel.child_token();
            tokio::spawn(async move { w.run(token).await })
        });
        tracing::info!(address = %self.address, worker = worker.is_some(), "deprov serving");
        let served =
            http::serve::serve(self.listener, self.router, &self.limits, cancel.clone()).await;
        cancel.cancel();
        if let Some(task) = worker
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "worker task ended abnormally");
        }
        tracing::info!("deprov stopped");
        served.map_err(|source| AppError::Io {
            addr: self.address,
            source,
        })
    }
}

/// Runs only the worker (`deprov worker`) until `cancel` fires; `listen` and `operator_token` are
/// ignored.
///
/// # Errors
/// [`AppError`] from loading the configuration, building pools or migrating.
pub async fn run_worker(settings: Settings, cancel: CancellationToken) -> Result<(), AppError> {
    let (config, pools) = prepare(&settings).await?;
    let worker = Worker::new(pools, config, worker_id());
    tracing::info!(worker = %worker.id, "deprov worker running");
    worker.run(cancel).await;
    Ok(())
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
