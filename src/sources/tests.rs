//! Every published (and locally derived) vector in `tests/fixtures/webhooks/` (a copy of
//! `../shared/fixtures/webhooks/`), each scheme's negative cases, and the standard-webhooks reference
//! crate as an oracle.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::*;

const TOL: Duration = DEFAULT_TOLERANCE;

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/webhooks/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The value after `label` on the first line starting with it (after `from`, if given).
fn field<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?}"))
        .trim()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

fn key(scheme: Scheme, secret: &str) -> Vec<Vec<u8>> {
    vec![scheme.derive_key(secret).unwrap()]
}

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
        Err(Reject::Malformed("webhook-signature"))
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

// ---- github, shopify, vercel, slack ----

#[test]
fn github_published_vector_passes_and_its_negatives_fail() {
    let text = fixture("github_vector.txt");
    let (secret, payload) = (field(&text, "secret:"), field(&text, "payload:"));
    let header = field(&text, "X-Hub-Signature-256:");
    let keys = key(Scheme::Github, secret);
    assert_eq!(github::sign(&keys[0], payload.as_bytes()), header);
    let h = headers(&[("x-hub-signature-256", header)]);
    assert_eq!(github::verify(&keys, &h, payload.as_bytes()), Ok(()));
    assert_eq!(
        github::verify(&keys, &h, b"Hello, World?"),
        Err(Reject::Mismatch)
    );
    assert_eq!(
        github::verify(
            &key(Scheme::Github, "It's a secret to everybody"),
            &h,
            payload.as_bytes()
        ),
        Err(Reject::Mismatch)
    );
    for bad in [
        "sha1=757107ea",
        "sha256=",
        "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        "sha256=zz",
    ] {
        assert_eq!(
            github::verify(
                &keys,
                &headers(&[("x-hub-signature-256", bad)]),
                payload.as_bytes()
            ),
            Err(Reject::Malformed(github::SIGNATURE))
        );
    }
    assert_eq!(
        github::verify(&keys, &HeaderMap::new(), payload.as_bytes()),
        Err(Reject::Missing(github::SIGNATURE))
    );
}

#[test]
fn shopify_vector_passes_and_its_negatives_fail() {
    let text = fixture("shopify_vector.txt");
    let body = fixture("shopify_shop.redact.json");
    assert_eq!(field(&text, "body:"), body);
    let header = field(&text, "X-Shopify-Hmac-Sha256:");
    let keys = key(Scheme::Shopify, field(&text, "secret:"));
    assert_eq!(shopify::sign(&keys[0], body.as_bytes()), header);
    let h = headers(&[("x-shopify-hmac-sha256", header)]);
    assert_eq!(shopify::verify(&keys, &h, body.as_bytes()), Ok(()));
    assert_eq!(
        shopify::verify(&keys, &h, format!("{body}\n").as_bytes()),
        Err(Reject::Mismatch)
    );
    assert_eq!(
        shopify::verify(&key(Scheme::Shopify, "hush!"), &h, body.as_bytes()),
        Err(Reject::Mismatch)
    );
    let short = headers(&[("x-shopify-hmac-sha256", "1ZkWm9gpyI+Zsjon2nUm8nnAH7b3L7Sl")]);
    assert_eq!(
        shopify::verify(&keys, &short, body.as_bytes()),
        Err(Reject::Malformed(shopify::SIGNATURE))
    );
}

#[test]
fn vercel_vectors_pass_and_their_negatives_fail() {
    let text = fixture("vercel_vector.txt");
    let keys = key(Scheme::VercelWebhook, field(&text, "secret:"));
    let new_body = fixture("vercel_integration-configuration.removed.json");
    let old_body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("# body (LF"))
        .skip(1)
        .take_while(|l| l.starts_with("# "))
        .map(|l| &l[2..])
        .collect::<Vec<_>>()
        .join("\n");
    let sigs = [
        field(&text, "expected x-vercel-signature:"),
        field(&text, "expected x-vercel-signature (old body):"),
    ];
    for (body, sig) in [(new_body.as_str(), sigs[0]), (old_body.as_str(), sigs[1])] {
        assert_eq!(vercel::sign(&keys[0], body.as_bytes()), sig);
        let h = headers(&[("x-vercel-signature", sig)]);
        assert_eq!(vercel::verify(&keys, &h, body.as_bytes()), Ok(()));
        assert_eq!(
            vercel::verify(&keys, &h, body.trim().as_bytes()).is_ok(),
            body.trim() == body
        );
    }
    let h = headers(&[("x-vercel-signature", sigs[0])]);
    assert_eq!(
        vercel::verify(&keys, &h, old_body.as_bytes()),
        Err(Reject::Mismatch)
    );
    let upper = headers(&[(
        "x-vercel-signature",
        "83d53d644f6504de716eea275039e8bddd870be",
    )]);
    assert_eq!(
        vercel::verify(&keys, &upper, new_body.as_bytes()),
        Err(Reject::Malformed(vercel::SIGNATURE))
    );
}

