//! `[notifications]`: where job completion and failure events are sent (see [`crate::notify`]).

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, Secrets, invalid};

/// The event types deprov emits: one per terminal job state.
pub const EVENT_TYPES: [&str; 3] = ["job.completed", "job.failed", "job.cancelled"];

/// The HMAC key derived from the secret. Its `Debug` never shows it.
#[derive(Clone, Default)]
pub struct SigningKey(pub Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey([redacted])")
    }
}

/// `[notifications]`: an HTTP callback receiving one signed event (Standard Webhooks) per job that
/// reaches `completed`, `failed` or `cancelled`. Absent: events are still recorded in
/// `deprov.outbox` (and listed by `deprov notifications list`) but nothing is sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotificationsConfig {
    /// The receiver, an `http://` or `https://` URL. Redirects are not followed (a 3xx is a failure).
    pub url: String,
    /// Environment variable holding the signing secret, `whsec_` + base64 (Standard Webhooks).
    pub secret_env: Option<String>,
    /// File holding the signing secret (trailing whitespace ignored). Exactly one of the two.
    pub secret_file: Option<String>,
    /// Event types to send (default all: `job.completed`, `job.failed`, `job.cancelled`); the
    /// others are marked `skipped`.
    #[serde(default = "all_events")]
    pub events: Vec<String>,
    /// Whole-request timeout of one delivery attempt, 1ms..=60s (default 10s); a timeout is retried.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Attempts before an event is `dead`, 1..=1000 (default 10).
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// An event that fails after being this old is `dead` whatever its attempts (default 24h).
    #[serde(default = "default_max_age", with = "humantime_serde")]
    pub max_age: Duration,
    /// Delay after the first failed attempt; doubles per attempt (default 1s).
    #[serde(default = "default_backoff_base", with = "humantime_serde")]
    pub backoff_base: Duration,
    /// Largest delay between attempts (default 10m).
    #[serde(default = "default_backoff_max", with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Fraction of each delay drawn at random, 0..=1 (default 0.5: a delay of `d` becomes one in
    /// `[d/2, d]`), so receivers that come back are not hit by every dispatcher at once.
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    /// Deliveries one process has in flight at most, 1..=100 (default 8).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: u32,
    /// How often an idle dispatcher looks for due events (default 1s); it also wakes when the
    /// earliest retry is due.
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// The key derived from the secret at load ([`NotificationsConfig::prepare`]).
    #[serde(skip)]
    pub key: SigningKey,
}

fn all_events() -> Vec<String> {
    EVENT_TYPES.iter().map(|&s| s.to_owned()).collect()
}
fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_attempts() -> u32 {
    10
}
fn default_max_age() -> Duration {
    Duration::from_secs(24 * 3600)
}
fn default_backoff_base() -> Duration {
    Duration::from_secs(1)
}
fn default_backoff_max() -> Duration {
    Duration::from_secs(600)
}
fn default_jitter() -> f64 {
    0.5
}
fn default_max_in_flight() -> u32 {
    8
}
fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}

