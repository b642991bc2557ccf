//! `deprov plan` (the binary): a missing tenant or an invalid key says so, with its own exit status;
//! the target database comes from the same variables as for `serve`.

/// `deprov plan --tenant <tenant> <args>` with the test configuration and the environment `env`
/// (neither `DEPROV_DATABASE_URL` nor `DEPROV_TARGET_URL` unless in it): exit status, stdout +
/// stderr, and stdout alone.
fn run_plan(tenant: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let (_dir, config) = crate::helpers::config_file(crate::helpers::TENANT_ACCOUNTS);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(["plan", "--tenant", tenant])
        .args(args)
        .env("DEPROV_CONFIG", &config)
        .env_remove("DEPROV_DATABASE_URL")
        .env_remove("DEPROV_TARGET_URL")
        .env_remove("DEPROV_POOLER_MODE")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), crate::process::output_text(&out), stdout)
}

/// `deprov plan` against `pg`'s `postgres` database given as `DEPROV_DATABASE_URL`.
fn plan(pg: &deprov_testkit::Throwaway, tenant: &str) -> (Option<i32>, String) {
    let (code, text, _) = run_plan(tenant, &[], &[("DEPROV_DATABASE_URL", &pg.url("postgres"))]);
    (code, text)
}

#[tokio::test]
async fn plan_says_when_there_is_no_such_tenant_or_the_key_is_invalid() {
    let pg = crate::process::start_pg(Some("INSERT INTO app.accounts VALUES (1)")).await;
    let (code, text) = plan(&pg, "1");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("app"), "{text}");
    let (code, text) = plan(&pg, "9999");
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains(r#"no tenant "9999""#), "{text}");
    let (code, text) = plan(&pg, "abc");
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.contains(r#"tenant key "abc" is not a valid value of app.accounts.id"#),
        "{text}"
    );
    assert!(!text.contains("error returned from database"), "{text}");
}

/// `serve` and `worker` read the target from `DEPROV_TARGET_URL`; `plan` reads only the target, and
/// used to refuse to run without `--database-url` / `DEPROV_DATABASE_URL` all the same (a clap
/// usage error, exit status 2).
#[tokio::test]
async fn plan_reads_the_target_from_deprov_target_url_alone() {
    let pg = crate::process::start_pg(Some("INSERT INTO app.accounts VALUES (1), (2)")).await;
    let target = pg.url("postgres");
    let (code, text, json) = run_plan("1", &["--json"], &[("DEPROV_TARGET_URL", &target)]);
    assert_eq!(code, Some(0), "{text}");
    let report: serde_json::Value = serde_json::from_str(&json).expect(&text);
    assert_eq!(report["tenant_id"], "1", "{report}");
    assert_eq!(report["root_rows"], 1, "{report}");

    // With both, the target is DEPROV_TARGET_URL's (the state database here cannot be reached).
    let down = format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        crate::helpers::closed_port()
    );
    let (code, text, json) = run_plan(
        "2",
        &["--json"],
        &[
            ("DEPROV_TARGET_URL", &target),
            ("DEPROV_DATABASE_URL", &down),
        ],
    );
    assert_eq!(code, Some(0), "{text}");
    let report: serde_json::Value = serde_json::from_str(&json).expect(&text);
    assert_eq!(report["root_rows"], 1, "{report}");

    // With neither, it says which variables it reads.
    let (code, text, _) = run_plan("1", &[], &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("give the target database: DEPROV_TARGET_URL (or DEPROV_DATABASE_URL)"),
        "{text}"
    );
}
