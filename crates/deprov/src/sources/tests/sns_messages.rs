//! `aws-sns`: the string to sign, both signature versions, URL, topic and timestamp checks.

use std::time::Duration;

use rsa::pkcs8::DecodePrivateKey as _;

use crate::sources::sns::{
    DEFAULT_CERT_HOSTS, Kind, Message, SnsReject, check_message, check_url, host_matches, parse,
    sign, string_to_sign, verify_signature,
};
use crate::sources::sns_certs::public_key;

fn sns_fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/sns/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub(in crate::sources) fn test_key() -> rsa::PrivateKey {
    rsa::PrivateKey::from_pkcs8_der(&sns_fixture("signing.key.der")).unwrap()
}

pub(in crate::sources) fn test_public_key() -> rsa::PublicKey {
    public_key(&sns_fixture("signing.pem")).unwrap()
}

const TOPIC: &str = "arn:aws:sns:us-east-1:287250355862:aws-mp-subscription-notification-abc123";

/// An AWS Marketplace `unsubscribe-success` notification, unsigned.
pub(in crate::sources) fn marketplace(sha256: bool) -> Message {
    Message {
        kind: Kind::Notification,
        message: r#"{"action": "unsubscribe-success", "customer-identifier": "X01EXAMPLEX", "product-code": "n0123EXAMPLEXXXXXXXXXXXX", "offer-identifier": "offer-abcexample123", "isFreeTrialTermPresent":"false"}"#.into(),
        message_id: "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324".into(),
        subject: None,
        timestamp: "2026-12-04T18:00:00.000Z".into(),
        topic_arn: TOPIC.into(),
        sha256,
        signature: Vec::new(),
        signing_cert_url: "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0000000000000000000000.pem".into(),
        subscribe_url: None,
        token: None,
    }
}

/// A `SubscriptionConfirmation`, unsigned.
pub(in crate::sources) fn confirmation(sha256: bool) -> Message {
    Message {
        kind: Kind::SubscriptionConfirmation,
        message: format!(
            "You have chosen to subscribe to the topic {TOPIC}.\nTo confirm the subscription, visit the SubscribeURL included in this message."
        ),
        subscribe_url: Some(format!(
            "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn={TOPIC}&Token=2336412f37"
        )),
        token: Some("2336412f37".into()),
        ..marketplace(sha256)
    }
}

#[test]
fn the_string_to_sign_follows_the_documented_field_order() {
    let mut m = marketplace(true);
    m.subject = Some("hi".into());
    assert_eq!(
        string_to_sign(&m),
        format!(
            "Message\n{}\nMessageId\n22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324\nSubject\nhi\n\
             Timestamp\n2026-12-04T18:00:00.000Z\nTopicArn\n{TOPIC}\nType\nNotification\n",
            m.message
        )
    );
    m.subject = None;
    assert!(!string_to_sign(&m).contains("Subject"));
    let c = confirmation(false);
    assert_eq!(
        string_to_sign(&c),
        format!(
            "Message\n{}\nMessageId\n{}\nSubscribeURL\n{}\nTimestamp\n{}\nToken\n2336412f37\n\
             TopicArn\n{TOPIC}\nType\nSubscriptionConfirmation\n",
            c.message,
            c.message_id,
            c.subscribe_url.as_deref().unwrap(),
            c.timestamp
        )
    );
}

