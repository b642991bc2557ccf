//! The kill switch over HTTP: round trip, requests recorded as `held` while engaged, release.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{OPERATOR_TOKEN, accepted, assert_problem, deletion, spawn_app};

#[tokio::test]
async fn put_and_get_round_trip() {
    let app = spawn_app().await;
    let initial: Value = app
        .operator_get("/v1/kill-switch")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (initial["engaged"].as_bool(), initial["version"].as_i64()),
        (Some(false), Some(0))
    );
    let response = app.put_kill_switch(true, "incident 42").await;
    assert_eq!(response.status(), StatusCode::OK);
    let set: Value = response.json().await.unwrap();
    assert_eq!(
        (
            set["engaged"].as_bool(),
            set["version"].as_i64(),
            set["jobs_moved"].as_u64()
        ),
        (Some(true), Some(1), Some(0))
    );
    let got: Value = app
        .operator_get("/v1/kill-switch")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(got["engaged"], true);
    assert_eq!(got["reason"], "incident 42");
    assert_eq!(
        got["changed_by"], "env:operator",
        "the bootstrap DEPROV_OPERATOR_TOKEN's actor"
    );
    assert_eq!(got["version"], 1);
    assert_eq!(got["changed_at"], set["changed_at"]);
    assert!(got.get("jobs_moved").is_none());
    let engaged: bool = sqlx::query_scalar("SELECT engaged FROM deprov.kill_switch")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(engaged);
}

#[tokio::test]
async fn invalid_kill_switch_bodies_are_refused() {
    let app = spawn_app().await;
    let put = |body: Value| {
        app.client
            .put(app.url("/v1/kill-switch"))
            .bearer_auth(OPERATOR_TOKEN)
            .json(&body)
            .send()
    };
    assert_problem(
        put(json!({"engaged": true})).await.unwrap(),
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_problem(
        put(json!({"engaged": true, "reason": "  "})).await.unwrap(),
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_problem(
        put(json!({"engaged": "yes", "reason": "x"})).await.unwrap(),
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_problem(
        put(json!({"engaged": true, "reason": "x", "force": true}))
            .await
            .unwrap(),
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    let version: i64 = sqlx::query_scalar("SELECT version FROM deprov.kill_switch")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(version, 0);
}

#[tokio::test]
async fn requests_are_recorded_as_held_while_engaged_and_released_to_queued() {
    let app = spawn_app().await;
    let before = accepted(app.post_deletion(&deletion("acct_before")).await).await;
    let engaged: Value = app
        .put_kill_switch(true, "stop")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(engaged["jobs_moved"], 1, "the queued job is held");
    assert_eq!(
        app.job_state(before["job_id"].as_str().unwrap()).await,
        "held"
    );

    let during = accepted(app.post_deletion(&deletion("acct_during")).await).await;
    assert_eq!(during["state"], "held");
    let while_held: bool = sqlx::query_scalar(
        "SELECT received_while_held FROM deprov.deletion_requests WHERE id = $1",
    )
    .bind(
        during["request_id"]
            .as_str()
            .unwrap()
            .parse::<uuid::Uuid>()
            .unwrap(),
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert!(while_held);

    let released: Value = app
        .put_kill_switch(false, "all clear")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            released["engaged"].as_bool(),
            released["jobs_moved"].as_u64(),
            released["version"].as_i64()
        ),
        (Some(false), Some(2), Some(2))
    );
    for body in [&before, &during] {
        assert_eq!(
            app.job_state(body["job_id"].as_str().unwrap()).await,
            "queued"
        );
    }
    let job: Value = app
        .get_job(during["job_id"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(job["state"], "queued");
}

#[tokio::test]
async fn the_cli_engages_and_releases_the_same_switch() {
    use clap::Parser;
    let app = spawn_app().await;
    accepted(app.post_deletion(&deletion("acct_1")).await).await;
    let url = app.db_url.clone();
    let cli = |args: &[&str]| {
        let mut argv = vec!["deprov", "kill-switch", "--database-url", &url];
        argv.extend_from_slice(args);
        deprov::cli::run(deprov::cli::Cli::parse_from(argv))
    };
    cli(&["on", "--reason", "from the cli"]).await.unwrap();
    let got: Value = app
        .operator_get("/v1/kill-switch")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            got["engaged"].as_bool(),
            got["changed_by"].as_str(),
            got["reason"].as_str()
        ),
        (Some(true), Some("cli"), Some("from the cli"))
    );
    assert_eq!(
        sqlx::query_scalar::<_, String>("SELECT state FROM deprov.jobs")
            .fetch_one(&app.db)
            .await
            .unwrap(),
        "held"
    );
    cli(&["status", "--json"]).await.unwrap();
    cli(&["off"]).await.unwrap();
    assert_eq!(
        sqlx::query_scalar::<_, String>("SELECT state FROM deprov.jobs")
            .fetch_one(&app.db)
            .await
            .unwrap(),
        "queued"
    );
}
