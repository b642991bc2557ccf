//! The one error type of the HTTP edge, rendered as RFC 9457 problem details
//! (`application/problem+json`).
//!
//! Every failure a client can see — including axum's own extractor rejections, unknown routes, wrong
//! methods, timeouts and panics — goes through [`ApiError`], so no response is ever plain text. Problem
//! `type` URIs are `https://deprov.dev/problems/<slug>`; they identify the kind of problem and are stable.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::queue::intake::IntakeError;

/// The media type of every error response (RFC 9457 §3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Seconds a client should wait before retrying when the state database is unavailable.
pub const RETRY_AFTER_SECS: u64 = 1;

/// An RFC 9457 problem details object, the body of every error response.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct Problem {
    /// A URI identifying the problem type, `https://deprov.dev/problems/<slug>`.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short, human-readable summary of the problem type (same for every occurrence).
    pub title: String,
    /// The HTTP status code of this occurrence.
    pub status: u16,
    /// What went wrong in this occurrence; names the offending field or header where there is one.
    pub detail: String,
}

/// Everything that can go wrong at the HTTP edge. Nothing is stored when one of these is returned,
/// except a 503 for a deletion request whose commit was not confirmed in time
/// ([`IntakeError::Unconfirmed`], or the request timeout): it may still be recorded, and a retry is
/// then answered as its duplicate.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the body is not JSON, or a query string or path parameter cannot be parsed.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no credentials, or credentials that match nothing configured. Carries `WWW-Authenticate`.
    #[error("{0}")]
    Unauthorized(String),
    /// 401 to a `basic` source's caller: carries `WWW-Authenticate: Basic realm="deprov"` (RFC 7617).
    #[error("{0}")]
    UnauthorizedBasic(String),
    /// 403: authenticated but not allowed (operator API disabled, or a `source` the token does not name).
    #[error("{0}")]
    Forbidden(String),
    /// 404: no such route or resource.
    #[error("{0}")]
    NotFound(String),
    /// 409: the resource's state does not allow the action (e.g. undo once the hard delete started).
    #[error("{0}")]
    Conflict(String),
    /// 405: the route exists, the method does not.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// 413: the body exceeds `[intake] max_body_bytes`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 431: the request's header fields exceed `[intake] max_header_bytes`.
    #[error("{0}")]
    HeadersTooLarge(String),
    /// 415: the body is not declared as `application/json`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 422: well-formed JSON with invalid, missing or unknown fields, or invalid header values.
    #[error("{0}")]
    Unprocessable(String),
    /// 422: an Idempotency-Key or external_id reused with a different body (IETF
    /// draft-ietf-httpapi-idempotency-key-header §2.7).
    #[error("{0}")]
    IdempotencyMismatch(String),
    /// 429 with `Retry-After`: the source (or peer address) exceeded `[intake.rate_limit]`, or a
    /// peer address used up its failed console logins (`[console.login_rate_limit]`).
    #[error("{detail}")]
    TooManyRequests {
        /// What was limited.
        detail: String,
        /// Seconds for the `Retry-After` header: when the next request of this source is admitted.
        retry_after: u64,
    },
    /// 503 with `Retry-After`: the state database did not answer within the pool's acquire timeout,
    /// or the request exceeded the server's request timeout.
    #[error("{detail}")]
    Unavailable {
        /// What was unavailable.
        detail: String,
        /// Seconds for the `Retry-After` header.
        retry_after: u64,
    },
    /// 500: a bug or an unexpected database error; the detail is logged, not sent.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) | Self::UnauthorizedBasic(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Unprocessable(_) | Self::IdempotencyMismatch(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            Self::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn slug_and_title(&self) -> (&'static str, &'static str) {
        match self {
            Self::BadRequest(_) => ("bad-request", "Malformed request"),
            Self::Unauthorized(_) | Self::UnauthorizedBasic(_) => {
                ("unauthorized", "Missing or invalid credentials")
            }
            Self::Forbidden(_) => ("forbidden", "Not allowed"),
            Self::NotFound(_) => ("not-found", "Not found"),
            Self::Conflict(_) => ("conflict", "Not allowed in the resource's current state"),
            Self::MethodNotAllowed => ("method-not-allowed", "Method not allowed"),
            Self::PayloadTooLarge(_) => ("payload-too-large", "Request body too large"),
            Self::HeadersTooLarge(_) => ("headers-too-large", "Request header fields too large"),
            Self::UnsupportedMediaType(_) => ("unsupported-media-type", "Unsupported media type"),
            Self::Unprocessable(_) => ("invalid-request", "Invalid request"),
            Self::IdempotencyMismatch(_) => (
                "idempotency-key-reused",
                "Idempotency key reused with a different request",
            ),
            Self::TooManyRequests { .. } => ("rate-limited", "Too many requests"),
            Self::Unavailable { .. } => ("unavailable", "Service temporarily unavailable"),
            Self::Internal(_) => ("internal", "Internal server error"),
        }
    }

    /// The problem details object sent for this error.
    pub fn problem(&self) -> Problem {
        let (slug, title) = self.slug_and_title();
        let detail = match self {
            Self::Internal(_) => "an unexpected error occurred; it has been logged".to_owned(),
            other => other.to_string(),
        };
        Problem {
            type_uri: format!("https://deprov.dev/problems/{slug}"),
            title: title.to_owned(),
            status: self.status().as_u16(),
            detail,
        }
    }

    /// A 503 for an unavailable state database.
    pub fn db_unavailable(detail: impl Into<String>) -> Self {
        Self::Unavailable {
            detail: detail.into(),
            retry_after: RETRY_AFTER_SECS,
        }
    }

    /// Maps an axum extractor rejection (JSON, path, query, body) to a problem, keeping its status.
    pub fn from_rejection(status: StatusCode, text: String) -> Self {
        match status {
            StatusCode::PAYLOAD_TOO_LARGE => Self::PayloadTooLarge(text),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::UnsupportedMediaType(text),
            StatusCode::UNPROCESSABLE_ENTITY => Self::Unprocessable(text),
            s if s.is_client_error() => Self::BadRequest(text),
            _ => Self::Internal(text),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            Self::Internal(detail) => tracing::error!(%detail, "internal error"),
            Self::Unavailable { detail, .. } => tracing::warn!(%detail, "unavailable"),
            other => tracing::debug!(status = status.as_u16(), detail = %other, "request refused"),
        }
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        match &self {
            Self::Unavailable { retry_after, .. } | Self::TooManyRequests { retry_after, .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
            }
            Self::Unauthorized(_) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::UnauthorizedBasic(_) => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(crate::sources::basic::CHALLENGE),
                );
            }
            _ => {}
        }
        response
    }
}

