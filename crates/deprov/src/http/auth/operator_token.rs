//! Operators: the [`Operator`] extractor (role by HTTP method) and [`OperatorAuth`], which checks
//! the bootstrap `DEPROV_OPERATOR_TOKEN` and the cached `deprov tokens` table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::Method;
use axum::http::request::Parts;
use time::OffsetDateTime;
use uuid::Uuid;

use super::super::AppState;
use super::super::error::ApiError;
use super::{TokenDigest, authorization_once, bearer, unauthorized};
use crate::db::{self, Bounds};
use crate::queue::tokens::{self, Role};

/// A request authenticated as an operator: by a token of `deprov tokens create` or by the bootstrap
/// `DEPROV_OPERATOR_TOKEN`, with the role the route needs (see [`OperatorAuth`]).
///
/// Safe methods (`GET`, `HEAD`, `OPTIONS`) need any role; every other method changes state and
/// needs role `operator`: a `read-only` token there is 403. The rule follows the method so that
/// every operator route, present or future, gets it by taking this extractor; take it before any
/// body extractor so a refused request reads and stores nothing.
///
/// Answers: 403 when no operator token exists at all (no `DEPROV_OPERATOR_TOKEN`, no token in
/// `deprov.operator_tokens`); 401 for a missing, repeated, unknown or revoked token; 503 when the token table
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
        authorization_once(&parts.headers)?;
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
        self.authenticate_digest(pool, presented.map(TokenDigest::of))
            .await
    }

    /// Who the token of digest `presented` belongs to, by the same rules as [`Self::authenticate`]:
    /// how a console session, which keeps only the digest of the token that logged in, is checked
    /// again on every request (a revoked token ends its sessions; the role is the token's current
    /// one).
    ///
    /// # Errors
    /// As [`Self::authenticate`].
    pub async fn authenticate_digest(
        &self,
        pool: &sqlx::PgPool,
        presented: Option<TokenDigest>,
    ) -> Result<Operator, ApiError> {
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
