//! `POST /v1/deletion-requests`: record a deletion request under its deterministic ID.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::auth::AuthenticatedSource;
use super::error::{ApiError, Problem};
use super::extract::{ApiJson, idempotency_key};
use crate::ids::{DedupBasis, KeyForm, TenantId};
use crate::queue::JobState;
use crate::queue::intake::{NewRequest, SubjectKind};

/// Longest accepted `external_id`, in characters.
pub const MAX_EXTERNAL_ID_LEN: usize = 255;
/// Longest accepted `reason`, in characters.
pub const MAX_REASON_CHARS: usize = 1000;

/// A request to delete one tenant. Unknown fields are refused (422).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeletionRequestBody {
    /// The tenant key (1..=256 characters, no control characters), cast by the worker to the type
    /// of `[tenant] key_column`. For an integer or `uuid` key column it must be one the type reads
    /// (else 422), and it is stored as PostgreSQL prints it (`"07"` is tenant `"7"`; see
    /// `deprov::ids::KeyForm`).
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    pub tenant_id: String,
    /// The sender's own ID for this request (1..=255 characters, no control characters); the
    /// preferred deduplication basis.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    pub external_id: Option<String>,
    /// Free text stored with the request (at most 1000 characters, no U+0000).
    #[serde(default)]
    #[schema(max_length = 1000, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
    /// The sending source; if present it must be the source the bearer token names (else 403).
    #[serde(default)]
    pub source: Option<String>,
}

/// The answer to a recorded (or repeated) deletion request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeletionAccepted {
    /// The deterministic request ID: UUIDv5 over deprov's request namespace and
    /// (source, basis, key) — see `deprov::ids`.
    pub request_id: Uuid,
    /// The job the request is attached to (one active job per tenant).
    pub job_id: Uuid,
    /// The tenant key, as stored: as sent, or as PostgreSQL prints it for an integer or `uuid`
    /// key column.
    pub tenant_id: String,
    /// The job's state now (`held` while the kill switch is engaged).
    pub state: JobState,
    /// `true` when this exact request had been recorded before (same IDs returned, nothing new stored).
    pub duplicate: bool,
}

pub(crate) fn validate_reason(reason: Option<String>) -> Result<Option<String>, ApiError> {
    match reason {
        Some(r) if r.chars().count() > MAX_REASON_CHARS => Err(ApiError::Unprocessable(format!(
            "reason: must be at most {MAX_REASON_CHARS} characters"
        ))),
        Some(r) => no_nul("reason", &r).map(|()| Some(r)),
        None => Ok(None),
    }
}

/// 422 when `text` contains U+0000, which PostgreSQL `text` cannot store (it would fail the
/// statement: a 500). The spec says so with the pattern `^[^\u0000]*$`.
///
/// # Errors
/// [`ApiError::Unprocessable`] naming `field`.
pub fn no_nul(field: &str, text: &str) -> Result<(), ApiError> {
    if text.contains('\0') {
        return Err(ApiError::Unprocessable(format!(
            "{field}: must not contain U+0000"
        )));
    }
    Ok(())
}

pub(super) fn job_state(state: &str) -> Result<JobState, ApiError> {
    JobState::parse(state).ok_or_else(|| ApiError::Internal(format!("unknown job state {state:?}")))
}

/// Builds the validated [`NewRequest`] for a body sent by `source`; `form` is how the key column
/// reads tenant keys, when known.
fn new_request(
    source: &str,
    body: DeletionRequestBody,
    key: Option<String>,
    form: Option<KeyForm>,
) -> Result<NewRequest, ApiError> {
    let invalid = |r| ApiError::Unprocessable(format!("tenant_id: {r}"));
    let mut tenant = TenantId::parse(&body.tenant_id).map_err(invalid)?;
    if let Some(form) = form {
        tenant = form.canonical(&tenant).map_err(invalid)?;
    }
    if let Some(claimed) = &body.source
        && claimed != source
    {
        return Err(ApiError::Forbidden(format!(
            "source: the token does not belong to source {claimed:?}"
        )));
    }
    if let Some(ext) = &body.external_id
        && (ext.is_empty()
            || ext.chars().count() > MAX_EXTERNAL_ID_LEN
            || ext.chars().any(char::is_control))
    {
        return Err(ApiError::Unprocessable(format!(
            "external_id: must be 1..={MAX_EXTERNAL_ID_LEN} characters without control characters"
        )));
    }
    let reason = validate_reason(body.reason)?;
    let (basis, dedup_key) = match (&body.external_id, key) {
        (Some(ext), _) => (DedupBasis::ExternalId, ext.clone()),
        (None, Some(key)) => (DedupBasis::IdempotencyKey, key),
        (None, None) => (DedupBasis::TenantId, tenant.as_str().to_owned()),
    };
    Ok(NewRequest {
        source: source.to_owned(),
        basis,
        dedup_key,
        subject_kind: SubjectKind::Tenant,
        subject: tenant.as_str().to_owned(),
        external_id: body.external_id,
        reason,
    })
}

/// Records a deletion request before answering.
///
/// The request ID derives from the source and, in order of preference, `external_id`, the
/// `Idempotency-Key` header, or `tenant_id`. Repeating a request returns the same IDs with
/// `duplicate: true`; a different request for a tenant with an active job attaches to that job. While
/// the kill switch is engaged requests are still recorded; their job waits as `held`.
#[utoipa::path(
    post,
    path = "/v1/deletion-requests",
    tag = "intake",
    security(("source_token" = [])),
    params(
        ("Idempotency-Key" = Option<String>, Header,
         description = "1..=255 printable ASCII characters (IETF draft-ietf-httpapi-idempotency-key-header). \
                        The deduplication key when no external_id is sent; reusing it with a different body is 422.",
         max_length = 255, pattern = "^[\\u0020-\\u007E]*[\\u0021-\\u007E][\\u0020-\\u007E]*$"),
    ),
    request_body(content = DeletionRequestBody, content_type = "application/json"),
    responses(
        (status = 202, description = "Recorded (or already recorded: `duplicate: true`)", body = DeletionAccepted),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown source token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`source` names another source than the token's", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than `[intake] max_body_bytes`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body not declared as application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid or unknown field (also a tenant_id the integer or uuid key column cannot read), invalid Idempotency-Key, or an Idempotency-Key / external_id reused with a different body", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "This source (or, without a known token, this peer address) exceeded `[intake.rate_limit]`; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds until the source's next request is admitted"))),
        (status = 503, description = "State database unavailable; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn create_deletion_request(
    State(state): State<AppState>,
    source: AuthenticatedSource,
    headers: HeaderMap,
    ApiJson(body): ApiJson<DeletionRequestBody>,
) -> Result<(StatusCode, axum::Json<DeletionAccepted>), ApiError> {
    let key = idempotency_key(&headers)?;
    let req = new_request(
        &source.name,
        body,
        key,
        state.readiness.sql_check().key_form(),
    )?;
    let tenant_id = req.subject.clone();
    let accepted = state.record(req).await?;
    tracing::info!(source = %source.name, request_id = %accepted.request_id, job_id = %accepted.job_id,
        duplicate = accepted.duplicate, "deletion request recorded");
    let answer = DeletionAccepted {
        request_id: accepted.request_id,
        job_id: accepted.job_id,
        tenant_id,
        state: job_state(&accepted.state)?,
        duplicate: accepted.duplicate,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(answer)))
}
