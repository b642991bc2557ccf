//! Malformed input and unknown routes: problem+json (RFC 9457) and nothing stored.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{MAX_BODY, assert_problem, spawn_app};

#[tokio::test]
async fn malformed_json_is_400() {
    let app = spawn_app().await;
    for body in [
        "{\"tenant_id\": ",
        "not json",
        "",
        "{\"tenant_id\": \"a\"} trailing",
    ] {
        assert_problem(
            app.post_raw("application/json", body).await,
            StatusCode::BAD_REQUEST,
        )
        .await;
    }
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn an_oversized_body_is_413() {
    let app = spawn_app().await;
    let body = json!({"tenant_id": "acct_1", "reason": "r".repeat(MAX_BODY)}).to_string();
    assert_problem(
        app.post_raw("application/json", body).await,
        StatusCode::PAYLOAD_TOO_LARGE,
    )
    .await;
    let response = app
        .client
        .delete(app.url("/v1/installations/icfg_1"))
        .bearer_auth(crate::helpers::VERCEL_TOKEN);
    let response = response
        .header("Content-Type", "application/json")
        .body(" ".repeat(MAX_BODY + 1))
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::PAYLOAD_TOO_LARGE).await;
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn an_unknown_field_is_422() {
    let app = spawn_app().await;
    let body = json!({"tenant_id": "acct_1", "tenant": "typo"}).to_string();
    let problem = assert_problem(
        app.post_raw("application/json", body).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert!(
        problem["detail"].as_str().unwrap().contains("tenant"),
        "{problem}"
    );
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn a_wrong_content_type_is_415() {
    let app = spawn_app().await;
    let body = json!({"tenant_id": "acct_1"}).to_string();
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/jsonx",
    ] {
        assert_problem(
            app.post_raw(content_type, body.clone()).await,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        )
        .await;
    }
    let no_type = app
        .client
        .post(app.url("/v1/deletion-requests"))
        .bearer_auth(crate::helpers::SOURCE_TOKEN);
    assert_problem(
        no_type.body(body.clone()).send().await.unwrap(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
    )
    .await;
    app.assert_nothing_stored().await;
    // Parameters and `+json` types are fine.
    assert_eq!(
        app.post_raw("application/json; charset=utf-8", body)
            .await
            .status(),
        StatusCode::ACCEPTED
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_are_problems_too() {
    let app = spawn_app().await;
    assert_problem(app.get("/v1/nothing-here").await, StatusCode::NOT_FOUND).await;
    let wrong_method = app
        .client
        .get(app.url("/v1/deletion-requests"))
        .send()
        .await
        .unwrap();
    assert_problem(wrong_method, StatusCode::METHOD_NOT_ALLOWED).await;
    let response = app.get("/healthz").await;
    assert!(
        response.headers().get("x-request-id").is_some(),
        "a request ID is generated and echoed"
    );
    let echoed = app
        .client
        .get(app.url("/healthz"))
        .header("x-request-id", "trace-me")
        .send()
        .await
        .unwrap();
    assert_eq!(echoed.headers().get("x-request-id").unwrap(), "trace-me");
}
