//! The Open Service Broker API v2.17, deprovision side only: `DELETE
//! /v2/service_instances/{instance_id}` and `GET /v2/service_instances/{instance_id}/last_operation`,
//! configured by `[osb]` (see `docs/api.md`, "Open Service Broker", which names the spec section
//! behind each behaviour).
//!
//! Every call is checked in this order: `[osb]` configured (else 404), HTTP Basic credentials of
//! the `[osb] source` (else 401 with `WWW-Authenticate: Basic realm="deprov"`; spec "Platform to
//! Service Broker Authentication"), `X-Broker-API-Version` present and 2.x at least `[osb]
//! min_api_version` (else 412; spec "API Version Header"), then the route's own parameters. A
//! deprovision is recorded like any deletion request under the source's name, deduplicated on the
//! instance ID (deterministic request ID over source and instance ID: every retry of a DELETE is
//! one request and one job). Errors have the OSB error body ([`broker_error::OsbError`]).

pub mod broker_error;
mod request_checks;
pub mod status;
pub mod types;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::AppState;
use super::error::{ApiError, Problem};
use super::intake_routes::job_state;
use crate::ids::DedupBasis;
use crate::queue::JobState;
use crate::queue::intake::{NewRequest, SubjectKind};
use broker_error::{OsbError, OsbErrorBody};
use request_checks::{broker, instance, json, param, with_identity};
use status::Standing;
pub use types::{
    DeprovisionAccepted, DeprovisionQuery, Empty, LastOperation, LastOperationQuery, OperationState,
};

/// The request header naming the platform's broker API version (spec "API Version Header").
pub const API_VERSION_HEADER: &str = "x-broker-api-version";

/// The platform's ID of a request (spec "Request Identity"): logged, and echoed in the response
/// ("The Service Broker SHOULD include this header in the response").
pub const REQUEST_IDENTITY_HEADER: &str = "x-broker-api-request-identity";

/// `Retry-After` seconds of a `last_operation` answer while the deletion is in progress (spec
/// "Polling Last Operation for Service Instances": the header tells the platform how long to wait
/// before polling again).
pub const RETRY_AFTER_SECS: u64 = 5;

/// Longest accepted `service_id`, `plan_id` or `operation`, in characters.
pub const MAX_PARAM_LEN: usize = 1024;

