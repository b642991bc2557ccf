//! `jwt`: webhooks authenticated by an `Authorization: Bearer` JWT checked against a JWKS (file, or
//! served from loopback), in Azure Marketplace's configuration (fulfillment webhook body, Entra ID
//! claims).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deprov::sources::unix_now;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::helpers::assert_problem;
use crate::helpers::{TestApp, TestOptions, spawn_app_with};

const ISSUER: &str = "https://login.microsoftonline.com/00000000-0000-0000-0000-0000000000aa/v2.0";
const AUDIENCE: &str = "api://deprov-test-app";
const APPID: &str = "20e940b3-4c77-4b0b-9a53-9e16a1b010a7";
const SUBSCRIPTION: &str = "37f9dea2-4345-438f-b0bd-03d40d28c7e0";

pub fn jwt_file(name: &str) -> String {
    format!("{}/tests/fixtures/jwt/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `claims` signed with `alg` by fixture key `key_file` under `kid`.
pub fn sign(alg: Algorithm, key_file: &str, kid: &str, claims: &Value) -> String {
    let pem = std::fs::read(jwt_file(key_file)).unwrap();
    let key = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem).unwrap(),
        Algorithm::HS256 => EncodingKey::from_secret(&pem).unwrap(),
        _ => EncodingKey::from_rsa_pem(&pem).unwrap(),
    };
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    encode(&header, claims, &key).unwrap()
}

/// Entra ID's claims for the Marketplace SaaS API calling the publisher's app, valid 5 minutes.
fn claims() -> Value {
    json!({
        "iss": ISSUER, "aud": AUDIENCE, "appid": APPID, "tid": "00000000-0000-0000-0000-0000000000aa",
        "iat": unix_now(), "nbf": unix_now() - 10, "exp": unix_now() + 300,
    })
}

fn rs256(claims: &Value) -> String {
    sign(Algorithm::RS256, "rsa-1.pem", "rsa-1", claims)
}

/// A fulfillment webhook body (Microsoft's documented shape).
fn body(operation: &str, action: &str) -> Vec<u8> {
    json!({
        "id": operation, "activityId": "e0ae0f0f-4d5b-4ef6-8b5c-d8b0b6f3a1c2",
        "publisherId": "contoso", "offerId": "deprov-offer", "planId": "silver", "quantity": 1,
        "subscriptionId": SUBSCRIPTION, "timeStamp": "2026-03-02T10:00:00.0000000Z",
        "action": action, "status": "InProgress",
    })
    .to_string()
    .into_bytes()
}

/// A server with `[sources.azure]` (scheme `jwt`) reading keys from `jwks` (a `jwks_*` line).
async fn spawn_jwt(jwks: &str) -> TestApp {
    spawn_app_with(TestOptions {
        extra_config: format!(
            r#"
[sources.azure]
scheme = "jwt"
{jwks}
allow_http_loopback = true
issuer = ["https://sts.windows.net/00000000-0000-0000-0000-0000000000aa/", "{ISSUER}"]
audience = "{AUDIENCE}"
algorithms = ["RS256", "ES256"]
required_claims = {{ appid = "{APPID}" }}
tenant = {{ pointer = "/subscriptionId" }}
event = {{ pointer = "/action" }}
delete_events = ["Unsubscribe"]
"#
        ),
        ..Default::default()
    })
    .await
}

async fn post(app: &TestApp, authorization: Option<String>, body: &[u8]) -> reqwest::Response {
    let mut req = app
        .client
        .post(app.url("/v1/webhooks/azure"))
        .header("Content-Type", "application/json")
        .body(body.to_vec());
    if let Some(a) = authorization {
        req = req.header("Authorization", a);
    }
    req.send().await.unwrap()
}

async fn answer(response: reqwest::Response, status: StatusCode) -> Value {
    let got = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    body
}

