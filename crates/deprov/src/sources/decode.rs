//! `[sources.NAME] decode`: payload decoding layers, applied to a verified JSON body before its
//! event type, tenant, deduplication key and `timestamp` are read.
//!
//! Some senders wrap their payload in a string field: Amazon SNS puts the publisher's JSON document
//! in the envelope's `Message` string, Google Pub/Sub push puts standard-base64 bytes in
//! `message.data`. Each layer names such a field with an RFC 6901 JSON pointer and how it is
//! encoded; the field's string is decoded and put in its place, so `/Message/action` reaches a
//! field of the wrapped document. Layers apply in order: a later one can point inside an earlier
//! one's result.
//!
//! ```toml
//! decode = [{ pointer = "/Message", as = "json" }]            # Amazon SNS
//! decode = [{ pointer = "/message/data", as = "base64-json" }] # Google Pub/Sub push
//! ```
//!
//! Bounded: at most [`MAX_LAYERS`] layers; the decoded document may not be larger (as JSON) than
//! `[intake] max_body_bytes` nor nest deeper than [`MAX_DEPTH`]. Any failure — the body not JSON, a
//! pointer naming no string, bad base64, a string that is not a JSON document — is a
//! [`DecodeError`], answered 400 with nothing stored.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde_json::Value;

/// Most layers one source may list.
pub const MAX_LAYERS: usize = 8;
/// Deepest nesting (objects and arrays) of a decoded document.
pub const MAX_DEPTH: usize = 64;

/// One decoding layer: `{ pointer = "/Message", as = "json" }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeLayer {
    /// RFC 6901 JSON pointer to a string field, starting with `/`.
    pub pointer: String,
    /// How the string is encoded.
    #[serde(rename = "as")]
    pub encoding: Encoding,
}

/// How a layer's string is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Encoding {
    /// A JSON document held as a string (SNS `Message`): parsed and put in place of the string.
    Json,
    /// Standard base64 (RFC 4648 §4, padded) of UTF-8 text: replaced by the text, as a string.
    Base64,
    /// Standard base64 of a JSON document (Google Pub/Sub push `message.data`): decoded, parsed and
    /// put in place of the string.
    Base64Json,
}

impl Encoding {
    fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Base64 => "base64",
            Self::Base64Json => "base64-json",
        }
    }
}

/// Why a body could not be decoded (answered 400 problem+json; nothing is stored).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The body itself is not JSON.
    #[error("the delivery's body is not valid JSON: {0}")]
    NotJson(String),
    /// The pointer names nothing, or a value that is not a string (`found` says what).
    #[error("decode {pointer:?} (as {encoding}): {found} there, not a string")]
    NotAString {
        /// The layer's pointer.
        pointer: String,
        /// The layer's encoding.
        encoding: &'static str,
        /// What the pointer names: `nothing`, `an object`, `a number`…
        found: &'static str,
    },
    /// The string is not standard base64.
    #[error("decode {pointer:?} (as {encoding}): not standard base64")]
    Base64 {
        /// The layer's pointer.
        pointer: String,
        /// The layer's encoding.
        encoding: &'static str,
    },
    /// `base64`: the decoded bytes are not UTF-8 text.
    #[error("decode {pointer:?} (as base64): the decoded bytes are not UTF-8 text")]
    NotText {
        /// The layer's pointer.
        pointer: String,
    },
    /// The (decoded) string is not a JSON document.
    #[error("decode {pointer:?} (as {encoding}): not a JSON document: {reason}")]
    NotJsonInside {
        /// The layer's pointer.
        pointer: String,
        /// The layer's encoding.
        encoding: &'static str,
        /// serde_json's reason.
        reason: String,
    },
    /// The decoded document is larger than the body limit (its bytes).
    #[error("the decoded body is larger than [intake] max_body_bytes ({0} bytes)")]
    TooLarge(usize),
    /// The decoded document nests deeper than [`MAX_DEPTH`].
    #[error("the decoded body nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

/// Checks a source's layers at load: at most [`MAX_LAYERS`], each pointer starting with `/`.
///
/// # Errors
/// The reason, for `sources.NAME.decode`.
pub fn check(layers: &[DecodeLayer]) -> Result<(), String> {
    if layers.len() > MAX_LAYERS {
        return Err(format!("at most {MAX_LAYERS} layers"));
    }
    match layers.iter().find(|l| !l.pointer.starts_with('/')) {
        Some(l) => Err(format!(
            "{:?} is not a JSON pointer to a field (it starts with `/`)",
            l.pointer
        )),
        None => Ok(()),
    }
}

fn kind(value: Option<&Value>) -> &'static str {
    match value {
        None => "nothing",
        Some(Value::Null) => "null",
        Some(Value::Bool(_)) => "a boolean",
        Some(Value::Number(_)) => "a number",
        Some(Value::String(_)) => "a string",
        Some(Value::Array(_)) => "an array",
        Some(Value::Object(_)) => "an object",
    }
}

/// How deeply `value` nests (a scalar is 0), walked without recursion.
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0_usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, d + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// Decodes one layer's string.
fn decode_one(layer: &DecodeLayer, text: &str) -> Result<Value, DecodeError> {
    let pointer = || layer.pointer.clone();
    let encoding = layer.encoding.as_str();
    let not_json = |e: serde_json::Error| DecodeError::NotJsonInside {
        pointer: pointer(),
        encoding,
        reason: e.to_string(),
    };
    let bytes = || {
        STANDARD.decode(text).map_err(|_| DecodeError::Base64 {
            pointer: pointer(),
            encoding,
        })
    };
    match layer.encoding {
        Encoding::Json => serde_json::from_str(text).map_err(not_json),
        Encoding::Base64 => String::from_utf8(bytes()?)
            .map(Value::String)
            .map_err(|_| DecodeError::NotText { pointer: pointer() }),
        Encoding::Base64Json => serde_json::from_slice(&bytes()?).map_err(not_json),
    }
}

/// Applies `layers` to `body`: `Ok(None)` without layers (the body is read as it is), else the
/// decoded document serialized as JSON, at most `max_bytes` long.
///
/// # Errors
/// [`DecodeError`].
pub fn apply(
    layers: &[DecodeLayer],
    body: &[u8],
    max_bytes: usize,
) -> Result<Option<Vec<u8>>, DecodeError> {
    if layers.is_empty() {
        return Ok(None);
    }
    let mut doc: Value =
        serde_json::from_slice(body).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    for layer in layers {
        let not_a_string = |found| DecodeError::NotAString {
            pointer: layer.pointer.clone(),
            encoding: layer.encoding.as_str(),
            found,
        };
        let Some(slot) = doc.pointer_mut(&layer.pointer) else {
            return Err(not_a_string(kind(None)));
        };
        let Value::String(text) = &*slot else {
            return Err(not_a_string(kind(Some(slot))));
        };
        *slot = decode_one(layer, text)?;
        if depth(&doc) > MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
    }
    let out = serde_json::to_vec(&doc).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    if out.len() > max_bytes {
        return Err(DecodeError::TooLarge(max_bytes));
    }
    Ok(Some(out))
}