/// Deprovisions a service instance: records the deletion of its tenant.
///
/// Retries of the DELETE collapse into one request and one job (deduplicated on the instance ID).
/// Answers 202 with the job as `operation` while the deletion is queued, held or running, and while
/// a failed or cancelled deletion waits for an operator (`last_operation` then says `failed`); 200
/// `{}` once the tenant was deleted; 410 `{}` when there was nothing to delete (the lookup found no
/// tenant, or the tenant had no rows). A DELETE after completion starts no second job.
#[utoipa::path(
    delete,
    path = "/v2/service_instances/{instance_id}",
    tag = "osb",
    security(("osb_basic" = [])),
    params(
        ("instance_id" = String, Path, description = "The Service Instance ID (1..=256 characters, no control characters); the tenant key, or the value `[osb] tenant_lookup` resolves",
         min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"),
        ("X-Broker-API-Version" = String, Header, description = "The platform's broker API version, `2.MINOR`; accepted from `[osb] min_api_version` (default 2.12) up",
         pattern = "^2\\.(1[2-9]|[2-9][0-9])$"),
        DeprovisionQuery,
    ),
    responses(
        (status = 200, description = "The tenant was deleted (`{}`)", body = Empty),
        (status = 202, description = "The deletion is in progress (or failed and waits for an operator: see `last_operation`); poll `last_operation`", body = DeprovisionAccepted),
        (status = 400, description = "`service_id` or `plan_id` missing or empty, a malformed parameter or instance ID; nothing stored", body = OsbErrorBody),
        (status = 401, description = "Missing or wrong HTTP Basic credentials (`WWW-Authenticate: Basic realm=\"deprov\"`); nothing stored", body = OsbErrorBody,
         headers(("WWW-Authenticate" = String, description = "`Basic realm=\"deprov\"`"))),
        (status = 404, description = "No `[osb]` section configured", body = OsbErrorBody),
        (status = 410, description = "Nothing to delete: the instance's tenant was not found, or is already gone (`{}`)", body = Empty),
        (status = 412, description = "`X-Broker-API-Version` missing or not accepted; nothing stored", body = OsbErrorBody),
        (status = 413, description = "Body larger than `[intake] max_body_bytes` (answered before the route, as problem+json)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`accepts_incomplete=true` missing (`AsyncRequired`: deprov deletes asynchronously only); nothing stored", body = OsbErrorBody),
        (status = 429, description = "This peer address exceeded `[intake.rate_limit]` (answered before the route, as problem+json); retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
        (status = 503, description = "State database unavailable (OSB error body), or the service is starting or the request timed out (problem+json); retry after `Retry-After` seconds",
         content((OsbErrorBody = "application/json"), (Problem = "application/problem+json")),
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn deprovision(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<DeprovisionQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let answer = record_deprovision(&state, path, query, &headers).await;
    with_identity(&state, &headers, answer)
}

/// [`deprovision`], before the request identity is echoed.
async fn record_deprovision(
    state: &AppState,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<DeprovisionQuery>, QueryRejection>,
    headers: &HeaderMap,
) -> Result<Response, OsbError> {
    let osb = broker(state, headers)?;
    let instance = instance(path)?;
    let Query(q) = query.map_err(|r| OsbError::bad_request(r.body_text()))?;
    let service_id = param("service_id", q.service_id)?
        .ok_or_else(|| OsbError::bad_request("the service_id query parameter is required"))?;
    let plan_id = param("plan_id", q.plan_id)?
        .ok_or_else(|| OsbError::bad_request("the plan_id query parameter is required"))?;
    match q.accepts_incomplete.as_deref() {
        Some("true") => {}
        None | Some("false") => {
            return Err(OsbError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "AsyncRequired",
                "This Service Plan requires client support for asynchronous service operations \
                 (accepts_incomplete=true): deprov deletes a tenant asynchronously",
            ));
        }
        Some(_) => {
            return Err(OsbError::bad_request(
                "accepts_incomplete must be true or false",
            ));
        }
    }
    let (subject_kind, subject) = match (&osb.tenant_lookup, state.readiness.sql_check().key_form())
    {
        (Some(_), _) => (
            SubjectKind::Lookup,
            format!("{}:{}", osb.source, instance.as_str()),
        ),
        // The instance ID is the tenant key: stored as the key column prints it when it reads it.
        (None, Some(form)) => (
            SubjectKind::Tenant,
            form.canonical_or_as_sent(instance.as_str()),
        ),
        (None, None) => (SubjectKind::Tenant, instance.to_string()),
    };
    let req = NewRequest {
        source: osb.source.clone(),
        basis: DedupBasis::InstallationId,
        dedup_key: instance.as_str().to_owned(),
        subject_kind,
        subject,
        external_id: None,
        // The first DELETE's is kept: another body for the same instance ID is the same request.
        reason: Some(format!(
            "Open Service Broker deprovision (service_id {service_id}, plan_id {plan_id})"
        )),
    };
    let accepted = state
        .record(req)
        .await
        .map_err(|e| OsbError::from(ApiError::from(e)))?;
    let identity = headers
        .get(REQUEST_IDENTITY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    tracing::info!(instance = %instance, %service_id, %plan_id, job_id = %accepted.job_id,
        duplicate = accepted.duplicate, request_identity = identity, "osb deprovision recorded");
    let operation = || {
        json(
            StatusCode::ACCEPTED,
            &DeprovisionAccepted {
                operation: accepted.job_id.to_string(),
            },
        )
    };
    match job_state(&accepted.state)? {
        JobState::Queued | JobState::Held | JobState::Running => return Ok(operation()),
        JobState::Completed | JobState::Failed | JobState::Cancelled => {}
    }
    let standing = status::standing(&state.pools.intake, &osb.source, instance.as_str())
        .await
        .map_err(|e| OsbError::from(ApiError::from(e)))?;
    Ok(match standing {
        Standing::Deleted => json(StatusCode::OK, &Empty {}),
        Standing::Gone => json(StatusCode::GONE, &Empty {}),
        Standing::InProgress { job_id, .. } | Standing::Failed { job_id, .. } => json(
            StatusCode::ACCEPTED,
            &DeprovisionAccepted {
                operation: job_id.to_string(),
            },
        ),
        Standing::Unknown => operation(),
    })
}

/// Polls the deprovisioning of a service instance.
///
/// `in progress` (with `Retry-After`) while the job is queued, held or running; `succeeded` once the
/// tenant was deleted; `failed` when the job failed or an operator cancelled it; 410 when the
/// deletion found nothing to delete (the platform treats it as success); 404 when deprov never
/// received a deprovision for the instance.
#[utoipa::path(
    get,
    path = "/v2/service_instances/{instance_id}/last_operation",
    tag = "osb",
    security(("osb_basic" = [])),
    params(
        ("instance_id" = String, Path, description = "The Service Instance ID (1..=256 characters, no control characters)",
         min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"),
        ("X-Broker-API-Version" = String, Header, description = "The platform's broker API version, `2.MINOR`; accepted from `[osb] min_api_version` (default 2.12) up",
         pattern = "^2\\.(1[2-9]|[2-9][0-9])$"),
        LastOperationQuery,
    ),
    responses(
        (status = 200, description = "The deletion's state", body = LastOperation,
         headers(("Retry-After" = u64, description = "While `in progress`: seconds to wait before polling again"))),
        (status = 400, description = "An empty or malformed parameter or instance ID", body = OsbErrorBody),
        (status = 401, description = "Missing or wrong HTTP Basic credentials (`WWW-Authenticate: Basic realm=\"deprov\"`)", body = OsbErrorBody,
         headers(("WWW-Authenticate" = String, description = "`Basic realm=\"deprov\"`"))),
        (status = 404, description = "No deprovision of this instance was received, or no `[osb]` section configured", body = OsbErrorBody),
        (status = 410, description = "The deletion completed finding nothing to delete (`{}`): the platform treats it as success", body = Empty),
        (status = 412, description = "`X-Broker-API-Version` missing or not accepted", body = OsbErrorBody),
        (status = 503, description = "State database unavailable (OSB error body), or the service is starting or the request timed out (problem+json); retry after `Retry-After` seconds",
         content((OsbErrorBody = "application/json"), (Problem = "application/problem+json")),
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn last_operation(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<LastOperationQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let answer = poll(&state, path, query, &headers).await;
    with_identity(&state, &headers, answer)
}

/// [`last_operation`], before the request identity is echoed.
async fn poll(
    state: &AppState,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<LastOperationQuery>, QueryRejection>,
    headers: &HeaderMap,
) -> Result<Response, OsbError> {
    let osb = broker(state, headers)?;
    let instance = instance(path)?;
    let Query(q) = query.map_err(|r| OsbError::bad_request(r.body_text()))?;
    param("service_id", q.service_id)?;
    param("plan_id", q.plan_id)?;
    param("operation", q.operation)?;
    let standing = status::standing(&state.pools.intake, &osb.source, instance.as_str())
        .await
        .map_err(|e| OsbError::from(ApiError::from(e)))?;
    let answer = |state, description: String, instance_usable| {
        json(
            StatusCode::OK,
            &LastOperation {
                state,
                description,
                instance_usable,
            },
        )
    };
    Ok(match standing {
        Standing::Unknown => {
            return Err(OsbError::new(
                StatusCode::NOT_FOUND,
                "NotFound",
                "no deprovision of this service instance was received",
            ));
        }
        Standing::InProgress { job_id, held } => {
            let description = if held {
                format!("deletion held by the service's kill switch (job {job_id})")
            } else {
                format!("deletion in progress (job {job_id})")
            };
            let mut response = answer(OperationState::InProgress, description, None);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            response
        }
        Standing::Deleted => answer(
            OperationState::Succeeded,
            "the tenant's data was deleted".into(),
            None,
        ),
        Standing::Gone => json(StatusCode::GONE, &Empty {}),
        Standing::Failed {
            job_id,
            cancelled,
            touched,
        } => {
            let what = if cancelled {
                "was cancelled by an operator"
            } else {
                "failed"
            };
            answer(
                OperationState::Failed,
                format!("the deletion {what} (job {job_id}); the service's operators must act"),
                Some(!touched),
            )
        }
    })
}
