//! A join table keyed `(job_id, file_id)`, with an index on `file_id`, stepped through `files`:
//! its key does not lead with the foreign key's columns. Ordered by the key inside each file,
//! PostgreSQL may read a file's children through the primary key in key order, filtering
//! `file_id` row by row — the whole index for each file with no row in the table. The step takes
//! each file's children in the order the `file_id` index gives instead.

use crate::harness::{
    accounts_plan, buffers, config_for, delete_tenant_1, env_with_schema, explain_batch,
};

/// Tenant 1 owns 200 jobs and 20,000 files; each job joins files 1 to 100 (20,000 join rows),
/// files 101 to 20,000 join none. Tenant 2 owns one job joining 100 files of its own.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.jobs (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.files (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.jobs_files (job_id bigint NOT NULL REFERENCES app.jobs ON DELETE CASCADE,
    file_id bigint NOT NULL REFERENCES app.files ON DELETE CASCADE, note text,
    PRIMARY KEY (job_id, file_id));
CREATE INDEX ON app.jobs_files (file_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.jobs SELECT g, 1 FROM generate_series(1, 200) g;
INSERT INTO app.jobs VALUES (201, 2);
INSERT INTO app.files SELECT g, 1 FROM generate_series(1, 20000) g;
INSERT INTO app.files SELECT g, 2 FROM generate_series(20001, 20100) g;
INSERT INTO app.jobs_files SELECT j, f, 'n' FROM generate_series(1, 200) j, generate_series(1, 100) f;
INSERT INTO app.jobs_files SELECT 201, f, 'n' FROM generate_series(20001, 20100) f;
ANALYZE;
";

/// A one-row batch (the size cuts leave a step at) over 1,000 files with no join row reads each
/// file's children through the `file_id` index: a few buffers per file, where the primary key in
/// key order would be read whole (about 60 leaf pages) for each.
#[tokio::test]
async fn childless_parents_of_a_join_table_are_read_through_the_foreign_key_index() {
    let env = env_with_schema(&config_for(100, "id", ""), SCHEMA).await;
    let plan = accounts_plan(&env.db).await;
    let step = plan
        .steps
        .iter()
        .find(|s| {
            plan.name(s.table).name == "jobs_files"
                && plan.name(plan.catalog.foreign_keys[s.path[0]].to).name == "files"
        })
        .expect("a step on jobs_files through files");
    // Unordered inside a file, a batch has no key range to continue a file with.
    assert!(!plan.range_step(step), "{}", plan.describe_path(step));
    let mut tx = env.db.begin().await.unwrap();
    let explained = explain_batch(&mut tx, &plan, step, vec!["100".into()], 1, 1000).await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.jobs_files")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let read = buffers(&explained);
    println!("buffers of a batch over 1,000 childless files: {read}");
    assert_eq!(left, 20_100, "no file after the 100th has a join row");
    assert!(
        read <= 4 * 1000,
        "the batch read {read} buffers:\n{explained:#}"
    );
}

/// The whole job in 100-row batches: equal to the cascade (tenant 2's join rows stay), every one
/// of tenant 1's join rows deleted by the join table's steps.
#[tokio::test]
async fn a_join_table_keyed_by_both_parents_is_deleted_equal_to_the_cascade() {
    let progress = delete_tenant_1(SCHEMA, &config_for(100, "id", "")).await;
    let t = progress
        .table(r#""app"."jobs_files""#)
        .expect("the join table in the progress");
    assert_eq!(t.rows_deleted, 20_000, "{progress:?}");
}