#[tokio::test]
async fn jwt_tokens_outside_the_rules_are_401_and_store_nothing() {
    let app = spawn_jwt(&format!("jwks_file = {:?}", jwt_file("jwks.json"))).await;
    let with = |key: &str, value: Value| {
        let mut c = claims();
        c[key] = value;
        c
    };
    let mut refused = vec![
        (
            "wrong issuer",
            rs256(&with("iss", json!("https://evil.example"))),
        ),
        (
            "wrong audience",
            rs256(&with("aud", json!("api://another"))),
        ),
        (
            "expired beyond the leeway",
            rs256(&with("exp", json!(unix_now() - 120))),
        ),
        (
            "not yet valid",
            rs256(&with("nbf", json!(unix_now() + 600))),
        ),
        (
            "required claim mismatch",
            rs256(&with("appid", json!("someone-else"))),
        ),
        (
            "RS384: not an allowed algorithm",
            sign(Algorithm::RS384, "rsa-1.pem", "rsa-1", &claims()),
        ),
        (
            "PS256: not an allowed algorithm",
            sign(Algorithm::PS256, "rsa-1.pem", "pss-1", &claims()),
        ),
        (
            "ES256 under an RSA key's kid",
            sign(Algorithm::ES256, "ec-p256.pem", "rsa-1", &claims()),
        ),
        (
            "signed by another key under rsa-1's kid",
            sign(Algorithm::RS256, "rsa-2.pem", "rsa-1", &claims()),
        ),
        (
            "unknown kid",
            sign(Algorithm::RS256, "rsa-2.pem", "rsa-2", &claims()),
        ),
        (
            "HS256 keyed with the public JWKS",
            sign(Algorithm::HS256, "jwks.json", "rsa-1", &claims()),
        ),
        ("not a JWT", "garbage".to_owned()),
    ];
    let mut c = claims();
    c.as_object_mut().unwrap().remove("appid");
    refused.push(("required claim absent", rs256(&c)));
    let good = rs256(&claims());
    let mut forged = good.clone().into_bytes();
    let at = forged.len() - 10;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    refused.push((
        "one signature byte changed",
        String::from_utf8(forged).unwrap(),
    ));
    for (what, token) in &refused {
        let response = post(
            &app,
            Some(format!("Bearer {token}")),
            &body("op-1", "Unsubscribe"),
        )
        .await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
        assert_problem(response, StatusCode::UNAUTHORIZED).await;
    }
    for authorization in [None, Some(format!("JWT {good}")), Some(good.clone())] {
        let response = post(&app, authorization.clone(), &body("op-1", "Unsubscribe")).await;
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{authorization:?}"
        );
    }
    app.assert_nothing_stored_at_all().await;

    // RS256 and ES256 both verify; the subscription is the natural dedup key (no delivery ID).
    sqlx::query("INSERT INTO app.accounts (id) VALUES ($1), ('other-subscription')")
        .bind(SUBSCRIPTION)
        .execute(&app.db)
        .await
        .unwrap();
    let first = answer(
        post(
            &app,
            Some(format!("Bearer {good}")),
            &body("op-1", "Unsubscribe"),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(
        (first["outcome"].as_str(), first["duplicate"].as_bool()),
        (Some("recorded"), Some(false))
    );
    let es = sign(Algorithm::ES256, "ec-p256.pem", "ec-1", &claims());
    let again = answer(
        post(
            &app,
            Some(format!("Bearer {es}")),
            &body("op-2", "Unsubscribe"),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["job_id"], first["job_id"]);
    let ignored = answer(
        post(
            &app,
            Some(format!("Bearer {good}")),
            &body("op-3", "ChangePlan"),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(ignored["outcome"], "ignored");
    let (subject, dedup_key): (String, String) =
        sqlx::query_as("SELECT subject, dedup_key FROM deprov.deletion_requests")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (subject.as_str(), dedup_key.as_str()),
        (SUBSCRIPTION, SUBSCRIPTION)
    );
    assert_eq!(
        (
            app.count_jobs().await,
            app.count_requests().await,
            app.count_ignored().await
        ),
        (1, 1, 1)
    );
    // The worker deletes the subscription's tenant, and only it.
    app.drain_worker().await;
    assert_eq!(
        app.job_state(first["job_id"].as_str().unwrap()).await,
        "completed"
    );
    assert_eq!(
        (
            app.account_exists(SUBSCRIPTION).await,
            app.account_exists("other-subscription").await
        ),
        (false, true)
    );
}

/// A JWKS host that counts its fetches and whose key set can be swapped (a rotation).
async fn jwks_server(body: Arc<Mutex<String>>, hits: Arc<AtomicUsize>) -> String {
    let app = axum::Router::new().route(
        "/keys",
        axum::routing::get(move || {
            let body = body.clone();
            let hits = hits.clone();
            async move {
                hits.fetch_add(1, Ordering::SeqCst);
                body.lock().await.clone()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/keys", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn jwt_keys_are_cached_and_an_unknown_kid_refetches_once() {
    let jwks = Arc::new(Mutex::new(
        std::fs::read_to_string(jwt_file("jwks.json")).unwrap(),
    ));
    let hits = Arc::new(AtomicUsize::new(0));
    let url = jwks_server(jwks.clone(), hits.clone()).await;
    let app = spawn_jwt(&format!("jwks_url = {url:?}")).await;
    for op in ["op-1", "op-2", "op-3"] {
        answer(
            post(
                &app,
                Some(format!("Bearer {}", rs256(&claims()))),
                &body(op, "Unsubscribe"),
            )
            .await,
            StatusCode::ACCEPTED,
        )
        .await;
    }
    assert_eq!(hits.load(Ordering::SeqCst), 1, "keys are cached");
    // A rotation: rsa-2 appears and signs the next delivery.
    *jwks.lock().await = std::fs::read_to_string(jwt_file("jwks-rotated.json")).unwrap();
    let rotated = sign(Algorithm::RS256, "rsa-2.pem", "rsa-2", &claims());
    answer(
        post(
            &app,
            Some(format!("Bearer {rotated}")),
            &body("op-4", "Unsubscribe"),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "an unknown kid refetches once"
    );
    for kid in ["kid-x", "kid-y", "kid-z"] {
        let token = sign(Algorithm::RS256, "rsa-2.pem", kid, &claims());
        assert_problem(
            post(
                &app,
                Some(format!("Bearer {token}")),
                &body("op-5", "Unsubscribe"),
            )
            .await,
            StatusCode::UNAUTHORIZED,
        )
        .await;
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "unknown kids cannot hammer the JWKS host"
    );
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

/// The detail of a 401 to `authorization` (one header, or two in order).
async fn refusal(app: &TestApp, authorization: &[String]) -> String {
    let mut req = app
        .client
        .post(app.url("/v1/webhooks/azure"))
        .header("Content-Type", "application/json")
        .body(body("op-1", "Unsubscribe"));
    for a in authorization {
        req = req.header("Authorization", a);
    }
    let problem = assert_problem(req.send().await.unwrap(), StatusCode::UNAUTHORIZED).await;
    problem["detail"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn jwt_refusal_details_are_plain_words_without_the_token() {
    let app = spawn_jwt(&format!("jwks_file = {:?}", jwt_file("jwks.json"))).await;
    let with = |key: &str, value: Value| {
        let mut c = claims();
        c[key] = value;
        c
    };
    let mut no_exp = claims();
    no_exp.as_object_mut().unwrap().remove("exp");
    let good = rs256(&claims());
    let cases = [
        (
            vec![format!("Bearer {good}"), "Bearer garbage".to_owned()],
            "source azure: repeated Authorization header".to_owned(),
        ),
        (
            vec!["Bearer garbage".to_owned(), format!("Bearer {good}")],
            "source azure: repeated Authorization header".to_owned(),
        ),
        (
            vec![format!(
                "Bearer {}",
                rs256(&with("aud", json!("api://another")))
            )],
            format!("source azure: token audience is not one of {AUDIENCE:?}"),
        ),
        (
            vec![format!(
                "Bearer {}",
                rs256(&with("exp", json!(unix_now() - 120)))
            )],
            "source azure: token expired".to_owned(),
        ),
        (
            vec![format!(
                "Bearer {}",
                rs256(&with("nbf", json!(unix_now() + 600)))
            )],
            "source azure: token not valid yet (nbf)".to_owned(),
        ),
        (
            vec![format!("Bearer {}", rs256(&no_exp))],
            "source azure: token has no exp claim".to_owned(),
        ),
    ];
    for (authorization, expected) in &cases {
        let detail = refusal(&app, authorization).await;
        assert_eq!(&detail, expected, "{authorization:?}");
        for a in authorization {
            let token = a.trim_start_matches("Bearer ");
            assert!(!detail.contains(token), "the token is never echoed");
        }
    }
    app.assert_nothing_stored_at_all().await;
}

#[tokio::test]
async fn a_tenant_value_that_cannot_be_used_is_422_saying_why() {
    let app = spawn_jwt(&format!("jwks_file = {:?}", jwt_file("jwks.json"))).await;
    let good = rs256(&claims());
    let cases = [
        (json!("x\ny"), "it holds a control character"),
        (json!(""), "it is empty"),
        (json!("s".repeat(257)), "it is longer than 256 characters"),
        (json!({"id": "x"}), "it is not a string or an integer"),
        (json!(null), "it is not a string or an integer"),
    ];
    for (value, why) in &cases {
        let mut delivery: Value = serde_json::from_slice(&body("op-1", "Unsubscribe")).unwrap();
        delivery["subscriptionId"] = value.clone();
        let response = post(
            &app,
            Some(format!("Bearer {good}")),
            delivery.to_string().as_bytes(),
        )
        .await;
        let problem = assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY).await;
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(
                "the value where sources.azure.tenant points (pointer \"/subscriptionId\") is absent \
                 or unusable: "
            ) && detail.contains(why),
            "{value}: {detail}"
        );
    }
    let mut delivery: Value = serde_json::from_slice(&body("op-1", "Unsubscribe")).unwrap();
    delivery.as_object_mut().unwrap().remove("subscriptionId");
    let response = post(
        &app,
        Some(format!("Bearer {good}")),
        delivery.to_string().as_bytes(),
    )
    .await;
    let problem = assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY).await;
    assert!(
        problem["detail"].as_str().unwrap().contains("it is absent"),
        "{problem}"
    );
    app.assert_nothing_stored_at_all().await;
}
