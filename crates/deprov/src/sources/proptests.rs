//! Property tests: the signature-header parsers and payload extraction take arbitrary bytes without
//! panicking, and no header built without the secret is accepted (no forgery), while a correctly
//! signed delivery always is.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;

use super::settings::{Dedup, Locator, Scheme, SourceConfig};
use super::*;

const TOL: Duration = DEFAULT_TOLERANCE;
const NOW: i64 = 1_700_000_000;
const SECRET: &[u8] = b"the-real-secret";

fn map(pairs: &[(&str, Vec<u8>)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            h.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), v);
        }
    }
    h
}

const HMAC_SCHEMES: [Scheme; 6] = [
    Scheme::StandardWebhooks,
    Scheme::Stripe,
    Scheme::Github,
    Scheme::Shopify,
    Scheme::Slack,
    Scheme::VercelWebhook,
];

/// A correctly signed delivery's headers for `scheme`.
fn signed(scheme: Scheme, key: &[u8], body: &[u8]) -> HeaderMap {
    let s = |v: String| v.into_bytes();
    match scheme {
        Scheme::StandardWebhooks => map(&[
            ("webhook-id", s("msg_1".into())),
            ("webhook-timestamp", s(NOW.to_string())),
            (
                "webhook-signature",
                s(standard_webhooks::sign(key, "msg_1", NOW, body)),
            ),
        ]),
        Scheme::Stripe => map(&[("stripe-signature", s(stripe::sign(key, NOW, body)))]),
        Scheme::Github => map(&[("x-hub-signature-256", s(github::sign(key, body)))]),
        Scheme::Shopify => map(&[("x-shopify-hmac-sha256", s(shopify::sign(key, body)))]),
        Scheme::Slack => map(&[
            ("x-slack-request-timestamp", s(NOW.to_string())),
            ("x-slack-signature", s(slack::sign(key, NOW, body))),
        ]),
        Scheme::VercelWebhook => map(&[("x-vercel-signature", s(vercel::sign(key, body)))]),
        Scheme::Bearer
        | Scheme::VercelOidc
        | Scheme::Basic
        | Scheme::Jwt
        | Scheme::AtlassianConnect
        | Scheme::AwsSns => HeaderMap::new(),
    }
}

