//! `aws-sns`: Amazon SNS HTTP/S deliveries (AWS Marketplace SaaS subscription events, among others).
//!
//! SNS signs each message with an RSA key whose X.509 certificate it publishes at the message's
//! `SigningCertURL`. Per AWS's "Verifying the signatures of Amazon SNS messages":
//! `SignatureVersion` `1` is SHA1withRSA, `2` SHA256withRSA (both PKCS#1 v1.5), over the
//! string-to-sign [`string_to_sign`] builds — for a `Notification` the fields `Message`,
//! `MessageId`, `Subject` (when present), `Timestamp`, `TopicArn`, `Type`; for a
//! `SubscriptionConfirmation` or `UnsubscribeConfirmation` `Message`, `MessageId`, `SubscribeURL`,
//! `Timestamp`, `Token`, `TopicArn`, `Type`; each as `Name\nValue\n`.
//!
//! Before any certificate is fetched ([`super::sns_certs`]) a message must name an allowed topic
//! (`topic_arns`), carry a `Timestamp` within the tolerance, and a `SigningCertURL` that is `https`,
//! on a host matching `cert_hosts` ([`DEFAULT_CERT_HOSTS`]) and whose path ends in `.pem`
//! ([`check_url`]). Everything here is pure: the fetch and the HTTP answers live elsewhere.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rsa::pkcs1v15::{Signature, SigningKey, VerifyingKey};
use rsa::signature::{SignatureEncoding as _, Signer as _, Verifier as _};
use rsa::{PrivateKey, PublicKey};
use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Default past tolerance of `Timestamp`: 1 h. SNS keeps a message's `Timestamp` (it is signed)
/// across its retries, and an HTTP/S delivery policy can retry for at most 3,600 s (AWS's "Amazon
/// SNS message delivery retries", a hard limit), so a legitimate retry is never older than this.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(3600);

/// How far in the future a `Timestamp` may be (clock skew).
pub const FUTURE_SKEW: Duration = Duration::from_secs(300);

/// Default `cert_hosts`: SNS's regional endpoints, in the commercial and the China partitions
/// (`*` = one DNS label, e.g. `sns.us-east-1.amazonaws.com`, `sns.cn-north-1.amazonaws.com.cn`).
pub const DEFAULT_CERT_HOSTS: [&str; 2] = ["sns.*.amazonaws.com", "sns.*.amazonaws.com.cn"];

/// Why an SNS message was refused (answered 401; nothing stored). Messages never echo a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnsReject {
    /// The body is not an SNS message: not JSON, or a required field absent or not a string.
    #[error("not an SNS message: {0}")]
    Malformed(String),
    /// `TopicArn` is not in `topic_arns`.
    #[error("topic {0:?} is not in topic_arns")]
    Topic(String),
    /// `Timestamp` is older than the tolerance (its seconds).
    #[error("message Timestamp older than the tolerance ({0} s)")]
    Stale(u64),
    /// `Timestamp` is in the future beyond [`FUTURE_SKEW`].
    #[error("message Timestamp in the future")]
    Future,
    /// `SigningCertURL` or `SubscribeURL` is not an allowed URL (the reason says why).
    #[error("{field} refused: {reason}")]
    Url {
        /// `SigningCertURL` or `SubscribeURL`.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The fetched certificate is not a readable X.509 certificate with an RSA key.
    #[error("the signing certificate is unreadable: {0}")]
    Certificate(String),
    /// The signature does not verify with the certificate's key.
    #[error("signature does not match")]
    Mismatch,
}

/// The kind of an SNS message (`Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A published message.
    Notification,
    /// Sent once on subscribe; confirmed by a GET of `SubscribeURL`.
    SubscriptionConfirmation,
    /// Sent when the subscription was deleted.
    UnsubscribeConfirmation,
}

