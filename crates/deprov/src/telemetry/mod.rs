//! Prometheus metrics: the process-wide recorder, the names deprov records, and the scrape-time
//! collector ([`collect`]).
//!
//! deprov records through the `metrics` facade (0.24) into one process-wide
//! `metrics-exporter-prometheus` recorder, installed once by [`install`] and rendered by our own
//! axum route (`GET /metrics`, [`crate::http::metrics`]); the exporter's own HTTP listener is not used.
//! Counters and histograms are recorded where things happen (pool acquires in [`crate::db`], batches in
//! the worker, refusals at the HTTP edge); gauges that describe pools and databases are set at scrape
//! time by [`collect::Collector`]. Every metric is listed, with type, labels and meaning, in `docs/operations.md` →
//! Operations → Metrics.
//!
//! One registry per process, as Prometheus expects: `deprov serve` and each `deprov worker` expose
//! their own counters; the database-wide gauges (`deprov_jobs`, `deprov_queue_oldest_age_seconds`,
//! `deprov_kill_switch_engaged`, `deprov_kill_switches_engaged`, `deprov_target_lock_waiters`) read the same facts from every process.

pub mod collect;

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

/// Counter `{pool}`: new connections a pool opened (sqlx `after_connect`): the churn signal.
pub const CONNECTIONS_OPENED: &str = "deprov_db_connections_opened_total";
/// Histogram `{pool}`, seconds: time to get a connection from a pool ([`crate::db::acquire`]).
pub const ACQUIRE_SECONDS: &str = "deprov_db_pool_acquire_seconds";
/// Counter `{pool}`: acquires that gave up after the pool's `acquire_timeout`.
pub const ACQUIRE_TIMEOUTS: &str = "deprov_db_pool_acquire_timeouts_total";
/// Gauge `{pool, state="idle"|"in_use"}`: the pool's open connections, read at scrape.
pub const POOL_CONNECTIONS: &str = "deprov_db_pool_connections";
/// Gauge `{pool}`: the pool's `max_connections`.
pub const POOL_MAX: &str = "deprov_db_pool_max_connections";
/// Histogram, seconds: committed hard-delete batch transactions, BEGIN to COMMIT.
pub const BATCH_SECONDS: &str = "deprov_batch_duration_seconds";
/// Counter: rows deleted by hard-delete batches, including rows PostgreSQL's cascade removed under them.
pub const ROWS_DELETED: &str = "deprov_rows_deleted_total";
/// Counter: hard-delete batches rolled back on `lock_timeout` (SQLSTATE 55P03).
pub const LOCK_TIMEOUTS: &str = "deprov_lock_timeouts_total";
/// Counter: hard-delete batches rolled back on `statement_timeout` (SQLSTATE 57014).
pub const STATEMENT_TIMEOUTS: &str = "deprov_statement_timeouts_total";
/// Counter: intake requests refused 429 by the per-source rate limit.
pub const RATE_LIMITED: &str = "deprov_intake_rate_limited_total";
/// Counter: intake requests answered 503 because their group's commit was not confirmed in time
/// ([`crate::queue::intake::IntakeError::Unconfirmed`]; they may still be recorded).
pub const INTAKE_UNCONFIRMED: &str = "deprov_intake_unconfirmed_total";
/// Gauge `{state}`: jobs per state in the state database (every state, 0 included).
pub const JOBS: &str = "deprov_jobs";
/// Gauge, seconds: how long the oldest claimable queued job has waited since it became claimable
/// (`now() - run_after`); 0 when none waits.
pub const QUEUE_OLDEST_AGE: &str = "deprov_queue_oldest_age_seconds";
/// Gauge: 1 while the global kill switch is engaged (scoped switches: [`KILL_SWITCHES`]).
pub const KILL_SWITCH: &str = "deprov_kill_switch_engaged";
/// Gauge `{scope="source"|"tenant"}`: how many switches of that scope are engaged now.
pub const KILL_SWITCHES: &str = "deprov_kill_switches_engaged";
/// Gauge: sessions on the target database waiting on a heavyweight lock.
pub const TARGET_LOCK_WAITERS: &str = "deprov_target_lock_waiters";
/// Gauge, seconds: the target's largest standby `replay_lag` (0 without standbys).
pub const TARGET_REPLICATION_LAG: &str = "deprov_target_replication_lag_seconds";
/// Gauge `{database="state"|"target"}`: 1 when the last scrape-time read of that database succeeded.
pub const DB_UP: &str = "deprov_db_up";
/// Counter `{database}`: scrape-time reads of a database that failed or timed out.
pub const DB_READ_ERRORS: &str = "deprov_db_read_errors_total";

