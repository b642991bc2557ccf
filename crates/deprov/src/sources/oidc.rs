//! JWTs checked against a JWKS: `vercel-oidc` (the Vercel Marketplace partner API's
//! `Authorization: Bearer <OIDC JWT>`) and `jwt` (any OIDC/JWT bearer sender, see [`super::jwt`]).
//!
//! A token is accepted when its header names an allowed algorithm ([`Rules::algorithms`]) and a key
//! (`kid`) of the configured JWKS (`jwks_url` or `jwks_file`), its signature verifies with that key
//! (jsonwebtoken, `rust_crypto` backend), and its claims carry one of the configured `iss` and `aud`
//! values and an `exp` in the future (`nbf`, when present, in the past; [`Rules::leeway`] either
//! way) and every [`Rules::required_claims`] value. `vercel-oidc` is one fixed configuration
//! ([`Rules::vercel`]: RS256, one issuer, one audience, 60 s). Symmetric (`oct`) keys of a JWKS are
//! never loaded, and a key whose JWK names an `alg` verifies only that algorithm. Keys are fetched
//! on first use and cached; a `kid` not in the cache (the sender rotated its keys) triggers a
//! refetch, but at most one such refetch per [`MIN_REFRESH`], so a stream of unknown `kid`s cannot
//! make deprov hammer the JWKS host. A fetch takes at most [`FETCH_TIMEOUT`] and reads at most
//! [`MAX_JWKS_BYTES`].
//!
//! The cached set is trusted for [`MAX_KEY_AGE`]: the first verification after that refetches it
//! (inline), so a key removed from the JWKS stops verifying within [`MAX_KEY_AGE`] even when its
//! holder keeps using its `kid`. When that refetch fails, the old set keeps serving (each failure
//! logged as a warning) until it is [`MAX_KEY_AGE`] + [`STALE_GRACE`] old; after that, tokens are
//! answered 503 until a fetch succeeds. A `jwks_file` is read and parsed at start-up of `serve` and
//! `worker` ([`check_jwks_file`]), so a missing or broken file stops the start.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use tokio::sync::Mutex;

/// Shortest interval between two JWKS fetches triggered by unknown `kid`s.
pub const MIN_REFRESH: Duration = Duration::from_secs(30);
/// After a failed fetch, requests needing a fetch fail at once (503) for this long.
pub const RETRY_FAILED: Duration = Duration::from_secs(1);
/// Longest a JWKS fetch may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest accepted token, in bytes.
pub const MAX_TOKEN_LEN: usize = 8192;
/// Largest JWKS document read, in bytes (larger = unavailable).
pub const MAX_JWKS_BYTES: usize = 256 * 1024;
/// How long a fetched key set (or an Atlassian key) is trusted before the next verification
/// refetches it: a key removed at the sender stops verifying at most this long after.
pub const MAX_KEY_AGE: Duration = Duration::from_secs(10 * 60);
/// After [`MAX_KEY_AGE`], how much longer the old keys keep verifying while refetches fail (each
/// failure a warning); past it, verification answers 503 until a fetch succeeds.
pub const STALE_GRACE: Duration = Duration::from_secs(10 * 60);
/// Default clock-skew leeway for `exp`, `nbf` (and Atlassian's `iat`): 60 s, jsonwebtoken's default.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);

/// Installs rustls' `ring` provider as the process default (the one sqlx uses), once. reqwest is
/// built without a bundled provider (its default, aws-lc-rs, needs a C build this project avoids),
/// so every process that builds a `reqwest::Client` calls this first; later calls do nothing.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Why a token was refused (all answered 401). Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OidcError {
    /// No `Authorization: Bearer` token, or one too long.
    #[error("send `Authorization: Bearer <OIDC token>`")]
    Missing,
    /// The token's header does not parse, has no `kid`, or names an algorithm other than RS256.
    #[error("malformed token header")]
    Malformed,
    /// The `kid` is not in the JWKS, even after a refresh.
    #[error("unknown signing key")]
    UnknownKey,
    /// The JWKS could not be fetched or parsed.
    #[error("signing keys unavailable")]
    Jwks,
    /// Signature, issuer, audience or expiry check failed ([`token_refusal`]'s plain text).
    #[error("{0}")]
    Invalid(String),
    /// A [`Rules::required_claims`] claim is absent or has another value (its name).
    #[error("invalid token: claim {0} does not have the required value")]
    Claim(String),
}

