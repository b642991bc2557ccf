//! Reconcile and grace-period routes:
//! - `GET /v1/reconcile`, `POST /v1/reconcile` — operator token ([`crate::queue::reconcile`]);
//! - `POST /v1/jobs/{job_id}/undo` — operator token ([`crate::queue::grace::undo`]);
//! - `POST /v1/reinstallations` — a source's bearer token: the tenant is back
//!   ([`crate::queue::grace::reinstall`]).
//!
//! These routes read or write the target database (orphans statement, undo statements) through
//! the target pool, besides the state database through the intake pool.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::auth::{AuthenticatedSource, Operator};
use super::error::{ApiError, Problem};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::kill_switch_routes::operator_reason;
use crate::db::{self, Bounds};
use crate::engine::BatchLimits;
use crate::http::operator_responses::{ReadOnly, Unauthorized, Unavailable};
use crate::queue::JobState;
use crate::queue::grace::{self, GraceError, ReinstallOf, Reinstalled, UndoTarget, Undone};
use crate::queue::reconcile::{self, Actions, Applied, Filter, ReconcileError, Report};

/// Query of `GET /v1/reconcile`: every given part must match.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReconcileQuery {
    /// Only jobs in these states, comma-separated (`held,failed`).
    #[param(
        pattern = "^\\s*(queued|held|running|completed|failed|cancelled)\\s*(,\\s*(queued|held|running|completed|failed|cancelled)\\s*)*$"
    )]
    pub state: Option<String>,
    /// Only jobs with a request from this source.
    pub source: Option<String>,
    /// Only this tenant (also narrows orphans).
    pub tenant: Option<String>,
    /// Only these jobs, comma-separated IDs.
    #[param(
        pattern = "^\\s*([0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}|[0-9A-Fa-f]{32})\\s*(,\\s*([0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}|[0-9A-Fa-f]{32})\\s*)*$"
    )]
    pub id: Option<String>,
    /// Only jobs with a request received at or after this RFC 3339 time.
    #[param(format = DateTime)]
    pub received_after: Option<String>,
    /// Only jobs with a request received before this RFC 3339 time.
    #[param(format = DateTime)]
    pub received_before: Option<String>,
}

fn time_param(name: &str, v: Option<&str>) -> Result<Option<time::OffsetDateTime>, ApiError> {
    v.map(|s| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .map_err(|_| ApiError::Unprocessable(format!("{name}: {s:?} is not an RFC 3339 time")))
    })
    .transpose()
}

