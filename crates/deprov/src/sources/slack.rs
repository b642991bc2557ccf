//! Slack (`X-Slack-Signature: v0=<hex>`, `X-Slack-Request-Timestamp`), per api.slack.com
//! "Verifying requests from Slack".
//!
//! - Key: the app's signing secret as UTF-8 bytes.
//! - Signed content: `"v0:{timestamp}:{raw body}"`, HMAC-SHA256, hex after `v0=`.
//! - The timestamp is refused beyond the tolerance (Slack: five minutes) in either direction.

use std::time::Duration;

use axum::http::HeaderMap;
use sha2::Sha256;

use super::{Reject, any_matches, check_timestamp, hmac_tag, required};

/// The signature header.
pub const SIGNATURE: &str = "x-slack-signature";
/// The Unix-seconds timestamp header.
pub const TIMESTAMP: &str = "x-slack-request-timestamp";

/// Decodes an `X-Slack-Signature` value.
///
/// # Errors
/// [`Reject::Malformed`] unless it is `v0=` followed by 64 hex digits.
pub fn parse(value: &str) -> Result<Vec<u8>, Reject> {
    value
        .strip_prefix("v0=")
        .filter(|h| h.len() == 64)
        .and_then(|h| hex::decode(h).ok())
        .ok_or(Reject::Malformed(SIGNATURE))
}

/// Verifies a request (see the module docs).
///
/// # Errors
/// [`Reject`].
pub fn verify(
    keys: &[Vec<u8>],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
    tolerance: Duration,
) -> Result<(), Reject> {
    let ts = required(headers, TIMESTAMP)?;
    let tag = parse(required(headers, SIGNATURE)?)?;
    check_timestamp(ts, TIMESTAMP, now, tolerance)?;
    if any_matches::<Sha256>(keys, &[b"v0:", ts.as_bytes(), b":", body], &[tag]) {
        Ok(())
    } else {
        Err(Reject::Mismatch)
    }
}

/// The `X-Slack-Signature` value for a request: for tests and clients.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let tag = hmac_tag::<Sha256>(secret, &[b"v0:", ts.as_bytes(), b":", body]);
    format!("v0={}", hex::encode(tag))
}
