//! deprov behind a real PgBouncer 1.18 in transaction mode (`DEPROV_POOLER_MODE=transaction`), with
//! fewer server connections than deprov has clients; and the failures this mode guards against,
//! shown on the same PgBouncer with sqlx's defaults.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use deprov::app::{Application, Settings};
use deprov::db::{self, Bounds, PoolerMode};
use deprov::throwaway::{Bouncer, BouncerOptions, PoolMode, Show, Throwaway, ThrowawayOptions};
use serde_json::{Value, json};
use sqlx::{Connection as _, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use crate::helpers::{OPERATOR_TOKEN, SOURCE_TOKEN};

/// PgBouncer's `default_pool_size`: server connections per database, against deprov's 8 + 4 + 2.
const SERVERS_PER_DB: usize = 2;

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

fn config() -> String {
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
struct Setup {
    pg: Throwaway,
    bouncer: Bouncer,
    direct: PgPool,
}

async fn setup(options: BouncerOptions) -> Setup {
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
    // Migrations run directly, as the README asks in transaction mode.
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

/// `pg_stat_database.sessions` per database (sessions ever established).
async fn sessions(direct: &PgPool) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT datname::text, sessions FROM pg_stat_database WHERE datname IN ('deprov', 'saas')",
    )
    .fetch_all(direct)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

async fn post(client: &reqwest::Client, base: &str, tenant: u32, n: u32) -> reqwest::StatusCode {
    let body = json!({"tenant_id": tenant.to_string(), "external_id": format!("evt-{tenant}-{n}")});
    client
        .post(format!("{base}/v1/deletion-requests"))
        .bearer_auth(SOURCE_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
}

async fn jobs(client: &reqwest::Client, base: &str) -> Vec<Value> {
    let body: Value = client
        .get(format!("{base}/v1/jobs?limit=100"))
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["jobs"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intake_to_completed_through_pgbouncer_in_transaction_mode_without_server_churn() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: SERVERS_PER_DB as u32,
        ..BouncerOptions::default()
    })
    .await;
    let before = sessions(&s.direct).await;
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("deprov.toml");
    std::fs::write(&config_path, config()).unwrap();
    let settings = Settings {
        database_url: s.bouncer.url("deprov"),
        target_url: Some(s.bouncer.url("saas")),
        config: config_path,
        listen: "127.0.0.1:0".parse().unwrap(),
        operator_token: Some(OPERATOR_TOKEN.into()),
        migrate: false,
        no_worker: false,
        pooler_mode: PoolerMode::Transaction,
    };
    let app = Application::build(settings).await.expect("build");
    let base = format!("http://127.0.0.1:{}", app.port());
    let cancel = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(cancel.clone()));
    let client = reqwest::Client::new();

    // 4 tenants × 10 distinct requests, all at once: 40 intake transactions over 2 server connections
    // while the worker claims, heartbeats and deletes through the same PgBouncer.
    let sends = (1..=4).flat_map(|t| (0..10).map(move |n| (t, n)));
    let statuses = futures::future::join_all(sends.map(|(t, n)| post(&client, &base, t, n))).await;
    assert!(statuses.iter().all(|s| s.as_u16() == 202), "{statuses:?}");

    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let all = jobs(&client, &base).await;
        if all.len() == 4 && all.iter().all(|j| j["state"] == "completed") {
            break all;
        }
        assert!(Instant::now() < deadline, "jobs not completed: {all:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for job in &done {
        assert_eq!(job["attempts"], 1, "{job:#}");
        assert!(job["last_error"].is_null(), "{job:#}");
    }

    // No churn: PgBouncer opened at most its pool size per database and closed none.
    let servers = s.bouncer.show(Show::Servers).await.unwrap();
    let pools = s.bouncer.show(Show::Pools).await.unwrap();
    let logins = s.bouncer.server_logins();
    let closes = s.bouncer.server_closes();
    cancel.cancel();
    server.await.unwrap().unwrap();
    s.bouncer.stop();
    // Sessions are counted in pg_stat_database once their backend reports statistics, at the latest
    // when it exits: wait until PgBouncer's server connections are gone, then read them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM pg_stat_activity WHERE datname IN ('deprov', 'saas')",
    )
    .fetch_one(&s.direct)
    .await
    .unwrap()
        > 0
    {
        assert!(Instant::now() < deadline, "backends still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = sessions(&s.direct).await;
    for database in ["deprov", "saas"] {
        let open = servers.iter().filter(|r| r["database"] == database).count();
        assert!(
            open <= SERVERS_PER_DB,
            "{database}: {open} servers: {servers:#?}"
        );
        let opened = after[database] - before[database];
        println!("{database}: {open} server connections open, {opened} PostgreSQL sessions opened");
        assert!(
            opened <= SERVERS_PER_DB as i64,
            "{database}: {opened} sessions opened"
        );
    }

    let saas = PgPool::connect(&s.pg.url("saas")).await.unwrap();
    let left: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT a.id, count(DISTINCT p.id), count(t.id) FROM app.accounts a \
         LEFT JOIN app.projects p ON p.account_id = a.id LEFT JOIN app.tasks t ON t.project_id = p.id \
         GROUP BY a.id ORDER BY a.id",
    )
    .fetch_all(&saas)
    .await
    .unwrap();
    assert_eq!(
        left,
        vec![(5, 5, 200), (6, 5, 200)],
        "tenants 1-4 gone, 5-6 intact"
    );
    println!("PgBouncer: {logins} server logins, {closes} server closes; pools: {pools:#?}");
    assert!(logins <= 2 * SERVERS_PER_DB, "{}", s.bouncer.log());
    assert_eq!(closes, 0, "{}", s.bouncer.log());
}

/// What transaction mode breaks, on one shared server connection: sqlx's default named statements
/// collide between clients, and a plain `SET` leaks to the next client; deprov's unnamed statements
/// inside bounded transactions do neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_statements_and_session_settings_break_behind_transaction_pooling() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: 1,
        ..BouncerOptions::default()
    })
    .await;
    let url = s.bouncer.url("deprov");
    let mut a = PgConnection::connect(&url).await.unwrap();
    let mut b = PgConnection::connect(&url).await.unwrap();

    // sqlx's default: a named prepared statement (`sqlx_s_1`) per client, left on the server.
    let one: i32 = sqlx::query_scalar("SELECT $1::int4")
        .bind(1)
        .fetch_one(&mut a)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let err = sqlx::query_scalar::<_, i32>("SELECT $1::int4")
        .bind(2)
        .fetch_one(&mut b)
        .await
        .unwrap_err();
    let code = err
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("42P05"), "{err}"); // prepared statement already exists

    // A plain SET outside a transaction stays on the server: the other client gets it.
    sqlx::raw_sql("SET statement_timeout = '1234ms'")
        .execute(&mut a)
        .await
        .unwrap();
    let leaked: String = sqlx::raw_sql("SHOW statement_timeout")
        .fetch_one(&mut b)
        .await
        .map(|r| sqlx::Row::get(&r, 0))
        .unwrap();
    assert_eq!(leaked, "1234ms");
    sqlx::raw_sql("RESET statement_timeout")
        .execute(&mut b)
        .await
        .unwrap();

    // deprov's way, interleaved on the same server: unnamed statements in bounded transactions.
    PoolerMode::Transaction.apply();
    assert!(PoolerMode::unnamed_statements());
    for i in 0..20 {
        for conn in [&mut a, &mut b] {
            let mut tx = db::begin_on(
                conn,
                Bounds::new(Duration::from_millis(77), Duration::from_secs(3)),
            )
            .await
            .unwrap();
            let (n, timeout): (i32, String) =
                db::query_as("SELECT $1::int4, current_setting('statement_timeout')")
                    .bind(i)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
            tx.commit().await.unwrap();
            assert_eq!((n, timeout.as_str()), (i, "3s"));
        }
    }
    let after: String = sqlx::raw_sql("SHOW statement_timeout")
        .fetch_one(&mut b)
        .await
        .map(|r| sqlx::Row::get(&r, 0))
        .unwrap();
    assert_eq!(after, "0", "SET LOCAL ended with its transaction");
}

