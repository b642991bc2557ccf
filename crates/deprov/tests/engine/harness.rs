//! A throwaway server with the fixture schema loaded, a clone where the cascade ran, and a worker.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use deprov::config::Config;
use deprov::db::Pools;
use deprov::ids::DedupBasis;
use deprov::queue::intake::{self, NewRequest, SubjectKind};
use deprov::queue::{Job, jobs};
use deprov::sql::{QualifiedName, SqlBuilder};
use deprov::worker::{StepOutcome, Worker};
use deprov_testkit::{Throwaway, ThrowawayOptions};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

pub const FIXTURE: &str = include_str!("fixture.sql");

pub struct Env {
    pub server: Throwaway,
    /// The database deprov works on (state and target together).
    pub db: PgPool,
    pub config: Arc<Config>,
    pub pools: Pools,
}

/// The fixture's configuration with 7-row batches, plus `extra` TOML.
pub fn config_text(extra: &str) -> String {
    config_for(7, "installation", extra)
}

/// A test configuration: the fixture's and the demo's soft delete, fixed-size batches of
/// `batch_rows` (no growth; shrinking only past 400 ms: tests count batches), leaves first only
/// (`cascade_rows = 0`: whether autovacuum analyzed a table must not change a test), a 1 s lease with
/// a 900 ms statement timeout (a batch always ends before its lease), and a Vercel lookup by
/// `lookup_column` of `app.accounts`.
pub fn config_for(batch_rows: u32, lookup_column: &str, extra: &str) -> String {
    config_hard(
        &format!(
            "batch_rows = {batch_rows}\nmax_batch_rows = {batch_rows}\nmax_batch_duration = \"800ms\"\n\
             lock_timeout = \"100ms\"\ncascade_rows = 0"
        ),
        lookup_column,
        extra,
    )
}

/// [`config_for`] with the given `[hard_delete]` keys (besides `statement_timeout = "900ms"` and
/// `user_triggers = "allow"`: tests watch deletions with triggers; `schema_edges` checks the
/// default, which refuses them). `whole_cascade` is off unless `hard_delete` sets it: these
/// tenants are small enough for one transaction, and the tests watch the batches.
pub fn config_hard(hard_delete: &str, lookup_column: &str, extra: &str) -> String {
    let whole = if hard_delete.contains("whole_cascade") {
        ""
    } else {
        "whole_cascade = false"
    };
    format!(
        r#"
[sources.billing]
token = "billing-token-0123456789"
[tenant]
root_table = "app.accounts"
key_column = "id"
[soft_delete]
statements = ["UPDATE app.accounts SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL"]
[hard_delete]
{hard_delete}
{whole}
statement_timeout = "900ms"
user_triggers = "allow"
[worker]
lease = "1s"
poll_interval = "20ms"
backoff_base = "1ms"
backoff_max = "2ms"
max_attempts = 5
[vercel]
source = "billing"
tenant_lookup = "SELECT id FROM app.accounts WHERE {lookup_column} = $1"
{extra}
"#
    )
}

/// A pool of `max` connections on database `db` of `server`.
pub async fn connect(server: &Throwaway, db: &str, max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .connect(&server.url(db))
        .await
        .unwrap()
}

pub async fn admin(server: &Throwaway) -> PgPool {
    connect(server, "postgres", 2).await
}

/// Starts a server with database `target` holding the fixture and deprov's schema.
pub async fn env(extra_config: &str) -> Env {
    env_with_config(&config_text(extra_config)).await
}

/// [`env`] with a whole configuration text.
pub async fn env_with_config(config: &str) -> Env {
    env_with_schema(config, FIXTURE).await
}

/// [`env_with_config`] with another schema and data than the fixture's (`schema` must create
/// `app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz, ...)`).
pub async fn env_with_schema(config: &str, schema: &str) -> Env {
    let server = Throwaway::start(&ThrowawayOptions {
        unsafe_fast: true,
        ..Default::default()
    })
    .unwrap();
    let admin = admin(&server).await;
    sqlx::query("CREATE DATABASE target")
        .execute(&admin)
        .await
        .unwrap();
    let db = connect(&server, "target", 4).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema.to_owned()))
        .execute(&db)
        .await
        .unwrap();
    db.close().await;
    // An untouched copy: the cascade runs on clones of it, never while deprov holds connections.
    sqlx::query("CREATE DATABASE pristine TEMPLATE target")
        .execute(&admin)
        .await
        .unwrap();
    let db = connect(&server, "target", 4).await;
    deprov::db::migrate(&db).await.unwrap();
    let config = Arc::new(Config::from_toml(config).unwrap());
    let url = server.url("target");
    let pools = Pools::new(&url, &url, &config.pools).unwrap();
    Env {
        server,
        db,
        config,
        pools,
    }
}

impl Env {
    pub fn worker(&self, name: &str) -> Worker {
        Worker::new(self.pools.clone(), self.config.clone(), name.into())
    }

