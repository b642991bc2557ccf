//! The per-source intake rate limit (`[intake.rate_limit]`): 429 problem+json with `Retry-After`.

use reqwest::StatusCode;

use crate::helpers::{
    TestOptions, VERCEL_TOKEN, accepted, assert_problem, deletion, spawn_app_with,
};

#[tokio::test]
async fn a_source_past_its_burst_gets_429_while_another_source_is_still_accepted() {
    // One request per 100 s sustained, bursts of 3: the 4th request within the test is over.
    let app = spawn_app_with(TestOptions {
        rate_limit: Some((0.01, 3)),
        ..Default::default()
    })
    .await;
    for tenant in ["1", "2", "3"] {
        accepted(app.post_deletion(&deletion(tenant)).await).await;
    }
    let refused = app.post_deletion(&deletion("4")).await;
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (90..=101).contains(&retry_after),
        "the next request is admitted in ~100 s: {retry_after}"
    );
    let problem = assert_problem(refused, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(problem["type"], "https://deprov.dev/problems/rate-limited");
    assert_eq!(
        app.count_requests().await,
        3,
        "the refused request is not stored"
    );

    // Another source, from the same address, has its own quota.
    let vercel = app
        .delete_installation("icfg_1", VERCEL_TOKEN, None, None)
        .await;
    assert_eq!(vercel.status(), StatusCode::OK);
    assert_eq!(app.count_requests().await, 4);

    // Requests without a known token are limited by peer address: 401 until the burst is spent.
    for _ in 0..3 {
        let bad = app
            .post_deletion_with(Some("not-a-configured-token"), None, &deletion("5"))
            .await;
        assert_eq!(bad.status(), StatusCode::UNAUTHORIZED);
    }
    let bad = app
        .post_deletion_with(Some("not-a-configured-token"), None, &deletion("5"))
        .await;
    assert_problem(bad, StatusCode::TOO_MANY_REQUESTS).await;
    // Neither exhausted quota touches the operator and health routes.
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn per_second_zero_turns_the_limit_off() {
    let app = spawn_app_with(TestOptions {
        rate_limit: Some((0.0, 1)),
        ..Default::default()
    })
    .await;
    for tenant in 0..10 {
        accepted(app.post_deletion(&deletion(&tenant.to_string())).await).await;
    }
    assert_eq!(app.count_requests().await, 10);
}

/// `docs/configuration.md`'s figures for `deploy/example.toml`'s `[intake.rate_limit]` (`per_second = 20`,
/// `burst = 40`): of 50 requests one source sends at once, 40 pass at once and one more every
/// 50 ms after; the rest are answered 429 with `Retry-After: 1` and not stored.
#[tokio::test]
async fn the_example_limit_answers_the_end_of_a_50_request_burst_429() {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/example.toml"
    ))
    .unwrap();
    let example: toml::Table = toml::from_str(&example).unwrap();
    let limit = &example["intake"]["rate_limit"];
    assert_eq!(
        (
            limit["per_second"].as_integer(),
            limit["burst"].as_integer()
        ),
        (Some(20), Some(40)),
        "docs/configuration.md's [intake.rate_limit] burst row quotes 20/s and 40: update it"
    );
    let app = spawn_app_with(TestOptions {
        rate_limit: Some((20.0, 40)),
        ..Default::default()
    })
    .await;
    let started = std::time::Instant::now();
    let burst = (0..50).map(|i| {
        let body = deletion(&format!("t{i}"));
        let app = &app;
        async move { app.post_deletion(&body).await }
    });
    let responses = futures::future::join_all(burst).await;
    let elapsed = started.elapsed();
    let (mut passed, mut refused) = (0, 0);
    for response in responses {
        match response.status() {
            StatusCode::ACCEPTED => passed += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(response.headers()["retry-after"], "1");
                refused += 1;
            }
            other => panic!("{other}"),
        }
    }
    println!("50 requests in {elapsed:?}: {passed} accepted, {refused} refused with 429");
    // 40 at once, and one per 50 ms while the burst was arriving.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let refilled = (elapsed.as_secs_f64() * 20.0).ceil() as i64;
    assert!(
        (40..=40 + refilled).contains(&passed),
        "{passed} accepted in {elapsed:?}"
    );
    assert_eq!(passed + refused, 50);
    assert_eq!(app.count_requests().await, passed);
}

/// A signed webhook (`github` scheme, `installation.deleted`) for `tenant`, to `source`, signed
/// with `secret`.
async fn github_delivery(
    app: &crate::helpers::TestApp,
    source: &str,
    secret: &[u8],
    tenant: u64,
) -> reqwest::Response {
    let body = serde_json::json!({"action": "deleted", "installation": {"id": tenant}}).to_string();
    app.client
        .post(app.url(&format!("/v1/webhooks/{source}")))
        .header("Content-Type", "application/json")
        .header(
            deprov::sources::github::SIGNATURE,
            deprov::sources::github::sign(secret, body.as_bytes()),
        )
        .header(deprov::sources::github::EVENT, "installation")
        .header(
            deprov::sources::github::DELIVERY,
            format!("d-{source}-{tenant}"),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn junk_sent_to_one_source_does_not_spend_another_sources_quota() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "hook-secret-0123456789\n").unwrap();
    let table = |name: &str| {
        format!(
            "[sources.{name}]\nscheme = \"github\"\nsecret_file = [{:?}]\n\
             tenant = {{ pointer = \"/installation/id\" }}\ndelete_events = [\"installation.deleted\"]\n",
            secret.display().to_string()
        )
    };
    let app = spawn_app_with(TestOptions {
        rate_limit: Some((0.01, 3)),
        extra_config: format!("{}{}", table("hooks-a"), table("hooks-b")),
        ..Default::default()
    })
    .await;
    // Badly signed deliveries to hooks-a, from this address: 401 until its burst is spent.
    for tenant in 1..=3 {
        let bad = github_delivery(&app, "hooks-a", b"not-the-secret", tenant).await;
        assert_eq!(bad.status(), StatusCode::UNAUTHORIZED);
    }
    let bad = github_delivery(&app, "hooks-a", b"not-the-secret", 4).await;
    assert_problem(bad, StatusCode::TOO_MANY_REQUESTS).await;
    // hooks-b, from the same address (as every sender behind one proxy is), still has its quota.
    let good = github_delivery(&app, "hooks-b", b"hook-secret-0123456789", 5).await;
    assert_eq!(good.status(), StatusCode::ACCEPTED);
    // A source name nobody configured is keyed by the address alone: its own bucket.
    for _ in 0..3 {
        let unknown = github_delivery(&app, "nobody", b"x", 6).await;
        assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);
    }
    let unknown = github_delivery(&app, "nobody", b"x", 6).await;
    assert_problem(unknown, StatusCode::TOO_MANY_REQUESTS).await;
    let good = github_delivery(&app, "hooks-b", b"hook-secret-0123456789", 7).await;
    assert_eq!(good.status(), StatusCode::ACCEPTED);
    // hooks-a's own deliveries wait for its quota: the junk did spend that.
    let late = github_delivery(&app, "hooks-a", b"hook-secret-0123456789", 8).await;
    assert_problem(late, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(app.count_requests().await, 2);
}
