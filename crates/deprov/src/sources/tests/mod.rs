//! Every published (and locally derived) vector in `tests/fixtures/webhooks/` (a copy of
//! `../shared/fixtures/webhooks/`), each scheme's negative cases, and the standard-webhooks reference
//! crate as an oracle.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::*;

mod decode_layers;
mod key_age;
pub(super) mod sns_messages;
mod source_config;
mod timed;
mod token_config;
mod untimed;

pub(super) const TOL: Duration = DEFAULT_TOLERANCE;

pub(super) fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/webhooks/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The value after `label` on the first line starting with it.
pub(super) fn field<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?}"))
        .trim()
}

pub(super) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

pub(super) fn key(scheme: Scheme, secret: &str) -> Vec<Vec<u8>> {
    vec![scheme.derive_key(secret).unwrap()]
}
