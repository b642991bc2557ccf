//! `POST /v1/deletion-requests`: shape, deduplication, concurrency, Idempotency-Key, authentication.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{SOURCE_TOKEN, VERCEL_TOKEN, accepted, assert_problem, deletion, spawn_app};

#[tokio::test]
async fn accepted_request_has_the_documented_shape_and_is_stored() {
    let app = spawn_app().await;
    let body = accepted(
        app.post_deletion(&json!({"tenant_id": "acct_1", "reason": "churned"}))
            .await,
    )
    .await;
    assert_eq!(body["tenant_id"], "acct_1");
    assert_eq!(body["state"], "queued");
    assert_eq!(body["duplicate"], false);
    let request_id: uuid::Uuid = body["request_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        request_id,
        deprov::ids::request_id("billing", deprov::ids::DedupBasis::TenantId, "acct_1")
    );
    let (job_id, source, basis, reason): (uuid::Uuid, String, String, Option<String>) =
        sqlx::query_as("SELECT job_id, source, dedup_basis, reason FROM deprov.deletion_requests WHERE id = $1")
            .bind(request_id)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(job_id.to_string(), body["job_id"].as_str().unwrap());
    assert_eq!(
        (source.as_str(), basis.as_str(), reason.as_deref()),
        ("billing", "tenant_id", Some("churned"))
    );
    assert_eq!(
        app.job_state(body["job_id"].as_str().unwrap()).await,
        "queued"
    );
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

#[tokio::test]
async fn the_same_request_again_returns_the_same_ids_as_a_duplicate() {
    let app = spawn_app().await;
    let request = json!({"tenant_id": "acct_1", "external_id": "ticket-9"});
    let first = accepted(app.post_deletion(&request).await).await;
    let second = accepted(app.post_deletion(&request).await).await;
    assert_eq!(first["request_id"], second["request_id"]);
    assert_eq!(first["job_id"], second["job_id"]);
    assert_eq!(
        (first["duplicate"].as_bool(), second["duplicate"].as_bool()),
        (Some(false), Some(true))
    );
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
    let duplicates: i32 = sqlx::query_scalar("SELECT duplicates FROM deprov.deletion_requests")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(duplicates, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_identical_requests_create_one_job_and_one_request() {
    let app = spawn_app().await;
    let request = deletion("acct_concurrent");
    let answers = futures::future::join_all((0..50).map(|_| app.post_deletion(&request))).await;
    let mut bodies = Vec::new();
    for answer in answers {
        bodies.push(accepted(answer).await);
    }
    for body in &bodies {
        assert_eq!(body["request_id"], bodies[0]["request_id"]);
        assert_eq!(body["job_id"], bodies[0]["job_id"]);
    }
    assert_eq!(
        bodies.iter().filter(|b| b["duplicate"] == false).count(),
        1,
        "exactly one answer is the original"
    );
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
    let duplicates: i32 = sqlx::query_scalar("SELECT duplicates FROM deprov.deletion_requests")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(duplicates, 49);
}

#[tokio::test]
async fn a_different_request_for_the_same_tenant_attaches_to_the_active_job() {
    let app = spawn_app().await;
    let a = accepted(
        app.post_deletion(&json!({"tenant_id": "acct_1", "external_id": "a"}))
            .await,
    )
    .await;
    let b = accepted(
        app.post_deletion(&json!({"tenant_id": "acct_1", "external_id": "b"}))
            .await,
    )
    .await;
    let other = accepted(app.post_deletion(&deletion("acct_2")).await).await;
    assert_ne!(a["request_id"], b["request_id"]);
    assert_eq!(a["job_id"], b["job_id"]);
    assert_eq!(b["duplicate"], false);
    assert_ne!(other["job_id"], a["job_id"]);
    assert_eq!((app.count_jobs().await, app.count_requests().await), (2, 3));
}

#[tokio::test]
async fn idempotency_key_reused_with_a_different_body_is_422_and_nothing_more_is_stored() {
    let app = spawn_app().await;
    let first = accepted(
        app.post_deletion_with(Some(SOURCE_TOKEN), Some("key-1"), &deletion("acct_1"))
            .await,
    )
    .await;
    let again = accepted(
        app.post_deletion_with(Some(SOURCE_TOKEN), Some("key-1"), &deletion("acct_1"))
            .await,
    )
    .await;
    assert_eq!(
        (again["duplicate"].as_bool(), &again["request_id"]),
        (Some(true), &first["request_id"])
    );
    let response = app
        .post_deletion_with(Some(SOURCE_TOKEN), Some("key-1"), &deletion("acct_2"))
        .await;
    let problem = assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY).await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key"),
        "{problem}"
    );
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
    let basis: String = sqlx::query_scalar("SELECT dedup_basis FROM deprov.deletion_requests")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(basis, "idempotency_key");
}

#[tokio::test]
async fn external_id_reused_with_a_different_body_is_422() {
    let app = spawn_app().await;
    accepted(
        app.post_deletion(&json!({"tenant_id": "acct_1", "external_id": "x"}))
            .await,
    )
    .await;
    let response = app
        .post_deletion(&json!({"tenant_id": "acct_1", "external_id": "x", "reason": "changed"}))
        .await;
    assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY).await;
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

#[tokio::test]
async fn missing_or_unknown_tokens_are_401_and_nothing_is_stored() {
    let app = spawn_app().await;
    for token in [None, Some("not-a-configured-token-at-all"), Some("")] {
        let response = app
            .post_deletion_with(token, None, &deletion("acct_1"))
            .await;
        assert_eq!(
            response.headers().get("www-authenticate").unwrap(),
            "Bearer"
        );
        assert_problem(response, StatusCode::UNAUTHORIZED).await;
    }
    let basic = app
        .client
        .post(app.url("/v1/deletion-requests"))
        .basic_auth("billing", Some(SOURCE_TOKEN));
    assert_problem(
        basic.json(&deletion("acct_1")).send().await.unwrap(),
        StatusCode::UNAUTHORIZED,
    )
    .await;
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn the_token_names_the_source_and_a_conflicting_source_field_is_403() {
    let app = spawn_app().await;
    let body = json!({"tenant_id": "acct_1", "source": "billing"});
    let response = app
        .post_deletion_with(Some(VERCEL_TOKEN), None, &body)
        .await;
    assert_problem(response, StatusCode::FORBIDDEN).await;
    app.assert_nothing_stored().await;
    accepted(app.post_deletion(&body).await).await;
    let source: String = sqlx::query_scalar("SELECT source FROM deprov.deletion_requests")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(source, "billing");
}

#[tokio::test]
async fn invalid_field_values_are_422_and_nothing_is_stored() {
    let app = spawn_app().await;
    let cases = [
        json!({"tenant_id": ""}),
        json!({"tenant_id": "a\u{0}b"}),
        json!({"tenant_id": "x".repeat(257)}),
        json!({"tenant_id": "acct_1", "external_id": ""}),
        json!({"tenant_id": "acct_1", "external_id": "e".repeat(256)}),
        json!({"tenant_id": "acct_1", "reason": "r".repeat(1001)}),
        json!({"tenant_id": 42}),
        json!({"external_id": "no tenant"}),
    ];
    for body in cases {
        let problem = assert_problem(
            app.post_deletion(&body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
        assert!(!problem["detail"].as_str().unwrap().is_empty());
    }
    let long = "k".repeat(256);
    for key in ["", "caf\u{e9}", long.as_str()] {
        let req = app
            .client
            .post(app.url("/v1/deletion-requests"))
            .bearer_auth(SOURCE_TOKEN)
            .json(&deletion("acct_1"));
        let response = req
            .header("Idempotency-Key", key.as_bytes())
            .send()
            .await
            .unwrap();
        assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY).await;
    }
    app.assert_nothing_stored().await;
}

/// What `docs/api.md` says goes into a request's fingerprint, which tells a retry (a duplicate) from
/// another request under the same `external_id` or `Idempotency-Key` (422): `tenant_id`,
/// `external_id` and `reason` — an absent `reason` and `null` alike, `""` another one — and
/// neither `source` nor the `Idempotency-Key` value. Without either key the request ID is the
/// tenant's and nothing is compared: another reason is a duplicate, the first reason kept.
#[tokio::test]
async fn the_fingerprint_is_the_tenant_external_id_and_reason() {
    let app = spawn_app().await;
    let with_key = |key: &'static str, body: serde_json::Value| {
        let app = &app;
        async move {
            app.post_deletion_with(Some(SOURCE_TOKEN), Some(key), &body)
                .await
        }
    };
    // Under one Idempotency-Key: the same body with `source` is a retry; another reason, or none,
    // is not.
    let first =
        accepted(with_key("key-1", json!({"tenant_id": "1", "reason": "churned"})).await).await;
    let again = accepted(
        with_key(
            "key-1",
            json!({"tenant_id": "1", "reason": "churned", "source": "billing"}),
        )
        .await,
    )
    .await;
    assert_eq!(
        (&again["request_id"], &again["duplicate"]),
        (&first["request_id"], &json!(true))
    );
    for other in [
        json!({"tenant_id": "1", "reason": "closed"}),
        json!({"tenant_id": "1"}),
        json!({"tenant_id": "2", "reason": "churned"}),
    ] {
        let problem = assert_problem(
            with_key("key-1", other.clone()).await,
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("Idempotency-Key"),
            "{other}: {problem}"
        );
    }
    // Under one external_id: another Idempotency-Key and `"reason": null` are the same request,
    // `"reason": ""` is another.
    let first = accepted(
        app.post_deletion(&json!({"tenant_id": "3", "external_id": "evt_1"}))
            .await,
    )
    .await;
    for same in [
        with_key("key-2", json!({"tenant_id": "3", "external_id": "evt_1"})).await,
        app.post_deletion(&json!({"tenant_id": "3", "external_id": "evt_1", "reason": null}))
            .await,
    ] {
        let same = accepted(same).await;
        assert_eq!(
            (&same["request_id"], &same["duplicate"]),
            (&first["request_id"], &json!(true))
        );
    }
    assert_problem(
        app.post_deletion(&json!({"tenant_id": "3", "external_id": "evt_1", "reason": ""}))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    // Neither key: the tenant is the key, and another reason is a duplicate.
    let first = accepted(
        app.post_deletion(&json!({"tenant_id": "4", "reason": "first"}))
            .await,
    )
    .await;
    let again = accepted(
        app.post_deletion(&json!({"tenant_id": "4", "reason": "second"}))
            .await,
    )
    .await;
    assert_eq!(
        (&again["request_id"], &again["duplicate"]),
        (&first["request_id"], &json!(true))
    );
    let reason: Option<String> =
        sqlx::query_scalar("SELECT reason FROM deprov.deletion_requests WHERE id = $1::uuid")
            .bind(first["request_id"].as_str().unwrap())
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(reason.as_deref(), Some("first"));
    assert_eq!(app.count_requests().await, 3);
}
