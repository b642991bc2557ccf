//! `atlassian-connect`: lifecycle hooks with an `Authorization: JWT` RS256 token whose public key is
//! served by `kid` (here from loopback, `allow_http_loopback`), bound to the request by `qsh` and to
//! the tenant by `iss` = the body's `clientKey`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deprov::sources::atlassian::qsh;
use deprov::sources::unix_now;
use jsonwebtoken::Algorithm;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, TestOptions, assert_problem, closed_port, spawn_app_with};
use crate::jwt::{jwt_file, sign};

const KID: &str = "connect-1";
const BASE_URL: &str = "https://app.example.com/addon";
const BASE_PATH: &str = "/deprov";
const CLIENT_KEY: &str = "a4ad5ff6-1ad6-3d6e-8a47-05a1f1a4cd11";
const PATH: &str = "/v1/webhooks/jira";

/// A key server serving `atlassian.pub.pem` for `connect-1` and 404 for any other `kid`, counting
/// requests; its URL template.
async fn key_server(hits: Arc<AtomicUsize>) -> String {
    let pem = std::fs::read_to_string(jwt_file("atlassian.pub.pem")).unwrap();
    let app = axum::Router::new().route(
        "/keys/{kid}",
        axum::routing::get(
            move |axum::extract::Path(kid): axum::extract::Path<String>| {
                let hits = hits.clone();
                let pem = pem.clone();
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    if kid == KID {
                        (StatusCode::OK, pem)
                    } else {
                        (StatusCode::NOT_FOUND, String::new())
                    }
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/keys/{{kid}}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn spawn_connect(key_url: &str) -> TestApp {
    spawn_app_with(TestOptions {
        extra_config: format!(
            r#"
[sources.jira]
scheme = "atlassian-connect"
audience = "{BASE_URL}"
key_url = "{key_url}"
allow_http_loopback = true
base_path = "{BASE_PATH}"
"#
        ),
        ..Default::default()
    })
    .await
}

/// Atlassian's claims for a hook to `PATH` (behind `BASE_PATH`) with `query`, valid 3 minutes.
fn claims(query: &str) -> Value {
    json!({
        "iss": CLIENT_KEY, "sub": "557058:f0e5a8b2", "aud": BASE_URL, "context": {},
        "iat": unix_now(), "exp": unix_now() + 180,
        "qsh": qsh("POST", BASE_PATH, PATH, query),
    })
}

fn token(claims: &Value) -> String {
    sign(Algorithm::RS256, "atlassian.pem", KID, claims)
}

fn body(event: &str) -> Vec<u8> {
    json!({
        "key": "com.example.deprov", "clientKey": CLIENT_KEY, "baseUrl": "https://acme.atlassian.net",
        "displayUrl": "https://acme.atlassian.net", "productType": "jira",
        "description": "Atlassian JIRA at https://acme.atlassian.net", "eventType": event,
    })
    .to_string()
    .into_bytes()
}

async fn post(app: &TestApp, query: &str, authorization: &str, body: &[u8]) -> reqwest::Response {
    let url = if query.is_empty() {
        app.url(PATH)
    } else {
        app.url(&format!("{PATH}?{query}"))
    };
    app.client
        .post(url)
        .header("Content-Type", "application/json")
        .header("Authorization", authorization)
        .body(body.to_vec())
        .send()
        .await
        .unwrap()
}

async fn answer(response: reqwest::Response, status: StatusCode) -> Value {
    let got = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    body
}

#[tokio::test]
async fn atlassian_uninstalled_is_one_job_a_replay_is_deduplicated_and_installed_is_ignored() {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = spawn_connect(&key_server(hits.clone()).await).await;
    sqlx::query("INSERT INTO app.accounts (id) VALUES ($1), ('other-client')")
        .bind(CLIENT_KEY)
        .execute(&app.db)
        .await
        .unwrap();
    let auth = format!("JWT {}", token(&claims("")));
    let first = answer(
        post(&app, "", &auth, &body("uninstalled")).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(
        (first["outcome"].as_str(), first["event_type"].as_str()),
        (Some("recorded"), Some("uninstalled"))
    );
    let replay = answer(
        post(&app, "", &auth, &body("uninstalled")).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(
        (replay["duplicate"].as_bool(), &replay["job_id"]),
        (Some(true), &first["job_id"])
    );
    // A query string is part of qsh: signed with it, it verifies.
    let with_query = format!("JWT {}", token(&claims("user_key=abc&b=1")));
    answer(
        post(&app, "b=1&user_key=abc", &with_query, &body("uninstalled")).await,
        StatusCode::ACCEPTED,
    )
    .await;
    let installed = answer(
        post(&app, "", &auth, &body("installed")).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(installed["outcome"], "ignored");
    let (subject, dedup_key): (String, String) =
        sqlx::query_as("SELECT subject, dedup_key FROM deprov.deletion_requests")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (subject.as_str(), dedup_key.as_str()),
        (CLIENT_KEY, CLIENT_KEY)
    );
    assert_eq!(
        (
            app.count_jobs().await,
            app.count_requests().await,
            app.count_ignored().await
        ),
        (1, 1, 1)
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1, "the key is fetched once");
    // The worker deletes the client's tenant, and only it.
    app.drain_worker().await;
    assert_eq!(
        app.job_state(first["job_id"].as_str().unwrap()).await,
        "completed"
    );
    assert_eq!(
        (
            app.account_exists(CLIENT_KEY).await,
            app.account_exists("other-client").await
        ),
        (false, true)
    );
}

#[tokio::test]
async fn atlassian_tokens_not_bound_to_this_request_and_tenant_are_401() {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = spawn_connect(&key_server(hits.clone()).await).await;
    let with = |key: &str, value: Value| {
        let mut c = claims("");
        c[key] = value;
        c
    };
    let good = token(&claims(""));
    let refused: Vec<(&str, &str, String, Vec<u8>)> = vec![
        (
            "qsh of another path",
            "",
            format!(
                "JWT {}",
                token(&with(
                    "qsh",
                    json!(qsh("POST", BASE_PATH, "/v1/webhooks/other", ""))
                ))
            ),
            body("uninstalled"),
        ),
        (
            "qsh without base_path",
            "",
            format!(
                "JWT {}",
                token(&with("qsh", json!(qsh("POST", "", PATH, ""))))
            ),
            body("uninstalled"),
        ),
        (
            "qsh of another query",
            "",
            format!("JWT {}", token(&claims("a=1"))),
            body("uninstalled"),
        ),
        (
            "a query the qsh does not cover",
            "a=1",
            format!("JWT {good}"),
            body("uninstalled"),
        ),
        (
            "qsh of another method",
            "",
            format!(
                "JWT {}",
                token(&with("qsh", json!(qsh("GET", BASE_PATH, PATH, ""))))
            ),
            body("uninstalled"),
        ),
        (
            "Bearer instead of JWT",
            "",
            format!("Bearer {good}"),
            body("uninstalled"),
        ),
        (
            "iss is not the body's clientKey",
            "",
            format!("JWT {}", token(&with("iss", json!("another-client")))),
            body("uninstalled"),
        ),
        (
            "wrong audience",
            "",
            format!("JWT {}", token(&with("aud", json!("https://evil.example")))),
            body("uninstalled"),
        ),
        (
            "expired",
            "",
            format!("JWT {}", token(&with("exp", json!(unix_now() - 120)))),
            body("uninstalled"),
        ),
        (
            "issued in the future",
            "",
            format!("JWT {}", token(&with("iat", json!(unix_now() + 600)))),
            body("uninstalled"),
        ),
        (
            "HS256 (a shared secret)",
            "",
            format!(
                "JWT {}",
                sign(Algorithm::HS256, "atlassian.pub.pem", KID, &claims(""))
            ),
            body("uninstalled"),
        ),
        (
            "signed by another key",
            "",
            format!(
                "JWT {}",
                sign(Algorithm::RS256, "rsa-1.pem", KID, &claims(""))
            ),
            body("uninstalled"),
        ),
        (
            "kid not a path segment",
            "",
            format!(
                "JWT {}",
                sign(
                    Algorithm::RS256,
                    "atlassian.pem",
                    "../keys/connect-1",
                    &claims("")
                )
            ),
            body("uninstalled"),
        ),
    ];
    for (what, query, authorization, body) in &refused {
        let response = post(&app, query, authorization, body).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
        let problem = assert_problem(response, StatusCode::UNAUTHORIZED).await;
        if what.starts_with("HS256") {
            assert!(
                problem["detail"].as_str().unwrap().contains("HS256"),
                "{problem}"
            );
        }
    }
    assert_eq!(hits.load(Ordering::SeqCst), 1, "only connect-1 was fetched");
    // A kid the key server does not know: one fetch (404), then no fetch for a while.
    for kid in ["connect-2", "connect-3"] {
        let t = sign(Algorithm::RS256, "atlassian.pem", kid, &claims(""));
        assert_problem(
            post(&app, "", &format!("JWT {t}"), &body("uninstalled")).await,
            StatusCode::UNAUTHORIZED,
        )
        .await;
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "unknown kids cannot hammer the key server"
    );
    app.assert_nothing_stored_at_all().await;
}

#[tokio::test]
async fn atlassian_an_unreachable_key_server_is_503_and_stores_nothing() {
    let app = spawn_connect(&format!("http://127.0.0.1:{}/{{kid}}", closed_port())).await;
    let response = post(
        &app,
        "",
        &format!("JWT {}", token(&claims(""))),
        &body("uninstalled"),
    )
    .await;
    assert!(response.headers().contains_key("retry-after"));
    assert_problem(response, StatusCode::SERVICE_UNAVAILABLE).await;
    app.assert_nothing_stored_at_all().await;
}

#[tokio::test]
async fn atlassian_refusal_details_name_a_repeated_header_a_missing_client_key_and_plain_reasons() {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = spawn_connect(&key_server(hits).await).await;
    let good = token(&claims(""));
    let repeated = app
        .client
        .post(app.url(PATH))
        .header("Content-Type", "application/json")
        .header("Authorization", format!("JWT {good}"))
        .header("Authorization", "Bearer garbage")
        .body(body("uninstalled"))
        .send()
        .await
        .unwrap();
    let problem = assert_problem(repeated, StatusCode::UNAUTHORIZED).await;
    assert_eq!(
        problem["detail"], "source jira: repeated Authorization header",
        "{problem}"
    );
    let no_client_key = json!({"eventType": "uninstalled"}).to_string();
    let with = |key: &str, value: Value| {
        let mut c = claims("");
        c[key] = value;
        format!("JWT {}", token(&c))
    };
    for (authorization, body, expected) in [
        (
            format!("JWT {good}"),
            no_client_key.into_bytes(),
            "source jira: the body has no clientKey".to_owned(),
        ),
        (
            with("aud", json!("https://evil.example")),
            body("uninstalled"),
            format!("source jira: token audience is not one of {BASE_URL:?}"),
        ),
        (
            with("exp", json!(unix_now() - 120)),
            body("uninstalled"),
            "source jira: token expired".to_owned(),
        ),
    ] {
        let problem = assert_problem(
            post(&app, "", &authorization, &body).await,
            StatusCode::UNAUTHORIZED,
        )
        .await;
        assert_eq!(problem["detail"], expected.as_str(), "{problem}");
    }
    app.assert_nothing_stored_at_all().await;
}