/// A caller that gives up ends only its own wait: the handler's transaction, blocked on a lock when
/// the client hangs up, still completes once the lock is free (well within its 1 s `lock_timeout`),
/// and PgBouncer closes no server connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hanging_up_does_not_abandon_its_transaction() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: SERVERS_PER_DB as u32,
        ..BouncerOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("deprov.toml");
    std::fs::write(&config_path, config()).unwrap();
    let settings = Settings {
        database_url: s.bouncer.url("deprov"),
        target_url: Some(s.bouncer.url("saas")),
        config: config_path,
        listen: "127.0.0.1:0".parse().unwrap(),
        operator_token: Some(OPERATOR_TOKEN.into()),
        migrate: false,
        no_worker: true,
        pooler_mode: PoolerMode::Transaction,
    };
    let app = Application::build(settings).await.expect("build");
    let base = format!("http://127.0.0.1:{}", app.port());
    let cancel = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(cancel.clone()));

    let state = PgPool::connect(&s.pg.url("deprov")).await.unwrap();
    let mut holder = state.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM deprov.kill_switch FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let gave_up = impatient
        .put(format!("{base}/v1/kill-switch"))
        .bearer_auth(OPERATOR_TOKEN)
        .json(&json!({"engaged": true, "reason": "hang-up test"}))
        .send()
        .await
        .unwrap_err();
    assert!(gave_up.is_timeout(), "{gave_up}");
    // Release the lock once the handler's UPDATE has waited 700 ms: long after the hang-up, before
    // its lock_timeout (1 s).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waited: Option<f64> = sqlx::query_scalar(
            "SELECT max(extract(epoch FROM now() - query_start))::float8 FROM pg_stat_activity \
             WHERE datname = 'deprov' AND wait_event_type = 'Lock'",
        )
        .fetch_one(&state)
        .await
        .unwrap();
        if waited.is_some_and(|w| w >= 0.7) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the handler's UPDATE never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holder.commit().await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (engaged, reason): (bool, Option<String>) =
            sqlx::query_as("SELECT engaged, reason FROM deprov.kill_switch")
                .fetch_one(&state)
                .await
                .unwrap();
        if engaged {
            assert_eq!(reason.as_deref(), Some("hang-up test"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned request's transaction did not complete"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.bouncer.server_closes(), 0, "{}", s.bouncer.log());
    assert!(s.bouncer.server_logins() <= 2 * SERVERS_PER_DB);
    cancel.cancel();
    server.await.unwrap().unwrap();
}

/// Every socket of a deprov pool carries TCP keepalives (set in `after_connect`), read back from the
/// kernel; a plain sqlx connection to the same server has none.
#[tokio::test]
async fn pool_connections_carry_tcp_keepalives() {
    use deprov::db::keepalive::{Keepalive, inspect};
    let pg = tokio::task::spawn_blocking(|| {
        Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .unwrap();
    let peer: std::net::SocketAddr = ([127, 0, 0, 1], pg.port()).into();
    let mut plain = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    sqlx::raw_sql("SELECT 1").execute(&mut plain).await.unwrap();
    let sockets = inspect(peer).unwrap();
    assert_eq!(sockets.len(), 1);
    assert!(!sockets[0].enabled, "sqlx sets no keepalive by itself");
    plain.close().await.unwrap();

    let bounds = deprov::config::PoolConfig {
        max_connections: 3,
        acquire_timeout: Duration::from_secs(5),
    };
    let pool = db::pool(
        &db::connect_options(&pg.url("postgres")).unwrap(),
        db::PoolRole::Queue,
        &bounds,
    );
    let held = futures::future::join_all((0..3).map(|_| db::begin(&pool, Bounds::STATE))).await;
    let sockets = inspect(peer).unwrap();
    assert_eq!(sockets.len(), 3, "{sockets:?}");
    let k = Keepalive::DEFAULT;
    for s in &sockets {
        assert!(s.enabled, "{s:?}");
        assert_eq!(s.idle_s as u64, k.idle.as_secs());
        assert_eq!(s.interval_s as u64, k.interval.as_secs());
        assert_eq!(s.retries as u32, k.retries);
        assert_eq!(s.user_timeout_ms as u128, k.detect_within().as_millis());
    }
    drop(held);
    pool.close().await;
}

/// `deprov kill-switch` through PgBouncer (one server connection), each call a new process: without
/// the pooler mode the second call fails on the named statement the first left on the server
/// (42P05); with `DEPROV_POOLER_MODE=transaction` every call works, and `deprov migrate` refuses to
/// run through the pooler. In transaction mode every process closes its pool cleanly before
/// exiting, so PgBouncer closes no server connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_needs_the_pooler_mode_behind_transaction_pooling() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: 1,
        ..BouncerOptions::default()
    })
    .await;
    let url = s.bouncer.url("deprov");
    let deprov = |mode: &str, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
            .args(args)
            .env("DEPROV_DATABASE_URL", &url)
            .env("DEPROV_POOLER_MODE", mode)
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = deprov("session", &["kill-switch", "status"]);
    assert!(ok, "{text}");
    let (ok, text) = deprov("session", &["kill-switch", "status"]);
    assert!(
        !ok && text.contains("already exists"),
        "{text}\n{}",
        s.bouncer.log()
    );
    let (logins, closes) = (s.bouncer.server_logins(), s.bouncer.server_closes());

    for args in [
        &["kill-switch", "status"][..],
        &["kill-switch", "on", "--reason", "pooler test"],
        &["kill-switch", "status", "--json"],
    ] {
        let (ok, text) = deprov("transaction", args);
        assert!(ok, "{args:?}: {text}");
    }
    let (_, text) = deprov("transaction", &["kill-switch", "status", "--json"]);
    let status: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(status["engaged"], true, "{status}");
    assert_eq!(status["reason"], "pooler test");
    let (ok, text) = deprov("transaction", &["migrate"]);
    assert!(!ok && text.contains("direct DEPROV_DATABASE_URL"), "{text}");
    // Each process closed its pool before exiting: in transaction mode PgBouncer kept its one server
    // connection (opened again at most once: the failed session-mode call's exit may have closed it).
    assert_eq!(s.bouncer.server_closes(), closes, "{}", s.bouncer.log());
    assert!(
        s.bouncer.server_logins() <= logins + 1,
        "{}",
        s.bouncer.log()
    );
}
