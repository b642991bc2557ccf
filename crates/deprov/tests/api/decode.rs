//! `[sources.NAME] decode` on an HMAC scheme: a Google Pub/Sub-shaped push (`message.data`, base64
//! JSON) whose tenant, event type and `timestamp` are read inside the decoded data.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use deprov::sources::{github, unix_now};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, TestOptions, assert_problem, spawn_app_with};

const SECRET: &str = "pubsub-relay-secret";

async fn spawn_pubsub(dir: &tempfile::TempDir) -> TestApp {
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    spawn_app_with(TestOptions {
        extra_config: format!(
            r#"
[sources.pubsub]
scheme = "github"
secret_file = [{secret:?}]
decode = [{{ pointer = "/message/data", as = "base64-json" }}]
event = {{ pointer = "/message/data/type" }}
tenant = {{ pointer = "/message/data/tenant" }}
dedup = {{ pointer = "/message/messageId" }}
delete_events = ["tenant.deleted"]
timestamp = "/message/data/createdAt"
max_age = "10m"
"#,
            secret = secret.display().to_string()
        ),
        ..Default::default()
    })
    .await
}

async fn push(app: &TestApp, data: Value) -> reqwest::Response {
    let body = json!({"message": {"data": data, "messageId": "2070443601311540"},
                      "subscription": "projects/p/subscriptions/s"})
    .to_string();
    app.client
        .post(app.url("/v1/webhooks/pubsub"))
        .header("Content-Type", "application/json")
        .header("X-GitHub-Event", "push")
        .header("X-GitHub-Delivery", "d-1")
        .header(
            "X-Hub-Signature-256",
            github::sign(SECRET.as_bytes(), body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

fn data(created_at: i64) -> Value {
    let inner = json!({"type": "tenant.deleted", "tenant": "t-42", "createdAt": created_at});
    json!(STANDARD.encode(inner.to_string()))
}

#[tokio::test]
async fn a_base64_json_payload_is_read_after_decoding_and_bad_layers_are_400() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_pubsub(&dir).await;
    for (value, says) in [
        (json!("not base64!"), "not standard base64"),
        (json!(42), "a number there, not a string"),
        (json!(STANDARD.encode("plain text")), "not a JSON document"),
    ] {
        let problem = assert_problem(push(&app, value).await, StatusCode::BAD_REQUEST).await;
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{problem}"
        );
    }
    // The decoded data's timestamp bounds a replay like any body timestamp.
    let stale = unix_now() - 3600;
    let problem = assert_problem(push(&app, data(stale)).await, StatusCode::UNAUTHORIZED).await;
    assert!(
        problem["detail"].as_str().unwrap().contains("max_age"),
        "{problem}"
    );
    app.assert_nothing_stored_at_all().await;
    let response = push(&app, data(unix_now())).await;
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(
        (&body["outcome"], &body["event_type"]),
        (&json!("recorded"), &json!("tenant.deleted"))
    );
    let (subject, external): (String, Option<String>) = sqlx::query_as(
        "SELECT j.subject, r.external_id FROM deprov.deletion_requests r JOIN deprov.jobs j ON j.id = r.job_id",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        (subject.as_str(), external.as_deref()),
        ("t-42", Some("2070443601311540"))
    );
}
