//! `GET /metrics`: Prometheus text exposition of this process's metrics
//! ([`crate::telemetry::collect::Collector`]).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::telemetry::collect::Collector;

/// The media type of the Prometheus text exposition format 0.0.4.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Metrics in Prometheus text format: pool gauges and acquire times, batch and deletion counters,
/// jobs per state, queue age, kill switch, target lock waiters (`docs/operations.md` → Metrics lists
/// them all). Unauthenticated, like `/healthz`. Always 200: the gauges read from a database are
/// bounded by `[metrics] read_timeout`; a database that could not be read keeps its last values and
/// shows `deprov_db_up{database} 0`.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "health",
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", body = String,
         content_type = "text/plain; version=0.0.4; charset=utf-8"),
    ),
)]
pub async fn metrics(State(collector): State<Arc<Collector>>) -> impl IntoResponse {
    let body = collector.render().await;
    ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], body)
}
