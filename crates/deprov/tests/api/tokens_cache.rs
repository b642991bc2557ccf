//! The operator token cache: while a server's copy is fresh, requests do not read the token table.

use std::time::Instant;

use reqwest::StatusCode;

use crate::helpers::{TestApp, TestOptions, assert_problem, spawn_app_with};
use crate::tokens::{create, get};

/// Sends 20 `GET /v1/jobs` with `token` while the test holds an ACCESS EXCLUSIVE lock on the token
/// table; returns their statuses. A request that reads the table waits for the lock until
/// `lock_timeout` (1 s) and is answered 503.
async fn statuses_while_the_table_is_locked(app: &TestApp, token: &str) -> Vec<StatusCode> {
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE deprov.operator_tokens IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(get(app, token, "/v1/jobs").await.status());
    }
    lock.rollback().await.unwrap();
    statuses
}

#[tokio::test]
async fn requests_do_not_read_the_token_table_while_the_cached_copy_is_fresh() {
    // A long TTL: after one read, 20 requests are answered from the copy, table locked or not.
    let app = spawn_app_with(TestOptions {
        extra_config: "[operator_tokens]\ncache_ttl = \"60s\"\n".into(),
        ..Default::default()
    })
    .await;
    let frank = create(&app, "frank", "read-only").await;
    assert_eq!(get(&app, &frank, "/v1/jobs").await.status(), StatusCode::OK);
    let started = Instant::now();
    let statuses = statuses_while_the_table_is_locked(&app, &frank).await;
    assert_eq!(statuses, vec![StatusCode::OK; 20]);
    eprintln!(
        "20 cached checks under the lock took {:?}",
        started.elapsed()
    );

    // TTL 0: every request reads the table, so the same lock makes them wait and answer 503.
    let app = spawn_app_with(TestOptions {
        extra_config: "[operator_tokens]\ncache_ttl = \"0s\"\n".into(),
        ..Default::default()
    })
    .await;
    let gina = create(&app, "gina", "read-only").await;
    assert_eq!(get(&app, &gina, "/v1/jobs").await.status(), StatusCode::OK);
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE deprov.operator_tokens IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    assert_problem(
        get(&app, &gina, "/v1/jobs").await,
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    lock.rollback().await.unwrap();
    assert_eq!(get(&app, &gina, "/v1/jobs").await.status(), StatusCode::OK);
}
