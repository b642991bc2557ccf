//! `spawn_app()`: a throwaway PostgreSQL, a config file and the `Application` on port 0, per test.

use std::time::Duration;

use deprov::app::{Application, Settings};
use deprov_testkit::{Throwaway, ThrowawayOptions};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use crate::requests::{accepted, assert_problem, deletion};

/// Token of `[sources.billing]`.
pub const SOURCE_TOKEN: &str = "billing-token-0123456789";
/// Token of `[sources.vercel]`, the `[vercel] source`.
pub const VERCEL_TOKEN: &str = "vercel-token-0123456789abc";
/// `DEPROV_OPERATOR_TOKEN` (unless disabled).
pub const OPERATOR_TOKEN: &str = "operator-token-0123456789";
/// `[intake] max_body_bytes` of the test configuration.
pub const MAX_BODY: usize = 4096;

/// The `[vercel]` section of the test configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VercelMode {
    /// No `[vercel]` section: the route answers 404.
    Off,
    /// `[vercel] source` only: the installation ID is the tenant key.
    InstallationIsTenant,
    /// With `tenant_lookup`: requests are recorded for the installation, resolved by the worker.
    Lookup,
}

/// How to start a test server.
#[derive(Debug, Clone)]
pub struct TestOptions {
    /// Configure `DEPROV_OPERATOR_TOKEN`.
    pub operator: bool,
    /// The `[vercel]` section.
    pub vercel: VercelMode,
    /// Override `DEPROV_TARGET_URL`.
    pub target_url: Option<String>,
    /// Point `DEPROV_DATABASE_URL` at a closed port (and skip migrations).
    pub state_unreachable: bool,
    /// Run the worker in the server process.
    pub worker: bool,
    /// Replaces the body of `[sources.vercel]` (e.g. a `vercel-oidc` entry).
    pub vercel_source: Option<String>,
    /// Appended to the configuration file (more `[sources.NAME]` tables).
    pub extra_config: String,
    /// More `[intake]` keys (lines).
    pub intake_extra: String,
    /// `[intake.rate_limit]` as (per_second, burst); `None` = off (`per_second = 0`).
    pub rate_limit: Option<(f64, u32)>,
    /// SQL run on the target after `app.accounts (id <key_type> PRIMARY KEY, installation_id text)`
    /// is created and before deprov starts (start-up checks the configured SQL against the schema).
    pub target_setup: String,
    /// The type of the tenant key column `app.accounts.id`: `text` (keys stored as sent) unless a
    /// test is about integer or uuid keys.
    pub key_type: &'static str,
}

impl Default for TestOptions {
    fn default() -> Self {
        Self {
            operator: true,
            vercel: VercelMode::InstallationIsTenant,
            target_url: None,
            state_unreachable: false,
            worker: false,
            vercel_source: None,
            extra_config: String::new(),
            intake_extra: String::new(),
            rate_limit: None,
            target_setup: String::new(),
            key_type: "text",
        }
    }
}

/// A running server with its own PostgreSQL; everything stops when dropped.
pub struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    /// The bound port.
    pub port: u16,
    /// A client without TLS, redirects or cookies.
    pub client: reqwest::Client,
    /// A pool on the state database for assertions.
    pub db: PgPool,
    /// The state database's URL.
    pub db_url: String,
    cancel: CancellationToken,
    server: Option<JoinHandle<Result<(), deprov::app::AppError>>>,
    _config_dir: tempfile::TempDir,
    _pg: Throwaway,
}

/// `text` written to `deprov.toml` in a new temporary directory: the directory (delete on drop; keep
/// it alive while the file is used) and the file's path.
pub fn config_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deprov.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// The settings deprov refused to start with, and each refusal's SQLSTATE (`None` for deprov's own
/// refusals); panics when `err` is not [`deprov::app::AppError::Statements`].
pub fn refusals(err: &deprov::app::AppError) -> Vec<(&str, Option<&str>)> {
    let deprov::app::AppError::Statements(refused) = err else {
        panic!("{err}");
    };
    refused
        .0
        .iter()
        .map(|f| (f.setting.as_str(), f.refusal.sqlstate.as_deref()))
        .collect()
}

/// Starts deprov as [`try_spawn_app_with`] does, without a `[vercel]` section, with `extra` appended
/// to the configuration and `setup` run on the target first, expecting it to refuse to start: its
/// error (read the refusals with [`refusals`], the message with `to_string`).
pub async fn refused_at_start(extra: &str, setup: &str) -> deprov::app::AppError {
    try_spawn_app_with(TestOptions {
        vercel: VercelMode::Off,
        extra_config: extra.into(),
        target_setup: setup.into(),
        ..Default::default()
    })
    .await
    .err()
    .expect("deprov must refuse to start")
}

/// The `[tenant]` section naming `app.accounts` by `id`, the root of the tests' minimal targets.
pub const TENANT_ACCOUNTS: &str = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";