#[test]
fn both_signature_versions_verify_and_do_not_stand_for_each_other() {
    let key = test_key();
    let public = test_public_key();
    for sha256 in [false, true] {
        for mut m in [marketplace(sha256), confirmation(sha256)] {
            m.signature = base64_decode(&sign(&key, &m));
            verify_signature(&public, &m).unwrap();
            m.sha256 = !sha256;
            assert_eq!(verify_signature(&public, &m), Err(SnsReject::Mismatch));
        }
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

#[test]
fn an_envelope_parses_and_names_what_it_lacks() {
    let body = serde_json::json!({
        "Type": "Notification", "MessageId": "m-1", "TopicArn": TOPIC, "Message": "{}",
        "Timestamp": "2026-12-04T18:00:00.000Z", "SignatureVersion": "2", "Signature": "AAAA",
        "SigningCertURL": "https://sns.us-east-1.amazonaws.com/c.pem", "Subject": null,
        "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe"
    });
    let m = parse(body.to_string().as_bytes()).unwrap();
    assert_eq!(
        (m.kind, m.sha256, m.subject),
        (Kind::Notification, true, None)
    );
    for (field, value, says) in [
        ("Type", serde_json::json!("Other"), "unknown Type"),
        ("SignatureVersion", serde_json::json!("3"), "not 1 or 2"),
        ("Signature", serde_json::json!("!!"), "not base64"),
        ("MessageId", serde_json::Value::Null, "no string MessageId"),
        (
            "Message",
            serde_json::json!(1),
            "not a JSON object of strings",
        ),
    ] {
        let mut b = body.clone();
        b[field] = value;
        let err = parse(b.to_string().as_bytes()).unwrap_err();
        assert!(err.to_string().contains(says), "{field}: {err}");
    }
    let mut b = body.clone();
    b["Type"] = "SubscriptionConfirmation".into();
    assert!(
        parse(b.to_string().as_bytes())
            .unwrap_err()
            .to_string()
            .contains("SubscribeURL")
    );
}

#[test]
fn certificate_urls_must_be_https_pem_on_an_sns_host() {
    let hosts: Vec<String> = DEFAULT_CERT_HOSTS.iter().map(|h| (*h).to_owned()).collect();
    let ok = |u: &str| check_url("SigningCertURL", u, &hosts, true);
    ok("https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem").unwrap();
    ok("https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem").unwrap();
    for (url, reason) in [
        ("http://sns.us-east-1.amazonaws.com/a.pem", "not https"),
        (
            "https://sns.us-east-1.amazonaws.com.evil.example/a.pem",
            "host",
        ),
        (
            "https://evil.example/sns.us-east-1.amazonaws.com/a.pem",
            "host",
        ),
        ("https://sns.evil.example.amazonaws.com/a.pem", "host"),
        ("https://sqs.us-east-1.amazonaws.com/a.pem", "host"),
        ("https://sns.us-east-1.amazonaws.com/a.pem.txt", ".pem"),
        ("https://sns.us-east-1.amazonaws.com/", ".pem"),
        (
            "https://u:p@sns.us-east-1.amazonaws.com/a.pem",
            "credentials",
        ),
        ("sns.us-east-1.amazonaws.com/a.pem", "not a URL"),
    ] {
        let err = ok(url).unwrap_err().to_string();
        assert!(
            err.starts_with("SigningCertURL refused") && err.contains(reason),
            "{url}: {err}"
        );
    }
    assert!(
        check_url(
            "SubscribeURL",
            "https://sns.eu-west-1.amazonaws.com/?Action=x",
            &hosts,
            false
        )
        .is_ok()
    );
    assert!(host_matches("127.0.0.1", "127.0.0.1"));
    assert!(!host_matches("sns.*.amazonaws.com", "sns..amazonaws.com"));
}

#[test]
fn topic_and_timestamp_are_checked() {
    let m = marketplace(true);
    let now = 1_796_407_200; // 2026-12-04T18:00:00Z
    let topics = vec![TOPIC.to_owned()];
    let hour = Duration::from_secs(3600);
    check_message(&m, &topics, now, hour).unwrap();
    check_message(&m, &topics, now + 3600, hour).unwrap();
    assert_eq!(
        check_message(&m, &topics, now + 3601, hour),
        Err(SnsReject::Stale(3600))
    );
    assert_eq!(
        check_message(&m, &topics, now - 301, hour),
        Err(SnsReject::Future)
    );
    let other = vec!["arn:aws:sns:us-east-1:1:other".to_owned()];
    assert_eq!(
        check_message(&m, &other, now, hour),
        Err(SnsReject::Topic(TOPIC.into()))
    );
    let mut bad = m.clone();
    bad.timestamp = "yesterday".into();
    assert!(matches!(
        check_message(&bad, &topics, now, hour),
        Err(SnsReject::Malformed(_))
    ));
}

#[test]
fn a_certificate_without_an_rsa_key_or_not_a_certificate_is_refused() {
    assert!(matches!(
        public_key(b"not pem"),
        Err(SnsReject::Certificate(_))
    ));
    let jwks = sns_fixture("ca.pem");
    assert!(public_key(&jwks).is_ok(), "the CA's key is RSA too");
}

#[test]
fn a_signed_message_of_another_type_does_not_verify() {
    let key = test_key();
    let public = test_public_key();
    let mut m = confirmation(true);
    m.signature = base64_decode(&sign(&key, &m));
    m.kind = Kind::UnsubscribeConfirmation;
    assert_eq!(verify_signature(&public, &m), Err(SnsReject::Mismatch));
}

/// An `aws-sns` table: what it needs, named by key; the defaults it gets.
#[test]
fn aws_sns_entries_name_what_is_wrong_and_get_their_defaults() {
    use crate::config::{Config, Secrets};
    let base = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";
    let entry = "scheme = \"aws-sns\"\ntenant = { pointer = \"/Message/customer-identifier\" }\n\
                 delete_events = [\"unsubscribe-success\"]\n";
    let load = |keys: &str| {
        Config::from_toml_with(
            &format!("[sources.s]\n{entry}{keys}\n{base}"),
            Secrets::Skip,
        )
    };
    let config = load(&format!("topic_arns = [\"{TOPIC}\"]")).unwrap();
    let s = &config.sources["s"];
    assert_eq!(s.tolerance(), Duration::from_secs(3600));
    assert_eq!(s.sns.as_ref().unwrap().hosts(), DEFAULT_CERT_HOSTS);
    assert!(!s.confirm_subscriptions);
    let topic = format!("topic_arns = [\"{TOPIC}\"]\n");
    for (keys, key, says) in [
        (String::new(), "topic_arns", "list the SNS topic ARNs"),
        (
            "topic_arns = [\"my-topic\"]".to_owned(),
            "topic_arns",
            "not an ARN",
        ),
        (
            format!("{topic}cert_hosts = []"),
            "cert_hosts",
            "at least one",
        ),
        (
            format!("{topic}cert_hosts = [\"sns.*.amazon aws.com\"]"),
            "cert_hosts",
            "not a host pattern",
        ),
        (
            format!("{topic}cert_roots_file = \"/nonexistent/roots.pem\""),
            "cert_roots_file",
            "/nonexistent/roots.pem",
        ),
        (
            format!("{topic}decode = [{{ pointer = \"Message\", as = \"json\" }}]"),
            "decode",
            "JSON pointer",
        ),
        (
            format!("{topic}secret_env = [\"X\"]"),
            "secret_env",
            "not used by scheme aws-sns",
        ),
        (
            format!("{topic}tolerance = \"2h\""),
            "tolerance",
            "between 1s and 1h",
        ),
        (
            format!("{topic}event = {{ pointer = \"/MessageAttributes/action\" }}"),
            "event",
            "SNS signs only",
        ),
        (
            format!("{topic}dedup = {{ header = \"x-amz-sns-message-id\" }}"),
            "dedup",
            "never a header",
        ),
        (
            format!("{topic}decode = [{{ pointer = \"/Extra\", as = \"json\" }}]"),
            "decode",
            "SNS signs only",
        ),
    ] {
        let err = load(&keys).unwrap_err().to_string();
        assert!(
            err.contains(&format!("sources.s.{key}")) && err.contains(says),
            "{keys}\n-> {err}"
        );
    }
    let roots = format!(
        "{topic}cert_roots_file = \"{}/tests/fixtures/sns/ca.pem\"",
        env!("CARGO_MANIFEST_DIR")
    );
    load(&roots).unwrap();
}

/// Envelopes signed outside deprov (`openssl dgst -sign` over the documented string-to-sign, see
/// `tests/fixtures/sns/README.md`) verify, and stop verifying once a signed field changes.
#[test]
fn envelopes_signed_with_openssl_verify_in_both_versions() {
    let public = test_public_key();
    for (file, kind, sha256) in [
        ("notification-v1.json", Kind::Notification, false),
        (
            "subscription-confirmation-v2.json",
            Kind::SubscriptionConfirmation,
            true,
        ),
    ] {
        let mut m = parse(&sns_fixture(file)).unwrap();
        assert_eq!((m.kind, m.sha256), (kind, sha256), "{file}");
        verify_signature(&public, &m).unwrap_or_else(|e| panic!("{file}: {e}"));
        m.timestamp = m.timestamp.replace("18:00", "18:01");
        assert_eq!(
            verify_signature(&public, &m),
            Err(SnsReject::Mismatch),
            "{file}"
        );
    }
}
