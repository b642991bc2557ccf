//! Connections that stop working: a worker that stops sending in the middle of a batch (frozen,
//! partitioned) must not keep the batch's row locks, nor commit the batch when it wakes up (the server
//! ends the transaction after `idle_in_transaction_session_timeout`, set by every bounded
//! transaction's opening); a pool whose connections all died (a restart) hands out new ones after
//! the first is found dead; and a worker whose check before the soft delete waits keeps its lease.

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

    // Woken up, the worker cannot commit what it deleted, and its run is retried (a lost
    // connection), not failed.
    let woken = frozen
        .commit()
        .await
        .expect_err("the server ended the batch");
    assert!(
        db::connection_lost(&woken) && deprov::engine::is_retryable(&woken),
        "{woken:?}"
    );
    let still: i64 = sqlx::query_scalar("SELECT count(*) FROM app.projects WHERE id = $1")
        .bind(project)
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(still, 1);
}

/// After PgBouncer or PostgreSQL restarted, every connection idle in a pool is dead; through a
/// transaction pooler none is pinged before use. The first statement to find one dead has the pool's
/// idle connections closed (`db::discard_idle`, as the worker does), so the next statements get new
/// connections instead of failing once per dead one (one job attempt each).
#[tokio::test]
async fn after_one_lost_connection_the_dead_idle_ones_are_closed_not_handed_out() {
    use sqlx::postgres::PgPoolOptions;
    let env = env("").await;
    let options = db::connect_options(&env.server.url("target"))
        .unwrap()
        .application_name("lost-connections");
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .test_before_acquire(false)
        .connect_lazy_with(options);
    let held: Vec<_> = futures::future::join_all((0..3).map(|_| db::acquire(&pool)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for mut conn in held {
        conn.return_to_pool().await;
    }
    assert_eq!(pool.num_idle(), 3);
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity \
         WHERE application_name = 'lost-connections'",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(terminated, vec![true; 3]);

    let select_1 = |pool: &sqlx::PgPool| {
        let pool = pool.clone();
        async move {
            let mut tx = db::begin(&pool, Bounds::STATE).await?;
            let one: i32 = db::query_scalar("SELECT 1").fetch_one(&mut *tx).await?;
            tx.commit().await?;
            Ok::<i32, sqlx::Error>(one)
        }
    };
    let lost = select_1(&pool).await.expect_err("a terminated connection");
    assert!(db::connection_lost(&lost), "{lost:?}");
    assert_eq!(db::discard_idle(&pool), 2);
    for answer in futures::future::join_all((0..3).map(|_| select_1(&pool))).await {
        assert_eq!(answer.expect("a new connection"), 1);
    }
}

/// A check before the soft delete that takes longer than a third of the lease (here: the simulation
/// waiting for a lock an application holds on a table it reads) renews the lease while it runs, so a
/// live worker's job is never left to expire and be taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_renewed_while_a_check_before_the_soft_delete_waits() {
    let config = crate::harness::config_hard(
        "batch_rows = 7\nmax_batch_rows = 7\nmax_batch_duration = \"850ms\"\n\
         lock_timeout = \"800ms\"\ncascade_rows = 0\ntrial_cascade = false",
        "installation",
        "",
    );
    let env = crate::harness::env_with_config(&config).await;
    // The application holds a lock on the table the simulation must read (the RESTRICT reference).
    let mut app = env.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE app.invoices IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *app)
        .await
        .unwrap();
    let job = env.request("1").await;
    let worker = env.worker("w1");
    let run = tokio::spawn(async move { worker.step().await.unwrap() });

    let waiting = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = 'deprov-target' AND wait_event_type = 'Lock'",
        )
        .fetch_one(&env.db)
        .await
        .unwrap();
        n > 0
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !waiting().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the check never waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let leased = env.job(job).await.lease_expires_at.expect("a lease");
    // Renewed (every third of the 1 s lease) before the check's own 800 ms lock_timeout ends it.
    let renewed = loop {
        let now = env.job(job).await.lease_expires_at.expect("a lease");
        if now > leased {
            break true;
        }
        if !waiting().await {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    app.rollback().await.unwrap();
    assert!(renewed, "the lease was not renewed while the check waited");
    run.await.unwrap();
    let done = env.job(job).await;
    assert_eq!((done.state.as_str(), done.attempts), ("completed", 1));
}