/// Why jsonwebtoken refused a token, in plain words: `audiences` and `issuers` are the accepted
/// values (configuration, not secrets). Never contains the token or its claims.
pub fn token_refusal(
    e: &jsonwebtoken::errors::Error,
    audiences: &[&str],
    issuers: &[&str],
) -> String {
    use jsonwebtoken::errors::ErrorKind;
    let list = |values: &[&str]| {
        let mut v = values.to_vec();
        v.sort_unstable();
        v.iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match e.kind() {
        ErrorKind::ExpiredSignature => "token expired".into(),
        ErrorKind::ImmatureSignature => "token not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => format!("token audience is not one of {}", list(audiences)),
        ErrorKind::InvalidIssuer => format!("token issuer is not one of {}", list(issuers)),
        ErrorKind::MissingRequiredClaim(claim) => format!("token has no {claim} claim"),
        ErrorKind::InvalidClaimFormat(claim) => format!("token claim {claim} has the wrong type"),
        ErrorKind::InvalidSignature => "token signature does not verify".into(),
        ErrorKind::InvalidSubject => "token subject is not the expected one".into(),
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => {
            "token algorithm does not match its key".into()
        }
        ErrorKind::InvalidToken
        | ErrorKind::Base64(_)
        | ErrorKind::Json(_)
        | ErrorKind::Utf8(_) => "token is not a well-formed JWT".into(),
        _ => "token refused".into(),
    }
}

/// What a token must satisfy besides its signature.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    /// Allowed `alg` values (never `none`, never an HMAC: the callers only build asymmetric ones).
    pub algorithms: Vec<Algorithm>,
    /// Accepted `iss` values (one must match).
    pub issuers: Vec<String>,
    /// Accepted `aud` values (one must match one of the token's).
    pub audiences: Vec<String>,
    /// Claims that must equal these JSON values exactly (strings or booleans from the config).
    pub required_claims: Vec<(String, serde_json::Value)>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
}

impl Rules {
    /// `vercel-oidc`'s fixed rules: RS256, `issuer`, `audience`, [`DEFAULT_LEEWAY`].
    pub fn vercel(issuer: &str, audience: &str) -> Self {
        Self {
            algorithms: vec![Algorithm::RS256],
            issuers: vec![issuer.to_owned()],
            audiences: vec![audience.to_owned()],
            required_claims: Vec::new(),
            leeway: DEFAULT_LEEWAY,
        }
    }
}

/// The claims deprov reads (Vercel documents more; they are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Claims {
    /// `installation_id`: set on user-authenticated calls, `null` on system calls.
    #[serde(default)]
    pub installation_id: Option<String>,
    /// `sub`, e.g. `account:0123abcd:user:4567ef89`.
    #[serde(default)]
    pub sub: Option<String>,
}

/// Where the JWKS comes from.
#[derive(Debug, Clone)]
pub enum JwksSource {
    /// Fetched with GET.
    Url(String),
    /// Read from a file.
    File(String),
}

/// The URL or the path, as written in the configuration.
impl std::fmt::Display for JwksSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url(u) | Self::File(u) => f.write_str(u),
        }
    }
}

/// The time a key cache goes by: [`Instant::now`], or a hand-moved one in tests.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// The process's monotonic clock.
pub fn system_clock() -> Clock {
    Arc::new(Instant::now)
}

/// The keys of a JWKS by `kid`, each with the `alg` its JWK names.
type KeySet = HashMap<String, (DecodingKey, Option<String>)>;

/// The usable keys of JWKS document `text`: those with a `kid`, not symmetric, that load.
///
/// # Errors
/// Why the text is not a JWKS.
fn parse_jwks(text: &str) -> Result<KeySet, String> {
    let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
    Ok(set
        .keys
        .iter()
        .filter(|jwk| !matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)))
        .filter_map(|jwk| {
            let kid = jwk.common.key_id.clone()?;
            let alg = jwk.common.key_algorithm.map(|a| a.to_string());
            Some((kid, (DecodingKey::from_jwk(jwk).ok()?, alg)))
        })
        .collect())
}

