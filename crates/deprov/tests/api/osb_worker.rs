//! Open Service Broker deprovisioning through to the worker: retries collapse into one request and
//! one job, `last_operation` follows the job (`in progress`, `succeeded`, `failed`, 410 for an
//! instance whose tenant was not found), and a DELETE after completion starts no second job.

use deprov::sources::basic::header_value;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::OPERATOR_TOKEN;
use crate::osb::{OLD_PASSWORD, QUERY, USER, spawn_broker};

async fn json_of(response: reqwest::Response, status: StatusCode) -> Value {
    let got = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    body
}

#[tokio::test]
async fn twenty_retries_are_one_job_polled_until_succeeded_and_a_later_delete_is_200() {
    let broker = spawn_broker(false).await;
    let app = &broker.app;
    sqlx::query("INSERT INTO app.accounts (id) VALUES ('acct_1'), ('acct_2')")
        .execute(&app.db)
        .await
        .unwrap();
    let first = json_of(broker.deprovision("acct_1").await, StatusCode::ACCEPTED).await;
    let operation = first["operation"].as_str().unwrap().to_owned();
    for i in 0..20 {
        // Rotation: the previous password is accepted too.
        let auth = if i % 2 == 0 {
            header_value(USER, OLD_PASSWORD)
        } else {
            crate::osb::auth()
        };
        let again = json_of(
            broker
                .delete("acct_1", QUERY, Some(&auth), Some("2.14"))
                .await,
            StatusCode::ACCEPTED,
        )
        .await;
        assert_eq!(again["operation"], operation.as_str(), "retry {i}");
    }
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
    let (source, basis, subject, duplicates, job): (String, String, String, i32, uuid::Uuid) =
        sqlx::query_as(
            "SELECT source, dedup_basis, subject, duplicates, job_id FROM deprov.deletion_requests",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        (
            source.as_str(),
            basis.as_str(),
            subject.as_str(),
            duplicates
        ),
        ("platform", "installation_id", "acct_1", 20)
    );
    assert_eq!(job.to_string(), operation, "operation is the job ID");
    let reason: String = sqlx::query_scalar("SELECT reason FROM deprov.deletion_requests")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        reason,
        "Open Service Broker deprovision (service_id svc-1, plan_id plan-1)"
    );

    let polled = broker.last_operation("acct_1").await;
    assert_eq!(polled.headers()["retry-after"], "5");
    let polled = json_of(polled, StatusCode::OK).await;
    assert_eq!(polled["state"], "in progress", "{polled}");

    broker.drain().await;
    assert_eq!(app.job_state(&operation).await, "completed");
    let polled = broker.last_operation("acct_1").await;
    assert!(polled.headers().get("retry-after").is_none());
    let polled = json_of(polled, StatusCode::OK).await;
    assert_eq!(polled["state"], "succeeded", "{polled}");
    assert!(
        polled["description"]
            .as_str()
            .is_some_and(|d| !d.is_empty())
    );
    let left: Vec<String> = sqlx::query_scalar("SELECT id FROM app.accounts ORDER BY id")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(left, ["acct_2"], "only the instance's tenant is deleted");

    let after = json_of(broker.deprovision("acct_1").await, StatusCode::OK).await;
    assert_eq!(after, json!({}));
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

#[tokio::test]
async fn an_instance_the_lookup_does_not_find_is_410_and_stays_one_job() {
    let broker = spawn_broker(true).await;
    let app = &broker.app;
    let first = json_of(
        broker.deprovision("inst-unknown").await,
        StatusCode::ACCEPTED,
    )
    .await;
    let operation = first["operation"].as_str().unwrap().to_owned();
    let (kind, subject): (String, String) =
        sqlx::query_as("SELECT subject_kind, subject FROM deprov.jobs")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (kind.as_str(), subject.as_str()),
        ("lookup", "platform:inst-unknown")
    );
    broker.drain().await;
    assert_eq!(app.job_state(&operation).await, "completed");
    let polled = json_of(
        broker.last_operation("inst-unknown").await,
        StatusCode::GONE,
    )
    .await;
    assert_eq!(polled, json!({}));
    let again = json_of(broker.deprovision("inst-unknown").await, StatusCode::GONE).await;
    assert_eq!(again, json!({}));
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

