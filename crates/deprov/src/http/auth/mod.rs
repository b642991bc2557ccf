//! Authentication extractors: deletion sources, operators ([`Operator`], [`OperatorAuth`]: named
//! tokens with roles, and the bootstrap `DEPROV_OPERATOR_TOKEN`), and the Vercel partner API.
//!
//! Tokens are compared in constant time: the presented token and every configured token are hashed
//! with SHA-256 and the digests compared with `subtle`, visiting every configured token, so neither the
//! position of a match nor a token's length leaks through timing.

mod operator_token;

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::ApiError;
pub use operator_token::{BOOTSTRAP_ACTOR, Operator, OperatorAuth};

use crate::config::Config;
use crate::sources::Scheme;
use crate::sources::oidc::{JwksSource, OidcError, OidcVerifier};

/// The SHA-256 digest of a secret token; only digests are kept in memory after start-up.
#[derive(Clone)]
pub struct TokenDigest([u8; 32]);

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

impl TokenDigest {
    /// Digests `token`.
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// A digest from its 32 bytes (as stored).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The digest's 32 bytes (to store; never the token).
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Constant-time equality of two digests.
    pub fn matches(&self, other: &TokenDigest) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

/// The configured `[sources.NAME]` tokens; a token names its source.
#[derive(Debug, Clone, Default)]
pub struct SourceTokens(Vec<(TokenDigest, String)>);

impl SourceTokens {
    /// Digests every source token of `config`.
    pub fn from_config(config: &Config) -> Self {
        Self(
            config
                .source_tokens()
                .into_iter()
                .map(|(token, name)| (TokenDigest::of(&token), name))
                .collect(),
        )
    }

    /// The source whose token equals `presented`, comparing against every source in constant time.
    pub fn identify(&self, presented: &str) -> Option<&str> {
        let presented = TokenDigest::of(presented);
        let mut found = None;
        for (digest, name) in &self.0 {
            if digest.matches(&presented) {
                found = Some(name.as_str());
            }
        }
        found
    }

    /// The digest of source `name`'s token.
    pub fn digest_of(&self, name: &str) -> Option<&TokenDigest> {
        self.0.iter().find(|(_, n)| n == name).map(|(d, _)| d)
    }
}

/// The detail of the 401 answered to a request carrying more than one `Authorization` header: no
/// route picks one of them.
pub const REPEATED_AUTHORIZATION: &str = "repeated Authorization header";

/// Whether the request carries more than one `Authorization` header.
pub fn authorization_repeated(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::AUTHORIZATION)
        .iter()
        .nth(1)
        .is_some()
}

/// 401 [`REPEATED_AUTHORIZATION`] when the request carries more than one `Authorization` header.
///
/// # Errors
/// [`ApiError::Unauthorized`].
pub fn authorization_once(headers: &HeaderMap) -> Result<(), ApiError> {
    if authorization_repeated(headers) {
        Err(ApiError::Unauthorized(REPEATED_AUTHORIZATION.into()))
    } else {
        Ok(())
    }
}

/// The token of an `Authorization: Bearer <token>` header (RFC 6750 §2.1; scheme case-insensitive).
/// `None` also when the header is repeated: neither value is used ([`authorization_once`] says why).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    if authorization_repeated(headers) {
        return None;
    }
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn unauthorized() -> ApiError {
    ApiError::Unauthorized("send `Authorization: Bearer <token>` with a configured token".into())
}

/// A request authenticated as one `[sources.NAME]`: missing, repeated or unknown token → 401.
#[derive(Debug, Clone)]
pub struct AuthenticatedSource {
    /// The source's name (the `NAME` of `[sources.NAME]`).
    pub name: String,
}

impl FromRequestParts<AppState> for AuthenticatedSource {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authorization_once(&parts.headers)?;
        let token = bearer(&parts.headers).ok_or_else(unauthorized)?;
        let name = state.sources.identify(token).ok_or_else(unauthorized)?;
        Ok(Self {
            name: name.to_owned(),
        })
    }
}

