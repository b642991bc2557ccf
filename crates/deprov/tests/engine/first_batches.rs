//! A step's first batches: they read as many parents as they have rows where the step's foreign
//! key to its parents has an index, a batch of one row does not make its parent "large" (a key
//! range for the rest of its children), and a batch that is not full ends its step when no parent
//! follows its own (it reads one parent ahead). A first batch is one row only where deleting a row
//! scans a referencing table larger than a first batch may scan. A small tenant's step then takes
//! one batch, or two when its table's first batch is one row. A table no key references starts
//! with eight times `batch_rows`.

use crate::harness::{config_hard, delete_tenant_1};

/// Tenant 1: 10 projects, one task (on its first project). `task_notes.task_id` has no index, so
/// deleting a task scans `task_notes` (`NOTES` rows of tenant 2's task 2).
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.tasks (id int PRIMARY KEY,
    project_id int NOT NULL REFERENCES app.projects ON DELETE CASCADE);
CREATE INDEX ON app.tasks (project_id);
CREATE TABLE app.task_notes (id int PRIMARY KEY,
    task_id int NOT NULL REFERENCES app.tasks ON DELETE CASCADE);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects SELECT g, CASE WHEN g <= 10 THEN 1 ELSE 2 END FROM generate_series(1, 30) g;
INSERT INTO app.tasks VALUES (1, 1), (2, 11), (3, 12);
INSERT INTO app.task_notes SELECT g, 2 FROM generate_series(1, NOTES) g;
ANALYZE;
";

/// [`SCHEMA`] with `notes` rows in `task_notes`.
fn schema(notes: u32) -> String {
    SCHEMA.replace("NOTES", &notes.to_string())
}

/// Tenant 1 deleted with 50-row first batches and no cascade allowance: each table's rows and
/// batches.
async fn rows_and_batches(notes: u32) -> impl Fn(&str) -> (i64, i64) {
    let config = config_hard(
        "batch_rows = 50\nmax_batch_duration = \"800ms\"\nlock_timeout = \"50ms\"\ncascade_rows = 0",
        "id",
        "",
    );
    let progress = delete_tenant_1(&schema(notes), &config).await;
    move |table: &str| {
        progress
            .table(table)
            .map(|t| (t.rows_deleted, t.batches))
            .unwrap_or_else(|| panic!("{table} counted: {progress:?}"))
    }
}

#[tokio::test]
async fn a_small_tenants_steps_take_one_batch_each_when_their_scans_are_small() {
    let batches = rows_and_batches(2).await;
    // The account's one row is every project's parent: one batch reads it and its 10 projects,
    // and knows no other account follows.
    assert_eq!(batches(r#""app"."projects""#), (10, 1));
    // Deleting a task scans `task_notes`, two rows: the first batch takes 50 rows and the next
    // parents ahead of its own, and it is the step's only batch.
    assert_eq!(batches(r#""app"."tasks""#), (1, 1));
}

#[tokio::test]
async fn a_step_whose_deletes_scan_a_large_table_starts_with_one_row() {
    // 30,000 notes: one task's delete scans more rows than a first batch may.
    let batches = rows_and_batches(30_000).await;
    assert_eq!(batches(r#""app"."projects""#), (10, 1));
    // One row (its first batch), then the rest of that project's tasks and the next projects'.
    assert_eq!(batches(r#""app"."tasks""#), (1, 2));
}

/// Tenant 1: 300 projects (which labels reference) and 300 events (which nothing references).
const LEAF_SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.labels (id int PRIMARY KEY,
    project_id int NOT NULL REFERENCES app.projects ON DELETE CASCADE);
CREATE INDEX ON app.labels (project_id);
CREATE TABLE app.events (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.events (account_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects SELECT g, CASE WHEN g <= 300 THEN 1 ELSE 2 END FROM generate_series(1, 400) g;
INSERT INTO app.events SELECT g, CASE WHEN g <= 300 THEN 1 ELSE 2 END FROM generate_series(1, 400) g;
ANALYZE;
";

#[tokio::test]
async fn a_table_no_key_references_starts_with_eight_times_the_first_batch() {
    let config = config_hard(
        "batch_rows = 50\nmax_batch_duration = \"800ms\"\nlock_timeout = \"50ms\"\ncascade_rows = 0",
        "id",
        "",
    );
    let progress = delete_tenant_1(LEAF_SCHEMA, &config).await;
    let batches = |table: &str| {
        progress
            .table(table)
            .map(|t| (t.rows_deleted, t.batches))
            .unwrap_or_else(|| panic!("{table} counted: {progress:?}"))
    };
    // A leaf: its first batch takes 400 rows, all 300 of the tenant's.
    assert_eq!(batches(r#""app"."events""#), (300, 1));
    // Referenced by `labels`: 50 rows first, the rest in more batches.
    let (rows, projects) = batches(r#""app"."projects""#);
    assert_eq!(rows, 300);
    assert!(projects >= 2, "projects took {projects} batch(es)");
}
