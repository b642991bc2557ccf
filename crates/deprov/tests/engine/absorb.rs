//! Letting PostgreSQL's cascade delete small subtrees under deprov's batches (`engine::absorb`).

use deprov::queue::JobState;
use deprov::worker::Progress;

use crate::harness::{config_hard, digest, env_with_config};

/// Tables of the fixture that only a cascade under their parents' batches can have emptied.
const ABSORBABLE: [&str; 2] = ["\"app\".\"events\"", "\"app\".\"log_lines\""];

#[tokio::test]
async fn analyzed_small_subtrees_go_with_their_parents_and_the_result_still_equals_the_cascade() {
    let env = env_with_config(&config_hard(
        "batch_rows = 7\nmax_batch_rows = 7\nmax_batch_duration = \"800ms\"\nlock_timeout = \"100ms\"",
        "installation",
        "",
    ))
    .await;
    sqlx::query("ANALYZE").execute(&env.db).await.unwrap();
    let expected = env.cascade_copy(1).await;
    let before = digest(&env.db).await;
    let job_id = env.request("1").await;
    env.drain(&env.worker("w1")).await;

    let job = env.job(job_id).await;
    assert_eq!(job.state(), JobState::Completed, "{job:?}");
    let after = digest(&env.db).await;
    assert_eq!(
        after,
        digest(&expected).await,
        "deprov's result differs from the cascade's"
    );

    let progress = Progress::from_json(&job.progress);
    let tenant_rows: i64 =
        before.values().map(|(n, _)| n).sum::<i64>() - after.values().map(|(n, _)| n).sum::<i64>();
    // Rows the cascade deleted under deprov's batches are counted too, each once.
    assert_eq!(progress.rows_deleted, tenant_rows, "{progress:?}");
    for name in ABSORBABLE {
        let t = progress.table(name).unwrap();
        assert_eq!(
            t.batches, 0,
            "{name} should have no batches of its own: {progress:?}"
        );
        assert!(t.rows_deleted > 0 && t.done, "{name}: {progress:?}");
    }
    // The folder tree, the root's direct children and a table referenced through an unindexed
    // foreign key (deployments, by log_lines) keep steps of their own.
    for name in [
        "\"app\".\"folders\"",
        "\"app\".\"projects\"",
        "\"app\".\"deployments\"",
    ] {
        let t = progress.table(name).unwrap();
        assert!(t.batches > 0, "{name}: {progress:?}");
    }
}

#[tokio::test]
async fn a_parent_with_far_more_rows_than_estimated_makes_the_job_replan_and_still_equal_the_cascade()
 {
    // Cascading batches may run for max(4/5 × max_batch_duration, lock_timeout + 1 ms) = 16 ms.
    let env = env_with_config(&config_hard(
        "batch_rows = 7\nmax_batch_rows = 100000\nmax_batch_duration = \"20ms\"\nlock_timeout = \"5ms\"",
        "installation",
        // Keep the pacing pauses after an overrun short.
        "[pacing]\nbackoff = \"1ms\"\nbackoff_max = \"1ms\"",
    ))
    .await;
    sqlx::query("ANALYZE").execute(&env.db).await.unwrap();
    // After ANALYZE: the estimate still says a deployment has a few events; one of tenant 1's has
    // 100,000 more (its cascade alone takes far longer than 16 ms).
    sqlx::query(
        "INSERT INTO app.events (deployment_id, seq, payload) \
         SELECT (SELECT min(d.id) FROM app.deployments d JOIN app.\"Environments\" e ON e.\"Id\" = d.env_id \
                 JOIN app.projects p ON p.id = e.\"projectId\" WHERE p.account_id = 1), 1000000 + g, 'x' \
         FROM generate_series(1, 100000) g",
    )
    .execute(&env.db)
    .await
    .unwrap();
    sqlx::query("DROP DATABASE pristine")
        .execute(&crate::harness::admin(&env.server).await)
        .await
        .unwrap();
    env.db.close().await;
    let admin = crate::harness::admin(&env.server).await;
    sqlx::query("CREATE DATABASE pristine TEMPLATE target")
        .execute(&admin)
        .await
        .unwrap();
    let db = crate::harness::connect(&env.server, "target", 4).await;
    let expected = env.cascade_copy(1).await;
    let job_id = env.request("1").await;
    env.drain(&env.worker("w1")).await;

    let job = deprov::queue::jobs::get(&db, job_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job.state(), JobState::Completed, "{job:?}");
    assert_eq!(
        digest(&db).await,
        digest(&expected).await,
        "deprov's result differs from the cascade's"
    );
    let progress = Progress::from_json(&job.progress);
    assert!(progress.replans >= 1, "{progress:?}");
    assert!(
        progress.cascade_rows.is_some_and(|c| c < 2_000),
        "{progress:?}"
    );
    assert!(progress.longest_rolled_back_ms > 0.0, "{progress:?}");
}