impl Kind {
    /// The `Type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Notification => "Notification",
            Self::SubscriptionConfirmation => "SubscriptionConfirmation",
            Self::UnsubscribeConfirmation => "UnsubscribeConfirmation",
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Raw {
    #[serde(rename = "Type")]
    kind: Option<String>,
    message: Option<String>,
    message_id: Option<String>,
    subject: Option<String>,
    timestamp: Option<String>,
    topic_arn: Option<String>,
    signature_version: Option<String>,
    signature: Option<String>,
    #[serde(rename = "SigningCertURL")]
    signing_cert_url: Option<String>,
    #[serde(rename = "SubscribeURL")]
    subscribe_url: Option<String>,
    token: Option<String>,
}

/// A parsed SNS message: the signed fields, read from the envelope as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `Type`.
    pub kind: Kind,
    /// `Message` (for a notification, the publisher's payload, often JSON in a string).
    pub message: String,
    /// `MessageId` (equal on retries).
    pub message_id: String,
    /// `Subject`, when present and not null.
    pub subject: Option<String>,
    /// `Timestamp`, as sent (ISO 8601, e.g. `2012-04-26T20:45:04.751Z`).
    pub timestamp: String,
    /// `TopicArn`.
    pub topic_arn: String,
    /// `SignatureVersion`: `true` for `2` (SHA-256), `false` for `1` (SHA-1).
    pub sha256: bool,
    /// `Signature`, base64-decoded.
    pub signature: Vec<u8>,
    /// `SigningCertURL`.
    pub signing_cert_url: String,
    /// `SubscribeURL` (confirmations only).
    pub subscribe_url: Option<String>,
    /// `Token` (confirmations only).
    pub token: Option<String>,
}

fn need(field: Option<String>, name: &str) -> Result<String, SnsReject> {
    field.ok_or_else(|| SnsReject::Malformed(format!("no string {name}")))
}

/// Parses an SNS envelope (the body of an HTTP/S delivery).
///
/// # Errors
/// [`SnsReject::Malformed`] naming the field.
pub fn parse(body: &[u8]) -> Result<Message, SnsReject> {
    let raw: Raw = serde_json::from_slice(body)
        .map_err(|_| SnsReject::Malformed("the body is not a JSON object of strings".into()))?;
    let kind = match need(raw.kind, "Type")?.as_str() {
        "Notification" => Kind::Notification,
        "SubscriptionConfirmation" => Kind::SubscriptionConfirmation,
        "UnsubscribeConfirmation" => Kind::UnsubscribeConfirmation,
        _ => return Err(SnsReject::Malformed("unknown Type".into())),
    };
    let sha256 = match need(raw.signature_version, "SignatureVersion")?.as_str() {
        "1" => false,
        "2" => true,
        _ => {
            return Err(SnsReject::Malformed(
                "SignatureVersion is not 1 or 2".into(),
            ));
        }
    };
    let signature = STANDARD
        .decode(need(raw.signature, "Signature")?)
        .map_err(|_| SnsReject::Malformed("Signature is not base64".into()))?;
    let (subscribe_url, token) = match kind {
        Kind::Notification => (None, None),
        _ => (
            Some(need(raw.subscribe_url, "SubscribeURL")?),
            Some(need(raw.token, "Token")?),
        ),
    };
    Ok(Message {
        kind,
        message: need(raw.message, "Message")?,
        message_id: need(raw.message_id, "MessageId")?,
        subject: raw.subject,
        timestamp: need(raw.timestamp, "Timestamp")?,
        topic_arn: need(raw.topic_arn, "TopicArn")?,
        sha256,
        signature,
        signing_cert_url: need(raw.signing_cert_url, "SigningCertURL")?,
        subscribe_url,
        token,
    })
}

/// The string SNS signs for `m` (see the module docs).
pub fn string_to_sign(m: &Message) -> String {
    let mut out = String::new();
    let mut add = |name: &str, value: &str| {
        out.push_str(name);
        out.push('\n');
        out.push_str(value);
        out.push('\n');
    };
    add("Message", &m.message);
    add("MessageId", &m.message_id);
    match m.kind {
        Kind::Notification => {
            if let Some(subject) = &m.subject {
                add("Subject", subject);
            }
        }
        _ => add(
            "SubscribeURL",
            m.subscribe_url.as_deref().unwrap_or_default(),
        ),
    }
    add("Timestamp", &m.timestamp);
    if m.kind != Kind::Notification {
        add("Token", m.token.as_deref().unwrap_or_default());
    }
    add("TopicArn", &m.topic_arn);
    add("Type", m.kind.as_str());
    out
}

