//! The dispatcher: claims due outbox events, POSTs them signed, records each outcome.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::outbox::{self, Claimed};
use crate::config::NotificationsConfig;
use crate::db::{self, Bounds};
use crate::sources::standard_webhooks;
use crate::telemetry;

/// Why a dispatcher could not be built.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The HTTP client could not be built (TLS setup).
    #[error("notifications: cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// What one [`Dispatcher::round`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Events claimed (at most `max_in_flight`).
    pub claimed: usize,
    /// Answered 2xx.
    pub delivered: usize,
    /// Failed, to be retried after a backoff.
    pub retrying: usize,
    /// Failed for the last time: now `dead`.
    pub dead: usize,
    /// Pending events of types not configured, marked `skipped`.
    pub skipped: u64,
}

/// Delivers outbox events to `[notifications] url`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    pool: PgPool,
    config: Arc<NotificationsConfig>,
    id: Arc<str>,
    client: reqwest::Client,
}

/// Retry delay after failed attempt `attempt` (1-based): `base * 2^(attempt-1)` capped at `max`,
/// of which the fraction `jitter` is drawn at random (a delay `d` becomes one in `[d·(1-jitter), d]`).
pub fn retry_delay(attempt: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let exp = base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
        .min(max);
    exp.mul_f64(1.0 - jitter.clamp(0.0, 1.0) * rand::random::<f64>())
}

