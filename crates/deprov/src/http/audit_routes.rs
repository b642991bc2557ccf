//! Operator route for the audit log: `GET /v1/audit` (see [`crate::queue::audit`]).

use axum::extract::State;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Operator;
use super::error::{ApiError, Problem};
use super::extract::ApiQuery;
use super::intake_routes::no_nul;
use crate::db::{self, Bounds};
use crate::http::operator_responses::{NoOperatorToken, Unauthorized, Unavailable};
use crate::queue::audit::{self, Entry};

/// One audit entry.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditEntryView {
    /// Position in the log (increasing; pass as `before` for the next page).
    pub id: i64,
    /// When (RFC 3339; the acting transaction's start).
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// Who: the operator token's name (HTTP API; `env:operator` for `DEPROV_OPERATOR_TOKEN`;
    /// entries before tokens existed read `operator` / `operator:<name>`), `cli` / `cli:<name>`
    /// (command line).
    pub actor: String,
    /// `kill_switch.engage`, `kill_switch.release`, `job.cancel`, `job.retry`, `token.create` or
    /// `token.revoke`.
    pub action: String,
    /// On what: `global`, `source:<name>`, `tenant:<key>`, `job:<uuid>`, `token:<name>`.
    pub target: Option<String>,
    /// Why, as the operator gave it.
    pub reason: String,
    /// Facts of the action (version, jobs moved, previous state …).
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

impl From<Entry> for AuditEntryView {
    fn from(e: Entry) -> Self {
        Self {
            id: e.id,
            at: e.at,
            actor: e.actor,
            action: e.action,
            target: e.target,
            reason: e.reason,
            details: e.details,
        }
    }
}

/// Query of `GET /v1/audit`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// At most this many entries, 1..=1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Only entries older than this `id` (the next page).
    pub before: Option<i64>,
    /// Only actions starting with this, e.g. `job.` or `kill_switch.engage` (no U+0000).
    #[param(pattern = "^[^\\u0000]*$")]
    pub action: Option<String>,
}

/// A page of the audit log, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    /// The entries.
    pub entries: Vec<AuditEntryView>,
}

/// The audit log of operator actions, newest first.
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "operator",
    security(("operator_token" = [])),
    params(AuditQuery),
    responses(
        (status = 200, description = "Entries, newest first", body = AuditList),
        (status = 400, description = "Malformed query string", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "limit out of range, or U+0000 in action", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        NoOperatorToken,
        Unavailable,
    ),
)]
pub async fn list_audit(
    _: Operator,
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<axum::Json<AuditList>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::Unprocessable(
            "limit: must be between 1 and 1000".into(),
        ));
    }
    if let Some(action) = &query.action {
        no_nul("action", action)?;
    }
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let rows = audit::list(&mut *tx, limit, query.before, query.action.as_deref()).await?;
    tx.commit().await?;
    Ok(axum::Json(AuditList {
        entries: rows.into_iter().map(AuditEntryView::from).collect(),
    }))
}
