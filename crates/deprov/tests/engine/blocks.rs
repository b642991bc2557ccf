//! A step whose foreign key to its parent has no index deletes by ranges of the table's blocks
//! (`engine::queries::block_batch`): one pass over the table, not a scan per parent.

use crate::harness::{config_hard, delete_tenant_1, env_with_schema};

/// 3 tenants × 20 projects × 100 events; `events.project_id` has no index.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.events (id int PRIMARY KEY,
    project_id int NOT NULL REFERENCES app.projects ON DELETE CASCADE, body text);
CREATE INDEX ON app.projects (account_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL), (3, NULL);
INSERT INTO app.projects SELECT g, 1 + g % 3 FROM generate_series(1, 60) g;
INSERT INTO app.events SELECT g, 1 + g % 60, repeat('x', 40) FROM generate_series(1, 6000) g;
ANALYZE;
";

#[tokio::test]
async fn a_table_without_an_index_on_its_key_is_deleted_by_block_ranges() {
    let config = config_hard(
        "batch_rows = 2\nmax_batch_rows = 1000\nmax_batch_duration = \"800ms\"\n\
         lock_timeout = \"100ms\"\ncascade_rows = 0",
        "id",
        "",
    );
    let env = env_with_schema(&config, SCHEMA).await;
    let plan = crate::harness::accounts_plan(&env.db).await;
    let events = plan
        .steps
        .iter()
        .find(|s| plan.name(s.table).name == "events")
        .expect("a step on events");
    assert!(plan.block_step(events), "{}", plan.describe_path(events));
    drop(env);

    let progress = delete_tenant_1(SCHEMA, &config).await;
    let events = progress
        .table(r#""app"."events""#)
        .expect("events in the progress");
    // Every one of tenant 1's events deleted by the step itself (none left to the projects'
    // cascade), in more than one range: the first reads 2 blocks of a table of more.
    assert_eq!(events.rows_deleted, 2000, "{progress:?}");
    assert!(events.batches >= 2, "{progress:?}");
    assert_eq!(progress.rows_deleted, 2021, "{progress:?}");
}
