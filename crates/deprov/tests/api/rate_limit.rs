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
