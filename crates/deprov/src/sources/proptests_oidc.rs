//! Property tests of `vercel-oidc`: the `Authorization: Bearer` parser and the JWT verifier take
//! arbitrary bytes without panicking and accept nothing but the token the key signed — a random
//! token, or the signed one with any single character changed, never verifies.

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderValue, header};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use proptest::prelude::*;

use super::oidc::{JwksSource, OidcVerifier};
use super::unix_now;
use crate::http::auth::bearer;

const ISSUER: &str = "https://marketplace.vercel.com";
const AUDIENCE: &str = "oac_9f4YG9JFjgKkRlxoaaGG0y05";
/// The characters of a JWT (base64url and the two dots).
const JWT_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.";

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/oidc/{name}", env!("CARGO_MANIFEST_DIR"))
}

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
});

/// A verifier over the fixture JWKS (`kid` `key-a`).
static VERIFIER: LazyLock<OidcVerifier> =
    LazyLock::new(|| OidcVerifier::new(JwksSource::File(fixture("jwks-a.json")), ISSUER, AUDIENCE));

/// A token signed by `key-a.pem`, valid for an hour.
static TOKEN: LazyLock<String> = LazyLock::new(|| {
    let pem = std::fs::read(fixture("key-a.pem")).unwrap();
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("key-a".into());
    let claims = serde_json::json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "account:1:user:2",
        "installation_id": "icfg_1", "iat": unix_now(), "exp": unix_now() + 3600,
    });
    encode(&header, &claims, &EncodingKey::from_rsa_pem(&pem).unwrap()).unwrap()
});

fn verifies(token: &str) -> bool {
    RUNTIME.block_on(VERIFIER.verify(token)).is_ok()
}

#[test]
fn the_signed_token_verifies() {
    assert!(verifies(&TOKEN));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary `Authorization` bytes: `bearer` never panics, and what it returns never verifies.
    #[test]
    fn arbitrary_authorization_headers_never_verify(
        raw in proptest::collection::vec(any::<u8>(), 0..400),
        prefix in prop::sample::select(vec!["", "Bearer ", "bearer ", "Basic "]),
    ) {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_bytes(&[prefix.as_bytes(), &raw].concat()) {
            headers.insert(header::AUTHORIZATION, value);
        }
        if let Some(token) = bearer(&headers) {
            prop_assert!(!verifies(token));
        }
    }

    /// Random JWT-shaped text (three base64url segments, or the real header and payload with a
    /// random signature) never verifies.
    #[test]
    fn random_tokens_never_verify(
        segments in proptest::collection::vec("[A-Za-z0-9_-]{0,120}", 1..5),
        signature in "[A-Za-z0-9_-]{0,400}",
    ) {
        prop_assert!(!verifies(&segments.join(".")));
        let (signed, _) = TOKEN.rsplit_once('.').unwrap();
        let resigned = format!("{signed}.{signature}");
        prop_assert!(!verifies(&resigned), "accepted {}", resigned);
    }

    /// The signed token with one character replaced by another JWT character — in its header,
    /// claims or signature — never verifies.
    #[test]
    fn a_mutated_token_never_verifies(
        at in any::<prop::sample::Index>(),
        with in any::<prop::sample::Index>(),
    ) {
        let mut bytes = TOKEN.as_bytes().to_vec();
        let i = at.index(bytes.len());
        let c = JWT_CHARS[with.index(JWT_CHARS.len())];
        prop_assume!(bytes[i] != c);
        bytes[i] = c;
        let forged = String::from_utf8(bytes).unwrap();
        prop_assert!(!verifies(&forged), "accepted {forged}");
    }
}