impl ReconcileQuery {
    /// The [`Filter`] the query names.
    ///
    /// # Errors
    /// 422 for an unknown state, a malformed ID or time, or a list parameter given blank.
    pub fn filter(&self) -> Result<Filter, ApiError> {
        for (name, v) in [("state", &self.state), ("id", &self.id)] {
            if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(ApiError::Unprocessable(format!(
                    "{name}: give at least one value, or leave the parameter out"
                )));
            }
        }
        let list = |v: &Option<String>| -> Vec<String> {
            v.as_deref()
                .map(|s| s.split(',').map(str::trim).map(str::to_owned).collect())
                .unwrap_or_default()
        };
        let states = list(&self.state)
            .iter()
            .map(|s| {
                JobState::parse(s).ok_or_else(|| {
                    ApiError::Unprocessable(format!(
                        "state: {s:?} is not one of queued, held, running, completed, failed, cancelled"
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        let ids = list(&self.id)
            .iter()
            .map(|s| {
                // Hex digits and hyphens only (as the spec's pattern): no braces or `urn:uuid:`.
                s.chars()
                    .all(|c| c.is_ascii_hexdigit() || c == '-')
                    .then(|| Uuid::parse_str(s).ok())
                    .flatten()
                    .ok_or_else(|| ApiError::Unprocessable(format!("id: {s:?} is not a UUID")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Filter {
            states,
            source: self.source.clone(),
            tenant: self.tenant.clone(),
            ids,
            received_after: time_param("received_after", self.received_after.as_deref())?,
            received_before: time_param("received_before", self.received_before.as_deref())?,
        })
    }
}

impl From<ReconcileError> for ApiError {
    fn from(e: ReconcileError) -> Self {
        match e {
            ReconcileError::Invalid(m) => Self::Unprocessable(m),
            ReconcileError::Orphans(e) => Self::Internal(format!("[soft_delete] orphans: {e}")),
            ReconcileError::Db(e) => e.into(),
        }
    }
}

impl From<GraceError> for ApiError {
    fn from(e: GraceError) -> Self {
        match e {
            GraceError::NotFound(_) => Self::NotFound(e.to_string()),
            GraceError::HardDeleteStarted { .. } | GraceError::Conflict(_) => {
                Self::Conflict(e.to_string())
            }
            GraceError::NotConfigured => Self::Conflict(e.to_string()),
            GraceError::Engine(inner) => Self::Internal(inner.to_string()),
            GraceError::Db(db) => db.into(),
        }
    }
}

/// What is held, failed, in grace, collapsed and orphaned.
#[utoipa::path(
    get,
    path = "/v1/reconcile",
    tag = "operator",
    security(("operator_token" = [])),
    params(ReconcileQuery),
    responses(
        (status = 200, description = "The listing", body = Report),
        (status = 400, description = "Malformed query string", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown state, malformed ID or time", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        ReadOnly,
        Unavailable,
    ),
)]
pub async fn get_reconcile(
    _: Operator,
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ReconcileQuery>,
) -> Result<axum::Json<Report>, ApiError> {
    let filter = query.filter()?;
    Ok(axum::Json(report(&state, &filter).await?))
}

/// What `filter` selects (held, failed, stalled, in grace, collapsed, orphans): the listing of `GET
/// /v1/reconcile` and of the console's reconcile page.
///
/// # Errors
/// 503 when the state database cannot be read; 500 when the orphans statement fails.
pub async fn report(state: &AppState, filter: &Filter) -> Result<Report, ApiError> {
    let limits = BatchLimits::from(&state.config.hard_delete);
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let report = reconcile::report(
        &mut tx,
        &state.pools.target,
        state.config.soft_delete.orphans.as_deref(),
        &limits,
        filter,
    )
    .await?;
    tx.commit().await?;
    Ok(report)
}

/// Body of `POST /v1/reconcile`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileBody {
    /// Act; `false` (default) is a dry run: the same actions, rolled back.
    #[serde(default)]
    pub apply: bool,
    /// Which actions.
    #[serde(default)]
    pub actions: Actions,
    /// Which jobs.
    #[serde(default)]
    pub filter: Filter,
    /// Released jobs per second, 0.001..=1000 (default `[reconcile] release_rate`).
    #[schema(minimum = 0.001, maximum = 1000.0)]
    pub rate: Option<f64>,
    /// Why (1..=1000 characters, not blank, no U+0000), recorded in the audit log.
    #[schema(
        min_length = 1,
        max_length = 1000,
        pattern = "^[^\\u0000]*[^\\u0000\\u0009-\\u000D\\u0020\\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000][^\\u0000]*$"
    )]
    pub reason: String,
}

/// What `POST /v1/reconcile` did, or would do.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReconcileAnswer {
    /// `true`: nothing was changed.
    pub dry_run: bool,
    /// The actions taken (or that would be), and the jobs left alone.
    pub applied: Applied,
}

/// Resume, retry, cancel, create orphan jobs: paced, audited; a dry run unless `apply`.
#[utoipa::path(
    post,
    path = "/v1/reconcile",
    tag = "operator",
    security(("operator_token" = [])),
    request_body = ReconcileBody,
    responses(
        (status = 200, description = "Done, or (dry run) what would be done", body = ReconcileAnswer),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than `[intake] max_body_bytes`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body not declared as application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid body: reason, rate, cancel without a filter or with other actions, orphans not configured", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        ReadOnly,
        Unavailable,
    ),
)]
pub async fn post_reconcile(
    operator: Operator,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<ReconcileBody>,
) -> Result<axum::Json<ReconcileAnswer>, ApiError> {
    Ok(axum::Json(run(&state, &operator.actor, &body).await?))
}

/// Runs a reconcile as `actor` (the operator token's name): applied when `body.apply`, else the same
/// actions rolled back (a dry run). The one implementation behind `POST /v1/reconcile` and the
/// console's reconcile and bulk job actions.
///
/// # Errors
/// 422 for an invalid reason, rate or action set; 503 when the state database is unavailable.
pub async fn run(
    state: &AppState,
    actor: &str,
    body: &ReconcileBody,
) -> Result<ReconcileAnswer, ApiError> {
    let reason = operator_reason(&body.reason)?;
    let rate = body.rate.unwrap_or(state.config.reconcile.release_rate);
    if !(rate.is_finite() && (0.001..=1000.0).contains(&rate)) {
        return Err(ApiError::Unprocessable(
            "rate: must be between 0.001 and 1000 (jobs per second)".into(),
        ));
    }
    let limits = BatchLimits::from(&state.config.hard_delete);
    let acting = reconcile::Acting {
        actor,
        reason,
        rate,
        max_attempts: state.max_attempts(),
    };
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let applied = reconcile::apply(
        &mut tx,
        &state.pools.target,
        state.config.soft_delete.orphans.as_deref(),
        &limits,
        &body.filter,
        body.actions,
        &acting,
    )
    .await?;
    if body.apply {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(ReconcileAnswer {
        dry_run: !body.apply,
        applied,
    })
}

/// Body of `POST /v1/jobs/{job_id}/undo`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UndoBody {
    /// Why (1..=1000 characters, not blank, no U+0000), recorded in the audit log.
    #[schema(
        min_length = 1,
        max_length = 1000,
        pattern = "^[^\\u0000]*[^\\u0000\\u0009-\\u000D\\u0020\\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000][^\\u0000]*$"
    )]
    pub reason: String,
}