/// How Vercel partner-API requests are authenticated: the bearer token of the source named by
/// `[vercel] source`, or — with `scheme = "vercel-oidc"` — Vercel's OIDC JWT checked against the
/// source's JWKS, issuer and audience ([`OidcVerifier`]).
#[derive(Debug, Clone)]
pub enum PartnerVerifier {
    /// `Authorization: Bearer <token>` equal to the source's configured token.
    SourceToken {
        /// The source requests are recorded under.
        source: String,
        /// Its token's digest.
        digest: TokenDigest,
    },
    /// `Authorization: Bearer <OIDC JWT>`.
    Oidc {
        /// The source requests are recorded under.
        source: String,
        /// The verifier, with its key cache.
        verifier: Arc<OidcVerifier>,
    },
}

/// A verified partner-API caller's identity.
#[derive(Debug, Clone)]
pub struct PartnerIdentity {
    /// The source the request is recorded under.
    pub source: String,
    /// The token's `installation_id` claim (OIDC user tokens only).
    pub installation_id: Option<String>,
}

impl PartnerVerifier {
    /// The verifier for `[vercel] source = name`; `None` when the source is missing or has another
    /// scheme (refused at load).
    pub fn for_source(config: &Config, tokens: &SourceTokens, name: &str) -> Option<Self> {
        let source = config.sources.get(name)?;
        match source.scheme {
            Scheme::Bearer => Some(Self::SourceToken {
                source: name.to_owned(),
                digest: tokens.digest_of(name)?.clone(),
            }),
            Scheme::VercelOidc => {
                let jwks = match (&source.jwks_url, &source.jwks_file) {
                    (Some(url), _) => JwksSource::Url(url.clone()),
                    (None, Some(file)) => JwksSource::File(file.clone()),
                    (None, None) => return None,
                };
                let verifier = OidcVerifier::new(
                    jwks,
                    source.issuer.as_ref()?.single()?,
                    source.audience.as_ref()?.single()?,
                )
                .named(name);
                Some(Self::Oidc {
                    source: name.to_owned(),
                    verifier: Arc::new(verifier),
                })
            }
            _ => None,
        }
    }

    /// Checks the request's credentials; returns the source to record the request under.
    ///
    /// # Errors
    /// [`ApiError::Unauthorized`] when the credentials are missing, repeated or wrong.
    pub async fn verify(&self, headers: &HeaderMap) -> Result<PartnerIdentity, ApiError> {
        authorization_once(headers)?;
        match self {
            Self::SourceToken { source, digest } => {
                let token = bearer(headers).ok_or_else(unauthorized)?;
                if digest.matches(&TokenDigest::of(token)) {
                    Ok(PartnerIdentity {
                        source: source.clone(),
                        installation_id: None,
                    })
                } else {
                    Err(unauthorized())
                }
            }
            Self::Oidc { source, verifier } => {
                let token = bearer(headers).ok_or_else(unauthorized)?;
                let claims = verifier.verify(token).await.map_err(|e| match e {
                    OidcError::Jwks => ApiError::db_unavailable(
                        "Vercel's signing keys could not be fetched; retry later",
                    ),
                    other => ApiError::Unauthorized(other.to_string()),
                })?;
                Ok(PartnerIdentity {
                    source: source.clone(),
                    installation_id: claims.installation_id,
                })
            }
        }
    }
}

/// A verified Vercel partner-API caller. No `[vercel]` section configured → 404.
#[derive(Debug, Clone)]
pub struct VercelCaller {
    /// The source the request is recorded under (`[vercel] source`).
    pub source: String,
    /// The `X-Vercel-Auth` header (`user` or `system`), if sent; informational.
    pub auth_style: Option<String>,
    /// The OIDC token's `installation_id` claim, when it carries one: it must name the installation.
    pub installation_id: Option<String>,
}

impl FromRequestParts<AppState> for VercelCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(verifier) = &state.vercel else {
            return Err(ApiError::NotFound(
                "the Vercel partner API is not configured ([vercel] section)".into(),
            ));
        };
        let identity = verifier.verify(&parts.headers).await?;
        let auth_style = parts
            .headers
            .get("x-vercel-auth")
            .and_then(|v| v.to_str().ok())
            .map(|s| s.chars().take(32).collect());
        Ok(Self {
            source: identity.source,
            auth_style,
            installation_id: identity.installation_id,
        })
    }
}
