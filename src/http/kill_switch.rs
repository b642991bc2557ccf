//! Operator routes for the kill switch: `GET` and `PUT /v1/kill-switch`.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Operator;
use super::error::{ApiError, Problem};
use super::extract::ApiJson;
use super::intake::MAX_REASON_CHARS;
use crate::db::{self, Bounds};
use crate::queue::kill_switch::{self, KillSwitch};

/// The switch as operators see it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KillSwitchView {
    /// `true`: no destructive statement starts; new and queued jobs wait as `held`.
    pub engaged: bool,
    /// Why it was last changed.
    pub reason: Option<String>,
    /// Who last changed it: `operator` (HTTP API), `cli`, or a source name.
    pub changed_by: Option<String>,
    /// Incremented by every change; compare to see whether a change took effect.
    pub version: i64,
    /// When it was last changed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub changed_at: OffsetDateTime,
    /// Only on `PUT`: how many jobs the change moved (`queued` → `held` on engage, `held` → `queued`
    /// on release). A running job stops at its next batch boundary and is not counted here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs_moved: Option<u64>,
}

impl KillSwitchView {
    fn new(switch: KillSwitch, jobs_moved: Option<u64>) -> Self {
        Self {
            engaged: switch.engaged,
            reason: switch.reason,
            changed_by: switch.changed_by,
            version: switch.version,
            changed_at: switch.changed_at,
            jobs_moved,
        }
    }
}

/// The body of `PUT /v1/kill-switch`. Unknown fields are refused (422).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetKillSwitch {
    /// `true` engages (stops all deletion), `false` releases.
    pub engaged: bool,
    /// Why (1..=1000 characters); stored and shown by `GET`.
    pub reason: String,
}

/// The kill switch's current setting.
#[utoipa::path(
    get,
    path = "/v1/kill-switch",
    tag = "operator",
    security(("operator_token" = [])),
    responses(
        (status = 200, description = "Current setting", body = KillSwitchView),
        (status = 401, description = "Missing or wrong operator token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "No operator token configured", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "State database unavailable", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn get_kill_switch(
    _: Operator,
    State(state): State<AppState>,
) -> Result<axum::Json<KillSwitchView>, ApiError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let switch = kill_switch::get(&mut *tx).await?;
    tx.commit().await?;
    Ok(axum::Json(KillSwitchView::new(switch, None)))
}

/// Engages or releases the kill switch. Intake keeps recording requests while it is engaged.
#[utoipa::path(
    put,
    path = "/v1/kill-switch",
    tag = "operator",
    security(("operator_token" = [])),
    request_body(content = SetKillSwitch, content_type = "application/json"),
    responses(
        (status = 200, description = "The new setting, with the number of jobs moved", body = KillSwitchView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong operator token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "No operator token configured", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body not declared as application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Missing, invalid or unknown field", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "State database unavailable", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn put_kill_switch(
    _: Operator,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SetKillSwitch>,
) -> Result<axum::Json<KillSwitchView>, ApiError> {
    let reason = body.reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
        return Err(ApiError::Unprocessable(format!(
            "reason: must be 1..={MAX_REASON_CHARS} characters"
        )));
    }
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let (switch, moved) = kill_switch::set(&mut tx, body.engaged, reason, "operator").await?;
    tx.commit().await?;
    tracing::warn!(engaged = switch.engaged, version = switch.version, jobs_moved = moved, %reason, "kill switch changed");
    Ok(axum::Json(KillSwitchView::new(switch, Some(moved))))
}
