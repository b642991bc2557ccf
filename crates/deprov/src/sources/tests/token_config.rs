//! `[sources.NAME]` tables of the token schemes (`jwt`, `atlassian-connect`): what is refused at
//! load, by key, and the defaults filled in.

use crate::config::{Config, Secrets};
use crate::sources::{Dedup, Locator, Scheme};

const BASE: &str = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";

const JWT: &str = "scheme = \"jwt\"\njwks_url = \"https://login.example.com/keys\"\n\
    issuer = \"https://login.example.com\"\naudience = \"api://app\"\n\
    tenant = { pointer = \"/subscriptionId\" }\nevent = { pointer = \"/action\" }\n\
    delete_events = [\"Unsubscribe\"]";

const CONNECT: &str = "scheme = \"atlassian-connect\"\naudience = \"https://app.example.com\"";

fn load(entry: &str) -> Result<Config, String> {
    Config::from_toml_with(&format!("[sources.s]\n{entry}\n{BASE}"), Secrets::Skip)
        .map_err(|e| e.to_string())
}

/// `entry` with `line` replacing the line starting with `key =`, or appended.
fn with(entry: &str, key: &str, line: &str) -> String {
    let mut lines: Vec<String> = entry
        .lines()
        .filter(|l| !l.starts_with(&format!("{key} =")))
        .map(str::to_owned)
        .collect();
    if !line.is_empty() {
        lines.push(line.to_owned());
    }
    lines.join("\n")
}

#[test]
fn jwt_tables_outside_the_bounds_are_refused_by_key() {
    let cases = [
        ("algorithms", "algorithms = [\"HS256\"]"),
        ("algorithms", "algorithms = [\"none\"]"),
        ("algorithms", "algorithms = [\"RS256\", \"EdDSA\"]"),
        ("leeway", "leeway = \"6m\""),
        (
            "required_claims",
            "required_claims = { email_verified = 1 }",
        ),
        ("required_claims", "required_claims = { \"\" = \"x\" }"),
        ("jwks_url", "jwks_url = \"http://login.example.com/keys\""),
        ("jwks_url", "jwks_url = \"http://127.0.0.1:8080/keys\""),
        ("jwks_url", "jwks_url = \"not a url\""),
        ("issuer", "issuer = []"),
        ("audience", "audience = [\"\"]"),
        ("event", ""),
        ("tenant", ""),
        ("delete_events", ""),
    ];
    for (key, line) in cases {
        let entry = with(JWT, key, line);
        let err = load(&entry).expect_err(&entry);
        assert!(
            err.contains(&format!("sources.s.{key}")),
            "{entry}\n-> {err}"
        );
    }
    // http:// to a non-loopback host stays refused with the loopback switch on.
    let entry = with(
        JWT,
        "jwks_url",
        "jwks_url = \"http://login.example.com/keys\"\nallow_http_loopback = true",
    );
    assert!(load(&entry).unwrap_err().contains("sources.s.jwks_url"));
    let entry = with(
        JWT,
        "jwks_url",
        "jwks_url = \"http://127.0.0.1:8080/keys\"\nallow_http_loopback = true",
    );
    load(&entry).unwrap();
    let entry = with(
        JWT,
        "jwks_url",
        "jwks_url = \"http://[::1]:8080/keys\"\nallow_http_loopback = true",
    );
    load(&entry).unwrap();
}

#[test]
fn a_jwt_source_deduplicates_on_the_tenant_unless_told_otherwise() {
    let config = load(JWT).unwrap();
    assert_eq!(config.sources["s"].dedup, Dedup::Tenant);
    let config = load(&format!("{JWT}\ndedup = {{ pointer = \"/id\" }}")).unwrap();
    assert_eq!(config.sources["s"].dedup, Dedup::Pointer("/id".into()));
    let err = load(&format!("{JWT}\ndedup = \"delivery\"")).unwrap_err();
    assert!(err.contains("sources.s.dedup"), "{err}");
    let rules = crate::sources::jwt::rules(&load(&with(
        JWT,
        "issuer",
        "issuer = [\"https://a\", \"https://b\"]\nalgorithms = [\"PS256\", \"ES384\"]\nleeway = \"0s\"",
    ))
    .unwrap()
    .sources["s"]);
    assert_eq!(rules.issuers, ["https://a", "https://b"]);
    assert_eq!(rules.algorithms.len(), 2);
    assert_eq!(rules.leeway.as_secs(), 0);
}

#[test]
fn atlassian_tables_are_checked_and_filled_with_the_defaults() {
    let config = load(CONNECT).unwrap();
    let s = &config.sources["s"];
    assert_eq!(s.scheme, Scheme::AtlassianConnect);
    assert_eq!(s.tenant, Some(Locator::Pointer("/clientKey".into())));
    assert_eq!(s.delete_events, ["uninstalled"]);
    assert_eq!(s.dedup, Dedup::Tenant);
    let cases = [
        ("audience", "audience = [\"https://a\", \"https://b\"]"),
        ("audience", "audience = \"\""),
        ("key_url", "key_url = \"https://keys.example.com/key\""),
        (
            "key_url",
            "key_url = \"https://keys.example.com/{kid}/{kid}\"",
        ),
        ("key_url", "key_url = \"http://keys.example.com/{kid}\""),
        ("key_url", "key_url = \"http://127.0.0.1:9/{kid}\""),
        ("base_path", "base_path = \"/app/\""),
        ("base_path", "base_path = \"app\""),
        ("base_path", "base_path = \"/app?x\""),
        ("leeway", "leeway = \"1h\""),
        ("issuer", "issuer = \"x\""),
        ("jwks_url", "jwks_url = \"https://x/keys\""),
        ("secret_env", "secret_env = [\"X\"]"),
    ];
    for (key, line) in cases {
        let entry = with(CONNECT, key, line);
        let err = load(&entry).expect_err(&entry);
        assert!(
            err.contains(&format!("sources.s.{key}")),
            "{entry}\n-> {err}"
        );
    }
    for ok in [
        "key_url = \"http://127.0.0.1:9/{kid}\"\nallow_http_loopback = true",
        "base_path = \"/app\"",
        "base_path = \"\"",
        "tenant = { pointer = \"/baseUrl\" }\ndelete_events = [\"uninstalled\", \"disabled\"]",
    ] {
        load(&format!("{CONNECT}\n{ok}")).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}
