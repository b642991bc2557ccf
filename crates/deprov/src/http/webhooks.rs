//! `POST /v1/webhooks/{source}`: deliveries from signed senders (`[sources.NAME]`, see
//! [`crate::sources`]).
//!
//! The body is read as raw bytes (at most `[intake] max_body_bytes`) and verified by the source's
//! scheme before anything is parsed or stored; any failure — unknown source, missing, malformed or
//! wrong signature or token (`jwt`, `atlassian-connect`: [`super::token_sources`]), a timestamp
//! outside the tolerance or, with `timestamp` and `max_age`, the body's timestamp outside `max_age`
//! ([`crate::sources::age`]) — is 401 problem+json and stores nothing. A
//! verified delivery whose body is not a JSON object, from a source that reads its body, is 400 problem+json
//! and stores nothing. A verified delivery whose event type is in `delete_events` is recorded like any deletion request
//! (deterministic ID over the delivery ID or the natural key, so a replay is a duplicate); any other
//! event type is acknowledged 200, recorded in `deprov.ignored_deliveries`, and starts nothing.
//! Between verification and reading, the source's `decode` layers unwrap a payload held in a
//! string field ([`crate::sources::decode`]); `aws-sns` messages are verified, and their
//! subscription confirmations answered, in this module's sibling `sns`.

use axum::body::Bytes;
use axum::extract::{FromRequest, OriginalUri, Request, State};
use axum::http::{HeaderMap, StatusCode};

use super::AppState;
use super::auth::{REPEATED_AUTHORIZATION, authorization_repeated, bearer};
use super::error::{ApiError, Problem};
use super::extract::ApiPath;
use super::intake_routes::job_state;
use super::webhook_answer::ignore;
pub use super::webhook_answer::{WebhookAnswer, WebhookOutcome};
use crate::ids::{DedupBasis, KeyForm, MAX_TENANT_ID_LEN};
use crate::queue::intake::{IntakeError, NewRequest, SubjectKind};
use crate::sources::payload::{self, Delivery};
use crate::sources::{Dedup, Scheme, SourceConfig, unix_now, verify_hmac};

/// The raw request body, with problem+json rejections (413 over `[intake] max_body_bytes`).
#[derive(Debug)]
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(req, state)
            .await
            .map(Self)
            .map_err(|r| ApiError::from_rejection(r.status(), r.body_text()))
    }
}

fn unauthorized(detail: String) -> ApiError {
    ApiError::Unauthorized(detail)
}

/// Checks the delivery's credentials under `source`'s scheme.
fn authenticate(
    state: &AppState,
    name: &str,
    source: &SourceConfig,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), ApiError> {
    match source.scheme {
        Scheme::Bearer => {
            if authorization_repeated(headers) {
                return Err(unauthorized(format!(
                    "source {name}: {REPEATED_AUTHORIZATION}"
                )));
            }
            let token = bearer(headers).ok_or_else(|| {
                unauthorized(format!(
                    "source {name}: send `Authorization: Bearer <token>`"
                ))
            })?;
            if state.sources.identify(token) == Some(name) {
                Ok(())
            } else {
                Err(unauthorized(format!("source {name}: wrong token")))
            }
        }
        Scheme::AwsSns => Err(unauthorized(format!("source {name}: not an SNS message"))),
        Scheme::Basic => crate::sources::basic::verify(
            source.username.as_deref().unwrap_or_default(),
            &source.keys.0,
            headers,
        )
        .map_err(|r| ApiError::UnauthorizedBasic(format!("source {name}: {r}"))),
        Scheme::VercelOidc => Err(unauthorized(format!(
            "source {name} is the Vercel partner API (DELETE /v1/installations/{{id}}); it sends no webhooks"
        ))),
        // Checked asynchronously by `state.token_sources` (keys are fetched).
        Scheme::Jwt | Scheme::AtlassianConnect => {
            Err(unauthorized(format!("source {name}: token not checked")))
        }
        scheme => verify_hmac(
            scheme,
            &source.keys.0,
            headers,
            body,
            unix_now(),
            source.tolerance(),
        )
        .map_err(|r| unauthorized(format!("source {name}: {r}"))),
    }
}