/// Whether `m`'s signature verifies with `key` (PKCS#1 v1.5, SHA-1 or SHA-256 by version).
///
/// # Errors
/// [`SnsReject::Mismatch`].
pub fn verify_signature(key: &PublicKey, m: &Message) -> Result<(), SnsReject> {
    let text = string_to_sign(m);
    let signature = Signature::try_from(m.signature.as_slice()).map_err(|_| SnsReject::Mismatch)?;
    let ok = if m.sha256 {
        VerifyingKey::<sha2::Sha256>::new(key.clone()).verify(text.as_bytes(), &signature)
    } else {
        VerifyingKey::<sha1::Sha1>::new(key.clone()).verify(text.as_bytes(), &signature)
    };
    ok.map_err(|_| SnsReject::Mismatch)
}

/// Signs `m` with `key` as SNS would (its `sha256` picks the version): the base64 `Signature`.
/// For tests and SNS-compatible senders.
pub fn sign(key: &PrivateKey, m: &Message) -> String {
    let text = string_to_sign(m);
    let bytes = if m.sha256 {
        SigningKey::<sha2::Sha256>::new(key.clone())
            .sign(text.as_bytes())
            .to_vec()
    } else {
        SigningKey::<sha1::Sha1>::new(key.clone())
            .sign(text.as_bytes())
            .to_vec()
    };
    STANDARD.encode(bytes)
}

/// Checks `m`'s topic against `topic_arns` and its `Timestamp` against `tolerance` (past) and
/// [`FUTURE_SKEW`]; `now` is Unix seconds.
///
/// # Errors
/// [`SnsReject::Topic`], [`SnsReject::Malformed`] (unreadable timestamp), [`SnsReject::Stale`],
/// [`SnsReject::Future`].
pub fn check_message(
    m: &Message,
    topic_arns: &[String],
    now: i64,
    tolerance: Duration,
) -> Result<(), SnsReject> {
    if !topic_arns.contains(&m.topic_arn) {
        return Err(SnsReject::Topic(m.topic_arn.clone()));
    }
    let ts = OffsetDateTime::parse(&m.timestamp, &Rfc3339)
        .map_err(|_| SnsReject::Malformed("Timestamp is not ISO 8601 (RFC 3339)".into()))?
        .unix_timestamp();
    let past = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    let future = i64::try_from(FUTURE_SKEW.as_secs()).unwrap_or(i64::MAX);
    if ts < now.saturating_sub(past) {
        return Err(SnsReject::Stale(tolerance.as_secs()));
    }
    if ts > now.saturating_add(future) {
        return Err(SnsReject::Future);
    }
    Ok(())
}

/// Whether `host` matches `pattern`, label by label; a `*` label matches one label of ASCII
/// letters, digits and `-`.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    let (p, h): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), host.split('.').collect());
    p.len() == h.len()
        && p.iter().zip(&h).all(|(p, h)| {
            if *p == "*" {
                !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            } else {
                p.eq_ignore_ascii_case(h)
            }
        })
}

/// Whether `pattern` is a valid `cert_hosts` entry: dot-separated labels, each `*` or letters,
/// digits and `-`.
pub fn valid_host_pattern(pattern: &str) -> bool {
    pattern.split('.').all(|l| {
        l == "*" || (!l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    })
}

/// Checks a `SigningCertURL` (`pem = true`: its path must end in `.pem`) or `SubscribeURL`: `https`,
/// no user or password, a host matching one of `hosts`.
///
/// # Errors
/// [`SnsReject::Url`] naming `field` and the reason.
pub fn check_url(
    field: &'static str,
    url: &str,
    hosts: &[String],
    pem: bool,
) -> Result<reqwest::Url, SnsReject> {
    let refuse = |reason: &str| SnsReject::Url {
        field,
        reason: reason.to_owned(),
    };
    let parsed = reqwest::Url::parse(url).map_err(|_| refuse("not a URL"))?;
    if parsed.scheme() != "https" {
        return Err(refuse("not https"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(refuse("carries credentials"));
    }
    let host = parsed.host_str().unwrap_or_default();
    if !hosts.iter().any(|p| host_matches(p, host)) {
        return Err(refuse("host not in cert_hosts"));
    }
    if pem && !parsed.path().ends_with(".pem") {
        return Err(refuse("path does not end in .pem"));
    }
    Ok(parsed)
}
