//! `vercel-oidc`: the Vercel Marketplace partner API's `Authorization: Bearer <OIDC JWT>`.
//!
//! A token is accepted when its header names a key (`kid`) of the configured JWKS (`jwks_url` or
//! `jwks_file`), its RS256 signature verifies with that key (jsonwebtoken, `rust_crypto` backend), and
//! its claims carry the configured `iss` and `aud` and an `exp` in the future (`nbf`, when present, in
//! the past; 60 s leeway either way). Keys are fetched on first use and cached; a `kid` not in the
//! cache (Vercel rotated its keys) triggers a refetch, but at most one such refetch per
//! [`MIN_REFRESH`], so a stream of unknown `kid`s cannot make deprov hammer the JWKS host. A fetch
//! takes at most [`FETCH_TIMEOUT`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
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
    /// Signature, issuer, audience or expiry check failed (jsonwebtoken's reason).
    #[error("invalid token: {0}")]
    Invalid(String),
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

#[derive(Default)]
struct Cache {
    keys: HashMap<String, DecodingKey>,
    /// Whether the JWKS was fetched successfully at least once.
    loaded: bool,
    /// When an unknown `kid` last caused a refetch.
    missed_at: Option<Instant>,
    /// When a fetch last failed.
    failed_at: Option<Instant>,
    /// How many fetches were made (for tests and logs).
    fetches: u64,
}

/// A verifier for one `vercel-oidc` source.
pub struct OidcVerifier {
    source: JwksSource,
    validation: Validation,
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
    /// A verifier requiring `issuer` and `audience`; keys are fetched on first use.
    pub fn new(source: JwksSource, issuer: &str, audience: &str) -> Self {
        install_crypto_provider();
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_issuer(&[issuer]);
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .unwrap_or_default();
        Self {
            source,
            validation,
            cache: Mutex::new(Cache::default()),
            client,
        }
    }

    async fn fetch(&self) -> Result<HashMap<String, DecodingKey>, OidcError> {
        let text = match &self.source {
            JwksSource::File(path) => tokio::fs::read_to_string(path)
                .await
                .map_err(|_| OidcError::Jwks)?,
            JwksSource::Url(url) => {
                let response = self
                    .client
                    .get(url)
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .map_err(|e| {
                        tracing::warn!(error = %e, "JWKS fetch failed");
                        OidcError::Jwks
                    })?;
                response.text().await.map_err(|_| OidcError::Jwks)?
            }
        };
        let set: JwkSet = serde_json::from_str(&text).map_err(|_| OidcError::Jwks)?;
        Ok(set
            .keys
            .iter()
            .filter_map(|jwk| {
                let kid = jwk.common.key_id.clone()?;
                Some((kid, DecodingKey::from_jwk(jwk).ok()?))
            })
            .collect())
    }

    /// The key `kid`, from the cache or after one (rate-limited) refetch.
    async fn key(&self, kid: &str) -> Result<DecodingKey, OidcError> {
        let mut cache = self.cache.lock().await;
        if let Some(key) = cache.keys.get(kid) {
            return Ok(key.clone());
        }
        if cache.failed_at.is_some_and(|t| t.elapsed() < RETRY_FAILED) {
            return Err(OidcError::Jwks);
        }
        if cache.loaded {
            if cache.missed_at.is_some_and(|t| t.elapsed() < MIN_REFRESH) {
                return Err(OidcError::UnknownKey);
            }
            cache.missed_at = Some(Instant::now());
        }
        cache.fetches += 1;
        match self.fetch().await {
            Ok(keys) => cache.keys = keys,
            Err(e) => {
                cache.failed_at = Some(Instant::now());
                return Err(e);
            }
        }
        cache.failed_at = None;
        cache.loaded = true;
        tracing::info!(
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

    /// Verifies `token` and returns its claims.
    ///
    /// # Errors
    /// [`OidcError`].
    pub async fn verify(&self, token: &str) -> Result<Claims, OidcError> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Err(OidcError::Missing);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| OidcError::Malformed)?;
        if header.alg != Algorithm::RS256 {
            return Err(OidcError::Malformed);
        }
        let kid = header.kid.ok_or(OidcError::Malformed)?;
        let key = self.key(&kid).await?;
        jsonwebtoken::decode::<Claims>(token, &key, &self.validation)
            .map(|data| data.claims)
            .map_err(|e| OidcError::Invalid(e.to_string()))
    }
}
