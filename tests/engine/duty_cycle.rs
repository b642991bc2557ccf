//! `[pacing] duty_cycle`: between batches the worker rests `work × (1 − d) / d`, so the hard delete
//! works at most `d` of the wall time, whatever a row costs.

use crate::harness::{config_hard, delete_tenant_1};

const SCHEMA: &str = "CREATE SCHEMA app;
     CREATE TABLE app.accounts (id bigint PRIMARY KEY, installation text UNIQUE, deleted_at timestamptz);
     CREATE TABLE app.items (id bigint PRIMARY KEY,
         account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
     CREATE INDEX ON app.items (account_id);
     INSERT INTO app.accounts VALUES (1, 'icfg_1', NULL), (2, 'icfg_2', NULL);
     INSERT INTO app.items SELECT g, 1, 'item ' || g FROM generate_series(1, 3000) g;
     INSERT INTO app.items SELECT 100000 + g, 2, 'other' FROM generate_series(1, 100) g;";

#[tokio::test]
async fn the_worker_rests_three_times_its_work_at_a_quarter_duty_cycle() {
    // Small batches that cannot grow far (max_batch_rows), so the job has many batches to rest
    // after; the harness's 1 s lease is renewed through the rests.
    let config = config_hard(
        "batch_rows = 20\nmax_batch_rows = 200\ncascade_rows = 0",
        "installation",
        "[pacing]\nduty_cycle = 0.25",
    );
    let progress = delete_tenant_1(SCHEMA, &config).await;
    let batch_ms: f64 = progress.tables.iter().map(|t| t.batch_ms).sum();
    assert!(progress.batches >= 15, "{progress:?}");
    // The work each rest answers for is every batch and all between them (the kill-switch checks
    // and checkpoints on the state database, deprov's own time), so the rests come to at least
    // three times the batches and the state database's time together.
    let measured = batch_ms + progress.bookkeeping_ms;
    assert!(
        progress.duty_cycle_ms >= 3.0 * measured * 0.98,
        "rested {} ms after {measured} ms of batches and bookkeeping: {progress:?}",
        progress.duty_cycle_ms,
    );
    // And not much more: what deprov does between statements is small beside them.
    assert!(
        progress.duty_cycle_ms <= 3.0 * (measured + 500.0),
        "{progress:?}"
    );
    assert_eq!(progress.rate_limited_ms, 0.0, "{progress:?}");
    assert_eq!(progress.rows_deleted, 3001, "{progress:?}");
}
