//! The stage every replay runs on: one throwaway PostgreSQL with durable settings (`fsync` on),
//! database `deprov` (deprov's state, migrated directly, as `docs/pgbouncer.md` asks behind a transaction
//! pooler) and `saas` (the demo schema, [`deprov_demo::load`]), a PgBouncer in front of it, and deprov
//! started in-process (HTTP + optionally its worker) with both URLs through that PgBouncer.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ReplayError;
use deprov::app::{AppError, Application, Settings};
use deprov::db::PoolerMode;
use deprov::sql::SqlBuilder;
use deprov_demo::{DemoSize, DemoTenants};
use deprov_testkit::{Bouncer, BouncerOptions, Throwaway, ThrowawayOptions};

/// The billing source's bearer token in the configuration the replays give deprov
/// (`deprov_demo::run::config_toml`).
pub const BILLING_TOKEN: &str = "demo-billing-token-unused-0000";

/// A running stage; everything stops when it is dropped.
#[derive(Debug)]
pub struct Stage {
    /// A direct pool (not through PgBouncer) on database `postgres`: sessions, locks, assertions.
    pub direct: PgPool,
    /// The demo data loaded into `saas`.
    pub tenants: DemoTenants,
    /// PgBouncer (dropped before the server).
    pub bouncer: Bouncer,
    /// PostgreSQL.
    pub pg: Throwaway,
}

/// Opens a small pool on `url` (direct connections: named statements are fine there).
pub(crate) async fn connect(url: &str, max: u32) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
}

impl Stage {
    /// Starts PostgreSQL, creates and fills `deprov` and `saas` (`size`), copies `saas` to each of
    /// `copies`, and starts PgBouncer with `bouncer`.
    ///
    /// # Errors
    /// [`ReplayError`] when a server does not start or a setup statement fails.
    pub async fn start(
        size: &DemoSize,
        copies: &[&str],
        bouncer: &BouncerOptions,
        settings: &[(String, String)],
    ) -> Result<Self, ReplayError> {
        let options = ThrowawayOptions {
            settings: settings.to_vec(),
            ..ThrowawayOptions::default()
        };
        let pg = tokio::task::spawn_blocking(move || Throwaway::start(&options))
            .await
            .map_err(|e| ReplayError::Run(e.to_string()))??;
        let direct = connect(&pg.url("postgres"), 4).await?;
        for db in ["saas", "deprov"] {
            let mut create = SqlBuilder::new();
            create.sql("CREATE DATABASE ").ident(db);
            sqlx::query(create.build().as_query())
                .execute(&direct)
                .await?;
        }
        let state = connect(&pg.url("deprov"), 1).await?;
        deprov::db::migrate(&state).await?;
        state.close().await;
        let saas = connect(&pg.url("saas"), 4).await?;
        let tenants = deprov_demo::load(&saas, size).await?;
        saas.close().await;
        for copy in copies {
            deprov_demo::clone_database(&direct, "saas", copy).await?;
        }
        let bouncer = tokio::task::block_in_place(|| Bouncer::start(&pg, bouncer))?;
        Ok(Self {
            direct,
            tenants,
            bouncer,
            pg,
        })
    }

    /// `pg_stat_database.sessions` of `db`: sessions PostgreSQL has ever established there (the
    /// server logins, whoever made them).
    ///
    /// # Errors
    /// Query errors.
    pub async fn sessions(&self, db: &str) -> Result<i64, sqlx::Error> {
        // The view is refreshed at transaction boundaries; a new statement sees the current counts.
        sqlx::query_scalar(
            "SELECT coalesce(sum(sessions), 0)::bigint FROM pg_stat_database WHERE datname = $1",
        )
        .bind(db)
        .fetch_one(&self.direct)
        .await
    }

    /// Starts deprov in-process on a free port with `config` (TOML), its state in `deprov` and its
    /// target `target_db`, both through PgBouncer in transaction pooler mode, with its worker when
    /// `worker`.
    ///
    /// # Errors
    /// [`ReplayError::App`] when it does not start.
    pub async fn start_deprov(
        &self,
        config: &str,
        target_db: &str,
        worker: bool,
    ) -> Result<RunningDeprov, ReplayError> {
        self.start_deprov_with(config, target_db, worker, true)
            .await
    }

