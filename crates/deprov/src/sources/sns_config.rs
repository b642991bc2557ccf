//! An `aws-sns` source's table checked ([`prepare`]): its topics, its events and tenant, every
//! location inside a field SNS signs, and its certificate hosts; then its certificate fetcher
//! ([`super::sns_certs`]) built.

use std::sync::Arc;

use super::settings::{Dedup, Locator, SourceConfig};
use super::sns::{DEFAULT_CERT_HOSTS, valid_host_pattern};
use super::sns_certs::SnsCerts;

/// The envelope fields SNS signs (in a `Notification`): the only ones an `aws-sns` source may read,
/// since anything else in the body (or a header) could be added to a captured message.
pub const SIGNED_FIELDS: [&str; 6] = [
    "Message",
    "MessageId",
    "Subject",
    "Timestamp",
    "TopicArn",
    "Type",
];

/// Whether `pointer` reaches into a signed field ([`SIGNED_FIELDS`]).
fn signed_pointer(pointer: &str) -> bool {
    pointer
        .strip_prefix('/')
        .and_then(|rest| rest.split('/').next())
        .is_some_and(|field| SIGNED_FIELDS.contains(&field))
}

/// Refuses a `tenant`, `event`, `dedup` or `decode` location outside the signed fields.
fn check_signed(source: &SourceConfig) -> Result<(), (&'static str, String)> {
    let dedup = match &source.dedup {
        Dedup::Pointer(p) => Some(Locator::Pointer(p.clone())),
        Dedup::Header(h) => Some(Locator::Header(h.clone())),
        Dedup::Delivery | Dedup::Tenant => None,
    };
    let why = format!(
        "SNS signs only the fields {}: read from one of them (a pointer starting with /Message, …), \
         never a header",
        SIGNED_FIELDS.join(", ")
    );
    for (key, locator) in [
        ("tenant", source.tenant.as_ref()),
        ("event", source.event.as_ref()),
        ("dedup", dedup.as_ref()),
    ] {
        match locator {
            Some(Locator::Pointer(p)) if signed_pointer(p) => {}
            Some(_) => return Err((key, why)),
            None => {}
        }
    }
    if source.decode.iter().any(|l| !signed_pointer(&l.pointer)) {
        return Err(("decode", why));
    }
    Ok(())
}

/// Checks an `aws-sns` source (`topic_arns`, `delete_events`, `tenant`, `cert_hosts`,
/// `cert_roots_file`; every location inside a signed field) and builds its fetcher.
///
/// # Errors
/// The key at fault and why.
pub fn prepare(source: &SourceConfig) -> Result<Arc<SnsCerts>, (&'static str, String)> {
    if source.topic_arns.is_empty() {
        return Err(("topic_arns", "list the SNS topic ARNs to accept".into()));
    }
    if let Some(t) = source.topic_arns.iter().find(|t| !t.starts_with("arn:")) {
        return Err(("topic_arns", format!("{t:?} is not an ARN (arn:…:sns:…)")));
    }
    if source.delete_events.is_empty() {
        return Err((
            "delete_events",
            "list the event types that mean delete".into(),
        ));
    }
    if source.tenant.is_none() {
        return Err((
            "tenant",
            "say where the tenant is, e.g. { pointer = \"/Message/customer-identifier\" }".into(),
        ));
    }
    check_signed(source)?;
    let hosts: Vec<String> = match &source.cert_hosts {
        None => DEFAULT_CERT_HOSTS.iter().map(|h| (*h).to_owned()).collect(),
        Some(h) if h.is_empty() => return Err(("cert_hosts", "list at least one host".into())),
        Some(h) => h.clone(),
    };
    if let Some(bad) = hosts.iter().find(|h| !valid_host_pattern(h)) {
        return Err((
            "cert_hosts",
            format!("{bad:?} is not a host pattern (labels of letters, digits, `-`, or `*`)"),
        ));
    }
    super::sns_certs::fetcher(hosts, source.cert_roots_file.as_deref())
}
