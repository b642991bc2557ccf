//! Signed senders: how each `[sources.NAME]` scheme authenticates a delivery, and how a verified
//! payload names its event, tenant and deduplication key.
//!
//! One small module per scheme, each a pure function over the header map, the **raw body bytes** and
//! the current Unix time, so every rule is testable without a server:
//! [`standard_webhooks`], [`stripe`], [`github`], [`shopify`], [`slack`], [`vercel`] (the
//! `x-vercel-signature` webhook), [`basic`] (HTTP Basic), [`oidc`] (`vercel-oidc`, the partner
//! API's JWTs, and the JWKS verifier `jwt` shares), [`jwt`] (any OIDC/JWT bearer sender),
//! [`atlassian`] (Atlassian Connect lifecycle hooks, verified by [`atlassian_keys`]) and [`sns`]
//! (`aws-sns`, RSA signatures with AWS's certificate, fetched by [`sns_certs`]); the last three are
//! async. HMACs are
//! checked with `hmac`'s constant-time `verify_slice`, against every configured secret (rotation: any
//! may match) and every signature the header carries, without stopping at the first match.
//! [`decode`] unwraps a payload held in a string field; [`payload`] reads the event type, tenant and
//! dedup key from a verified delivery; [`settings`] is the `[sources.NAME]` table.

pub mod age;
pub mod atlassian;
pub mod atlassian_keys;
pub mod basic;
pub mod decode;
pub mod github;
pub mod jwt;
pub mod oidc;
pub mod payload;
pub mod prepare;
pub mod scheme;
pub mod settings;
pub mod shopify;
pub mod slack;
pub mod sns;
pub mod sns_certs;
pub mod sns_config;
pub mod standard_webhooks;
pub mod stripe;
pub mod vercel;

use std::time::Duration;

use axum::http::HeaderMap;
use hmac::{EagerHash, Hmac, KeyInit, Mac};

pub use settings::{
    Dedup, InvalidSource, Locator, ReinstallScope, SOURCE_KEYS, Scheme, Secrets, SourceConfig,
};

/// Default timestamp tolerance of the schemes that sign a timestamp (standard-webhooks, Stripe,
/// Slack): 5 minutes, in the past and in the future. All three document 300 s.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Longest signature-carrying header value read, in bytes (longer = malformed).
pub const MAX_SIGNATURE_HEADER_LEN: usize = 4096;

/// Why a delivery was refused. Every variant is answered 401 with a problem+json body; the message
/// names the header, never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// A required header is absent.
    #[error("missing header {0}")]
    Missing(&'static str),
    /// A header is present but unparseable, empty or too long.
    #[error("malformed header {0}")]
    Malformed(&'static str),
    /// A header that must appear once appears more than once (none of its values is used).
    #[error("repeated {} header", header_title(.0))]
    Repeated(&'static str),
    /// The signed timestamp is older than the tolerance.
    #[error("timestamp too old (tolerance {0} s)")]
    Stale(u64),
    /// The signed timestamp is further in the future than the tolerance.
    #[error("timestamp too far in the future (tolerance {0} s)")]
    Future(u64),
    /// No signature matches any configured secret.
    #[error("no signature matches")]
    Mismatch,
    /// HTTP Basic credentials that are not the configured user name and one of the passwords.
    #[error("wrong user name or password")]
    WrongCredentials,
    /// `timestamp` names no readable timestamp in the body (the pointer, as configured).
    #[error(
        "no timestamp at {0:?} in the body (an RFC 3339 string, or Unix seconds or milliseconds)"
    )]
    NoTimestamp(String),
    /// The body's timestamp is older than `max_age` (its seconds).
    #[error("delivery older than max_age ({0} s)")]
    TooOld(u64),
    /// The body's timestamp is further than `max_age` (its seconds) in the future.
    #[error("delivery timestamp more than max_age ({0} s) in the future")]
    TooNew(u64),
}

/// A lowercase header name as it is usually written: `authorization` → `Authorization`,
/// `x-hub-signature-256` → `X-Hub-Signature-256`.
pub fn header_title(name: &str) -> String {
    name.split('-')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// The value of header `name` as text: `Ok(None)` when absent, [`Reject::Repeated`] when sent more
/// than once, [`Reject::Malformed`] when empty, not visible ASCII, or longer than
/// [`MAX_SIGNATURE_HEADER_LEN`].
///
/// # Errors
/// [`Reject::Repeated`] or [`Reject::Malformed`].
pub fn header<'h>(headers: &'h HeaderMap, name: &'static str) -> Result<Option<&'h str>, Reject> {
    let mut all = headers.get_all(name).iter();
    let Some(value) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(Reject::Repeated(name));
    }
    if value.len() > MAX_SIGNATURE_HEADER_LEN {
        return Err(Reject::Malformed(name));
    }
    let text = value.to_str().map_err(|_| Reject::Malformed(name))?.trim();
    if text.is_empty() {
        return Err(Reject::Malformed(name));
    }
    Ok(Some(text))
}

