//! A NUL character (`\u0000`), which PostgreSQL cannot store in text, in any JSON string or query
//! parameter: 422 problem+json naming it, nothing stored (was a 500 from SQLSTATE 22021).

use reqwest::StatusCode;

use crate::helpers::{OPERATOR_TOKEN, assert_problem, spawn_app};

/// The problem names the character: "NUL", "U+0000", or (tenant keys) "control characters".
fn names_nul(problem: &serde_json::Value) {
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("NUL")
            || detail.contains("U+0000")
            || detail.contains("control characters"),
        "{problem}"
    );
}

#[tokio::test]
async fn a_nul_in_a_json_field_or_query_parameter_is_422_and_stores_nothing() {
    let app = spawn_app().await;
    for body in [
        r#"{"tenant_id":"44","reason":"a\u0000b"}"#,
        r#"{"tenant_id":"4\u00004"}"#,
    ] {
        names_nul(
            &assert_problem(
                app.post_raw("application/json", body).await,
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await,
        );
    }
    app.assert_nothing_stored().await;
    for body in [
        r#"{"engaged":true,"reason":"a\u0000b"}"#,
        r#"{"engaged":true,"reason":"x","scope":"tenant","key":"k\u0000"}"#,
    ] {
        let response = app
            .client
            .put(app.url("/v1/kill-switch"))
            .bearer_auth(OPERATOR_TOKEN)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        names_nul(&assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY).await);
    }
    for path in ["/v1/audit?action=job%00", "/v1/jobs?state=queued%00"] {
        names_nul(
            &assert_problem(
                app.operator_get(path).await,
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await,
        );
    }
    let (audit, scopes): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM deprov.audit_log), \
                (SELECT count(*) FROM deprov.kill_switch_scopes)",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!((audit, scopes), (0, 0), "no switch or audit entry stored");
    let engaged: bool = sqlx::query_scalar("SELECT engaged FROM deprov.kill_switch")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(!engaged, "the global switch stays released");
}

/// The backstop for text that would reach PostgreSQL by another way: its refusal of a NUL in text
/// (SQLSTATE 22021) and in `jsonb` (22P05) is a 422 at the HTTP edge, not a 500. (Every route's
/// input is checked before the database: JSON bodies and query strings above, path and header
/// values by their own validation.)
#[tokio::test]
async fn postgresql_refusing_a_nul_maps_to_422() {
    let pg = crate::process::start_pg(None).await;
    let db = crate::process::connect(&pg).await;
    let text = sqlx::query("SELECT $1::text")
        .bind("a\0b")
        .fetch_one(&db)
        .await
        .unwrap_err();
    let json = sqlx::query("SELECT $1::text::jsonb")
        .bind(r#"{"a":"\u0000"}"#)
        .fetch_one(&db)
        .await
        .unwrap_err();
    for (e, code) in [(text, "22021"), (json, "22P05")] {
        assert_eq!(
            e.as_database_error().and_then(|d| d.code()).as_deref(),
            Some(code)
        );
        let api = deprov::http::error::ApiError::from(e);
        assert_eq!(api.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(api.problem().detail.contains("NUL"), "{api}");
    }
}
