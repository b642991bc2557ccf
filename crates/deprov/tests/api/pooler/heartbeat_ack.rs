//! Kill switch acknowledgement through PgBouncer in transaction mode, where `LISTEN` cannot pass:
//! without `DEPROV_NOTIFY_URL` the worker acknowledges by heartbeat.

use std::time::{Duration, Instant};

use deprov_testkit::{BouncerOptions, PoolMode};
use serde_json::{Value, json};

use super::{SERVERS_PER_DB, setup, start_app};
use crate::helpers::OPERATOR_TOKEN;

async fn status(client: &reqwest::Client, base: &str) -> Value {
    client
        .get(format!("{base}/v1/kill-switch"))
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Polls (20 ms) until `pred` holds, at most 10 s.
async fn until(client: &reqwest::Client, base: &str, what: &str, pred: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status(client, base).await;
        if pred(&s) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_notify_url_the_worker_acknowledges_by_heartbeat_through_the_pooler() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: SERVERS_PER_DB as u32,
        ..BouncerOptions::default()
    })
    .await;
    let app = start_app(&s, true).await;
    let client = reqwest::Client::new();
    until(&client, &app.base, "one live worker, not listening", |s| {
        s["live_workers"].as_array().is_some_and(|w| w.len() == 1)
            && s["live_workers"][0]["listening"] == false
    })
    .await;
    let engaged = Instant::now();
    let response = client
        .put(format!("{}/v1/kill-switch", app.base))
        .bearer_auth(OPERATOR_TOKEN)
        .json(&json!({"engaged": true, "reason": "behind pgbouncer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    until(&client, &app.base, "acknowledged", |s| {
        s["acknowledged"] == true
    })
    .await;
    let took = engaged.elapsed();
    println!(
        "acknowledged by heartbeat through PgBouncer after {took:?} ([worker] heartbeat_interval = 1s)"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    let listeners: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'deprov-listener'",
    )
    .fetch_one(&s.direct)
    .await
    .unwrap();
    assert_eq!(
        listeners, 0,
        "no LISTEN connection in transaction mode without a notify URL"
    );
    app.cancel.cancel();
    app.server.await.unwrap().unwrap();
}
