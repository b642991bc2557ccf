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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_ttl_defaults_to_5s_and_is_bounded_by_60s() {
        let parse = |text: &str| toml::from_str::<OperatorTokensConfig>(text).unwrap();
        assert_eq!(parse("").cache_ttl, Duration::from_secs(5));
        assert_eq!(parse("cache_ttl = \"0s\"").cache_ttl, Duration::ZERO);
        assert!(parse("cache_ttl = \"60s\"").validate().is_ok());
        let err = parse("cache_ttl = \"61s\"").validate().unwrap_err();
        assert!(
            err.to_string().contains("operator_tokens.cache_ttl"),
            "{err}"
        );
        assert!(toml::from_str::<OperatorTokensConfig>("ttl = \"1s\"").is_err());
    }
}
