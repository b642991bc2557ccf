//! Checks of the rules in the module docs.

use std::path::Path;

/// The service's modules set no session or transaction setting by SQL text: the bounds of every
/// transaction are `db::begin`'s (`SET LOCAL` and `set_config` live in `db/` and `sql.rs`). The
/// calls themselves — sqlx's `query*`, `begin` and `acquire` outside `db/` — are refused by clippy
/// (`disallowed-methods` in `clippy.toml`); this checks what clippy cannot see, the SQL inside
/// strings. Every file under `src/` is checked except those that implement the rule (`db/`,
/// `sql.rs`): a new module is checked without being listed. (The demo, the benchmarks and the test
/// kit, which run on their own throwaway servers, are crates of their own.)
#[test]
fn service_statements_set_no_bounds_of_their_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let exempt = ["db", "sql.rs"].map(|p| root.join(p));
    let files: Vec<_> = crate::layout_tests::source_tree()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .filter(|p| !exempt.iter().any(|e| p.starts_with(e)))
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with("notify/dispatch/mod.rs"))
            && files
                .iter()
                .any(|f| f.ends_with("worker/run/hard_delete/committed.rs")),
        "the walk reaches nested service modules"
    );
    let mut offences = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            for bad in ["set_config(", "SET LOCAL"] {
                if line.contains(bad) && !line.trim_start().starts_with("//") {
                    offences.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "use db::begin and db::set_local_statement_timeout:\n{}",
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
