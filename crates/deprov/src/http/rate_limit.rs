//! Per-source rate limit on intake (`[intake.rate_limit]`), with tower_governor.
//!
//! Requests are keyed by the source their bearer token names ([`SourceKey`]). A request without a
//! known token is keyed by its peer IP address (axum's `ConnectInfo`, present because the service is
//! served with `into_make_service_with_connect_info::<SocketAddr>()`), so a flood of bad tokens from
//! one address is limited too — and, when its path names a configured source (the source of
//! `POST /v1/webhooks/{source}`, `[osb] source` for `/v2/service_instances/…`, `[vercel] source` for
//! `/v1/installations/…`), by that source as well: behind a proxy every sender shares the proxy's
//! address, and junk sent to one source's route must not spend another source's quota. Over the limit the request is answered 429 problem+json with
//! `Retry-After` (whole seconds, rounded up) before any handler or database work, and counted in
//! `deprov_intake_rate_limited_total`. Keys of sources idle for a full quota are dropped every
//! [`RETAIN_INTERVAL`] ([`spawn_retain`]), so memory follows the active peers.

use std::collections::HashSet;
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
use crate::config::{Config, RateLimitConfig};

/// How often keys of idle sources and peers are dropped (`RateLimiter::retain_recent`).
pub const RETAIN_INTERVAL: Duration = Duration::from_secs(60);

/// Who a request counts against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateKey {
    /// An authenticated `[sources.NAME]`.
    Source(String),
    /// No known token: the peer's IP address.
    Peer(IpAddr),
    /// No known token, on a route of a configured source (named by the path): that source, from
    /// the peer's IP address (`None` without a peer address).
    Routed(String, Option<IpAddr>),
    /// No known token and no peer address (only when served without connect info, e.g. in tests).
    Unknown,
}

/// Keys intake requests by authenticated source, else by the source the path names and the peer
/// IP, else by peer IP ([`RateKey`]).
#[derive(Debug, Clone)]
pub struct SourceKey {
    sources: Arc<SourceTokens>,
    routes: Arc<Routes>,
}

/// The configured sources a request's path can name.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    /// Every `[sources.NAME]` (the `{source}` of `POST /v1/webhooks/{source}`).
    pub webhooks: HashSet<String>,
    /// `[osb] source`.
    pub osb: Option<String>,
    /// `[vercel] source`.
    pub vercel: Option<String>,
}

impl Routes {
    /// The sources of `config`.
    pub fn of(config: &Config) -> Self {
        Self {
            webhooks: config.sources.keys().cloned().collect(),
            osb: config.osb.as_ref().map(|o| o.source.clone()),
            vercel: config.vercel.as_ref().map(|v| v.source.clone()),
        }
    }

    /// The configured source whose route `path` is, if any.
    pub fn source_of(&self, path: &str) -> Option<&str> {
        if let Some(rest) = path.strip_prefix("/v1/webhooks/") {
            let name = rest.split('/').next().unwrap_or_default();
            return self.webhooks.get(name).map(String::as_str);
        }
        if path.starts_with("/v2/service_instances/") {
            return self.osb.as_deref();
        }
        if path.starts_with("/v1/installations/") {
            return self.vercel.as_deref();
        }
        None
    }
}

impl KeyExtractor for SourceKey {
    type Key = RateKey;

    fn extract<T>(&self, req: &Request<T>) -> Result<RateKey, GovernorError> {
        if let Some(name) = bearer(req.headers()).and_then(|t| self.sources.identify(t)) {
            return Ok(RateKey::Source(name.to_owned()));
        }
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        if let Some(source) = self.routes.source_of(req.uri().path()) {
            return Ok(RateKey::Routed(source.to_owned(), peer));
        }
        Ok(peer.map_or(RateKey::Unknown, RateKey::Peer))
    }
}

/// The limiter's configuration (shared by the layer and [`spawn_retain`]).
pub type Limit = Arc<GovernorConfig<SourceKey, NoOpMiddleware>>;

/// The limit of `config` over `sources` and the sources' `routes`; `None` when `per_second` is 0
/// (no limit).
pub fn limit(
    config: &RateLimitConfig,
    sources: Arc<SourceTokens>,
    routes: Routes,
) -> Option<Limit> {
    let period = config.period()?;
    GovernorConfigBuilder::default()
        .period(period)
        .burst_size(config.burst)
        .key_extractor(SourceKey {
            sources,
            routes: Arc::new(routes),
        })
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

/// Drops idle keys from `limit`: those whose cells are all earned back.
pub fn retain_recent(limit: &Limit) {
    limit.limiter().retain_recent();
    limit.limiter().shrink_to_fit();
}

/// Runs `retain` (a limiter's [`retain_recent`]) every [`RETAIN_INTERVAL`] on a task of its own
/// until `cancel` fires.
pub fn spawn_retain(cancel: CancellationToken, retain: impl Fn() + Send + 'static) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(RETAIN_INTERVAL) => retain(),
            }
        }
    });
}
