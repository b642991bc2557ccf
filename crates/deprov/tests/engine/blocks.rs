//! A step whose foreign key to its parent has no index deletes by ranges of the table's blocks
//! (`engine::queries::block_batch`): one pass over the table, not a scan per parent. A tenant
//! the statistics say holds few rows in a table straight under the root reads a first range of
//! a first scan's length, not one sized for a range full of its rows.

use deprov::engine::absorb::FIRST_SCAN_ROWS;
use deprov::engine::{self, BatchLimits};

use crate::harness::{analyzed_env, config_hard, delete_tenant_1, env_with_schema, step_on};

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
    let events = step_on(&plan, "events");
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

/// 3 tenants × 3,000 events straight under the root, by a key of another integer type than the
/// root's and without an index; tenant 1 also owns rows of a second table keyed to the root by
/// a column other than its key.
const ROOT_SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, code text UNIQUE NOT NULL, deleted_at timestamptz);
CREATE TABLE app.events (id int PRIMARY KEY,
    account_id int NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
CREATE TABLE app.notes (id int PRIMARY KEY,
    account_code text NOT NULL REFERENCES app.accounts (code) ON DELETE CASCADE, body text);
INSERT INTO app.accounts VALUES (1, 'a', NULL), (2, 'b', NULL), (3, 'c', NULL);
INSERT INTO app.events SELECT g, 1 + g % 3, repeat('x', 40) FROM generate_series(1, 9000) g;
INSERT INTO app.notes SELECT g, chr(97 + g % 3), repeat('x', 40) FROM generate_series(1, 3000) g;
ANALYZE;
";

#[tokio::test]
async fn a_table_keyed_straight_to_the_root_is_deleted_by_block_ranges_of_its_own_key() {
    let config = config_hard(
        "batch_rows = 2\nmax_batch_rows = 1000\nmax_batch_duration = \"800ms\"\n\
         lock_timeout = \"100ms\"\ncascade_rows = 0",
        "id",
        "",
    );
    let env = env_with_schema(&config, ROOT_SCHEMA).await;
    let plan = crate::harness::accounts_plan(&env.db).await;
    for table in ["events", "notes"] {
        let step = step_on(&plan, table);
        assert!(plan.block_step(step), "{}", plan.describe_path(step));
        // Straight under the root's key: a filter on the range; by another column: a semi-join.
        let sql = deprov::engine::queries::block_batch(&plan, step)
            .text()
            .to_string();
        assert_eq!(sql.contains("EXISTS"), table == "notes", "{sql}");
    }
    drop(env);

    // Equal to the cascade's copy (delete_tenant_1): tenants 2 and 3 keep all their rows.
    let progress = delete_tenant_1(ROOT_SCHEMA, &config).await;
    for (table, rows) in [(r#""app"."events""#, 3000), (r#""app"."notes""#, 1000)] {
        let t = progress.table(table).expect("the table in the progress");
        assert_eq!(t.rows_deleted, rows, "{table}: {progress:?}");
        assert!(t.batches >= 2, "{table}: {progress:?}");
    }
    assert_eq!(progress.rows_deleted, 4001, "{progress:?}");
}

/// Tenant 1 owns 360 of 200,360 events (no index on `account_id`), tenant 2 the rest: more than a
/// quarter of the table's pages (about 1,280), the root row's allowance by the pages its delete
/// scans (`engine::absorb::ROWS_PER_SCANNED_PAGE`). `ANALYZE` samples 300 rows per unit of the
/// statistics target (PostgreSQL docs, `ANALYZE`): at 10,000 it reads every row, so the
/// statistics give tenant 1 its 360 rows.
const SMALL_TENANT: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.events (id bigserial PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
ALTER TABLE app.events ALTER COLUMN account_id SET STATISTICS 10000;
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.events (account_id, body) SELECT 2, 'e' || g FROM generate_series(1, 200000) g;
INSERT INTO app.events (account_id, body) SELECT 1, 'e' || g FROM generate_series(1, 360) g;
";

#[tokio::test]
async fn a_tenant_with_few_rows_in_the_table_reads_a_first_scans_worth_of_blocks_first() {
    // Allowances below tenant 1's 360 events (`cascade_rows`, and a quarter of the table's
    // pages): they keep their step rather than going with the root row's delete.
    let config = config_hard(
        "batch_rows = 50\nmax_batch_duration = \"800ms\"\nlock_timeout = \"100ms\"\ncascade_rows = 10",
        "id",
        "",
    );
    let env = analyzed_env(&config, SMALL_TENANT, "events", 200_360).await;
    let leaves_first = crate::harness::accounts_plan(&env.db).await;
    let limits = BatchLimits::from(&env.config.hard_delete);
    let first = |tenant: &'static str| {
        let (db, leaves_first, limits) = (&env.db, &leaves_first, &limits);
        async move {
            let rows = engine::estimate::absorbable_rows(db, leaves_first, tenant, limits, 10)
                .await
                .unwrap();
            let plan = leaves_first.clone().absorb_tenant(10.0, &rows);
            let step = step_on(&plan, "events");
            assert!(plan.block_step(step), "{}", plan.describe_path(step));
            plan.first_batch(step, 50)
        }
    };
    // Rows per block by the statistics, as the plan reads them.
    let (rows, pages): (f64, f64) = sqlx::query_as(
        "SELECT reltuples::float8, relpages::float8 FROM pg_class \
         WHERE oid = 'app.events'::regclass",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(rows, 200_360.0);
    assert!(
        360.0 > pages * engine::absorb::ROWS_PER_SCANNED_PAGE,
        "{pages} pages"
    );
    let per_block = rows / pages;
    // A leaf's first batch is 400 rows: a few blocks when each may be full of the tenant's rows
    // (tenant 2's), the blocks of a first scan when the tenant has 360 rows in all (tenant 1's).
    let large = first("2").await;
    assert_eq!(large, (400.0 / per_block).ceil() as i64, "{pages} pages");
    let small = first("1").await;
    assert_eq!(
        small,
        (FIRST_SCAN_ROWS / per_block).floor() as i64,
        "{pages} pages"
    );
    assert!(small > 10 * large, "{small} blocks against {large}");

    let progress = env.delete_tenant_1().await;
    let events = progress
        .table(r#""app"."events""#)
        .expect("events in the progress");
    assert_eq!(events.rows_deleted, 360, "{progress:?}");
    // The first range, then one sixteen times as long: past the table's last block.
    assert!(events.batches <= 2, "{progress:?}");
}
