//! `POST /v1/webhooks/{source}`: every scheme end to end, with the fixtures' documented payloads.

use std::time::{Duration, Instant};

use deprov::sources::{github, unix_now};
use reqwest::StatusCode;

use crate::helpers::{MAX_BODY, assert_problem};
use crate::signed::*;

#[tokio::test]
async fn every_scheme_records_its_fixture_once_and_a_replay_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, false).await;
    for (delivery, kind, subject) in deleting_deliveries() {
        let first = answer(app.deliver(&delivery).await, StatusCode::ACCEPTED).await;
        assert_eq!(
            (first["outcome"].as_str(), first["duplicate"].as_bool()),
            (Some("recorded"), Some(false)),
            "{first}"
        );
        let again = answer(app.deliver(&delivery).await, StatusCode::ACCEPTED).await;
        assert_eq!(
            again["duplicate"], true,
            "{}: a replay is a duplicate",
            delivery.source
        );
        assert_eq!(
            (&again["request_id"], &again["job_id"]),
            (&first["request_id"], &first["job_id"])
        );
        let (k, s, source, dups): (String, String, String, i32) = sqlx::query_as(
            "SELECT j.subject_kind, j.subject, r.source, r.duplicates FROM deprov.deletion_requests r \
             JOIN deprov.jobs j ON j.id = r.job_id WHERE r.id = $1::text::uuid",
        )
        .bind(first["request_id"].as_str().unwrap())
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert_eq!(
            (k.as_str(), s.as_str(), source.as_str(), dups),
            (kind, subject, delivery.source, 1)
        );
    }
    assert_eq!(
        (
            app.count_jobs().await,
            app.count_requests().await,
            app.count_ignored().await
        ),
        (6, 6, 0)
    );
}

#[tokio::test]
async fn the_untimed_published_vectors_verify_over_http_and_the_timed_ones_are_now_stale() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, false).await;
    // GitHub's published vector: body "Hello, World!". It verifies (a wrong signature is 401), and
    // then, not being JSON, cannot be read for GitHub's `action`: 400, nothing stored.
    let text = String::from_utf8(fixture("github_vector.txt")).unwrap();
    let sig = text
        .lines()
        .find_map(|l| l.strip_prefix("X-Hub-Signature-256: "))
        .unwrap();
    let gh = Delivery {
        source: "github",
        headers: vec![
            ("X-GitHub-Event", "ping".into()),
            ("X-GitHub-Delivery", "d-1".into()),
            ("X-Hub-Signature-256", sig.into()),
        ],
        body: b"Hello, World!".to_vec(),
    };
    let p = assert_problem(app.deliver(&gh).await, StatusCode::BAD_REQUEST).await;
    assert!(
        p["detail"].as_str().unwrap().contains("not valid JSON"),
        "{p}"
    );
    // Shopify's and Vercel's vectors, exact bytes and signatures.
    let text = String::from_utf8(fixture("shopify_vector.txt")).unwrap();
    let sig = text
        .lines()
        .find_map(|l| l.strip_prefix("X-Shopify-Hmac-Sha256: "))
        .unwrap();
    let mut shop = shopify_delivery("shop/redact", "evt-v", &fixture("shopify_shop.redact.json"));
    shop.headers[3].1 = sig.to_owned();
    answer(app.deliver(&shop).await, StatusCode::ACCEPTED).await;
    let text = String::from_utf8(fixture("vercel_vector.txt")).unwrap();
    let sig = text
        .lines()
        .find_map(|l| l.strip_prefix("expected x-vercel-signature: "))
        .unwrap();
    let mut hook = vercel_delivery(&fixture("vercel_integration-configuration.removed.json"));
    hook.headers[0].1 = sig.to_owned();
    answer(app.deliver(&hook).await, StatusCode::ACCEPTED).await;
    assert_eq!(
        (
            app.count_jobs().await,
            app.count_requests().await,
            app.count_ignored().await
        ),
        (2, 2, 0)
    );
    // The timestamped vectors (2021, 2017, 2018) verify only at their own time: here they are stale.
    let b = br#"{"test": 2432232314}"#;
    let sw = Delivery {
        source: "acme",
        headers: vec![
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek".into()),
            ("webhook-timestamp", "1614265330".into()),
            (
                "webhook-signature",
                "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".into(),
            ),
        ],
        body: b.to_vec(),
    };
    let p = assert_problem(app.deliver(&sw).await, StatusCode::UNAUTHORIZED).await;
    assert!(p["detail"].as_str().unwrap().contains("too old"), "{p}");
    assert_eq!(
        (
            app.count_jobs().await,
            app.count_requests().await,
            app.count_ignored().await
        ),
        (2, 2, 0)
    );
}

