//! `deprov-lab demo`: the whole service on real input, from nothing but PostgreSQL's server binaries.
//!
//! Starts a throwaway PostgreSQL (durable settings), loads the demo schema with one large and many
//! small tenants, copies the database and runs the naive cascading `DELETE` on the copy (the reference
//! result and timing), starts deprov (HTTP + worker) in-process, sends the Vercel Marketplace
//! "Delete Installation" call for the large tenant plus 20 concurrent retries, shows a progress bar
//! while the job runs, then prints the job's figures and two checks: every other tenant's rows are
//! unchanged, and the database equals the cascade's copy.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

use super::{
    CascadeOutcome, DatabaseDigest, DemoSize, DemoTenants, cascade_delete, clone_database,
    database_digest, load, other_tenants_digest,
};
use deprov::app::{Application, Settings};
use deprov::sql::QualifiedName;
use deprov_testkit::{Throwaway, ThrowawayOptions};

/// Demo parameters (`deprov-lab demo --help`).
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Rows of the large tenant, over all its tables.
    #[arg(long, default_value_t = 1_000_000)]
    pub large_rows: u64,
    /// Number of small tenants (about 2,000 rows each).
    #[arg(long, default_value_t = 60)]
    pub small_tenants: u32,
    /// `[hard_delete] batch_rows` for the run.
    #[arg(long, default_value_t = 50)]
    pub batch_rows: u32,
    /// Retries of the deletion request sent after the first one.
    #[arg(long, default_value_t = 20)]
    pub retries: usize,
}