impl NotificationsConfig {
    /// Validates the values and, with [`Secrets::Read`], derives the signing key from `secret_env` /
    /// `secret_file`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `notifications.<key>` (never the secret's value).
    pub fn prepare(&mut self, secrets: Secrets) -> Result<(), ConfigError> {
        let key = |k: &str| format!("notifications.{k}");
        let url = reqwest::Url::parse(&self.url)
            .map_err(|e| invalid(key("url"), format!("not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(invalid(key("url"), "must be an http:// or https:// URL"));
        }
        let which = match (&self.secret_env, &self.secret_file) {
            (Some(_), None) => "secret_env",
            (None, Some(_)) => "secret_file",
            _ => {
                return Err(invalid(
                    key("secret_env"),
                    "give exactly one of secret_env and secret_file",
                ));
            }
        };
        if secrets == Secrets::Read {
            let secret = match &self.secret_env {
                Some(var) => std::env::var(var).map_err(|_| {
                    invalid(
                        key("secret_env"),
                        format!("environment variable {var} is not set"),
                    )
                })?,
                None => {
                    let path = self.secret_file.as_deref().unwrap_or_default();
                    std::fs::read_to_string(path)
                        .map_err(|e| invalid(key("secret_file"), format!("{path}: {e}")))?
                }
            };
            self.key = SigningKey(
                crate::sources::standard_webhooks::derive_key(secret.trim_end())
                    .map_err(|r| invalid(key(which), r))?,
            );
        }
        if self.events.is_empty() {
            return Err(invalid(key("events"), "list at least one event type"));
        }
        if let Some(e) = self
            .events
            .iter()
            .find(|e| !EVENT_TYPES.contains(&e.as_str()))
        {
            return Err(invalid(
                key("events"),
                format!(
                    "unknown event type {e:?}; known: {}",
                    EVENT_TYPES.join(", ")
                ),
            ));
        }
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(60) {
            return Err(invalid(key("timeout"), "must be between 1ms and 60s"));
        }
        if !(1..=1000).contains(&self.max_attempts) {
            return Err(invalid(key("max_attempts"), "must be between 1 and 1000"));
        }
        if self.max_age.is_zero() {
            return Err(invalid(key("max_age"), "must be above 0"));
        }
        if self.backoff_base.is_zero() || self.backoff_max < self.backoff_base {
            return Err(invalid(
                key("backoff_max"),
                "must be at least notifications.backoff_base, which must be above 0",
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(invalid(key("jitter"), "must be between 0 and 1"));
        }
        if !(1..=100).contains(&self.max_in_flight) {
            return Err(invalid(key("max_in_flight"), "must be between 1 and 100"));
        }
        if self.poll_interval.is_zero() {
            return Err(invalid(key("poll_interval"), "must be above 0"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use crate::config::Config;

    const BASE: &str = r#"
        [tenant]
        root_table = "app.accounts"
        key_column = "id"
    "#;

    fn secret_file(secret: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "{secret}").unwrap();
        f
    }

    fn with(extra: &str) -> Result<Config, String> {
        Config::from_toml(&format!("{BASE}\n[notifications]\n{extra}\n")).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_a_key_that_never_shows() {
        let f = secret_file("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let c = with(&format!(
            "url = \"https://hooks.example.com/deprov\"\nsecret_file = {:?}",
            f.path()
        ))
        .unwrap();
        let n = c.notifications.unwrap();
        assert_eq!(n.events.len(), 3);
        assert_eq!(n.max_attempts, 10);
        assert_eq!(n.timeout, std::time::Duration::from_secs(10));
        assert_eq!(n.key.0.len(), 24);
        let shown = format!("{n:?}");
        assert!(
            shown.contains("[redacted]") && !shown.contains("MfKQ9r8"),
            "{shown}"
        );
        assert!(Config::from_toml(BASE).unwrap().notifications.is_none());
    }

    #[test]
    fn invalid_values_are_named_without_the_secret() {
        let f = secret_file("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let ok = format!("secret_file = {:?}", f.path());
        let url = "url = \"http://127.0.0.1:9/\"";
        let cases = [
            (format!("url = \"ftp://x\"\n{ok}"), "notifications.url"),
            (format!("url = \"nope\"\n{ok}"), "notifications.url"),
            (url.to_owned(), "notifications.secret_env"),
            (
                format!("{url}\nsecret_env = \"DEPROV_TEST_SURELY_UNSET_VAR\""),
                "DEPROV_TEST_SURELY_UNSET_VAR is not set",
            ),
            (
                format!("{url}\n{ok}\nevents = [\"job.exploded\"]"),
                "notifications.events",
            ),
            (format!("{url}\n{ok}\nevents = []"), "notifications.events"),
            (
                format!("{url}\n{ok}\ntimeout = \"0s\""),
                "notifications.timeout",
            ),
            (
                format!("{url}\n{ok}\nmax_attempts = 0"),
                "notifications.max_attempts",
            ),
            (
                format!("{url}\n{ok}\nbackoff_base = \"2s\"\nbackoff_max = \"1s\""),
                "notifications.backoff_max",
            ),
            (format!("{url}\n{ok}\njitter = 1.5"), "notifications.jitter"),
            (
                format!("{url}\n{ok}\nmax_in_flight = 0"),
                "notifications.max_in_flight",
            ),
            (format!("{url}\n{ok}\nretries = 3"), "retries"),
        ];
        for (extra, key) in cases {
            let err = with(&extra).unwrap_err();
            assert!(err.contains(key), "{extra:?} -> {err}");
        }
        let bad = secret_file("whsec_not base64!");
        let err = with(&format!("{url}\nsecret_file = {:?}", bad.path())).unwrap_err();
        assert!(
            err.contains("notifications.secret_file") && !err.contains("not base64!"),
            "{err}"
        );
    }
}

/// `deploy/example.toml` with its commented `[notifications]` uncommented is valid.
#[cfg(test)]
#[test]
fn the_example_notifications_are_valid_once_uncommented() {
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
    let mut in_block = false;
    let mut out = Vec::new();
    for line in include_str!("../../../../deploy/example.toml").lines() {
        in_block |= line == "# [notifications]";
        match line.strip_prefix("# ") {
            Some(rest) if in_block => out.push(rest.to_owned()),
            _ => {
                in_block = false;
                out.push(line.to_owned());
            }
        }
    }
    let text = out
        .join("\n")
        .replace(
            "token_env = \"DEPROV_BILLING_TOKEN\"",
            "token = \"billing-token-0123456789\"",
        )
        .replace(
            "token_env = \"DEPROV_VERCEL_TOKEN\"",
            "token = \"vercel-token-0123456789\"",
        )
        .replace(
            "secret_env = \"DEPROV_NOTIFY_SECRET\"",
            &format!("secret_file = {:?}", secret.path()),
        );
    let c = crate::config::Config::from_toml(&text).unwrap();
    let n = c.notifications.expect("the [notifications] block");
    assert_eq!(n.url, "https://hooks.example.com/deprov");
    assert_eq!(n.events.len(), 3);
    assert_eq!(n.max_in_flight, 8);
}
