//! Reading a verified delivery: its event type, tenant and deduplication key.
//!
//! Values come from a [`Locator`] — an RFC 6901 JSON pointer into the body or a header. A located
//! value is used when it is a JSON string or integer of 1..=256 characters without control characters;
//! anything else counts as absent. Each scheme has defaults for the event type and the delivery ID
//! ([`default_event`], [`default_delivery`]); `[sources.NAME] event` / `dedup` override them.

use axum::http::HeaderMap;
use serde_json::Value;

use super::settings::{Dedup, Locator, Scheme, SourceConfig};
use super::{github, shopify, standard_webhooks};
use crate::ids::MAX_TENANT_ID_LEN;

/// Where a scheme's sender puts its event type by default.
pub fn default_event(scheme: Scheme) -> Option<Locator> {
    match scheme {
        Scheme::StandardWebhooks | Scheme::Stripe | Scheme::VercelWebhook => {
            Some(Locator::Pointer("/type".into()))
        }
        // GitHub: the header, joined with the body's `action` (see `event_type`).
        Scheme::Github => Some(Locator::Header(github::EVENT.into())),
        Scheme::Shopify => Some(Locator::Header(shopify::TOPIC.into())),
        // Slack Events API: `event.type` inside an `event_callback`, else the envelope's `type`.
        Scheme::Slack => Some(Locator::Pointer("/event/type".into())),
        // Atlassian Connect lifecycle hooks: `installed`, `uninstalled`, `enabled`, `disabled`.
        Scheme::AtlassianConnect => Some(Locator::Pointer("/eventType".into())),
        // SNS: the envelope's `Type` (`Notification`); Marketplace's action is `/Message/action`
        // once `decode` parsed `/Message`.
        Scheme::AwsSns => Some(Locator::Pointer("/Type".into())),
        Scheme::Bearer | Scheme::VercelOidc | Scheme::Basic | Scheme::Jwt => None,
    }
}

/// Where a scheme's sender puts its delivery/event ID (equal on retries) by default.
pub fn default_delivery(scheme: Scheme) -> Option<Locator> {
    match scheme {
        Scheme::StandardWebhooks => Some(Locator::Header(standard_webhooks::ID.into())),
        Scheme::Stripe | Scheme::VercelWebhook => Some(Locator::Pointer("/id".into())),
        Scheme::Github => Some(Locator::Header(github::DELIVERY.into())),
        Scheme::Shopify => Some(Locator::Header(shopify::EVENT_ID.into())),
        Scheme::Slack => Some(Locator::Pointer("/event_id".into())),
        Scheme::AwsSns => Some(Locator::Pointer("/MessageId".into())),
        Scheme::Bearer
        | Scheme::VercelOidc
        | Scheme::Basic
        | Scheme::Jwt
        | Scheme::AtlassianConnect => None,
    }
}

fn usable(text: &str) -> Option<String> {
    (!text.is_empty()
        && text.chars().count() <= MAX_TENANT_ID_LEN
        && !text.chars().any(char::is_control))
    .then(|| text.to_owned())
}

/// The value at `locator`, if usable (see the module docs). `json` is the parsed body, if it is JSON.
pub fn read(locator: &Locator, headers: &HeaderMap, json: Option<&Value>) -> Option<String> {
    match locator {
        Locator::Header(name) => {
            let mut all = headers.get_all(name.as_str()).iter();
            let value = all.next()?;
            if all.next().is_some() {
                return None;
            }
            usable(value.to_str().ok()?.trim())
        }
        Locator::Pointer(pointer) => match json?.pointer(pointer)? {
            Value::String(s) => usable(s),
            Value::Number(n) if n.is_i64() || n.is_u64() => usable(&n.to_string()),
            _ => None,
        },
    }
}

/// Why [`read`] finds no usable value at `locator`: for the 422 that names the tenant's locator.
pub fn why_unusable(locator: &Locator, headers: &HeaderMap, json: Option<&Value>) -> &'static str {
    let text = |t: &str| {
        if t.is_empty() {
            "it is empty"
        } else if t.chars().count() > MAX_TENANT_ID_LEN {
            "it is longer than 256 characters"
        } else if t.chars().any(char::is_control) {
            "it holds a control character"
        } else {
            "it is not usable"
        }
    };
    match locator {
        Locator::Header(name) => {
            let mut all = headers.get_all(name.as_str()).iter();
            let Some(value) = all.next() else {
                return "it is absent";
            };
            if all.next().is_some() {
                return "the header is repeated";
            }
            value
                .to_str()
                .map_or("it is not visible ASCII", |v| text(v.trim()))
        }
        Locator::Pointer(pointer) => match json.map(|j| j.pointer(pointer)) {
            None => "the body is not JSON",
            Some(None) => "it is absent",
            Some(Some(Value::String(s))) => text(s),
            Some(Some(Value::Number(n))) if n.is_i64() || n.is_u64() => text(&n.to_string()),
            Some(Some(_)) => "it is not a string or an integer",
        },
    }
}

