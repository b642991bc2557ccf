//! `jwt`: a generic OIDC/JWT bearer sender — `Authorization: Bearer <JWT>` on
//! `POST /v1/webhooks/{source}`, checked against a JWKS ([`super::oidc::OidcVerifier`] with
//! [`Rules`] from the `[sources.NAME]` table). Microsoft Entra ID tokens on Azure Marketplace's SaaS
//! fulfillment webhook and Google-signed OIDC tokens on Pub/Sub push deliveries are configurations
//! of it (README, "Signed senders").
//!
//! The table: `jwks_url` or `jwks_file`; `issuer` and `audience` (a string or a list, one must
//! match); `algorithms` (default `["RS256"]`, any of [`ALGORITHMS`]: never `none`, never an HMAC,
//! which a public JWKS would key); `required_claims` (claim → string or boolean the token must
//! carry, e.g. Google's `email` and `email_verified = true`); `leeway` (clock skew on `exp`/`nbf`,
//! default 60 s, at most [`MAX_LEEWAY`]). A `jwks_url` is `https://`, or with
//! `allow_http_loopback = true` an `http://` URL to a loopback IP address (tests, a local proxy).

use std::time::Duration;

use super::oidc::{DEFAULT_LEEWAY, JwksSource, Rules};
use super::settings::{InvalidSource, OneOrMany, SourceConfig, invalid};
use jsonwebtoken::Algorithm;

/// The `algorithms` a `jwt` source may allow (RFC 7518 §3.1 asymmetric signatures that
/// jsonwebtoken's `rust_crypto` backend verifies).
pub const ALGORITHMS: [&str; 8] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
];

/// Largest `leeway`: 5 minutes.
pub const MAX_LEEWAY: Duration = Duration::from_secs(300);

/// `sources.NAME.<key>`'s URL: `https://`, or — with `allow_http_loopback` — `http://` to a
/// loopback IP address literal (127.0.0.0/8, `::1`).
///
/// # Errors
/// [`InvalidSource`] naming `key`.
pub fn check_url(
    name: &str,
    key: &str,
    url: &str,
    allow_loopback: bool,
) -> Result<(), InvalidSource> {
    let parsed =
        reqwest::Url::parse(url).map_err(|e| invalid(name, key, format!("{url:?}: {e}")))?;
    let loopback = parsed
        .host_str()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
        .and_then(|h| h.parse::<std::net::IpAddr>().ok())
        .is_some_and(|ip| ip.is_loopback());
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if allow_loopback && loopback => Ok(()),
        "http" if loopback => Err(invalid(
            name,
            key,
            "an http:// loopback URL needs allow_http_loopback = true (tests only)",
        )),
        _ => Err(invalid(name, key, "must be an https:// URL")),
    }
}

/// `leeway`: at most [`MAX_LEEWAY`].
///
/// # Errors
/// [`InvalidSource`] naming `leeway`.
pub fn check_leeway(name: &str, source: &SourceConfig) -> Result<(), InvalidSource> {
    match source.leeway {
        Some(l) if l > MAX_LEEWAY => Err(invalid(name, "leeway", "must be between 0s and 5m")),
        _ => Ok(()),
    }
}

/// Checks a `jwt` table: exactly one JWKS source, an issuer and an audience, allowed algorithms,
/// string or boolean required claims, the leeway, and the webhook keys a delivery is read with
/// (`tenant`, `event`, `delete_events`).
///
/// # Errors
/// [`InvalidSource`] naming the key.
pub fn check(name: &str, source: &SourceConfig) -> Result<(), InvalidSource> {
    match (&source.jwks_url, &source.jwks_file) {
        (Some(url), None) => check_url(name, "jwks_url", url, source.allow_http_loopback)?,
        (None, Some(_)) => {}
        _ => {
            return Err(invalid(
                name,
                "jwks_url",
                "give exactly one of jwks_url and jwks_file",
            ));
        }
    }
    for (key, value) in [("issuer", &source.issuer), ("audience", &source.audience)] {
        if !value.as_ref().is_some_and(OneOrMany::is_valid) {
            return Err(invalid(
                name,
                key,
                "required: a non-empty string or list of them",
            ));
        }
    }
    for alg in &source.algorithms {
        if !ALGORITHMS.contains(&alg.as_str()) {
            return Err(invalid(
                name,
                "algorithms",
                format!("{alg:?} is not one of {}", ALGORITHMS.join(", ")),
            ));
        }
    }
    for (claim, value) in &source.required_claims {
        if claim.is_empty() || !(value.is_string() || value.is_boolean()) {
            return Err(invalid(
                name,
                "required_claims",
                format!("{claim:?}: a claim name and a string or boolean value"),
            ));
        }
    }
    check_leeway(name, source)?;
    if source.tenant.is_none() {
        return Err(invalid(
            name,
            "tenant",
            "say where the tenant is: { pointer = \"/…\" } or { header = \"…\" }",
        ));
    }
    if source.event.is_none() {
        return Err(invalid(
            name,
            "event",
            "say where the event type is: { pointer = \"/…\" } or { header = \"…\" }",
        ));
    }
    if source.delete_events.is_empty() {
        return Err(invalid(
            name,
            "delete_events",
            "list the event types that mean delete",
        ));
    }
    Ok(())
}

/// The JWKS source of a checked `jwt` or `vercel-oidc` table.
pub fn jwks(source: &SourceConfig) -> Option<JwksSource> {
    match (&source.jwks_url, &source.jwks_file) {
        (Some(url), _) => Some(JwksSource::Url(url.clone())),
        (None, Some(file)) => Some(JwksSource::File(file.clone())),
        (None, None) => None,
    }
}

/// The [`Rules`] of a checked `jwt` table.
pub fn rules(source: &SourceConfig) -> Rules {
    let algorithms = if source.algorithms.is_empty() {
        vec![Algorithm::RS256]
    } else {
        source
            .algorithms
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect()
    };
    Rules {
        algorithms,
        issuers: source
            .issuer
            .as_ref()
            .map(OneOrMany::values)
            .unwrap_or_default(),
        audiences: source
            .audience
            .as_ref()
            .map(OneOrMany::values)
            .unwrap_or_default(),
        required_claims: source
            .required_claims
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        leeway: source.leeway.unwrap_or(DEFAULT_LEEWAY),
    }
}
