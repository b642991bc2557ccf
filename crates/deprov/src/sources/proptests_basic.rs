//! Property tests of `scheme = "basic"`: the parser takes arbitrary text without panicking, the
//! configured credentials always verify, and a changed byte of the password (or user-id) never does.

use axum::http::{HeaderMap, HeaderValue};
use proptest::prelude::*;

use super::Reject;
use super::basic::{AUTHORIZATION, header_value, parse, verify};

fn headers(value: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(AUTHORIZATION, v);
    }
    h
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_parser_takes_arbitrary_text(value in ".{0,300}") {
        let _ = parse(&value);
        let _ = parse(&format!("Basic {value}"));
    }

    /// Arbitrary bytes as the base64 token: never verifies against a password that was not sent.
    #[test]
    fn arbitrary_tokens_never_verify(token in "[A-Za-z0-9+/=]{0,200}") {
        let h = headers(&format!("Basic {token}"));
        let passwords = vec![b"the-real-password-0123".to_vec()];
        let sent = parse(&format!("Basic {token}")).ok();
        let would_match = sent.as_ref().is_some_and(|(u, p)| u == "platform" && p == "the-real-password-0123");
        prop_assert_eq!(verify("platform", &passwords, &h).is_ok(), would_match);
    }

    /// The configured user-id and password verify, among rotated passwords in any position; one
    /// byte of the password or the user-id changed never does.
    #[test]
    fn a_changed_byte_never_verifies(
        user in "[!-9;-~]{1,40}",
        password in proptest::collection::vec(any::<u8>(), 1..80),
        other in proptest::collection::vec(any::<u8>(), 1..80),
        first in any::<bool>(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        in_user in any::<bool>(),
    ) {
        // Passwords are text in a header: keep the bytes valid UTF-8.
        let password = String::from_utf8_lossy(&password).into_owned();
        let other = String::from_utf8_lossy(&other).into_owned();
        prop_assume!(other != password);
        let passwords = if first {
            vec![password.clone().into_bytes(), other.into_bytes()]
        } else {
            vec![other.into_bytes(), password.clone().into_bytes()]
        };
        prop_assert_eq!(verify(&user, &passwords, &headers(&header_value(&user, &password))), Ok(()));

        let (mut u, mut p) = (user.clone().into_bytes(), password.clone().into_bytes());
        let target = if in_user { &mut u } else { &mut p };
        let i = at.index(target.len());
        target[i] ^= flip;
        // The changed credentials, sent as bytes (a changed byte may make them invalid UTF-8: then
        // the header is malformed, which must be refused too).
        let mut raw = u.clone();
        raw.push(b':');
        raw.extend_from_slice(&p);
        use base64::Engine as _;
        let value = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(&raw));
        let result = verify(&user, &passwords, &headers(&value));
        prop_assert!(result.is_err(), "a changed byte verified: {:?}", result);
        let still_same = (u == user.as_bytes()) && p == password.as_bytes();
        prop_assert!(!still_same);
        if u.contains(&b':') || std::str::from_utf8(&raw).is_err() {
            // Parsed differently or not at all: refused either way.
            prop_assert!(matches!(result, Err(Reject::WrongCredentials | Reject::Malformed(_))));
        } else {
            prop_assert_eq!(result, Err(Reject::WrongCredentials));
        }
    }
}
