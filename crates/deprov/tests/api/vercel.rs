//! `DELETE /v1/installations/{installationId}`: the Vercel Marketplace partner API shape.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    SOURCE_TOKEN, TestOptions, VERCEL_TOKEN, VercelMode, assert_problem, spawn_app, spawn_app_with,
};

const INSTALLATION: &str = "icfg_9bceb8ccT32d3U417ezb5c8p";

fn fixture_body() -> Value {
    serde_json::from_str(include_str!("fixtures/vercel_delete-installation.json")).unwrap()
}

async fn finalized(response: reqwest::Response) -> bool {
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    body["finalized"]
        .as_bool()
        .unwrap_or_else(|| panic!("no finalized: {body}"))
}

#[tokio::test]
async fn the_fixture_is_recorded_and_twenty_retries_collapse_into_one_job() {
    let app = spawn_app().await;
    let body = fixture_body();
    assert!(
        !finalized(
            app.delete_installation(INSTALLATION, VERCEL_TOKEN, Some(&body), Some("retry-0"))
                .await
        )
        .await
    );
    for i in 1..=20 {
        let key = format!("retry-{i}");
        assert!(
            !finalized(
                app.delete_installation(INSTALLATION, VERCEL_TOKEN, Some(&body), Some(&key))
                    .await
            )
            .await
        );
    }
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
    let (kind, subject, tenant, state): (String, String, Option<String>, String) =
        sqlx::query_as("SELECT subject_kind, subject, tenant_id, state FROM deprov.jobs")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (
            kind.as_str(),
            subject.as_str(),
            tenant.as_deref(),
            state.as_str()
        ),
        ("tenant", INSTALLATION, Some(INSTALLATION), "queued")
    );
    let (source, basis, duplicates): (String, String, i32) =
        sqlx::query_as("SELECT source, dedup_basis, duplicates FROM deprov.deletion_requests")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (source.as_str(), basis.as_str(), duplicates),
        ("vercel", "installation_id", 20)
    );
}

#[tokio::test]
async fn with_a_tenant_lookup_the_installation_is_recorded_for_the_worker_to_resolve() {
    let app = spawn_app_with(TestOptions {
        vercel: VercelMode::Lookup,
        ..Default::default()
    })
    .await;
    assert!(
        !finalized(
            app.delete_installation(INSTALLATION, VERCEL_TOKEN, None, None)
                .await
        )
        .await
    );
    let (kind, tenant, step): (String, Option<String>, String) =
        sqlx::query_as("SELECT subject_kind, tenant_id, step FROM deprov.jobs")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (kind.as_str(), tenant, step.as_str()),
        ("vercel_installation", None, "resolve")
    );
}

#[tokio::test]
async fn finalized_is_true_once_the_job_has_completed() {
    let app = spawn_app().await;
    let body = json!({"cascadeResourceDeletion": false, "reason": "uninstalled"});
    assert!(
        !finalized(
            app.delete_installation(INSTALLATION, VERCEL_TOKEN, Some(&body), None)
                .await
        )
        .await
    );
    sqlx::query("UPDATE deprov.jobs SET state = 'completed', step = 'done', finished_at = now()")
        .execute(&app.db)
        .await
        .unwrap();
    assert!(
        finalized(
            app.delete_installation(INSTALLATION, VERCEL_TOKEN, Some(&body), None)
                .await
        )
        .await
    );
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

#[tokio::test]
async fn wrong_credentials_are_401_and_nothing_is_stored() {
    let app = spawn_app().await;
    for token in [SOURCE_TOKEN, "vercel-token-0123456789abd"] {
        assert_problem(
            app.delete_installation(INSTALLATION, token, None, None)
                .await,
            StatusCode::UNAUTHORIZED,
        )
        .await;
    }
    let no_auth = app
        .client
        .delete(app.url(&format!("/v1/installations/{INSTALLATION}")))
        .send()
        .await
        .unwrap();
    assert_problem(no_auth, StatusCode::UNAUTHORIZED).await;
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn bad_bodies_are_problems_and_nothing_is_stored() {
    let app = spawn_app().await;
    let send = |content_type: &'static str, body: &'static str| {
        let req = app
            .client
            .delete(app.url(&format!("/v1/installations/{INSTALLATION}")))
            .bearer_auth(VERCEL_TOKEN);
        req.header("Content-Type", content_type).body(body).send()
    };
    assert_problem(
        send("application/json", "{").await.unwrap(),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_problem(
        send("application/json", "{\"cascadeResourceDeletion\": \"yes\"}")
            .await
            .unwrap(),
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_problem(
        send("text/plain", "{}").await.unwrap(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
    )
    .await;
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn without_a_vercel_section_the_route_is_404() {
    let app = spawn_app_with(TestOptions {
        vercel: VercelMode::Off,
        ..Default::default()
    })
    .await;
    let response = app
        .delete_installation(INSTALLATION, VERCEL_TOKEN, Some(&fixture_body()), None)
        .await;
    assert_problem(response, StatusCode::NOT_FOUND).await;
    app.assert_nothing_stored().await;
}
