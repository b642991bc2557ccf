//! Idle workers listening on the state database claim a queued job at once (`NOTIFY deprov_jobs`
//! from migration 0009), not at their next poll.

use std::time::{Duration, Instant};

use crate::harness::{config_hard, env_with_config};
use crate::kill_switch_ack::start_workers;

/// Polls (5 ms) until a worker has claimed the job (`started_at` set); returns how long that took,
/// at most `limit`.
async fn claimed_within(env: &crate::harness::Env, id: uuid::Uuid, limit: Duration) -> Duration {
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

/// Polls (5 ms) until the job is finished, at most 30 s.
async fn until_finished(env: &crate::harness::Env, id: uuid::Uuid) {
    let started = Instant::now();
    while env.job(id).await.finished_at.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "job {id} not finished"
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
    let workers = start_workers(&env, 1, true);
    // The first job is claimed by the worker's first poll or by the wake-up; after it the worker
    // is idle, asleep for its 60 s poll interval.
    let first = env.request("1").await;
    claimed_within(&env, first, Duration::from_secs(30)).await;
    until_finished(&env, first).await;
    // Tenant 2's cascade fails (a RESTRICT key): claimed, it is refused at once, nothing deleted.
    let second = env.request("2").await;
    let took = claimed_within(&env, second, Duration::from_secs(20)).await;
    println!("a job requested while the worker was idle was claimed after {took:?}");
    until_finished(&env, second).await;
    workers.stop().await;
}
