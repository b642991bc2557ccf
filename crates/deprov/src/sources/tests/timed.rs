//! standard-webhooks and Stripe: vectors, tolerance both ways, rotation, malformed headers.

use axum::http::{HeaderMap, HeaderValue};

use super::*;

// ---- standard-webhooks ----

struct SwVector {
    secret: String,
    id: String,
    ts: i64,
    body: String,
    signature: String,
}

fn sw_vectors() -> Vec<SwVector> {
    let text = fixture("standardwebhooks_vector.txt");
    let sections: Vec<&str> = text.split("## Vector ").skip(1).collect();
    assert_eq!(sections.len(), 2, "vectors A and B");
    sections
        .iter()
        .map(|s| {
            let lines: Vec<&str> = s.lines().collect();
            let body_at = lines.iter().position(|l| l.starts_with("body (")).unwrap();
            SwVector {
                secret: field(s, "secret:").to_owned(),
                id: field(s, "webhook-id:").to_owned(),
                ts: field(s, "webhook-timestamp:").parse().unwrap(),
                body: lines[body_at + 1].to_owned(),
                signature: field(s, "expected webhook-signature:").to_owned(),
            }
        })
        .collect()
}

fn sw_headers(id: &str, ts: i64, sig: &str) -> HeaderMap {
    headers(&[
        ("webhook-id", id),
        ("webhook-timestamp", &ts.to_string()),
        ("webhook-signature", sig),
    ])
}

#[test]
fn standard_webhooks_published_vectors_pass() {
    for v in sw_vectors() {
        let keys = key(Scheme::StandardWebhooks, &v.secret);
        assert_eq!(
            standard_webhooks::sign(&keys[0], &v.id, v.ts, v.body.as_bytes()),
            v.signature
        );
        let h = sw_headers(&v.id, v.ts, &v.signature);
        assert_eq!(
            standard_webhooks::verify(&keys, &h, v.body.as_bytes(), v.ts, TOL),
            Ok(())
        );
        // Within the tolerance either way; one second beyond it is refused.
        assert_eq!(
            standard_webhooks::verify(&keys, &h, v.body.as_bytes(), v.ts + 300, TOL),
            Ok(())
        );
        assert_eq!(
            standard_webhooks::verify(&keys, &h, v.body.as_bytes(), v.ts - 300, TOL),
            Ok(())
        );
        assert_eq!(
            standard_webhooks::verify(&keys, &h, v.body.as_bytes(), v.ts + 301, TOL),
            Err(Reject::Stale(300))
        );
        assert_eq!(
            standard_webhooks::verify(&keys, &h, v.body.as_bytes(), v.ts - 301, TOL),
            Err(Reject::Future(300))
        );
        // Altered body, wrong secret.
        let mut altered = v.body.clone().into_bytes();
        altered.push(b' ');
        assert_eq!(
            standard_webhooks::verify(&keys, &h, &altered, v.ts, TOL),
            Err(Reject::Mismatch)
        );
        let wrong = key(
            Scheme::StandardWebhooks,
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSx",
        );
        assert_eq!(
            standard_webhooks::verify(&wrong, &h, v.body.as_bytes(), v.ts, TOL),
            Err(Reject::Mismatch)
        );
    }
}

#[test]
fn standard_webhooks_documented_edge_cases() {
    let v = &sw_vectors()[1];
    let keys = key(Scheme::StandardWebhooks, &v.secret);
    let body = v.body.as_bytes();
    let check = |sig: &str| {
        standard_webhooks::verify(&keys, &sw_headers(&v.id, v.ts, sig), body, v.ts, TOL)
    };
    let text = fixture("standardwebhooks_vector.txt");
    let wrong = field(&text, "- Wrong signature (must fail):")
        .split_whitespace()
        .next()
        .unwrap();
    assert_eq!(check(wrong), Err(Reject::Mismatch));
    assert_eq!(check("v1,"), Err(Reject::Malformed("webhook-signature")));
    assert_eq!(
        check(&v.signature[..v.signature.len() - 4]),
        Err(Reject::Mismatch),
        "partial"
    );
    let v2_only = v.signature.replace("v1,", "v2,");
    assert_eq!(
        check(&v2_only),
        Err(Reject::Malformed("webhook-signature")),
        "v2 ignored"
    );
    let multi = format!(
        "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,Ceo5 {} v1,Ceo5",
        v.signature
    );
    assert_eq!(check(&multi), Ok(()), "any v1 entry may match");
    assert!(Scheme::StandardWebhooks.derive_key("whsec_").is_err());
    assert!(Scheme::StandardWebhooks.derive_key("").is_err());
    assert!(
        Scheme::StandardWebhooks
            .derive_key("whsec_not base64!")
            .is_err()
    );
    // Missing or malformed headers.
    let no_id = headers(&[
        ("webhook-timestamp", "1614265330"),
        ("webhook-signature", &v.signature),
    ]);
    assert_eq!(
        standard_webhooks::verify(&keys, &no_id, body, v.ts, TOL),
        Err(Reject::Missing("webhook-id"))
    );
    let bad_ts = sw_headers(&v.id, v.ts, &v.signature);
    let mut bad_ts = bad_ts;
    bad_ts.insert("webhook-timestamp", HeaderValue::from_static("16142653a0"));
    assert_eq!(
        standard_webhooks::verify(&keys, &bad_ts, body, v.ts, TOL),
        Err(Reject::Malformed("webhook-timestamp"))
    );
    let mut twice = sw_headers(&v.id, v.ts, &v.signature);
    twice.append(
        "webhook-signature",
        HeaderValue::from_str(&v.signature).unwrap(),
    );
    assert_eq!(
        standard_webhooks::verify(&keys, &twice, body, v.ts, TOL),
        Err(Reject::Repeated("webhook-signature"))
    );
    assert_eq!(
        Reject::Repeated("webhook-signature").to_string(),
        "repeated Webhook-Signature header"
    );
}

