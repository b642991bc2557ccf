//! Property tests of `jwt` and `atlassian-connect`: a token signed by a fixture key with any single
//! character changed — in its header, claims or signature — never verifies, for each allowed
//! algorithm family (RS256, PS256, ES256) and for Atlassian's qsh-bound RS256 tokens.

use std::sync::LazyLock;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use proptest::prelude::*;

use super::atlassian_keys::ConnectVerifier;
use super::oidc::{JwksSource, OidcVerifier, Rules};
use super::unix_now;

const ISSUER: &str = "https://accounts.google.com";
const AUDIENCE: &str = "https://deprov.example.com/v1/webhooks/gcp";
const EMAIL: &str = "push@project.iam.gserviceaccount.com";
/// The characters of a JWT (base64url and the two dots).
const JWT_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.";

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/jwt/{name}", env!("CARGO_MANIFEST_DIR"))
}

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
});

static VERIFIER: LazyLock<OidcVerifier> = LazyLock::new(|| {
    OidcVerifier::with_rules(
        JwksSource::File(fixture("jwks.json")),
        Rules {
            algorithms: vec![Algorithm::RS256, Algorithm::PS256, Algorithm::ES256],
            issuers: vec![ISSUER.into()],
            audiences: vec![AUDIENCE.into()],
            required_claims: vec![
                ("email".into(), serde_json::json!(EMAIL)),
                ("email_verified".into(), serde_json::json!(true)),
            ],
            leeway: Duration::from_secs(60),
        },
    )
});

fn sign(alg: Algorithm, kid: &str, claims: &serde_json::Value) -> String {
    let pem = std::fs::read(fixture(if alg == Algorithm::ES256 {
        "ec-p256.pem"
    } else {
        "rsa-1.pem"
    }))
    .unwrap();
    let key = if alg == Algorithm::ES256 {
        EncodingKey::from_ec_pem(&pem).unwrap()
    } else {
        EncodingKey::from_rsa_pem(&pem).unwrap()
    };
    let mut header = Header::new(alg);
    header.kid = Some(kid.into());
    encode(&header, claims, &key).unwrap()
}

fn claims() -> serde_json::Value {
    serde_json::json!({
        "iss": ISSUER, "aud": AUDIENCE, "email": EMAIL, "email_verified": true,
        "iat": unix_now(), "exp": unix_now() + 3600,
    })
}

/// One valid token per algorithm family.
static TOKENS: LazyLock<[String; 3]> = LazyLock::new(|| {
    [
        sign(Algorithm::RS256, "rsa-1", &claims()),
        sign(Algorithm::PS256, "pss-1", &claims()),
        sign(Algorithm::ES256, "ec-1", &claims()),
    ]
});

fn verifies(token: &str) -> bool {
    RUNTIME.block_on(VERIFIER.verify_claims(token)).is_ok()
}

const CONNECT_AUDIENCE: &str = "https://app.example.com";
const CLIENT_KEY: &str = "a1b2c3d4-client";
const CONNECT_BODY: &[u8] = br#"{"eventType":"uninstalled","clientKey":"a1b2c3d4-client"}"#;

/// An `atlassian-connect` verifier whose one key is already cached (no server is reached: a
/// fetch would fail, and the mutations of `kid` are refused before any fetch or by the cache).
static CONNECT: LazyLock<ConnectVerifier> = LazyLock::new(|| {
    let source: crate::sources::SourceConfig = toml::from_str(&format!(
        "scheme = \"atlassian-connect\"\naudience = {CONNECT_AUDIENCE:?}\n\
         key_url = \"http://127.0.0.1:9/{{kid}}\"\nallow_http_loopback = true"
    ))
    .unwrap();
    let verifier = ConnectVerifier::new(&source);
    let pem = std::fs::read(fixture("atlassian.pub.pem")).unwrap();
    RUNTIME.block_on(verifier.insert_key(
        "connect-1",
        jsonwebtoken::DecodingKey::from_rsa_pem(&pem).unwrap(),
    ));
    verifier
});

