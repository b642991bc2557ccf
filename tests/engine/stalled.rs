//! A worker that stops sending in the middle of a batch (frozen, partitioned) must not keep the
//! batch's row locks, nor commit the batch when it wakes up: the server ends the transaction after
//! `idle_in_transaction_session_timeout` (set by every bounded transaction's opening).

use std::time::Duration;

use deprov::db::{self, Bounds};

use crate::harness::env;

#[tokio::test]
async fn a_batch_whose_worker_stops_sending_is_rolled_back_by_the_server() {
    let env = env("").await;
    let project: i64 = sqlx::query_scalar("SELECT min(id) FROM app.projects WHERE account_id = 1")
        .fetch_one(&env.db)
        .await
        .unwrap();
    // A batch's bounds: statements of at most 200 ms, so the idle bound is its 1 s floor.
    let bounds = Bounds::new(Duration::from_millis(50), Duration::from_millis(200));
    assert_eq!(
        db::idle_in_transaction_timeout(bounds.statement_timeout),
        Duration::from_secs(1)
    );
    let mut frozen = db::begin(&env.pools.target, bounds).await.unwrap();
    let deleted = db::query("DELETE FROM app.projects WHERE id = $1")
        .bind(project)
        .execute(&mut *frozen)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(deleted, 1);

    // The worker now sends nothing. Another session wants the row: it waits on the frozen batch's
    // row lock until the server ends that batch, far within its own 10 s.
    let mut other = db::begin(
        &env.db,
        Bounds::new(Duration::from_secs(10), Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let touched = db::query("UPDATE app.projects SET name = name WHERE id = $1")
        .bind(project)
        .execute(&mut *other)
        .await
        .expect("the frozen batch's lock is released by the server")
        .rows_affected();
    other.commit().await.unwrap();
    assert_eq!(touched, 1, "the frozen batch's DELETE was rolled back");

    // Woken up, the worker cannot commit what it deleted.
    assert!(frozen.commit().await.is_err());
    let still: i64 = sqlx::query_scalar("SELECT count(*) FROM app.projects WHERE id = $1")
        .bind(project)
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(still, 1);
}
