//! Verifying an `atlassian-connect` delivery ([`super::atlassian`] says what is checked), with the
//! public keys fetched by `kid` and cached.
//!
//! A key is fetched from the `key_url` template with `{kid}` replaced (the `kid` checked by
//! [`safe_kid`] first), without following redirects, in at most [`FETCH_TIMEOUT`], reading at most
//! [`MAX_KEY_BYTES`] of PEM. A fetched key is kept for [`MAX_KEY_AGE`] (at most [`MAX_KEYS`]; the
//! cache is emptied when full); the first use after that fetches it again, so a `kid` the key server
//! withdraws (now 404) stops verifying within [`MAX_KEY_AGE`]. A `kid` the server does not know
//! (404, or not an RSA public key) is refused 401, and after such a miss no other unknown `kid` is
//! fetched for [`MIN_REFRESH`], so forged `kid`s cannot make deprov hammer the key server; a failed
//! fetch (network, 5xx) blocks fetches for [`RETRY_FAILED`] and is 503, except that a key past
//! [`MAX_KEY_AGE`] keeps verifying (a warning per failure) until it is [`MAX_KEY_AGE`] +
//! [`STALE_GRACE`] old.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use tokio::sync::Mutex;

use super::atlassian::{key_url, qsh, safe_kid};
use super::oidc::{
    Clock, DEFAULT_LEEWAY, FETCH_TIMEOUT, MAX_KEY_AGE, MAX_TOKEN_LEN, MIN_REFRESH, RETRY_FAILED,
    STALE_GRACE, install_crypto_provider, read_bounded, system_clock, token_refusal,
};
use super::settings::{OneOrMany, SourceConfig};
use super::unix_now;

/// Largest key document read, in bytes.
pub const MAX_KEY_BYTES: usize = 16 * 1024;
/// Most keys kept.
pub const MAX_KEYS: usize = 64;

/// Why an Atlassian Connect delivery was refused (401, except [`ConnectError::Keys`]: 503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// No `Authorization: JWT <token>` (a `Bearer` token included), or one too long.
    #[error("send `Authorization: JWT <token>`")]
    Missing,
    /// More than one `Authorization` header: neither is used.
    #[error("repeated Authorization header")]
    Repeated,
    /// An HS256 token: shared-secret hooks are not accepted (see [`super::atlassian`]).
    #[error(
        "HS256 tokens are refused: Atlassian signs lifecycle hooks with RS256 (signed install)"
    )]
    Symmetric,
    /// The header does not parse, names another algorithm, or has no usable `kid`.
    #[error("malformed token header (RS256 with a kid of [A-Za-z0-9._-])")]
    Malformed,
    /// The key server does not know the `kid` (or serves no RSA public key for it).
    #[error("unknown signing key")]
    UnknownKey,
    /// The key server could not be reached or failed.
    #[error("Atlassian's signing keys could not be fetched; retry later")]
    Keys,
    /// Signature, `aud`, `exp` or `iat` check failed ([`super::oidc::token_refusal`]'s plain text).
    #[error("{0}")]
    Invalid(String),
    /// `qsh` is not the hash of this request's method, path and query.
    #[error("invalid token: qsh does not match this request")]
    Qsh,
    /// `iss` is not the body's `clientKey`.
    #[error("invalid token: iss is not the body's clientKey")]
    Issuer,
    /// The body (JSON) has no string `clientKey` to compare `iss` with: 401 like the other
    /// refusals, since the token cannot be tied to the hook.
    #[error("the body has no clientKey")]
    NoClientKey,
}

#[derive(Default)]
struct Cache {
    /// Each key by `kid`, with when it was fetched.
    keys: HashMap<String, (DecodingKey, Instant)>,
    missed_at: Option<Instant>,
    failed_at: Option<Instant>,
    fetches: u64,
}

/// The verifier of one `atlassian-connect` source, with its key cache.
pub struct ConnectVerifier {
    template: String,
    audience: String,
    base_path: String,
    leeway: Duration,
    clock: Clock,
    cache: Mutex<Cache>,
    client: reqwest::Client,
}

impl std::fmt::Debug for ConnectVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectVerifier")
            .field("template", &self.template)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

/// The token of `Authorization: JWT <token>` (scheme case-insensitive); `Bearer` is not it.
///
/// # Errors
/// [`ConnectError::Repeated`] for a repeated header, else [`ConnectError::Missing`].
pub fn jwt_token(headers: &HeaderMap) -> Result<&str, ConnectError> {
    let value = match super::header(headers, "authorization") {
        Err(super::Reject::Repeated(_)) => return Err(ConnectError::Repeated),
        other => other.ok().flatten().ok_or(ConnectError::Missing)?,
    };
    let (scheme, token) = value.split_once(' ').ok_or(ConnectError::Missing)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("jwt") || token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(ConnectError::Missing);
    }
    Ok(token)
}

impl ConnectVerifier {
    /// The verifier of a prepared `atlassian-connect` table.
    pub fn new(source: &SourceConfig) -> Self {
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .https_only(!source.allow_http_loopback)
            .build()
            .unwrap_or_default();
        Self {
            template: source
                .key_url
                .clone()
                .unwrap_or_else(|| super::atlassian::DEFAULT_KEY_URL.to_owned()),
            audience: source
                .audience
                .as_ref()
                .and_then(OneOrMany::single)
                .unwrap_or_default()
                .to_owned(),
            base_path: source.base_path.clone().unwrap_or_default(),
            leeway: source.leeway.unwrap_or(DEFAULT_LEEWAY),
            clock: system_clock(),
            cache: Mutex::new(Cache::default()),
            client,
        }
    }

