//! Property tests: an SNS message with any byte of any signed field changed, or of its signature,
//! never verifies, in both signature versions.

use proptest::prelude::*;

use super::sns::{Message, parse, verify_signature};
use super::tests::sns_messages::{confirmation, marketplace, test_key, test_public_key};

/// The signed text fields of `m`, by index (for a confirmation also `SubscribeURL` and `Token`).
fn field(m: &mut Message, index: usize) -> Option<&mut String> {
    match index {
        0 => Some(&mut m.message),
        1 => Some(&mut m.message_id),
        2 => m.subject.as_mut(),
        3 => Some(&mut m.timestamp),
        4 => Some(&mut m.topic_arn),
        5 => m.subscribe_url.as_mut(),
        _ => m.token.as_mut(),
    }
}

/// The four signed messages (version 1 and 2, notification and confirmation), signed once.
fn signed(sha256: bool, confirm: bool) -> Message {
    static SIGNED: std::sync::OnceLock<Vec<Message>> = std::sync::OnceLock::new();
    let all = SIGNED.get_or_init(|| {
        [(false, false), (false, true), (true, false), (true, true)]
            .into_iter()
            .map(|(v2, c)| sign_one(v2, c))
            .collect()
    });
    all[usize::from(sha256) * 2 + usize::from(confirm)].clone()
}

fn sign_one(sha256: bool, confirm: bool) -> Message {
    let mut m = if confirm {
        confirmation(sha256)
    } else {
        marketplace(sha256)
    };
    if !confirm {
        m.subject = Some("AWS Marketplace".into());
    }
    let sig = super::sns::sign(&test_key(), &m);
    m.signature = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, sig).unwrap();
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Replacing one character of any signed field with another printable ASCII character.
    #[test]
    fn a_changed_byte_of_a_signed_field_never_verifies(
        sha256 in any::<bool>(),
        confirm in any::<bool>(),
        index in 0usize..7,
        at in any::<prop::sample::Index>(),
        replacement in 0x20u8..0x7f,
    ) {
        let public = test_public_key();
        let mut m = signed(sha256, confirm);
        prop_assert!(verify_signature(&public, &m).is_ok());
        let Some(text) = field(&mut m, index) else { return Ok(()) };
        let mut bytes = text.clone().into_bytes();
        let i = at.index(bytes.len());
        prop_assume!(bytes[i] != replacement && bytes[i].is_ascii());
        bytes[i] = replacement;
        *text = String::from_utf8(bytes).unwrap();
        prop_assert!(verify_signature(&public, &m).is_err());
    }

    /// Flipping bits of one byte of the signature.
    #[test]
    fn a_changed_signature_byte_never_verifies(
        sha256 in any::<bool>(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let public = test_public_key();
        let mut m = signed(sha256, false);
        let i = at.index(m.signature.len());
        m.signature[i] ^= flip;
        prop_assert!(verify_signature(&public, &m).is_err());
    }

    /// The envelope parser takes any bytes without panicking.
    #[test]
    fn any_body_parses_or_is_refused(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&body);
    }
}
