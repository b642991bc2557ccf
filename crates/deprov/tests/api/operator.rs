//! Operator routes: 403 without an operator token configured, 401 on a wrong one; job views.

use reqwest::StatusCode;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::helpers::{
    OPERATOR_TOKEN, SOURCE_TOKEN, TestOptions, accepted, assert_problem, deletion, spawn_app,
    spawn_app_with,
};

const OPERATOR_ROUTES: [(&str, &str); 4] = [
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/0190f0b4-0000-7000-8000-000000000000"),
    ("GET", "/v1/kill-switch"),
    ("PUT", "/v1/kill-switch"),
];

fn operator_request(
    app: &crate::helpers::TestApp,
    method: &str,
    path: &str,
) -> reqwest::RequestBuilder {
    let builder = app.client.request(method.parse().unwrap(), app.url(path));
    if method == "PUT" {
        builder.json(&json!({"engaged": true, "reason": "test"}))
    } else {
        builder
    }
}

#[tokio::test]
async fn operator_routes_are_403_when_no_operator_token_is_configured() {
    let app = spawn_app_with(TestOptions {
        operator: false,
        ..Default::default()
    })
    .await;
    for (method, path) in OPERATOR_ROUTES {
        for token in [None, Some(OPERATOR_TOKEN), Some("")] {
            let mut req = operator_request(&app, method, path);
            if let Some(token) = token {
                req = req.bearer_auth(token);
            }
            assert_problem(req.send().await.unwrap(), StatusCode::FORBIDDEN).await;
        }
    }
    let engaged: bool = sqlx::query_scalar("SELECT engaged FROM deprov.kill_switch")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(!engaged, "a refused PUT changes nothing");
}

#[tokio::test]
async fn operator_routes_are_401_on_a_missing_or_wrong_token() {
    let app = spawn_app().await;
    for (method, path) in OPERATOR_ROUTES {
        for token in [None, Some(SOURCE_TOKEN), Some("operator-token-0123456788")] {
            let mut req = operator_request(&app, method, path);
            if let Some(token) = token {
                req = req.bearer_auth(token);
            }
            assert_problem(req.send().await.unwrap(), StatusCode::UNAUTHORIZED).await;
        }
    }
    let version: i64 = sqlx::query_scalar("SELECT version FROM deprov.kill_switch")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(version, 0, "a refused PUT changes nothing");
}

fn timestamp(value: &Value) -> OffsetDateTime {
    OffsetDateTime::parse(
        value
            .as_str()
            .unwrap_or_else(|| panic!("not a timestamp: {value}")),
        &Rfc3339,
    )
    .unwrap()
}

#[tokio::test]
async fn get_job_shows_state_timestamps_and_progress() {
    let app = spawn_app().await;
    let job_id = accepted(app.post_deletion(&deletion("acct_1")).await).await["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let response = app.get_job(&job_id).await;
    assert_eq!(response.status(), StatusCode::OK);
    let job: Value = response.json().await.unwrap();
    assert_eq!(
        (
            job["job_id"].as_str(),
            job["tenant_id"].as_str(),
            job["state"].as_str()
        ),
        (Some(job_id.as_str()), Some("acct_1"), Some("queued"))
    );
    assert_eq!(
        (job["attempts"].as_i64(), &job["last_error"]),
        (Some(0), &Value::Null)
    );
    timestamp(&job["created_at"]);
    assert_eq!(
        (&job["started_at"], &job["finished_at"]),
        (&Value::Null, &Value::Null)
    );
    assert_eq!(
        job["progress"],
        json!({"rows_deleted": 0, "current_table": null, "tables": []})
    );

    let progress = json!({"rows_deleted": 1500, "current_table": "app.\"Line Items\"",
                          "tables": [{"table": "app.invoices", "rows_deleted": 1500}], "longest_batch_ms": 42});
    sqlx::query(
        "UPDATE deprov.jobs SET state = 'failed', attempts = 3, last_error = 'boom', progress = $2, \
         started_at = now() - interval '1 minute', finished_at = now() WHERE id = $1",
    )
    .bind(job_id.parse::<uuid::Uuid>().unwrap())
    .bind(&progress)
    .execute(&app.db)
    .await
    .unwrap();
    let job: Value = app.get_job(&job_id).await.json().await.unwrap();
    assert_eq!(
        (
            job["state"].as_str(),
            job["attempts"].as_i64(),
            job["last_error"].as_str()
        ),
        (Some("failed"), Some(3), Some("boom"))
    );
    assert_eq!(job["progress"], progress, "progress keys pass through");
    assert!(timestamp(&job["started_at"]) < timestamp(&job["finished_at"]));
}

#[tokio::test]
async fn get_job_refuses_unknown_and_malformed_ids() {
    let app = spawn_app().await;
    assert_problem(
        app.get_job("0190f0b4-0000-7000-8000-000000000000").await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_problem(app.get_job("not-a-uuid").await, StatusCode::BAD_REQUEST).await;
}

#[tokio::test]
async fn list_jobs_filters_by_state_and_validates_the_query() {
    let app = spawn_app().await;
    for tenant in ["a", "b", "c"] {
        accepted(app.post_deletion(&deletion(tenant)).await).await;
    }
    sqlx::query(
        "UPDATE deprov.jobs SET state = 'completed', finished_at = now() WHERE subject = 'b'",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let all: Value = app.operator_get("/v1/jobs").await.json().await.unwrap();
    let tenants: Vec<&str> = all["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["tenant_id"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, ["c", "b", "a"], "newest first");
    let queued: Value = app
        .operator_get("/v1/jobs?state=queued&limit=1")
        .await
        .json()
        .await
        .unwrap();
    let queued = queued["jobs"].as_array().unwrap();
    assert_eq!(
        (queued.len(), queued[0]["tenant_id"].as_str()),
        (1, Some("c"))
    );
    let completed: Value = app
        .operator_get("/v1/jobs?state=completed")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(completed["jobs"][0]["tenant_id"], "b");
    assert_eq!(completed["jobs"].as_array().unwrap().len(), 1);
    assert_problem(
        app.operator_get("/v1/jobs?state=exploded").await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_problem(
        app.operator_get("/v1/jobs?limit=0").await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_problem(
        app.operator_get("/v1/jobs?limit=many").await,
        StatusCode::BAD_REQUEST,
    )
    .await;
}
