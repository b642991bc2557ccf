//! Cached signing keys have a maximum age: a key removed from a `jwks_file`, or withdrawn by the
//! Atlassian key server, stops verifying once the cached copy is older than [`MAX_KEY_AGE`]. The
//! caches go by a hand-moved clock, so nothing waits.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::json;

use crate::sources::atlassian_keys::{ConnectError, ConnectVerifier};
use crate::sources::oidc::{Clock, JwksSource, MAX_KEY_AGE, OidcError, OidcVerifier, STALE_GRACE};
use crate::sources::unix_now;

const ISSUER: &str = "https://marketplace.vercel.com";
const AUDIENCE: &str = "oac_key_age";
const SECOND: Duration = Duration::from_secs(1);

fn fixture(dir: &str, name: &str) -> String {
    let path = format!("{}/tests/fixtures/{dir}/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A clock that moves only when the test says.
struct HandClock(Arc<Mutex<Instant>>);

impl HandClock {
    fn new() -> (Self, Clock) {
        let now = Arc::new(Mutex::new(Instant::now()));
        let read = now.clone();
        (Self(now), Arc::new(move || *read.lock().unwrap()))
    }

    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
}

fn sign(dir: &str, key: &str, kid: &str, claims: &serde_json::Value) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_owned());
    let pem = fixture(dir, key);
    encode(
        &header,
        claims,
        &EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn oidc_token(key: &str, kid: &str) -> String {
    let claims = json!({ "iss": ISSUER, "aud": AUDIENCE, "exp": unix_now() + 300 });
    sign("oidc", key, kid, &claims)
}

#[tokio::test]
async fn a_key_removed_from_the_jwks_file_is_refused_after_the_maximum_age() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, fixture("oidc", "jwks-ab.json")).unwrap();
    let (clock, time) = HandClock::new();
    let verifier = OidcVerifier::new(
        JwksSource::File(path.display().to_string()),
        ISSUER,
        AUDIENCE,
    )
    .with_clock(time);
    let a = oidc_token("key-a.pem", "key-a");
    let b = oidc_token("key-b.pem", "key-b");
    assert!(verifier.verify_claims(&a).await.is_ok());
    assert!(verifier.verify_claims(&b).await.is_ok());
    assert_eq!(verifier.fetches().await, 1, "one read serves both keys");

    // key-b is removed from the file; its holder keeps using it.
    std::fs::write(&path, fixture("oidc", "jwks-a.json")).unwrap();
    clock.advance(MAX_KEY_AGE - SECOND);
    assert!(
        verifier.verify_claims(&b).await.is_ok(),
        "within the maximum age the cached set is trusted"
    );
    assert_eq!(verifier.fetches().await, 1);
    clock.advance(2 * SECOND);
    assert_eq!(
        verifier.verify_claims(&b).await.unwrap_err(),
        OidcError::UnknownKey,
        "past the maximum age the set is reread and the removed key refused"
    );
    assert_eq!(verifier.fetches().await, 2);
    assert!(
        verifier.verify_claims(&a).await.is_ok(),
        "a key still in the set verifies"
    );
    assert_eq!(
        verifier.verify_claims(&b).await.unwrap_err(),
        OidcError::UnknownKey
    );
    assert_eq!(
        verifier.fetches().await,
        2,
        "the removed kid does not refetch again right after the reread"
    );
}

#[tokio::test]
async fn an_old_set_serves_for_a_bounded_grace_while_the_jwks_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, fixture("oidc", "jwks-a.json")).unwrap();
    let (clock, time) = HandClock::new();
    let verifier = OidcVerifier::new(
        JwksSource::File(path.display().to_string()),
        ISSUER,
        AUDIENCE,
    )
    .with_clock(time);
    let a = oidc_token("key-a.pem", "key-a");
    assert!(verifier.verify_claims(&a).await.is_ok());
    std::fs::write(&path, "{ not a JWKS").unwrap();
    clock.advance(MAX_KEY_AGE + SECOND);
    assert!(
        verifier.verify_claims(&a).await.is_ok(),
        "the failed reread keeps the old set within the grace"
    );
    assert_eq!(verifier.fetches().await, 2);
    clock.advance(STALE_GRACE);
    assert_eq!(
        verifier.verify_claims(&a).await.unwrap_err(),
        OidcError::Jwks,
        "past the grace: unavailable (503)"
    );
    assert_eq!(verifier.fetches().await, 3);
    std::fs::write(&path, fixture("oidc", "jwks-a.json")).unwrap();
    clock.advance(2 * SECOND);
    assert!(
        verifier.verify_claims(&a).await.is_ok(),
        "a good read recovers"
    );
    assert_eq!(verifier.fetches().await, 4);
}