/// Each way a delivery can be wrong, per scheme: 401 problem+json, nothing stored.
/// Seconds past now of the "future" deliveries: beyond the 300 s tolerance by a minute, so that the
/// seconds a loaded machine takes between building a delivery and checking it cannot bring it back
/// inside (the stale ones, at now - 301, only get staler).
const FUTURE: i64 = 360;

#[tokio::test]
async fn forged_altered_stale_future_and_malformed_deliveries_are_401_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, false).await;
    let now = unix_now();
    let mut bad: Vec<(String, Delivery)> = Vec::new();
    for (good, _, _) in deleting_deliveries() {
        let mut altered = good.clone();
        altered.body.push(b' ');
        bad.push(("altered body".into(), altered));
        for (i, (name, _)) in good.headers.iter().enumerate() {
            let lower = name.to_ascii_lowercase();
            let is_sig = lower.contains("signature") || lower.contains("hmac");
            if !is_sig && !lower.contains("timestamp") {
                continue;
            }
            let mut missing = good.clone();
            missing.headers.remove(i);
            bad.push((format!("{name} missing"), missing));
            let mut empty = good.clone();
            empty.headers[i].1 = String::new();
            bad.push((format!("{name} empty"), empty));
            let mut malformed = good.clone();
            malformed.headers[i].1 = "v1,,=sha256=t=%%".into();
            bad.push((format!("{name} malformed"), malformed));
        }
    }
    let acme = br#"{"type":"account.deleted","data":{"id":"acct_42"}}"#;
    bad.push((
        "wrong secret".into(),
        sw_delivery("whsec_dGhlIHdyb25nIHNlY3JldA==", "msg_1", now, acme),
    ));
    bad.push((
        "stale".into(),
        sw_delivery(SW_SECRET, "msg_1", now - 301, acme),
    ));
    bad.push((
        "future".into(),
        sw_delivery(SW_SECRET, "msg_1", now + FUTURE, acme),
    ));
    let stripe_body = fixture("stripe_customer.deleted.json");
    bad.push((
        "stripe stale".into(),
        stripe_delivery(now - 301, &stripe_body),
    ));
    bad.push((
        "stripe future".into(),
        stripe_delivery(now + FUTURE, &stripe_body),
    ));
    bad.push((
        "slack stale".into(),
        slack_delivery(now - 301, &slack_uninstall()),
    ));
    bad.push((
        "slack future".into(),
        slack_delivery(now + FUTURE, &slack_uninstall()),
    ));
    let mut wrong = github_delivery(
        "installation",
        "d",
        &fixture("github_installation.deleted.json"),
    );
    wrong.headers[2].1 = github::sign(b"It's a secret to everybody", &wrong.body);
    bad.push(("github wrong secret".into(), wrong));
    let mut unknown = stripe_delivery(now, &stripe_body);
    unknown.source = "nobody";
    bad.push(("unknown source".into(), unknown));
    let mut bearer = stripe_delivery(now, &stripe_body);
    bearer.source = "vercel";
    bad.push((
        "a bearer source without tenant config and token".into(),
        bearer,
    ));
    for (what, delivery) in &bad {
        let response = app.deliver(delivery).await;
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{}: {what}",
            delivery.source
        );
        assert_problem(response, StatusCode::UNAUTHORIZED).await;
    }
    assert_eq!(bad.len(), 40, "every case was built");
    app.assert_nothing_stored_at_all().await;
}

#[tokio::test]
async fn other_event_types_are_acknowledged_recorded_as_ignored_and_start_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, false).await;
    let now = unix_now();
    let example = fixture("standardwebhooks_example.json");
    let ignored = [
        sw_delivery(SW_SECRET, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", now, &example),
        shopify_delivery(
            "customers/redact",
            "evt-c-1",
            &fixture("shopify_customers.redact.json"),
        ),
    ];
    for d in &ignored {
        let first = answer(app.deliver(d).await, StatusCode::OK).await;
        assert_eq!(
            (first["outcome"].as_str(), first["duplicate"].as_bool()),
            (Some("ignored"), Some(false)),
            "{first}"
        );
        let again = answer(app.deliver(d).await, StatusCode::OK).await;
        assert_eq!(
            (again["duplicate"].as_bool(), &again["request_id"]),
            (Some(true), &first["request_id"])
        );
    }
    let rows: Vec<(String, Option<String>, i32)> = sqlx::query_as(
        "SELECT source, event_type, duplicates FROM deprov.ignored_deliveries ORDER BY source",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            ("acme".into(), Some("contact.created".into()), 1),
            ("shopify".into(), Some("customers/redact".into()), 1)
        ]
    );
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn a_verified_body_that_is_not_json_is_400_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, false).await;
    // A delete event cut short: signed correctly, but unreadable.
    let body = br#"{"type":"account.deleted","data":{"id":"43"}"#;
    let d = sw_delivery(SW_SECRET, "msg_truncated", unix_now(), body);
    let res = app.deliver(&d).await;
    let problem = assert_problem(res, StatusCode::BAD_REQUEST).await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{problem}"
    );
    // Valid JSON that is not an object has no event type either: an array holding a delete event
    // must not be acknowledged as ignored.
    for (i, body) in [
        &br#"[{"type":"account.deleted","data":{"id":"43"}}]"#[..],
        b"null",
        br#""account.deleted""#,
    ]
    .into_iter()
    .enumerate()
    {
        let d = sw_delivery(SW_SECRET, &format!("msg_not_object_{i}"), unix_now(), body);
        let problem = assert_problem(app.deliver(&d).await, StatusCode::BAD_REQUEST).await;
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("not a JSON object"),
            "{problem}"
        );
    }
    app.assert_nothing_stored_at_all().await;
}