#[tokio::test]
async fn an_instance_the_lookup_finds_is_deleted_and_succeeds() {
    let broker = spawn_broker(true).await;
    let app = &broker.app;
    sqlx::query(
        "INSERT INTO app.accounts (id, installation_id) VALUES ('acct_9', 'inst-9'), ('acct_8', 'inst-8')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    json_of(broker.deprovision("inst-9").await, StatusCode::ACCEPTED).await;
    broker.drain().await;
    let polled = json_of(broker.last_operation("inst-9").await, StatusCode::OK).await;
    assert_eq!(polled["state"], "succeeded", "{polled}");
    let left: Vec<String> = sqlx::query_scalar("SELECT id FROM app.accounts ORDER BY id")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(left, ["acct_8"]);
    json_of(broker.deprovision("inst-9").await, StatusCode::OK).await;
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

/// A direct tenant key with no row: the job completes deleting nothing, so the instance is gone.
#[tokio::test]
async fn a_tenant_key_with_no_row_is_410_once_the_job_completed() {
    let broker = spawn_broker(false).await;
    json_of(
        broker.deprovision("acct_absent").await,
        StatusCode::ACCEPTED,
    )
    .await;
    broker.drain().await;
    json_of(broker.last_operation("acct_absent").await, StatusCode::GONE).await;
    json_of(broker.deprovision("acct_absent").await, StatusCode::GONE).await;
    assert_eq!(
        (
            broker.app.count_jobs().await,
            broker.app.count_requests().await
        ),
        (1, 1)
    );
}

/// A failed job (as a worker or an operator leaves it) is `failed` to the platform; a re-sent DELETE
/// answers 202 with the same operation and starts no second job.
#[tokio::test]
async fn a_failed_job_is_reported_failed_and_a_resent_delete_starts_no_second_job() {
    let broker = spawn_broker(false).await;
    let app = &broker.app;
    let first = json_of(broker.deprovision("acct_3").await, StatusCode::ACCEPTED).await;
    sqlx::query(
        "UPDATE deprov.jobs SET state = 'failed', finished_at = now(), last_error = 'refused'",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let polled = json_of(broker.last_operation("acct_3").await, StatusCode::OK).await;
    assert_eq!(
        (polled["state"].clone(), polled["instance_usable"].clone()),
        (json!("failed"), json!(true)),
        "{polled}"
    );
    let again = json_of(broker.deprovision("acct_3").await, StatusCode::ACCEPTED).await;
    assert_eq!(again["operation"], first["operation"]);
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

/// The job is an ordinary job of source `platform`: a kill switch on that source holds it (the
/// platform sees `in progress`), the jobs API and the reconcile listing show it under the
/// `operation` ID, and releasing the switch lets it complete.
#[tokio::test]
async fn a_kill_switch_on_the_source_holds_the_job_and_the_operator_routes_see_it() {
    let broker = spawn_broker(false).await;
    let app = &broker.app;
    sqlx::query("INSERT INTO app.accounts (id) VALUES ('acct_5')")
        .execute(&app.db)
        .await
        .unwrap();
    let switch = |engaged: bool| {
        app.client
            .put(app.url("/v1/kill-switch"))
            .bearer_auth(OPERATOR_TOKEN)
            .json(&json!({"engaged": engaged, "reason": "incident", "scope": "source", "key": "platform"}))
            .send()
    };
    assert_eq!(switch(true).await.unwrap().status(), StatusCode::OK);
    let first = json_of(broker.deprovision("acct_5").await, StatusCode::ACCEPTED).await;
    let operation = first["operation"].as_str().unwrap().to_owned();
    assert_eq!(app.job_state(&operation).await, "held");
    let polled = json_of(broker.last_operation("acct_5").await, StatusCode::OK).await;
    assert_eq!(polled["state"], "in progress");
    assert!(
        polled["description"]
            .as_str()
            .is_some_and(|d| d.contains("kill switch")),
        "{polled}"
    );
    let job: Value = app.get_job(&operation).await.json().await.unwrap();
    assert_eq!(
        (job["state"].clone(), job["tenant_id"].clone()),
        (json!("held"), json!("acct_5"))
    );
    let listing: Value = app
        .operator_get("/v1/reconcile?state=held&source=platform")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        listing["held"][0]["job_id"],
        operation.as_str(),
        "{listing}"
    );

    assert_eq!(switch(false).await.unwrap().status(), StatusCode::OK);
    broker.drain().await;
    let polled = json_of(broker.last_operation("acct_5").await, StatusCode::OK).await;
    assert_eq!(polled["state"], "succeeded", "{polled}");
}

/// `deprov jobs show` prints the note of a job that completed finding no tenant, and `deprov jobs
/// list` shows it in its last column.
#[tokio::test]
async fn the_cli_shows_why_a_completed_job_deleted_nothing() {
    let broker = spawn_broker(true).await;
    let app = &broker.app;
    let first = json_of(
        broker.deprovision("inst-unknown").await,
        StatusCode::ACCEPTED,
    )
    .await;
    let operation = first["operation"].as_str().unwrap().to_owned();
    broker.drain().await;
    assert_eq!(app.job_state(&operation).await, "completed");

    let (code, text) =
        crate::sqlcheck::run_with_env_to_exit(&app.db_url, &["jobs", "show", &operation], "", &[])
            .await;
    assert_eq!(code, Some(0), "{text}");
    let note = text
        .lines()
        .find(|l| l.starts_with("note:"))
        .unwrap_or_else(|| panic!("no note line in:\n{text}"));
    assert!(
        note.contains("no tenant found for") && note.ends_with("nothing to delete"),
        "{note}"
    );
    assert!(text.contains("rows:        0"), "{text}");

    let (code, text) =
        crate::sqlcheck::run_with_env_to_exit(&app.db_url, &["jobs", "list"], "", &[]).await;
    assert_eq!(code, Some(0), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with(&operation))
        .unwrap_or_else(|| panic!("no row for {operation} in:\n{text}"));
    assert!(row.contains("note: no tenant found for"), "{row}");
}
