//! Failure and completion notifications: the outbox row committed with the job's terminal state,
//! delivered signed to a real local HTTP receiver, retried with backoff, dead after max_attempts,
//! delivered after a crash, never twice at once by two dispatchers.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use deprov::notify::{Dispatcher, outbox};
use deprov::queue::JobState;
use deprov::sources::standard_webhooks;
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::harness::{Env, env};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Hit {
    at: Instant,
    headers: HeaderMap,
    body: Bytes,
}

impl Hit {
    fn id(&self) -> String {
        self.headers[standard_webhooks::ID]
            .to_str()
            .unwrap()
            .to_owned()
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// Verified by the repo's own verifier and the reference crate.
    fn assert_signed(&self) {
        let key = standard_webhooks::derive_key(SECRET).unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        assert_eq!(
            standard_webhooks::verify(
                &[key],
                &self.headers,
                &self.body,
                now,
                Duration::from_secs(300)
            ),
            Ok(()),
            "{:?}",
            self.headers
        );
        standardwebhooks::Webhook::new(SECRET)
            .unwrap()
            .verify(&self.body, &self.headers)
            .expect("the reference crate accepts the signature");
    }
}

/// A real HTTP receiver on 127.0.0.1:0: answers the scripted statuses in order, then 200; takes
/// `latency` to answer (a slow receiver); records every request and any event ID received while
/// a request with the same ID was still being answered.
#[derive(Clone, Default)]
struct Receiver {
    hits: Arc<Mutex<Vec<Hit>>>,
    script: Arc<Mutex<VecDeque<u16>>>,
    latency: Duration,
    in_flight: Arc<Mutex<HashSet<String>>>,
    overlapping: Arc<Mutex<Vec<String>>>,
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let id = headers
        .get(standard_webhooks::ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if !r.in_flight.lock().unwrap().insert(id.clone()) {
        r.overlapping.lock().unwrap().push(id.clone());
    }
    if !r.latency.is_zero() {
        // The receiver's own processing time, not a wait of the test.
        tokio::time::sleep(r.latency).await;
    }
    r.in_flight.lock().unwrap().remove(&id);
    r.hits.lock().unwrap().push(Hit {
        at: Instant::now(),
        headers,
        body,
    });
    let status = r.script.lock().unwrap().pop_front().unwrap_or(200);
    StatusCode::from_u16(status).unwrap()
}

impl Receiver {
    /// Starts it; returns its URL. It runs until the test's runtime ends.
    async fn start(script: &[u16], latency: Duration) -> (Self, String) {
        Self::start_on("127.0.0.1:0", script, latency).await
    }

