//! Authentication extractors: deletion sources, operators ([`Operator`], [`OperatorAuth`]: named
//! tokens with roles, and the bootstrap `DEPROV_OPERATOR_TOKEN`), and the Vercel partner API.
//!
//! Tokens are compared in constant time: the presented token and every configured token are hashed
//! with SHA-256 and the digests compared with `subtle`, visiting every configured token, so neither the
//! position of a match nor a token's length leaks through timing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use time::OffsetDateTime;
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use crate::db::{self, Bounds};
use crate::queue::tokens::{self, Role};

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

/// The token of an `Authorization: Bearer <token>` header (RFC 6750 §2.1; scheme case-insensitive).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
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

/// A request authenticated as one `[sources.NAME]`: missing or unknown token → 401.
#[derive(Debug, Clone)]
pub struct AuthenticatedSource {
    /// The source's name (the `NAME` of `[sources.NAME]`).
    pub name: String,
}

impl FromRequestParts<AppState> for AuthenticatedSource {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(&parts.headers).ok_or_else(unauthorized)?;
        let name = state.sources.identify(token).ok_or_else(unauthorized)?;
        Ok(Self {
            name: name.to_owned(),
        })
    }
}

/// A request authenticated as an operator: by a token of `deprov tokens create` or by the bootstrap
/// `DEPROV_OPERATOR_TOKEN`, with the role the route needs (see [`OperatorAuth`]).
///
/// Safe methods (`GET`, `HEAD`, `OPTIONS`) need any role; every other method changes state and
/// needs role `operator`: a `read-only` token there is 403. The rule follows the method so that
/// every operator route, present or future, gets it by taking this extractor; take it before any
/// body extractor so a refused request reads and stores nothing.
///
/// Answers: 403 when no operator token exists at all (no `DEPROV_OPERATOR_TOKEN`, no token in
/// `deprov.operator_tokens`); 401 for a missing, unknown or revoked token; 503 when the token table
/// cannot be read within the intake pool's bounds.
#[derive(Debug, Clone)]
pub struct Operator {
    /// The audit actor: the token's name, or `env:operator` for `DEPROV_OPERATOR_TOKEN`.
    pub actor: String,
    /// The token's role.
    pub role: Role,
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let operator = state
            .operators
            .authenticate(&state.pools.intake, bearer(&parts.headers))
            .await?;
        let safe = matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
        if !safe && operator.role != Role::Operator {
            return Err(ApiError::Forbidden(format!(
                "token {:?} has role {}; {} needs role operator",
                operator.actor,
                operator.role.as_str(),
                parts.method
            )));
        }
        Ok(operator)
    }
}

/// The audit actor of `DEPROV_OPERATOR_TOKEN`.
pub const BOOTSTRAP_ACTOR: &str = "env:operator";

/// A token of the table as a server keeps it: digest, ID, name, role.
#[derive(Debug, Clone)]
struct Known {
    digest: TokenDigest,
    id: Uuid,
    name: String,
    role: Role,
}

/// The tokens read at `read_at`.
#[derive(Debug)]
struct Snapshot {
    tokens: Vec<Known>,
    read_at: Instant,
}

/// Checks operator tokens: the bootstrap `DEPROV_OPERATOR_TOKEN` (role `operator`, actor
/// [`BOOTSTRAP_ACTOR`]) and the tokens of `deprov.operator_tokens` ([`crate::queue::tokens`]).
///
/// The table is not read per request: a server keeps the tokens that are not revoked (digests only)
/// for `[operator_tokens] cache_ttl` (default 5 s) from the start of the read, so a revoke takes effect
/// on every server within that time. One request at a time re-reads it when stale (the others wait
/// for that read, not for their own), through the intake pool with [`Bounds::STATE`]; a read that
/// fails answers 503 rather than trusting a stale copy. The same transaction writes `last_used_at` of
/// the tokens used since the previous read (uses in the last `cache_ttl` before a process stops are
/// not recorded). A presented token is compared with every known digest in constant time.
#[derive(Debug)]
pub struct OperatorAuth {
    bootstrap: Option<TokenDigest>,
    ttl: Duration,
    snapshot: RwLock<Option<Arc<Snapshot>>>,
    refresh: tokio::sync::Mutex<()>,
    uses: Mutex<HashMap<Uuid, OffsetDateTime>>,
}