/// The Standard Webhooks headers of one delivery attempt: `webhook-id` = `id`, `webhook-timestamp` =
/// `timestamp` (Unix seconds), `webhook-signature` = `v1,<base64 HMAC-SHA256(key, "id.timestamp.body")>`.
pub fn signed_headers(
    key: &[u8],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> [(&'static str, String); 3] {
    [
        (standard_webhooks::ID, id.to_owned()),
        (standard_webhooks::TIMESTAMP, timestamp.to_string()),
        (
            standard_webhooks::SIGNATURE,
            standard_webhooks::sign(key, id, timestamp, body),
        ),
    ]
}

/// How a delivery attempt failed: the receiver's status if it answered, and a description.
struct Failure(Option<u16>, String);

/// A description of a client error without the URL (it may carry credentials) but with its cause.
fn describe(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("timed out after {} ms", timeout.as_millis());
    }
    let kind = if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    let mut cause = std::error::Error::source(e);
    let mut last = None;
    while let Some(c) = cause {
        last = Some(c.to_string());
        cause = c.source();
    }
    match last {
        Some(c) => format!("{kind}: {c}"),
        None => kind.to_owned(),
    }
}

impl Dispatcher {
    /// A dispatcher named `id` (its claims carry it) on the state database `pool`.
    ///
    /// # Errors
    /// [`NotifyError`] when the HTTP client cannot be built.
    pub fn new(pool: PgPool, config: NotificationsConfig, id: &str) -> Result<Self, NotifyError> {
        crate::sources::oidc::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("deprov/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            pool,
            config: Arc::new(config),
            id: id.into(),
            client,
        })
    }

    /// How long a claim keeps other dispatchers off an event: the request timeout twice, plus 5 s
    /// to record the outcome.
    fn lease(&self) -> Duration {
        self.config.timeout * 2 + Duration::from_secs(5)
    }

    /// Claims up to `max_in_flight` due events, delivers them concurrently and records each outcome.
    /// Tests drive this directly.
    ///
    /// # Errors
    /// Database errors while claiming. Errors recording an outcome are logged; the event's claim then
    /// expires and it is sent again (at-least-once; receivers deduplicate on `webhook-id`).
    pub async fn round(&self) -> Result<Round, sqlx::Error> {
        let c = &self.config;
        let mut round = Round::default();
        let mut tx = db::begin(&self.pool, Bounds::STATE).await?;
        if c.events.len() < crate::config::EVENT_TYPES.len() {
            round.skipped = outbox::skip_others(&mut *tx, &c.events).await?;
        }
        let claimed =
            outbox::claim(&mut *tx, &self.id, &c.events, c.max_in_flight, self.lease()).await?;
        tx.commit().await?;
        round.claimed = claimed.len();
        let mut tasks = JoinSet::new();
        for event in claimed {
            let this = self.clone();
            tasks.spawn(async move { this.deliver_and_record(event).await });
        }
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(Some(state)) => match state {
                    "delivered" => round.delivered += 1,
                    "dead" => round.dead += 1,
                    _ => round.retrying += 1,
                },
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, "notification delivery task ended abnormally")
                }
            }
        }
        Ok(round)
    }

    /// Sends one event and records the outcome; returns the state recorded (`None`: not recorded).
    async fn deliver_and_record(&self, event: Claimed) -> Option<&'static str> {
        let c = &self.config;
        let outcome = self.deliver(&event).await;
        let recorded = async {
            let mut tx = db::begin(&self.pool, Bounds::STATE).await?;
            let state = match &outcome {
                Ok(status) => outbox::delivered(&mut *tx, event.id, event.attempts, *status)
                    .await?
                    .then_some("delivered"),
                Err(Failure(status, error)) => {
                    let attempt = u32::try_from(event.attempts).unwrap_or(1);
                    let wait = retry_delay(attempt, c.backoff_base, c.backoff_max, c.jitter);
                    let state = outbox::failed(
                        &mut *tx,
                        event.id,
                        event.attempts,
                        *status,
                        error,
                        c.max_attempts,
                        c.max_age,
                        wait,
                    )
                    .await?;
                    state.map(|s| if s == "dead" { "dead" } else { "retry" })
                }
            };
            tx.commit().await?;
            Ok::<_, sqlx::Error>(state)
        }
        .await;
        match recorded {
            Ok(Some(outcome_label)) => {
                telemetry::notification_attempt(outcome_label);
                match (&outcome, outcome_label) {
                    (Ok(_), _) => {
                        tracing::debug!(event = %event.id, job = %event.job_id, "notification delivered")
                    }
                    (Err(Failure(status, error)), "dead") => tracing::error!(
                        event = %event.id, job = %event.job_id, kind = %event.event_type,
                        attempts = event.attempts, ?status, %error,
                        "notification undeliverable: now dead (see `deprov notifications list --state dead`)"
                    ),
                    (Err(Failure(status, error)), _) => tracing::warn!(
                        event = %event.id, job = %event.job_id, attempts = event.attempts, ?status, %error,
                        "notification delivery failed; will retry"
                    ),
                }
                Some(outcome_label)
            }
            Ok(None) => {
                // The claim expired and another dispatcher took the event over.
                telemetry::notification_attempt("lost");
                tracing::warn!(event = %event.id, "notification claim lost before its outcome was recorded");
                None
            }
            Err(e) => {
                telemetry::notification_attempt("unrecorded");
                tracing::warn!(event = %event.id, error = %e, "cannot record a notification outcome; it will be sent again");
                None
            }
        }
    }

    /// One signed POST of `event` (Standard Webhooks headers); `Ok(status)` on a 2xx.
    async fn deliver(&self, event: &Claimed) -> Result<u16, Failure> {
        let body = serde_json::to_vec(&event.payload)
            .map_err(|e| Failure(None, format!("cannot serialize the payload: {e}")))?;
        let id = event.id.to_string();
        let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
        let mut request = self
            .client
            .post(&self.config.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        for (name, value) in signed_headers(&self.config.key.0, &id, timestamp, &body) {
            request = request.header(name, value);
        }
        let sent = request.body(body).send().await;
        match sent {
            Ok(resp) if resp.status().is_success() => Ok(resp.status().as_u16()),
            Ok(resp) => {
                let status = resp.status();
                Err(Failure(
                    Some(status.as_u16()),
                    format!("receiver answered {status}"),
                ))
            }
            Err(e) => Err(Failure(None, describe(&e, self.config.timeout))),
        }
    }

    /// Runs rounds until `cancel` fires: again at once after a full round, else when the earliest
    /// retry is due or after `poll_interval`, whichever is sooner; backing off while the state
    /// database is unreachable. A round in progress is finished (bounded by the request timeout), so
    /// a stopping worker process may wait up to `[notifications] timeout` for it.
    pub async fn run(self, cancel: CancellationToken) {
        let poll = self.config.poll_interval;
        let max = usize::try_from(self.config.max_in_flight).unwrap_or(usize::MAX);
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            let wait = match self.round().await {
                Ok(r) if r.claimed >= max => {
                    failures = 0;
                    continue;
                }
                Ok(_) => {
                    failures = 0;
                    match outbox::next_due(&self.pool, &self.config.events).await {
                        Ok(Some(due)) => {
                            (due + Duration::from_millis(1)).clamp(Duration::from_millis(5), poll)
                        }
                        Ok(None) | Err(_) => poll,
                    }
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %e, "notifications: cannot claim events from the state database");
                    crate::worker::backoff(failures, poll, Duration::from_secs(30))
                }
            };
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod dispatch_tests;
