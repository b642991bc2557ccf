//! A small tenant created after a large one: its rows sit behind the large tenant's in key order.
//! `ORDER BY id LIMIT n` over the tenant's rows is planned as a walk of the primary key's index
//! (the planner assumes the tenant's rows are spread evenly), which passes every row of the other
//! tenant first. The batch bound cuts such a batch short; its retry reads first where the tenant's
//! rows begin (`engine::queries::batch`'s `jump`) and goes on from there, instead of shrinking to
//! one row and running unbounded.

use crate::harness::{config_hard, delete_tenant_1};

/// Tenant 2: 400,000 items (keys 1..400,000). Tenant 1: 3,000 items after them, a quarter with a
/// note. Leaves first (`cascade_rows = 0`), so the notes' step orders tenant 1's items as its
/// parents and the items' step orders them as the root's children: both meet tenant 2's rows.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.items (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
CREATE INDEX ON app.items (account_id);
CREATE TABLE app.notes (id bigint PRIMARY KEY,
    item_id bigint NOT NULL REFERENCES app.items ON DELETE CASCADE, body text);
CREATE INDEX ON app.notes (item_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.items SELECT g, 2, 'other' FROM generate_series(1, 400000) g;
INSERT INTO app.items SELECT 400000 + g, 1, 'mine' FROM generate_series(1, 3000) g;
INSERT INTO app.notes SELECT g, 400000 + g * 4, 'note' FROM generate_series(1, 750) g;
INSERT INTO app.notes SELECT 1000 + g, g * 4, 'other' FROM generate_series(1, 1000) g;
ANALYZE;
";

#[tokio::test]
async fn a_tenant_behind_another_in_key_order_is_deleted_within_the_batch_bound() {
    let config = config_hard(
        "batch_rows = 50\nmax_batch_duration = \"20ms\"\nlock_timeout = \"10ms\"\ncascade_rows = 0",
        "id",
        "[pacing]\nbackoff = \"1ms\"\nbackoff_max = \"1ms\"",
    );
    let progress = delete_tenant_1(SCHEMA, &config).await;
    assert_eq!(progress.rows_deleted, 3_751, "{progress:?}");
    // Without the jump each cut batch shrinks to one row, whose walk still outlasts the bound, and
    // the step runs unbounded (or, cascading, re-plans).
    assert_eq!(progress.unbounded_steps, 0, "{progress:?}");
    assert_eq!(progress.replans, 0, "{progress:?}");
    assert!(progress.jumps >= 1, "{progress:?}");
    // Committed batches stay near the bound of 16 ms; 150 ms leaves room for a loaded machine.
    assert!(
        progress.longest_batch_ms <= 150.0,
        "longest batch {} ms: {progress:?}",
        progress.longest_batch_ms
    );
    println!(
        "{} batches, {} jumps, longest {:.1} ms, {} cut short",
        progress.batches, progress.jumps, progress.longest_batch_ms, progress.timeouts
    );
}
