//! The whole service through PgBouncer in transaction mode.

use std::time::{Duration, Instant};

use deprov_testkit::{BouncerOptions, PoolMode, Show};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::{SERVERS_PER_DB, sessions, setup, start_app};
use crate::helpers::{OPERATOR_TOKEN, SOURCE_TOKEN};

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
    let app = start_app(&s, true).await;
    let (base, cancel) = (app.base.clone(), app.cancel.clone());
    let client = {
        deprov::sources::oidc::install_crypto_provider();
        reqwest::Client::new()
    };

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
    app.server.await.unwrap().unwrap();
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
    let app = start_app(&s, false).await;
    let (base, cancel) = (app.base.clone(), app.cancel.clone());

    let state = PgPool::connect(&s.pg.url("deprov")).await.unwrap();
    let mut holder = state.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM deprov.kill_switch FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let impatient = {
        deprov::sources::oidc::install_crypto_provider();
        reqwest::Client::builder()
    }
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
    app.server.await.unwrap().unwrap();
}
