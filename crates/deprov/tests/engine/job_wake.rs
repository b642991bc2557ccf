//! An idle worker listening on the state database claims a job at once, not at its next poll,
//! when intake has just queued it (`NOTIFY deprov_jobs`, sent after intake's commit) and when an
//! operator's retry, a kill-switch release or reconcile queued it again (the same `NOTIFY`, sent
//! in their transaction).

use std::time::{Duration, Instant};

use deprov::engine::BatchLimits;
use deprov::queue::group_commit::GroupCommit;
use deprov::queue::{intake, kill_switch, operator, reconcile};

use crate::harness::{Env, config_hard, env_with_config, tenant_request, wait_for_job};
use crate::kill_switch_ack::{start_workers, status, until};

/// Records a deletion request for `tenant` through intake's group commit, as the HTTP API does.
async fn request(env: &Env, intake: &GroupCommit, tenant: &str) -> uuid::Uuid {
    let req = tenant_request("billing", tenant);
    let attempts = env.config.worker.max_attempts as i32;
    intake.record(req, attempts).await.unwrap().job_id
}

/// Polls (5 ms) until a worker has claimed the job (`attempts` above 0: a new job and a retried one
/// start at 0); returns how long that took, failing after `limit`.
async fn claimed_within(env: &Env, id: uuid::Uuid, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if env.job(id).await.attempts > 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "job {id} not claimed within {limit:?}: {:?}",
            env.job(id).await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An environment whose workers poll every 60 s: a claim within seconds is a wake-up's.
async fn env_polling_every_minute() -> Env {
    let config = config_hard("", "installation", "")
        .replace("poll_interval = \"20ms\"", "poll_interval = \"60s\"");
    assert!(config.contains("poll_interval = \"60s\""));
    env_with_config(&config).await
}

/// Waits for job `id` to finish; returns its state.
async fn finished(env: &Env, id: uuid::Uuid) -> String {
    wait_for_job(&env.pools.queue, id, "the job to finish", |j| {
        j.finished_at.is_some()
    })
    .await
    .state
}

#[tokio::test]
async fn an_idle_listening_worker_claims_a_new_job_long_before_its_next_poll() {
    let env = env_polling_every_minute().await;
    let intake = GroupCommit::start(env.pools.intake.clone(), 1, 8, 64, Duration::from_secs(5));
    let workers = start_workers(&env, 1, true);
    // The first job is claimed by the worker's first poll or by the wake-up; after it the worker
    // is idle, asleep for its 60 s poll interval.
    let first = request(&env, &intake, "1").await;
    claimed_within(&env, first, Duration::from_secs(30)).await;
    assert_eq!(finished(&env, first).await, "completed");
    // Tenant 2's cascade fails (a RESTRICT key): claimed, it is refused at once, nothing deleted.
    let second = request(&env, &intake, "2").await;
    let took = claimed_within(&env, second, Duration::from_secs(10)).await;
    println!("a job requested while the worker was idle was claimed after {took:?}");
    assert_eq!(finished(&env, second).await, "failed");
    workers.stop().await;
}

#[tokio::test]
async fn an_operator_retry_and_a_kill_switch_release_wake_an_idle_worker() {
    let env = env_polling_every_minute().await;
    let intake = GroupCommit::start(env.pools.intake.clone(), 1, 8, 64, Duration::from_secs(5));
    let workers = start_workers(&env, 1, true);
    // Tenant 2's cascade fails (a RESTRICT key): the job fails at once, nothing deleted.
    let refused = request(&env, &intake, "2").await;
    claimed_within(&env, refused, Duration::from_secs(30)).await;
    assert_eq!(finished(&env, refused).await, "failed");

    let mut tx = env.pools.queue.begin().await.unwrap();
    let state = operator::retry(&mut tx, refused, "on-call", "retry after the fix")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(state, "queued");
    let took = claimed_within(&env, refused, Duration::from_secs(10)).await;
    println!("a retried job was claimed after {took:?}");
    assert_eq!(finished(&env, refused).await, "failed");

    // Requested while the kill switch is engaged, the job waits held; the release queues it.
    let mut tx = env.pools.queue.begin().await.unwrap();
    kill_switch::set(&mut tx, true, "incident", "on-call")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let held = request(&env, &intake, "1").await;
    assert_eq!(env.job(held).await.state, "held");
    let mut tx = env.pools.queue.begin().await.unwrap();
    let (_, moved) = kill_switch::set(&mut tx, false, "resolved", "on-call")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(moved, 1);
    let took = claimed_within(&env, held, Duration::from_secs(10)).await;
    println!("a job queued by the release was claimed after {took:?}");
    assert_eq!(finished(&env, held).await, "completed");
    workers.stop().await;
}

/// Records a deletion request for `tenant` in a transaction of its own, without intake's wake-up.
async fn request_quietly(env: &Env, tenant: &str) -> uuid::Uuid {
    let mut conn = env.pools.queue.acquire().await.unwrap();
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let accepted = intake::record(&mut tx, &tenant_request("billing", tenant), 5)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    accepted.job_id
}

#[tokio::test]
async fn a_reconcile_resume_wakes_an_idle_worker() {
    let env = env_polling_every_minute().await;
    // Recorded before any worker runs, without a wake-up. The first job is set held as if handed
    // back while its switch was being released: no switch blocks it, and workers look at it again
    // only in an hour (`run_after`). Reconcile's resume queues it now. The second (tenant 2,
    // refused at once) takes the worker past its start-up.
    let held = request_quietly(&env, "1").await;
    sqlx::query(
        "UPDATE deprov.jobs SET state = 'held', run_after = now() + interval '1 hour' WHERE id = $1",
    )
    .bind(held)
    .execute(&env.pools.queue)
    .await
    .unwrap();
    let first = request_quietly(&env, "2").await;
    let workers = start_workers(&env, 1, true);
    assert_eq!(finished(&env, first).await, "failed");
    until(10, "a listening worker", || async {
        let st = status(&env.db).await;
        st.workers.len() == 1 && st.workers[0].listening
    })
    .await;
    assert_eq!(env.job(held).await.attempts, 0);
    let mut conn = env.pools.queue.acquire().await.unwrap();
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let applied = reconcile::apply(
        &mut tx,
        &env.pools.target,
        None,
        &BatchLimits::from(&env.config.hard_delete),
        &reconcile::Filter::default(),
        reconcile::Actions {
            resume: true,
            ..Default::default()
        },
        &reconcile::Acting {
            actor: "on-call",
            reason: "after the incident",
            rate: 10.0,
            max_attempts: 5,
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(applied.actions.len(), 1, "{:?}", applied.skipped);
    let took = claimed_within(&env, held, Duration::from_secs(10)).await;
    println!("a job resumed by reconcile was claimed after {took:?}");
    assert_eq!(finished(&env, held).await, "completed");
    workers.stop().await;
}
