//! GitHub (`X-Hub-Signature-256: sha256=<hex>`), per docs.github.com "Validating webhook deliveries".
//!
//! - Key: the webhook secret as UTF-8 bytes. Signed content: the raw body, HMAC-SHA256.
//! - No timestamp is signed and none is documented: replays are caught by deduplication on
//!   `X-GitHub-Delivery` (the same on a manual redelivery). The legacy SHA-1 `X-Hub-Signature` is not
//!   accepted.

use axum::http::HeaderMap;
use sha2::Sha256;

use super::{Reject, any_matches, hmac_tag, required};

/// The signature header.
pub const SIGNATURE: &str = "x-hub-signature-256";
/// The delivery ID header (default dedup key).
pub const DELIVERY: &str = "x-github-delivery";
/// The event name header (`installation`, …).
pub const EVENT: &str = "x-github-event";

/// Decodes an `X-Hub-Signature-256` value.
///
/// # Errors
/// [`Reject::Malformed`] unless it is `sha256=` followed by 64 hex digits.
pub fn parse(value: &str) -> Result<Vec<u8>, Reject> {
    value
        .strip_prefix("sha256=")
        .filter(|h| h.len() == 64)
        .and_then(|h| hex::decode(h).ok())
        .ok_or(Reject::Malformed(SIGNATURE))
}

/// Verifies a delivery (see the module docs).
///
/// # Errors
/// [`Reject`].
pub fn verify(keys: &[Vec<u8>], headers: &HeaderMap, body: &[u8]) -> Result<(), Reject> {
    let tag = parse(required(headers, SIGNATURE)?)?;
    if any_matches::<Sha256>(keys, &[body], &[tag]) {
        Ok(())
    } else {
        Err(Reject::Mismatch)
    }
}

/// The `X-Hub-Signature-256` value for a body: for tests and clients.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    format!(
        "sha256={}",
        hex::encode(hmac_tag::<Sha256>(secret, &[body]))
    )
}