/// Undo a job's soft delete and cancel it, while its hard delete has not started.
#[utoipa::path(
    post,
    path = "/v1/jobs/{job_id}/undo",
    tag = "operator",
    security(("operator_token" = [])),
    params(("job_id" = Uuid, Path, description = "The job ID")),
    request_body = UndoBody,
    responses(
        (status = 200, description = "Undone: the job is cancelled and the undo statements ran", body = Undone),
        (status = 400, description = "Malformed job ID or JSON", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than `[intake] max_body_bytes`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body not declared as application/json", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The hard delete started (nothing to undo), the job is running or completed, or no undo statements are configured", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid reason", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        ReadOnly,
        Unavailable,
    ),
)]
pub async fn undo_job(
    operator: Operator,
    State(state): State<AppState>,
    ApiPath(job_id): ApiPath<Uuid>,
    ApiJson(body): ApiJson<UndoBody>,
) -> Result<axum::Json<Undone>, ApiError> {
    Ok(axum::Json(
        undo(&state, &operator.actor, job_id, &body.reason).await?,
    ))
}

/// Undoes job `job_id`'s soft delete and cancels it, as `actor` for `reason`: the one implementation
/// behind `POST /v1/jobs/{job_id}/undo` and the console's undo button.
///
/// # Errors
/// 404 no such job; 409 when the hard delete started or nothing is configured to undo; 422 for an
/// invalid reason; 503 when a database is unavailable.
pub async fn undo(
    state: &AppState,
    actor: &str,
    job_id: Uuid,
    reason: &str,
) -> Result<Undone, ApiError> {
    let reason = operator_reason(reason)?;
    let target = UndoTarget::new(&state.pools.target, &state.config);
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let undone = grace::undo(&mut tx, target, job_id, actor, reason).await?;
    tx.commit().await?;
    Ok(undone)
}

