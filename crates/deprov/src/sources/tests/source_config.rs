//! `[sources.NAME]` parsing: README and example entries, errors naming the key.

use super::*;

// ---- configuration ----

/// `text` (source tables) with every secret list pointed at one file, plus a `[tenant]`, parsed.
fn with_secret_files(text: &str) -> crate::config::Config {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD\n").unwrap();
    let file_line = format!("secret_file = [{:?}]", secret.display().to_string());
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("secret_env") || l.starts_with("secret_file") {
                file_line.clone()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let tenant = if text.contains("[tenant]") {
        ""
    } else {
        "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n"
    };
    crate::config::Config::from_toml(&format!("{text}\n{tenant}")).unwrap()
}

/// The README's `[sources.NAME]` entries (section "Signed senders"), with each secret list pointed
/// at a file, are a valid configuration with the documented defaults.
#[test]
fn the_readme_entries_are_valid_configuration() {
    let readme = include_str!("../../../../../README.md");
    let section = readme.split("## Signed senders").nth(1).unwrap();
    let block = section
        .split("```toml\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let config = with_secret_files(block);
    let schemes: Vec<Scheme> = config.sources.values().map(|s| s.scheme).collect();
    for scheme in Scheme::ALL.into_iter().filter(|&s| s != Scheme::Bearer) {
        assert!(schemes.contains(&scheme), "README has no {scheme:?} entry");
    }
    let acme = &config.sources["acme"];
    assert_eq!(acme.keys.0.len(), 1);
    assert_eq!(acme.tolerance(), DEFAULT_TOLERANCE);
    assert_eq!(format!("{:?}", acme.keys), "Keys(1 redacted)");
    assert!(
        !format!("{config:?}").contains("C2FVsBQIhrscChlQIMV"),
        "secrets never in Debug"
    );
    assert_eq!(config.sources["vercel-hooks"].dedup, Dedup::Tenant);
}

#[test]
fn bad_source_entries_are_named() {
    let base = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";
    let cases = [
        (
            "scheme = \"stripe\"\ntenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]",
            "sources.s.secret_env",
        ),
        (
            "scheme = \"stripe\"\nsecret_env = [\"DEPROV_TEST_UNSET_VAR_7\"]\ntenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]",
            "DEPROV_TEST_UNSET_VAR_7",
        ),
        (
            "scheme = \"stripe\"\nsecret_file = [\"/nonexistent/x\"]\ntenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]",
            "sources.s.secret_file",
        ),
        (
            "scheme = \"github\"\ntoken = \"0123456789abcdef0\"",
            "sources.s.token",
        ),
        (
            "scheme = \"vercel-oidc\"\nissuer = \"i\"\naudience = \"a\"",
            "sources.s.jwks_url",
        ),
        ("scheme = \"smtp\"", "smtp"),
        (
            "token = \"0123456789abcdef0\"\ntolerance = \"5m\"",
            "sources.s.tolerance",
        ),
        (
            "token = \"0123456789abcdef0\"\ntenant = { header = \"X Shop\" }",
            "sources.s.tenant",
        ),
        (
            "token = \"0123456789abcdef0\"\ndedup = { pointer = \"id\" }",
            "sources.s.dedup",
        ),
    ];
    for (entry, key) in cases {
        let err = crate::config::Config::from_toml(&format!("[sources.s]\n{entry}\n{base}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{entry:?} -> {err}");
    }
}

/// `deploy/example.toml` with its commented signed senders uncommented is valid too.
#[test]
fn the_example_signed_senders_are_valid_once_uncommented() {
    let example = include_str!("../../../../../deploy/example.toml")
        .replace(
            "token_env = \"DEPROV_BILLING_TOKEN\"",
            "token = \"billing-token-0123456789\"",
        )
        .replace(
            "token_env = \"DEPROV_VERCEL_TOKEN\"",
            "token = \"vercel-token-0123456789\"",
        );
    let mut out = Vec::new();
    let mut in_block = false;
    for line in example.lines() {
        if line.starts_with("# [sources.") {
            in_block = true;
        }
        match line
            .strip_prefix("# ")
            .or_else(|| (line == "#").then_some(""))
        {
            Some(rest) if in_block => out.push(rest.to_owned()),
            _ => {
                in_block = false;
                out.push(line.to_owned());
            }
        }
    }
    let config = with_secret_files(&out.join("\n"));
    for name in ["stripe", "github", "vercel-hooks"] {
        assert!(config.sources[name].scheme.is_hmac(), "{name}");
    }
    assert_eq!(config.sources["platform"].scheme, Scheme::Basic);
    assert_eq!(config.osb.unwrap().source, "platform");
}

/// A scheme says it has a delivery ID exactly when the payload layer knows where it is.
#[test]
fn a_delivery_id_is_declared_where_one_is_read() {
    for scheme in Scheme::ALL {
        assert_eq!(
            scheme.has_delivery_id(),
            crate::sources::payload::default_delivery(scheme).is_some(),
            "{}",
            scheme.as_str()
        );
    }
}

/// A minimal valid `[sources.s]` body for `scheme`, with its secret in an environment variable
/// (unread: parsed with [`crate::config::Secrets::Skip`]).
fn minimal_entry(scheme: Scheme) -> String {
    let name = scheme.as_str();
    match scheme {
        Scheme::Bearer => "token = \"0123456789abcdef0\"".into(),
        Scheme::AwsSns => format!(
            "scheme = \"{name}\"\ntopic_arns = [\"arn:aws:sns:us-east-1:1:t\"]\n\
             tenant = {{ pointer = \"/Message/x\" }}\ndelete_events = [\"a\"]"
        ),
        Scheme::VercelOidc => format!(
            "scheme = \"{name}\"\njwks_url = \"https://example.com/jwks\"\nissuer = \"i\"\naudience = \"a\""
        ),
        Scheme::Jwt => format!(
            "scheme = \"{name}\"\njwks_url = \"https://example.com/jwks\"\nissuer = \"i\"\naudience = \"a\"\n\
             tenant = {{ pointer = \"/x\" }}\nevent = {{ pointer = \"/t\" }}\ndelete_events = [\"a\"]"
        ),
        Scheme::AtlassianConnect => {
            format!("scheme = \"{name}\"\naudience = \"https://app.example.com\"")
        }
        Scheme::Basic => format!(
            "scheme = \"{name}\"\nusername = \"platform\"\nsecret_env = [\"DEPROV_TEST_UNSET_VAR_8\"]"
        ),
        _ => format!(
            "scheme = \"{name}\"\nsecret_env = [\"DEPROV_TEST_UNSET_VAR_8\"]\n\
             tenant = {{ pointer = \"/x\" }}\ndelete_events = [\"a\"]"
        ),
    }
}

/// A value of each `[sources.NAME]` key, as it would be written.
fn sample_value(key: &str) -> &'static str {
    match key {
        "token" => "\"fedcba9876543210f\"",
        "token_env" => "\"DEPROV_TEST_UNSET_VAR_9\"",
        "secret_env" => "[\"DEPROV_TEST_UNSET_VAR_9\"]",
        "secret_file" => "[\"/nonexistent/secret\"]",
        "tolerance" => "\"1m\"",
        "tenant" | "event" => "{ header = \"x-tenant\" }",
        "tenant_lookup" => "\"SELECT id FROM app.accounts WHERE slug = $1\"",
        "delete_events" => "[\"a\"]",
        "restore_events" => "[\"b\"]",
        "reinstalls" => "\"any\"",
        "dedup" => "\"tenant\"",
        "jwks_url" => "\"https://example.com/jwks\"",
        "jwks_file" => "\"/nonexistent/jwks.json\"",
        "issuer" | "audience" => "\"x\"",
        "timestamp" => "\"/createdAt\"",
        "max_age" => "\"5m\"",
        "algorithms" => "[\"RS256\"]",
        "required_claims" => "{ email = \"x@example.com\" }",
        "leeway" => "\"30s\"",
        "key_url" => "\"https://keys.example.com/{kid}\"",
        "base_path" => "\"/app\"",
        "allow_http_loopback" => "true",
        "decode" => "[{ pointer = \"/Message\", as = \"json\" }]",
        "topic_arns" => "[\"arn:aws:sns:us-east-1:1:t\"]",
        "cert_hosts" => "[\"sns.*.amazonaws.com\"]",
        "cert_roots_file" => "\"/nonexistent/roots.pem\"",
        "confirm_subscriptions" => "true",
        "username" => "\"platform\"",
        other => panic!("no sample for {other}"),
    }
}

/// The keys each scheme ignores, as the request paths read them: bearer sources send deletion
/// requests and webhooks, HMAC sources webhooks, and `vercel-oidc` only the partner API's
/// `DELETE /v1/installations/{id}` (whose lookup is `[vercel] tenant_lookup`).
fn unused_by(scheme: Scheme) -> Vec<&'static str> {
    let oidc = ["jwks_url", "jwks_file", "issuer", "audience"];
    let token = [
        "algorithms",
        "required_claims",
        "leeway",
        "key_url",
        "base_path",
        "allow_http_loopback",
    ];
    let signed = [
        "token",
        "token_env",
        "secret_env",
        "secret_file",
        "tolerance",
        "timestamp",
        "max_age",
    ];
    let sns = [
        "topic_arns",
        "cert_hosts",
        "cert_roots_file",
        "confirm_subscriptions",
    ];
    let mut out = match scheme {
        Scheme::Bearer => vec![
            "secret_env",
            "secret_file",
            "tolerance",
            "timestamp",
            "max_age",
        ],
        Scheme::VercelOidc => vec![
            "token",
            "token_env",
            "secret_env",
            "secret_file",
            "tolerance",
            "timestamp",
            "max_age",
            "tenant",
            "tenant_lookup",
            "event",
            "delete_events",
            "restore_events",
            "reinstalls",
            "dedup",
            "decode",
        ],
        Scheme::AwsSns => vec![
            "token",
            "token_env",
            "secret_env",
            "secret_file",
            "timestamp",
            "max_age",
        ],
        Scheme::StandardWebhooks | Scheme::Stripe | Scheme::Slack => {
            vec!["token", "token_env", "timestamp", "max_age"]
        }
        Scheme::Github | Scheme::Shopify | Scheme::VercelWebhook => {
            vec!["token", "token_env", "tolerance"]
        }
        Scheme::Jwt => [&signed[..], &["key_url", "base_path"]].concat(),
        Scheme::AtlassianConnect => [
            &signed[..],
            &[
                "jwks_url",
                "jwks_file",
                "issuer",
                "algorithms",
                "required_claims",
            ],
        ]
        .concat(),
        Scheme::Basic => vec!["token", "token_env", "tolerance", "timestamp", "max_age"],
    };
    if scheme != Scheme::Basic {
        out.push("username");
    }
    if !matches!(
        scheme,
        Scheme::VercelOidc | Scheme::Jwt | Scheme::AtlassianConnect
    ) {
        out.extend(oidc);
    }
    if !scheme.is_token() {
        out.extend(token);
    }
    if scheme != Scheme::AwsSns {
        out.extend(sns);
    }
    out
}

/// Every key a scheme does not use is refused by name, for every scheme; every key it uses is
/// not refused as unused.
#[test]
fn every_scheme_refuses_the_keys_it_does_not_use() {
    use crate::config::{Config, Secrets};
    let base = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";
    for scheme in Scheme::ALL {
        let entry = minimal_entry(scheme);
        Config::from_toml_with(&format!("[sources.s]\n{entry}\n{base}"), Secrets::Skip)
            .unwrap_or_else(|e| panic!("{}: {e}", scheme.as_str()));
        let unused = unused_by(scheme);
        for key in SOURCE_KEYS {
            if entry.lines().any(|l| l.starts_with(&format!("{key} ="))) {
                continue;
            }
            let text = format!(
                "[sources.s]\n{entry}\n{key} = {}\n{base}",
                sample_value(key)
            );
            let result = Config::from_toml_with(&text, Secrets::Skip);
            let refused = format!(
                "configuration key `sources.s.{key}`: not used by scheme {}",
                scheme.as_str()
            );
            match result {
                Err(e) if unused.contains(&key) => {
                    assert!(e.to_string().starts_with(&refused), "{text}\n-> {e}");
                }
                Err(e) => assert!(!e.to_string().contains("not used by"), "{text}\n-> {e}"),
                Ok(_) => assert!(!unused.contains(&key), "{text}\n accepted"),
            }
        }
    }
    // The example of a Vercel partner-API source with webhook keys.
    let err = Config::from_toml_with(
        &format!(
            "[sources.vercel]\n{}\ntenant = {{ pointer = \"/x\" }}\ndelete_events = [\"a\"]\n{base}",
            minimal_entry(Scheme::VercelOidc)
        ),
        Secrets::Skip,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with(
            "configuration key `sources.vercel.tenant`: not used by scheme vercel-oidc"
        ),
        "{err}"
    );
    // `dedup = "delivery"` written out where the scheme has no delivery ID.
    let err = Config::from_toml_with(
        &format!(
            "[sources.s]\n{}\ndedup = \"delivery\"\n{base}",
            minimal_entry(Scheme::Bearer)
        ),
        Secrets::Skip,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("sources.s.dedup") && err.contains("sends no delivery ID"),
        "{err}"
    );
}

/// `timestamp` and `max_age` go together, the first a JSON pointer, the second 1s..=7d.
#[test]
fn a_body_timestamp_needs_its_max_age_and_a_pointer() {
    use crate::config::{Config, Secrets};
    let base = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";
    let entry = minimal_entry(Scheme::VercelWebhook);
    let load = |keys: &str| {
        Config::from_toml_with(
            &format!("[sources.s]\n{entry}\n{keys}\n{base}"),
            Secrets::Skip,
        )
    };
    let config = load("timestamp = \"/createdAt\"\nmax_age = \"10m\"").unwrap();
    let s = &config.sources["s"];
    assert_eq!(s.timestamp.as_deref(), Some("/createdAt"));
    assert_eq!(s.max_age, Some(std::time::Duration::from_secs(600)));
    for (keys, key, reason) in [
        (
            "timestamp = \"/createdAt\"",
            "max_age",
            "required with timestamp",
        ),
        ("max_age = \"10m\"", "timestamp", "required with max_age"),
        (
            "timestamp = \"createdAt\"\nmax_age = \"10m\"",
            "timestamp",
            "JSON pointer",
        ),
        (
            "timestamp = \"/createdAt\"\nmax_age = \"8d\"",
            "max_age",
            "between 1s and 7d",
        ),
    ] {
        let err = load(keys).unwrap_err().to_string();
        assert!(
            err.contains(&format!("sources.s.{key}")) && err.contains(reason),
            "{keys}\n-> {err}"
        );
    }
}

/// [`SOURCE_KEYS`] (and `scheme`) are exactly the keys a `[sources.NAME]` table accepts, so a key
/// added later is checked against every scheme too.
#[test]
fn the_source_keys_are_every_key_of_a_source_table() {
    let err = toml::from_str::<SourceConfig>("no_such_key = 1")
        .unwrap_err()
        .to_string();
    let expected = err.split("expected one of").nth(1).expect(&err);
    let mut accepted: Vec<&str> = expected
        .split(',')
        .map(|k| k.trim().trim_matches('`'))
        .filter(|k| !k.is_empty())
        .collect();
    accepted.sort_unstable();
    let mut keys: Vec<&str> = SOURCE_KEYS.iter().copied().chain(["scheme"]).collect();
    keys.sort_unstable();
    assert_eq!(accepted, keys, "{err}");
}

/// Without the secrets (`plan`, `config check`, …) a file whose secret variables and files are
/// absent loads, every other value still checked; with them (`serve`, `worker`) it is refused
/// naming the variable or file.
#[test]
fn secrets_are_read_only_when_asked_for() {
    use crate::config::{Config, Secrets};
    let text = "[sources.billing]\ntoken_env = \"DEPROV_TEST_UNSET_VAR_10\"\n\
                [sources.hooks]\nscheme = \"stripe\"\nsecret_env = [\"DEPROV_TEST_UNSET_VAR_11\"]\n\
                secret_file = [\"/nonexistent/hooks-secret\"]\n\
                tenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]\n\
                [notifications]\nurl = \"https://example.com/hook\"\nsecret_env = \"DEPROV_TEST_UNSET_VAR_12\"\n\
                [tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";
    let config = Config::from_toml_with(text, Secrets::Skip).unwrap();
    assert_eq!(
        config.secret_settings(),
        [
            "sources.billing.token_env",
            "sources.hooks.secret_env",
            "sources.hooks.secret_file",
            "notifications.secret_env"
        ]
    );
    assert!(config.sources["hooks"].keys.0.is_empty());
    assert!(config.source_tokens().is_empty());
    // Each secret on its own, read: refused naming its variable or file.
    let tenant = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";
    let hooks = "[sources.hooks]\nscheme = \"stripe\"\ntenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]\n";
    for (entry, named) in [
        (
            "[sources.billing]\ntoken_env = \"DEPROV_TEST_UNSET_VAR_10\"\n".to_owned(),
            "sources.billing`: token_env: environment variable DEPROV_TEST_UNSET_VAR_10 is not set",
        ),
        (
            format!("{hooks}secret_env = [\"DEPROV_TEST_UNSET_VAR_11\"]\n"),
            "sources.hooks.secret_env`: environment variable DEPROV_TEST_UNSET_VAR_11 is not set",
        ),
        (
            format!("{hooks}secret_file = [\"/nonexistent/hooks-secret\"]\n"),
            "sources.hooks.secret_file`: /nonexistent/hooks-secret",
        ),
        (
            "[notifications]\nurl = \"https://example.com/hook\"\nsecret_env = \"DEPROV_TEST_UNSET_VAR_12\"\n"
                .to_owned(),
            "notifications.secret_env`: environment variable DEPROV_TEST_UNSET_VAR_12 is not set",
        ),
    ] {
        let text = format!("{entry}{tenant}");
        Config::from_toml_with(&text, Secrets::Skip).unwrap();
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(err.contains(named), "{err}");
    }
    // The rest is checked all the same: a short literal token, a source without any secret.
    let short = text.replace(
        "token_env = \"DEPROV_TEST_UNSET_VAR_10\"",
        "token = \"short\"",
    );
    let err = Config::from_toml_with(&short, Secrets::Skip)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sources.billing.token"), "{err}");
    let no_secret = text
        .replace("secret_env = [\"DEPROV_TEST_UNSET_VAR_11\"]\n", "")
        .replace("secret_file = [\"/nonexistent/hooks-secret\"]\n", "");
    let err = Config::from_toml_with(&no_secret, Secrets::Skip)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sources.hooks.secret_env"), "{err}");
}

/// `serve` and `worker` ([`Secrets::Read`]) read and parse a `jwks_file` at start and refuse a
/// missing, unparsable or keyless one, naming the key, the path and the reason; other commands
/// leave it unread.
#[test]
fn a_jwks_file_that_cannot_be_used_stops_the_start() {
    use crate::config::{Config, Secrets};
    let base = "[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n";
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::copy(
        format!(
            "{}/tests/fixtures/oidc/jwks-a.json",
            env!("CARGO_MANIFEST_DIR")
        ),
        &good,
    )
    .unwrap();
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{ \"keys\": [").unwrap();
    let symmetric = dir.path().join("symmetric.json");
    std::fs::write(
        &symmetric,
        r#"{"keys":[{"kty":"oct","kid":"k","k":"c2VjcmV0"}]}"#,
    )
    .unwrap();
    let missing = dir.path().join("missing.json");
    for scheme in [Scheme::Jwt, Scheme::VercelOidc] {
        let text = |path: &std::path::Path| {
            let entry = minimal_entry(scheme).replace(
                "jwks_url = \"https://example.com/jwks\"",
                &format!("jwks_file = {:?}", path.display().to_string()),
            );
            format!("[sources.s]\n{entry}\n{base}")
        };
        Config::from_toml(&text(&good)).unwrap();
        for (path, reason) in [
            (&missing, "No such file or directory"),
            (&broken, "not a JWKS"),
            (&symmetric, "no usable key"),
        ] {
            let err = Config::from_toml(&text(path)).unwrap_err().to_string();
            let prefix = format!(
                "configuration key `sources.s.jwks_file`: {}: ",
                path.display()
            );
            assert!(
                err.starts_with(&prefix) && err.contains(reason),
                "{scheme:?} {path:?}: {err}"
            );
            Config::from_toml_with(&text(path), Secrets::Skip).unwrap();
        }
    }
}
