//! Shopify (`X-Shopify-Hmac-Sha256: <base64>`), per shopify.dev "Verify webhooks".
//!
//! - Key: the app's client secret as UTF-8 bytes. Signed content: the raw body, HMAC-SHA256, base64.
//! - No timestamp is signed: replays are caught by deduplication on `X-Shopify-Event-Id` (the same
//!   on every retry of one event). After a secret rotation Shopify may sign with the old secret for an
//!   hour: configure both.

use axum::http::HeaderMap;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::Sha256;

use super::{Reject, any_matches, hmac_tag, required};

/// The signature header.
pub const SIGNATURE: &str = "x-shopify-hmac-sha256";
/// The event ID header: equal on duplicates (default dedup key).
pub const EVENT_ID: &str = "x-shopify-event-id";
/// The topic header (`shop/redact`, …): the event type.
pub const TOPIC: &str = "x-shopify-topic";

/// Decodes an `X-Shopify-Hmac-Sha256` value.
///
/// # Errors
/// [`Reject::Malformed`] unless it is base64 of 32 bytes.
pub fn parse(value: &str) -> Result<Vec<u8>, Reject> {
    STANDARD
        .decode(value)
        .ok()
        .filter(|t| t.len() == 32)
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

/// The `X-Shopify-Hmac-Sha256` value for a body: for tests and clients.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    STANDARD.encode(hmac_tag::<Sha256>(secret, &[body]))
}
