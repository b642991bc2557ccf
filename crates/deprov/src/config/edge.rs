//! `[intake.rate_limit]` and `[metrics]`: the bounds of the HTTP edge and of metric scrapes.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// `[intake.rate_limit]`: per-source limit on intake requests (`POST /v1/deletion-requests`,
/// `DELETE /v1/installations/{id}`), a GCRA limiter (tower_governor / governor) keyed by the
/// authenticated source, else by peer IP. Over the limit a request is answered 429 with `Retry-After`
/// before anything is read from the database.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Sustained requests per second per source, 0..=100000 (fractions allowed, e.g. `0.5`);
    /// `0` = no limit. Default 20.
    pub per_second: f64,
    /// Requests a source may send at once above the sustained rate, 1..=100000. Default 40.
    pub burst: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            per_second: 20.0,
            burst: 40,
        }
    }
}

impl RateLimitConfig {
    /// The time one request of quota takes to replenish; `None` when the limit is off.
    pub fn period(&self) -> Option<Duration> {
        period(self.per_second)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        validate_rate("intake.rate_limit", self.per_second, self.burst)
    }
}

/// The time one cell of a `per_second` quota takes to replenish; `None` when it is 0 (off).
pub(super) fn period(per_second: f64) -> Option<Duration> {
    (per_second > 0.0).then(|| Duration::from_secs_f64(1.0 / per_second))
}

/// Checks a rate limit's `per_second` (0 = off, else 0.001..=100000) and `burst` (1..=100000);
/// errors name `{table}.per_second` / `{table}.burst`.
pub(super) fn validate_rate(table: &str, per_second: f64, burst: u32) -> Result<(), ConfigError> {
    if !per_second.is_finite() || !(0.0..=100_000.0).contains(&per_second) {
        return Err(invalid(
            format!("{table}.per_second"),
            "must be between 0 and 100000",
        ));
    }
    if per_second > 0.0 && per_second < 0.001 {
        return Err(invalid(
            format!("{table}.per_second"),
            "must be 0 (off) or at least 0.001",
        ));
    }
    if !(1..=100_000).contains(&burst) {
        return Err(invalid(
            format!("{table}.burst"),
            "must be between 1 and 100000",
        ));
    }
    Ok(())
}

/// `[metrics]`: how `GET /metrics` reads the gauges that come from the databases
/// (see [`crate::telemetry::collect`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Bound on each scrape-time database read: the wait for a connection and the read's
    /// `lock_timeout` and `statement_timeout`, 1ms..=10s. Default 1s.
    #[serde(with = "humantime_serde")]
    pub read_timeout: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            read_timeout: Duration::from_secs(1),
        }
    }
}

impl MetricsConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.read_timeout.is_zero() || self.read_timeout > Duration::from_secs(10) {
            return Err(invalid(
                "metrics.read_timeout",
                "must be between 1ms and 10s",
            ));
        }
        Ok(())
    }
}
