//! `engine::check_unchanged`: while batches committed deferred since the last checkpoint, every
//! batch first checks that the target is still the server run that took them
//! ([`deprov::engine::Incarnation`]); a batch on a restarted target fails with
//! `TargetRestarted` before it deletes anything, on each batch path (children of parents, a large
//! parent's key range, the sweep of held rows).

use deprov::engine::{self, BatchLimits, BatchStart, Cursor, EngineError, Incarnation};

use crate::harness::{config_text, env_with_schema};

const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.events (id bigserial PRIMARY KEY,
  account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, payload text);
CREATE INDEX ON app.events (account_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.events (account_id, payload) SELECT 1, 'e' || g FROM generate_series(1, 500) g;
INSERT INTO app.events (account_id, payload) SELECT 2, 'e' || g FROM generate_series(1, 10) g;
";

async fn events(db: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM app.events WHERE account_id = 1")
        .fetch_one(db)
        .await
        .unwrap()
}

fn restarted(result: Result<impl std::fmt::Debug, EngineError>) -> bool {
    matches!(result, Err(EngineError::TargetRestarted { .. }))
}

#[tokio::test]
async fn a_batch_on_a_restarted_target_deletes_nothing() {
    let env = env_with_schema(&config_text(""), SCHEMA).await;
    let plan = crate::harness::accounts_plan(&env.db).await;
    let step = plan
        .steps
        .iter()
        .position(|s| plan.name(s.table).to_string() == "\"app\".\"events\"")
        .unwrap();
    let limits = BatchLimits {
        rows: 100,
        lock_timeout: std::time::Duration::from_secs(1),
        statement_timeout: std::time::Duration::from_secs(5),
        deferred: true,
    };
    let now = engine::incarnation(&env.db, &limits).await.unwrap();
    // The same start time, another statistics reset: what crash recovery leaves.
    let recovered = Incarnation {
        stats_reset: Some("2000-01-01 00:00:00+00".into()),
        ..now.clone()
    };
    let batch = |cursor: Cursor, large_parent: bool, unchanged: Incarnation| {
        let (db, plan) = (env.db.clone(), plan.clone());
        async move {
            let began = std::sync::OnceLock::new();
            let at = BatchStart {
                step,
                cursor: &cursor,
                parents: 1,
                large_parent,
                unchanged: Some(&unchanged),
                began: &began,
                jump: false,
            };
            engine::run_batch(&db, &plan, at, "1", &limits).await
        }
    };

    // Children of parents: refused on the "recovered" target, runs on the same one.
    assert!(restarted(
        batch(Cursor::Start, false, recovered.clone()).await
    ));
    assert_eq!(events(&env.db).await, 500, "a refused batch deleted rows");
    let first = batch(Cursor::Start, false, now.clone()).await.unwrap();
    assert_eq!(first.deleted, 100);
    let Some(next @ Cursor::Within(..)) = first.next else {
        panic!("the batch did not stop within the parent: {:?}", first.next);
    };

    // A large parent's key range.
    assert!(restarted(
        batch(next.clone(), true, recovered.clone()).await
    ));
    assert_eq!(events(&env.db).await, 400);
    assert_eq!(
        batch(next.clone(), true, now.clone())
            .await
            .unwrap()
            .deleted,
        100
    );

    // The sweep of rows kept back.
    let table = plan.steps[step].table;
    assert!(restarted(
        engine::run_sweep(&env.db, &plan, table, "1", &limits, Some(&recovered)).await
    ));
    assert_eq!(events(&env.db).await, 300);

    // A statistics reset is what the check sees of a crash recovery: after one, the incarnation
    // read before it no longer passes (deprov then redoes the batches since its checkpoint).
    sqlx::query("SELECT pg_stat_reset_shared('bgwriter')")
        .execute(&env.db)
        .await
        .unwrap();
    let after = engine::incarnation(&env.db, &limits).await.unwrap();
    assert_eq!(after.started, now.started);
    assert_ne!(after.stats_reset, now.stats_reset);
    assert!(restarted(batch(next.clone(), true, now.clone()).await));
    assert_eq!(events(&env.db).await, 300);
}
