//! The isolation of deprov's connections: named, bounded pools; intake fails fast on a lock.

use crate::helpers::{TestOptions, accepted, deletion, spawn_app, spawn_app_with};

#[tokio::test]
async fn every_connection_names_its_pool_and_intake_uses_only_its_own() {
    let app = spawn_app_with(TestOptions {
        worker: true,
        ..Default::default()
    })
    .await;
    accepted(app.post_deletion(&deletion("8")).await).await;
    // Intake's connections are `deprov-intake`; the in-process worker's are `deprov-worker` (and
    // `deprov-listener`, its LISTEN connection for kill switch changes).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name LIKE 'deprov-%' ORDER BY 1",
        )
        .fetch_all(&app.db)
        .await
        .unwrap();
        if names.contains(&"deprov-intake".to_owned())
            && names.contains(&"deprov-worker".to_owned())
        {
            assert!(
                names.iter().all(|n| [
                    "deprov-intake",
                    "deprov-worker",
                    "deprov-target",
                    "deprov-listener"
                ]
                .contains(&n.as_str())),
                "{names:?}"
            );
            let intake: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'deprov-intake'",
            )
            .fetch_one(&app.db)
            .await
            .unwrap();
            assert!(
                intake <= 8,
                "the intake pool is bounded by [pools.intake] max_connections: {intake}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "connections never showed up named: {names:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn intake_blocked_by_a_lock_fails_fast_with_503_and_stores_nothing() {
    let app = spawn_app().await;
    // Another transaction is creating tenant 9's job and has not committed: intake's insert must wait
    // for it — but only for its lock_timeout (1 s), then answer 503 + Retry-After instead of queueing.
    let mut blocker = app.db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO deprov.jobs (id, subject_kind, subject, tenant_id, state, max_attempts) \
         VALUES (gen_random_uuid(), 'tenant', '9', '9', 'queued', 1)",
    )
    .execute(&mut *blocker)
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let response = app.post_deletion(&deletion("9")).await;
    let waited = started.elapsed();
    assert!(
        response.headers().contains_key("retry-after"),
        "{:?}",
        response.headers()
    );
    crate::helpers::assert_problem(response, reqwest::StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(
        waited < std::time::Duration::from_secs(4),
        "intake waited {waited:?}"
    );
    blocker.rollback().await.unwrap();
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM deprov.deletion_requests")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(stored, 0);
    // Once the lock is gone the same request goes through.
    accepted(app.post_deletion(&deletion("9")).await).await;
}

#[tokio::test]
async fn a_root_table_missing_from_a_reachable_target_is_a_start_up_error() {
    let pg = deprov_testkit::Throwaway::start(&deprov_testkit::ThrowawayOptions {
        unsafe_fast: true,
        ..Default::default()
    })
    .unwrap();
    let (_dir, config) =
        crate::helpers::config_file("[tenant]\nroot_table = \"app.nope\"\nkey_column = \"id\"\n");
    let settings = deprov::app::Settings {
        database_url: pg.url("postgres"),
        target_url: None,
        config,
        listen: "127.0.0.1:0".parse().unwrap(),
        operator_token: None,
        migrate: true,
        no_worker: true,
        metrics_listen: None,
        pooler_mode: deprov::db::PoolerMode::Session,
        notify_url: None,
    };
    let err = deprov::app::Application::build(settings)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tenant") && err.contains("\"app\".\"nope\""),
        "{err}"
    );
}
