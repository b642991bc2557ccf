//! The error responses every operator route documents besides its own, written once for the
//! OpenAPI spec ([`utoipa::IntoResponses`]; listed in a route's `responses(...)` after its own
//! tuples). Each is an RFC 9457 [`Problem`] as `application/problem+json`, rendered by
//! [`super::error::ApiError`]; these types only describe them.

use super::error::Problem;

/// 401, 403 and 503 of an operator route any operator token may call (the read-only role
/// included).
#[derive(utoipa::IntoResponses)]
pub enum ReadErrors {
    /// No `Authorization: Bearer` header, or a token that is not an operator token.
    #[response(
        status = 401,
        description = "Missing or wrong operator token",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    /// Operator routes are closed until an operator token exists.
    #[response(
        status = 403,
        description = "No operator token exists (no DEPROV_OPERATOR_TOKEN, no `deprov tokens` token)",
        content_type = "application/problem+json"
    )]
    NoOperatorToken(Problem),
    /// The state database did not answer within the route's bounds.
    #[response(
        status = 503,
        description = "State database unavailable",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))
    )]
    Unavailable(Problem),
}

/// 401, 403 and 503 of an operator route that changes something: a `read-only` token is refused.
#[derive(utoipa::IntoResponses)]
pub enum WriteErrors {
    /// No `Authorization: Bearer` header, or a token that is not an operator token.
    #[response(
        status = 401,
        description = "Missing or wrong operator token",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    /// A `read-only` token, or operator routes closed because no operator token exists.
    #[response(
        status = 403,
        description = "A read-only token, or no operator token exists (no DEPROV_OPERATOR_TOKEN, no `deprov tokens` token)",
        content_type = "application/problem+json"
    )]
    ReadOnlyOrNoOperatorToken(Problem),
    /// The state database did not answer within the route's bounds.
    #[response(
        status = 503,
        description = "State database unavailable",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))
    )]
    Unavailable(Problem),
}