/// A key server serving `atlassian.pub.pem` for `connect-1` and `connect-2` (404 once `withdrawn`
/// for `connect-1`, and for every other `kid`), counting requests; its URL template.
async fn key_server(hits: Arc<AtomicUsize>, withdrawn: Arc<AtomicBool>) -> String {
    let pem = fixture("jwt", "atlassian.pub.pem");
    let app = axum::Router::new().route(
        "/keys/{kid}",
        axum::routing::get(
            move |axum::extract::Path(kid): axum::extract::Path<String>| async move {
                hits.fetch_add(1, Ordering::SeqCst);
                let served =
                    kid == "connect-2" || (kid == "connect-1" && !withdrawn.load(Ordering::SeqCst));
                if served {
                    (StatusCode::OK, pem)
                } else {
                    (StatusCode::NOT_FOUND, String::new())
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/keys/{{kid}}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn connect(verifier: &ConnectVerifier, kid: &str) -> Result<(), ConnectError> {
    const BASE_URL: &str = "https://app.example.com";
    const CLIENT_KEY: &str = "client-1";
    const PATH: &str = "/v1/webhooks/jira";
    let claims = json!({
        "iss": CLIENT_KEY, "aud": BASE_URL, "iat": unix_now(), "exp": unix_now() + 180,
        "qsh": crate::sources::atlassian::qsh("POST", "", PATH, ""),
    });
    let token = sign("jwt", "atlassian.pem", kid, &claims);
    let mut headers = HeaderMap::new();
    headers.insert(
        "authorization",
        HeaderValue::from_str(&format!("JWT {token}")).unwrap(),
    );
    let body = json!({ "eventType": "uninstalled", "clientKey": CLIENT_KEY }).to_string();
    verifier
        .verify(&headers, "POST", PATH, "", body.as_bytes())
        .await
}

#[tokio::test]
async fn an_atlassian_key_the_server_withdraws_is_refused_after_the_maximum_age() {
    let hits = Arc::new(AtomicUsize::new(0));
    let withdrawn = Arc::new(AtomicBool::new(false));
    let url = key_server(hits.clone(), withdrawn.clone()).await;
    let source: crate::sources::SourceConfig = toml::from_str(&format!(
        "scheme = \"atlassian-connect\"\naudience = \"https://app.example.com\"\n\
         key_url = {url:?}\nallow_http_loopback = true"
    ))
    .unwrap();
    let (clock, time) = HandClock::new();
    let verifier = ConnectVerifier::new(&source).with_clock(time);
    for kid in ["connect-1", "connect-2", "connect-1"] {
        connect(&verifier, kid).await.unwrap();
    }
    assert_eq!(hits.load(Ordering::SeqCst), 2, "one fetch per kid");

    withdrawn.store(true, Ordering::SeqCst);
    clock.advance(MAX_KEY_AGE - SECOND);
    connect(&verifier, "connect-1").await.unwrap();
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "cached within the maximum age"
    );
    clock.advance(2 * SECOND);
    assert_eq!(
        connect(&verifier, "connect-1").await.unwrap_err(),
        ConnectError::UnknownKey,
        "past the maximum age the withdrawn key is refetched (404) and refused"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    connect(&verifier, "connect-2").await.unwrap();
    assert_eq!(
        hits.load(Ordering::SeqCst),
        4,
        "a key still served is refetched and verifies"
    );
    assert_eq!(
        connect(&verifier, "connect-1").await.unwrap_err(),
        ConnectError::UnknownKey
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        4,
        "the withdrawn kid is not fetched again within the miss interval"
    );
    assert_eq!(verifier.fetches().await, 4);
}
