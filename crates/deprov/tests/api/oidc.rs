//! `vercel-oidc`: the partner API verified by Vercel's OIDC JWTs against a JWKS (file or URL).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deprov::sources::unix_now;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::helpers::{TestApp, TestOptions, assert_problem, closed_port, spawn_app_with};

const INSTALLATION: &str = "icfg_9bceb8ccT32d3U417ezb5c8p";
const ISSUER: &str = "https://marketplace.vercel.com";
const AUDIENCE: &str = "oac_9f4YG9JFjgKkRlxoaaGG0y05";

fn oidc_file(name: &str) -> String {
    format!("{}/tests/fixtures/oidc/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The fixture's claims (`vercel_oidc-claims.{user,system}.json`) with fresh `iat`/`exp`.
fn claims(kind: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/webhooks/vercel_oidc-claims.{kind}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    c["iat"] = json!(unix_now());
    c["exp"] = json!(unix_now() + 300);
    c
}

fn token(key_file: &str, kid: &str, claims: &Value) -> String {
    let pem = std::fs::read(oidc_file(key_file)).unwrap();
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_owned());
    encode(&header, claims, &EncodingKey::from_rsa_pem(&pem).unwrap()).unwrap()
}

async fn spawn_oidc(jwks: &str) -> TestApp {
    spawn_app_with(TestOptions {
        vercel_source: Some(format!(
            "scheme = \"vercel-oidc\"\n{jwks}\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\n"
        )),
        ..Default::default()
    })
    .await
}

async fn ok(response: reqwest::Response) {
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["finalized"], false);
}

#[tokio::test]
async fn tokens_are_checked_against_the_jwks_issuer_audience_expiry_and_installation() {
    let app = spawn_oidc(&format!("jwks_file = {:?}", oidc_file("jwks-a.json"))).await;
    let mut refused = Vec::new();
    let mut c = claims("user");
    c["aud"] = json!("oac_someone_else");
    refused.push(("wrong audience", token("key-a.pem", "key-a", &c)));
    let mut c = claims("user");
    c["iss"] = json!("https://evil.example");
    refused.push(("wrong issuer", token("key-a.pem", "key-a", &c)));
    let mut c = claims("user");
    c["exp"] = json!(unix_now() - 120);
    refused.push(("expired", token("key-a.pem", "key-a", &c)));
    let mut c = claims("user");
    c["nbf"] = json!(unix_now() + 600);
    refused.push(("not yet valid", token("key-a.pem", "key-a", &c)));
    refused.push((
        "signed by another key under key-a's kid",
        token("key-b.pem", "key-a", &claims("user")),
    ));
    refused.push(("unknown kid", token("key-b.pem", "key-b", &claims("user"))));
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some("key-a".into());
    let jwks = std::fs::read(oidc_file("jwks-a.json")).unwrap();
    refused.push((
        "HS256 keyed with the public JWKS (algorithm confusion)",
        encode(
            &hs,
            &claims("user"),
            &EncodingKey::from_secret(&jwks).unwrap(),
        )
        .unwrap(),
    ));
    refused.push(("not a JWT", "garbage".to_owned()));
    for (what, t) in &refused {
        let response = app.delete_installation(INSTALLATION, t, None, None).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
        assert_problem(response, StatusCode::UNAUTHORIZED).await;
    }
    let mut c = claims("user");
    c["installation_id"] = json!("icfg_another");
    assert_problem(
        app.delete_installation(INSTALLATION, &token("key-a.pem", "key-a", &c), None, None)
            .await,
        StatusCode::FORBIDDEN,
    )
    .await;
    app.assert_nothing_stored().await;

    ok(app
        .delete_installation(
            INSTALLATION,
            &token("key-a.pem", "key-a", &claims("user")),
            None,
            None,
        )
        .await)
    .await;
    ok(app
        .delete_installation(
            INSTALLATION,
            &token("key-a.pem", "key-a", &claims("system")),
            None,
            None,
        )
        .await)
    .await;
    let (source, duplicates): (String, i32) =
        sqlx::query_as("SELECT source, duplicates FROM deprov.deletion_requests")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (source.as_str(), duplicates, app.count_jobs().await),
        ("vercel", 1, 1)
    );
}