/// Whether a database error means "the state database is unavailable" (answered 503 + Retry-After)
/// rather than a bug (500): pool acquire timeout, I/O or TLS failure, a connection-class,
/// shutdown-class or resource-class SQLSTATE (08, 57P, 53), or intake's own server-side bounds firing
/// (55P03 lock_timeout, 57014 statement_timeout): the sender should retry later.
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            crate::sqlstate::is_connection_exception(&c)
                || c.starts_with("57P")
                || c.starts_with("53")
                || crate::sqlstate::is_timeout(&c)
        }),
        _ => false,
    }
}

/// Whether a database error means "the client sent text PostgreSQL cannot store" (answered 422):
/// a NUL character (`\u0000`) in a text value (SQLSTATE 22021, `invalid byte sequence for encoding
/// "UTF8": 0x00`) or in a `jsonb` value (22P05, `unsupported Unicode escape sequence`). Any JSON
/// string field or query parameter can carry one; the statement fails, so nothing is stored.
pub fn is_unstorable_text(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            c == crate::sqlstate::CHARACTER_NOT_IN_REPERTOIRE
                || c == crate::sqlstate::UNTRANSLATABLE_CHARACTER
        }),
        _ => false,
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        if is_unstorable_text(&e) {
            Self::Unprocessable(
                "a text field or query parameter contains a NUL character (U+0000), which cannot be stored"
                    .into(),
            )
        } else if is_unavailable(&e) {
            Self::db_unavailable(format!("the state database is unavailable: {e}"))
        } else {
            Self::Internal(e.to_string())
        }
    }
}

impl From<IntakeError> for ApiError {
    fn from(e: IntakeError) -> Self {
        match e {
            IntakeError::Mismatch { .. } => Self::IdempotencyMismatch(e.to_string()),
            IntakeError::Race => {
                Self::db_unavailable("too many concurrent identical requests; retry")
            }
            IntakeError::Db(db) => db.into(),
            IntakeError::Unconfirmed(_) => Self::db_unavailable(e.to_string()),
        }
    }
}
