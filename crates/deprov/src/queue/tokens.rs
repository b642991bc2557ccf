//! Operator tokens (`deprov.operator_tokens`, migration 0006): named bearer tokens with a role,
//! stored only as their SHA-256 digest.
//!
//! A token is `dpv_` followed by 43 base64url characters: 32 bytes (256 bits) from the operating
//! system's CSPRNG (`rand`'s thread generator, seeded from `getrandom`). SHA-256 is the right digest
//! for a token of that entropy: a slow, salted password hash (argon2, bcrypt) protects *guessable*
//! secrets against offline guessing; nobody can enumerate 2^256 candidates, so it would only make
//! every request slower. Digests are compared in constant time ([`crate::http::auth`]). The token
//! itself is returned once, by [`create`], and never stored or logged.
//!
//! Roles ([`Role`]): `read-only` may read (every `GET` operator route), `operator` may also change
//! state (kill switch, job actions). Creating and revoking tokens are operator actions: both are
//! written to the audit log ([`super::audit`], actions `token.create` / `token.revoke`, target
//! `token:<name>`) in the same transaction.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgExecutor};
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit;

/// Prefix of every token deprov issues (so a leaked one is recognizable, e.g. by secret scanners).
pub const TOKEN_PREFIX: &str = "dpv_";

/// Longest token name, in characters (names match `[A-Za-z0-9._@-]{1,100}`).
pub const MAX_NAME_CHARS: usize = 100;

/// What a token may do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Read jobs, kill switches and the audit log (`GET` routes only).
    ReadOnly,
    /// Everything `read-only` may, and change state (`PUT`, `POST`, `DELETE` routes).
    Operator,
}

impl Role {
    /// The stored and displayed name: `read-only` or `operator`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::Operator => "operator",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read-only" => Some(Self::ReadOnly),
            "operator" => Some(Self::Operator),
            _ => None,
        }
    }
}

/// Why a token action was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The name or reason is not allowed.
    #[error("{0}")]
    Invalid(String),
    /// A token that is not revoked already has this name.
    #[error("a token named {0:?} exists and is not revoked; revoke it first or pick another name")]
    NameTaken(String),
    /// No token (not yet revoked) has this name or ID.
    #[error("no active token named or with ID {0:?}")]
    NotFound(String),
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A token as listed: everything but its digest.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct TokenInfo {
    /// Its ID (UUIDv7).
    pub id: Uuid,
    /// Its name: the audit actor of everything done with it.
    pub name: String,
    /// `read-only` or `operator`.
    pub role: String,
    /// When it was created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Who created it (`cli:<name>`).
    pub created_by: String,
    /// When it was revoked; `None` while it works.
    #[serde(with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
    /// Who revoked it.
    pub revoked_by: Option<String>,
    /// When it last authenticated a request, as recorded by a server (at most
    /// `[operator_tokens] cache_ttl` late; see [`touch`]).
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_used_at: Option<OffsetDateTime>,
}

/// A token that is not revoked, with its digest: what a server authenticates against.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ActiveToken {
    /// Its ID.
    pub id: Uuid,
    /// Its name (the audit actor).
    pub name: String,
    /// `read-only` or `operator`.
    pub role: String,
    /// SHA-256 of the token (32 bytes).
    pub token_sha256: Vec<u8>,
}

/// SHA-256 of `token` (see the module docs for why no salt or slow hash).
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A new random token: [`TOKEN_PREFIX`] + [`random_secret`], 47 characters.
pub fn generate() -> String {
    format!("{TOKEN_PREFIX}{}", random_secret())
}