/// The request a deleting delivery records.
///
/// A tenant key for the key column itself (no `tenant_lookup`) is stored as the column prints it
/// when `form` reads it ([`KeyForm::canonical_or_as_sent`]); one it cannot read is stored as sent, not
/// refused (a sender would retry it for days), and its job fails with the cast's error.
fn new_request(
    name: &str,
    source: &SourceConfig,
    delivery: &Delivery,
    form: Option<KeyForm>,
) -> Result<NewRequest, ApiError> {
    let tenant = delivery.tenant.clone().ok_or_else(|| {
        let at = source
            .tenant
            .as_ref()
            .map_or_else(|| "not configured".to_owned(), ToString::to_string);
        let why = delivery.tenant_unusable.unwrap_or("it is absent");
        ApiError::Unprocessable(format!(
            "the value where sources.{name}.tenant points ({at}) is absent or unusable: {why} \
             (a tenant is a string or an integer of 1..={MAX_TENANT_ID_LEN} characters without \
             control characters)"
        ))
    })?;
    let direct = source.tenant_lookup.is_none();
    let tenant = match form {
        Some(form) if direct => form.canonical_or_as_sent(&tenant),
        _ => tenant,
    };
    let key = delivery.dedup.clone().ok_or_else(|| {
        ApiError::Unprocessable(format!(
            "the delivery has no usable deduplication key (sources.{name}.dedup = {}): absent, \
             empty, longer than {MAX_TENANT_ID_LEN} characters or holding a control character",
            source.dedup
        ))
    })?;
    let (basis, external_id, key) = match source.dedup {
        // The tenant deduplicates: in the form it is stored in.
        Dedup::Tenant => (DedupBasis::TenantId, None, tenant.clone()),
        _ => (DedupBasis::ExternalId, Some(key.clone()), key),
    };
    let (subject_kind, subject) = if direct {
        (SubjectKind::Tenant, tenant)
    } else {
        (SubjectKind::Lookup, format!("{name}:{tenant}"))
    };
    Ok(NewRequest {
        source: name.to_owned(),
        basis,
        dedup_key: key,
        subject_kind,
        subject,
        external_id,
        reason: delivery.event.as_ref().map(|e| format!("event {e}")),
    })
}