/// A loopback port nothing listens on.
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn config_text(options: &TestOptions) -> String {
    let acquire = if options.state_unreachable {
        "300ms"
    } else {
        "5s"
    };
    let vercel_source = options
        .vercel_source
        .clone()
        .unwrap_or_else(|| format!("token = \"{VERCEL_TOKEN}\""));
    let intake_extra = &options.intake_extra;
    let mut text = format!(
        "[sources.billing]\ntoken = \"{SOURCE_TOKEN}\"\n[sources.vercel]\n{vercel_source}\n\
         [tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n\
         [intake]\nmax_body_bytes = {MAX_BODY}\n{intake_extra}\n\
         [pools.intake]\nmax_connections = 8\nacquire_timeout = \"{acquire}\"\n"
    );
    let (per_second, burst) = options.rate_limit.unwrap_or((0.0, 1));
    text.push_str(&format!(
        "[intake.rate_limit]\nper_second = {per_second:?}\nburst = {burst}\n"
    ));
    match options.vercel {
        VercelMode::Off => {}
        VercelMode::InstallationIsTenant => text.push_str("[vercel]\nsource = \"vercel\"\n"),
        VercelMode::Lookup => text.push_str(
            "[vercel]\nsource = \"vercel\"\ntenant_lookup = \"SELECT id FROM app.accounts WHERE installation_id = $1\"\n",
        ),
    }
    text.push_str(&options.extra_config);
    text
}

/// Starts a server with the default options.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(TestOptions::default()).await
}

/// Starts a server with `options`.
pub async fn spawn_app_with(options: TestOptions) -> TestApp {
    try_spawn_app_with(options)
        .await
        .expect("build application")
}

/// Starts a server with `options`, or returns why `Application::build` refused to.
pub async fn try_spawn_app_with(options: TestOptions) -> Result<TestApp, deprov::app::AppError> {
    let pg = tokio::task::spawn_blocking(|| {
        Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .expect("start throwaway PostgreSQL");
    let config_dir = tempfile::tempdir().unwrap();
    let config_path = config_dir.path().join("deprov.toml");
    std::fs::write(&config_path, config_text(&options)).unwrap();
    let state_url = if options.state_unreachable {
        format!("postgres://postgres@127.0.0.1:{}/postgres", closed_port())
    } else {
        pg.url("postgres")
    };
    if options.target_url.is_none() {
        // The application's root table: deprov refuses to start when `[tenant] root_table` is missing.
        let target = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&pg.url("postgres"))
            .await
            .unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA app; CREATE TABLE app.accounts (id {} PRIMARY KEY, installation_id text UNIQUE)",
            options.key_type
        )))
        .execute(&target)
        .await
        .unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(options.target_setup.clone()))
            .execute(&target)
            .await
            .unwrap();
        target.close().await;
    }
    let settings = Settings {
        database_url: state_url,
        target_url: options.target_url.clone(),
        config: config_path,
        listen: "127.0.0.1:0".parse().unwrap(),
        operator_token: options.operator.then(|| OPERATOR_TOKEN.to_owned()),
        migrate: !options.state_unreachable,
        no_worker: !options.worker,
        metrics_listen: None,
        pooler_mode: deprov::db::PoolerMode::Session,
        notify_url: None,
    };
    let app = Application::build(settings).await?;
    let port = app.port();
    let cancel = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(cancel.clone()));
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&pg.url("postgres"))
        .await
        .unwrap();
    Ok(TestApp {
        address: format!("http://127.0.0.1:{port}"),
        port,
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
        db,
        db_url: pg.url("postgres"),
        cancel,
        server: Some(server),
        _config_dir: config_dir,
        _pg: pg,
    })
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
impl TestApp {
    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// The configuration file the server was started with.
    pub fn config_path(&self) -> std::path::PathBuf {
        self._config_dir.path().join("deprov.toml")
    }

    /// Runs a worker (the server's configuration; the target is the state database) until it finds
    /// no job to run.
    pub async fn drain_worker(&self) {
        let config = deprov::config::Config::load(self.config_path().to_str().unwrap()).unwrap();
        let pools = deprov::db::Pools::new(&self.db_url, &self.db_url, &config.pools).unwrap();
        let worker =
            deprov::worker::Worker::new(pools, std::sync::Arc::new(config), "api-test".into());
        for _ in 0..20 {
            if worker.step().await.unwrap() == deprov::worker::StepOutcome::Idle {
                return;
            }
        }
        panic!("the worker never went idle");
    }

    /// Whether `app.accounts` (the target's root table) has a row with key `id`.
    pub async fn account_exists(&self, id: &str) -> bool {
        sqlx::query_scalar("SELECT EXISTS (SELECT FROM app.accounts WHERE id::text = $1)")
            .bind(id)
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    /// Stops the server (graceful shutdown) and waits until `run_until_stopped` returned.
    pub async fn shutdown(&mut self) {
        self.cancel.cancel();
        let server = self.server.take().expect("not yet shut down");
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
    }
}