/// Slack's own example (api.slack.com/authentication/verifying-requests-from-slack); the copy with its
/// source is `tests/fixtures/webhooks/slack_vector.txt`.
#[test]
fn slack_published_vector_passes_and_its_negatives_fail() {
    let text = fixture("slack_vector.txt");
    let (secret, body) = (field(&text, "signing secret:"), field(&text, "body:"));
    let ts: i64 = field(&text, "X-Slack-Request-Timestamp:").parse().unwrap();
    let sig = field(&text, "X-Slack-Signature:");
    let keys = key(Scheme::Slack, secret);
    assert_eq!(slack::sign(&keys[0], ts, body.as_bytes()), sig);
    let h = headers(&[
        ("x-slack-signature", sig),
        ("x-slack-request-timestamp", &ts.to_string()),
    ]);
    assert_eq!(
        slack::verify(&keys, &h, body.as_bytes(), ts + 10, TOL),
        Ok(())
    );
    assert_eq!(
        slack::verify(&keys, &h, body.as_bytes(), ts + 301, TOL),
        Err(Reject::Stale(300))
    );
    assert_eq!(
        slack::verify(&keys, &h, body.as_bytes(), ts - 301, TOL),
        Err(Reject::Future(300))
    );
    assert_eq!(
        slack::verify(&keys, &h, &body.as_bytes()[1..], ts, TOL),
        Err(Reject::Mismatch)
    );
    let h = headers(&[("x-slack-signature", sig)]);
    assert_eq!(
        slack::verify(&keys, &h, body.as_bytes(), ts, TOL),
        Err(Reject::Missing(slack::TIMESTAMP))
    );
}

// ---- configuration ----

/// `text` (source tables) with every secret list pointed at one file, plus a `[tenant]`, parsed.
fn with_secret_files(text: &str) -> crate::config::Config {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD\n").unwrap();
    let file_line = format!("secret_file = [{:?}]", secret.display().to_string());
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("secret_env") || l.starts_with("secret_file") {
                file_line.clone()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let tenant = if text.contains("[tenant]") {
        ""
    } else {
        "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n"
    };
    crate::config::Config::from_toml(&format!("{text}\n{tenant}")).unwrap()
}

/// The README's `[sources.NAME]` entries (section "Signed senders"), with each secret list pointed
/// at a file, are a valid configuration with the documented defaults.
#[test]
fn the_readme_entries_are_valid_configuration() {
    let readme = include_str!("../../README.md");
    let section = readme.split("## Signed senders").nth(1).unwrap();
    let block = section
        .split("```toml\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let config = with_secret_files(block);
    let schemes: Vec<Scheme> = config.sources.values().map(|s| s.scheme).collect();
    for scheme in [
        Scheme::StandardWebhooks,
        Scheme::Stripe,
        Scheme::Github,
        Scheme::Shopify,
        Scheme::Slack,
        Scheme::VercelWebhook,
        Scheme::VercelOidc,
    ] {
        assert!(schemes.contains(&scheme), "README has no {scheme:?} entry");
    }
    let acme = &config.sources["acme"];
    assert_eq!(acme.keys.0.len(), 1);
    assert_eq!(acme.tolerance(), DEFAULT_TOLERANCE);
    assert_eq!(format!("{:?}", acme.keys), "Keys(1 redacted)");
    assert!(
        !format!("{config:?}").contains("C2FVsBQIhrscChlQIMV"),
        "secrets never in Debug"
    );
    assert_eq!(config.sources["vercel-hooks"].dedup, Dedup::Tenant);
}

#[test]
fn bad_source_entries_are_named() {
    let base = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";
    let cases = [
        (
            "scheme = \"stripe\"\ntenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]",
            "sources.s.secret_env",
        ),
        (
            "scheme = \"stripe\"\nsecret_env = [\"DEPROV_TEST_UNSET_VAR_7\"]\ntenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]",
            "DEPROV_TEST_UNSET_VAR_7",
        ),
        (
            "scheme = \"stripe\"\nsecret_file = [\"/nonexistent/x\"]\ntenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]",
            "sources.s.secret_file",
        ),
        (
            "scheme = \"github\"\ntoken = \"0123456789abcdef0\"",
            "sources.s.token",
        ),
        (
            "scheme = \"vercel-oidc\"\nissuer = \"i\"\naudience = \"a\"",
            "sources.s.jwks_url",
        ),
        ("scheme = \"smtp\"", "smtp"),
        (
            "token = \"0123456789abcdef0\"\ntolerance = \"5m\"",
            "sources.s.tolerance",
        ),
    ];
    for (entry, key) in cases {
        let err = crate::config::Config::from_toml(&format!("[sources.s]\n{entry}\n{base}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{entry:?} -> {err}");
    }
}

/// `deploy/example.toml` with its commented signed senders uncommented is valid too.
#[test]
fn the_example_signed_senders_are_valid_once_uncommented() {
    let example = include_str!("../../deploy/example.toml")
        .replace(
            "token_env = \"DEPROV_BILLING_TOKEN\"",
            "token = \"billing-token-0123456789\"",
        )
        .replace(
            "token_env = \"DEPROV_VERCEL_TOKEN\"",
            "token = \"vercel-token-0123456789\"",
        );
    let mut out = Vec::new();
    let mut in_block = false;
    for line in example.lines() {
        if line.starts_with("# [sources.") {
            in_block = true;
        }
        match line
            .strip_prefix("# ")
            .or_else(|| (line == "#").then_some(""))
        {
            Some(rest) if in_block => out.push(rest.to_owned()),
            _ => {
                in_block = false;
                out.push(line.to_owned());
            }
        }
    }
    let config = with_secret_files(&out.join("\n"));
    for name in ["stripe", "github", "vercel-hooks"] {
        assert!(config.sources[name].scheme.is_hmac(), "{name}");
    }
}
