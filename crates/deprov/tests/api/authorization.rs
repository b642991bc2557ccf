//! A repeated `Authorization` header: every route that reads it answers 401 "repeated
//! Authorization header", whichever of the values comes first, and stores nothing.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{
    OPERATOR_TOKEN, SOURCE_TOKEN, VERCEL_TOKEN, assert_problem, deletion, spawn_app,
};

pub const REPEATED: &str = "repeated Authorization header";

/// Asserts a 401 problem whose detail says the header was repeated.
pub async fn assert_repeated(response: reqwest::Response, what: &str) {
    let body = assert_problem(response, StatusCode::UNAUTHORIZED).await;
    assert!(
        body["detail"].as_str().unwrap().contains(REPEATED),
        "{what}: {body}"
    );
}

/// `req` with two `Authorization` headers: `first`, then `second`.
fn twice(req: reqwest::RequestBuilder, first: &str, second: &str) -> reqwest::RequestBuilder {
    req.header("Authorization", first)
        .header("Authorization", second)
}

/// Each route with a good token first and garbage second, and the other way round.
async fn both_orders(good: &str, route: impl Fn() -> reqwest::RequestBuilder) {
    let good = format!("Bearer {good}");
    for (first, second) in [(good.as_str(), "Bearer garbage"), ("Bearer garbage", &good)] {
        let response = twice(route(), first, second).send().await.unwrap();
        assert_repeated(response, &format!("{first} then {second}")).await;
    }
}

#[tokio::test]
async fn a_repeated_authorization_header_is_401_on_bearer_operator_and_vercel_routes() {
    let app = spawn_app().await;
    both_orders(SOURCE_TOKEN, || {
        app.client
            .post(app.url("/v1/deletion-requests"))
            .json(&deletion("acct_1"))
    })
    .await;
    both_orders(SOURCE_TOKEN, || {
        app.client
            .post(app.url("/v1/webhooks/billing"))
            .json(&json!({"tenant_id": "acct_1"}))
    })
    .await;
    both_orders(VERCEL_TOKEN, || {
        app.client
            .delete(app.url("/v1/installations/icfg_1"))
            .header("X-Vercel-Auth", "system")
    })
    .await;
    both_orders(OPERATOR_TOKEN, || app.client.get(app.url("/v1/jobs"))).await;
    both_orders(OPERATOR_TOKEN, || {
        app.client
            .put(app.url("/v1/kill-switch"))
            .json(&json!({"engaged": true, "reason": "test"}))
    })
    .await;
    app.assert_nothing_stored().await;
    let version: i64 = sqlx::query_scalar("SELECT version FROM deprov.kill_switch")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(version, 0, "a refused PUT changes nothing");
    // One header still works.
    let ok = app
        .client
        .post(app.url("/v1/deletion-requests"))
        .bearer_auth(SOURCE_TOKEN)
        .json(&deletion("acct_1"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::ACCEPTED);
}
