//! `atlassian-connect`: Atlassian Connect lifecycle hooks (`uninstalled`), `Authorization: JWT
//! <token>`.
//!
//! Since Atlassian's "signed-install" migration, install and uninstall hooks carry an RS256 token
//! whose public key is served by `kid` at `https://connect-install-keys.atlassian.com/{kid}` (a PEM
//! public key). deprov checks ([`super::atlassian_keys::ConnectVerifier`]): the header's `alg` is
//! RS256 and its `kid` a safe path segment ([`safe_kid`]); the key fetched for it verifies the
//! signature; `aud` is the app's `baseUrl` (`audience`); `exp` is in the future and `iat` not in
//! the future (both with `leeway`); `qsh` is the SHA-256 hex of the canonical request
//! ([`canonical_request`], Atlassian's "Understanding JWT for Connect apps"); and `iss` equals the
//! body's `clientKey`.
//!
//! HS256 tokens are refused: they are signed with the `sharedSecret` that an `installed` hook hands
//! to the app, which deprov never holds — and before signed installs that hook itself was unsigned,
//! so anyone could have registered a `clientKey` and a secret of their own and then "uninstalled"
//! it. Only Atlassian's asymmetric key proves Atlassian sent the hook.
//!
//! Defaults of the table: event type at `/eventType`, tenant at `/clientKey`, `delete_events =
//! ["uninstalled"]`, dedup on the tenant (Atlassian sends no event ID).

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::{Digest, Sha256};

use super::jwt::{check_leeway, check_url};
use super::settings::{InvalidSource, Locator, OneOrMany, SourceConfig, invalid};

/// Atlassian's key server; `{kid}` is replaced by the token's `kid`.
pub const DEFAULT_KEY_URL: &str = "https://connect-install-keys.atlassian.com/{kid}";

/// Longest accepted `kid`, in bytes.
pub const MAX_KID_LEN: usize = 128;

/// What RFC 3986 leaves unencoded (`A-Z a-z 0-9 - . _ ~`); everything else is `%XX` (so `+`
/// and space are `%20`-style escapes, `*` is `%2A`), as Atlassian's canonical query requires.
const ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Whether `kid` may be put in the key URL: 1..=[`MAX_KID_LEN`] characters of
/// `[A-Za-z0-9._-]`, not `.` or `..` (no `/`, `?`, `#`, `%`: it stays one path segment).
pub fn safe_kid(kid: &str) -> bool {
    !kid.is_empty()
        && kid.len() <= MAX_KID_LEN
        && kid != "."
        && kid != ".."
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn encode(text: &str) -> String {
    utf8_percent_encode(text, ENCODE).to_string()
}

/// The canonical path: `base_path` + `path`, without a trailing `/` (empty = `/`), `&` escaped as
/// `%26`.
fn canonical_path(base_path: &str, path: &str) -> String {
    let joined = format!("{base_path}{path}");
    let trimmed = joined.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.replace('&', "%26")
    }
}

