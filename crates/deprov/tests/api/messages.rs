//! What people read: refusal details and `--help` text in plain words, not Rust `Debug` output or
//! rustdoc links.

use reqwest::StatusCode;

use crate::helpers::assert_problem;
use crate::signed::{fixture, github_delivery, shopify_delivery, spawn_signed};

fn without(mut d: crate::signed::Delivery, header: &str) -> crate::signed::Delivery {
    d.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(header));
    d
}

#[tokio::test]
async fn a_delivery_missing_its_tenant_or_dedup_key_is_refused_in_plain_words() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_signed(&dir, false).await;
    let body = fixture("shopify_shop.redact.json");
    let no_shop = without(
        shopify_delivery("shop/redact", "evt_1", &body),
        "X-Shopify-Shop-Domain",
    );
    let problem = assert_problem(
        app.deliver(&no_shop).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains(r#"sources.shopify.tenant points (header "X-Shopify-Shop-Domain")"#),
        "{detail}"
    );
    let body = fixture("github_installation.deleted.json");
    let no_id = without(
        github_delivery("installation", "d-1", &body),
        "X-GitHub-Delivery",
    );
    let problem = assert_problem(app.deliver(&no_id).await, StatusCode::UNPROCESSABLE_ENTITY).await;
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("sources.github.dedup = delivery (the sender's delivery ID)"),
        "{detail}"
    );
    for detail in [detail, problem.to_string().as_str()] {
        assert!(
            !detail.contains("Some(") && !detail.contains("Header("),
            "{detail}"
        );
    }
    app.assert_nothing_stored_at_all().await;
}

/// Every subcommand's `--help`: no rustdoc intra-doc links (clap prints doc comments as help).
#[test]
fn help_texts_have_no_rustdoc_links() {
    let commands: &[&[&str]] = &[
        &[],
        &["serve"],
        &["worker"],
        &["migrate"],
        &["plan"],
        &["kill-switch", "on"],
        &["kill-switch", "off"],
        &["jobs", "list"],
        &["jobs", "retry"],
        &["jobs", "cancel"],
        &["audit", "list"],
        &["tokens", "create"],
        &["notifications", "list"],
        &["notifications", "redrive"],
        &["config", "check"],
    ];
    for args in commands {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
            .args(*args)
            .arg("--help")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(text.contains("Usage"), "{args:?}: {text}");
        for link in ["[`", "`]", "crate::", "Self::"] {
            assert!(
                !text.contains(link),
                "{args:?} --help shows {link:?}:\n{text}"
            );
        }
    }
}

/// A configuration file that is not valid TOML stops `deprov serve` and `deprov config check` with
/// the parser's error printed once: the report repeated, under `Caused by:`, the TOML error the
/// message already holds.
#[test]
fn a_toml_error_in_the_configuration_is_printed_once() {
    let (_dir, config) =
        crate::helpers::config_file("[tenant]\nroot_table = \"app.accounts\nkey_column = \"id\"\n");
    for args in [&["serve"][..], &["config", "check"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
            .args(args)
            .env("DEPROV_DATABASE_URL", "postgres://127.0.0.1:1/x")
            .env("DEPROV_CONFIG", &config)
            .env("DEPROV_LISTEN", "127.0.0.1:0")
            .env_remove("DEPROV_TARGET_URL")
            .env_remove("DEPROV_POOLER_MODE")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(
            stderr.matches("TOML parse error at line 2").count(),
            1,
            "{args:?}: {stderr}"
        );
        assert_eq!(
            stderr.matches(r#"root_table = "app.accounts"#).count(),
            1,
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("Caused by"), "{args:?}: {stderr}");
    }
}
