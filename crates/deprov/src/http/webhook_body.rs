//! A verified webhook body made ready to read: the source's `decode` layers
//! ([`crate::sources::decode`]) applied, then its `timestamp`/`max_age` bound
//! ([`crate::sources::age`]) checked on the decoded document, so a timestamp inside a wrapped
//! payload can be reached.

use axum::body::Bytes;

use super::AppState;
use super::error::ApiError;
use crate::sources::{SourceConfig, age, decode, unix_now};

/// The body the event type, tenant and deduplication key are read from.
///
/// # Errors
/// 400 when a layer cannot be applied ([`decode::DecodeError`]); 401 when the body's timestamp is
/// absent or outside `max_age`. Nothing is stored either way.
pub(super) fn readable(
    state: &AppState,
    name: &str,
    source: &SourceConfig,
    body: Bytes,
) -> Result<Bytes, ApiError> {
    let body = match decode::apply(&source.decode, &body, state.config.intake.max_body_bytes) {
        Ok(None) => body,
        Ok(Some(decoded)) => Bytes::from(decoded),
        Err(e) => return Err(ApiError::BadRequest(format!("source {name}: {e}"))),
    };
    if let (Some(pointer), Some(max_age)) = (&source.timestamp, source.max_age) {
        age::check(pointer, max_age, &body, unix_now().saturating_mul(1000))
            .map_err(|r| ApiError::Unauthorized(format!("source {name}: {r}")))?;
    }
    Ok(body)
}
