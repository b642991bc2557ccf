//! Failure and completion notifications: the outbox row committed with the job's terminal state,
//! delivered signed to a real local HTTP receiver, retried with backoff, dead after max_attempts,
//! delivered after a crash, never twice at once by two dispatchers; listed and redriven by the CLI.
//! This module holds the receiver and helpers; the tests are in [`delivery`] and [`operations`].

mod delivery;
mod operations;

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use deprov::notify::{Dispatcher, outbox};
use deprov::sources::standard_webhooks;
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::harness::{Env, env};

pub(super) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the receiver got.
#[derive(Debug, Clone)]
pub(super) struct Hit {
    pub(super) at: Instant,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
}

impl Hit {
    pub(super) fn id(&self) -> String {
        self.headers[standard_webhooks::ID]
            .to_str()
            .unwrap()
            .to_owned()
    }

    pub(super) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// Verified by the repo's own verifier and the reference crate.
    pub(super) fn assert_signed(&self) {
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
pub(super) struct Receiver {
    hits: Arc<Mutex<Vec<Hit>>>,
    script: Arc<Mutex<VecDeque<u16>>>,
    latency: Duration,
    in_flight: Arc<Mutex<HashSet<String>>>,
    pub(super) overlapping: Arc<Mutex<Vec<String>>>,
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
    pub(super) async fn start(script: &[u16], latency: Duration) -> (Self, String) {
        Self::start_on("127.0.0.1:0", script, latency).await
    }

    /// [`Receiver::start`] on `addr`.
    pub(super) async fn start_on(addr: &str, script: &[u16], latency: Duration) -> (Self, String) {
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

    pub(super) fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

/// The harness configuration with `[notifications]` to `url`, the secret in a file (kept alive by
/// the returned guard).
pub(super) async fn env_notifying(url: &str, extra: &str) -> (Env, tempfile::NamedTempFile) {
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), format!("{SECRET}\n")).unwrap();
    let config = format!(
        "[notifications]\nurl = {url:?}\nsecret_file = {:?}\ntimeout = \"2s\"\npoll_interval = \"20ms\"\n{extra}",
        secret.path()
    );
    (env(&config).await, secret)
}

pub(super) fn dispatcher(env: &Env, name: &str) -> Dispatcher {
    Dispatcher::new(
        env.pools.queue.clone(),
        env.config.notifications.clone().unwrap(),
        name,
    )
    .unwrap()
}

/// Runs `d` in the background until the returned token is cancelled.
pub(super) fn spawn(d: Dispatcher) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let task = tokio::spawn(d.run(stop.clone()));
    (stop, task)
}

pub(super) async fn events(db: &PgPool) -> Vec<outbox::Event> {
    outbox::list(db, None, 1000).await.unwrap()
}

/// Polls the outbox until `pred` holds for all its events, at most 30 s.
pub(super) async fn wait_events(
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

pub(super) async fn cancel_queued(env: &Env, job: Uuid) {
    let mut conn = env.db.acquire().await.unwrap();
    deprov::queue::operator::cancel(&mut conn, job, "test", "no longer wanted")
        .await
        .unwrap();
}
