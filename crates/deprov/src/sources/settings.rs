//! `[sources.NAME]`: one sender of deletion requests, its scheme, secrets and payload locations.
//!
//! Secrets come from environment variables (`secret_env`) or files (`secret_file`, trailing
//! newline trimmed), never from the file itself, and are read once at start-up of `serve` and
//! `worker` by [`SourceConfig::prepare`] (other commands leave them unread: [`Secrets`]), which also
//! derives each scheme's HMAC key. They are kept only as [`Keys`], whose `Debug` prints nothing. A
//! key the source's scheme does not use is refused ([`Scheme::uses`]). The README ("Signed
//! senders") has a complete entry per scheme; `docs/api.md` describes each.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::DEFAULT_TOLERANCE;
pub use super::scheme::{SOURCE_KEYS, Scheme};

/// Whether loading the configuration reads the secrets it names (`token_env`, `secret_env`,
/// `secret_file`, `[notifications]`'s secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secrets {
    /// Read and check them: `serve` and `worker`, which verify and sign with them.
    Read,
    /// Leave them unread (every other key and value is still checked): commands that only use the
    /// databases (`plan`, `config check`, `reconcile`, `jobs undo`) need no sender's secret.
    Skip,
}

/// Where a value is read from a verified delivery.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Locator {
    /// An RFC 6901 JSON pointer into the body, e.g. `"/data/object/id"`; strings and integers are read.
    Pointer(String),
    /// A request header, e.g. `"X-Shopify-Shop-Domain"`.
    Header(String),
}

/// As written in the config: `pointer "/data/id"`, `header "X-Shopify-Shop-Domain"`.
impl std::fmt::Display for Locator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pointer(p) => write!(f, "pointer {p:?}"),
            Self::Header(h) => write!(f, "header {h:?}"),
        }
    }
}

/// What a delivery's deterministic request ID derives from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Dedup {
    /// The sender's delivery/event ID, where the scheme defines one (default; see
    /// [`Scheme::has_delivery_id`]).
    #[default]
    Delivery,
    /// The tenant value itself (a natural key such as an installation ID): every delivery for the
    /// tenant collapses into one request.
    Tenant,
    /// A JSON pointer into the body.
    Pointer(String),
    /// A request header.
    Header(String),
}

/// As written in the config: `delivery` (the sender's delivery ID), `tenant`, `pointer "/id"`,
/// `header "X-Id"`.
impl std::fmt::Display for Dedup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Delivery => f.write_str("delivery (the sender's delivery ID)"),
            Self::Tenant => f.write_str("tenant"),
            Self::Pointer(p) => write!(f, "pointer {p:?}"),
            Self::Header(h) => write!(f, "header {h:?}"),
        }
    }
}

/// The derived HMAC keys of a source (one per configured secret). `Debug` prints only the count.
#[derive(Clone, Default)]
pub struct Keys(pub Vec<Vec<u8>>);

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({} redacted)", self.0.len())
    }
}

/// `[sources.NAME] reinstalls`: whose pending deletions a source's reinstall reaches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReinstallScope {
    /// Only deletions this source requested, and none another source also requested.
    #[default]
    Own,
    /// The tenant's pending deletion, whichever sources requested it.
    Any,
}

