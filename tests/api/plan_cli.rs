//! `deprov plan` (the binary): a missing tenant or an invalid key says so, with its own exit status.

/// `deprov plan` against `pg`'s `postgres` database: exit status and stdout + stderr.
fn plan(pg: &deprov::throwaway::Throwaway, tenant: &str) -> (Option<i32>, String) {
    let (_dir, config) = crate::helpers::config_file(crate::helpers::TENANT_ACCOUNTS);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(["plan", "--tenant", tenant])
        .env("DEPROV_DATABASE_URL", pg.url("postgres"))
        .env("DEPROV_CONFIG", &config)
        .env_remove("DEPROV_TARGET_URL")
        .output()
        .unwrap();
    let text = crate::process::output_text(&out);
    (out.status.code(), text)
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
