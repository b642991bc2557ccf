//! The `deprov` binary's operator commands, and the isolation of deprov's connections.

use std::process::Command;

use crate::helpers::{TestOptions, accepted, deletion, spawn_app, spawn_app_with};

fn deprov(args: &[&str], database_url: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(args)
        .env("DEPROV_DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the deprov binary runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn kill_switch_cli_engages_holds_jobs_and_releases_them() {
    let app = spawn_app().await;
    let job = accepted(app.post_deletion(&deletion("7")).await).await;
    let job_id: uuid::Uuid = job["job_id"].as_str().unwrap().parse().unwrap();

    let (ok, out) = deprov(
        &["kill-switch", "on", "--reason", "incident 42"],
        &app.db_url,
    );
    assert!(ok, "{out}");
    let (engaged, reason, version): (bool, Option<String>, i64) =
        sqlx::query_as("SELECT engaged, reason, version FROM deprov.kill_switch")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (engaged, reason.as_deref(), version),
        (true, Some("incident 42"), 1)
    );
    let state: String = sqlx::query_scalar("SELECT state FROM deprov.jobs WHERE id = $1")
        .bind(job_id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(state, "held");

    let (ok, out) = deprov(&["kill-switch", "status", "--json"], &app.db_url);
    assert!(ok, "{out}");
    let status: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(status["engaged"], true);

    let (ok, out) = deprov(&["kill-switch", "off", "--reason", "resolved"], &app.db_url);
    assert!(ok, "{out}");
    let state: String = sqlx::query_scalar("SELECT state FROM deprov.jobs WHERE id = $1")
        .bind(job_id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(state, "queued");
}

#[tokio::test]
async fn every_connection_names_its_pool_and_intake_uses_only_its_own() {
    let app = spawn_app_with(TestOptions {
        worker: true,
        ..Default::default()
    })
    .await;
    accepted(app.post_deletion(&deletion("8")).await).await;
    // Intake's connections are `deprov-intake`; the in-process worker's are `deprov-worker`.
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
                names
                    .iter()
                    .all(|n| ["deprov-intake", "deprov-worker", "deprov-target"]
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