/// Receives a signed delivery from a configured source.
///
/// Verification is over the raw body bytes with the source's scheme and secrets (any configured
/// secret may match). A delivery whose event type is in the source's `delete_events` is recorded as
/// a deletion request (202); a replay answers the same IDs with `duplicate: true`. Other event types
/// are acknowledged (200), recorded as ignored, and start nothing.
#[utoipa::path(
    post,
    path = "/v1/webhooks/{source}",
    tag = "webhooks",
    params(
        ("source" = String, Path, description = "The `NAME` of a `[sources.NAME]` table"),
        ("webhook-signature" = Option<String>, Header, description = "standard-webhooks (with `webhook-id`, `webhook-timestamp`)"),
        ("Stripe-Signature" = Option<String>, Header, description = "stripe: `t=…,v1=…`"),
        ("X-Hub-Signature-256" = Option<String>, Header, description = "github: `sha256=<hex>`"),
        ("X-Shopify-Hmac-Sha256" = Option<String>, Header, description = "shopify: base64"),
        ("X-Slack-Signature" = Option<String>, Header, description = "slack: `v0=<hex>` (with `X-Slack-Request-Timestamp`)"),
        ("x-vercel-signature" = Option<String>, Header, description = "vercel-webhook: hex HMAC-SHA1"),
        ("Authorization" = Option<String>, Header, description = "jwt: `Bearer <JWT>`; atlassian-connect: `JWT <RS256 token>`"),
    ),
    request_body(content = Object, content_type = "application/json",
                 description = "The sender's own payload, verified over its exact bytes"),
    responses(
        (status = 200, description = "Verified; the event type does not mean delete (recorded as ignored), a Slack challenge, a `restore_events` event (`outcome: reinstall`), or an SNS subscription confirmation (`confirmed`, or `ignored` without `confirm_subscriptions`)", body = WebhookAnswer),
        (status = 202, description = "Verified and recorded as a deletion request (or already recorded: `duplicate: true`)", body = WebhookAnswer),
        (status = 400, description = "Verified, but the body is not a JSON object and the source reads its event type, tenant or deduplication key from the body, or a `decode` layer cannot be applied (no string at its pointer, bad base64, not JSON, too large or too deep); nothing stored", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Unknown source, or a missing, malformed or wrong signature or token (a `bearer` source's token, a `basic` source's HTTP Basic credentials: `WWW-Authenticate: Basic realm=\"deprov\"`), or a timestamp outside the tolerance (or the body's timestamp outside `max_age`); `aws-sns`: a topic not in `topic_arns`, a `SigningCertURL` not https, not on a `cert_hosts` host or not a `.pem`, or a signature that does not verify", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than `[intake] max_body_bytes`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A deleting event without a tenant or deduplication key where the source says they are, or a delivery ID reused with a different body", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "This peer address exceeded `[intake.rate_limit]`; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
        (status = 503, description = "State database unavailable, or a token sender's signing keys could not be fetched, or (`aws-sns`) the signing certificate could not be fetched or a subscription could not be confirmed; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ),
)]
pub async fn receive(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Result<RawBody, ApiError>,
) -> Result<(StatusCode, axum::Json<WebhookAnswer>), ApiError> {
    let answer = match body {
        Ok(RawBody(body)) => receive_verified(&state, &name, &uri, &headers, body).await,
        Err(e) => Err(e),
    };
    if let Err(e) = &answer {
        refused(&state, &name, e);
    }
    answer
}

/// Logs (WARN) and counts a delivery refused with a 4xx status: the source's name (`unknown` for a
/// name that is not configured, whose raw path segment is logged only escaped and shortened) and
/// the problem's detail, which names no secret, token or body content.
fn refused(state: &AppState, name: &str, e: &ApiError) {
    let status = e.status();
    if !status.is_client_error() {
        return;
    }
    let reason = e.to_string();
    if state.config.sources.contains_key(name) {
        tracing::warn!(source = %name, status = status.as_u16(), %reason, "webhook delivery refused");
        crate::telemetry::delivery_refused(name, status.as_u16());
    } else {
        let requested: String = name.chars().take(64).collect();
        tracing::warn!(source = crate::telemetry::UNKNOWN_SOURCE, requested = ?requested,
            status = status.as_u16(), %reason, "webhook delivery refused");
        crate::telemetry::delivery_refused(crate::telemetry::UNKNOWN_SOURCE, status.as_u16());
    }
}

/// [`receive`], from the body read on: the refusals it returns are counted by [`receive`].
async fn receive_verified(
    state: &AppState,
    name: &str,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, axum::Json<WebhookAnswer>), ApiError> {
    let Some(source) = state.config.sources.get(name) else {
        return Err(unauthorized("unknown source".into()));
    };
    if source.scheme == Scheme::AwsSns {
        let message = super::sns_delivery::authenticate(name, source, &body).await?;
        if let Some(answer) =
            super::sns_delivery::answer_other(state, name, source, &message).await?
        {
            return Ok((StatusCode::OK, axum::Json(answer)));
        }
    } else if source.scheme.is_token() {
        state
            .token_sources
            .authenticate(name, headers, uri, &body)
            .await?;
    } else {
        authenticate(state, name, source, headers, &body)?;
    }
    let body = super::webhook_body::readable(state, name, source, body)?;
    if payload::reads_body(source) {
        json_object(&body)?;
    }
    let delivery = payload::extract(source, headers, &body);
    let answer = if source.scheme == Scheme::Slack
        && delivery.event.as_deref() == Some("url_verification")
    {
        (StatusCode::OK, slack_challenge(&body, delivery.event))
    } else if let Some(event) = delivery
        .event
        .as_deref()
        .filter(|e| source.restore_events.iter().any(|r| r == e))
    {
        (
            StatusCode::OK,
            reinstall(state, name, source, &delivery, event).await?,
        )
    } else if !delivery.deletes {
        (StatusCode::OK, ignore(state, name, &delivery, &body).await?)
    } else {
        (
            StatusCode::ACCEPTED,
            record(state, name, source, &delivery).await?,
        )
    };
    Ok((answer.0, axum::Json(answer.1)))
}

/// Refuses (400) a body that is not a JSON object, for a source that reads its event type, tenant
/// or deduplication key from the body: acknowledging it as an ignored event would tell the sender
/// a deletion was handled.
fn json_object(body: &[u8]) -> Result<(), ApiError> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Err(e) => Err(ApiError::BadRequest(format!(
            "the delivery's body is not valid JSON: {e}"
        ))),
        Ok(v) if !v.is_object() => Err(ApiError::BadRequest(
            "the delivery's body is not a JSON object".into(),
        )),
        Ok(_) => Ok(()),
    }
}

