//! Letting PostgreSQL's cascade delete small subtrees under deprov's batches (`engine::absorb`).

use deprov::queue::JobState;
use deprov::worker::Progress;

use crate::harness::{config_hard, digest, env_with_config};

/// Tables of the fixture that only a cascade under their parents' batches can have emptied.
/// `deployments` among them: `log_lines`, which references it through a key without an index,
/// is a few pages, so a deleted deployment's scan of it weighs as a few rows.
const ABSORBABLE: [&str; 3] = [
    "\"app\".\"events\"",
    "\"app\".\"log_lines\"",
    "\"app\".\"deployments\"",
];

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
    // The folder tree keeps steps of its own. (The root's direct children go with the root row
    // when the tenant's rows below them fit the root's allowance: `absorb_root`.)
    let folders = progress.table("\"app\".\"folders\"").unwrap();
    assert!(folders.batches > 0, "{progress:?}");
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

/// `a` (1 row per tenant, 2 notes) and `b` (50 rows, 2 items each) under the account, each with
/// its children absorbed; after ANALYZE one of tenant 1's `b` rows gains 60,000 items, so
/// its cascade alone outlasts the batch bound and the job re-plans after `a`'s step finished.
/// `a_log` and `b_log` reference `a` and `b` through keys without an index and hold tenant 2's
/// 10,000 rows each, more pages than `engine::absorb::SMALL_SCAN_PAGES`: a deleted row of `a` or
/// `b` scans one of them, so neither goes with the root row's delete (`Plan::absorb_tenant`):
/// they keep their steps.
const FINISHED_BEFORE_REPLAN: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.a (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.a_notes (id bigint PRIMARY KEY,
    a_id bigint NOT NULL REFERENCES app.a ON DELETE CASCADE);
CREATE TABLE app.a_log (a_id bigint NOT NULL REFERENCES app.a ON DELETE CASCADE);
CREATE TABLE app.b (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.items (id bigint PRIMARY KEY,
    b_id bigint NOT NULL REFERENCES app.b ON DELETE CASCADE);
CREATE TABLE app.b_log (b_id bigint NOT NULL REFERENCES app.b ON DELETE CASCADE);
CREATE INDEX ON app.a (account_id);
CREATE INDEX ON app.a_notes (a_id);
CREATE INDEX ON app.b (account_id);
CREATE INDEX ON app.items (b_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.a VALUES (1, 1), (2, 2);
INSERT INTO app.a_notes SELECT g, 1 + (g - 1) / 2 FROM generate_series(1, 4) g;
INSERT INTO app.b SELECT g, 1 + (g - 1) / 50 FROM generate_series(1, 100) g;
INSERT INTO app.items SELECT g, 1 + (g - 1) / 2 FROM generate_series(1, 200) g;
INSERT INTO app.a_log SELECT 2 FROM generate_series(1, 10000);
INSERT INTO app.b_log SELECT 100 FROM generate_series(1, 10000);
ANALYZE;
INSERT INTO app.items SELECT 1000 + g, 1 FROM generate_series(1, 60000) g;
";

#[tokio::test]
async fn a_replan_passes_over_the_steps_finished_before_it() {
    let config = config_hard(
        "batch_rows = 7\nmax_batch_rows = 100000\nmax_batch_duration = \"20ms\"\nlock_timeout = \"5ms\"",
        "id",
        "[pacing]\nbackoff = \"1ms\"\nbackoff_max = \"1ms\"",
    );
    let progress = crate::harness::delete_tenant_1(FINISHED_BEFORE_REPLAN, &config).await;
    assert!(progress.replans >= 1, "{progress:?}");
    // `a`'s one batch deleted its row and, by cascade, its 2 notes; no re-plan walks `a` again,
    // nor `a_notes` once a re-plan gives it steps of its own.
    let a = progress.table("\"app\".\"a\"").unwrap();
    assert_eq!((a.batches, a.rows_deleted), (1, 1), "{progress:?}");
    let notes = progress.table("\"app\".\"a_notes\"").unwrap();
    assert_eq!((notes.batches, notes.rows_deleted), (0, 2), "{progress:?}");
    assert!(a.done && notes.done, "{progress:?}");
    let items = progress.table("\"app\".\"items\"").unwrap();
    assert_eq!(items.rows_deleted, 60_100, "{progress:?}");
}