/// Base64url (no padding) of 32 random bytes: 43 characters, 256 bits.
pub fn random_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Checks a token name: 1..=100 characters of `A-Z a-z 0-9 . _ @ -` (no `:`, so a name never
/// looks like the `cli:` or `env:` actors).
///
/// # Errors
/// [`TokenError::Invalid`].
pub fn check_name(name: &str) -> Result<(), TokenError> {
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'));
    if ok {
        Ok(())
    } else {
        Err(TokenError::Invalid(format!(
            "name {name:?}: must be 1..={MAX_NAME_CHARS} characters of A-Z a-z 0-9 . _ @ -"
        )))
    }
}

/// Creates a token named `name` with `role`, records `token.create` by `actor` for `reason`, and
/// returns the row and the token — the only time the token exists outside the caller's hands.
///
/// # Errors
/// [`TokenError::Invalid`] for a bad name; [`TokenError::NameTaken`] when a token not revoked has
/// the name; database errors.
pub async fn create(
    conn: &mut PgConnection,
    name: &str,
    role: Role,
    actor: &str,
    reason: &str,
) -> Result<(TokenInfo, String), TokenError> {
    check_name(name)?;
    let token = generate();
    let inserted: Option<TokenInfo> = crate::db::query_as(
        "INSERT INTO deprov.operator_tokens (id, name, role, token_sha256, created_by) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING \
         RETURNING id, name, role, created_at, created_by, revoked_at, revoked_by, last_used_at",
    )
    .bind(Uuid::now_v7())
    .bind(name)
    .bind(role.as_str())
    .bind(&digest(&token)[..])
    .bind(actor)
    .fetch_optional(&mut *conn)
    .await?;
    let info = inserted.ok_or_else(|| TokenError::NameTaken(name.to_owned()))?;
    let details = serde_json::json!({"token_id": info.id, "role": info.role});
    audit::record(
        &mut *conn,
        actor,
        "token.create",
        Some(&format!("token:{name}")),
        reason,
        &details,
    )
    .await?;
    Ok((info, token))
}

/// Every token, newest first; revoked ones only when `include_revoked`.
///
/// # Errors
/// Database errors.
pub async fn list(
    db: impl PgExecutor<'_>,
    include_revoked: bool,
) -> Result<Vec<TokenInfo>, sqlx::Error> {
    crate::db::query_as(
        "SELECT id, name, role, created_at, created_by, revoked_at, revoked_by, last_used_at \
         FROM deprov.operator_tokens WHERE $1 OR revoked_at IS NULL ORDER BY created_at DESC, id DESC",
    )
    .bind(include_revoked)
    .fetch_all(db)
    .await
}

/// Revokes the token whose ID is `name_or_id` (a UUID), else the active token named `name_or_id`,
/// and records `token.revoke` by `actor` for `reason`. Servers refuse it within
/// `[operator_tokens] cache_ttl`.
///
/// # Errors
/// [`TokenError::NotFound`] when no token that is not revoked matches; database errors.
pub async fn revoke(
    conn: &mut PgConnection,
    name_or_id: &str,
    actor: &str,
    reason: &str,
) -> Result<TokenInfo, TokenError> {
    let id = Uuid::parse_str(name_or_id).ok();
    let revoked: Option<TokenInfo> = crate::db::query_as(
        "UPDATE deprov.operator_tokens SET revoked_at = now(), revoked_by = $3 \
         WHERE revoked_at IS NULL AND (id = $1 OR ($1 IS NULL AND name = $2)) \
         RETURNING id, name, role, created_at, created_by, revoked_at, revoked_by, last_used_at",
    )
    .bind(id)
    .bind(name_or_id)
    .bind(actor)
    .fetch_optional(&mut *conn)
    .await?;
    let info = revoked.ok_or_else(|| TokenError::NotFound(name_or_id.to_owned()))?;
    let details = serde_json::json!({"token_id": info.id, "role": info.role});
    audit::record(
        &mut *conn,
        actor,
        "token.revoke",
        Some(&format!("token:{}", info.name)),
        reason,
        &details,
    )
    .await?;
    Ok(info)
}

/// Every token that is not revoked, with its digest.
///
/// # Errors
/// Database errors.
pub async fn active(db: impl PgExecutor<'_>) -> Result<Vec<ActiveToken>, sqlx::Error> {
    crate::db::query_as(
        "SELECT id, name, role, token_sha256 FROM deprov.operator_tokens WHERE revoked_at IS NULL",
    )
    .fetch_all(db)
    .await
}

/// Records when tokens were last used: `uses` = (token ID, time of its latest use). A server calls
/// it once per cache refresh with the uses since the last one, so `last_used_at` costs at most one
/// statement per `[operator_tokens] cache_ttl`, never one per request. Never moves a time backwards.
///
/// # Errors
/// Database errors.
pub async fn touch(
    db: impl PgExecutor<'_>,
    uses: &[(Uuid, OffsetDateTime)],
) -> Result<u64, sqlx::Error> {
    if uses.is_empty() {
        return Ok(0);
    }
    let (ids, times): (Vec<Uuid>, Vec<OffsetDateTime>) = uses.iter().copied().unzip();
    let done = crate::db::query(
        "UPDATE deprov.operator_tokens t \
         SET last_used_at = greatest(t.last_used_at, u.at) \
         FROM unnest($1::uuid[], $2::timestamptz[]) AS u(id, at) WHERE t.id = u.id",
    )
    .bind(ids)
    .bind(times)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_prefixed_random_and_256_bits() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        let body = &a[TOKEN_PREFIX.len()..];
        assert_eq!(body.len(), 43);
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(body)
            .unwrap();
        assert_eq!(bytes.len(), 32);
        assert_ne!(digest(&a), digest(&b));
    }

    #[test]
    fn names_exclude_colons_and_blanks() {
        for good in ["alice", "ci-bot", "a.b_c@example.com", &"x".repeat(100)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "cli:alice",
            "env:operator",
            "a b",
            &"x".repeat(101),
            "é",
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(Role::parse("read-only"), Some(Role::ReadOnly));
        assert_eq!(Role::parse(Role::Operator.as_str()), Some(Role::Operator));
        assert_eq!(Role::parse("admin"), None);
    }
}