/// Reads and parses the JWKS file `path` (start-up of `serve` and `worker`).
///
/// # Errors
/// The OS error, or why the content is not a JWKS with at least one usable key (asymmetric, with a
/// `kid`).
pub fn check_jwks_file(path: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    if text.len() > MAX_JWKS_BYTES {
        return Err(format!("larger than {MAX_JWKS_BYTES} bytes"));
    }
    if parse_jwks(&text)?.is_empty() {
        return Err("no usable key (an asymmetric key with a kid)".into());
    }
    Ok(())
}

#[derive(Default)]
struct Cache {
    /// Each key by `kid`, with the `alg` its JWK names, if any.
    keys: KeySet,
    /// When the keys were last fetched successfully (`None`: never).
    loaded_at: Option<Instant>,
    /// When an unknown `kid` last caused a refetch.
    missed_at: Option<Instant>,
    /// When a fetch last failed.
    failed_at: Option<Instant>,
    /// How many fetches were made (for tests and logs).
    fetches: u64,
}

/// A verifier for one `vercel-oidc` or `jwt` source, with its key cache.
pub struct OidcVerifier {
    /// The configured source's name (logs).
    name: String,
    source: JwksSource,
    clock: Clock,
    validation: Validation,
    required_claims: Vec<(String, serde_json::Value)>,
    cache: Mutex<Cache>,
    client: reqwest::Client,
}