/// The canonical query: parameters decoded (`application/x-www-form-urlencoded`), `jwt` left out,
/// names and values percent-encoded ([`ENCODE`]), sorted by name, a repeated name's values sorted
/// and joined with `,`, pairs joined with `&`.
fn canonical_query(query: &str) -> String {
    let mut params: Vec<(String, Vec<String>)> = Vec::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        if name == "jwt" {
            continue;
        }
        let (name, value) = (encode(&name), encode(&value));
        match params.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value),
            None => params.push((name, vec![value])),
        }
    }
    params.sort();
    params
        .into_iter()
        .map(|(name, mut values)| {
            values.sort();
            format!("{name}={}", values.join(","))
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// `METHOD&canonical-path&canonical-query` (Atlassian, "Understanding JWT for Connect apps",
/// "Creating a query string hash"). `path` is the request's path as deprov receives it, `query`
/// its raw query string (without `?`), `base_path` the table's `base_path`.
pub fn canonical_request(method: &str, base_path: &str, path: &str, query: &str) -> String {
    format!(
        "{}&{}&{}",
        method.to_ascii_uppercase(),
        canonical_path(base_path, path),
        canonical_query(query)
    )
}

/// The `qsh` claim a request must carry: lowercase hex SHA-256 of [`canonical_request`].
pub fn qsh(method: &str, base_path: &str, path: &str, query: &str) -> String {
    hex::encode(Sha256::digest(
        canonical_request(method, base_path, path, query).as_bytes(),
    ))
}

/// The key URL for `kid` (already [`safe_kid`]): `template` with `{kid}` replaced.
pub fn key_url(template: &str, kid: &str) -> String {
    template.replace("{kid}", kid)
}

/// Checks an `atlassian-connect` table and fills its defaults (tenant `/clientKey`, event
/// `/eventType` via `payload::default_event`, `delete_events = ["uninstalled"]`).
///
/// # Errors
/// [`InvalidSource`] naming the key: `audience` (the app's `baseUrl`) missing or a list,
/// `key_url` not an https URL with one `{kid}`, `base_path` not empty or `/…` without a trailing
/// `/`, `?` or `#`, `leeway` over 5m.
pub fn prepare(name: &str, source: &mut SourceConfig) -> Result<(), InvalidSource> {
    if source
        .audience
        .as_ref()
        .and_then(OneOrMany::single)
        .is_none()
    {
        return Err(invalid(
            name,
            "audience",
            "required: the app's baseUrl (the hooks' aud claim)",
        ));
    }
    let template = source.key_url.as_deref().unwrap_or(DEFAULT_KEY_URL);
    if template.matches("{kid}").count() != 1 {
        return Err(invalid(name, "key_url", "must contain {kid} exactly once"));
    }
    check_url(
        name,
        "key_url",
        &key_url(template, "kid"),
        source.allow_http_loopback,
    )?;
    let base_ok = |b: &str| {
        b.is_empty() || (b.starts_with('/') && !b.ends_with('/') && !b.contains(['?', '#']))
    };
    if source.base_path.as_deref().is_some_and(|b| !base_ok(b)) {
        return Err(invalid(
            name,
            "base_path",
            "empty, or a path starting with `/` without a trailing `/`, `?` or `#`",
        ));
    }
    check_leeway(name, source)?;
    if source.tenant.is_none() {
        source.tenant = Some(Locator::Pointer("/clientKey".into()));
    }
    if source.delete_events.is_empty() {
        source.delete_events = vec!["uninstalled".into()];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Atlassian's worked example ("Understanding JWT for Connect apps").
    #[test]
    fn the_documented_example_canonicalizes_as_documented() {
        assert_eq!(
            canonical_request(
                "get",
                "",
                "/path/to/service",
                "zee_last=param&repeated=parameter%201&first=param&repeated=parameter+2"
            ),
            "GET&/path/to/service&first=param&repeated=parameter%201,parameter%202&zee_last=param"
        );
    }

    #[test]
    fn paths_and_queries_follow_the_rules() {
        assert_eq!(canonical_request("POST", "", "", ""), "POST&/&");
        assert_eq!(
            canonical_request("POST", "", "/a/b/", "jwt=x"),
            "POST&/a/b&"
        );
        assert_eq!(
            canonical_request("POST", "/app", "/v1/webhooks/jira", ""),
            "POST&/app/v1/webhooks/jira&"
        );
        assert_eq!(canonical_request("POST", "", "/a&b", ""), "POST&/a%26b&");
        assert_eq!(
            canonical_request("POST", "", "/p", "b=*&a=~&A=x%20y&c"),
            "POST&/p&A=x%20y&a=~&b=%2A&c="
        );
        assert_eq!(
            qsh("POST", "", "/x", ""),
            hex::encode(Sha256::digest(b"POST&/x&"))
        );
    }

    #[test]
    fn only_plain_path_segments_are_kids() {
        for kid in ["a", "key-1.v2_x", "0f1e2d3c-aaaa-bbbb-cccc-0123456789ab"] {
            assert!(safe_kid(kid), "{kid}");
        }
        let long = "a".repeat(MAX_KID_LEN + 1);
        for kid in [
            "", ".", "..", "a/b", "../x", "a?b", "a#b", "%2e", "a b", &long,
        ] {
            assert!(!safe_kid(kid), "{kid}");
        }
    }
}