    /// Uses `clock` instead of the system's (tests move it by hand).
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Puts `key` in the cache under `kid` (unit tests: no key server).
    #[cfg(test)]
    pub(crate) async fn insert_key(&self, kid: &str, key: DecodingKey) {
        let now = (self.clock)();
        self.cache
            .lock()
            .await
            .keys
            .insert(kid.to_owned(), (key, now));
    }

    /// How many key fetches were made so far.
    pub async fn fetches(&self) -> u64 {
        self.cache.lock().await.fetches
    }

    /// `Ok(Some(key))`, `Ok(None)` when the server does not know `kid`, `Err` when it failed.
    async fn fetch(&self, kid: &str) -> Result<Option<DecodingKey>, ConnectError> {
        let response = self
            .client
            .get(key_url(&self.template, kid))
            .send()
            .await
            .map_err(|e| {
                tracing::warn!(template = %self.template, kid, error = %e, "Atlassian key fetch failed");
                ConnectError::Keys
            })?;
        let status = response.status();
        if status.is_client_error() {
            return Ok(None);
        }
        if !status.is_success() {
            tracing::warn!(template = %self.template, kid, %status, "Atlassian key fetch failed");
            return Err(ConnectError::Keys);
        }
        let pem = read_bounded(response, MAX_KEY_BYTES)
            .await
            .ok_or(ConnectError::Keys)?;
        Ok(DecodingKey::from_rsa_pem(pem.as_bytes()).ok())
    }

    /// The key of `kid`: cached and younger than [`MAX_KEY_AGE`], or fetched.
    async fn key(&self, kid: &str) -> Result<DecodingKey, ConnectError> {
        let mut cache = self.cache.lock().await;
        let now = (self.clock)();
        let since = |t: Instant| now.saturating_duration_since(t);
        // A cached key past the maximum age, still usable while refetches fail.
        let stale = match cache.keys.get(kid) {
            Some((key, at)) if since(*at) < MAX_KEY_AGE => return Ok(key.clone()),
            Some((key, at)) if since(*at) < MAX_KEY_AGE + STALE_GRACE => Some(key.clone()),
            _ => None,
        };
        if cache.failed_at.is_some_and(|t| since(t) < RETRY_FAILED) {
            return stale.ok_or(ConnectError::Keys);
        }
        let known = cache.keys.contains_key(kid);
        if !known && cache.missed_at.is_some_and(|t| since(t) < MIN_REFRESH) {
            return Err(ConnectError::UnknownKey);
        }
        cache.fetches += 1;
        match self.fetch(kid).await {
            Ok(Some(key)) => {
                if !known && cache.keys.len() >= MAX_KEYS {
                    cache.keys.clear();
                }
                cache.keys.insert(kid.to_owned(), (key.clone(), now));
                cache.failed_at = None;
                Ok(key)
            }
            Ok(None) => {
                cache.keys.remove(kid);
                cache.missed_at = Some(now);
                Err(ConnectError::UnknownKey)
            }
            Err(e) => {
                cache.failed_at = Some(now);
                match stale {
                    Some(key) => {
                        tracing::warn!(
                            kid,
                            "verifying with the previously fetched Atlassian key until a fetch succeeds"
                        );
                        Ok(key)
                    }
                    None => Err(e),
                }
            }
        }
    }

    /// Verifies a delivery: `headers` carry the token, `method`, `path` and `query` (raw, without
    /// `?`) are the request's as deprov received it, `body` its bytes (for `clientKey`).
    ///
    /// # Errors
    /// [`ConnectError`].
    pub async fn verify(
        &self,
        headers: &HeaderMap,
        method: &str,
        path: &str,
        query: &str,
        body: &[u8],
    ) -> Result<(), ConnectError> {
        let token = jwt_token(headers)?;
        let header = jsonwebtoken::decode_header(token).map_err(|_| ConnectError::Malformed)?;
        match header.alg {
            Algorithm::RS256 => {}
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
                return Err(ConnectError::Symmetric);
            }
            _ => return Err(ConnectError::Malformed),
        }
        let kid = header
            .kid
            .filter(|k| safe_kid(k))
            .ok_or(ConnectError::Malformed)?;
        let key = self.key(&kid).await?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = self.leeway.as_secs();
        let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
            .map_err(|e| ConnectError::Invalid(token_refusal(&e, &[&self.audience], &[])))?
            .claims;
        let leeway = i64::try_from(self.leeway.as_secs()).unwrap_or(i64::MAX);
        match claims.get("iat").and_then(serde_json::Value::as_i64) {
            Some(iat) if iat <= unix_now().saturating_add(leeway) => {}
            _ => {
                return Err(ConnectError::Invalid(
                    "token iat is missing or in the future".into(),
                ));
            }
        }
        if claims.get("qsh").and_then(serde_json::Value::as_str)
            != Some(qsh(method, &self.base_path, path, query).as_str())
        {
            return Err(ConnectError::Qsh);
        }
        let client_key = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|b| b.get("clientKey")?.as_str().map(str::to_owned));
        let Some(client_key) = client_key else {
            return Err(ConnectError::NoClientKey);
        };
        match claims.get("iss").and_then(serde_json::Value::as_str) {
            Some(iss) if iss == client_key => Ok(()),
            _ => Err(ConnectError::Issuer),
        }
    }
}
