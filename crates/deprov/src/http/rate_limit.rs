//! Per-source rate limit on intake (`[intake.rate_limit]`), with tower_governor.
//!
//! Requests are keyed by the source their bearer token names ([`SourceKey`]); a request without a
//! known token is keyed by its peer IP address (axum's `ConnectInfo`, present because the service is
//! served with `into_make_service_with_connect_info::<SocketAddr>()`), so a flood of bad tokens from
//! one address is limited too. Over the limit the request is answered 429 problem+json with
//! `Retry-After` (whole seconds, rounded up) before any handler or database work, and counted in
//! `deprov_intake_rate_limited_total`. Keys of sources idle for a full quota are dropped every
//! [`RETAIN_INTERVAL`] ([`spawn_retain`]), so memory follows the active peers.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::response::IntoResponse;
use governor::middleware::NoOpMiddleware;
use tokio_util::sync::CancellationToken;
use tower_governor::GovernorError;
use tower_governor::governor::{GovernorConfig, GovernorConfigBuilder};
use tower_governor::key_extractor::KeyExtractor;

use super::auth::{SourceTokens, bearer};
use super::error::ApiError;
use crate::config::RateLimitConfig;

/// How often keys of idle sources and peers are dropped (`RateLimiter::retain_recent`).
pub const RETAIN_INTERVAL: Duration = Duration::from_secs(60);

/// Who a request counts against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateKey {
    /// An authenticated `[sources.NAME]`.
    Source(String),
    /// No known token: the peer's IP address.
    Peer(IpAddr),
    /// No known token and no peer address (only when served without connect info, e.g. in tests).
    Unknown,
}

/// Keys intake requests by authenticated source, else by peer IP ([`RateKey`]).
#[derive(Debug, Clone)]
pub struct SourceKey {
    sources: Arc<SourceTokens>,
}

impl KeyExtractor for SourceKey {
    type Key = RateKey;

    fn extract<T>(&self, req: &Request<T>) -> Result<RateKey, GovernorError> {
        if let Some(name) = bearer(req.headers()).and_then(|t| self.sources.identify(t)) {
            return Ok(RateKey::Source(name.to_owned()));
        }
        Ok(req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(RateKey::Unknown, |c| RateKey::Peer(c.0.ip())))
    }
}

/// The limiter's configuration (shared by the layer and [`spawn_retain`]).
pub type Limit = Arc<GovernorConfig<SourceKey, NoOpMiddleware>>;

/// The limit of `config` over `sources`; `None` when `per_second` is 0 (no limit).
pub fn limit(config: &RateLimitConfig, sources: Arc<SourceTokens>) -> Option<Limit> {
    let period = config.period()?;
    GovernorConfigBuilder::default()
        .period(period)
        .burst_size(config.burst)
        .key_extractor(SourceKey { sources })
        .finish()
        .map(Arc::new)
}

/// The 429 (or, should a key ever fail to extract, 500) problem for a refused request.
pub fn refusal(error: GovernorError) -> axum::response::Response {
    match error {
        GovernorError::TooManyRequests { wait_time, .. } => {
            crate::telemetry::rate_limited();
            ApiError::TooManyRequests {
                detail: "rate limit of this source exceeded ([intake.rate_limit])".into(),
                // governor's wait is truncated to whole seconds: round up.
                retry_after: wait_time + 1,
            }
            .into_response()
        }
        other => ApiError::Internal(format!("rate limit: {other}")).into_response(),
    }
}

/// Drops idle keys from `limit` every [`RETAIN_INTERVAL`] until `cancel` fires.
pub fn spawn_retain(limit: Limit, cancel: CancellationToken) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(RETAIN_INTERVAL) => {
                    limit.limiter().retain_recent();
                    limit.limiter().shrink_to_fit();
                }
            }
        }
    });
}
