//! Tenant keys in the form the key column reads them (`deprov::ids::KeyForm`): with an integer or
//! `uuid` `[tenant] key_column`, intake refuses a key the type cannot read (422, nothing stored)
//! and stores every key as PostgreSQL prints it, so `"07"` and `"7"` are one request, one job and
//! one tenant kill switch. The forms are checked against PostgreSQL's own casts.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{
    OPERATOR_TOKEN, TestApp, TestOptions, VERCEL_TOKEN, accepted, assert_problem, spawn_app_with,
};
use deprov::ids::{KeyForm, TenantId};

async fn app_keyed_by(key_type: &'static str) -> TestApp {
    spawn_app_with(TestOptions {
        key_type,
        ..TestOptions::default()
    })
    .await
}

#[tokio::test]
async fn integer_keys_are_refused_or_stored_as_postgresql_prints_them() {
    let app = app_keyed_by("bigint").await;
    for bad in ["acct_1", "1.5", "9223372036854775808", "0x10"] {
        let r = app.post_deletion(&json!({"tenant_id": bad})).await;
        let body = assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("tenant_id: ") && detail.contains("bigint"),
            "{bad:?}: {body}"
        );
    }
    app.assert_nothing_stored().await;
    // A reinstall of a key the column cannot read is refused alike, and records nothing.
    for bad in ["abc", "99999999999999999999", "1e3"] {
        let r = app
            .post_reinstallation(crate::helpers::SOURCE_TOKEN, bad)
            .await;
        let body = assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
        assert!(
            body["detail"].as_str().unwrap().contains("bigint"),
            "{bad:?}: {body}"
        );
    }
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM deprov.audit_log")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(audited, 0, "no reinstall recorded");

    let first = accepted(app.post_deletion(&json!({"tenant_id": "007"})).await).await;
    assert_eq!(first["tenant_id"], "7", "{first}");
    assert_eq!(first["duplicate"], false, "{first}");
    // Keyed by the tenant (no external_id): the same request, whatever the spelling.
    for spelling in ["7", "+7", " 7 "] {
        let again = accepted(app.post_deletion(&json!({"tenant_id": spelling})).await).await;
        assert_eq!(
            (
                &again["request_id"],
                &again["duplicate"],
                &again["tenant_id"]
            ),
            (&first["request_id"], &json!(true), &json!("7")),
            "{spelling:?}: {again}"
        );
    }
    // Another request for the same tenant joins its job.
    let other = accepted(
        app.post_deletion(&json!({"tenant_id": "07", "external_id": "evt_2"}))
            .await,
    )
    .await;
    assert_eq!(other["job_id"], first["job_id"], "{other}");
    assert_eq!((app.count_requests().await, app.count_jobs().await), (2, 1));
    let subject: String = sqlx::query_scalar("SELECT tenant_id FROM deprov.jobs")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(subject, "7");
    // Vercel's installation ID as the tenant key: never refused, stored in the same form.
    let r = app
        .delete_installation("0007", VERCEL_TOKEN, None, None)
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = app
        .delete_installation("icfg_1", VERCEL_TOKEN, None, None)
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let subjects: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT subject FROM deprov.jobs ORDER BY subject")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(subjects, ["7", "icfg_1"]);
}

