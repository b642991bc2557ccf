//! A tree (a table's own `ON DELETE CASCADE` reference) whose parents have higher keys than their
//! children: a batch (descending keys) meets parents first, and PostgreSQL's cascade deletes their
//! subtrees under it — more rows than the batch selected, for far longer than
//! `max_batch_duration`. Every batch runs under ⅘ of it, so one that cascades further than its
//! size predicted is cut short and retried smaller.

use crate::harness::{config_hard, delete_tenant_1};

/// Tenant 1: 60,000 childless nodes with the highest keys, then 100 roots (keys 1,000,001..) each
/// the top of a chain of 1,500 nodes with lower keys (each node's parent the next one up its
/// chain): by the time the batches reach the roots they have grown on childless rows, and each root
/// they select cascades to 1,500 rows. Tenant 2: one chain of 10, untouched.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.nodes (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    parent int REFERENCES app.nodes (id) ON DELETE CASCADE, body text);
CREATE INDEX ON app.nodes (account_id);
CREATE INDEX ON app.nodes (parent);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.nodes SELECT 2000000 + g, 1, NULL, 'leaf' FROM generate_series(1, 60000) g;
INSERT INTO app.nodes SELECT 1000000 + c, 1, NULL, 'root' FROM generate_series(1, 100) c;
INSERT INTO app.nodes SELECT c * 1500 + i, 1,
    CASE WHEN i = 1499 THEN 1000001 + c ELSE c * 1500 + i + 1 END, 'chain'
    FROM generate_series(0, 99) c, generate_series(0, 1499) i;
INSERT INTO app.nodes SELECT g, 2, CASE WHEN g < 3000010 THEN g + 1 END, 'other'
    FROM generate_series(3000001, 3000010) g;
ANALYZE;
";

/// The default sizing (50 rows first, then by time towards half of 100 ms), a batch bound of 80 ms,
/// nothing absorbed, and pauses of 1 ms.
pub fn bounded_config() -> String {
    config_hard(
        "batch_rows = 50\nmax_batch_duration = \"100ms\"\nlock_timeout = \"50ms\"\ncascade_rows = 0",
        "id",
        "[pacing]\nbackoff = \"1ms\"\nbackoff_max = \"1ms\"",
    )
}

#[tokio::test]
async fn batches_that_cascade_down_a_tree_stay_within_the_batch_bound() {
    let progress = delete_tenant_1(SCHEMA, &bounded_config()).await;
    assert_eq!(progress.rows_deleted, 210_101, "{progress:?}");
    let nodes = progress.table("\"app\".\"nodes\"").unwrap();
    assert_eq!(nodes.rows_deleted, 210_100, "{progress:?}");
    // Committed batches end within the bound of 80 ms plus their commit; rolled-back ones at it,
    // plus the cancel's and the rollback's way back. 150 ms leaves room for a loaded machine (a
    // clean-clone CI run saw a rolled-back batch take 104.8 ms from BEGIN); without the bound a
    // batch ran 615 ms.
    assert!(
        progress.longest_batch_ms <= 150.0,
        "longest batch {} ms: {progress:?}",
        progress.longest_batch_ms
    );
    assert!(progress.longest_rolled_back_ms <= 150.0, "{progress:?}");
    assert_eq!(progress.unbounded_steps, 0, "{progress:?}");
    println!(
        "{} batches, longest {:.1} ms, {} cut short (longest {:.1} ms)",
        progress.batches,
        progress.longest_batch_ms,
        progress.timeouts,
        progress.longest_rolled_back_ms
    );
}
