//! A tree (a table's own `ON DELETE CASCADE` reference) reached through two paths: its key straight
//! to the root and a key to another of the tenant's tables. Its nodes hang under parents of the
//! other table spread across the tree, so a walk under those parents meets a node before its
//! descendants, and PostgreSQL's cascade deletes them all under that node's delete. The step
//! under the root row alone walks the whole tree leaves first, and goes first.

use crate::harness::{accounts_plan, env_with_schema};
use crate::tree_overrun::bounded_config;

/// Tenant 1: 100 buckets and a binary tree of 40,000 nodes (node `i`'s parent is `i / 2`, so every
/// parent has a lower key than its children), node `i` in bucket `i % 100`: node 1, the root, has
/// every other node below it, and bucket 1 holds it with nodes high and low in the tree. Each node
/// also keys its tenant straight. The bucket key is declared first, so the catalog lists its path
/// first. Tenant 2: one bucket and a chain of 10 nodes, untouched.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.buckets (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.buckets (account_id);
CREATE TABLE app.nodes (id int PRIMARY KEY,
    bucket_id int NOT NULL REFERENCES app.buckets ON DELETE CASCADE,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    parent int REFERENCES app.nodes (id) ON DELETE CASCADE, body text);
CREATE INDEX ON app.nodes (bucket_id);
CREATE INDEX ON app.nodes (account_id);
CREATE INDEX ON app.nodes (parent);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.buckets SELECT g, 1 FROM generate_series(0, 99) g;
INSERT INTO app.buckets VALUES (100, 2);
INSERT INTO app.nodes SELECT g, g % 100, 1, NULLIF(g / 2, 0), 'node' FROM generate_series(1, 40000) g;
INSERT INTO app.nodes SELECT g, 100, 2, CASE WHEN g > 50001 THEN g - 1 END, 'other'
    FROM generate_series(50001, 50010) g;
ANALYZE;
";

#[tokio::test]
async fn a_tree_reached_under_other_parents_is_walked_under_the_root_first() {
    let env = env_with_schema(&bounded_config(), SCHEMA).await;
    let plan = accounts_plan(&env.db).await;
    let paths: Vec<String> = plan
        .steps
        .iter()
        .filter(|s| plan.name(s.table).name == "nodes")
        .map(|s| plan.describe_path(s))
        .collect();
    assert_eq!(
        paths,
        [
            r#""app"."nodes" → "app"."accounts""#,
            r#""app"."nodes" → "app"."buckets" → "app"."accounts""#
        ],
        "the step under the root row first"
    );
    let progress = env.delete_tenant_1().await;
    assert_eq!(progress.rows_deleted, 40_101, "{progress:?}");
    // Leaves first, no batch meets a subtree: none runs past the bound of 80 ms plus its commit
    // (150 ms leaves room for a loaded machine), and no step needs the full statement_timeout.
    // Walked under the buckets first, the batches reach the root with most of the tree below it.
    assert_eq!(progress.unbounded_steps, 0, "{progress:?}");
    assert!(
        progress.longest_batch_ms <= 150.0,
        "longest batch {} ms: {progress:?}",
        progress.longest_batch_ms
    );
    let nodes = progress.table("\"app\".\"nodes\"").unwrap();
    assert_eq!(nodes.rows_deleted, 40_000, "{progress:?}");
    println!(
        "{} batches, longest {:.1} ms, {} cut short",
        progress.batches, progress.longest_batch_ms, progress.timeouts
    );
}
