//! PostgreSQL restarted behind PgBouncer, with `docs/pgbouncer.md`'s settings: deprov answers 503
//! with `Retry-After` while the server is down and is ready again within seconds of its return,
//! without a restart of deprov or of PgBouncer.
//!
//! PgBouncer waits `server_login_retry` (its default is 15 s) before it tries a server login again
//! after one failed: the probes deprov's `/readyz` and intake make during the outage fail a login,
//! so with that default deprov stays unready for seconds after PostgreSQL is back; with the
//! `docs/pgbouncer.md`'s 1 s, for under one.

use std::time::{Duration, Instant};

use deprov_testkit::{BouncerOptions, PoolMode};
use reqwest::StatusCode;

use super::{SERVERS_PER_DB, setup, start_app};

/// `docs/pgbouncer.md`'s `[pgbouncer]` settings beyond the pool size.
fn readme_settings() -> Vec<(String, String)> {
    [("query_wait_timeout", "10"), ("server_login_retry", "1")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

async fn ready(client: &reqwest::Client, base: &str) -> StatusCode {
    client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_postgres_restart_behind_pgbouncer_deprov_is_ready_within_seconds() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: SERVERS_PER_DB as u32,
        settings: readme_settings(),
        ..BouncerOptions::default()
    })
    .await;
    let app = start_app(&s, false).await;
    let client = reqwest::Client::new();
    assert_eq!(
        app.post_deletion(&client, "1").await.status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(ready(&client, &app.base).await, StatusCode::OK);

    s.pg.stop().unwrap();
    // Down: both answer 503 + Retry-After as problem+json, and each probe fails a server login.
    let down = app.post_deletion(&client, "2").await;
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(down.headers().contains_key("retry-after"), "{down:?}");
    assert_eq!(
        down.headers()["content-type"],
        "application/problem+json",
        "{down:?}"
    );
    assert_eq!(
        ready(&client, &app.base).await,
        StatusCode::SERVICE_UNAVAILABLE
    );

    let restarting = Instant::now();
    s.pg.restart().unwrap();
    let back = Instant::now();
    println!("PostgreSQL restarted in {:?}", back - restarting);
    while ready(&client, &app.base).await != StatusCode::OK {
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "not ready 30 s after PostgreSQL returned"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let readied = back.elapsed();
    let accepted = app.post_deletion(&client, "3").await;
    let answered = back.elapsed();
    println!(
        "behind PgBouncer: ready {readied:?}, intake 202 {answered:?} after PostgreSQL returned"
    );
    assert_eq!(accepted.status(), StatusCode::ACCEPTED);
    // server_login_retry = 1: under a second here. PgBouncer's default (15) fails this.
    assert!(
        answered < Duration::from_secs(3),
        "ready {readied:?}, intake {answered:?} after PostgreSQL returned"
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM deprov.deletion_requests")
        .fetch_one(&sqlx::PgPool::connect(&s.pg.url("deprov")).await.unwrap())
        .await
        .unwrap();
    assert_eq!(
        stored, 2,
        "the two accepted requests, not the one answered 503"
    );
    app.cancel.cancel();
    let _ = app.server.await;
}