impl std::fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcVerifier")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl OidcVerifier {
    /// `vercel-oidc`'s verifier: [`Rules::vercel`] (`issuer`, `audience`); keys fetched on first use.
    pub fn new(source: JwksSource, issuer: &str, audience: &str) -> Self {
        Self::with_rules(source, Rules::vercel(issuer, audience))
    }

    /// A verifier applying `rules` (an empty `algorithms` allows RS256 only); keys fetched on first
    /// use and trusted for [`MAX_KEY_AGE`].
    pub fn with_rules(source: JwksSource, rules: Rules) -> Self {
        install_crypto_provider();
        let mut validation = Validation::new(Algorithm::RS256);
        if !rules.algorithms.is_empty() {
            validation.algorithms = rules.algorithms;
        }
        validation.set_issuer(&rules.issuers);
        validation.set_audience(&rules.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = rules.leeway.as_secs();
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .unwrap_or_default();
        Self {
            name: String::new(),
            source,
            clock: system_clock(),
            validation,
            required_claims: rules.required_claims,
            cache: Mutex::new(Cache::default()),
            client,
        }
    }

    /// Names the verifier's source in its logs.
    #[must_use]
    pub fn named(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    /// Uses `clock` instead of the system's (tests move it by hand).
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Fetches (or reads) and parses the JWKS.
    ///
    /// # Errors
    /// Why it could not, for the log.
    async fn fetch(&self) -> Result<KeySet, String> {
        let text = match &self.source {
            JwksSource::File(path) => {
                let text = tokio::fs::read_to_string(path)
                    .await
                    .map_err(|e| e.to_string())?;
                if text.len() > MAX_JWKS_BYTES {
                    return Err(format!("larger than {MAX_JWKS_BYTES} bytes"));
                }
                text
            }
            JwksSource::Url(url) => {
                let response = self
                    .client
                    .get(url)
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .map_err(|e| e.to_string())?;
                read_bounded(response, MAX_JWKS_BYTES)
                    .await
                    .ok_or_else(|| {
                        format!("body larger than {MAX_JWKS_BYTES} bytes, not UTF-8, or cut off")
                    })?
            }
        };
        parse_jwks(&text)
    }

    /// The key `kid`, from the cache, or after a refetch: the cache is older than the maximum age
    /// ([`MAX_KEY_AGE`]), or `kid` is unknown (at most one such refetch per [`MIN_REFRESH`]).
    async fn key(&self, kid: &str) -> Result<(DecodingKey, Option<String>), OidcError> {
        let mut cache = self.cache.lock().await;
        let now = (self.clock)();
        let since = |t: Option<Instant>| t.map(|t| now.saturating_duration_since(t));
        let age = since(cache.loaded_at);
        let fresh = age.is_some_and(|a| a < MAX_KEY_AGE);
        // Within the grace after the maximum age, the old set serves while refetches fail.
        let stale_ok = age.is_some_and(|a| a < MAX_KEY_AGE + STALE_GRACE);
        if fresh && let Some(key) = cache.keys.get(kid) {
            return Ok(key.clone());
        }
        if since(cache.failed_at).is_some_and(|d| d < RETRY_FAILED) {
            return match cache.keys.get(kid) {
                Some(key) if stale_ok => Ok(key.clone()),
                _ => Err(OidcError::Jwks),
            };
        }
        // An unknown kid in a fresh set refetches, rate-limited; the refetch of an old set counts
        // too (a kid missing right after it needs no other).
        if fresh && since(cache.missed_at).is_some_and(|d| d < MIN_REFRESH) {
            return Err(OidcError::UnknownKey);
        }
        if cache.loaded_at.is_some() {
            cache.missed_at = Some(now);
        }
        cache.fetches += 1;
        match self.fetch().await {
            Ok(keys) => cache.keys = keys,
            Err(error) => {
                cache.failed_at = Some(now);
                tracing::warn!(
                    source = %self.name,
                    jwks = %self.source,
                    %error,
                    "JWKS fetch failed"
                );
                return match cache.keys.get(kid) {
                    Some(key) if stale_ok => {
                        tracing::warn!(
                            source = %self.name,
                            jwks = %self.source,
                            "verifying with the previous JWKS until a fetch succeeds"
                        );
                        Ok(key.clone())
                    }
                    _ => Err(OidcError::Jwks),
                };
            }
        }
        cache.failed_at = None;
        cache.loaded_at = Some(now);
        tracing::info!(
            source = %self.name,
            keys = cache.keys.len(),
            fetches = cache.fetches,
            "JWKS fetched"
        );
        cache.keys.get(kid).cloned().ok_or(OidcError::UnknownKey)
    }

    /// How many times the JWKS has been fetched so far.
    pub async fn fetches(&self) -> u64 {
        self.cache.lock().await.fetches
    }

    /// Verifies `token` and returns the partner API's claims.
    ///
    /// # Errors
    /// [`OidcError`].
    pub async fn verify(&self, token: &str) -> Result<Claims, OidcError> {
        let claims = self.verify_claims(token).await?;
        serde_json::from_value(claims)
            .map_err(|e| OidcError::Invalid(format!("token claims unusable: {e}")))
    }

    /// Verifies `token` (signature, algorithm, `iss`, `aud`, `exp`, `nbf`, required claims) and
    /// returns all its claims.
    ///
    /// # Errors
    /// [`OidcError`].
    pub async fn verify_claims(&self, token: &str) -> Result<serde_json::Value, OidcError> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Err(OidcError::Missing);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| OidcError::Malformed)?;
        if !self.validation.algorithms.contains(&header.alg) {
            return Err(OidcError::Malformed);
        }
        let kid = header.kid.ok_or(OidcError::Malformed)?;
        let (key, alg) = self.key(&kid).await?;
        if alg.is_some_and(|a| a != format!("{:?}", header.alg)) {
            return Err(OidcError::Malformed);
        }
        // jsonwebtoken wants every allowed algorithm of the key's family: allow just this one.
        let mut validation = self.validation.clone();
        validation.algorithms = vec![header.alg];
        let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
            .map(|data| data.claims)
            .map_err(|e| {
                let aud: Vec<&str> = self
                    .validation
                    .aud
                    .iter()
                    .flatten()
                    .map(String::as_str)
                    .collect();
                let iss: Vec<&str> = self
                    .validation
                    .iss
                    .iter()
                    .flatten()
                    .map(String::as_str)
                    .collect();
                OidcError::Invalid(token_refusal(&e, &aud, &iss))
            })?;
        for (name, expected) in &self.required_claims {
            if claims.get(name) != Some(expected) {
                return Err(OidcError::Claim(name.clone()));
            }
        }
        Ok(claims)
    }
}

/// The body of `response` as UTF-8 text, or `None` when it is longer than `max` bytes, not UTF-8,
/// or the connection fails.
pub async fn read_bounded(mut response: reqwest::Response, max: usize) -> Option<String> {
    if response
        .content_length()
        .is_some_and(|n| n > u64::try_from(max).unwrap_or(u64::MAX))
    {
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if body.len() + chunk.len() > max {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).ok()
}
