//! Stripe (`Stripe-Signature: t=…,v1=…[,v1=…][,v0=…]`), as stripe-python's `WebhookSignature`.
//!
//! - Key: the whole `whsec_…` string as UTF-8 bytes (not base64-decoded).
//! - Signed content: `"{t}.{raw body}"`, HMAC-SHA256, hex in each `v1=` entry; any may match (several
//!   during a secret roll); other schemes (`v0`) are ignored.
//! - `t` is refused beyond the tolerance (300 s) in the past — and, unlike stripe-python, in the future.

use std::time::Duration;

use axum::http::HeaderMap;
use sha2::Sha256;

use super::{Reject, any_matches, check_timestamp, hmac_tag, required};

/// The signature header.
pub const SIGNATURE: &str = "stripe-signature";

/// A parsed `Stripe-Signature` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header<'a> {
    /// The `t=` value, as sent (digits).
    pub t: &'a str,
    /// Every `v1=` value, hex-decoded (undecodable entries skipped).
    pub v1: Vec<Vec<u8>>,
}

/// Parses a `Stripe-Signature` value: comma-separated `key=value`; exactly one `t`, at least one
/// decodable `v1`.
///
/// # Errors
/// [`Reject::Malformed`].
pub fn parse(value: &str) -> Result<Header<'_>, Reject> {
    let mut t = None;
    let mut v1 = Vec::new();
    for item in value.split(',') {
        let Some((k, v)) = item.trim().split_once('=') else {
            continue;
        };
        match k {
            "t" if t.is_none() => t = Some(v),
            "t" => return Err(Reject::Malformed(SIGNATURE)),
            "v1" => {
                if let Ok(sig) = hex::decode(v) {
                    v1.push(sig);
                }
            }
            _ => {}
        }
    }
    match t {
        Some(t) if !v1.is_empty() => Ok(Header { t, v1 }),
        _ => Err(Reject::Malformed(SIGNATURE)),
    }
}

/// Verifies a delivery (see the module docs).
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
    let parsed = parse(required(headers, SIGNATURE)?)?;
    check_timestamp(parsed.t, SIGNATURE, now, tolerance)?;
    if any_matches::<Sha256>(keys, &[parsed.t.as_bytes(), b".", body], &parsed.v1) {
        Ok(())
    } else {
        Err(Reject::Mismatch)
    }
}

/// The `Stripe-Signature` value for a delivery: for tests and clients.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let t = timestamp.to_string();
    let tag = hmac_tag::<Sha256>(secret, &[t.as_bytes(), b".", body]);
    format!("t={t},v1={}", hex::encode(tag))
}