/// The delivery's event type: `[sources.NAME] event` or the scheme's default; GitHub's is
/// `"{X-GitHub-Event}.{action}"` when the body has an `action` (e.g. `installation.deleted`), Slack's
/// falls back to the envelope's `type` (e.g. `url_verification`).
pub fn event_type(
    source: &SourceConfig,
    headers: &HeaderMap,
    json: Option<&Value>,
) -> Option<String> {
    if let Some(locator) = &source.event {
        return read(locator, headers, json);
    }
    let event = read(&default_event(source.scheme)?, headers, json);
    match source.scheme {
        Scheme::Github => {
            let action = read(&Locator::Pointer("/action".into()), headers, json);
            match (event, action) {
                (Some(e), Some(a)) => Some(format!("{e}.{a}")),
                (e, _) => e,
            }
        }
        Scheme::Slack => event.or_else(|| read(&Locator::Pointer("/type".into()), headers, json)),
        _ => event,
    }
}

/// What a verified delivery asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The event type, if found.
    pub event: Option<String>,
    /// Whether the event type is one of `delete_events` (always, for a bearer or basic source
    /// without any).
    pub deletes: bool,
    /// The tenant value (before any `tenant_lookup`), if found.
    pub tenant: Option<String>,
    /// Without a tenant: why the value at `tenant` is absent or unusable ([`why_unusable`]).
    pub tenant_unusable: Option<&'static str>,
    /// The deduplication key, if found (`Dedup::Tenant`: the tenant value).
    pub dedup: Option<String>,
}

/// Whether `source` reads anything from the body (a JSON pointer for its event type, GitHub's
/// `action`, its tenant or its dedup key): then a body that is not JSON cannot be read, and is
/// refused (400) rather than acknowledged as an ignored event.
pub fn reads_body(source: &SourceConfig) -> bool {
    let pointer = |l: Option<Locator>| matches!(l, Some(Locator::Pointer(_)));
    let dedup = match &source.dedup {
        Dedup::Tenant => None,
        Dedup::Pointer(p) => Some(Locator::Pointer(p.clone())),
        Dedup::Header(h) => Some(Locator::Header(h.clone())),
        Dedup::Delivery => default_delivery(source.scheme),
    };
    pointer(
        source
            .event
            .clone()
            .or_else(|| default_event(source.scheme)),
    ) || (source.event.is_none() && source.scheme == Scheme::Github)
        || pointer(source.tenant.clone())
        || pointer(dedup)
}

/// Reads a delivery's event type, tenant and dedup key. `body` is parsed as JSON when it is JSON
/// (whatever its declared type); a body that is not JSON simply has no pointer values.
pub fn extract(source: &SourceConfig, headers: &HeaderMap, body: &[u8]) -> Delivery {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let json = json.as_ref();
    let event = event_type(source, headers, json);
    let deletes = if source.delete_events.is_empty() {
        matches!(source.scheme, Scheme::Bearer | Scheme::Basic)
    } else {
        event
            .as_ref()
            .is_some_and(|e| source.delete_events.iter().any(|d| d == e))
    };
    let tenant = source.tenant.as_ref().and_then(|l| read(l, headers, json));
    let tenant_unusable = match (&tenant, &source.tenant) {
        (None, Some(locator)) => Some(why_unusable(locator, headers, json)),
        _ => None,
    };
    let dedup = match &source.dedup {
        Dedup::Tenant => tenant.clone(),
        Dedup::Pointer(p) => read(&Locator::Pointer(p.clone()), headers, json),
        Dedup::Header(h) => read(&Locator::Header(h.clone()), headers, json),
        Dedup::Delivery => default_delivery(source.scheme).and_then(|l| read(&l, headers, json)),
    };
    Delivery {
        event,
        deletes,
        tenant,
        tenant_unusable,
        dedup,
    }
}
