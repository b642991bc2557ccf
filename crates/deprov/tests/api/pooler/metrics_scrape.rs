//! `GET /metrics` of a real `deprov serve` process whose pools all go through PgBouncer in
//! transaction mode: the scrape-time reads (`db::begin_on` + `db::query*`) work there, and the
//! instrumented acquires and the counters agree with the jobs and with PgBouncer. A child process,
//! because the metrics registry is one per process (see `crate::process`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use deprov_testkit::{BouncerOptions, PoolMode};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::{SERVERS_PER_DB, config, scrape, setup};
use crate::helpers::{OPERATOR_TOKEN, SOURCE_TOKEN, closed_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(unsafe_code)] // kill(2) on the pgbouncer process this test started
async fn metrics_are_read_through_pgbouncer_in_transaction_mode() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: SERVERS_PER_DB as u32,
        ..BouncerOptions::default()
    })
    .await;
    let saas = PgPool::connect(&s.pg.url("saas")).await.unwrap();
    let tenant_rows: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM app.accounts WHERE id IN (1, 2)) \
              + (SELECT count(*) FROM app.projects WHERE account_id IN (1, 2)) \
              + (SELECT count(*) FROM app.tasks t JOIN app.projects p ON p.id = t.project_id \
                 WHERE p.account_id IN (1, 2))",
    )
    .fetch_one(&saas)
    .await
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("deprov.toml");
    std::fs::write(&config_path, config()).unwrap();
    let port = closed_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_deprov"))
            .arg("serve")
            .env("DEPROV_DATABASE_URL", s.bouncer.url("deprov"))
            .env("DEPROV_TARGET_URL", s.bouncer.url("saas"))
            .env("DEPROV_POOLER_MODE", "transaction")
            .env("DEPROV_MIGRATE", "false")
            .env("DEPROV_CONFIG", &config_path)
            .env("DEPROV_OPERATOR_TOKEN", OPERATOR_TOKEN)
            .env("DEPROV_LISTEN", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn deprov serve"),
    );
    let client = {
        deprov::sources::oidc::install_crypto_provider();
        reqwest::Client::new()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(child.0.try_wait().unwrap().is_none(), "deprov serve exited");
        assert!(Instant::now() < deadline, "deprov serve never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    for tenant in ["1", "2"] {
        let status = client
            .post(format!("{base}/v1/deletion-requests"))
            .bearer_auth(SOURCE_TOKEN)
            .json(&json!({ "tenant_id": tenant }))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 202);
    }
    // Scrapes while the worker runs: every scrape's reads share PgBouncer's 2 server connections per
    // database with intake, the queue and the hard delete.
    let deadline = Instant::now() + Duration::from_secs(60);
    let jobs = loop {
        let scrapes = (0..3).map(|_| client.get(format!("{base}/metrics")).send());
        for response in futures::future::join_all(scrapes).await {
            assert_eq!(response.unwrap().status().as_u16(), 200);
        }
        let body: Value = client
            .get(format!("{base}/v1/jobs?limit=100"))
            .bearer_auth(OPERATOR_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let jobs = body["jobs"].as_array().cloned().unwrap_or_default();
        if jobs.len() == 2 && jobs.iter().all(|j| j["state"] == "completed") {
            break jobs;
        }
        assert!(Instant::now() < deadline, "jobs not completed: {jobs:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let progress_rows: i64 = jobs
        .iter()
        .map(|j| j["progress"]["rows_deleted"].as_i64().unwrap())
        .sum();

    let m = scrape(&client, &base).await;
    // Every scrape-time read succeeded: named statements or session settings would fail here
    // (`prepared statement "sqlx_s_1" already exists` / does not exist).
    assert_eq!(m.value("deprov_db_up", &[("database", "state")]), 1.0);
    assert_eq!(m.value("deprov_db_up", &[("database", "target")]), 1.0);
    assert_eq!(
        m.get("deprov_db_read_errors_total", &[]),
        None,
        "{}",
        m.text
    );
    assert_eq!(m.value("deprov_jobs", &[("state", "completed")]), 2.0);
    assert_eq!(progress_rows, tenant_rows);
    assert_eq!(
        m.value("deprov_rows_deleted_total", &[]),
        tenant_rows as f64
    );
    // Acquires went through db::acquire (counted per pool) and none timed out.
    for pool in ["intake", "queue", "target"] {
        assert!(
            m.value("deprov_db_pool_acquire_seconds_count", &[("pool", pool)]) > 0.0,
            "{pool}: {}",
            m.text
        );
        assert_eq!(
            m.get("deprov_db_pool_acquire_timeouts_total", &[("pool", pool)]),
            None,
            "{pool}: {}",
            m.text
        );
    }

    // SAFETY: kill(2) on our own child's pid; it has not been reaped, so the pid is still its own.
    let pid = i32::try_from(child.0.id()).unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        s.bouncer.server_logins() <= 2 * SERVERS_PER_DB,
        "{}",
        s.bouncer.log()
    );
    assert_eq!(s.bouncer.server_closes(), 0, "{}", s.bouncer.log());
    saas.close().await;
}

/// The child process, killed if the test fails before it is stopped (its stderr is the test's).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