/// One `[sources.NAME]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// How requests are authenticated (default `bearer`).
    #[serde(default)]
    pub scheme: Scheme,
    /// `bearer`: the token itself (≥ 16 characters).
    pub token: Option<String>,
    /// `bearer`: the environment variable holding the token.
    pub token_env: Option<String>,
    /// HMAC schemes: environment variables each holding one secret (rotation: any may match).
    #[serde(default)]
    pub secret_env: Vec<String>,
    /// HMAC schemes: files each holding one secret (trailing whitespace trimmed).
    #[serde(default)]
    pub secret_file: Vec<String>,
    /// Timestamp tolerance, past and future, of schemes that sign one (default 5m; 1s..=1h).
    #[serde(default, with = "humantime_serde")]
    pub tolerance: Option<Duration>,
    /// HMAC schemes that sign no timestamp (`github`, `shopify`, `vercel-webhook`): an RFC 6901
    /// JSON pointer to a timestamp in the signed body (e.g. Vercel's `"/createdAt"`), read as
    /// [`super::age`] says. With `max_age`; both or neither.
    pub timestamp: Option<String>,
    /// With `timestamp`: a delivery whose timestamp is further than this from now, past or future,
    /// is refused (401) like a wrong signature: a captured delivery replayed later is no longer
    /// accepted (1s..=7d).
    #[serde(default, with = "humantime_serde")]
    pub max_age: Option<Duration>,
    /// Where the tenant is (required on `POST /v1/webhooks/{source}`).
    pub tenant: Option<Locator>,
    /// Optional statement run by the worker on the target, `$1` = the value read by `tenant`,
    /// returning the tenant key in its first column; without it the value is the tenant key.
    pub tenant_lookup: Option<String>,
    /// Where the event type is, overriding the scheme's default (see [`super::payload`]).
    pub event: Option<Locator>,
    /// Event types that mean "delete this tenant"; any other is acknowledged and recorded as ignored.
    /// Empty on a `bearer` or `basic` source = every request deletes.
    #[serde(default)]
    pub delete_events: Vec<String>,
    /// Event types that mean "the tenant is back" (a reinstall): the tenant's pending deletion is
    /// cancelled and, still in its grace period, its soft delete undone (see
    /// [`crate::queue::grace::reinstall`]). Must not overlap `delete_events`.
    #[serde(default)]
    pub restore_events: Vec<String>,
    /// Whose pending deletions this source's reinstalls reach (`POST /v1/reinstallations` and
    /// `restore_events`): `own` (default) — only a deletion this source requested, and not while
    /// another source's request for it stands; `any` — the tenant's pending deletion whoever asked
    /// for it: give it to the application's own install flow, the only one that can see a reinstall
    /// from a marketplace that gives it a new ID (Vercel, GitHub).
    #[serde(default)]
    pub reinstalls: ReinstallScope,
    /// The deduplication key (default: the sender's delivery ID).
    #[serde(default)]
    pub dedup: Dedup,
    /// `vercel-oidc`, `jwt`: the JWKS URL (e.g. `https://marketplace.vercel.com/.well-known/jwks`;
    /// `jwt`: `https://`, see `allow_http_loopback`).
    pub jwks_url: Option<String>,
    /// `vercel-oidc`, `jwt`: a file holding the JWKS (instead of `jwks_url`); `serve` and `worker`
    /// refuse to start when it cannot be read or holds no usable key.
    pub jwks_file: Option<String>,
    /// `vercel-oidc`: the required `iss` claim (e.g. `https://marketplace.vercel.com`); `jwt`: one
    /// or a list of accepted `iss` values.
    pub issuer: Option<OneOrMany>,
    /// `vercel-oidc`: the required `aud` claim (the integration's client ID, `oac_…`); `jwt`: one or
    /// a list of accepted `aud` values; `atlassian-connect`: the app's `baseUrl`.
    pub audience: Option<OneOrMany>,
    /// `jwt`: allowed `alg` values (default `["RS256"]`; see [`super::jwt::ALGORITHMS`]).
    #[serde(default)]
    pub algorithms: Vec<String>,
    /// `jwt`: claims the token must carry with exactly this string or boolean value.
    #[serde(default)]
    pub required_claims: std::collections::BTreeMap<String, serde_json::Value>,
    /// `jwt`, `atlassian-connect`: clock skew allowed on `exp`, `nbf` and (Atlassian) `iat`
    /// (default 60s; 0s..=5m).
    #[serde(default, with = "humantime_serde")]
    pub leeway: Option<Duration>,
    /// `atlassian-connect`: where the public key of a `kid` is fetched, `{kid}` replaced (default
    /// `https://connect-install-keys.atlassian.com/{kid}`).
    pub key_url: Option<String>,
    /// `atlassian-connect`: the path, relative to the app's `baseUrl`, that a proxy strips before
    /// deprov sees the request (default empty); the `qsh` path is `base_path` + deprov's path.
    pub base_path: Option<String>,
    /// `jwt`, `atlassian-connect`: accept an `http://` `jwks_url`/`key_url` to a loopback IP
    /// address (tests only; default false).
    #[serde(default)]
    pub allow_http_loopback: bool,
    /// `basic`: the user-id the caller must send (1..=256 characters, no `:`, no control
    /// characters: RFC 7617 §2).
    pub username: Option<String>,
    /// The derived keys, filled by [`SourceConfig::prepare`]; not part of the file.
    #[serde(skip)]
    pub keys: Keys,
    /// Decoding layers applied to a verified body before anything is read from it
    /// ([`super::decode`]), e.g. `[{ pointer = "/Message", as = "json" }]`; at most
    /// [`super::decode::MAX_LAYERS`].
    #[serde(default)]
    pub decode: Vec<super::decode::DecodeLayer>,
    /// `aws-sns`: the topic ARNs whose messages are accepted (required, non-empty).
    #[serde(default)]
    pub topic_arns: Vec<String>,
    /// `aws-sns`: host patterns a `SigningCertURL` or `SubscribeURL` must match (`*` = one DNS
    /// label); default [`super::sns::DEFAULT_CERT_HOSTS`].
    pub cert_hosts: Option<Vec<String>>,
    /// `aws-sns`: a PEM file of CA certificates trusted, instead of the system's, for the
    /// certificate fetch and the subscription confirmation (SNS-compatible private endpoints, tests).
    pub cert_roots_file: Option<String>,
    /// `aws-sns`: confirm a `SubscriptionConfirmation` by GETting its `SubscribeURL` (default
    /// `false`: recorded as ignored and logged as a warning for the operator to confirm).
    #[serde(default)]
    pub confirm_subscriptions: bool,
    /// `aws-sns`: the certificate fetcher and cache, built by [`SourceConfig::prepare`].
    #[serde(skip)]
    pub sns: Option<Arc<super::sns_certs::SnsCerts>>,
}