/// A JWKS host that counts its fetches and whose key set can be swapped (a rotation).
async fn jwks_server(body: Arc<Mutex<String>>, hits: Arc<AtomicUsize>) -> String {
    let app = axum::Router::new().route(
        "/.well-known/jwks",
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
    let url = format!("http://{}/.well-known/jwks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn keys_from_a_url_are_cached_and_refetched_once_on_an_unknown_kid() {
    let body = Arc::new(Mutex::new(
        std::fs::read_to_string(oidc_file("jwks-a.json")).unwrap(),
    ));
    let hits = Arc::new(AtomicUsize::new(0));
    let url = jwks_server(body.clone(), hits.clone()).await;
    let app = spawn_oidc(&format!("jwks_url = {url:?}")).await;
    for _ in 0..3 {
        ok(app
            .delete_installation(
                INSTALLATION,
                &token("key-a.pem", "key-a", &claims("user")),
                None,
                None,
            )
            .await)
        .await;
    }
    assert_eq!(hits.load(Ordering::SeqCst), 1, "keys are cached");
    // Vercel rotates: key-b appears in the JWKS and signs the next call.
    *body.lock().await = std::fs::read_to_string(oidc_file("jwks-ab.json")).unwrap();
    ok(app
        .delete_installation(
            INSTALLATION,
            &token("key-b.pem", "key-b", &claims("user")),
            None,
            None,
        )
        .await)
    .await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "an unknown kid refetches once"
    );
    // Unknown kids right after that refetch: refused without fetching (one refetch per interval).
    for kid in ["key-y", "key-z", "key-x"] {
        assert_problem(
            app.delete_installation(
                INSTALLATION,
                &token("key-b.pem", kid, &claims("user")),
                None,
                None,
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

#[tokio::test]
async fn an_unreachable_jwks_is_503_with_retry_after_and_stores_nothing() {
    let url = format!("http://127.0.0.1:{}/jwks", closed_port());
    let app = spawn_oidc(&format!("jwks_url = {url:?}")).await;
    let response = app
        .delete_installation(
            INSTALLATION,
            &token("key-a.pem", "key-a", &claims("user")),
            None,
            None,
        )
        .await;
    assert!(response.headers().contains_key("retry-after"));
    assert_problem(response, StatusCode::SERVICE_UNAVAILABLE).await;
    app.assert_nothing_stored().await;
}

/// `serve` and `worker` refuse to start on a `jwks_file` they cannot read, naming the key, the path
/// and the OS error (instead of starting and answering every token 503).
#[tokio::test]
async fn serve_and_worker_refuse_to_start_on_a_missing_jwks_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("jwks.json").display().to_string();
    let (_config_dir, config) = crate::helpers::config_file(&format!(
        "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n\n\
         [sources.partner]\nscheme = \"jwt\"\njwks_file = {missing:?}\nissuer = \"{ISSUER}\"\n\
         audience = \"{AUDIENCE}\"\ntenant = {{ pointer = \"/x\" }}\nevent = {{ pointer = \"/t\" }}\n\
         delete_events = [\"a\"]\n"
    ));
    for command in ["serve", "worker"] {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
            .arg(command)
            .env("DEPROV_DATABASE_URL", "postgres://127.0.0.1:1/x")
            .env("DEPROV_TARGET_URL", "postgres://127.0.0.1:1/y")
            .env("DEPROV_CONFIG", &config)
            .env("DEPROV_LISTEN", "127.0.0.1:0")
            .env_remove("DEPROV_POOLER_MODE")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // A process that started (the fault) would run on: give up on it and fail.
        let out =
            tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
                .await
                .unwrap_or_else(|_| panic!("{command} started despite the missing jwks_file"))
                .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "configuration key `sources.partner.jwks_file`: {missing}: No such file or directory"
            )),
            "{command}: {stderr}"
        );
    }
}
