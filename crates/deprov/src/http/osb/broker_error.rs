//! The Open Service Broker error body (OSB v2.17, "Service Broker Errors"): `{"error": "<CamelCase
//! word>", "description": "<user-facing message>"}` as `application/json`, which platforms (Cloud
//! Foundry, Kubernetes service catalogs) parse and show to the user — not problem+json, which they
//! do not read. `error` is the spec's code where the spec names one (`AsyncRequired`), else a
//! CamelCase word of deprov's own for the condition.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::error::ApiError;

/// The body of every error answer of the `/v2/` routes (OSB v2.17, "Service Broker Errors").
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OsbErrorBody {
    /// A single CamelCase word identifying the condition: `AsyncRequired` (spec code, 422),
    /// `MissingApiVersion` / `UnsupportedApiVersion` (412), `Unauthorized` (401), `BadRequest`
    /// (400), `NotFound` (404), `PayloadTooLarge` (413), `TooManyRequests` (429),
    /// `ServiceUnavailable` (503), `InternalError` (500).
    pub error: String,
    /// A user-facing message saying why the request failed.
    pub description: String,
}

/// An error of the `/v2/` routes: a status, the OSB body, and the headers the status needs
/// (`WWW-Authenticate: Basic realm="deprov"` on 401, `Retry-After` on 429 and 503).
#[derive(Debug)]
pub struct OsbError {
    status: StatusCode,
    error: &'static str,
    description: String,
    retry_after: Option<u64>,
}

impl OsbError {
    /// An error of `status` with OSB `error` code and `description`.
    pub fn new(status: StatusCode, error: &'static str, description: impl Into<String>) -> Self {
        Self {
            status,
            error,
            description: description.into(),
            retry_after: None,
        }
    }

    /// 400 `BadRequest`: malformed or missing mandatory data (OSB: "MUST be returned if the request
    /// is malformed or missing mandatory data").
    pub fn bad_request(description: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", description)
    }

    /// 401 `Unauthorized`, with the Basic challenge.
    pub fn unauthorized(description: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", description)
    }

    /// The status answered.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The user-facing description sent (names no credential).
    pub fn description(&self) -> &str {
        &self.description
    }
}

impl From<ApiError> for OsbError {
    /// The same status and `Retry-After` as the problem+json answer, with the problem's detail as
    /// the description (a 500's detail stays logged, not sent).
    fn from(e: ApiError) -> Self {
        let error = match e.status() {
            StatusCode::BAD_REQUEST => "BadRequest",
            StatusCode::UNAUTHORIZED => "Unauthorized",
            StatusCode::NOT_FOUND => "NotFound",
            StatusCode::PAYLOAD_TOO_LARGE => "PayloadTooLarge",
            StatusCode::UNPROCESSABLE_ENTITY => "UnprocessableEntity",
            StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
            _ => "InternalError",
        };
        let retry_after = match &e {
            ApiError::Unavailable { retry_after, .. }
            | ApiError::TooManyRequests { retry_after, .. } => Some(*retry_after),
            _ => None,
        };
        if let ApiError::Internal(detail) = &e {
            tracing::error!(%detail, "internal error");
        }
        Self {
            status: e.status(),
            error,
            description: e.problem().detail,
            retry_after,
        }
    }
}

impl IntoResponse for OsbError {
    fn into_response(self) -> Response {
        tracing::debug!(status = self.status.as_u16(), error = self.error, description = %self.description, "broker request refused");
        let body = OsbErrorBody {
            error: self.error.to_owned(),
            description: self.description,
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(crate::sources::basic::CHALLENGE),
            );
        }
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
