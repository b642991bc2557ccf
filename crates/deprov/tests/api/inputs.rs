//! Inputs schemathesis found mishandled, now refused (or accepted) as `openapi.yaml` says: U+0000 in
//! stored text was a 500 (PostgreSQL `text` cannot hold it), a JSON array was read as a request
//! body, JSON `null` (allowed by the spec) was refused as the Vercel body, and key lengths are
//! counted in characters like OpenAPI's `maxLength`.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{OPERATOR_TOKEN, VERCEL_TOKEN, accepted, assert_problem, spawn_app};

async fn count_audit(app: &crate::helpers::TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM deprov.audit_log")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn nul_in_stored_text_is_422_and_stores_nothing() {
    let app = spawn_app().await;
    let r = app
        .post_deletion(&json!({"tenant_id": "1", "reason": "a\u{0}b"}))
        .await;
    let body = assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
    assert!(
        body["detail"].as_str().unwrap().contains("U+0000"),
        "{body}"
    );
    let r = app
        .delete_installation(
            "icfg_1",
            VERCEL_TOKEN,
            Some(&json!({"reason": "\u{0}"})),
            None,
        )
        .await;
    assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
    app.assert_nothing_stored().await;

    for body in [
        json!({"engaged": true, "reason": "x\u{0}"}),
        json!({"engaged": true, "reason": "x", "actor": "\u{0}a"}),
        json!({"engaged": true, "reason": "x", "scope": "tenant", "key": "t\u{0}"}),
    ] {
        let r = app
            .client
            .put(app.url("/v1/kill-switch"))
            .bearer_auth(OPERATOR_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
    }
    assert_eq!(count_audit(&app).await, 0, "no kill switch change recorded");

    let r = app.operator_get("/v1/audit?action=job.%00").await;
    assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
    // The same filter without U+0000 is fine.
    let r = app.operator_get("/v1/audit?action=job.").await;
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_json_array_is_not_a_request_body_and_null_is_the_empty_vercel_body() {
    let app = spawn_app().await;
    // serde reads a struct from an array: unchecked, ["7", null, null, null] would be tenant 7.
    let r = app
        .post_raw("application/json", r#"["7", null, null, null]"#)
        .await;
    let body = assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
    assert!(
        body["detail"].as_str().unwrap().contains("object"),
        "{body}"
    );
    let r = app
        .delete_installation("icfg_1", VERCEL_TOKEN, Some(&json!([null, null])), None)
        .await;
    assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
    // Malformed JSON stays 400.
    let r = app.post_raw("application/json", "[1,").await;
    assert_problem(r, StatusCode::BAD_REQUEST).await;
    app.assert_nothing_stored().await;

    let r = app
        .delete_installation("icfg_1", VERCEL_TOKEN, Some(&json!(null)), None)
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!((app.count_requests().await, app.count_jobs().await), (1, 1));
}

#[tokio::test]
async fn key_lengths_are_characters() {
    let app = spawn_app().await;
    // 256 three-byte characters (768 bytes) fit `maxLength: 256`; 257 do not.
    let tenant = "€".repeat(256);
    let a = accepted(app.post_deletion(&json!({"tenant_id": tenant})).await).await;
    assert_eq!(a["tenant_id"], tenant);
    let r = app
        .post_deletion(&json!({"tenant_id": "€".repeat(257)}))
        .await;
    assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
    let r = app
        .post_deletion(&json!({"tenant_id": "1", "external_id": "é".repeat(255)}))
        .await;
    accepted(r).await;
    let r = app
        .post_deletion(&json!({"tenant_id": "1", "external_id": "é".repeat(256)}))
        .await;
    assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
    let stored: Vec<String> =
        sqlx::query_scalar("SELECT subject FROM deprov.jobs ORDER BY subject")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(stored, vec!["1".to_owned(), tenant]);
}
