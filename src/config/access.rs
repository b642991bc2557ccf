//! `[operator_tokens]`: how a server checks operator tokens (see [`crate::http::auth`]).

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// `[operator_tokens]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OperatorTokensConfig {
    /// How long a server trusts its copy of the tokens that are not revoked, 0s..=60s (default 5s):
    /// a revoked token is refused by every server within this time, and the token table is read at
    /// most once per this time per server (through the intake pool and its bounds). `0s` reads it for
    /// every operator request.
    #[serde(with = "humantime_serde")]
    pub cache_ttl: Duration,
}

impl Default for OperatorTokensConfig {
    fn default() -> Self {
        Self {
            cache_ttl: Duration::from_secs(5),
        }
    }
}

impl OperatorTokensConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.cache_ttl > Duration::from_secs(60) {
            return Err(invalid(
                "operator_tokens.cache_ttl",
                "must be between 0s and 60s",
            ));
        }
        Ok(())
    }
}