    /// [`Receiver::start`] on `addr`.
    async fn start_on(addr: &str, script: &[u16], latency: Duration) -> (Self, String) {
        let r = Self {
            script: Arc::new(Mutex::new(script.iter().copied().collect())),
            latency,
            ..Self::default()
        };
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(r.clone());
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (r, url)
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

/// The harness configuration with `[notifications]` to `url`, the secret in a file (kept alive by
/// the returned guard).
async fn env_notifying(url: &str, extra: &str) -> (Env, tempfile::NamedTempFile) {
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), format!("{SECRET}\n")).unwrap();
    let config = format!(
        "[notifications]\nurl = {url:?}\nsecret_file = {:?}\ntimeout = \"2s\"\npoll_interval = \"20ms\"\n{extra}",
        secret.path()
    );
    (env(&config).await, secret)
}

fn dispatcher(env: &Env, name: &str) -> Dispatcher {
    Dispatcher::new(
        env.pools.queue.clone(),
        env.config.notifications.clone().unwrap(),
        name,
    )
    .unwrap()
}

/// Runs `d` in the background until the returned token is cancelled.
fn spawn(d: Dispatcher) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let task = tokio::spawn(d.run(stop.clone()));
    (stop, task)
}

async fn events(db: &PgPool) -> Vec<outbox::Event> {
    outbox::list(db, None, 1000).await.unwrap()
}

/// Polls the outbox until `pred` holds for all its events, at most 30 s.
async fn wait_events(
    db: &PgPool,
    what: &str,
    pred: impl Fn(&[outbox::Event]) -> bool,
) -> Vec<outbox::Event> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all = events(db).await;
        if pred(&all) {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {all:#?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn cancel_queued(env: &Env, job: Uuid) {
    let mut conn = env.db.acquire().await.unwrap();
    deprov::queue::operator::cancel(&mut conn, job, "test", "no longer wanted")
        .await
        .unwrap();
}

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

#[tokio::test]
async fn two_dispatchers_never_deliver_the_same_event_twice() {
    let (receiver, url) = Receiver::start(&[], Duration::from_millis(15)).await;
    let (env, _secret) = env_notifying(&url, "max_in_flight = 4").await;
    let mut jobs = Vec::new();
    for n in 0..40 {
        let job = env.request(&format!("{}", 1000 + n)).await;
        cancel_queued(&env, job).await;
        jobs.push(job);
    }
    assert_eq!(events(&env.db).await.len(), 40);

    let (stop_a, a) = spawn(dispatcher(&env, "a"));
    let (stop_b, b) = spawn(dispatcher(&env, "b"));
    wait_events(&env.db, "40 delivered events", |all| {
        all.len() == 40 && all.iter().all(|e| e.state == "delivered")
    })
    .await;
    stop_a.cancel();
    stop_b.cancel();
    a.await.unwrap();
    b.await.unwrap();

    let hits = receiver.hits();
    let ids: HashSet<String> = hits.iter().map(Hit::id).collect();
    assert_eq!(hits.len(), 40, "one request per event");
    assert_eq!(ids.len(), 40);
    assert!(receiver.overlapping.lock().unwrap().is_empty());
    let per: Vec<(String, i64, i32)> = sqlx::query_as(
        "SELECT claimed_by, count(*), max(attempts) FROM deprov.outbox GROUP BY claimed_by ORDER BY 1",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert!(per.iter().all(|(_, _, max)| *max == 1), "{per:?}");
    assert_eq!(per.len(), 2, "both dispatchers delivered: {per:?}");
}

/// Runs the `deprov` binary with `args` on the env's state database; returns stdout.
fn deprov_cli(env: &Env, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(args)
        .env("DEPROV_DATABASE_URL", env.server.url("target"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deprov {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn dead_events_are_listed_by_the_cli_and_a_redrive_delivers_them_once_the_receiver_is_back() {
    // The receiver's port, closed for now.
    let addr = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (env, _secret) = env_notifying(&format!("http://{addr}/hook"), "max_attempts = 1").await;
    let job = env.request("3").await;
    env.drain(&env.worker("w1")).await;
    let d = dispatcher(&env, "d1");
    assert_eq!(d.round().await.unwrap().dead, 1);

    let listed: serde_json::Value = serde_json::from_str(&deprov_cli(
        &env,
        &["notifications", "list", "--state", "dead", "--json"],
    ))
    .unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["job_id"], job.to_string());
    assert_eq!(listed[0]["event_type"], "job.completed");
    assert_eq!(listed[0]["attempts"], 1);
    let table = deprov_cli(&env, &["notifications", "list"]);
    assert!(
        table.starts_with("EVENT") && table.contains(" dead "),
        "{table}"
    );
    let none: serde_json::Value = serde_json::from_str(&deprov_cli(
        &env,
        &["notifications", "list", "--state", "pending", "--json"],
    ))
    .unwrap();
    assert_eq!(none.as_array().unwrap().len(), 0);

    // The receiver is fixed; an operator sends the dead events again.
    let (receiver, _) = Receiver::start_on(&addr, &[], Duration::ZERO).await;
    deprov_cli(
        &env,
        &[
            "notifications",
            "redrive",
            "--all-dead",
            "--reason",
            "receiver fixed",
            "--actor",
            "ops",
        ],
    );
    let (actor, action, reason): (String, String, String) = sqlx::query_as(
        "SELECT actor, action, reason FROM deprov.audit_log WHERE action = 'notification.redrive'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(
        (actor.as_str(), action.as_str(), reason.as_str()),
        ("cli:ops", "notification.redrive", "receiver fixed")
    );
    let round = d.round().await.unwrap();
    assert_eq!((round.claimed, round.delivered), (1, 1));
    let hits = receiver.hits();
    assert_eq!(hits.len(), 1);
    hits[0].assert_signed();
    assert_eq!(hits[0].id(), listed[0]["id"].as_str().unwrap());
}
