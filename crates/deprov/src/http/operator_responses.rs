//! The error responses every operator route documents besides its own, written once for the
//! OpenAPI spec ([`utoipa::IntoResponses`]; listed in a route's `responses(...)` after its own
//! tuples: [`Unauthorized`], [`NoOperatorToken`] or [`ReadOnly`], and [`Unavailable`]). Each is an
//! RFC 9457 [`Problem`] as `application/problem+json`, rendered by [`super::error::ApiError`];
//! these types only describe them.

use super::error::Problem;

/// 401: no `Authorization: Bearer` header, or a token that is not an operator token.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 401,
    description = "Missing or wrong operator token",
    content_type = "application/problem+json"
)]
pub struct Unauthorized(pub Problem);

/// 403 of a route any operator token may call: operator routes are closed until an operator token
/// exists.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 403,
    description = "No operator token exists (no DEPROV_OPERATOR_TOKEN, no `deprov tokens` token)",
    content_type = "application/problem+json"
)]
pub struct NoOperatorToken(pub Problem);

/// 403 of a route that changes something: a `read-only` token, or no operator token exists.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 403,
    description = "A read-only token, or no operator token exists (no DEPROV_OPERATOR_TOKEN, no `deprov tokens` token)",
    content_type = "application/problem+json"
)]
pub struct ReadOnly(pub Problem);

/// 503: the state database did not answer within the route's bounds.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 503,
    description = "State database unavailable",
    content_type = "application/problem+json",
    headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))
)]
pub struct Unavailable(pub Problem);
