//! Reconcile, undo and reinstalls over HTTP: the listing, a paced release, undo in the grace
//! period and its 409 once the hard delete started, the source route and a webhook `restore_events`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    OPERATOR_TOKEN, SOURCE_TOKEN, TestApp, TestOptions, accepted, assert_problem, spawn_app_with,
};

const SHOP_TOKEN: &str = "shop-token-0123456789abcdef";
/// The application's install flow: its reinstalls reach any source's deletion.
const INSTALL_TOKEN: &str = "install-flow-token-0123456789";

async fn app() -> TestApp {
    let app = spawn_app_with(TestOptions {
        key_type: "bigint",
        worker: true,
        extra_config: format!(
            "[sources.shop]\ntoken = \"{SHOP_TOKEN}\"\ntenant = {{ pointer = \"/tenant\" }}\n\
             event = {{ pointer = \"/type\" }}\ndedup = {{ pointer = \"/id\" }}\n\
             delete_events = [\"app.uninstalled\"]\nrestore_events = [\"app.installed\"]\n\
             [sources.install]\ntoken = \"{INSTALL_TOKEN}\"\nreinstalls = \"any\"\n\
             [soft_delete]\n\
             statements = [\"UPDATE app.accounts SET deleted_at = now() WHERE id = $1\"]\n\
             undo_statements = [\"UPDATE app.accounts SET deleted_at = NULL WHERE id = $1\"]\n\
             orphans = \"SELECT id FROM app.accounts WHERE deleted_at IS NOT NULL\"\n\
             [hard_delete]\ngrace_period = \"1h\"\n[reconcile]\nrelease_rate = 4.0\n\
             [worker]\npoll_interval = \"20ms\"\n"
        ),
        // Before start: deprov refuses statements naming a column the target does not have.
        target_setup: "ALTER TABLE app.accounts ADD COLUMN deleted_at timestamptz".into(),
        ..Default::default()
    })
    .await;
    sqlx::raw_sql("INSERT INTO app.accounts (id) SELECT generate_series(1, 6)")
        .execute(&app.db)
        .await
        .unwrap();
    app
}

