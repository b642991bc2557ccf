//! `DELETE /v1/installations/{installationId}`: Vercel Marketplace's partner API "Delete Installation".
//!
//! Vercel calls this when a user uninstalls the integration and retries until it gets a 2xx. Every
//! call for one installation has the same request ID (deduplication basis: the installation ID), so
//! all retries collapse into one request and one job.

use axum::extract::State;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::auth::VercelCaller;
use super::error::{ApiError, Problem};
use super::extract::{ApiPath, OptionalJson, idempotency_key};
use super::intake_routes::{job_state, validate_reason};
use crate::ids::{DedupBasis, TenantId};
use crate::queue::JobState;
use crate::queue::intake::{NewRequest, SubjectKind};

/// The optional body Vercel sends. Unknown fields are ignored (the partner API may grow).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeleteInstallationBody {
    /// Whether Vercel asks to delete the installation's resources too. deprov always deletes the whole
    /// tenant, so this is logged only.
    #[serde(default)]
    pub cascade_resource_deletion: Option<bool>,
    /// Vercel's reason code (at most 1000 characters, no U+0000); stored with the request.
    #[serde(default)]
    #[schema(max_length = 1000, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
}

/// The partner API's answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeleteInstallationResponse {
    /// `true` once the installation's deletion job has `completed`; `false` while it is queued,
    /// held, running — or failed (an operator must act; Vercel's retries then still answer `false`).
    pub finalized: bool,
}

/// Records the deletion of a Vercel installation.
///
/// With `[vercel] tenant_lookup` configured the request is recorded for the installation and the
/// worker resolves the tenant with that statement (intake never touches the target database);
/// without it the installation ID is the tenant key. Retries collapse into one request and one job.
/// Answers 200 `{"finalized": false}` until the job has completed, then `{"finalized": true}`.
#[utoipa::path(
    delete,
    path = "/v1/installations/{installationId}",
    tag = "vercel",
    security(("vercel_token" = [])),
    params(
        ("installationId" = String, Path, description = "Vercel installation (integration configuration) ID, e.g. `icfg_…` (1..=256 characters, no control characters)",
         min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"),
        ("Idempotency-Key" = Option<String>, Header, description = "Accepted and validated (1..=255 printable ASCII); retries are deduplicated by installation ID regardless",
         max_length = 255, pattern = "^[\\u0020-\\u007E]*[\\u0021-\\u007E][\\u0020-\\u007E]*$"),
        ("X-Vercel-Auth" = Option<String>, Header, description = "Vercel's auth style, `user` or `system`; logged"),
    ),
    request_body(content = Option<DeleteInstallationBody>, content_type = "application/json",
                 description = "Optional; an empty body is allowed"),
    responses(
        (status = 200, description = "Recorded; `finalized` tells whether the deletion has completed", body = DeleteInstallationResponse),
        (status = 400, description = "Malformed JSON or installation ID", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The OIDC token's `installation_id` claim names another installation", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No `[vercel]` section configured", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than `[intake] max_body_bytes`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A non-empty body not declared as application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field or header value", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "This source (or, without a known token, this peer address) exceeded `[intake.rate_limit]`; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds until the source's next request is admitted"))),
        (status = 503, description = "State database unavailable", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn delete_installation(
    State(state): State<AppState>,
    caller: VercelCaller,
    ApiPath(installation_id): ApiPath<String>,
    headers: HeaderMap,
    OptionalJson(body): OptionalJson<DeleteInstallationBody>,
) -> Result<axum::Json<DeleteInstallationResponse>, ApiError> {
    let installation = TenantId::parse(&installation_id)
        .map_err(|r| ApiError::BadRequest(format!("installationId: {r}")))?;
    if let Some(claimed) = &caller.installation_id
        && claimed != installation.as_str()
    {
        return Err(ApiError::Forbidden(
            "the token's installation_id claim names another installation".into(),
        ));
    }
    idempotency_key(&headers)?;
    let reason = validate_reason(body.reason)?;
    let vercel = state
        .config
        .vercel
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("no [vercel] section".into()))?;
    let (subject_kind, subject) = match (
        &vercel.tenant_lookup,
        state.readiness.sql_check().key_form(),
    ) {
        (Some(_), _) => (SubjectKind::VercelInstallation, installation.to_string()),
        // The installation ID is the tenant key: stored as the key column prints it when it
        // reads it, else as sent (Vercel is not refused; the job fails with the cast's error).
        (None, Some(form)) => (
            SubjectKind::Tenant,
            form.canonical_or_as_sent(installation.as_str()),
        ),
        (None, None) => (SubjectKind::Tenant, installation.to_string()),
    };
    let req = NewRequest {
        source: caller.source.clone(),
        basis: DedupBasis::InstallationId,
        dedup_key: installation.as_str().to_owned(),
        subject_kind,
        subject,
        external_id: None,
        reason,
    };
    let accepted = state.record(req).await?;
    tracing::info!(installation = %installation, job_id = %accepted.job_id, duplicate = accepted.duplicate,
        auth_style = ?caller.auth_style, cascade = ?body.cascade_resource_deletion, "vercel installation deletion recorded");
    Ok(axum::Json(DeleteInstallationResponse {
        finalized: job_state(&accepted.state)? == JobState::Completed,
    }))
}
