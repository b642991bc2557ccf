//! Extractors whose rejections are [`ApiError`]s (so every refusal is problem+json), and the
//! `Idempotency-Key` header.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The `Idempotency-Key` request header (IETF draft-ietf-httpapi-idempotency-key-header).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Longest accepted `Idempotency-Key`, in bytes.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// Whether the request declares a JSON body: `application/json` or any `application/*+json`.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Parses a JSON object body: 415 unless declared JSON, 400 for malformed JSON, 422 for well-formed
/// JSON that is not an object or does not fit `T` (missing, mistyped or unknown fields). Every body
/// this API takes is an object; serde would otherwise also read a struct from a JSON array
/// (`["t1"]`), which the spec does not allow.
///
/// # Errors
/// [`ApiError::UnsupportedMediaType`], [`ApiError::BadRequest`] or [`ApiError::Unprocessable`].
pub fn parse_json<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType(
            "expected `Content-Type: application/json`".into(),
        ));
    }
    let classify = |e: serde_json::Error| match e.classify() {
        serde_json::error::Category::Data => {
            ApiError::Unprocessable(format!("invalid request body: {e}"))
        }
        _ => ApiError::BadRequest(format!("malformed JSON body: {e}")),
    };
    if body.trim_ascii_start().first() != Some(&b'{') {
        // Not an object: 400 if it is not JSON at all, else 422.
        serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(classify)?;
        return Err(ApiError::Unprocessable(
            "invalid request body: expected a JSON object".into(),
        ));
    }
    serde_json::from_slice(body).map_err(classify)
}

/// The 422 for a NUL character, which PostgreSQL cannot store in text (see
/// [`super::error::is_unstorable_text`], the same refusal for any input that reaches the database).
fn nul_refusal(what: &str) -> ApiError {
    ApiError::Unprocessable(format!(
        "{what} contains a NUL character (U+0000), which cannot be stored"
    ))
}

async fn body_bytes<S: Send + Sync>(
    req: Request,
    state: &S,
) -> Result<(HeaderMap, Bytes), ApiError> {
    let headers = req.headers().clone();
    let bytes = Bytes::from_request(req, state)
        .await
        .map_err(|r| ApiError::from_rejection(r.status(), r.body_text()))?;
    Ok((headers, bytes))
}

/// A required JSON body (see [`parse_json`]); a body over `[intake] max_body_bytes` is 413.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (headers, bytes) = body_bytes(req, state).await?;
        parse_json(&headers, &bytes).map(Self)
    }
}

/// An optional JSON body: an empty body or JSON `null` is `T::default()`, anything else as
/// [`ApiJson`].
#[derive(Debug)]
pub struct OptionalJson<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (headers, bytes) = body_bytes(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        if is_json(&headers) && bytes.trim_ascii() == b"null" {
            return Ok(Self(T::default()));
        }
        parse_json(&headers, &bytes).map(Self)
    }
}

/// `axum::extract::Path` with problem+json rejections (400).
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Self(p.0))
            .map_err(|r| ApiError::from_rejection(r.status(), r.body_text()))
    }
}

/// `axum::extract::Query` with problem+json rejections (400; 422 for a NUL character, `%00`).
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        if parts.uri.query().is_some_and(|q| q.contains("%00")) {
            return Err(nul_refusal("the query string"));
        }
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Self(q.0))
            .map_err(|r| ApiError::from_rejection(r.status(), r.body_text()))
    }
}

/// The optional `Idempotency-Key` header: 1..=255 printable ASCII characters (0x20..=0x7E). A value
/// sent as a structured-field string (`"abc"`, as the IETF draft specifies) and the bare `abc` are
/// the same key; `""` is the two-character key (so the spec's pattern, at least one visible
/// character, is exact). HTTP strips a value's surrounding spaces, so all-space keys arrive empty.
///
/// # Errors
/// [`ApiError::Unprocessable`] for an empty, over-long or non-printable key, or a repeated header.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(raw) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::Unprocessable(
            "Idempotency-Key must be sent once".into(),
        ));
    }
    let bad = || {
        ApiError::Unprocessable(format!(
            "Idempotency-Key must be 1..={MAX_IDEMPOTENCY_KEY_LEN} printable ASCII characters"
        ))
    };
    let text = raw.to_str().map_err(|_| bad())?;
    let key = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .filter(|inner| !inner.is_empty())
        .unwrap_or(text);
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY_LEN
        || !key.bytes().all(|b| (0x20..=0x7e).contains(&b))
    {
        return Err(bad());
    }
    Ok(Some(key.to_owned()))
}
