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

/// A target that cannot be reached, or a database error, reads as its cause: the server's message
/// and SQLSTATE, not sqlx's pool timeout or PostgreSQL's C source line ("at line N").
#[tokio::test]
async fn plan_and_jobs_name_why_the_database_cannot_be_used() {
    let pg = crate::process::start_pg(None).await;
    // A port nothing listens on: the pool would only have said it timed out.
    let port = crate::helpers::closed_port();
    let down = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let (code, text, _) = run_plan("1", &[], &[("DEPROV_TARGET_URL", &down)]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("cannot reach the target database: "),
        "{text}"
    );
    assert!(text.contains("refused"), "{text}");
    assert!(!text.contains("pool timed out"), "{text}");

    let (code, text, _) = run_plan("1", &[], &[("DEPROV_TARGET_URL", &pg.url("nodb"))]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(r#"database "nodb" does not exist (SQLSTATE 3D000)"#),
        "{text}"
    );
    assert!(!text.contains(" at line "), "{text}");

    // A state database deprov's migrations never ran on.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(["jobs", "--database-url", &pg.url("postgres"), "list"])
        .output()
        .unwrap();
    let text = crate::process::output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            r#"relation "deprov.jobs" does not exist (SQLSTATE 42P01); the state database has no deprov schema yet: run `deprov migrate`"#
        ),
        "{text}"
    );

    // `config check` names the setting a missing root table refuses, as it names the others.
    let (_dir, config) =
        crate::helpers::config_file("[tenant]\nroot_table = \"app.nosuch\"\nkey_column = \"id\"\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(["config", "check"])
        .env("DEPROV_CONFIG", &config)
        .env("DEPROV_TARGET_URL", pg.url("postgres"))
        .env_remove("DEPROV_DATABASE_URL")
        .env_remove("DEPROV_POOLER_MODE")
        .output()
        .unwrap();
    let text = crate::process::output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(
            r#"tenant.root_table: REFUSED: root table "app"."nosuch" not found in the target database"#
        ),
        "{text}"
    );
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

/// A configuration whose bearer token, webhook secrets and notification secret are in variables
/// and a file that do not exist here.
const SECRETS_UNSET: &str = "[sources.billing]\ntoken_env = \"DEPROV_TEST_UNSET_BILLING_TOKEN\"\n\
    [sources.hooks]\nscheme = \"stripe\"\nsecret_env = [\"DEPROV_TEST_UNSET_HOOKS_SECRET\"]\n\
    secret_file = [\"/nonexistent/hooks-secret\"]\ntenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]\n\
    [notifications]\nurl = \"https://example.com/hook\"\nsecret_env = \"DEPROV_TEST_UNSET_SIGNING\"\n";

/// `deprov <args>` with `config` (plus `[tenant] app.accounts`) as `DEPROV_CONFIG` and `target` as
/// `DEPROV_TARGET_URL`: exit status and stdout + stderr.
fn run_with_config(args: &[&str], config: &str, target: &str) -> (Option<i32>, String) {
    let (_dir, path) =
        crate::helpers::config_file(&format!("{config}{}", crate::helpers::TENANT_ACCOUNTS));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(args)
        .env("DEPROV_CONFIG", &path)
        .env("DEPROV_TARGET_URL", target)
        .env_remove("DEPROV_DATABASE_URL")
        .env_remove("DEPROV_POOLER_MODE")
        .output()
        .unwrap();
    (out.status.code(), crate::process::output_text(&out))
}

/// `plan` and `config check` only read the target: they run without any sender's secret, and
/// `config check` says which it did not read. `serve` still refuses to start without them.
#[tokio::test]
async fn read_only_commands_need_no_source_secrets_and_serve_does() {
    let pg = crate::process::start_pg(Some("INSERT INTO app.accounts VALUES (1)")).await;
    let target = pg.url("postgres");
    let (code, text) =
        run_with_config(&["plan", "--tenant", "1", "--json"], SECRETS_UNSET, &target);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("\"root_rows\": 1"), "{text}");
    let (code, text) = run_with_config(&["config", "check"], SECRETS_UNSET, &target);
    assert_eq!(code, Some(0), "{text}");
    for setting in [
        "sources.billing.token_env",
        "sources.hooks.secret_env",
        "sources.hooks.secret_file",
        "notifications.secret_env",
    ] {
        assert!(
            text.contains(&format!(
                "{setting}: not read here (serve and worker read it at start)"
            )),
            "{text}"
        );
    }
    assert!(
        text.contains("tenant.root_table app.accounts (key column id): found"),
        "{text}"
    );

    let err = crate::helpers::refused_at_start(
        "[sources.hooks]\nscheme = \"stripe\"\nsecret_env = [\"DEPROV_TEST_UNSET_HOOKS_SECRET\"]\n\
         tenant = { pointer = \"/x\" }\ndelete_events = [\"a\"]\n",
        "",
    )
    .await;
    assert!(
        err.to_string().contains(
            "sources.hooks.secret_env`: environment variable DEPROV_TEST_UNSET_HOOKS_SECRET is not set"
        ),
        "{err}"
    );
}