async fn deleted(app: &TestApp, id: i64) -> bool {
    sqlx::query_scalar("SELECT deleted_at IS NOT NULL FROM app.accounts WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Requests deletion of `tenant` and waits (polling) until its job waits in its grace period.
async fn in_grace(app: &TestApp, tenant: &str) -> String {
    let body = accepted(app.post_deletion(&json!({"tenant_id": tenant})).await).await;
    let job = body["job_id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let view: Value = app.get_job(&job).await.json().await.unwrap();
        if view["progress"]["grace_until"].is_string() && view["state"] == "queued" {
            return job;
        }
        assert!(tokio::time::Instant::now() < deadline, "{view}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn operator_post(app: &TestApp, path: &str, body: &Value) -> reqwest::Response {
    app.client
        .post(app.url(path))
        .bearer_auth(OPERATOR_TOKEN)
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn undo_over_http_restores_in_grace_and_is_a_409_problem_once_the_hard_delete_started() {
    let app = app().await;
    let job = in_grace(&app, "1").await;
    assert!(deleted(&app, 1).await);
    let listing: Value = app
        .operator_get("/v1/reconcile")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listing["in_grace"][0]["job_id"], job.as_str(), "{listing}");
    assert_eq!(listing["in_grace"].as_array().unwrap().len(), 1);
    assert_eq!(
        listing["orphans"],
        json!({"status": "found", "tenants": []}),
        "tenant 1 has its job"
    );

    let response = operator_post(
        &app,
        &format!("/v1/jobs/{job}/undo"),
        &json!({"reason": "came back"}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let undone: Value = response.json().await.unwrap();
    assert_eq!(
        (undone["restored"].clone(), undone["restored_rows"].clone()),
        (json!(true), json!(1))
    );
    assert!(!deleted(&app, 1).await, "tenant 1 restored");
    assert_eq!(app.job_state(&job).await, "cancelled");
    let actor: String = sqlx::query_scalar(
        "SELECT actor FROM deprov.audit_log WHERE action = 'job.undo' AND target = $1",
    )
    .bind(format!("job:{job}"))
    .fetch_one(&app.db)
    .await
    .unwrap();
    // The actor is the operator token's: here the bootstrap DEPROV_OPERATOR_TOKEN.
    assert_eq!(actor, "env:operator");

    // Tenant 2's hard delete has started (stamped as the worker does before its first batch).
    let job2 = in_grace(&app, "2").await;
    sqlx::query("UPDATE deprov.jobs SET hard_delete_started_at = now() WHERE id = $1::uuid")
        .bind(&job2)
        .execute(&app.db)
        .await
        .unwrap();
    let problem = assert_problem(
        operator_post(
            &app,
            &format!("/v1/jobs/{job2}/undo"),
            &json!({"reason": "x"}),
        )
        .await,
        StatusCode::CONFLICT,
    )
    .await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("nothing to undo"),
        "{problem}"
    );
    assert!(deleted(&app, 2).await, "nothing undone");
    assert_eq!(app.job_state(&job2).await, "queued");
    assert_problem(
        operator_post(
            &app,
            "/v1/jobs/0190f0b4-0000-7000-8000-000000000000/undo",
            &json!({"reason": "x"}),
        )
        .await,
        StatusCode::NOT_FOUND,
    )
    .await;
}

#[tokio::test]
async fn a_reinstall_by_route_or_restore_event_cancels_the_pending_deletion() {
    let app = app().await;
    let job3 = in_grace(&app, "3").await;
    let outcome = reinstall_as(&app, SOURCE_TOKEN, "3").await;
    assert_eq!(outcome["outcome"], "undone", "{outcome}");
    assert_eq!(outcome["job_id"], job3.as_str());
    assert!(!deleted(&app, 3).await);
    assert_eq!(app.job_state(&job3).await, "cancelled");

    // A webhook source: app.uninstalled deletes, app.installed is the reinstall. The tenant key is
    // written two ways the bigint key column reads as 4: both are stored as "4".
    let send = |event: &str, id: &str, tenant: &str| {
        app.client
            .post(app.url("/v1/webhooks/shop"))
            .bearer_auth(SHOP_TOKEN)
            .json(&json!({"type": event, "tenant": tenant, "id": id}))
            .send()
    };
    let recorded: Value = send("app.uninstalled", "d-1", "004")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(recorded["outcome"], "recorded", "{recorded}");
    let job4 = recorded["job_id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !deleted(&app, 4).await || app.job_state(&job4).await != "queued" {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let response = send("app.installed", "d-2", "+4").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["outcome"], "reinstall", "{answer}");
    assert_eq!(answer["reinstall"]["outcome"], "undone");
    assert_eq!(answer["reinstall"]["job_id"], job4.as_str());
    assert!(!deleted(&app, 4).await);
    assert_eq!(app.job_state(&job4).await, "cancelled");
    // Sent again: nothing pending.
    let again: Value = send("app.installed", "d-2", "4")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["reinstall"]["outcome"], "nothing_pending");
    let actors: Vec<String> = sqlx::query_scalar(
        "SELECT actor FROM deprov.audit_log WHERE action = 'job.reinstall' ORDER BY id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(actors, vec!["source:billing", "source:shop", "source:shop"]);
}

#[tokio::test]
async fn post_reconcile_is_a_dry_run_by_default_and_releases_orphans_paced() {
    let app = app().await;
    // Tenants 5 and 6 soft-deleted on the target without a job.
    sqlx::query("UPDATE app.accounts SET deleted_at = now() WHERE id IN (5, 6)")
        .execute(&app.db)
        .await
        .unwrap();
    let listing: Value = app
        .operator_get("/v1/reconcile")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        listing["orphans"],
        json!({"status": "found", "tenants": ["5", "6"]})
    );
    let body = json!({"actions": {"create_orphan_jobs": true}, "reason": "incident 9"});
    let dry: Value = operator_post(&app, "/v1/reconcile", &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(dry["applied"]["actions"].as_array().unwrap().len(), 2);
    assert_eq!(app.count_jobs().await, 0, "a dry run changes nothing");

    let mut apply = body.clone();
    apply["apply"] = json!(true);
    apply["rate"] = json!(0.25);
    let response = operator_post(&app, "/v1/reconcile", &apply).await;
    assert_eq!(response.status(), StatusCode::OK);
    let done: Value = response.json().await.unwrap();
    assert_eq!(done["dry_run"], false);
    assert_eq!(done["applied"]["rate"], 0.25);
    let at = |i: usize| {
        time::OffsetDateTime::parse(
            done["applied"]["actions"][i]["run_after"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    assert_eq!(
        at(1) - at(0),
        time::Duration::seconds(4),
        "0.25/s: 4 s apart"
    );
    assert_eq!(app.count_jobs().await, 2);
    let replay: Value = operator_post(&app, "/v1/reconcile", &apply)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(replay["applied"]["actions"], json!([]), "{replay}");
    assert_eq!(app.count_jobs().await, 2);

    assert_problem(
        operator_post(
            &app,
            "/v1/reconcile",
            &json!({"actions": {"cancel": true}, "reason": "x"}),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    let unauthorized = app
        .client
        .get(app.url("/v1/reconcile"))
        .send()
        .await
        .unwrap();
    assert_problem(unauthorized, StatusCode::UNAUTHORIZED).await;
}

/// `POST /v1/reinstallations` with `token` for `tenant`: the answer's body.
async fn reinstall_as(app: &TestApp, token: &str, tenant: &str) -> Value {
    let response = app.post_reinstallation(token, tenant).await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

#[tokio::test]
async fn a_source_reinstalls_only_its_own_requests_unless_it_may_reach_any() {
    let app = app().await;
    // billing (SOURCE_TOKEN) asked for tenant 5's deletion.
    let job5 = in_grace(&app, "5").await;
    let shop = reinstall_as(&app, SHOP_TOKEN, "5").await;
    assert_eq!(shop["outcome"], "nothing_pending", "{shop}");
    assert!(deleted(&app, 5).await, "shop never asked: nothing undone");
    // The install flow (`reinstalls = "any"`) sees the reinstall Vercel or GitHub cannot report.
    let install = reinstall_as(&app, INSTALL_TOKEN, "5").await;
    assert_eq!(
        (&install["outcome"], &install["job_id"]),
        (&json!("undone"), &json!(job5)),
        "{install}"
    );
    assert!(!deleted(&app, 5).await);
    assert_eq!(app.job_state(&job5).await, "cancelled");
}