#[tokio::test]
async fn a_tenant_kill_switch_holds_the_tenant_however_its_key_is_written() {
    let app = app_keyed_by("integer").await;
    let r = app
        .client
        .put(app.url("/v1/kill-switch"))
        .bearer_auth(OPERATOR_TOKEN)
        .json(&json!({"engaged": true, "reason": "incident", "scope": "tenant", "key": "07001"}))
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["key"], "7001", "{body}");
    let held = accepted(app.post_deletion(&json!({"tenant_id": "7001"})).await).await;
    assert_eq!(held["state"], "held", "{held}");
    let free = accepted(app.post_deletion(&json!({"tenant_id": "7002"})).await).await;
    assert_eq!(free["state"], "queued", "{free}");

    // A switch engaged from the CLI, which stores the key as typed, is released by the API's
    // release of the tenant.
    let mut tx = app.db.begin().await.unwrap();
    deprov::queue::kill_switch::set_scope(
        &mut tx,
        &deprov::queue::kill_switch::Scope::Tenant("007002".into()),
        true,
        "from the CLI",
        "cli:test",
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let r = app
        .client
        .put(app.url("/v1/kill-switch"))
        .bearer_auth(OPERATOR_TOKEN)
        .json(&json!({"engaged": false, "reason": "over", "scope": "tenant", "key": "7002"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let engaged: Vec<String> = sqlx::query_scalar(
        "SELECT key FROM deprov.kill_switch_scopes WHERE scope = 'tenant' AND engaged ORDER BY key",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(engaged, ["7001"], "the CLI's 007002 was released with 7002");
}

#[tokio::test]
async fn uuid_keys_are_stored_lower_case_and_hyphenated() {
    let app = app_keyed_by("uuid").await;
    let r = app.post_deletion(&json!({"tenant_id": "7"})).await;
    assert_problem(r, StatusCode::UNPROCESSABLE_ENTITY).await;
    app.assert_nothing_stored().await;
    let a = accepted(
        app.post_deletion(&json!({"tenant_id": "A0EEBC999C0B4EF8BB6D6BB9BD380A11"}))
            .await,
    )
    .await;
    assert_eq!(a["tenant_id"], "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
    let b = accepted(
        app.post_deletion(&json!({"tenant_id": "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"}))
            .await,
    )
    .await;
    assert_eq!(
        (&b["request_id"], &b["duplicate"]),
        (&a["request_id"], &json!(true))
    );
}

/// A text key column keeps keys as sent: `"07"` and `"7"` are two tenants.
#[tokio::test]
async fn text_keys_are_stored_as_sent() {
    let app = app_keyed_by("text").await;
    let a = accepted(app.post_deletion(&json!({"tenant_id": "07"})).await).await;
    let b = accepted(app.post_deletion(&json!({"tenant_id": "7"})).await).await;
    assert_eq!(a["tenant_id"], "07");
    assert_ne!(a["job_id"], b["job_id"]);
}

/// What intake accepts, PostgreSQL's cast accepts and prints the same way; what the cast refuses,
/// intake refuses. (Intake may refuse more: the forms PostgreSQL 16 added, odd uuid hyphenation.)
#[tokio::test]
async fn key_forms_agree_with_postgresql_casts() {
    let app = app_keyed_by("text").await;
    let inputs = [
        "0",
        "7",
        "07",
        "+7",
        "-7",
        " 7",
        "7 ",
        "  -0012  ",
        "- 7",
        "+-7",
        "1.0",
        "1e3",
        "0x1F",
        "1_000",
        "abc",
        "32767",
        "32768",
        "-32768",
        "-32769",
        "2147483647",
        "2147483648",
        "-2147483649",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
        "a0eebc999c0b4ef8bb6d6bb9bd380a11",
        "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
        "{a0eebc999c0b4ef8bb6d6bb9bd380a11}",
        "urn:uuid:a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11",
        " a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
    ];
    let mut compared = 0;
    for sql_type in ["smallint", "integer", "bigint", "uuid"] {
        let form = KeyForm::of(sql_type);
        for raw in inputs {
            let ours = form
                .canonical(&TenantId::parse(raw).unwrap())
                .map(|k| k.as_str().to_owned());
            let mut tx = app.db.begin().await.unwrap();
            let theirs: Result<String, _> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT $1::{sql_type}::text")))
                    .bind(raw)
                    .fetch_one(&mut *tx)
                    .await;
            tx.rollback().await.ok();
            match (&ours, &theirs) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{raw:?} as {sql_type}"),
                (Ok(a), Err(e)) => {
                    panic!("{raw:?} as {sql_type}: intake stores {a:?}, PostgreSQL refuses it: {e}")
                }
                (Err(_), _) => {}
            }
            if theirs.is_err() {
                assert!(
                    ours.is_err(),
                    "{raw:?} as {sql_type}: PostgreSQL refuses it"
                );
            }
            compared += 1;
        }
    }
    assert_eq!(compared, 4 * inputs.len());
}