/// Every header name any scheme reads.
const NAMES: [&str; 8] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "stripe-signature",
    "x-hub-signature-256",
    "x-shopify-hmac-sha256",
    "x-slack-signature",
    "x-vercel-signature",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parsers_take_arbitrary_text(value in ".{0,300}") {
        let _ = standard_webhooks::parse_signatures(&value);
        let _ = stripe::parse(&value);
        let _ = github::parse(&value);
        let _ = shopify::parse(&value);
        let _ = slack::parse(&value);
        let _ = vercel::parse(&value);
        let _ = check_timestamp(&value, "t", NOW, TOL);
    }

    /// Arbitrary header bytes (with or without a plausible prefix) under every name: nothing panics
    /// and nothing verifies, since none was computed with the secret.
    #[test]
    fn arbitrary_headers_never_verify(
        values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), NAMES.len()),
        prefix in prop::sample::select(vec!["", "v1,", "sha256=", "v0=", "t=1700000000,v1="]),
        body in proptest::collection::vec(any::<u8>(), 0..200),
        ts in prop::sample::select(vec![NOW.to_string(), String::new(), "-1".into(), "99999999999999999999".into()]),
    ) {
        let mut pairs: Vec<(&str, Vec<u8>)> = NAMES
            .iter()
            .zip(values)
            .map(|(n, v)| (*n, [prefix.as_bytes(), &v].concat()))
            .collect();
        pairs.push(("webhook-timestamp", ts.clone().into_bytes()));
        pairs.push(("x-slack-request-timestamp", ts.into_bytes()));
        let h = map(&pairs);
        let keys = vec![SECRET.to_vec()];
        for scheme in HMAC_SCHEMES {
            prop_assert!(verify_hmac(scheme, &keys, &h, &body, NOW, TOL).is_err(), "{scheme:?} accepted a forgery");
        }
    }

    /// A delivery signed with the secret verifies; one bit flipped in the body, or a different key,
    /// never does.
    #[test]
    fn signed_verifies_and_any_change_does_not(
        body in proptest::collection::vec(any::<u8>(), 1..300),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
        other in proptest::collection::vec(any::<u8>(), 1..40),
    ) {
        let keys = vec![SECRET.to_vec()];
        for scheme in HMAC_SCHEMES {
            let h = signed(scheme, SECRET, &body);
            prop_assert_eq!(verify_hmac(scheme, &keys, &h, &body, NOW, TOL), Ok(()));
            let mut altered = body.clone();
            altered[flip.index(body.len())] ^= 1 << bit;
            prop_assert_eq!(verify_hmac(scheme, &keys, &h, &altered, NOW, TOL), Err(Reject::Mismatch));
            if other != SECRET {
                prop_assert_eq!(verify_hmac(scheme, std::slice::from_ref(&other), &h, &body, NOW, TOL), Err(Reject::Mismatch));
            }
        }
    }

    /// A correctly signed delivery with one byte of one of its signed or signature headers replaced
    /// by another visible ASCII byte never verifies — unless the change is only a letter's case
    /// (hex digits and `v1`/`t` keys read case-insensitively or not at all: the same signature).
    #[test]
    fn a_mutated_signature_or_signed_header_never_verifies(
        body in proptest::collection::vec(any::<u8>(), 0..200),
        which in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        byte in 0x20u8..0x7f,
    ) {
        let keys = vec![SECRET.to_vec()];
        for scheme in HMAC_SCHEMES {
            let h = signed(scheme, SECRET, &body);
            let names: Vec<&HeaderName> = h.keys().collect();
            let name = names[which.index(names.len())].clone();
            let value = h[&name].as_bytes().to_vec();
            let mut mutated = value.clone();
            let i = at.index(value.len());
            prop_assume!(mutated[i] != byte);
            mutated[i] = byte;
            let mut forged = h.clone();
            forged.insert(name.clone(), HeaderValue::from_bytes(&mutated).unwrap());
            let verdict = verify_hmac(scheme, &keys, &forged, &body, NOW, TOL);
            if !mutated.eq_ignore_ascii_case(&value) {
                prop_assert!(verdict.is_err(), "{scheme:?}: {name} {:?} accepted", String::from_utf8_lossy(&mutated));
            }
        }
    }

    /// Extraction from arbitrary bytes and arbitrary pointers/headers, under every locator, event
    /// override and dedup setting, never panics and only yields usable values (1..=256 characters,
    /// no control characters).
    #[test]
    fn extraction_takes_arbitrary_bytes(
        body in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            "\\{\"type\":\".{0,20}\",\"data\":\\{\"id\":(\".{0,300}\"|[0-9]{1,30}|null|\\[\\]|1\\.5)\\}\\}".prop_map(String::into_bytes),
        ],
        pointer in "(/[a-z~0-9]{0,6}){0,4}",
        header in proptest::collection::vec(any::<u8>(), 0..300),
        dedup in prop_oneof![
            Just(Dedup::Delivery),
            Just(Dedup::Tenant),
            "(/[a-z~0-9]{0,6}){0,4}".prop_map(Dedup::Pointer),
            Just(Dedup::Header("x-tenant".into())),
        ],
        event in prop_oneof![
            Just(None),
            Just(Some(Locator::Header("x-tenant".into()))),
            "(/[a-z~0-9]{0,6}){0,4}".prop_map(|p| Some(Locator::Pointer(p))),
        ],
    ) {
        let h = map(&[
            ("x-tenant", header.clone()),
            ("x-shopify-topic", header.clone()),
            ("x-github-event", header.clone()),
            ("x-github-delivery", header.clone()),
            ("x-shopify-event-id", header.clone()),
            ("webhook-id", header),
        ]);
        for scheme in HMAC_SCHEMES {
            for tenant in [Locator::Pointer(pointer.clone()), Locator::Pointer("/data/id".into()), Locator::Header("x-tenant".into())] {
                let source = SourceConfig {
                    scheme,
                    tenant: Some(tenant),
                    delete_events: vec!["account.deleted".into()],
                    dedup: dedup.clone(),
                    event: event.clone(),
                    ..minimal()
                };
                let d = payload::extract(&source, &h, &body);
                for v in [&d.tenant, &d.dedup, &d.event].into_iter().flatten() {
                    prop_assert!(!v.is_empty() && v.chars().count() <= 256 && !v.chars().any(char::is_control), "{v:?}");
                }
            }
        }
    }
}

fn minimal() -> SourceConfig {
    toml::from_str::<SourceConfig>("").unwrap()
}