/// Body of `POST /v1/reinstallations`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReinstallBody {
    /// The tenant that is back, as this source sends it in deletion requests (1..=256 characters,
    /// no control characters).
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    pub tenant_id: String,
    /// Free text, recorded in the audit log (at most 1000 characters, no U+0000).
    #[schema(max_length = 1000, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
}

/// The tenant is back (a reinstall): cancel its pending deletion and, before the hard delete,
/// undo its soft delete. Every outcome is answered 200 and recorded (`job.reinstall`).
#[utoipa::path(
    post,
    path = "/v1/reinstallations",
    tag = "intake",
    security(("source_token" = [])),
    request_body = ReinstallBody,
    responses(
        (status = 200, description = "`undone`, `cancel_requested` (a worker holds the job: send again to undo), `requested_by_others` (other sources asked for the deletion too: nothing changed), `too_late` (the hard delete started) or `nothing_pending` (none this source requested)", body = Reinstalled),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than `[intake] max_body_bytes`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body not declared as application/json", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown source token", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid body, or a `tenant_id` the key column cannot read (an integer or uuid key column)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "State database unavailable", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn reinstall(
    source: AuthenticatedSource,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<ReinstallBody>,
) -> Result<axum::Json<Reinstalled>, ApiError> {
    // The same rules as a deletion request's tenant_id, so a reinstall finds what intake stored.
    let invalid = |r| ApiError::Unprocessable(format!("tenant_id: {r}"));
    let tenant = crate::ids::TenantId::parse(&body.tenant_id).map_err(invalid)?;
    // As at intake, a key the key column cannot read is refused (nothing of it can be stored).
    let lookup = is_lookup(&state, &source.name);
    if !lookup && let Some(form) = state.readiness.sql_check().key_form() {
        form.canonical(&tenant).map_err(invalid)?;
    }
    let reason = crate::http::intake_routes::validate_reason(body.reason)?;
    let outcome =
        reinstall_subject(&state, &source.name, tenant.as_str(), reason.as_deref()).await?;
    Ok(axum::Json(outcome))
}

/// Whether source `name` sends a value its `tenant_lookup` turns into the tenant key (rather than
/// the key itself).
fn is_lookup(state: &AppState, name: &str) -> bool {
    state
        .config
        .sources
        .get(name)
        .is_some_and(|s| s.tenant_lookup.is_some())
}

/// Runs a reinstall of `value` (a tenant key, or a `tenant_lookup` value of the source) reported
/// by source `name`; shared with the webhook route's `restore_events`.
///
/// # Errors
/// [`ApiError`] for database and target failures.
pub async fn reinstall_subject(
    state: &AppState,
    name: &str,
    value: &str,
    reason: Option<&str>,
) -> Result<Reinstalled, ApiError> {
    let lookup = is_lookup(state, name);
    let any = state
        .config
        .sources
        .get(name)
        .is_some_and(|s| s.reinstalls == crate::sources::ReinstallScope::Any);
    // A tenant key is matched in the form intake stored it in (crate::ids::KeyForm).
    let tenant = match state.readiness.sql_check().key_form() {
        Some(form) if !lookup => form.canonical_or_as_sent(value),
        _ => value.to_owned(),
    };
    let subject = if lookup {
        format!("{name}:{value}")
    } else {
        tenant.clone()
    };
    let of = ReinstallOf {
        subject_kind: if lookup { "lookup" } else { "tenant" },
        subject: &subject,
        tenant: (!lookup).then_some(tenant.as_str()),
        source: (!any).then_some(name),
    };
    let target = UndoTarget::new(&state.pools.target, &state.config);
    let reason = reason.map_or_else(|| "reinstalled".to_owned(), str::to_owned);
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let outcome = grace::reinstall(&mut tx, target, of, &format!("source:{name}"), &reason).await?;
    tx.commit().await?;
    Ok(outcome)
}