impl OperatorAuth {
    /// Checks `bootstrap` (`DEPROV_OPERATOR_TOKEN`, kept as its digest) and the token table, whose
    /// copy is trusted for `ttl`.
    pub fn new(bootstrap: Option<&str>, ttl: Duration) -> Self {
        Self {
            bootstrap: bootstrap.map(TokenDigest::of),
            ttl,
            snapshot: RwLock::new(None),
            refresh: tokio::sync::Mutex::new(()),
            uses: Mutex::new(HashMap::new()),
        }
    }

    fn fresh(&self) -> Option<Arc<Snapshot>> {
        let guard = self.snapshot.read().unwrap_or_else(|e| e.into_inner());
        guard
            .as_ref()
            .filter(|s| s.read_at.elapsed() < self.ttl)
            .cloned()
    }

    /// The tokens not revoked, from the copy when it is younger than the TTL, else read anew.
    async fn tokens(&self, pool: &sqlx::PgPool) -> Result<Arc<Snapshot>, sqlx::Error> {
        if let Some(s) = self.fresh() {
            return Ok(s);
        }
        let _one_reader = self.refresh.lock().await;
        if let Some(s) = self.fresh() {
            return Ok(s);
        }
        let uses: Vec<(Uuid, OffsetDateTime)> = self
            .uses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        let read_at = Instant::now();
        let read = async {
            let mut tx = db::begin(pool, Bounds::STATE).await?;
            tokens::touch(&mut *tx, &uses).await?;
            let rows = tokens::active(&mut *tx).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(rows)
        }
        .await;
        let rows = match read {
            Ok(rows) => rows,
            Err(e) => {
                // Not written: keep the uses for the next read.
                let mut pending = self.uses.lock().unwrap_or_else(|e| e.into_inner());
                for (id, at) in uses {
                    let entry = pending.entry(id).or_insert(at);
                    *entry = (*entry).max(at);
                }
                return Err(e);
            }
        };
        let tokens = rows
            .into_iter()
            .filter_map(|row| {
                let digest = <[u8; 32]>::try_from(row.token_sha256.as_slice()).ok()?;
                Some(Known {
                    digest: TokenDigest(digest),
                    id: row.id,
                    name: row.name,
                    role: Role::parse(&row.role)?,
                })
            })
            .collect();
        let snapshot = Arc::new(Snapshot { tokens, read_at });
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Some(snapshot.clone());
        Ok(snapshot)
    }

    /// Who `presented` (a bearer token) belongs to.
    ///
    /// # Errors
    /// 403 when no operator token exists at all; 401 when `presented` is missing or matches no token
    /// that is not revoked; 503 when the token table cannot be read.
    pub async fn authenticate(
        &self,
        pool: &sqlx::PgPool,
        presented: Option<&str>,
    ) -> Result<Operator, ApiError> {
        let presented = presented.map(TokenDigest::of);
        if let (Some(bootstrap), Some(p)) = (&self.bootstrap, &presented)
            && bootstrap.matches(p)
        {
            return Ok(Operator {
                actor: BOOTSTRAP_ACTOR.to_owned(),
                role: Role::Operator,
            });
        }
        let snapshot = self.tokens(pool).await?;
        if snapshot.tokens.is_empty() && self.bootstrap.is_none() {
            return Err(ApiError::Forbidden(
                "the operator API is disabled: no operator token exists \
                 (set DEPROV_OPERATOR_TOKEN or run `deprov tokens create`)"
                    .into(),
            ));
        }
        let presented = presented.ok_or_else(unauthorized)?;
        let mut found = None;
        for known in &snapshot.tokens {
            if known.digest.matches(&presented) {
                found = Some(known);
            }
        }
        let known = found.ok_or_else(unauthorized)?;
        self.uses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(known.id, OffsetDateTime::now_utc());
        Ok(Operator {
            actor: known.name.clone(),
            role: known.role,
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
                let verifier =
                    OidcVerifier::new(jwks, source.issuer.as_deref()?, source.audience.as_deref()?);
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
    /// [`ApiError::Unauthorized`] when the credentials are missing or wrong.
    pub async fn verify(&self, headers: &HeaderMap) -> Result<PartnerIdentity, ApiError> {
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
