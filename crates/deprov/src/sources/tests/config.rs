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
