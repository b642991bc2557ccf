//! `[intake]`, `[sources.NAME]` and `[vercel]`: who may request deletions, and the limits of
//! the requests they send.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, RateLimitConfig, SourceConfig, invalid};
use crate::sources::{Scheme, Secrets};

/// `[intake]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntakeConfig {
    /// Largest accepted request body in bytes (default 16384); larger bodies get 413.
    pub max_body_bytes: usize,
    /// Largest accepted request header, names + values in bytes, 1024..=1048576 (default 16384);
    /// larger gets 431 (see `http::serve`).
    pub max_header_bytes: usize,
    /// How long a client may take to send a request's header, and how long an idle keep-alive
    /// connection stays open, 100ms..=60s (default 5s); then the connection is closed.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Per-source request rate limit (`[intake.rate_limit]`).
    pub rate_limit: RateLimitConfig,
    /// Most deletion requests recorded in one durable transaction, 1..=1000 (default 32; 1 = one
    /// transaction per request). Requests that arrive together share a `COMMIT` and its WAL flush;
    /// a request on an idle service is never held back (see `queue::group_commit`).
    pub group_commit: usize,
    /// Writer tasks recording groups, each on its own intake connection, 1..=1000 (default 2; at
    /// most `[pools.intake] max_connections` run). Fewer writers make larger groups, and a group
    /// costs PostgreSQL little more than one request, so fewer writers record more requests/s at
    /// saturation but leave a stalled writer fewer peers (`deprov-lab bench intake` measures both).
    pub group_writers: usize,
}

impl Default for IntakeConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 * 1024,
            max_header_bytes: 16 * 1024,
            header_timeout: Duration::from_secs(5),
            rate_limit: RateLimitConfig::default(),
            group_commit: 32,
            group_writers: 2,
        }
    }
}

/// `[vercel]`: the Marketplace partner API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VercelConfig {
    /// The `[sources.NAME]` whose credentials the partner API requests carry.
    pub source: String,
    /// Optional statement run by the worker on the target, `$1` = installation ID, returning the
    /// tenant key in its first column. Without it the installation ID is the tenant key.
    pub tenant_lookup: Option<String>,
}

impl IntakeConfig {
    /// # Errors
    /// [`ConfigError::Invalid`]: a size, count or timeout outside its range (see each key), or
    /// `[intake.rate_limit]`'s.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(256..=10 * 1024 * 1024).contains(&self.max_body_bytes) {
            return Err(invalid(
                "intake.max_body_bytes",
                "must be between 256 and 10485760",
            ));
        }
        if !(1..=1000).contains(&self.group_commit) {
            return Err(invalid("intake.group_commit", "must be between 1 and 1000"));
        }
        if !(1..=1000).contains(&self.group_writers) {
            return Err(invalid(
                "intake.group_writers",
                "must be between 1 and 1000",
            ));
        }
        if !(1024..=1024 * 1024).contains(&self.max_header_bytes) {
            return Err(invalid(
                "intake.max_header_bytes",
                "must be between 1024 and 1048576",
            ));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&self.header_timeout) {
            return Err(invalid(
                "intake.header_timeout",
                "must be between 100ms and 60s",
            ));
        }
        self.rate_limit.validate()
    }
}

/// Checks `[sources.NAME]`: names of 1..=64 characters of `[A-Za-z0-9-_.]`; each bearer token
/// resolved (from `token`, or `token_env` with [`Secrets::Read`]), at least 16 characters, and
/// naming one source only.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the source (or its `token`).
pub(super) fn validate_sources(
    sources: &BTreeMap<String, SourceConfig>,
    secrets: Secrets,
) -> Result<(), ConfigError> {
    let mut seen = BTreeMap::new();
    for (name, source) in sources {
        let key = format!("sources.{name}");
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(invalid(
                key,
                "source names are 1..=64 characters of [A-Za-z0-9-_.]",
            ));
        }
        if source.scheme != Scheme::Bearer {
            continue;
        }
        let Some(token) = source
            .resolve_token(secrets)
            .map_err(|r| invalid(&key, r))?
        else {
            continue;
        };
        if token.len() < 16 {
            return Err(match &source.token_env {
                Some(var) => invalid(
                    format!("{key}.token_env"),
                    format!(
                        "the token in environment variable {var} must be at least 16 characters"
                    ),
                ),
                None => invalid(format!("{key}.token"), "must be at least 16 characters"),
            });
        }
        if let Some(other) = seen.insert(token, name.clone()) {
            return Err(invalid(
                format!("{key}.token"),
                format!("same token as sources.{other}: a token must name one source"),
            ));
        }
    }
    Ok(())
}

impl VercelConfig {
    /// `sources` is the file's `[sources.NAME]`: the partner API's source must be one of them.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`]: `source` names no source, or one whose scheme is neither `bearer`
    /// nor `vercel-oidc`; `tenant_lookup` empty.
    pub(super) fn validate(
        &self,
        sources: &BTreeMap<String, SourceConfig>,
    ) -> Result<(), ConfigError> {
        match sources.get(&self.source).map(|s| s.scheme) {
            None => {
                return Err(invalid(
                    "vercel.source",
                    format!("no [sources.{}] is configured", self.source),
                ));
            }
            Some(Scheme::Bearer | Scheme::VercelOidc) => {}
            Some(other) => {
                return Err(invalid(
                    "vercel.source",
                    format!(
                        "sources.{} has scheme {:?}; the partner API needs bearer or vercel-oidc",
                        self.source,
                        other.as_str()
                    ),
                ));
            }
        }
        if self
            .tenant_lookup
            .as_deref()
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err(invalid("vercel.tenant_lookup", "must not be empty"));
        }
        Ok(())
    }
}