/// `issuer` / `audience`: one string or a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// `issuer = "https://accounts.google.com"`.
    One(String),
    /// `issuer = ["https://a", "https://b"]`.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The values, in the order written.
    pub fn values(&self) -> Vec<String> {
        match self {
            Self::One(v) => vec![v.clone()],
            Self::Many(v) => v.clone(),
        }
    }

    /// The value when exactly one, non-empty, is given.
    pub fn single(&self) -> Option<&str> {
        match self {
            Self::One(v) if !v.is_empty() => Some(v),
            Self::Many(v) if v.len() == 1 && !v[0].is_empty() => Some(&v[0]),
            _ => None,
        }
    }

    /// Whether at least one value is given and none is empty.
    pub fn is_valid(&self) -> bool {
        let values = self.values();
        !values.is_empty() && values.iter().all(|v| !v.is_empty())
    }
}

/// A `[sources.NAME]` value that parsed but is not allowed (the configuration reports it as an
/// invalid key).
#[derive(Debug, thiserror::Error)]
#[error("configuration key `{key}`: {reason}")]
pub struct InvalidSource {
    /// Dotted path of the key, e.g. `sources.stripe.secret_env`.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// `sources.NAME.<key>` of source `name` is invalid, for `reason`.
pub(super) fn invalid(name: &str, key: &str, reason: impl Into<String>) -> InvalidSource {
    InvalidSource {
        key: format!("sources.{name}.{key}"),
        reason: reason.into(),
    }
}

impl SourceConfig {
    /// Refuses a key of `given` (the keys written in the table) that the scheme does not read, and
    /// `dedup = "delivery"` for a scheme that sends no delivery ID.
    pub(super) fn check_keys(&self, name: &str, given: &[&str]) -> Result<(), InvalidSource> {
        let scheme = self.scheme;
        for k in SOURCE_KEYS {
            if given.contains(&k) && !scheme.uses(k) {
                return Err(invalid(
                    name,
                    k,
                    format!(
                        "not used by scheme {} ({})",
                        scheme.as_str(),
                        scheme.instead(k)
                    ),
                ));
            }
        }
        if given.contains(&"dedup") && self.dedup == Dedup::Delivery && !scheme.has_delivery_id() {
            return Err(invalid(
                name,
                "dedup",
                format!(
                    "scheme {} sends no delivery ID: give \"tenant\", a pointer or a header",
                    scheme.as_str()
                ),
            ));
        }
        Ok(())
    }

    /// Refuses an event type that both restores and deletes.
    pub(super) fn check_events(&self, name: &str) -> Result<(), InvalidSource> {
        if let Some(e) = self
            .restore_events
            .iter()
            .find(|e| self.delete_events.contains(e))
        {
            return Err(invalid(
                name,
                "restore_events",
                format!("{e:?} is also in delete_events"),
            ));
        }
        Ok(())
    }

    /// An HMAC scheme: a secret given (read, and its keys derived, with [`Secrets::Read`]), the
    /// event types that delete, and where the tenant is.
    pub(super) fn prepare_hmac(
        &mut self,
        name: &str,
        secrets: Secrets,
    ) -> Result<(), InvalidSource> {
        if self.secret_env.is_empty() && self.secret_file.is_empty() {
            return Err(invalid(
                name,
                "secret_env",
                "give at least one secret (secret_env or secret_file)",
            ));
        }
        if secrets == Secrets::Read {
            self.keys = Keys(self.read_keys(name)?);
        }
        if self.delete_events.is_empty() {
            return Err(invalid(
                name,
                "delete_events",
                "list the event types that mean delete",
            ));
        }
        if self.tenant.is_none() {
            return Err(invalid(
                name,
                "tenant",
                "say where the tenant is: { pointer = \"/…\" } or { header = \"…\" }",
            ));
        }
        Ok(())
    }

    /// `vercel-oidc`: exactly one JWKS source, an issuer and an audience.
    pub(super) fn check_oidc(&self, name: &str) -> Result<(), InvalidSource> {
        if self.jwks_url.is_some() == self.jwks_file.is_some() {
            return Err(invalid(
                name,
                "jwks_url",
                "give exactly one of jwks_url and jwks_file",
            ));
        }
        if self.issuer.as_ref().and_then(OneOrMany::single).is_none() {
            return Err(invalid(name, "issuer", "required for vercel-oidc"));
        }
        if self.audience.as_ref().and_then(OneOrMany::single).is_none() {
            return Err(invalid(name, "audience", "required for vercel-oidc"));
        }
        Ok(())
    }

