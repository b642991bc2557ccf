//! Scoped kill switches over HTTP, with the live workers' acknowledgement, and `GET /v1/audit`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{OPERATOR_TOKEN, TestApp, TestOptions, assert_problem, spawn_app_with};

impl TestApp {
    async fn put_switch(&self, body: Value) -> reqwest::Response {
        self.client
            .put(self.url("/v1/kill-switch"))
            .bearer_auth(OPERATOR_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn switch_status(&self) -> Value {
        self.operator_get("/v1/kill-switch")
            .await
            .json()
            .await
            .unwrap()
    }

    /// Polls `GET /v1/kill-switch` (10 ms) until `pred` holds, at most 10 s.
    async fn status_until(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let status = self.switch_status().await;
            if pred(&status) {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {status}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn a_tenant_switch_is_versioned_acknowledged_by_the_live_worker_and_audited() {
    let app = spawn_app_with(TestOptions {
        worker: true,
        ..Default::default()
    })
    .await;
    app.status_until("one live worker", |s| {
        s["live_workers"].as_array().unwrap().len() == 1
    })
    .await;
    let response = app
        .put_switch(
            json!({"engaged": true, "reason": "tenant incident", "scope": "tenant",
                           "key": "acct_9"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let set: Value = response.json().await.unwrap();
    assert_eq!(
        (
            &set["scope"],
            &set["key"],
            &set["version"],
            &set["changed_by"],
            &set["jobs_moved"]
        ),
        (
            &json!("tenant"),
            &json!("acct_9"),
            &json!(1),
            &json!("env:operator"),
            &json!(0)
        )
    );
    let status = app
        .status_until("acknowledged", |s| s["acknowledged"] == true)
        .await;
    assert_eq!(status["engaged"], false, "the global switch is untouched");
    assert_eq!(
        (
            status["version"].as_i64(),
            status["latest_version"].as_i64()
        ),
        (Some(0), Some(1))
    );
    let scopes = status["scopes"].as_array().unwrap();
    assert_eq!(scopes.len(), 2);
    assert_eq!(
        (&scopes[0]["scope"], scopes[0].get("key")),
        (&json!("global"), None)
    );
    assert_eq!(
        (
            &scopes[1]["scope"],
            &scopes[1]["key"],
            &scopes[1]["engaged"],
            &scopes[1]["acknowledged"]
        ),
        (
            &json!("tenant"),
            &json!("acct_9"),
            &json!(true),
            &json!(true)
        )
    );
    let worker = &status["live_workers"][0];
    assert_eq!(
        (&worker["observed_version"], &worker["listening"]),
        (&json!(1), &json!(true))
    );

    // A live worker that acknowledges nothing is named, per scope and overall.
    sqlx::query(
        "INSERT INTO deprov.workers (id, live_until) VALUES ('ghost', now() + interval '1 hour')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let status = app.switch_status().await;
    assert_eq!(
        (&status["acknowledged"], &status["pending_workers"]),
        (&json!(false), &json!(["ghost"]))
    );
    assert_eq!(status["scopes"][1]["pending_workers"], json!(["ghost"]));
    assert_eq!(
        status["scopes"][0]["acknowledged"], true,
        "version 0: nothing to observe"
    );

    let audit: Value = app.operator_get("/v1/audit").await.json().await.unwrap();
    let entry = &audit["entries"][0];
    assert_eq!(
        (
            &entry["action"],
            &entry["target"],
            &entry["actor"],
            &entry["reason"],
            &entry["details"]["version"]
        ),
        (
            &json!("kill_switch.engage"),
            &json!("tenant:acct_9"),
            &json!("env:operator"),
            &json!("tenant incident"),
            &json!(1)
        )
    );
    let none: Value = app
        .operator_get("/v1/audit?action=job.")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(none["entries"], json!([]));
}

#[tokio::test]
async fn invalid_scopes_and_audit_queries_are_refused() {
    let app = spawn_app_with(TestOptions::default()).await;
    for body in [
        json!({"engaged": true, "reason": "x", "key": "acct_1"}),
        json!({"engaged": true, "reason": "x", "scope": "tenant"}),
        json!({"engaged": true, "reason": "x", "scope": "source", "key": "  "}),
        json!({"engaged": true, "reason": "x", "scope": "region", "key": "eu"}),
        // The actor is the token's name, never self-declared: an `actor` field is unknown.
        json!({"engaged": true, "reason": "x", "actor": "carol"}),
    ] {
        assert_problem(
            app.put_switch(body.clone()).await,
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    }
    let latest: i64 = sqlx::query_scalar("SELECT latest_version FROM deprov.kill_switch")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(latest, 0, "nothing changed");
    assert_problem(
        app.operator_get("/v1/audit?limit=0").await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_problem(app.get("/v1/audit").await, StatusCode::UNAUTHORIZED).await;
}

#[tokio::test]
async fn engaging_an_unconfigured_source_is_refused() {
    let app = spawn_app_with(TestOptions::default()).await;
    let problem = assert_problem(
        app.put_switch(
            json!({"engaged": true, "reason": "x", "scope": "source", "key": "nosuchsource"}),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert!(
        problem["detail"].as_str().unwrap().contains("nosuchsource"),
        "{problem}"
    );
    let (latest, audit): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT latest_version FROM deprov.kill_switch), \
                (SELECT count(*) FROM deprov.audit_log)",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!((latest, audit), (0, 0), "nothing changed");
    // A configured source is accepted.
    let response = app
        .put_switch(json!({"engaged": true, "reason": "x", "scope": "source", "key": "billing"}))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn engaging_a_tenant_switch_under_a_key_the_root_cannot_hold_is_refused() {
    // `app.accounts.id` is bigint: `cus_1` is a sender's ID, never a tenant's key.
    let app = spawn_app_with(TestOptions {
        key_type: "bigint",
        ..TestOptions::default()
    })
    .await;
    let problem = assert_problem(
        app.put_switch(json!({"engaged": true, "reason": "x", "scope": "tenant", "key": "cus_1"}))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("decimal integer") && detail.contains("sender's ID"),
        "{problem}"
    );
    let latest: i64 = sqlx::query_scalar("SELECT latest_version FROM deprov.kill_switch")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(latest, 0, "nothing changed");
    // A key the column holds is engaged; releasing takes any key.
    let engaged = app
        .put_switch(json!({"engaged": true, "reason": "x", "scope": "tenant", "key": "07"}))
        .await;
    assert_eq!(engaged.status(), StatusCode::OK);
    let released = app
        .put_switch(json!({"engaged": false, "reason": "x", "scope": "tenant", "key": "cus_1"}))
        .await;
    assert_eq!(released.status(), StatusCode::OK);
}

/// `deprov kill-switch ARGS` (the binary) on `app`'s state database, which is also its target:
/// with the app's configuration as `DEPROV_CONFIG` unless `config` is false. Exit status and
/// stdout + stderr.
async fn kill_switch_cli(app: &TestApp, args: &[&str], config: bool) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_deprov"));
    command
        .arg("kill-switch")
        .args(args)
        .env("DEPROV_DATABASE_URL", &app.db_url)
        .env_remove("DEPROV_CONFIG")
        .env_remove("DEPROV_TARGET_URL")
        .env_remove("DEPROV_POOLER_MODE")
        .env_remove("DEPROV_ACTOR");
    if config {
        command.env("DEPROV_CONFIG", app.config_path());
    }
    let out = command.output().await.unwrap();
    (out.status.code(), crate::process::output_text(&out))
}

/// `deprov kill-switch on --scope tenant` checks the key as `PUT /v1/kill-switch` does: under a
/// key the root's key column cannot hold it exits 1 saying why and changes nothing; a key the
/// column holds is written in the column's form, and released by any spelling of it. Without the
/// configuration the key cannot be checked: it is written as typed, with a warning.
#[tokio::test]
async fn the_cli_refuses_a_tenant_switch_under_a_key_the_root_cannot_hold() {
    // `app.accounts.id` is bigint: `cus_1` is a sender's ID, never a tenant's key.
    let app = spawn_app_with(TestOptions {
        key_type: "bigint",
        ..TestOptions::default()
    })
    .await;
    let changes = || async {
        let row: (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT latest_version FROM deprov.kill_switch), \
                    (SELECT count(*) FROM deprov.kill_switch_scopes), \
                    (SELECT count(*) FROM deprov.audit_log)",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        row
    };
    for key in ["cus_1", "abc", "1.5", "99999999999999999999"] {
        let (code, text) = kill_switch_cli(
            &app,
            &["on", "--scope", "tenant", "--key", key, "--reason", "x"],
            true,
        )
        .await;
        assert_eq!(code, Some(1), "{key}: {text}");
        assert!(
            text.contains("refused, nothing changed")
                && text.contains("decimal integer")
                && text.contains("sender's ID"),
            "{key}: {text}"
        );
        assert_eq!(changes().await, (0, 0, 0), "{key}: nothing changed");
    }

    // A key the column holds: engaged under the column's form, as the API writes it.
    let (code, text) = kill_switch_cli(
        &app,
        &["on", "--scope", "tenant", "--key", "07", "--reason", "x"],
        true,
    )
    .await;
    assert_eq!(code, Some(0), "{text}");
    let engaged: Vec<(String, bool)> =
        sqlx::query_as("SELECT key, engaged FROM deprov.kill_switch_scopes ORDER BY key")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(engaged, [("7".to_owned(), true)]);

    // Without the configuration nothing can be checked: written as typed, and said so.
    let (code, text) = kill_switch_cli(
        &app,
        &["on", "--scope", "tenant", "--key", "007", "--reason", "x"],
        false,
    )
    .await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("written as typed, not checked"), "{text}");

    // Released by another spelling: every spelling of the tenant's key is released.
    let (code, text) = kill_switch_cli(
        &app,
        &["off", "--scope", "tenant", "--key", "+7", "--reason", "x"],
        true,
    )
    .await;
    assert_eq!(code, Some(0), "{text}");
    let still: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deprov.kill_switch_scopes WHERE engaged")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(still, 0);
}
