//! An idle worker listening on the state database claims a job intake has just queued at once
//! (`NOTIFY deprov_jobs`, sent after intake's commit), not at its next poll.

use std::time::{Duration, Instant};

use deprov::queue::group_commit::GroupCommit;

use crate::harness::{Env, config_hard, env_with_config, tenant_request, wait_for_job};
use crate::kill_switch_ack::start_workers;

/// Records a deletion request for `tenant` through intake's group commit, as the HTTP API does.
async fn request(env: &Env, intake: &GroupCommit, tenant: &str) -> uuid::Uuid {
    let req = tenant_request("billing", tenant);
    let attempts = env.config.worker.max_attempts as i32;
    intake.record(req, attempts).await.unwrap().job_id
}

/// Polls (5 ms) until a worker has claimed the job (`started_at` set); returns how long that took,
/// failing after `limit`.
async fn claimed_within(env: &Env, id: uuid::Uuid, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if env.job(id).await.started_at.is_some() {
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

#[tokio::test]
async fn an_idle_listening_worker_claims_a_new_job_long_before_its_next_poll() {
    let config = config_hard("", "installation", "")
        .replace("poll_interval = \"20ms\"", "poll_interval = \"60s\"");
    assert!(config.contains("poll_interval = \"60s\""));
    let env = env_with_config(&config).await;
    let intake = GroupCommit::start(env.pools.intake.clone(), 1, 8, 64, Duration::from_secs(5));
    let workers = start_workers(&env, 1, true);
    // The first job is claimed by the worker's first poll or by the wake-up; after it the worker
    // is idle, asleep for its 60 s poll interval.
    let first = request(&env, &intake, "1").await;
    claimed_within(&env, first, Duration::from_secs(30)).await;
    wait_for_job(&env.pools.queue, first, "the first job to finish", |j| {
        j.finished_at.is_some()
    })
    .await;
    // Tenant 2's cascade fails (a RESTRICT key): claimed, it is refused at once, nothing deleted.
    let second = request(&env, &intake, "2").await;
    let took = claimed_within(&env, second, Duration::from_secs(10)).await;
    println!("a job requested while the worker was idle was claimed after {took:?}");
    let done = wait_for_job(&env.pools.queue, second, "the second job to finish", |j| {
        j.finished_at.is_some()
    })
    .await;
    assert_eq!(done.state, "failed", "{done:?}");
    workers.stop().await;
}
