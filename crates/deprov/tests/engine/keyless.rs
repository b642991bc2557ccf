//! A table without a primary key, its foreign key indexed, and one parent with many rows in it.
//! Continuing inside the parent by `ctid > $cursor ORDER BY ctid`, an order no index gives, would
//! make every batch read and sort all of the parent's remaining rows and the time-sized batches
//! shrink to one row: a job that would not end. A parent's rows are taken in the index's order,
//! and a batch reads about as many rows as it deletes.

use deprov::engine::{Cursor, queries};

use crate::harness::{config_for, delete_tenant_1, env_with_schema};

const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.logs (org_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, msg text);
CREATE INDEX ON app.logs (org_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.logs SELECT 1, 'm' || g FROM generate_series(1, 20000) g;
INSERT INTO app.logs SELECT 2, 'm' || g FROM generate_series(1, 100) g;
ANALYZE app.logs;
";

/// Rows every scan node of `plan` (EXPLAIN ANALYZE's JSON) on `relation` returned, summed.
fn rows_read(plan: &serde_json::Value, relation: &str) -> i64 {
    let scan = plan["Node Type"]
        .as_str()
        .is_some_and(|t| t.ends_with("Scan"));
    let own = if scan && plan["Relation Name"] == relation {
        plan["Actual Rows"].as_i64().unwrap_or(0) * plan["Actual Loops"].as_i64().unwrap_or(1)
    } else {
        0
    };
    own + plan["Plans"]
        .as_array()
        .map_or(0, |ps| ps.iter().map(|p| rows_read(p, relation)).sum())
}

/// One batch inside tenant 1's only parent row, run under EXPLAIN ANALYZE and rolled back: it
/// reads from `app.logs` about the rows it deletes, not all 20,000 of the parent's.
#[tokio::test]
async fn a_batch_inside_a_large_parent_reads_what_it_deletes() {
    let env = env_with_schema(&config_for(100, "id", ""), SCHEMA).await;
    let plan = crate::harness::accounts_plan(&env.db).await;
    let step = plan
        .steps
        .iter()
        .find(|s| plan.name(s.table).to_string() == r#""app"."logs""#)
        .expect("a step for app.logs");
    // Where a first 100-row batch of the parent leaves the cursor.
    let cursor = Cursor::Within(vec!["1".into()], vec!["(0,100)".into()]);
    let stmt = queries::batch(&plan, step, &cursor, false);
    let mut tx = env.db.begin().await.unwrap();
    let explained: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        stmt.text()
    )))
    .bind("1")
    .bind(100_i64)
    .bind(vec!["1".to_string(), "(0,100)".to_string()])
    .bind(1_i64)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.logs WHERE org_id = 1")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let read = rows_read(&explained[0]["Plan"], "logs");
    println!(
        "rows read from app.logs by one 100-row batch: {read}; tenant rows left after it: {left}"
    );
    assert_eq!(left, 20_000 - 100, "the batch deletes 100 rows");
    assert!(
        read <= 2 * 100 + 1,
        "one batch read {read} rows of app.logs to delete 100:\n{explained:#}"
    );
}

/// The whole job, 100-row batches: it ends, in about 200 batches, equal to the cascade.
#[tokio::test]
async fn a_large_parent_in_a_keyless_table_is_deleted_in_batches_equal_to_the_cascade() {
    let progress = delete_tenant_1(SCHEMA, &config_for(100, "id", "")).await;
    let logs = progress
        .table(r#""app"."logs""#)
        .expect("app.logs in the progress");
    assert_eq!(logs.rows_deleted, 20_000, "{progress:?}");
    assert!(
        (200..=220).contains(&logs.batches),
        "20,000 rows in 100-row batches: {} batches",
        logs.batches
    );
}