/// [`header`], absent = [`Reject::Missing`].
///
/// # Errors
/// [`Reject::Missing`], [`Reject::Repeated`] or [`Reject::Malformed`].
pub fn required<'h>(headers: &'h HeaderMap, name: &'static str) -> Result<&'h str, Reject> {
    header(headers, name)?.ok_or(Reject::Missing(name))
}

/// Parses a decimal Unix timestamp (seconds) and checks it lies within `tolerance` of `now`, both ways.
///
/// # Errors
/// [`Reject::Malformed`] (named `name`), [`Reject::Stale`] or [`Reject::Future`].
pub fn check_timestamp(
    raw: &str,
    name: &'static str,
    now: i64,
    tolerance: Duration,
) -> Result<i64, Reject> {
    if raw.is_empty() || raw.len() > 12 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Reject::Malformed(name));
    }
    let ts: i64 = raw.parse().map_err(|_| Reject::Malformed(name))?;
    let tol = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if ts < now.saturating_sub(tol) {
        return Err(Reject::Stale(tolerance.as_secs()));
    }
    if ts > now.saturating_add(tol) {
        return Err(Reject::Future(tolerance.as_secs()));
    }
    Ok(ts)
}

/// Whether HMAC-`D`(`key`, concatenation of `message`) equals `tag`, compared in constant time
/// (`Mac::verify_slice`). A tag of the wrong length never matches.
pub fn hmac_matches<D>(key: &[u8], message: &[&[u8]], tag: &[u8]) -> bool
where
    D: EagerHash,
{
    let Ok(mut mac) = <Hmac<D> as KeyInit>::new_from_slice(key) else {
        return false;
    };
    for part in message {
        mac.update(part);
    }
    mac.verify_slice(tag).is_ok()
}

/// HMAC-`D`(`key`, concatenation of `message`): for signing in tests and clients.
pub fn hmac_tag<D>(key: &[u8], message: &[&[u8]]) -> Vec<u8>
where
    D: EagerHash,
{
    let Ok(mut mac) = <Hmac<D> as KeyInit>::new_from_slice(key) else {
        return Vec::new();
    };
    for part in message {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

/// Whether any of `tags` is a valid HMAC-`D` under any of `keys`. Every pair is checked (no early
/// exit), so the time taken does not reveal which secret or signature matched.
pub fn any_matches<D>(keys: &[Vec<u8>], message: &[&[u8]], tags: &[Vec<u8>]) -> bool
where
    D: EagerHash,
{
    let mut ok = false;
    for key in keys {
        for tag in tags {
            ok |= hmac_matches::<D>(key, message, tag);
        }
    }
    ok
}

/// Verifies a delivery for one of the HMAC schemes (`bearer` and `vercel-oidc` are checked
/// elsewhere). `keys` are the source's derived keys ([`Scheme::derive_key`]); `now` is Unix seconds.
///
/// # Errors
/// [`Reject`] — always 401 at the HTTP edge.
pub fn verify_hmac(
    scheme: Scheme,
    keys: &[Vec<u8>],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
    tolerance: Duration,
) -> Result<(), Reject> {
    match scheme {
        Scheme::StandardWebhooks => standard_webhooks::verify(keys, headers, body, now, tolerance),
        Scheme::Stripe => stripe::verify(keys, headers, body, now, tolerance),
        Scheme::Github => github::verify(keys, headers, body),
        Scheme::Shopify => shopify::verify(keys, headers, body),
        Scheme::Slack => slack::verify(keys, headers, body, now, tolerance),
        Scheme::VercelWebhook => vercel::verify(keys, headers, body),
        Scheme::Bearer
        | Scheme::VercelOidc
        | Scheme::Basic
        | Scheme::Jwt
        | Scheme::AtlassianConnect
        | Scheme::AwsSns => Err(Reject::Mismatch),
    }
}

/// The current Unix time in seconds.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod proptests_basic;
#[cfg(test)]
mod proptests_jwt;
#[cfg(test)]
mod proptests_oidc;
#[cfg(test)]
mod proptests_sns;
#[cfg(test)]
mod tests;
