//! The batch bound: every batch transaction runs under `statement_timeout` = ⅘ of
//! `[hard_delete] max_batch_duration`, so a batch slower than the sizing expected is cut short and
//! retried smaller; a step whose single row cannot fit the bound runs under the full
//! `statement_timeout` instead of failing the job.

use crate::harness::{config_hard, delete_tenant_1};

/// A root with one leaf table; `extra` SQL runs after the data is loaded.
fn schema(items: u32, extra: &str) -> String {
    format!(
        "CREATE SCHEMA app;
         CREATE TABLE app.accounts (id bigint PRIMARY KEY, installation text UNIQUE, deleted_at timestamptz);
         CREATE TABLE app.items (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
         CREATE INDEX ON app.items (account_id);
         INSERT INTO app.accounts VALUES (1, 'icfg_1', NULL), (2, 'icfg_2', NULL);
         INSERT INTO app.items SELECT g, 1, 'item ' || g FROM generate_series(1, {items}) g;
         INSERT INTO app.items SELECT 1000000 + g, 2, 'other' FROM generate_series(1, 100) g;
         {extra}"
    )
}

/// Batches may run for max(⅘ × 20 ms, 5 ms + 1 ms) = 16 ms; the server's own bound stays 900 ms.
fn config(batch_rows: u32) -> String {
    config_hard(
        &format!(
            "batch_rows = {batch_rows}\nmax_batch_rows = 100000\nmax_batch_duration = \"20ms\"\n\
             lock_timeout = \"5ms\"\ncascade_rows = 0"
        ),
        "installation",
        "[pacing]\nbackoff = \"1ms\"\nbackoff_max = \"1ms\"",
    )
}

#[tokio::test]
async fn a_leaf_batch_far_larger_than_the_bound_allows_is_cut_short_and_retried_smaller() {
    // The first batch asks for all 60,000 rows at once: no server deletes them in 16 ms.
    let progress = delete_tenant_1(&schema(60_000, ""), &config(60_000)).await;
    assert!(progress.timeouts >= 1, "{progress:?}");
    assert_eq!(progress.unbounded_steps, 0, "{progress:?}");
    assert!(
        progress.longest_rolled_back_ms < 900.0,
        "cut by the batch bound, not the 900 ms statement_timeout: {progress:?}"
    );
    let items = progress.table("\"app\".\"items\"").unwrap();
    assert_eq!(items.rows_deleted, 60_000, "{progress:?}");
    assert!(items.batches > 1, "{progress:?}");
}

#[tokio::test]
async fn a_row_whose_delete_alone_outlasts_the_bound_gets_the_full_statement_timeout() {
    // Item 1's delete sets 60,000 other rows' reference to NULL: far more than 16 ms of work, and
    // no smaller batch exists. The job must complete, not spend its attempts on timeouts.
    let mentions = "CREATE TABLE app.mentions (id bigint PRIMARY KEY,
             item_id bigint REFERENCES app.items ON DELETE SET NULL);
         CREATE INDEX ON app.mentions (item_id);
         INSERT INTO app.mentions SELECT g, 1 FROM generate_series(1, 60000) g;";
    let progress = delete_tenant_1(&schema(10, mentions), &config(7)).await;
    assert_eq!(progress.unbounded_steps, 1, "{progress:?}");
    assert!(progress.timeouts >= 2, "{progress:?}");
    assert!(
        progress.longest_batch_ms > 20.0,
        "item 1's batch ran past max_batch_duration: {progress:?}"
    );
    assert_eq!(
        progress.pauses, 0,
        "a batch of an unbounded step takes as long as its row does, which is not distress: {progress:?}"
    );
}

#[tokio::test]
async fn a_slow_root_row_runs_once_under_the_full_statement_timeout_at_no_smaller_size() {
    // A trigger makes the account's own delete outlast the 16 ms bound (half a million rows
    // counted). Its step's first batch would be sized by the cascade estimate (thousands of
    // "rows" at batch_rows = 10,000), but it is one row that cannot be split: no try under the
    // bound that could only be cut, one batch under the full statement_timeout.
    let slow = "CREATE FUNCTION app.slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM count(*) FROM generate_series(1, 500000); RETURN OLD; END $$;
         CREATE TRIGGER slow_delete BEFORE DELETE ON app.accounts
             FOR EACH ROW EXECUTE FUNCTION app.slow_delete();
         ANALYZE;";
    let progress = delete_tenant_1(&schema(10, slow), &config(10_000)).await;
    assert_eq!(progress.timeouts, 0, "{progress:?}");
    assert_eq!(progress.unbounded_steps, 1, "{progress:?}");
    let root = progress.table("\"app\".\"accounts\"").unwrap();
    assert_eq!((root.rows_deleted, root.batches), (1, 1), "{progress:?}");
    assert!(root.longest_batch_ms > 20.0, "{progress:?}");
}