    /// A copy of the fixture as loaded, in which the naive cascade deleted `tenant`.
    pub async fn cascade_copy(&self, tenant: i64) -> PgPool {
        self.try_cascade_copy(tenant).await.unwrap()
    }

    /// [`Env::cascade_copy`], or the error of the cascade (the copy then is as loaded).
    pub async fn try_cascade_copy(&self, tenant: i64) -> Result<PgPool, sqlx::Error> {
        let admin = admin(&self.server).await;
        let mut b = SqlBuilder::new();
        b.sql("CREATE DATABASE ")
            .ident(&format!("expected_{tenant}"))
            .sql(" TEMPLATE pristine");
        sqlx::query(b.build().as_query())
            .execute(&admin)
            .await
            .unwrap();
        let url = self.server.url(&format!("expected_{tenant}"));
        let copy = PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .unwrap();
        sqlx::query("DELETE FROM app.accounts WHERE id = $1")
            .bind(tenant)
            .execute(&copy)
            .await?;
        Ok(copy)
    }

    pub async fn request(&self, tenant: &str) -> Uuid {
        self.record(DedupBasis::TenantId, SubjectKind::Tenant, tenant)
            .await
    }

    pub async fn request_installation(&self, installation: &str) -> Uuid {
        self.record(
            DedupBasis::InstallationId,
            SubjectKind::VercelInstallation,
            installation,
        )
        .await
    }

    async fn record(&self, basis: DedupBasis, subject_kind: SubjectKind, key: &str) -> Uuid {
        record(&self.pools, &self.config, basis, subject_kind, key).await
    }

    pub async fn job(&self, id: Uuid) -> Job {
        jobs::get(&self.db, id).await.unwrap().unwrap()
    }

    /// Steps `worker` until it is idle; returns the outcomes.
    pub async fn drain(&self, worker: &Worker) -> Vec<StepOutcome> {
        let mut out = Vec::new();
        for _ in 0..100 {
            match worker.step().await.unwrap() {
                StepOutcome::Idle => return out,
                ran => out.push(ran),
            }
        }
        panic!("worker never went idle: {out:?}");
    }
}

/// A server with `schema` loaded under `config` and analyzed once the loading session's writes show in the
/// statistics (`n_mod_since_analyze` of `app.{table}` reaches `rows`): the statistics then hold no
/// rows written since, as on a database analyzed after its last load.
pub async fn analyzed_env(config: &str, schema: &str, table: &str, rows: i64) -> Env {
    let env = env_with_schema(config, schema).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let written: i64 = sqlx::query_scalar(
            "SELECT coalesce(max(n_mod_since_analyze), 0) FROM pg_stat_user_tables \
             WHERE schemaname = 'app' AND relname = $1",
        )
        .bind(table)
        .fetch_one(&env.db)
        .await
        .unwrap();
        if written >= rows {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{table}: {written} rows written"
        );
        tokio::task::yield_now().await;
    }
    sqlx::query("ANALYZE").execute(&env.db).await.unwrap();
    env
}

/// Deletes tenant 1 of `schema` (see [`env_with_schema`]) under `config` with one worker run until
/// idle; asserts that the job completed and that the data equals the cascade's. Returns the job's
/// progress.
pub async fn delete_tenant_1(schema: &str, config: &str) -> deprov::worker::Progress {
    env_with_schema(config, schema)
        .await
        .delete_tenant_1()
        .await
}

impl Env {
    /// [`delete_tenant_1`] on this server as it is.
    pub async fn delete_tenant_1(&self) -> deprov::worker::Progress {
        let env = self;
        let expected = env.cascade_copy(1).await;
        let id = env.request("1").await;
        let outcomes = env.drain(&env.worker("w1")).await;
        let job = env.job(id).await;
        assert_eq!(
            job.state(),
            deprov::queue::JobState::Completed,
            "{job:?} {outcomes:?}"
        );
        // A completed job advanced, whichever way it went (batches, or one transaction).
        assert_eq!(job.stalled_attempts, 0, "{job:?}");
        assert_eq!(digest(&env.db).await, digest(&expected).await);
        deprov::worker::Progress::from_json(&job.progress)
    }
}

/// Every table of schema `app` → (rows, order-independent md5 of all rows).
pub async fn digest(db: &PgPool) -> BTreeMap<String, (i64, String)> {
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'app' AND c.relkind IN ('r', 'p') ORDER BY 1, 2",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let mut out = BTreeMap::new();
    for (schema, name) in tables {
        let table = QualifiedName::new(schema, name);
        let mut b = SqlBuilder::new();
        b.sql("SELECT count(*), coalesce(md5(string_agg(md5(t::text), '' ORDER BY md5(t::text))), '') FROM ").table(&table).sql(" t");
        let row: (i64, String) = sqlx::query_as(b.build().as_query())
            .fetch_one(db)
            .await
            .unwrap();
        out.insert(table.to_string(), row);
    }
    out
}

