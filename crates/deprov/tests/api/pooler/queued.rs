//! Intake while every PgBouncer server of deprov's database is busy with other clients: deprov holds
//! a connection to PgBouncer, so no pool acquire timeout fires, and its group's `BEGIN` waits in
//! PgBouncer's queue, where no server-side timeout bounds it (only PgBouncer's `query_wait_timeout`,
//! 10 s in `docs/pgbouncer.md`). The caller is answered 503 + `Retry-After` within twice the intake pool's
//! `acquire_timeout`, not after PgBouncer's 10 s; the group is neither cancelled nor its connection
//! closed, so it commits the request once a server is free, and the sender's retry is its duplicate.

use std::time::{Duration, Instant};

use deprov_testkit::{BouncerOptions, PoolMode};
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::Connection as _;

use super::{SERVERS_PER_DB, config, scrape, setup, start_app_with};

async fn stored(direct: &sqlx::PgPool, tenant: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM deprov.deletion_requests WHERE subject = $1")
        .bind(tenant)
        .fetch_one(direct)
        .await
        .unwrap()
}

/// `deprov_intake_unconfirmed_total` on the app's `/metrics` (this process's registry; 0 before
/// the first).
async fn unconfirmed(client: &reqwest::Client, base: &str) -> f64 {
    scrape(client, base)
        .await
        .get("deprov_intake_unconfirmed_total", &[])
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pgbouncers_servers_all_busy_intake_answers_503_in_time_and_commits_later() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: SERVERS_PER_DB as u32,
        settings: vec![("query_wait_timeout".into(), "10".into())],
        ..BouncerOptions::default()
    })
    .await;
    let acquire_timeout = Duration::from_millis(500);
    let text = config().replace(
        "[pools.intake]\nmax_connections = 8\nacquire_timeout = \"5s\"",
        "[pools.intake]\nmax_connections = 8\nacquire_timeout = \"500ms\"",
    );
    assert_ne!(
        text,
        config(),
        "the intake pool's acquire_timeout was not replaced"
    );
    let app = start_app_with(&s, false, &text).await;
    let client = reqwest::Client::new();
    assert_eq!(
        app.post_deletion(&client, "1").await.status(),
        StatusCode::ACCEPTED
    );

    let unconfirmed_before = unconfirmed(&client, &app.base).await;
    // Other clients of the same database and user take every server of the pool for 4 s.
    let hold = Duration::from_secs(4);
    let mut holders = tokio::task::JoinSet::new();
    for _ in 0..SERVERS_PER_DB {
        let url = s.bouncer.url("deprov");
        holders.spawn(async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::raw_sql("SELECT pg_sleep(4)")
                .execute(&mut conn)
                .await
                .unwrap();
            conn.close().await.unwrap();
        });
    }
    let direct = sqlx::PgPool::connect(&s.pg.url("deprov")).await.unwrap();
    let started = Instant::now();
    loop {
        let sleeping: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(4)' AND state = 'active'",
        )
        .fetch_one(&direct)
        .await
        .unwrap();
        if sleeping == SERVERS_PER_DB as i64 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the holders did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held_at = Instant::now();

    let sent = Instant::now();
    let answer = app.post_deletion(&client, "2").await;
    let waited = sent.elapsed();
    let status = answer.status();
    let retry_after = answer.headers().get("retry-after").cloned();
    let content_type = answer.headers().get("content-type").cloned();
    let body: Value = answer.json().await.unwrap();
    println!("servers busy: intake answered {status} in {waited:?}: {body}");
    assert!(
        held_at.elapsed() < hold,
        "the servers were freed before the answer; the test proves nothing"
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(retry_after.is_some());
    assert_eq!(content_type.unwrap(), "application/problem+json");
    assert!(
        waited < 2 * acquire_timeout + Duration::from_millis(700),
        "answered after {waited:?}"
    );

    // The group was not cancelled: once a server is free it commits the request.
    while holders.join_next().await.is_some() {}
    // A scrape reads the databases through PgBouncer too: only once its servers are free.
    assert_eq!(
        unconfirmed(&client, &app.base).await - unconfirmed_before,
        1.0,
        "deprov_intake_unconfirmed_total"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while stored(&direct, "2").await == 0 {
        assert!(
            Instant::now() < deadline,
            "the unconfirmed request was never committed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let retry: Value = app.post_deletion(&client, "2").await.json().await.unwrap();
    assert_eq!(retry["duplicate"], true, "{retry}");
    assert_eq!(stored(&direct, "2").await, 1);
    app.cancel.cancel();
    let _ = app.server.await;
}
