//! `[console]`: the operator console's bounds.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::edge::{period, validate_rate};

/// `[console]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Failed logins per peer address (`[console.login_rate_limit]`).
    pub login_rate_limit: LoginRateLimitConfig,
}

/// `[console.login_rate_limit]`: failed console logins per peer IP address, a GCRA limiter
/// (governor). A login from an address that used up its failures is answered 429 with
/// `Retry-After` before its token is checked; a successful login spends nothing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoginRateLimitConfig {
    /// Failed logins per second an address earns back, 0..=100000 (fractions allowed); `0` = no
    /// limit. Default 0.1 (one every 10 s).
    pub per_second: f64,
    /// Failed logins an address may make before it is limited, 1..=100000. Default 10.
    pub burst: u32,
}

impl Default for LoginRateLimitConfig {
    fn default() -> Self {
        Self {
            per_second: 0.1,
            burst: 10,
        }
    }
}

impl LoginRateLimitConfig {
    /// The time one failed login takes to be earned back; `None` when the limit is off.
    pub fn period(&self) -> Option<Duration> {
        period(self.per_second)
    }
}

impl ConsoleConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let limit = &self.login_rate_limit;
        validate_rate("console.login_rate_limit", limit.per_second, limit.burst)
    }
}