/// Gauge `{state="pending"|"delivered"|"dead"|"skipped"}`: notification events in `deprov.outbox`.
pub const NOTIFICATIONS: &str = "deprov_notifications";
/// Gauge, seconds: age of the oldest pending notification event (0 when none).
pub const NOTIFICATIONS_OLDEST_PENDING: &str = "deprov_notifications_oldest_pending_seconds";
/// Counter `{outcome="delivered"|"retry"|"dead"|"lost"|"unrecorded"}`: notification delivery
/// attempts by this process, by what was recorded ([`crate::notify`]).
pub const NOTIFICATION_DELIVERIES: &str = "deprov_notification_deliveries_total";
/// Counter `{source}`: SNS `SubscriptionConfirmation`s recorded without being confirmed
/// (`confirm_subscriptions` off): each needs an operator to confirm the subscription.
pub const SNS_UNCONFIRMED: &str = "deprov_sns_unconfirmed_subscriptions_total";
/// Counter `{source, status}`: deliveries to `POST /v1/webhooks/{source}` and calls of the Open
/// Service Broker routes answered with a 4xx status by the route (wrong signature, token or
/// credentials, unknown source, unreadable body, …). `source` is a configured source name, or
/// `unknown` for a name that is not configured.
pub const DELIVERIES_REFUSED: &str = "deprov_webhook_deliveries_refused_total";
/// Counter `{source, reason="no_event_type"|"not_a_delete_event"}`: verified deliveries acknowledged
/// 200 as ignored, by why.
pub const DELIVERIES_IGNORED: &str = "deprov_webhook_deliveries_ignored_total";
/// The `source` label of a refusal for a name that is not a configured source.
pub const UNKNOWN_SOURCE: &str = "unknown";

/// Bucket bounds (seconds) of every histogram: 1 ms to 30 s.
pub const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once; later calls return the same handle) and
/// describes every metric. When another global recorder was installed first (not done by deprov), the
/// returned handle renders an empty registry.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets(BUCKETS)
            .expect("BUCKETS is not empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        match metrics::set_global_recorder(recorder) {
            Ok(()) => describe(),
            Err(e) => tracing::warn!(error = %e, "a metrics recorder was already installed"),
        }
        handle
    })
}

fn describe() {
    describe_counter!(CONNECTIONS_OPENED, "New connections opened by a pool");
    describe_histogram!(
        ACQUIRE_SECONDS,
        Unit::Seconds,
        "Time to get a connection from a pool"
    );
    describe_counter!(ACQUIRE_TIMEOUTS, "Pool acquires that hit acquire_timeout");
    describe_gauge!(
        POOL_CONNECTIONS,
        "Open connections of a pool, idle or in use"
    );
    describe_gauge!(POOL_MAX, "max_connections of a pool");
    describe_histogram!(
        BATCH_SECONDS,
        Unit::Seconds,
        "Committed hard-delete batch transactions"
    );
    describe_counter!(ROWS_DELETED, "Rows deleted by hard-delete batches");
    describe_counter!(LOCK_TIMEOUTS, "Batches rolled back on lock_timeout");
    describe_counter!(
        STATEMENT_TIMEOUTS,
        "Batches rolled back on statement_timeout"
    );
    describe_counter!(RATE_LIMITED, "Intake requests refused by the rate limit");
    describe_counter!(
        INTAKE_UNCONFIRMED,
        "Intake requests answered 503 before their group's commit was confirmed"
    );
    describe_gauge!(JOBS, "Jobs per state");
    describe_gauge!(
        QUEUE_OLDEST_AGE,
        Unit::Seconds,
        "Wait of the oldest claimable queued job"
    );
    describe_gauge!(KILL_SWITCH, "1 while the kill switch is engaged");
    describe_gauge!(KILL_SWITCHES, "Scoped kill switches engaged, per scope");
    describe_gauge!(TARGET_LOCK_WAITERS, "Target sessions waiting on a lock");
    describe_gauge!(
        TARGET_REPLICATION_LAG,
        Unit::Seconds,
        "Largest standby replay_lag of the target"
    );
    describe_gauge!(
        DB_UP,
        "1 when the last scrape-time read of the database succeeded"
    );
    describe_counter!(DB_READ_ERRORS, "Scrape-time database reads that failed");
    describe_gauge!(NOTIFICATIONS, "Notification events per delivery state");
    describe_gauge!(
        NOTIFICATIONS_OLDEST_PENDING,
        Unit::Seconds,
        "Age of the oldest pending notification event"
    );
    describe_counter!(
        NOTIFICATION_DELIVERIES,
        "Notification delivery attempts by outcome"
    );
    describe_counter!(
        SNS_UNCONFIRMED,
        "SNS subscription confirmations recorded without being confirmed"
    );
    describe_counter!(
        DELIVERIES_REFUSED,
        "Webhook deliveries and broker calls refused with a 4xx status"
    );
    describe_counter!(
        DELIVERIES_IGNORED,
        "Verified webhook deliveries acknowledged as ignored, by reason"
    );
}

