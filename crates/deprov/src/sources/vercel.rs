//! Vercel integration webhooks (`x-vercel-signature: <hex>`), per vercel.com/docs/webhooks and
//! vercel/example-marketplace-integration.
//!
//! - Key: the integration's client secret as UTF-8 bytes. Signed content: the raw body, HMAC-SHA1
//!   (40 hex digits).
//! - No timestamp is signed: replays are caught by deduplication on the body's `id`.

use axum::http::HeaderMap;
use sha1::Sha1;

use super::{Reject, any_matches, hmac_tag, required};

/// The signature header.
pub const SIGNATURE: &str = "x-vercel-signature";

/// Decodes an `x-vercel-signature` value.
///
/// # Errors
/// [`Reject::Malformed`] unless it is 40 hex digits.
pub fn parse(value: &str) -> Result<Vec<u8>, Reject> {
    Some(value)
        .filter(|h| h.len() == 40)
        .and_then(|h| hex::decode(h).ok())
        .ok_or(Reject::Malformed(SIGNATURE))
}

/// Verifies a delivery (see the module docs).
///
/// # Errors
/// [`Reject`].
pub fn verify(keys: &[Vec<u8>], headers: &HeaderMap, body: &[u8]) -> Result<(), Reject> {
    let tag = parse(required(headers, SIGNATURE)?)?;
    if any_matches::<Sha1>(keys, &[body], &[tag]) {
        Ok(())
    } else {
        Err(Reject::Mismatch)
    }
}

/// The `x-vercel-signature` value for a body: for tests and clients.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    hex::encode(hmac_tag::<Sha1>(secret, &[body]))
}
