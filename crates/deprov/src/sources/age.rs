//! `[sources.NAME] timestamp` and `max_age`: the age of a delivery whose scheme signs the body but
//! no timestamp (GitHub, Shopify, Vercel webhooks), read from a timestamp inside the signed body.
//!
//! Those schemes' signatures cover the body alone, so a captured delivery verifies forever; one
//! whose delivery ID deprov never saw (sent before deprov ran, or recorded in another state
//! database) would be taken as new. A timestamp the sender writes into the body — Vercel's
//! `createdAt` (Unix milliseconds), a GitHub payload's `updated_at` (RFC 3339) — is covered by the
//! signature, so bounding its age bounds when a captured delivery can be replayed. A header is
//! never read for it: these schemes do not sign their headers.
//!
//! A value is read as an RFC 3339 string (`2026-12-04T10:00:00Z`), or as a number (or a string of
//! digits) of Unix seconds, or of Unix milliseconds from 10^11 on (10^11 s is the year 5138,
//! 10^11 ms is 1973).

use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::Reject;

/// From this value on, a numeric timestamp is in milliseconds (see the module docs).
const MILLIS_FROM: i64 = 100_000_000_000;

/// Checks that the timestamp at JSON pointer `pointer` of `body` lies within `max_age` of
/// `now_ms` (Unix milliseconds), past or future.
///
/// # Errors
/// [`Reject::NoTimestamp`] when the body is not JSON, or the pointer finds no value that reads as
/// a timestamp; [`Reject::TooOld`] or [`Reject::TooNew`] outside `max_age`.
pub fn check(pointer: &str, max_age: Duration, body: &[u8], now_ms: i64) -> Result<(), Reject> {
    let missing = || Reject::NoTimestamp(pointer.to_owned());
    let json: Value = serde_json::from_slice(body).map_err(|_| missing())?;
    let at = json
        .pointer(pointer)
        .and_then(unix_ms)
        .ok_or_else(missing)?;
    let max = i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
    if at < now_ms.saturating_sub(max) {
        return Err(Reject::TooOld(max_age.as_secs()));
    }
    if at > now_ms.saturating_add(max) {
        return Err(Reject::TooNew(max_age.as_secs()));
    }
    Ok(())
}

/// A JSON value as Unix milliseconds (see the module docs); `None` when it reads as no timestamp.
fn unix_ms(value: &Value) -> Option<i64> {
    let number = |n: i64| {
        (n >= 0).then(|| {
            if n >= MILLIS_FROM {
                n
            } else {
                n.saturating_mul(1000)
            }
        })
    };
    match value {
        Value::Number(n) => n.as_i64().and_then(number),
        Value::String(s)
            if !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_digit()) =>
        {
            s.parse().ok().and_then(number)
        }
        Value::String(s) => {
            let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
            i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{Duration, Reject, check};

    const NOW_MS: i64 = 1_764_842_400_000; // 2025-12-04T10:00:00Z
    const MAX: Duration = Duration::from_secs(300);

    fn at(body: &str) -> Result<(), Reject> {
        check("/createdAt", MAX, body.as_bytes(), NOW_MS)
    }

    #[test]
    fn milliseconds_seconds_and_rfc3339_within_max_age_are_taken() {
        assert_eq!(at(r#"{"createdAt": 1764842400000}"#), Ok(()));
        assert_eq!(at(r#"{"createdAt": 1764842160000}"#), Ok(()), "4 min old");
        assert_eq!(at(r#"{"createdAt": 1764842400}"#), Ok(()), "seconds");
        assert_eq!(at(r#"{"createdAt": "1764842400"}"#), Ok(()), "digits");
        assert_eq!(at(r#"{"createdAt": "2025-12-04T09:58:00Z"}"#), Ok(()));
        assert_eq!(at(r#"{"createdAt": "2025-12-04T11:02:00+01:00"}"#), Ok(()));
    }

    #[test]
    fn too_old_or_too_far_ahead_is_refused_with_max_age() {
        assert_eq!(
            at(r#"{"createdAt": 1764842099999}"#),
            Err(Reject::TooOld(300))
        );
        assert_eq!(
            at(r#"{"createdAt": "2025-12-04T09:54:59Z"}"#),
            Err(Reject::TooOld(300))
        );
        assert_eq!(
            at(r#"{"createdAt": 1764842700001}"#),
            Err(Reject::TooNew(300))
        );
        // A captured delivery a day later.
        assert_eq!(
            check(
                "/createdAt",
                MAX,
                br#"{"createdAt": 1764842400000}"#,
                NOW_MS + 86_400_000
            ),
            Err(Reject::TooOld(300))
        );
    }

    #[test]
    fn no_readable_timestamp_is_refused_naming_the_pointer() {
        let none = Err(Reject::NoTimestamp("/createdAt".into()));
        for body in [
            r#"{}"#,
            r#"{"createdAt": null}"#,
            r#"{"createdAt": -5}"#,
            r#"{"createdAt": 1.5e12}"#,
            r#"{"createdAt": "yesterday"}"#,
            r#"{"createdAt": ""}"#,
            r#"{"createdAt": {"t": 1}}"#,
            "not json",
        ] {
            assert_eq!(at(body), none, "{body}");
        }
    }
}
