//! Operator routes for jobs: `GET /v1/jobs/{job_id}` and `GET /v1/jobs`.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::auth::Operator;
use super::error::{ApiError, Problem};
use super::extract::{ApiPath, ApiQuery};
use crate::db::{self, Bounds};
use crate::http::operator_responses::{NoOperatorToken, Unauthorized, Unavailable};
use crate::queue::{Job, JobState, jobs};

/// Default and largest page size of `GET /v1/jobs`.
pub const DEFAULT_LIMIT: i64 = 100;
/// Largest `limit` accepted by `GET /v1/jobs`.
pub const MAX_LIMIT: i64 = 1000;

/// A job's progress, from the worker's `progress` document. Keys the worker adds beyond these (for
/// example `longest_batch_ms`) are passed through unchanged.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProgressView {
    /// Rows hard-deleted so far (0 before the hard delete starts).
    pub rows_deleted: i64,
    /// The table being deleted from now, schema-qualified; `null` when none.
    pub current_table: Option<String>,
    /// Per-table progress entries as the worker records them (e.g. `{"table", "rows_deleted"}`).
    #[schema(value_type = Vec<Object>)]
    pub tables: Vec<serde_json::Value>,
    /// Any other keys of the progress document.
    #[serde(flatten)]
    #[schema(value_type = Object, additional_properties)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ProgressView {
    /// Reads the stored document, defaulting absent or ill-typed keys to 0 / `null` / `[]`.
    pub fn from_document(doc: &serde_json::Value) -> Self {
        let mut extra = doc.as_object().cloned().unwrap_or_default();
        let rows_deleted = extra
            .remove("rows_deleted")
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        let current_table = extra
            .remove("current_table")
            .and_then(|v| v.as_str().map(str::to_owned));
        let tables = match extra.remove("tables") {
            Some(serde_json::Value::Array(items)) => items,
            _ => Vec::new(),
        };
        Self {
            rows_deleted,
            current_table,
            tables,
            extra,
        }
    }
}

/// One job as operators see it. Timestamps are RFC 3339.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobView {
    /// The job ID (UUIDv7).
    pub job_id: Uuid,
    /// The tenant key; `null` while a Vercel installation is not yet resolved.
    pub tenant_id: Option<String>,
    /// `tenant` or `vercel_installation`.
    pub subject_kind: String,
    /// The tenant key or the installation ID the job was created for.
    pub subject: String,
    /// Lifecycle state.
    pub state: JobState,
    /// `resolve`, `soft_delete`, `hard_delete` or `done`.
    pub step: String,
    /// Times a worker claimed the job, not counting a run handed back `held` by a kill switch or
    /// to wait (a rest, the grace period).
    pub attempts: i32,
    /// Claims since the job last advanced (its soft delete committed, its checkpoint moved on):
    /// a run that advances nothing and fails with this at `[worker] max_attempts` fails the job.
    pub stalled_attempts: i32,
    /// The latest error, if any.
    pub last_error: Option<String>,
    /// When the job was created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When a worker first claimed it.
    #[serde(with = "time::serde::rfc3339::option")]
    pub started_at: Option<OffsetDateTime>,
    /// When it reached `completed` or `failed`.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// Progress of the hard delete.
    pub progress: ProgressView,
}

impl From<Job> for JobView {
    fn from(job: Job) -> Self {
        Self {
            job_id: job.id,
            state: job.state(),
            tenant_id: job.tenant_id,
            subject_kind: job.subject_kind,
            subject: job.subject,
            step: job.step,
            attempts: job.attempts,
            stalled_attempts: job.stalled_attempts,
            last_error: job.last_error,
            created_at: job.created_at,
            started_at: job.started_at,
            finished_at: job.finished_at,
            progress: ProgressView::from_document(&job.progress),
        }
    }
}

/// Query of `GET /v1/jobs`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only jobs in this state: `queued`, `held`, `running`, `completed`, `failed` or `cancelled`.
    #[param(value_type = Option<JobState>)]
    pub state: Option<String>,
    /// At most this many jobs, 1..=1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// A page of jobs, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    /// The jobs.
    pub jobs: Vec<JobView>,
}

/// One job with its progress.
#[utoipa::path(
    get,
    path = "/v1/jobs/{job_id}",
    tag = "operator",
    security(("operator_token" = [])),
    params(("job_id" = Uuid, Path, description = "The job ID")),
    responses(
        (status = 200, description = "The job", body = JobView),
        (status = 400, description = "Malformed job ID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        NoOperatorToken,
        Unavailable,
    ),
)]
pub async fn get_job(
    _: Operator,
    State(state): State<AppState>,
    ApiPath(job_id): ApiPath<Uuid>,
) -> Result<axum::Json<JobView>, ApiError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let job = jobs::get(&mut *tx, job_id).await?;
    tx.commit().await?;
    let job = job.ok_or_else(|| ApiError::NotFound(format!("no job {job_id}")))?;
    Ok(axum::Json(job.into()))
}

/// Jobs, newest first, optionally of one state.
#[utoipa::path(
    get,
    path = "/v1/jobs",
    tag = "operator",
    security(("operator_token" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "Jobs, newest first", body = JobList),
        (status = 400, description = "Malformed query string", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown state or limit out of range", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        NoOperatorToken,
        Unavailable,
    ),
)]
pub async fn list_jobs(
    _: Operator,
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<axum::Json<JobList>, ApiError> {
    let filter = match query.state.as_deref() {
        None => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| {
            ApiError::Unprocessable(format!(
                "state: {s:?} is not one of queued, held, running, completed, failed, cancelled"
            ))
        })?),
    };
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::Unprocessable(format!(
            "limit: must be between 1 and {MAX_LIMIT}"
        )));
    }
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let rows = jobs::list(&mut *tx, filter, limit).await?;
    tx.commit().await?;
    Ok(axum::Json(JobList {
        jobs: rows.into_iter().map(JobView::from).collect(),
    }))
}
