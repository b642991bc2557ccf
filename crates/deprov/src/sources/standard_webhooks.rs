//! Standard Webhooks (standardwebhooks.com, spec `standard-webhooks.md`, symmetric `v1`).
//!
//! - Key: the secret without its optional `whsec_` prefix, base64-decoded (standard alphabet,
//!   padding required, as the reference Rust library); empty = invalid.
//! - Signed content: `"{webhook-id}.{webhook-timestamp}.{raw body}"`, HMAC-SHA256.
//! - `webhook-signature`: space-separated `version,base64` entries; only `v1` entries are checked
//!   (any may match); others (`v1a` asymmetric, `v2`, …) are ignored.
//! - `webhook-timestamp`: Unix seconds, refused beyond the tolerance in either direction (300 s).

use std::time::Duration;

use axum::http::HeaderMap;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::Sha256;

use super::{Reject, any_matches, check_timestamp, hmac_tag, required};

/// The delivery ID header (also the default dedup key).
pub const ID: &str = "webhook-id";
/// The Unix-seconds timestamp header.
pub const TIMESTAMP: &str = "webhook-timestamp";
/// The signature header.
pub const SIGNATURE: &str = "webhook-signature";

/// Derives the HMAC key from a `whsec_…` secret.
///
/// # Errors
/// A reason when the secret is empty or not base64.
pub fn derive_key(secret: &str) -> Result<Vec<u8>, String> {
    let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = STANDARD
        .decode(b64)
        .map_err(|_| "a standard-webhooks secret is `whsec_` + base64".to_owned())?;
    if key.is_empty() {
        return Err("the secret is empty".into());
    }
    Ok(key)
}

/// The `v1` signatures of a `webhook-signature` value, decoded; entries that are not
/// `v1,<base64>` are skipped.
pub fn parse_signatures(value: &str) -> Vec<Vec<u8>> {
    value
        .split(' ')
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == "v1")
        .filter_map(|(_, sig)| STANDARD.decode(sig).ok())
        .filter(|sig| !sig.is_empty())
        .collect()
}

/// Verifies a delivery (see the module docs).
///
/// # Errors
/// [`Reject`]: a header missing or malformed, the timestamp outside the tolerance, or no match.
pub fn verify(
    keys: &[Vec<u8>],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
    tolerance: Duration,
) -> Result<(), Reject> {
    let id = required(headers, ID)?;
    let ts = required(headers, TIMESTAMP)?;
    let sig = required(headers, SIGNATURE)?;
    check_timestamp(ts, TIMESTAMP, now, tolerance)?;
    let tags = parse_signatures(sig);
    if tags.is_empty() {
        return Err(Reject::Malformed(SIGNATURE));
    }
    let message = [id.as_bytes(), b".", ts.as_bytes(), b".", body];
    if any_matches::<Sha256>(keys, &message, &tags) {
        Ok(())
    } else {
        Err(Reject::Mismatch)
    }
}

/// The `webhook-signature` value (`v1,<base64>`) for a delivery: for tests and clients.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let tag = hmac_tag::<Sha256>(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    format!("v1,{}", STANDARD.encode(tag))
}