    /// [`Self::start_deprov`], through PgBouncer when `pooled`, else directly (session mode, named
    /// statements) — unless an earlier start in this process already made statements unnamed
    /// ([`PoolerMode::apply`] is process-wide and one-way).
    ///
    /// # Errors
    /// [`ReplayError::App`] when it does not start.
    pub async fn start_deprov_with(
        &self,
        config: &str,
        target_db: &str,
        worker: bool,
        pooled: bool,
    ) -> Result<RunningDeprov, ReplayError> {
        let dir = tempfile::tempdir()?;
        let path: PathBuf = dir.path().join("deprov.toml");
        std::fs::write(&path, config)?;
        let url = |db: &str| {
            if pooled {
                self.bouncer.url(db)
            } else {
                self.pg.url(db)
            }
        };
        let settings = Settings {
            database_url: url("deprov"),
            target_url: Some(url(target_db)),
            config: path,
            listen: "127.0.0.1:0".parse().expect("literal address"),
            operator_token: None,
            migrate: false,
            no_worker: !worker,
            pooler_mode: if pooled {
                PoolerMode::Transaction
            } else {
                PoolerMode::Session
            },
            metrics_listen: None,
            notify_url: None,
        };
        let app = Application::build(settings).await?;
        let base = format!("http://{}", app.address());
        let cancel = CancellationToken::new();
        let server = tokio::spawn(app.run_until_stopped(cancel.clone()));
        Ok(RunningDeprov {
            base,
            cancel,
            server,
            _dir: dir,
        })
    }
}

/// The configuration the replays give deprov: `deploy/example.toml` with tokens filled in, the
/// worker polling every 10 ms (so a job starts as soon as it is recorded), and intake's per-source
/// rate limit off: the replays send one source's requests at hundreds per second to measure pooling
/// and throughput, which the limit (20/s) would turn into 429s.
pub fn deprov_config() -> String {
    deprov_demo::run::config_toml("bench-vercel-token-0000000000", 50)
        .replace("poll_interval = \"500ms\"", "poll_interval = \"10ms\"")
        .replace("\nper_second = 20 ", "\nper_second = 0 ")
}

/// deprov serving in this process.
#[derive(Debug)]
pub struct RunningDeprov {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    cancel: CancellationToken,
    server: JoinHandle<Result<(), AppError>>,
    _dir: tempfile::TempDir,
}

impl RunningDeprov {
    /// Stops serving and the worker, and closes deprov's pools (see
    /// [`Application::run_until_stopped`]).
    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.server.await;
    }
}

/// One `POST /v1/deletion-requests` as the billing source; `Ok(status)` or the transport error.
pub(crate) async fn post_request(
    client: &reqwest::Client,
    base: &str,
    tenant: &str,
    external_id: Option<&str>,
) -> Result<u16, String> {
    let mut body = serde_json::json!({"tenant_id": tenant, "reason": "replay"});
    if let Some(ext) = external_id {
        body["external_id"] = ext.into();
    }
    let answer = client
        .post(format!("{base}/v1/deletion-requests"))
        .bearer_auth(BILLING_TOKEN)
        .json(&body)
        .send()
        .await
        .map_err(describe)?;
    let status = answer.status().as_u16();
    // Read to the end, so the keep-alive connection can carry the next request.
    answer.bytes().await.map_err(describe)?;
    Ok(status)
}

/// A transport error as text; the client's timeout (the caller's deadline) starts with
/// [`TIMEOUT`].
fn describe(e: reqwest::Error) -> String {
    if e.is_timeout() {
        format!("{TIMEOUT}: {e}")
    } else {
        e.to_string()
    }
}

/// How [`post_request`]'s error starts when the client's timeout fired.
pub(crate) const TIMEOUT: &str = "deadline";

#[cfg(test)]
mod tests {
    /// The replays' configuration parses, polls every 10 ms and has no per-source intake limit
    /// (the string replacements in [`super::deprov_config`] still match `deploy/example.toml`).
    #[test]
    fn the_replay_configuration_turns_the_intake_rate_limit_off() {
        let c = deprov::config::Config::from_toml(&super::deprov_config()).unwrap();
        assert_eq!(c.intake.rate_limit.per_second, 0.0);
        assert_eq!(c.worker.poll_interval, std::time::Duration::from_millis(10));
    }
}
