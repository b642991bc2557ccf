//! The checks both Open Service Broker routes make before their own work, and the shaping of their
//! answers.

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::broker_error::OsbError;
use super::{API_VERSION_HEADER, MAX_PARAM_LEN, REQUEST_IDENTITY_HEADER};
use crate::config::OsbConfig;
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::ids::TenantId;

/// The `[osb]` section and its checks common to both routes: configured (404), Basic credentials
/// (401), `X-Broker-API-Version` (412).
pub(super) fn broker<'s>(
    state: &'s AppState,
    headers: &HeaderMap,
) -> Result<&'s OsbConfig, OsbError> {
    let osb = state.config.osb.as_ref().ok_or_else(|| {
        OsbError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the Open Service Broker API is not configured ([osb] section)",
        )
    })?;
    let source = state.config.sources.get(&osb.source).ok_or_else(|| {
        OsbError::from(ApiError::Internal(format!(
            "[osb] source {:?} is not configured",
            osb.source
        )))
    })?;
    crate::sources::basic::verify(
        source.username.as_deref().unwrap_or_default(),
        &source.keys.0,
        headers,
    )
    .map_err(|r| {
        OsbError::unauthorized(format!(
            "send the broker's HTTP Basic credentials (Authorization: Basic …): {r}"
        ))
    })?;
    check_version(headers, osb)?;
    Ok(osb)
}

/// `X-Broker-API-Version`: `2.MINOR` with MINOR ≥ `[osb] min_api_version`'s (spec "API Version
/// Header"). Missing, repeated or any other value: 412 with a description naming the versions
/// accepted.
fn check_version(headers: &HeaderMap, osb: &OsbConfig) -> Result<(), OsbError> {
    let accepted = format!(
        "this broker accepts X-Broker-API-Version 2.{} or a later 2.x (it implements the \
         deprovision side of Open Service Broker API 2.17)",
        osb.min_minor()
    );
    let mut values = headers.get_all(API_VERSION_HEADER).iter();
    let Some(value) = values.next() else {
        return Err(OsbError::new(
            StatusCode::PRECONDITION_FAILED,
            "MissingApiVersion",
            format!("the X-Broker-API-Version header is required; {accepted}"),
        ));
    };
    if values.next().is_some() {
        return Err(OsbError::new(
            StatusCode::PRECONDITION_FAILED,
            "RepeatedApiVersion",
            format!("the X-Broker-API-Version header is repeated: send it once; {accepted}"),
        ));
    }
    let minor = value
        .to_str()
        .ok()
        .and_then(|v| crate::config::osb_minor_of(v.trim()));
    match minor {
        Some(m) if m >= osb.min_minor() => Ok(()),
        _ => Err(OsbError::new(
            StatusCode::PRECONDITION_FAILED,
            "UnsupportedApiVersion",
            format!(
                "X-Broker-API-Version {:?} is not supported; {accepted}",
                String::from_utf8_lossy(value.as_bytes())
            ),
        )),
    }
}

/// The path's instance ID: 1..=256 characters without control characters, else 400.
pub(super) fn instance(path: Result<Path<String>, PathRejection>) -> Result<TenantId, OsbError> {
    let Path(raw) = path.map_err(|r| OsbError::bad_request(r.body_text()))?;
    TenantId::parse(&raw).map_err(|r| OsbError::bad_request(format!("instance_id: {r}")))
}

/// A query parameter's value, if present: non-empty (spec v2.12: "if present, MUST be a non-empty
/// string"), at most [`MAX_PARAM_LEN`] characters, no control characters; else 400.
pub(super) fn param(name: &str, value: Option<String>) -> Result<Option<String>, OsbError> {
    match value {
        Some(v)
            if v.is_empty()
                || v.chars().count() > MAX_PARAM_LEN
                || v.chars().any(char::is_control) =>
        {
            Err(OsbError::bad_request(format!(
                "{name} must be 1..={MAX_PARAM_LEN} characters without control characters"
            )))
        }
        other => Ok(other),
    }
}

/// `answer` with the request's `X-Broker-API-Request-Identity` echoed (spec "Request Identity"),
/// when it sent one.
///
/// A 4xx error answer is logged at WARN (the `[osb] source`'s name, `unknown` without `[osb]`, and
/// the error's description) and counted in `deprov_webhook_deliveries_refused_total`.
pub(super) fn with_identity(
    state: &AppState,
    headers: &HeaderMap,
    answer: Result<Response, OsbError>,
) -> Response {
    if let Err(e) = &answer
        && e.status().is_client_error()
    {
        let source = state
            .config
            .osb
            .as_ref()
            .map_or(crate::telemetry::UNKNOWN_SOURCE, |o| o.source.as_str());
        tracing::warn!(source, status = e.status().as_u16(), reason = %e.description(),
            "broker request refused");
        crate::telemetry::delivery_refused(source, e.status().as_u16());
    }
    let mut response = answer.into_response();
    if let Some(id) = headers.get(REQUEST_IDENTITY_HEADER) {
        response
            .headers_mut()
            .insert(REQUEST_IDENTITY_HEADER, id.clone());
    }
    response
}

/// A JSON answer with `status`.
pub(super) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}