/// Slack's `url_verification`: the body's `challenge`, echoed; nothing stored.
fn slack_challenge(body: &[u8], event: Option<String>) -> WebhookAnswer {
    let challenge = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("challenge")?.as_str().map(str::to_owned));
    WebhookAnswer {
        challenge,
        ..WebhookAnswer::new(WebhookOutcome::Challenge, event)
    }
}

/// A `restore_events` event: the tenant reinstalled ([`super::reconcile_routes::reinstall_subject`]).
///
/// # Errors
/// 422 without a tenant where the source says it is; the reinstall's errors.
async fn reinstall(
    state: &AppState,
    name: &str,
    source: &SourceConfig,
    delivery: &payload::Delivery,
    event: &str,
) -> Result<WebhookAnswer, ApiError> {
    let tenant = delivery.tenant.as_deref().ok_or_else(|| {
        ApiError::Unprocessable(format!(
            "no tenant at sources.{name}.tenant ({:?})",
            source.tenant
        ))
    })?;
    let reason = format!("event {event}");
    let outcome =
        super::reconcile_routes::reinstall_subject(state, name, tenant, Some(&reason)).await?;
    tracing::info!(source = %name, event, ?outcome, "webhook reinstall");
    Ok(WebhookAnswer {
        reinstall: Some(outcome),
        ..WebhookAnswer::new(WebhookOutcome::Reinstall, delivery.event.clone())
    })
}

/// A deleting event: recorded as a deletion request, as intake records one.
///
/// # Errors
/// 422 without a tenant or deduplication key where the source says, or a delivery ID reused with
/// another body; intake's errors.
async fn record(
    state: &AppState,
    name: &str,
    source: &SourceConfig,
    delivery: &payload::Delivery,
) -> Result<WebhookAnswer, ApiError> {
    let req = new_request(
        name,
        source,
        delivery,
        state.readiness.sql_check().key_form(),
    )?;
    let accepted = state.record(req).await.map_err(|e| match e {
        // The sender's delivery ID, not an `external_id` a caller chose: say so.
        IntakeError::Mismatch { .. } => ApiError::IdempotencyMismatch(format!(
            "this delivery's deduplication key (sources.{name}.dedup = {}) was already used by a \
             delivery with a different body",
            source.dedup
        )),
        other => other.into(),
    })?;
    tracing::info!(source = %name, event = ?delivery.event, request_id = %accepted.request_id,
        job_id = %accepted.job_id, duplicate = accepted.duplicate, "webhook deletion recorded");
    Ok(WebhookAnswer {
        request_id: Some(accepted.request_id),
        job_id: Some(accepted.job_id),
        state: Some(job_state(&accepted.state)?),
        duplicate: accepted.duplicate,
        ..WebhookAnswer::new(WebhookOutcome::Recorded, delivery.event.clone())
    })
}
