//! The audit log (`deprov.audit_log`): one row per operator action — kill switch changes, job
//! cancel, retry and resume — with actor, action, target and reason. Append-only: a trigger refuses
//! `UPDATE`, `DELETE` and `TRUNCATE` (SQLSTATE 42501), whoever runs them.
//!
//! Actions: `kill_switch.engage`, `kill_switch.release` (target `global`, `source:<name>`,
//! `tenant:<key>`), `job.cancel`, `job.retry` (target `job:<uuid>`), `token.create`,
//! `token.revoke` (target `token:<name>`, see [`super::tokens`]).

use sqlx::PgExecutor;
use time::OffsetDateTime;

/// One audit entry.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Entry {
    /// Position in the log (increasing).
    pub id: i64,
    /// When (the acting transaction's start).
    pub at: OffsetDateTime,
    /// Who: the operator token's name (HTTP API; `env:operator` for `DEPROV_OPERATOR_TOKEN`),
    /// `cli` / `cli:<name>` (command line, as the caller stated it).
    pub actor: String,
    /// What, e.g. `kill_switch.engage` (see the module docs).
    pub action: String,
    /// On what, e.g. `tenant:acct_1` or `job:<uuid>`.
    pub target: Option<String>,
    /// Why, as the operator gave it.
    pub reason: String,
    /// Facts of the action (version, jobs moved, previous state …).
    pub details: serde_json::Value,
}

/// Appends an entry; run it in the transaction of the action so both commit together.
///
/// # Errors
/// Database errors.
pub async fn record(
    db: impl PgExecutor<'_>,
    actor: &str,
    action: &str,
    target: Option<&str>,
    reason: &str,
    details: &serde_json::Value,
) -> Result<i64, sqlx::Error> {
    crate::db::query_scalar(
        "INSERT INTO deprov.audit_log (actor, action, target, reason, details) \
         VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(actor)
    .bind(action)
    .bind(target)
    .bind(reason)
    .bind(details)
    .fetch_one(db)
    .await
}

/// Entries newest first: at most `limit` (1..=1000), only those with `id < before` when given (the
/// next page), only of actions starting with `action` when given (`job.` or `kill_switch.engage`).
///
/// # Errors
/// Database errors.
pub async fn list(
    db: impl PgExecutor<'_>,
    limit: i64,
    before: Option<i64>,
    action: Option<&str>,
) -> Result<Vec<Entry>, sqlx::Error> {
    crate::db::query_as(
        "SELECT id, at, actor, action, target, reason, details FROM deprov.audit_log \
         WHERE ($2::bigint IS NULL OR id < $2) AND ($3::text IS NULL OR starts_with(action, $3)) \
         ORDER BY id DESC LIMIT $1",
    )
    .bind(limit.clamp(1, 1000))
    .bind(before)
    .bind(action)
    .fetch_all(db)
    .await
}
