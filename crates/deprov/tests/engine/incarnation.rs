//! While batches committed deferred since the last checkpoint, every batch checks, before it
//! commits, that the target is still the server run that took them
//! ([`deprov::engine::Incarnation`]); a batch on a restarted target fails with `TargetRestarted`
//! and deletes nothing, on each batch path (children of parents, a large parent's key range, a
//! block range, the sweep of held rows), and so does one whose statement failed there.

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

/// The target's incarnation now, and one as crash recovery leaves it: the same start time,
/// another statistics reset.
async fn now_and_recovered(db: &sqlx::PgPool, limits: &BatchLimits) -> (Incarnation, Incarnation) {
    let now = engine::incarnation(db, limits).await.unwrap();
    let recovered = Incarnation {
        stats_reset: Some("2000-01-01 00:00:00+00".into()),
        ..now.clone()
    };
    (now, recovered)
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
    let (now, recovered) = now_and_recovered(&env.db, &limits).await;
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

const BLOCKS_SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.notes (id bigserial PRIMARY KEY,
  account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
CREATE TABLE app.events (id bigserial PRIMARY KEY,
  account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, payload text);
CREATE INDEX ON app.events (account_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.notes (account_id, body) SELECT 1 + g % 2, 'n' || g FROM generate_series(1, 400) g;
INSERT INTO app.events (account_id, payload) SELECT 1, 'e' || g FROM generate_series(1, 50) g;
";

/// The batch reads the incarnation in its own statement (a block range: after its delete): on a
/// restarted target it still commits nothing. And a batch whose statement fails there (here a
/// lock it waited for too long) reports the restart, not the statement's error.
#[tokio::test]
async fn a_block_batch_or_a_failed_batch_on_a_restarted_target_reports_the_restart() {
    let env = env_with_schema(&config_text(""), BLOCKS_SCHEMA).await;
    let plan = crate::harness::accounts_plan(&env.db).await;
    let step_of = |table: &str| {
        plan.steps
            .iter()
            .position(|s| plan.name(s.table).to_string() == table)
            .unwrap()
    };
    let (notes, events) = (step_of("\"app\".\"notes\""), step_of("\"app\".\"events\""));
    assert!(
        plan.block_step(&plan.steps[notes]),
        "notes has no index on its key"
    );
    let limits = BatchLimits {
        rows: 1_000,
        lock_timeout: std::time::Duration::from_millis(50),
        statement_timeout: std::time::Duration::from_secs(5),
        deferred: true,
    };
    let (now, recovered) = now_and_recovered(&env.db, &limits).await;
    let count = |table: &'static str| {
        let db = env.db.clone();
        async move {
            let sql = match table {
                "notes" => "SELECT count(*) FROM app.notes WHERE account_id = 1",
                _ => "SELECT count(*) FROM app.events WHERE account_id = 1",
            };
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    let batch = |step: usize, unchanged: Incarnation| {
        let (db, plan) = (env.db.clone(), plan.clone());
        async move {
            let began = std::sync::OnceLock::new();
            let at = BatchStart {
                step,
                cursor: &Cursor::Start,
                parents: 10,
                large_parent: false,
                unchanged: Some(&unchanged),
                began: &began,
                jump: false,
            };
            engine::run_batch(&db, &plan, at, "1", &limits).await
        }
    };

    assert!(restarted(batch(notes, recovered.clone()).await));
    assert_eq!(
        count("notes").await,
        200,
        "a refused block batch deleted rows"
    );

    // A row of each table locked by another transaction: the batches wait past lock_timeout.
    let mut holder = env.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM app.notes WHERE account_id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    sqlx::query("SELECT 1 FROM app.events WHERE account_id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    for step in [notes, events] {
        assert!(restarted(batch(step, recovered.clone()).await));
        match batch(step, now.clone()).await {
            Err(EngineError::Db(e)) => assert_eq!(
                e.as_database_error().and_then(|d| d.code()).as_deref(),
                Some("55P03"),
                "{e}"
            ),
            other => panic!("expected the lock timeout on an unchanged target: {other:?}"),
        }
    }
    holder.rollback().await.unwrap();

    let done = batch(notes, now.clone()).await.unwrap();
    assert_eq!(done.deleted, 200);
    assert_eq!(count("notes").await, 0);
    assert_eq!(batch(events, now.clone()).await.unwrap().deleted, 50);
    assert_eq!(count("events").await, 0);
}
