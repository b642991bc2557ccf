//! The signer against the Standard Webhooks spec's published vectors and the reference crate, and
//! the retry delays.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::{retry_delay, signed_headers};
use crate::sources::standard_webhooks;

const VECTORS: &str = include_str!("../../../tests/fixtures/webhooks/standardwebhooks_vector.txt");

/// (secret, id, timestamp, body, expected signature) of vectors A and B.
fn vectors() -> Vec<(String, String, i64, String, String)> {
    let field = |s: &str, name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .to_owned()
    };
    let sections: Vec<&str> = VECTORS.split("## Vector ").skip(1).collect();
    assert_eq!(sections.len(), 2, "vectors A and B");
    sections
        .iter()
        .map(|s| {
            let lines: Vec<&str> = s.lines().collect();
            let body_at = lines.iter().position(|l| l.starts_with("body (")).unwrap();
            (
                field(s, "secret:"),
                field(s, "webhook-id:"),
                field(s, "webhook-timestamp:").parse().unwrap(),
                lines[body_at + 1].to_owned(),
                field(s, "expected webhook-signature:"),
            )
        })
        .collect()
}

fn header_map(headers: &[(&'static str, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

#[test]
fn signed_headers_match_the_published_vectors() {
    for (secret, id, ts, body, expected) in vectors() {
        let key = standard_webhooks::derive_key(&secret).unwrap();
        let headers = signed_headers(&key, &id, ts, body.as_bytes());
        assert_eq!(headers[0], ("webhook-id", id.clone()));
        assert_eq!(headers[1], ("webhook-timestamp", ts.to_string()));
        assert_eq!(headers[2], ("webhook-signature", expected));
        // The repo's verifier and the reference crate accept them.
        let map = header_map(&headers);
        assert_eq!(
            standard_webhooks::verify(
                std::slice::from_ref(&key),
                &map,
                body.as_bytes(),
                ts,
                Duration::from_secs(300)
            ),
            Ok(())
        );
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let fresh = header_map(&signed_headers(&key, &id, now, body.as_bytes()));
        standardwebhooks::Webhook::new(&secret)
            .unwrap()
            .verify(body.as_bytes(), &fresh)
            .expect("the reference crate accepts our signature");
        // One byte of the body changed: refused.
        let tampered = body.replace('"', "'");
        assert!(
            standard_webhooks::verify(
                &[key],
                &map,
                tampered.as_bytes(),
                ts,
                Duration::from_secs(300)
            )
            .is_err()
        );
    }
}

#[test]
fn retry_delays_double_up_to_the_cap_within_the_jitter() {
    let base = Duration::from_millis(100);
    let max = Duration::from_secs(1);
    for _ in 0..200 {
        for (attempt, full) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (30, 1000),
        ] {
            let d = retry_delay(attempt, base, max, 0.25);
            let full = Duration::from_millis(full);
            assert!(
                d <= full && d >= full.mul_f64(0.75),
                "attempt {attempt}: {d:?}"
            );
        }
    }
    assert_eq!(retry_delay(3, base, max, 0.0), Duration::from_millis(400));
}

/// The README's example delivery verifies, and its body is exactly how the dispatcher serializes it
/// (compact, keys sorted).
#[test]
fn the_readme_example_delivery_verifies_and_is_serialized_as_sent() {
    let readme = include_str!("../../../../../README.md");
    let start = readme.find("POST /deprov-events").expect("the example");
    let block: Vec<&str> = readme[start..]
        .lines()
        .take_while(|l| *l != "```")
        .collect();
    let header = |name: &str| {
        block
            .iter()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
            .unwrap()
            .to_owned()
    };
    let secret = readme[..start]
        .rsplit("test secret `")
        .next()
        .and_then(|s| s.split('`').next())
        .unwrap();
    let body = block.last().unwrap().as_bytes();
    let key = standard_webhooks::derive_key(secret).unwrap();
    let ts: i64 = header("webhook-timestamp").parse().unwrap();
    let sent = signed_headers(&key, &header("webhook-id"), ts, body);
    assert_eq!(sent[2].1, header("webhook-signature"));
    let value: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(serde_json::to_vec(&value).unwrap(), body);
}
