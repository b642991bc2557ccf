//! Checks of the rules in the module docs.

use std::path::Path;

/// The service's modules open no unbounded transaction and bypass no pooler rule: every query goes
/// through `db::query*` (unnamed in transaction pooler mode) and every transaction through
/// `db::begin` / `db::begin_on` (bounded), and every connection through `db::acquire` (the one
/// instrumented `Pool::acquire`, in `db/mod.rs`, which times the wait for `/metrics`). The demo and
/// the benchmarks run on their own throwaway servers and are not checked.
#[test]
fn service_statements_are_unnamed_and_bounded() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![
        root.join("queue"),
        root.join("engine"),
        root.join("worker"),
        root.join("http"),
        root.join("cli"),
        root.join("telemetry"),
        root.join("app"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.extend(["worker.rs", "cli.rs", "sqlcheck.rs"].map(|f| root.join(f)));
    let mut offences = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            for bad in [
                "sqlx::query(",
                "sqlx::query_as",
                "sqlx::query_scalar",
                ".begin()",
                "set_config(",
                "SET LOCAL",
                ".acquire()",
            ] {
                if line.contains(bad) && !line.trim_start().starts_with("//") {
                    offences.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "use db::query* and db::begin:\n{}",
        offences.join("\n")
    );
}

#[test]
fn transaction_mode_refuses_startup_options_and_migrations() {
    use super::{PoolerMode, connect_options};
    let with = connect_options("postgres://u@h/db?options=-c%20search_path%3Dx").unwrap();
    let without = connect_options("postgres://u@h/db").unwrap();
    assert!(PoolerMode::Transaction.check_url(&with).is_err());
    assert!(PoolerMode::Transaction.check_url(&without).is_ok());
    assert!(PoolerMode::Session.check_url(&with).is_ok());
    assert!(!PoolerMode::Transaction.allows_migrations());
    assert!(PoolerMode::Session.allows_migrations());
}

#[test]
fn only_postgres_urls_are_taken() {
    use super::connect_options;
    for ok in [
        "postgres://u@h/db",
        "postgresql://u@h:5433/db",
        "POSTGRES://u@h/db",
    ] {
        assert!(connect_options(ok).is_ok(), "{ok}");
    }
    for bad in ["mysql://x", "http://h/db", "h/db", ""] {
        let e = connect_options(bad).expect_err(bad).to_string();
        assert!(e.contains("postgres://"), "{bad}: {e}");
    }
}
