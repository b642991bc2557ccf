//! The `[sources.NAME]` whose webhook deliveries carry a signed token checked against fetched keys
//! (`jwt`, `atlassian-connect`): one verifier per source, built at start-up, whose key cache lives
//! as long as the server.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderMap, Uri};

use super::auth::{REPEATED_AUTHORIZATION, authorization_repeated, bearer};
use super::error::ApiError;
use crate::config::Config;
use crate::sources::atlassian_keys::{ConnectError, ConnectVerifier};
use crate::sources::oidc::{OidcError, OidcVerifier};
use crate::sources::{Scheme, jwt};

/// One source's verifier.
#[derive(Debug, Clone)]
pub enum TokenVerifier {
    /// `jwt`: `Authorization: Bearer <JWT>` against a JWKS.
    Jwt(Arc<OidcVerifier>),
    /// `atlassian-connect`: `Authorization: JWT <token>` against a key fetched by `kid`.
    Connect(Arc<ConnectVerifier>),
}

/// The verifiers of the configured token sources, by source name.
#[derive(Debug, Clone, Default)]
pub struct TokenSources(BTreeMap<String, TokenVerifier>);

impl TokenSources {
    /// A verifier for every `jwt` and `atlassian-connect` source of `config` (already checked).
    pub fn from_config(config: &Config) -> Self {
        let mut out = BTreeMap::new();
        for (name, source) in &config.sources {
            let verifier = match source.scheme {
                Scheme::Jwt => match jwt::jwks(source) {
                    Some(jwks) => TokenVerifier::Jwt(Arc::new(
                        OidcVerifier::with_rules(jwks, jwt::rules(source)).named(name),
                    )),
                    None => continue,
                },
                Scheme::AtlassianConnect => {
                    TokenVerifier::Connect(Arc::new(ConnectVerifier::new(source)))
                }
                _ => continue,
            };
            out.insert(name.clone(), verifier);
        }
        Self(out)
    }

    /// Source `name`'s verifier, if it is a token source.
    pub fn get(&self, name: &str) -> Option<&TokenVerifier> {
        self.0.get(name)
    }

    /// Checks a `POST` delivery to token source `name`: its `Authorization` token, and for
    /// Atlassian the request's path and query (`uri`, as received) and the body's `clientKey`.
    ///
    /// # Errors
    /// 401 for any refusal (a repeated `Authorization` header included); 503 (`Retry-After`) when the keys cannot be fetched.
    pub async fn authenticate(
        &self,
        name: &str,
        headers: &HeaderMap,
        uri: &Uri,
        body: &[u8],
    ) -> Result<(), ApiError> {
        let refuse = |detail: String| ApiError::Unauthorized(format!("source {name}: {detail}"));
        if authorization_repeated(headers) {
            return Err(refuse(REPEATED_AUTHORIZATION.into()));
        }
        match self.0.get(name) {
            None => Err(refuse("no verifier configured".into())),
            Some(TokenVerifier::Jwt(verifier)) => {
                let token = bearer(headers)
                    .ok_or_else(|| refuse("send `Authorization: Bearer <JWT>`".into()))?;
                verifier
                    .verify_claims(token)
                    .await
                    .map(drop)
                    .map_err(|e| match e {
                        OidcError::Jwks => ApiError::db_unavailable(
                            "the sender's signing keys could not be fetched; retry later",
                        ),
                        other => refuse(other.to_string()),
                    })
            }
            Some(TokenVerifier::Connect(verifier)) => verifier
                .verify(headers, "POST", uri.path(), uri.query().unwrap_or(""), body)
                .await
                .map_err(|e| match e {
                    ConnectError::Keys => ApiError::db_unavailable(
                        "Atlassian's signing keys could not be fetched; retry later",
                    ),
                    other => refuse(other.to_string()),
                }),
        }
    }
}