#[tokio::test]
async fn a_reused_or_unusable_delivery_id_is_422_in_the_senders_terms() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, false).await;
    let now = unix_now();
    let first = sw_delivery(
        SW_SECRET,
        "msg_1",
        now,
        br#"{"type":"account.deleted","data":{"id":"acct_1"}}"#,
    );
    answer(app.deliver(&first).await, StatusCode::ACCEPTED).await;
    let reused = sw_delivery(
        SW_SECRET,
        "msg_1",
        now,
        br#"{"type":"account.deleted","data":{"id":"acct_2"}}"#,
    );
    let p = assert_problem(app.deliver(&reused).await, StatusCode::UNPROCESSABLE_ENTITY).await;
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("deduplication key") && detail.contains("different body"),
        "{p}"
    );
    let long_id = "m".repeat(300);
    let long = sw_delivery(
        SW_SECRET,
        &long_id,
        now,
        br#"{"type":"account.deleted","data":{"id":"acct_3"}}"#,
    );
    let p = assert_problem(app.deliver(&long).await, StatusCode::UNPROCESSABLE_ENTITY).await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("longer than 256 characters"),
        "{p}"
    );
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

#[tokio::test]
async fn slack_url_verification_echoes_the_challenge_and_a_large_body_is_413() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, false).await;
    let body = br#"{"token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let a = answer(
        app.deliver(&slack_delivery(unix_now(), body)).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        a["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );
    let big = vec![b' '; MAX_BODY + 1];
    assert_problem(
        app.deliver(&vercel_delivery(&big)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
    )
    .await;
    app.assert_nothing_stored_at_all().await;
}

/// A source with `tenant_lookup`: the worker resolves the value on the target, as for Vercel.
#[tokio::test]
async fn the_worker_resolves_a_lookup_source_and_deletes_the_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, true).await;
    sqlx::query(
        "INSERT INTO app.accounts (id, installation_id) VALUES (7, 'my_config_id'), (8, 'other')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let a = answer(
        app.deliver(&vercel_delivery(&fixture(
            "vercel_integration-configuration.removed.json",
        )))
        .await,
        StatusCode::ACCEPTED,
    )
    .await;
    let job = a["job_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.job_state(&job).await != "completed" {
        assert!(
            Instant::now() < deadline,
            "job {job} did not complete: {}",
            app.job_state(&job).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (kind, tenant): (String, Option<String>) =
        sqlx::query_as("SELECT subject_kind, tenant_id FROM deprov.jobs WHERE id = $1::text::uuid")
            .bind(&job)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((kind.as_str(), tenant.as_deref()), ("tenant", Some("7")));
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM app.accounts ORDER BY id")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(left, vec![8]);
}

/// A sender retrying the same delivery 20 times at once: one request, one job.
#[tokio::test]
async fn twenty_concurrent_copies_of_a_delivery_are_one_request_and_one_job() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, false).await;
    let delivery = stripe_delivery(unix_now(), &fixture("stripe_customer.deleted.json"));
    let answers = futures::future::join_all((0..20).map(|_| app.deliver(&delivery))).await;
    let mut ids = std::collections::BTreeSet::new();
    for response in answers {
        let a = answer(response, StatusCode::ACCEPTED).await;
        ids.insert((a["request_id"].to_string(), a["job_id"].to_string()));
    }
    assert_eq!(ids.len(), 1, "every copy answers the same IDs");
    let duplicates: i32 = sqlx::query_scalar("SELECT duplicates FROM deprov.deletion_requests")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        (
            app.count_jobs().await,
            app.count_requests().await,
            duplicates
        ),
        (1, 1, 19)
    );
}