/// What went wrong in the demo itself (a failed check is reported in [`DemoOutcome`] instead).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// PostgreSQL could not be started.
    #[error(transparent)]
    Server(#[from] deprov_testkit::ThrowawayError),
    /// A database step failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// deprov itself failed to start.
    #[error("starting deprov: {0}")]
    App(#[from] deprov::app::AppError),
    /// An HTTP call failed or answered unexpectedly.
    #[error("HTTP: {0}")]
    Http(String),
    /// Writing the configuration file failed.
    #[error("config file: {0}")]
    Io(#[from] std::io::Error),
}

impl From<reqwest::Error> for DemoError {
    fn from(e: reqwest::Error) -> Self {
        Self::Http(e.to_string())
    }
}

/// The demo's verdict.
#[derive(Debug, Clone)]
pub struct DemoOutcome {
    /// The job's final state.
    pub state: String,
    /// Other tenants' rows unchanged.
    pub others_unchanged: bool,
    /// The database equals the cascade's copy.
    pub equals_cascade: bool,
}

impl DemoOutcome {
    /// Whether everything the demo checks held.
    pub fn passed(&self) -> bool {
        self.state == "completed" && self.others_unchanged && self.equals_cascade
    }
}

/// `deploy/example.toml` with `token` as the Vercel source's token and `batch_rows` as the first batch.
pub fn config_toml(token: &str, batch_rows: u32) -> String {
    let mut text = include_str!("../../../deploy/example.toml").to_owned();
    text = text.replace(
        "token_env = \"DEPROV_VERCEL_TOKEN\"",
        &format!("token = \"{token}\""),
    );
    text = text.replace(
        "token_env = \"DEPROV_BILLING_TOKEN\"",
        "token = \"demo-billing-token-unused-0000\"",
    );
    text.replace("batch_rows = 50 ", &format!("batch_rows = {batch_rows} "))
}

async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new().max_connections(4).connect(url).await
}

fn step(n: u32, text: &str) {
    println!("\n[{n}] {text}");
}

/// Runs the demo end to end and prints its report.
///
/// # Errors
/// [`DemoError`] when a step could not run; failed checks are in the returned [`DemoOutcome`].
pub async fn run(args: &DemoArgs) -> Result<DemoOutcome, DemoError> {
    step(1, "starting a throwaway PostgreSQL (durable settings)");
    let (server, admin) = start_server().await?;

    step(2, "loading the demo SaaS schema and data");
    let root = QualifiedName::new("app", "accounts");
    let (tenants, others_before) = load_saas(args, &server, &root).await?;

    step(3, "reference: the naive cascading DELETE, on a copy");
    let (copy, cascade) = reference(&server, &admin, &root, tenants.large).await?;

    step(4, "starting deprov (HTTP API + worker)");
    let mut service = Service::start(args, &server).await?;

    step(
        5,
        &format!(
            "Vercel: DELETE /v1/installations/{} and {} retries at once",
            tenants.large_vercel_installation_id, args.retries
        ),
    );
    deprov::sources::oidc::install_crypto_provider();
    let client = reqwest::Client::new();
    let job_id = service.uninstall(args, &client, &tenants).await?;

    step(6, "deleting (soft delete, then leaves-first batches)");
    let job = service
        .follow(&client, &job_id, tenants.large_total_rows())
        .await?;
    service.stop().await;

    step(7, "result");
    report(&job, &cascade);
    check(&server, &copy, &root, tenants.large, &job, &others_before).await
}

/// A throwaway PostgreSQL with durable settings and the empty databases `saas` and `deprov`;
/// returns it with a pool on its `postgres` database.
async fn start_server() -> Result<(Throwaway, PgPool), DemoError> {
    let server = Throwaway::start(&ThrowawayOptions::default())?;
    let admin = connect(&server.url("postgres")).await?;
    for db in ["saas", "deprov"] {
        let mut create = deprov::sql::SqlBuilder::new();
        create.sql("CREATE DATABASE ").ident(db);
        sqlx::query(create.build().as_query())
            .execute(&admin)
            .await?;
    }
    println!(
        "    PostgreSQL on 127.0.0.1:{}; application database \"saas\", deprov's state in \"deprov\"",
        server.port()
    );
    Ok((server, admin))
}

/// The demo schema and tenants loaded into `saas`; returns the tenants and the digest of every
/// tenant's rows but the large one's (below `root`).
async fn load_saas(
    args: &DemoArgs,
    server: &Throwaway,
    root: &QualifiedName,
) -> Result<(DemoTenants, DatabaseDigest), DemoError> {
    let saas = connect(&server.url("saas")).await?;
    let started = Instant::now();
    let size = DemoSize {
        small_tenants: args.small_tenants,
        large_tenant_rows: args.large_rows,
    };
    let tenants = load(&saas, &size).await?;
    let tables = super::user_tables(&saas, "app").await?.len();
    println!(
        "    {tables} tables; large tenant {} with {} rows (Vercel installation {}); {} small tenants; {:.1} s",
        tenants.large,
        tenants.large_total_rows(),
        tenants.large_vercel_installation_id,
        tenants.small.len(),
        started.elapsed().as_secs_f64()
    );
    let others_before = other_tenants_digest(&saas, "app", root, "id", tenants.large).await?;
    saas.close().await;
    Ok((tenants, others_before))
}

/// The reference: `saas` copied to `saas_cascade` and the large tenant (`large`) deleted there by
/// one cascading `DELETE`; returns a pool on the copy and the cascade's figures.
async fn reference(
    server: &Throwaway,
    admin: &PgPool,
    root: &QualifiedName,
    large: i64,
) -> Result<(PgPool, CascadeOutcome), DemoError> {
    clone_database(admin, "saas", "saas_cascade").await?;
    let copy = connect(&server.url("saas_cascade")).await?;
    let cascade = cascade_delete(&copy, root, "id", large).await?;
    println!(
        "    DELETE FROM app.accounts WHERE id = {}: {} rows in ONE transaction of {:.0} ms (every lock held until commit)",
        large,
        cascade.total_deleted(),
        cascade.elapsed_ms()
    );
    Ok((copy, cascade))
}

/// deprov running in-process (HTTP API and worker) on the demo's databases.
struct Service {
    /// The directory of its configuration file, kept until the demo ends.
    _dir: tempfile::TempDir,
    /// The Vercel source's token.
    token: String,
    /// The operator token, to read the jobs.
    operator: String,
    /// `http://<address>`.
    base: String,
    /// Stops it.
    cancel: CancellationToken,
    /// Its task.
    serving: tokio::task::JoinHandle<Result<(), deprov::app::AppError>>,
}

impl Service {
    /// Writes the configuration ([`config_toml`] with fresh tokens), builds the application on
    /// `server`'s `deprov` and `saas` databases and starts serving.
    async fn start(args: &DemoArgs, server: &Throwaway) -> Result<Self, DemoError> {
        let dir = tempfile::tempdir()?;
        let token = format!("vercel-demo-{}", uuid::Uuid::new_v4().simple());
        let operator = format!("operator-demo-{}", uuid::Uuid::new_v4().simple());
        let config: PathBuf = dir.path().join("deprov.toml");
        std::fs::write(&config, config_toml(&token, args.batch_rows))?;
        let settings = Settings {
            database_url: server.url("deprov"),
            target_url: Some(server.url("saas")),
            config,
            listen: "127.0.0.1:0".parse().expect("literal address"),
            operator_token: Some(operator.clone()),
            migrate: true,
            no_worker: false,
            metrics_listen: None,
            pooler_mode: deprov::db::PoolerMode::Session,
            notify_url: None,
        };
        let app = Application::build(settings).await?;
        let base = format!("http://{}", app.address());
        let cancel = CancellationToken::new();
        let serving = tokio::spawn(app.run_until_stopped(cancel.clone()));
        println!("    listening on {base}");
        Ok(Self {
            _dir: dir,
            token,
            operator,
            base,
            cancel,
            serving,
        })
    }

    /// Vercel's "Delete Installation" call for the large tenant, then `--retries` copies of it at
    /// once; prints the answers and returns the id of the one job they made.
    async fn uninstall(
        &self,
        args: &DemoArgs,
        client: &reqwest::Client,
        tenants: &DemoTenants,
    ) -> Result<String, DemoError> {
        let url = format!(
            "{}/v1/installations/{}",
            self.base, tenants.large_vercel_installation_id
        );
        let send = |key: usize| {
            client
                .delete(&url)
                .bearer_auth(&self.token)
                .header("Idempotency-Key", format!("demo-uninstall-{key}"))
                .header("X-Vercel-Auth", "system")
                .json(&serde_json::json!({"cascadeResourceDeletion": true}))
                .send()
        };
        let first = send(0).await?;
        let first_status = first.status();
        let first_body: Value = first.json().await?;
        let mut pending = tokio::task::JoinSet::new();
        for key in 1..=args.retries {
            pending.spawn(send(key));
        }
        let mut statuses = BTreeMap::new();
        while let Some(answer) = pending.join_next().await {
            let answer = answer.map_err(|e| DemoError::Http(e.to_string()))??;
            *statuses.entry(answer.status().as_u16()).or_insert(0) += 1;
        }
        println!("    first answer: {first_status} {first_body}; retries answered {statuses:?}");
        let jobs: Value = client
            .get(format!("{}/v1/jobs", self.base))
            .bearer_auth(&self.operator)
            .send()
            .await?
            .json()
            .await?;
        let jobs = jobs["jobs"].as_array().cloned().unwrap_or_default();
        println!(
            "    jobs created for {} requests: {}",
            args.retries + 1,
            jobs.len()
        );
        Ok(jobs
            .first()
            .and_then(|j| j["job_id"].as_str())
            .ok_or_else(|| DemoError::Http("no job was created".into()))?
            .to_owned())
    }

    /// Polls job `job_id` every 100 ms behind a progress bar (of `total` rows) until it ended;
    /// returns it as the API shows it.
    async fn follow(
        &self,
        client: &reqwest::Client,
        job_id: &str,
        total: u64,
    ) -> Result<Value, DemoError> {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "    {bar:40.cyan/blue} {pos:>9}/{len} rows {per_sec:>12} {msg}",
            )
            .expect("static template")
            .progress_chars("##-"),
        );
        let job = loop {
            let job: Value = client
                .get(format!("{}/v1/jobs/{job_id}", self.base))
                .bearer_auth(&self.operator)
                .send()
                .await?
                .json()
                .await?;
            bar.set_position(job["progress"]["rows_deleted"].as_u64().unwrap_or(0));
            bar.set_message(format!(
                "{} {}",
                job["state"].as_str().unwrap_or("?"),
                job["progress"]["current_table"].as_str().unwrap_or("")
            ));
            if matches!(job["state"].as_str(), Some("completed" | "failed")) {
                break job;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        bar.finish();
        Ok(job)
    }

    /// Stops serving and waits for the application to end.
    async fn stop(&mut self) {
        self.cancel.cancel();
        let _ = (&mut self.serving).await;
    }
}

/// The demo's two checks, printed: the other tenants' rows as before (`others_before`), and
/// `saas` equal to the cascade's copy (`copy`); returns the verdict with the job's state.
async fn check(
    server: &Throwaway,
    copy: &PgPool,
    root: &QualifiedName,
    large: i64,
    job: &Value,
    others_before: &DatabaseDigest,
) -> Result<DemoOutcome, DemoError> {
    let saas = connect(&server.url("saas")).await?;
    let others_after = other_tenants_digest(&saas, "app", root, "id", large).await?;
    let mine = database_digest(&saas, "app").await?;
    let theirs = database_digest(copy, "app").await?;
    let outcome = DemoOutcome {
        state: job["state"].as_str().unwrap_or("?").to_owned(),
        others_unchanged: &others_after == others_before,
        equals_cascade: mine == theirs,
    };
    let mark = |ok: bool| if ok { "PASS" } else { "FAIL" };
    println!(
        "    check: other tenants' rows unchanged ({} tables digested) ........ {}",
        others_after.len(),
        mark(outcome.others_unchanged)
    );
    println!(
        "    check: database equals the cascading DELETE on the copy ({} tables) . {}",
        mine.len(),
        mark(outcome.equals_cascade)
    );
    if !outcome.equals_cascade {
        println!(
            "    tables that differ: {:?}",
            super::differing_tables(&mine, &theirs)
        );
    }
    Ok(outcome)
}

fn report(job: &Value, cascade: &super::CascadeOutcome) {
    let p = &job["progress"];
    let ts = |k: &str| {
        job[k].as_str().and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
    };
    let elapsed = match (ts("started_at"), ts("finished_at")) {
        (Some(a), Some(b)) => format!("{:.1} s", (b - a).as_seconds_f64()),
        _ => "n/a".into(),
    };
    println!(
        "    job {} {} after {} attempt(s){}",
        job["job_id"].as_str().unwrap_or("?"),
        job["state"].as_str().unwrap_or("?"),
        job["attempts"],
        job["last_error"]
            .as_str()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    );
    println!(
        "    elapsed {elapsed}; {} batches; longest single transaction {:.1} ms (the cascade's: {:.0} ms)",
        p["batches"],
        p["longest_batch_ms"].as_f64().unwrap_or(0.0),
        cascade.elapsed_ms()
    );
    println!(
        "    {:<40} {:>12} {:>14} {:>12}",
        "table", "deprov rows", "cascade rows", "longest ms"
    );
    for t in p["tables"].as_array().into_iter().flatten() {
        let name = t["table"].as_str().unwrap_or("?");
        let reference = cascade
            .deleted
            .iter()
            .find(|(q, _)| q.to_string() == name)
            .map_or(0, |(_, n)| *n);
        let longest = t["longest_batch_ms"].as_f64().unwrap_or(0.0);
        println!(
            "    {:<40} {:>12} {:>14} {:>12.1}",
            name,
            t["rows_deleted"].as_i64().unwrap_or(0),
            reference,
            longest
        );
    }
    println!(
        "    {:<40} {:>12} {:>14}",
        "total",
        p["rows_deleted"].as_i64().unwrap_or(0),
        cascade.total_deleted()
    );
}