/// As [`config`], with `cascade_rows = 2000` and 10-row first batches.
fn cascading_config() -> String {
    config_hard(
        "batch_rows = 10\nmax_batch_duration = \"20ms\"\nlock_timeout = \"5ms\"\ncascade_rows = 2000",
        "installation",
        "[pacing]\nbackoff = \"1ms\"\nbackoff_max = \"1ms\"",
    )
}

/// Tenants 1 and 2 with a project each; deleting a project makes PostgreSQL's referential trigger
/// scan all of `events` (no index on its key), a million rows of tenant 2's project: longer than
/// the 16 ms bound whatever the plan. `below` adds tables, then everything is analyzed.
fn projects_with_events(below: &str) -> String {
    format!(
        "CREATE TABLE app.projects (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
         CREATE INDEX ON app.projects (account_id);
         INSERT INTO app.projects VALUES (1, 1), (2, 2);
         CREATE TABLE app.events (id bigint PRIMARY KEY,
             project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE);
         INSERT INTO app.events SELECT g, 2 FROM generate_series(1, 1000000) g;
         INSERT INTO app.events SELECT 2000000 + g, 1 FROM generate_series(1, 50) g;
         {below}
         ANALYZE;"
    )
}

#[tokio::test]
async fn a_root_row_whose_delete_outlasts_the_bound_runs_unbounded_from_its_first_try() {
    // Deleting an account makes PostgreSQL's referential trigger scan all of `events` (no index
    // on its key): a million other-tenant rows, longer than the 16 ms bound whatever the plan.
    // `notes` is covered (a NOT NULL key to the root beside its path through `items`), so the
    // root's delete may cascade.
    let extra = "CREATE TABLE app.events (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
         INSERT INTO app.events SELECT g, 2 FROM generate_series(1, 1000000) g;
         INSERT INTO app.events SELECT 2000000 + g, 1 FROM generate_series(1, 50) g;
         CREATE TABLE app.notes (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
             item_id bigint NOT NULL REFERENCES app.items ON DELETE CASCADE);
         CREATE INDEX ON app.notes (account_id);
         CREATE INDEX ON app.notes (item_id);
         INSERT INTO app.notes SELECT g, 1, g FROM generate_series(1, 10) g;
         ANALYZE;";
    let config = cascading_config();
    let progress = delete_tenant_1(&schema(10, extra), &config).await;
    assert_eq!(progress.replans, 0, "{progress:?}");
    // Counted once, as it ran past max_batch_duration: a try under the bound first would be cut,
    // and count again when it made the step run unbounded. (A pass over `events` by block ranges
    // may be cut on a loaded machine: `timeouts` says nothing of the root here.)
    assert_eq!(progress.unbounded_steps, 1, "{progress:?}");
    let root = progress.table("\"app\".\"accounts\"").unwrap();
    assert_eq!((root.rows_deleted, root.batches), (1, 1), "{progress:?}");
    assert!(
        root.longest_batch_ms > 20.0,
        "the root row's delete ran past max_batch_duration: {progress:?}"
    );
}

#[tokio::test]
async fn a_row_whose_own_delete_outlasts_the_bound_runs_unbounded_without_a_replan() {
    // A project's delete outlasts the bound (`projects_with_events`). `tasks` is covered (a NOT
    // NULL key to the root beside its path through `projects`), so a project's delete may cascade
    // — only to rows its own step already deleted.
    let extra = projects_with_events(
        "CREATE TABLE app.tasks (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
             project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE);
         CREATE INDEX ON app.tasks (account_id);
         CREATE INDEX ON app.tasks (project_id);
         INSERT INTO app.tasks SELECT g, 1, 1 FROM generate_series(1, 10) g;",
    );
    let config = cascading_config();
    let progress = delete_tenant_1(&schema(10, &extra), &config).await;
    assert_eq!(progress.replans, 0, "{progress:?}");
    assert!(progress.unbounded_steps >= 1, "{progress:?}");
    let projects = progress.table("\"app\".\"projects\"").unwrap();
    assert_eq!(projects.rows_deleted, 1, "{progress:?}");
}