    /// The tolerance's range, a non-empty `tenant_lookup`, and well-formed JSON pointers and header
    /// names for the tenant, the event type and the deduplication key.
    pub(super) fn check_values(&self, name: &str) -> Result<(), InvalidSource> {
        if let Some(t) = self.tolerance
            && (t < Duration::from_secs(1) || t > Duration::from_secs(3600))
        {
            return Err(invalid(name, "tolerance", "must be between 1s and 1h"));
        }
        self.check_age(name)?;
        if self
            .tenant_lookup
            .as_deref()
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err(invalid(name, "tenant_lookup", "must not be empty"));
        }
        let dedup = match &self.dedup {
            Dedup::Pointer(p) => Some(Locator::Pointer(p.clone())),
            Dedup::Header(h) => Some(Locator::Header(h.clone())),
            Dedup::Delivery | Dedup::Tenant => None,
        };
        for (k, loc) in [
            ("tenant", &self.tenant),
            ("event", &self.event),
            ("dedup", &dedup),
        ] {
            match loc {
                Some(Locator::Pointer(p)) if !(p.is_empty() || p.starts_with('/')) => {
                    return Err(invalid(
                        name,
                        k,
                        "a JSON pointer is empty or starts with `/`",
                    ));
                }
                Some(Locator::Header(h))
                    if axum::http::HeaderName::from_bytes(h.as_bytes()).is_err() =>
                {
                    return Err(invalid(name, k, format!("{h:?} is not a header name")));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Reads the secrets of source `name` (an HMAC scheme, or `basic`'s passwords) and derives their
    /// keys.
    pub(super) fn read_keys(&self, name: &str) -> Result<Vec<Vec<u8>>, InvalidSource> {
        let mut keys = Vec::new();
        for var in &self.secret_env {
            let secret = std::env::var(var).map_err(|_| {
                invalid(
                    name,
                    "secret_env",
                    format!("environment variable {var} is not set"),
                )
            })?;
            keys.push(
                self.scheme
                    .derive_key(secret.trim_end())
                    .map_err(|r| invalid(name, "secret_env", format!("{var}: {r}")))?,
            );
        }
        for path in &self.secret_file {
            let secret = std::fs::read_to_string(path)
                .map_err(|e| invalid(name, "secret_file", format!("{path}: {e}")))?;
            keys.push(
                self.scheme
                    .derive_key(secret.trim_end())
                    .map_err(|r| invalid(name, "secret_file", format!("{path}: {r}")))?,
            );
        }
        Ok(keys)
    }

    /// `timestamp` and `max_age`: both or neither, a JSON pointer, and an age of 1s..=7d.
    fn check_age(&self, name: &str) -> Result<(), InvalidSource> {
        match (&self.timestamp, self.max_age) {
            (None, None) => Ok(()),
            (Some(_), None) => Err(invalid(name, "max_age", "required with timestamp")),
            (None, Some(_)) => Err(invalid(name, "timestamp", "required with max_age")),
            (Some(p), _) if !p.starts_with('/') => Err(invalid(
                name,
                "timestamp",
                "a JSON pointer into the signed body, starting with `/`",
            )),
            (Some(_), Some(a))
                if a < Duration::from_secs(1) || a > Duration::from_secs(7 * 24 * 3600) =>
            {
                Err(invalid(name, "max_age", "must be between 1s and 7d"))
            }
            (Some(_), Some(_)) => Ok(()),
        }
    }

    /// The timestamp tolerance in effect.
    pub fn tolerance(&self) -> Duration {
        let default = if self.scheme == Scheme::AwsSns {
            super::sns::DEFAULT_TOLERANCE
        } else {
            DEFAULT_TOLERANCE
        };
        self.tolerance.unwrap_or(default)
    }

    /// The bearer token (`bearer` sources only); with [`Secrets::Skip`], `None` for a token given
    /// by `token_env` (the variable is not read).
    ///
    /// # Errors
    /// A reason when not exactly one of `token`, `token_env` is given or the variable is unset.
    pub fn resolve_token(&self, secrets: Secrets) -> Result<Option<String>, String> {
        match (&self.token, &self.token_env) {
            (Some(t), None) => Ok(Some(t.clone())),
            (None, Some(_)) if secrets == Secrets::Skip => Ok(None),
            (None, Some(var)) => std::env::var(var)
                .map(Some)
                .map_err(|_| format!("token_env: environment variable {var} is not set")),
            _ => Err("give exactly one of `token` and `token_env`".into()),
        }
    }
}
