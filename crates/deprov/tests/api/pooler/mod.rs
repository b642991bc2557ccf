//! deprov behind a real PgBouncer 1.18 in transaction mode (`DEPROV_POOLER_MODE=transaction`), with
//! fewer server connections than deprov has clients ([`service`]); the failures this mode guards
//! against, shown on the same PgBouncer with sqlx's defaults and with the CLI without the mode
//! ([`failures`]); TCP keepalives on pool sockets ([`keepalive`]); `GET /metrics` of a real process
//! through the same PgBouncer ([`metrics_scrape`]); the start-up check of the configured SQL through it
//! ([`startup_check`]); PostgreSQL restarted behind it ([`outage`]); intake while PgBouncer's servers
//! are all busy ([`queued`]).

mod failures;
mod heartbeat_ack;
mod keepalive;
mod metrics_scrape;
mod outage;
mod queued;
mod service;
mod startup_check;

use std::collections::BTreeMap;

use deprov::app::{AppError, Application, Settings};
use deprov::db::{self, PoolerMode};
use deprov_testkit::{Bouncer, BouncerOptions, Throwaway, ThrowawayOptions};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::helpers::{OPERATOR_TOKEN, SOURCE_TOKEN};

/// PgBouncer's `default_pool_size`: server connections per database, against deprov's 8 + 4 + 2.
pub(crate) const SERVERS_PER_DB: usize = 2;

const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id bigserial PRIMARY KEY,
  account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.tasks (id bigserial PRIMARY KEY,
  project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE);
CREATE INDEX ON app.tasks (project_id);
INSERT INTO app.accounts SELECT g FROM generate_series(1, 6) g;
INSERT INTO app.projects (account_id) SELECT a FROM generate_series(1, 6) a, generate_series(1, 5);
INSERT INTO app.tasks (project_id) SELECT p.id FROM app.projects p, generate_series(1, 40);
ANALYZE;
";

pub(crate) fn config() -> String {
    format!(
        "[sources.billing]\ntoken = \"{SOURCE_TOKEN}\"\n\
         [tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n\
         [soft_delete]\nstatements = [\"UPDATE app.accounts SET deleted_at = now() WHERE id = $1\"]\n\
         [hard_delete]\nbatch_rows = 20\ncascade_rows = 0\n\
         [worker]\npoll_interval = \"50ms\"\n\
         [pools.intake]\nmax_connections = 8\nacquire_timeout = \"5s\"\n\
         [pools.queue]\nmax_connections = 4\nacquire_timeout = \"5s\"\n\
         [pools.target]\nmax_connections = 2\nacquire_timeout = \"5s\"\n"
    )
}

/// A PostgreSQL with databases `deprov` (migrated, directly) and `saas` (six tenants), and a
/// PgBouncer in front of it.
pub(crate) struct Setup {
    pub pg: Throwaway,
    pub bouncer: Bouncer,
    /// A direct pool on database `postgres`, for assertions.
    pub direct: PgPool,
}

pub(crate) async fn setup(options: BouncerOptions) -> Setup {
    let pg = tokio::task::spawn_blocking(|| {
        Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .expect("start throwaway PostgreSQL");
    let direct = PgPool::connect(&pg.url("postgres")).await.unwrap();
    for create in ["CREATE DATABASE deprov", "CREATE DATABASE saas"] {
        sqlx::raw_sql(create).execute(&direct).await.unwrap();
    }
    let saas = PgPool::connect(&pg.url("saas")).await.unwrap();
    sqlx::raw_sql(SCHEMA).execute(&saas).await.unwrap();
    saas.close().await;
    // Migrations run directly, as `docs/pgbouncer.md` asks in transaction mode.
    let state = PgPool::connect(&pg.url("deprov")).await.unwrap();
    db::migrate(&state).await.unwrap();
    state.close().await;
    let bouncer = {
        let pg = &pg;
        tokio::task::block_in_place(|| Bouncer::start(pg, &options)).expect("start PgBouncer")
    };
    Setup {
        pg,
        bouncer,
        direct,
    }
}

/// One `GET {base}/metrics` of a deprov serving at `base`, parsed.
pub(crate) async fn scrape(client: &reqwest::Client, base: &str) -> crate::process::Metrics {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    crate::process::Metrics::parse(&text)
}

/// `pg_stat_database.sessions` per database (sessions ever established).
pub(crate) async fn sessions(direct: &PgPool) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT datname::text, sessions FROM pg_stat_database WHERE datname IN ('deprov', 'saas')",
    )
    .fetch_all(direct)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// deprov serving on a free port with both URLs through `s.bouncer`, in transaction pooler mode.
pub(crate) struct RunningApp {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Stops the server.
    pub cancel: CancellationToken,
    /// `run_until_stopped`.
    pub server: JoinHandle<Result<(), AppError>>,
    _dir: tempfile::TempDir,
}

impl RunningApp {
    /// `POST /v1/deletion-requests` for `tenant` with the source token.
    pub(crate) async fn post_deletion(
        &self,
        client: &reqwest::Client,
        tenant: &str,
    ) -> reqwest::Response {
        client
            .post(format!("{}/v1/deletion-requests", self.base))
            .bearer_auth(SOURCE_TOKEN)
            .json(&serde_json::json!({ "tenant_id": tenant }))
            .send()
            .await
            .unwrap()
    }
}

/// Starts deprov (migrations already applied) through the setup's PgBouncer, with its worker when
/// `worker`.
pub(crate) async fn start_app(s: &Setup, worker: bool) -> RunningApp {
    start_app_with(s, worker, &config()).await
}

/// [`start_app`] with the configuration `config_text`.
pub(crate) async fn start_app_with(s: &Setup, worker: bool, config_text: &str) -> RunningApp {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("deprov.toml");
    std::fs::write(&config_path, config_text).unwrap();
    let settings = Settings {
        database_url: s.bouncer.url("deprov"),
        target_url: Some(s.bouncer.url("saas")),
        config: config_path,
        listen: "127.0.0.1:0".parse().unwrap(),
        operator_token: Some(OPERATOR_TOKEN.into()),
        migrate: false,
        no_worker: !worker,
        metrics_listen: None,
        pooler_mode: PoolerMode::Transaction,
        notify_url: None,
    };
    let app = Application::build(settings).await.expect("build");
    let base = format!("http://127.0.0.1:{}", app.port());
    let cancel = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(cancel.clone()));
    RunningApp {
        base,
        cancel,
        server,
        _dir: dir,
    }
}