static CONNECT_TOKEN: LazyLock<String> = LazyLock::new(|| {
    let pem = std::fs::read(fixture("atlassian.pem")).unwrap();
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("connect-1".into());
    let claims = serde_json::json!({
        "iss": CLIENT_KEY, "aud": CONNECT_AUDIENCE, "iat": unix_now(), "exp": unix_now() + 180,
        "qsh": super::atlassian::qsh("POST", "", "/v1/webhooks/jira", ""),
    });
    encode(&header, &claims, &EncodingKey::from_rsa_pem(&pem).unwrap()).unwrap()
});

fn connect_verifies(token: &str) -> bool {
    let mut headers = HeaderMap::new();
    let Ok(value) = HeaderValue::from_str(&format!("JWT {token}")) else {
        return false;
    };
    headers.insert(header::AUTHORIZATION, value);
    RUNTIME
        .block_on(CONNECT.verify(&headers, "POST", "/v1/webhooks/jira", "", CONNECT_BODY))
        .is_ok()
}

#[test]
fn the_signed_tokens_verify() {
    for token in TOKENS.iter() {
        let r = RUNTIME.block_on(VERIFIER.verify_claims(token));
        assert!(r.is_ok(), "{token}: {r:?}");
    }
    assert!(connect_verifies(&CONNECT_TOKEN));
}

#[test]
fn claims_and_algorithms_outside_the_rules_never_verify() {
    let mut c = claims();
    c["email_verified"] = serde_json::json!("true");
    assert!(
        !verifies(&sign(Algorithm::RS256, "rsa-1", &c)),
        "a string is not true"
    );
    let mut c = claims();
    c.as_object_mut().unwrap().remove("email");
    assert!(
        !verifies(&sign(Algorithm::RS256, "rsa-1", &c)),
        "absent claim"
    );
    // The JWK of `rsa-1` names RS256: the same key under PS256 is refused.
    assert!(!verifies(&sign(Algorithm::PS256, "rsa-1", &claims())));
    // RS384 is not allowed by these rules.
    assert!(!verifies(&sign(Algorithm::RS384, "rsa-1", &claims())));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// One character of a signed `jwt` token replaced by another JWT character never verifies.
    #[test]
    fn a_mutated_jwt_never_verifies(
        which in 0usize..3,
        at in any::<prop::sample::Index>(),
        with in any::<prop::sample::Index>(),
    ) {
        let mut bytes = TOKENS[which].as_bytes().to_vec();
        let i = at.index(bytes.len());
        let c = JWT_CHARS[with.index(JWT_CHARS.len())];
        prop_assume!(bytes[i] != c);
        bytes[i] = c;
        let forged = String::from_utf8(bytes).unwrap();
        prop_assert!(!verifies(&forged), "accepted {forged}");
    }

    /// One character of a signed Atlassian token replaced by another JWT character never verifies.
    #[test]
    fn a_mutated_connect_token_never_verifies(
        at in any::<prop::sample::Index>(),
        with in any::<prop::sample::Index>(),
    ) {
        let mut bytes = CONNECT_TOKEN.as_bytes().to_vec();
        let i = at.index(bytes.len());
        let c = JWT_CHARS[with.index(JWT_CHARS.len())];
        prop_assume!(bytes[i] != c);
        bytes[i] = c;
        let forged = String::from_utf8(bytes).unwrap();
        prop_assert!(!connect_verifies(&forged), "accepted {forged}");
    }

    /// Random JWT-shaped text never verifies under either scheme.
    #[test]
    fn random_tokens_never_verify(segments in proptest::collection::vec("[A-Za-z0-9_-]{0,120}", 1..5)) {
        let token = segments.join(".");
        prop_assert!(!verifies(&token));
        prop_assert!(!connect_verifies(&token));
    }
}