#[tokio::test]
async fn a_replan_goes_straight_to_the_first_allowance_that_changes_the_cut_rows_cascade() {
    // A project's delete outlasts the bound; `labels` is absorbed under `projects` (one label per
    // project by the estimates):
    // it stays absorbed under cascade_rows 2000, 250 and 31, so a project's delete would be the
    // same statement under each. The one re-plan goes to 0 (leaves first), where `labels` gets its
    // own step; the project's delete, still cut, then runs under the full statement_timeout.
    let extra = projects_with_events(
        "CREATE TABLE app.labels (id bigint PRIMARY KEY,
             project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE);
         CREATE INDEX ON app.labels (project_id);
         INSERT INTO app.labels VALUES (1, 1), (2, 2);",
    );
    let config = cascading_config();
    let progress = delete_tenant_1(&schema(10, &extra), &config).await;
    assert_eq!(progress.replans, 1, "{progress:?}");
    assert_eq!(progress.cascade_rows, Some(0), "{progress:?}");
    assert!(progress.unbounded_steps >= 1, "{progress:?}");
    let labels = progress.table("\"app\".\"labels\"").unwrap();
    assert_eq!(labels.rows_deleted, 1, "{progress:?}");
}

#[tokio::test]
async fn a_row_cut_by_the_scan_of_a_table_absorbed_below_it_runs_unbounded_without_a_replan() {
    // 1,000 projects (tenant 1 owns one), a million `notes` under them: 1,000 per project by the
    // estimates, within cascade_rows, so `notes` is absorbed under `projects`. Its key has no
    // index, so a project's delete scans all of `notes`, longer than the 16 ms bound. A plan with
    // less cascade would give `notes` a pass of its own and leave the project's delete that scan.
    let extra = "CREATE TABLE app.projects (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
         CREATE INDEX ON app.projects (account_id);
         INSERT INTO app.projects VALUES (1, 1);
         INSERT INTO app.projects SELECT g, 2 FROM generate_series(2, 1000) g;
         CREATE TABLE app.notes (id bigint PRIMARY KEY,
             project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE);
         INSERT INTO app.notes SELECT g, 2 + g % 999 FROM generate_series(1, 1000000) g;
         INSERT INTO app.notes SELECT 2000000 + g, 1 FROM generate_series(1, 50) g;
         ANALYZE;";
    let progress = delete_tenant_1(&schema(10, extra), &cascading_config()).await;
    assert_eq!(progress.replans, 0, "{progress:?}");
    assert!(progress.unbounded_steps >= 1, "{progress:?}");
    let notes = progress.table("\"app\".\"notes\"").unwrap();
    assert_eq!((notes.rows_deleted, notes.batches), (50, 0), "{progress:?}");
}

/// PostgreSQL compiles a statement estimated above `jit_above_cost` before it runs, and the
/// compile does not answer the bound's cancel: a bounded transaction runs with JIT off. The same
/// statement, planned outside one, is compiled (the server has JIT).
#[tokio::test]
async fn a_bounded_transaction_plans_its_statements_without_jit() {
    use deprov::db::{self, Bounds};
    use std::time::Duration;
    let env = crate::harness::env("").await;
    // Estimated at about 2·10⁸, far above the default jit_above_cost of 10⁵; only planned.
    const COSTLY: &str = "EXPLAIN (FORMAT JSON) SELECT count(*) \
        FROM generate_series(1, 100000) a CROSS JOIN generate_series(1, 100000) b";
    let jit = |explained: &serde_json::Value| explained[0].get("JIT").is_some();
    let outside: serde_json::Value = sqlx::query_scalar(COSTLY)
        .fetch_one(&env.pools.target)
        .await
        .unwrap();
    assert!(jit(&outside), "the server compiles it: {outside:#}");
    let bounds = Bounds::new(Duration::from_millis(50), Duration::from_millis(200));
    let mut tx = db::begin(&env.pools.target, bounds).await.unwrap();
    let inside: serde_json::Value = sqlx::query_scalar(COSTLY)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(
        !jit(&inside),
        "compiled in a bounded transaction: {inside:#}"
    );
}
