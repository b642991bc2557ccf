//! `[sources.NAME] decode`: JSON in a string, base64, and every refusal.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::sources::decode::{DecodeError, DecodeLayer, Encoding, MAX_DEPTH, apply, check};

const MAX: usize = 16 * 1024;

fn layer(pointer: &str, encoding: Encoding) -> DecodeLayer {
    DecodeLayer {
        pointer: pointer.into(),
        encoding,
    }
}

fn decoded(layers: &[DecodeLayer], body: &Value) -> Result<Value, DecodeError> {
    let out = apply(layers, body.to_string().as_bytes(), MAX)?.expect("layers given");
    Ok(serde_json::from_slice(&out).unwrap())
}

#[test]
fn json_in_a_string_is_put_in_its_place() {
    let message = json!({"action": "unsubscribe-success", "customer-identifier": "X01EXAMPLEX"});
    let body = json!({"Type": "Notification", "Message": message.to_string()});
    let doc = decoded(&[layer("/Message", Encoding::Json)], &body).unwrap();
    assert_eq!(
        doc.pointer("/Message/action"),
        Some(&json!("unsubscribe-success"))
    );
    assert_eq!(
        doc.pointer("/Message/customer-identifier"),
        Some(&json!("X01EXAMPLEX"))
    );
    assert_eq!(doc["Type"], "Notification");
}

#[test]
fn base64_json_and_base64_text_are_decoded() {
    let data = STANDARD.encode(br#"{"event":"tenant.deleted","tenant":"t-1"}"#);
    let body = json!({"message": {"data": data, "messageId": "1"}, "subscription": "s"});
    let doc = decoded(&[layer("/message/data", Encoding::Base64Json)], &body).unwrap();
    assert_eq!(doc.pointer("/message/data/tenant"), Some(&json!("t-1")));
    let body = json!({"note": STANDARD.encode("héllo")});
    let doc = decoded(&[layer("/note", Encoding::Base64)], &body).unwrap();
    assert_eq!(doc["note"], "héllo");
}

#[test]
fn layers_apply_in_order_one_inside_another() {
    let inner = STANDARD.encode(br#"{"id":"deep"}"#);
    let middle = json!({"payload": inner}).to_string();
    let body = json!({"Message": middle});
    let layers = [
        layer("/Message", Encoding::Json),
        layer("/Message/payload", Encoding::Base64Json),
    ];
    let doc = decoded(&layers, &body).unwrap();
    assert_eq!(doc.pointer("/Message/payload/id"), Some(&json!("deep")));
}

#[test]
fn no_layers_leave_the_body_as_it_is() {
    assert_eq!(apply(&[], b"not even json", MAX), Ok(None));
}

#[test]
fn bad_base64_is_refused() {
    let body = json!({"message": {"data": "not base64!"}});
    let err = decoded(&[layer("/message/data", Encoding::Base64Json)], &body).unwrap_err();
    assert!(matches!(err, DecodeError::Base64 { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "decode \"/message/data\" (as base64-json): not standard base64"
    );
    let body = json!({"note": STANDARD.encode([0xff, 0xfe])});
    let err = decoded(&[layer("/note", Encoding::Base64)], &body).unwrap_err();
    assert!(matches!(err, DecodeError::NotText { .. }), "{err:?}");
}

#[test]
fn a_pointer_that_names_no_string_is_refused() {
    let body = json!({"Message": {"already": "an object"}, "n": 1});
    for (pointer, found) in [
        ("/Message", "an object"),
        ("/n", "a number"),
        ("/absent", "nothing"),
    ] {
        let err = decoded(&[layer(pointer, Encoding::Json)], &body).unwrap_err();
        assert_eq!(
            err,
            DecodeError::NotAString {
                pointer: pointer.into(),
                encoding: "json",
                found
            }
        );
        assert!(err.to_string().contains("not a string"), "{err}");
    }
}

#[test]
fn a_string_that_is_not_json_and_a_body_that_is_not_json_are_refused() {
    let body = json!({"Message": "You have chosen to subscribe to the topic"});
    let err = decoded(&[layer("/Message", Encoding::Json)], &body).unwrap_err();
    assert!(matches!(err, DecodeError::NotJsonInside { .. }), "{err:?}");
    let err = apply(&[layer("/Message", Encoding::Json)], b"Message=x", MAX).unwrap_err();
    assert!(matches!(err, DecodeError::NotJson(_)), "{err:?}");
}

#[test]
fn a_decoded_body_too_large_or_too_deep_is_refused() {
    let big = json!({"Message": json!({"pad": "x".repeat(300)}).to_string()});
    let layers = [layer("/Message", Encoding::Json)];
    let err = apply(&layers, big.to_string().as_bytes(), 256).unwrap_err();
    assert_eq!(err, DecodeError::TooLarge(256));
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    let body = json!({ "Message": deep });
    let err = decoded(&layers, &body).unwrap_err();
    assert_eq!(err, DecodeError::TooDeep);
    let fits = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
    decoded(&layers, &json!({ "Message": fits })).unwrap();
}

#[test]
fn layers_are_checked_at_load() {
    assert!(check(&[layer("/Message", Encoding::Json)]).is_ok());
    assert!(check(&[layer("Message", Encoding::Json)]).is_err());
    let many = vec![layer("/a", Encoding::Json); 9];
    assert!(check(&many).unwrap_err().contains("at most 8"));
    let parsed: DecodeLayer = toml::from_str("pointer = \"/m\"\nas = \"base64-json\"").unwrap();
    assert_eq!(parsed, layer("/m", Encoding::Base64Json));
    assert!(toml::from_str::<DecodeLayer>("pointer = \"/m\"\nas = \"gzip\"").is_err());
}
