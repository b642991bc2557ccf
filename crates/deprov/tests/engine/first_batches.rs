//! A step's first batches: they read as many parents as they have rows where the step's foreign
//! key to its parents has an index, and a batch of one row does not make its parent "large" (a
//! key range for the rest of its children). A small tenant's step then takes one batch, or two
//! when its table's first batch is one row, not three.

use crate::harness::{config_hard, delete_tenant_1};

/// Tenant 1: 10 projects, one task (on its first project). `task_notes.task_id` has no index, so
/// deleting a task scans `task_notes`: the task step's first batch is one row.
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
INSERT INTO app.task_notes VALUES (1, 2), (2, 3);
ANALYZE;
";

#[tokio::test]
async fn a_small_tenants_steps_take_one_batch_or_two_after_a_one_row_batch() {
    let config = config_hard(
        "batch_rows = 50\nmax_batch_duration = \"800ms\"\nlock_timeout = \"50ms\"\ncascade_rows = 0",
        "id",
        "",
    );
    let progress = delete_tenant_1(SCHEMA, &config).await;
    let batches = |table: &str| {
        progress
            .table(table)
            .map(|t| (t.rows_deleted, t.batches))
            .unwrap_or_else(|| panic!("{table} counted: {progress:?}"))
    };
    // The account's one row is every project's parent: one batch reads it and its 10 projects.
    assert_eq!(batches(r#""app"."projects""#), (10, 1), "{progress:?}");
    // One row (its first batch), then the rest of that project's tasks and the next projects'.
    assert_eq!(batches(r#""app"."tasks""#), (1, 2), "{progress:?}");
}