#[test]
fn standard_webhooks_agrees_with_the_reference_crate() {
    let now = unix_now();
    for v in sw_vectors() {
        let oracle = standardwebhooks::Webhook::new(&v.secret).unwrap();
        assert_eq!(
            oracle.sign(&v.id, v.ts, v.body.as_bytes()).unwrap(),
            v.signature
        );
        let keys = key(Scheme::StandardWebhooks, &v.secret);
        let ours = standard_webhooks::sign(&keys[0], &v.id, now, v.body.as_bytes());
        let h = sw_headers(&v.id, now, &ours);
        oracle
            .verify(v.body.as_bytes(), &h)
            .expect("the oracle accepts our signature");
        assert_eq!(
            standard_webhooks::verify(&keys, &h, v.body.as_bytes(), now, TOL),
            Ok(())
        );
    }
}

// ---- stripe ----

fn stripe_vector() -> (String, i64, String, String) {
    let text = fixture("stripe_vector.txt");
    let body = text
        .split("-----BEGIN BODY-----\n")
        .nth(1)
        .and_then(|r| r.split("\n-----END BODY-----").next())
        .unwrap()
        .to_owned();
    let header = field(&text, "expected header: Stripe-Signature:").to_owned();
    (
        field(&text, "secret:").to_owned(),
        field(&text, "t:").parse().unwrap(),
        body,
        header,
    )
}

#[test]
fn stripe_vector_passes_and_its_negatives_fail() {
    let (secret, t, body, header) = stripe_vector();
    let keys = key(Scheme::Stripe, &secret);
    assert_eq!(stripe::sign(&keys[0], t, body.as_bytes()), header);
    let h = headers(&[("stripe-signature", &header)]);
    assert_eq!(stripe::verify(&keys, &h, body.as_bytes(), t, TOL), Ok(()));
    assert_eq!(
        stripe::verify(&keys, &h, body.as_bytes(), t + 301, TOL),
        Err(Reject::Stale(300))
    );
    assert_eq!(
        stripe::verify(&keys, &h, body.as_bytes(), t - 301, TOL),
        Err(Reject::Future(300))
    );
    assert_eq!(
        stripe::verify(&keys, &h, b"{}", t, TOL),
        Err(Reject::Mismatch)
    );
    let wrong = key(Scheme::Stripe, "whsec_test_secreT");
    assert_eq!(
        stripe::verify(&wrong, &h, body.as_bytes(), t, TOL),
        Err(Reject::Mismatch)
    );
    // Rotation: several v1 entries (the old secret's first), plus a v0 to ignore.
    let old = stripe::sign(b"whsec_old", t, body.as_bytes());
    let old_v1 = old.split_once(",v1=").unwrap().1;
    let new_v1 = header.split_once(",v1=").unwrap().1;
    let rolled = format!(
        "t={t},v1={old_v1},v1={new_v1},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"
    );
    let h = headers(&[("stripe-signature", &rolled)]);
    assert_eq!(stripe::verify(&keys, &h, body.as_bytes(), t, TOL), Ok(()));
    // Both secrets configured, the delivery signed with either.
    let both = vec![b"whsec_old".to_vec(), keys[0].clone()];
    let h = headers(&[("stripe-signature", &old)]);
    assert_eq!(stripe::verify(&both, &h, body.as_bytes(), t, TOL), Ok(()));
    for bad in [
        "",
        "t=1492774577",
        "v1=abc",
        "t=1492774577,t=1492774577,v1=00",
        "garbage",
        "t=,v1=00",
    ] {
        let h = if bad.is_empty() {
            HeaderMap::new()
        } else {
            headers(&[("stripe-signature", bad)])
        };
        assert!(
            stripe::verify(&keys, &h, body.as_bytes(), t, TOL).is_err(),
            "{bad:?}"
        );
    }
}
