//! Delivery: one signed event per finished job, retries with growing delays, dead after
//! max_attempts, delivered after a crash.

use std::collections::HashMap;
use std::time::Duration;

use deprov::notify::outbox;
use deprov::queue::JobState;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::*;

#[tokio::test]
async fn completed_failed_and_cancelled_jobs_each_deliver_exactly_one_signed_event() {
    let (receiver, url) = Receiver::start(&[], Duration::ZERO).await;
    let (env, _secret) = env_notifying(&url, "").await;
    let completed = env.request("1").await;
    let failed = env.request("2").await; // a RESTRICT reference refuses it
    let cancelled = env.request("3").await;
    cancel_queued(&env, cancelled).await;
    env.drain(&env.worker("w1")).await;
    assert_eq!(env.job(completed).await.state(), JobState::Completed);
    assert_eq!(env.job(failed).await.state(), JobState::Failed);

    // Committed with the state change, before any dispatcher ran.
    let pending = events(&env.db).await;
    assert_eq!(pending.len(), 3, "{pending:#?}");
    assert!(
        pending
            .iter()
            .all(|e| e.state == "pending" && e.attempts == 0)
    );
    assert!(receiver.hits().is_empty());

    let (stop, task) = spawn(dispatcher(&env, "d1"));
    let done = wait_events(&env.db, "three delivered events", |all| {
        all.len() == 3 && all.iter().all(|e| e.state == "delivered")
    })
    .await;
    stop.cancel();
    task.await.unwrap();

    let hits = receiver.hits();
    assert_eq!(hits.len(), 3, "exactly one request per event");
    let mut by_job = HashMap::new();
    for hit in &hits {
        hit.assert_signed();
        let body = hit.json();
        let job: Uuid = body["data"]["job_id"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            body["type"].as_str().unwrap(),
            format!("job.{}", body["data"]["state"].as_str().unwrap())
        );
        let event = done.iter().find(|e| e.job_id == job).unwrap();
        assert_eq!(hit.id(), event.id.to_string(), "webhook-id is the event ID");
        assert_eq!(event.attempts, 1);
        assert_eq!(event.last_status, Some(200));
        assert!(by_job.insert(job, body).is_none(), "one event per job");
    }
    assert_eq!(by_job[&completed]["type"], "job.completed");
    assert_eq!(by_job[&completed]["data"]["tenant_id"], "1");
    assert!(by_job[&completed]["data"]["rows_deleted"].as_i64().unwrap() > 0);
    assert_eq!(
        by_job[&completed]["data"]["requests"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(by_job[&failed]["type"], "job.failed");
    let error = by_job[&failed]["data"]["error"].as_str().unwrap();
    assert!(error.contains("invoices"), "{error}");
    assert_eq!(by_job[&cancelled]["type"], "job.cancelled");

    // Nothing more is sent: a later round finds nothing due.
    let round = dispatcher(&env, "d2").round().await.unwrap();
    assert_eq!(round.claimed, 0);
    assert_eq!(receiver.hits().len(), 3);
}

#[tokio::test]
async fn a_receiver_answering_500_twice_gets_three_attempts_with_growing_delays() {
    let (receiver, url) = Receiver::start(&[500, 500], Duration::ZERO).await;
    let (env, _secret) = env_notifying(
        &url,
        "backoff_base = \"150ms\"\nbackoff_max = \"10s\"\njitter = 0.2\nmax_attempts = 5",
    )
    .await;
    let job = env.request("3").await;
    env.drain(&env.worker("w1")).await;
    assert_eq!(env.job(job).await.state(), JobState::Completed);

    let (stop, task) = spawn(dispatcher(&env, "d1"));
    let done = wait_events(&env.db, "the event delivered", |all| {
        all.len() == 1 && all[0].state == "delivered"
    })
    .await;
    stop.cancel();
    task.await.unwrap();

    assert_eq!(done[0].attempts, 3);
    assert_eq!(done[0].last_status, Some(200));
    let hits = receiver.hits();
    assert_eq!(hits.len(), 3);
    for hit in &hits {
        hit.assert_signed();
        assert_eq!(
            hit.id(),
            done[0].id.to_string(),
            "the same webhook-id on every attempt"
        );
    }
    let first = hits[1].at - hits[0].at;
    let second = hits[2].at - hits[1].at;
    // Planned: 120..=150 ms after attempt 1, 240..=300 ms after attempt 2.
    assert!(first >= Duration::from_millis(115), "{first:?}");
    assert!(second >= Duration::from_millis(235), "{second:?}");
    assert!(second > first, "delays grow: {first:?} then {second:?}");
}

#[tokio::test]
async fn a_receiver_that_is_down_leaves_the_event_pending_then_dead_after_max_attempts() {
    // A port nothing listens on: bound, then closed.
    let url = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}/hook", l.local_addr().unwrap())
    };
    let (env, _secret) = env_notifying(
        &url,
        "backoff_base = \"20ms\"\nbackoff_max = \"40ms\"\nmax_attempts = 3",
    )
    .await;
    deprov::telemetry::install();
    let job = env.request("3").await;
    env.drain(&env.worker("w1")).await;
    let d = dispatcher(&env, "d1");

    let round = d.round().await.unwrap();
    assert_eq!((round.claimed, round.retrying, round.dead), (1, 1, 0));
    let after_one = events(&env.db).await;
    assert_eq!(after_one[0].state, "pending");
    assert_eq!(after_one[0].attempts, 1);
    assert_eq!(after_one[0].last_status, None);
    let error = after_one[0].last_error.clone().unwrap();
    assert!(error.contains("connection"), "{error}");

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut dead = 0;
    while dead == 0 {
        assert!(
            Instant::now() < deadline,
            "never went dead: {:#?}",
            events(&env.db).await
        );
        dead += d.round().await.unwrap().dead;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let all = events(&env.db).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].state, "dead");
    assert_eq!(all[0].attempts, 3);
    assert!(all[0].finished_at.is_some());
    assert_eq!(all[0].job_id, job);
    assert_eq!(
        env.job(job).await.state(),
        JobState::Completed,
        "the job is not affected"
    );
    // Listed as dead, counted by the gauge, and the attempt that made it dead by the counter.
    let listed = outbox::list(&env.db, Some("dead"), 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    let metrics = deprov::telemetry::collect::Collector::new(
        env.pools.clone(),
        false,
        Duration::from_secs(2),
    )
    .render()
    .await;
    let value = |series: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
    };
    assert_eq!(
        value("deprov_notifications{state=\"dead\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        value("deprov_notifications{state=\"pending\"}"),
        Some(0.0),
        "{metrics}"
    );
    assert!(
        value("deprov_notification_deliveries_total{outcome=\"dead\"}").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    assert!(
        value("deprov_notification_deliveries_total{outcome=\"retry\"}").is_some_and(|n| n >= 2.0),
        "{metrics}"
    );
    // No more attempts once dead; a redrive makes it pending again with attempts reset.
    assert_eq!(d.round().await.unwrap().claimed, 0);
    let redriven = outbox::redrive(&env.db, None).await.unwrap();
    assert_eq!(redriven, vec![all[0].id]);
    let again = events(&env.db).await;
    assert_eq!((again[0].state.as_str(), again[0].attempts), ("pending", 0));
}

#[tokio::test]
async fn an_event_committed_before_a_crash_is_delivered_by_a_new_dispatcher() {
    let (receiver, url) = Receiver::start(&[], Duration::ZERO).await;
    let (env, _secret) = env_notifying(&url, "").await;
    let job = env.request("3").await;
    // The worker commits the job's end (and its event) and "dies": no dispatcher ran.
    env.drain(&env.worker("w1")).await;
    assert_eq!(env.job(job).await.state(), JobState::Completed);
    // A dispatcher claimed the event and died before sending it (its claim lasts 100 ms).
    let types: Vec<String> = deprov::config::EVENT_TYPES
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let claimed = outbox::claim(&env.db, "crashed", &types, 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(receiver.hits().is_empty());

    // A new worker process starts (its run loop starts the dispatcher).
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (w, stop) = (env.worker("restarted"), stop.clone());
        async move { w.run(stop).await }
    });
    let done = wait_events(&env.db, "the event delivered after the restart", |all| {
        all.len() == 1 && all[0].state == "delivered"
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    assert_eq!(done[0].attempts, 2, "the lost claim and the delivery");
    let hits = receiver.hits();
    assert_eq!(hits.len(), 1);
    hits[0].assert_signed();
    assert_eq!(hits[0].json()["data"]["job_id"], job.to_string());
    let by: String = sqlx::query_scalar("SELECT claimed_by FROM deprov.outbox")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(by, "restarted");
}
