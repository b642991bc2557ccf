//! GitHub, Shopify, Vercel webhooks (no signed timestamp) and Slack: vectors and negatives.

use axum::http::HeaderMap;

use super::*;

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
