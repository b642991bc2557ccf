//! Sessions of the operator console (`deprov.console_sessions`, migration 0009): created at login
//! with an operator token, ended by logout or expiry.
//!
//! A session is a random 256-bit secret held by the browser in an `HttpOnly` cookie; only its
//! SHA-256 is stored, next to the digest of the operator token that logged in (checked again on
//! every request, see [`crate::http::console`]). Nothing here stores or returns a token.

use std::time::Duration;

use sqlx::PgExecutor;

/// A session as a request finds it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Found {
    /// SHA-256 of the operator token that logged in.
    pub operator_token_sha256: Vec<u8>,
    /// The actor at login (the token's name), for display.
    pub actor: String,
}

/// A new random session secret ([`super::tokens::random_secret`]).
pub fn generate() -> String {
    super::tokens::random_secret()
}

/// Stores a session of digest `session` for the operator token of digest `operator_token`, valid
/// for `ttl`; deletes expired sessions in the same call.
///
/// # Errors
/// Database errors.
pub async fn create(
    conn: &mut sqlx::PgConnection,
    session: &[u8; 32],
    operator_token: &[u8; 32],
    actor: &str,
    ttl: Duration,
) -> Result<(), sqlx::Error> {
    crate::db::query("DELETE FROM deprov.console_sessions WHERE expires_at <= now()")
        .execute(&mut *conn)
        .await?;
    crate::db::query(
        "INSERT INTO deprov.console_sessions (session_sha256, operator_token_sha256, actor, expires_at) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4::float8))",
    )
    .bind(session.as_slice())
    .bind(operator_token.as_slice())
    .bind(actor)
    .bind(ttl.as_secs_f64())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The session of digest `session`, unless it expired or was ended.
///
/// # Errors
/// Database errors.
pub async fn find(
    db: impl PgExecutor<'_>,
    session: &[u8; 32],
) -> Result<Option<Found>, sqlx::Error> {
    crate::db::query_as(
        "SELECT operator_token_sha256, actor FROM deprov.console_sessions \
         WHERE session_sha256 = $1 AND expires_at > now()",
    )
    .bind(session.as_slice())
    .fetch_optional(db)
    .await
}

/// Ends the session of digest `session` (logout). Returns whether there was one.
///
/// # Errors
/// Database errors.
pub async fn end(db: impl PgExecutor<'_>, session: &[u8; 32]) -> Result<bool, sqlx::Error> {
    let r = crate::db::query("DELETE FROM deprov.console_sessions WHERE session_sha256 = $1")
        .bind(session.as_slice())
        .execute(db)
        .await?;
    Ok(r.rows_affected() == 1)
}