/// Waits (polling the state database) until `pred` holds for the job, at most 30 s.
pub async fn wait_for_job(db: &PgPool, id: Uuid, what: &str, pred: impl Fn(&Job) -> bool) -> Job {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let job = jobs::get(db, id).await.unwrap().unwrap();
        if pred(&job) {
            return job;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {job:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A deletion request from `source` for tenant `tenant`, deduplicated on the tenant ID.
pub fn tenant_request(source: &str, tenant: &str) -> NewRequest {
    NewRequest {
        source: source.into(),
        basis: DedupBasis::TenantId,
        dedup_key: tenant.into(),
        subject_kind: SubjectKind::Tenant,
        subject: tenant.into(),
        external_id: None,
        reason: None,
    }
}

/// Records a deletion request from source `billing` as intake does; returns its job.
pub async fn record(
    pools: &Pools,
    config: &Config,
    basis: DedupBasis,
    subject_kind: SubjectKind,
    key: &str,
) -> Uuid {
    let req = NewRequest {
        source: "billing".into(),
        basis,
        dedup_key: key.into(),
        subject_kind,
        subject: key.into(),
        external_id: None,
        reason: None,
    };
    let attempts = config.worker.max_attempts as i32;
    intake::record_tx(&pools.intake, &req, attempts)
        .await
        .unwrap()
        .job_id
}

/// Runs `deprov plan --tenant <tenant> <args>` (the binary) on the environment's database under
/// `config` (TOML); returns whether it exited successfully and what it printed.
pub fn plan_cli(env: &Env, tenant: &str, args: &[&str], config: &str) -> (bool, String) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), config).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(["plan", "--tenant", tenant])
        .args(args)
        .env("DEPROV_DATABASE_URL", env.server.url("target"))
        .env("DEPROV_CONFIG", file.path())
        .env_remove("DEPROV_TARGET_URL")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The plan of the fixtures' root, `app.accounts` keyed by `id`, as the worker loads it.
pub async fn accounts_plan(db: &PgPool) -> deprov::engine::Plan {
    deprov::engine::load_plan(db, &QualifiedName::new("app", "accounts"), "id")
        .await
        .unwrap()
}

/// The first step of `plan` on the table named `table` (schema `app`).
pub fn step_on<'p>(plan: &'p deprov::engine::Plan, table: &str) -> &'p deprov::engine::Step {
    plan.steps
        .iter()
        .find(|s| plan.name(s.table).name == table)
        .unwrap_or_else(|| panic!("a step on {table}"))
}

/// The cascade pre-check's verdict on `tenant` ([`deprov::engine::simulate::simulate`]), each
/// read bounded at 40 ms, at most 10,000,000 rows held.
pub async fn simulated(
    env: &Env,
    plan: &deprov::engine::Plan,
    tenant: &str,
) -> deprov::engine::simulate::Verdict {
    let limits = deprov::engine::BatchLimits::from(&env.config.hard_delete);
    deprov::engine::simulate::simulate(
        &env.db,
        plan,
        tenant,
        &limits,
        Duration::from_millis(40),
        10_000_000,
    )
    .await
    .unwrap()
}

/// PostgreSQL's own answer to `DELETE FROM app.accounts WHERE id = account` (the cascade), rolled
/// back: `None` when it succeeds, else the error's SQLSTATE and constraint.
pub async fn cascade_error(env: &Env, account: i64) -> Option<(String, Option<String>)> {
    let mut tx = env.db.begin().await.unwrap();
    let result = sqlx::query("DELETE FROM app.accounts WHERE id = $1")
        .bind(account)
        .execute(&mut *tx)
        .await;
    tx.rollback().await.unwrap();
    let e = result.err()?;
    let db = e.as_database_error()?;
    Some((
        db.code().map(|c| c.into_owned()).unwrap_or_default(),
        db.constraint().map(str::to_owned),
    ))
}

/// Shared buffers (hit + read) of EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)'s top node.
pub fn buffers(explained: &serde_json::Value) -> i64 {
    let plan = &explained[0]["Plan"];
    plan["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + plan["Shared Read Blocks"].as_i64().unwrap_or(0)
}

/// EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of the batch of `step` after the parent `after` (a
/// [`deprov::engine::Cursor::AfterParent`], its values also bound as `$3`), for tenant 1, at most
/// `rows` rows of at most `parents` parents, run in `tx`: the batch deletes what it would.
pub async fn explain_batch(
    tx: &mut sqlx::PgConnection,
    plan: &deprov::engine::Plan,
    step: &deprov::engine::Step,
    after: Vec<String>,
    rows: i64,
    parents: i64,
) -> serde_json::Value {
    let cursor = deprov::engine::Cursor::AfterParent(after.clone());
    let stmt = deprov::engine::queries::batch(plan, step, &cursor, false);
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
        stmt.text()
    )))
    .bind("1")
    .bind(rows)
    .bind(after)
    .bind(parents)
    .fetch_one(tx)
    .await
    .unwrap()
}