/// Renders the registry as Prometheus text exposition (format 0.0.4), after draining histogram
/// samples ([`PrometheusHandle::run_upkeep`]).
pub fn render() -> String {
    let handle = install();
    handle.run_upkeep();
    handle.render()
}

/// Drains histogram samples every 5 s until `cancel` fires, so memory stays bounded between scrapes.
pub fn spawn_upkeep(cancel: CancellationToken) {
    let handle = install();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(Duration::from_secs(5)) => handle.run_upkeep(),
            }
        }
    });
}

/// Records one pool acquire by pool `label` that waited `waited` (and timed out, if `timed_out`).
pub fn pool_acquired(label: &'static str, waited: Duration, timed_out: bool) {
    histogram!(ACQUIRE_SECONDS, "pool" => label).record(waited.as_secs_f64());
    if timed_out {
        counter!(ACQUIRE_TIMEOUTS, "pool" => label).increment(1);
    }
}

/// Records a new connection of pool `label`.
pub fn connection_opened(label: &'static str) {
    counter!(CONNECTIONS_OPENED, "pool" => label).increment(1);
}

/// Records a committed hard-delete batch: its transaction time and the rows it deleted (cascaded
/// rows included).
pub fn batch_committed(elapsed: Duration, rows: i64) {
    histogram!(BATCH_SECONDS).record(elapsed.as_secs_f64());
    counter!(ROWS_DELETED).increment(u64::try_from(rows).unwrap_or(0));
}

/// Records a hard-delete batch that failed with `sqlstate` (only timeouts are counted).
pub fn batch_failed(sqlstate: Option<&str>) {
    match sqlstate {
        Some(crate::sqlstate::LOCK_NOT_AVAILABLE) => counter!(LOCK_TIMEOUTS).increment(1),
        Some(crate::sqlstate::QUERY_CANCELED) => counter!(STATEMENT_TIMEOUTS).increment(1),
        _ => {}
    }
}

/// Records an intake request refused by the rate limit.
pub fn rate_limited() {
    counter!(RATE_LIMITED).increment(1);
}

/// Records an intake request answered 503 before its group's commit was confirmed.
pub fn intake_unconfirmed() {
    counter!(INTAKE_UNCONFIRMED).increment(1);
}

/// Records a notification delivery attempt by what was recorded: `delivered`, `retry`, `dead`,
/// `lost` (another dispatcher took the event over) or `unrecorded` (the state database failed).
pub fn notification_attempt(outcome: &'static str) {
    counter!(NOTIFICATION_DELIVERIES, "outcome" => outcome).increment(1);
}

/// Records a delivery (or broker call) of `source` (a configured name, or [`UNKNOWN_SOURCE`])
/// refused with `status`.
pub fn delivery_refused(source: &str, status: u16) {
    counter!(DELIVERIES_REFUSED, "source" => source.to_owned(), "status" => status.to_string())
        .increment(1);
}

/// Records a verified delivery of `source` acknowledged as ignored, for `reason`
/// (`no_event_type` or `not_a_delete_event`).
pub fn delivery_ignored(source: &str, reason: &'static str) {
    counter!(DELIVERIES_IGNORED, "source" => source.to_owned(), "reason" => reason).increment(1);
}
