//! Schemas a fresh reviewer built to break the claim "equal to the cascade on any schema"
//! (session 11), each now a fixed test.

use crate::harness::{config_for, config_hard, delete_tenant_1};

/// Tables that `INHERITS` from a table in the tenant: a foreign key covers only its own table, so
/// the cascade (whose referential triggers query `ONLY`) never deletes an inheriting child's rows,
/// even those whose columns name the tenant. deprov's statements deleted them too.
fn inheritance_schema(analyze: bool) -> String {
    format!(
        "CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, name text);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.projects_archive (archived_at date) INHERITS (app.projects);
CREATE TABLE app.tasks (id bigint PRIMARY KEY,
    project_id bigint REFERENCES app.projects ON DELETE CASCADE,
    account_id bigint REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.tasks (project_id);
CREATE INDEX ON app.tasks (account_id);
CREATE TABLE app.tasks_child () INHERITS (app.tasks);
INSERT INTO app.accounts SELECT g, NULL FROM generate_series(1, 3) g;
INSERT INTO app.projects SELECT g, 1 + g % 3, 'p' FROM generate_series(1, 12) g;
INSERT INTO app.projects_archive SELECT g, 1 + g % 3, 'arch', '2020-01-01' FROM generate_series(100, 111) g;
INSERT INTO app.tasks SELECT g, 1 + g % 12, 1 + (1 + g % 12) % 3 FROM generate_series(1, 40) g;
INSERT INTO app.tasks_child SELECT g, 1 + g % 12, 1 + (1 + g % 12) % 3 FROM generate_series(1000, 1020) g;
{}",
        if analyze { "ANALYZE;" } else { "" }
    )
}

#[tokio::test]
async fn rows_of_a_table_that_inherits_from_a_tenant_table_are_left_as_the_cascade_leaves_them() {
    // Leaves first: every table gets its own batches.
    let progress = delete_tenant_1(&inheritance_schema(false), &config_for(2, "id", "")).await;
    assert_eq!(progress.rows_deleted, 1 + 4 + 13, "{progress:?}");
    // Analyzed, with an allowance: the projects' batches let PostgreSQL cascade to the tasks.
    let absorbed = config_hard(
        "batch_rows = 50\nmax_batch_rows = 100000\ncascade_rows = 2000",
        "id",
        "",
    );
    let progress = delete_tenant_1(&inheritance_schema(true), &absorbed).await;
    assert_eq!(progress.rows_deleted, 1 + 4 + 13, "{progress:?}");
}
