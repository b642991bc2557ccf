//! The configured SQL checked against the target at start (`deprov::sqlcheck`): a broken statement
//! stops `deprov serve` naming its setting and the server's error, `deprov config check` says the
//! same, every kind of refusal is named, a valid configuration starts and the check changes nothing,
//! and with the target down at start the worker claims nothing until the check passes while
//! `/readyz` names what the target refuses.

use std::time::Duration;

use deprov_testkit::Throwaway;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{
    TestOptions, VercelMode, accepted, deletion, refusals, refused_at_start, spawn_app_with,
};

const SOFT_DELETE: &str = "UPDATE app.accounts SET deleted_at = now() WHERE id = $1";
const TYPO: &str = "UPDTE app.accounts SET deleted_at = now() WHERE id = $1";

/// Runs `deprov <args>` with `DEPROV_DATABASE_URL` = `pg`'s `postgres` database and a config of
/// `[tenant]` + `extra`; waits at most 30 s for it to exit (it is killed and the test fails
/// otherwise). Returns the exit code and stdout + stderr.
async fn run_to_exit(pg: &Throwaway, args: &[&str], extra: &str) -> (Option<i32>, String) {
    run_on_url_to_exit(&pg.url("postgres"), args, extra).await
}

/// [`run_to_exit`] with `DEPROV_DATABASE_URL` = `url`.
async fn run_on_url_to_exit(url: &str, args: &[&str], extra: &str) -> (Option<i32>, String) {
    run_with_env_to_exit(url, args, extra, &[]).await
}

/// [`run_on_url_to_exit`] with the environment variables `env` set as well.
pub(crate) async fn run_with_env_to_exit(
    url: &str,
    args: &[&str],
    extra: &str,
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("deprov.toml");
    std::fs::write(
        &config,
        format!("[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n{extra}"),
    )
    .unwrap();
    let port = crate::helpers::closed_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(args)
        .env("DEPROV_DATABASE_URL", url)
        .env("DEPROV_CONFIG", &config)
        .env("DEPROV_LISTEN", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .env_remove("DEPROV_TARGET_URL")
        .env_remove("DEPROV_POOLER_MODE")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if tokio::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("deprov {args:?} still running after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = child.wait_with_output().unwrap();
    let text = crate::process::output_text(&out);
    (out.status.code(), text)
}

#[tokio::test]
async fn a_typo_in_a_soft_delete_statement_stops_serve_and_config_check_names_it() {
    let pg = crate::process::start_pg(Some(
        "ALTER TABLE app.accounts ADD COLUMN deleted_at timestamptz; INSERT INTO app.accounts VALUES (1)",
    ))
    .await;
    let broken = format!("[soft_delete]\nstatements = [{SOFT_DELETE:?}, {TYPO:?}]\n");

    let (code, text) = run_to_exit(&pg, &["serve"], &broken).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(
            r#"soft_delete.statements[1]: syntax error at or near "UPDTE" at character 1 (SQLSTATE 42601)"#
        ),
        "{text}"
    );
    assert!(!text.contains("soft_delete.statements[0]"), "{text}");
    assert!(
        !text.contains("Database(") && !text.contains("Some("),
        "{text}"
    );

    let (code, text) = run_to_exit(&pg, &["config", "check"], &broken).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("soft_delete.statements[0]: accepted"),
        "{text}"
    );
    assert!(
        text.contains(r#"soft_delete.statements[1]: REFUSED: syntax error at or near "UPDTE""#),
        "{text}"
    );

    let valid = format!("[soft_delete]\nstatements = [{SOFT_DELETE:?}]\n");
    let (code, text) = run_to_exit(&pg, &["config", "check"], &valid).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("soft_delete.statements[0]: accepted"),
        "{text}"
    );

    // Fixed, it starts as before, and nothing was soft-deleted by any of the checks.
    let process = crate::process::spawn(pg, "serve", &valid).await;
    let ready = process
        .client
        .get(process.url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    let db = crate::process::connect(&process.pg).await;
    let touched: i64 =
        sqlx::query_scalar("SELECT count(*) FROM app.accounts WHERE deleted_at IS NOT NULL")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(touched, 0);
}

#[tokio::test]
async fn every_refused_statement_is_named_with_the_servers_error_and_deprov_does_not_start() {
    let extra = r#"
[sources.shop]
token = "shop-token-0123456789abcdef"
tenant = { pointer = "/tenant" }
tenant_lookup = "SELECT created_at FROM app.accounts WHERE installation_id = $1"
[soft_delete]
statements = [
  "UPDATE app.accounts SET deleted_at = now() WHERE id = $1",
  "UPDATE app.accounts SET deleted = true WHERE id = $1",
  "UPDATE app.accounts SET deleted_at = now() WHERE id = $1 AND installation_id = $2",
  "UPDATE app.accounts SET deleted_at = now()",
]
undo_statements = ["UPDATE app.acounts SET deleted_at = NULL WHERE id = $1"]
orphans = "SELECT id FROM app.accounts WHERE deleted_at IS NOT NULL AND id > $1"
[vercel]
source = "vercel"
tenant_lookup = "SELECT id FROM app.accounts WHERE balance = $1"
"#;
    let err = refused_at_start(
        extra,
        "ALTER TABLE app.accounts ADD COLUMN deleted_at timestamptz, \
         ADD COLUMN balance numeric, ADD COLUMN created_at timestamptz",
    )
    .await;
    let found = refusals(&err);
    assert_eq!(
        found,
        [
            ("soft_delete.statements[1]", Some("42703")),
            ("soft_delete.statements[2]", None),
            ("soft_delete.statements[3]", None),
            ("soft_delete.undo_statements[0]", Some("42P01")),
            ("soft_delete.orphans", None),
            ("sources.shop.tenant_lookup", None),
            ("vercel.tenant_lookup", Some("42883")),
        ],
        "{err}"
    );
    let message = err.to_string();
    for expected in [
        "refuses 7 configured statements",
        "soft_delete.statements[3]: uses no $1: it would do the same whatever the tenant key",
        r#"soft_delete.statements[1]: column "deleted" of relation "accounts" does not exist"#,
        "soft_delete.statements[2]: takes 2 parameters ($1 to $2); only $1 is given (the tenant key)",
        r#"soft_delete.undo_statements[0]: relation "app.acounts" does not exist"#,
        "soft_delete.orphans: takes 1 parameter ($1); the orphans statement is run without any",
        r#"sources.shop.tenant_lookup: its first column "created_at" is of type timestamptz"#,
        "vercel.tenant_lookup: $1 is inferred as numeric, and deprov sends the key as text: \
         operator does not exist: numeric = text",
    ] {
        assert!(message.contains(expected), "{expected}\nnot in: {message}");
    }
}

#[tokio::test]
async fn a_valid_configuration_starts_and_its_check_runs_nothing() {
    let extra = r#"
[sources.shop]
token = "shop-token-0123456789abcdef"
tenant = { pointer = "/tenant" }
tenant_lookup = "SELECT id FROM app.accounts WHERE installation_id = $1"
[soft_delete]
statements = [
  "UPDATE app.accounts SET deleted_at = now() WHERE id = $1",
  "UPDATE app.accounts SET deleted_at = now() WHERE installation_id = $1",
]
undo_statements = ["UPDATE app.accounts SET deleted_at = NULL WHERE id = $1::text::bigint"]
orphans = "SELECT id::int FROM app.accounts WHERE deleted_at IS NOT NULL"
[vercel]
source = "vercel"
tenant_lookup = "SELECT gen_random_uuid() FROM app.accounts WHERE installation_id = $1"
"#;
    let app = spawn_app_with(TestOptions {
        key_type: "bigint",
        vercel: VercelMode::Off,
        extra_config: extra.into(),
        target_setup: "ALTER TABLE app.accounts ADD COLUMN deleted_at timestamptz; \
                       INSERT INTO app.accounts (id, installation_id) VALUES (1, 'i1'), (2, 'i2')"
            .into(),
        ..Default::default()
    })
    .await;
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
    let touched: i64 =
        sqlx::query_scalar("SELECT count(*) FROM app.accounts WHERE deleted_at IS NOT NULL")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(touched, 0);
}

/// Polls `/readyz` until `done(status, body)` or 30 s pass.
async fn readyz_until(
    app: &crate::helpers::TestApp,
    what: &str,
    done: impl Fn(StatusCode, &Value) -> bool,
) -> (StatusCode, Value, Option<String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = app.get("/readyz").await;
        let status = r.status();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let body: Value = r.json().await.unwrap();
        if done(status, &body) {
            return (status, body, retry);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn with_the_target_down_at_start_no_job_is_claimed_until_the_check_passes() {
    // No `deleted_at` yet: the soft delete below names a column the target does not have. The
    // checkpoint keeps it across the immediate stop (the throwaway commits asynchronously).
    let target = crate::process::start_pg(Some("INSERT INTO app.accounts VALUES (1), (2)")).await;
    let saas = crate::process::connect(&target).await;
    sqlx::raw_sql("CHECKPOINT").execute(&saas).await.unwrap();
    saas.close().await;
    target.stop().unwrap();

    let app = spawn_app_with(TestOptions {
        target_url: Some(target.url("postgres")),
        worker: true,
        extra_config: format!(
            "[soft_delete]\nstatements = [{SOFT_DELETE:?}]\n\
             [worker]\npoll_interval = \"20ms\"\nheartbeat_interval = \"100ms\"\n\
             [pools.target]\nmax_connections = 2\nacquire_timeout = \"500ms\"\n"
        ),
        ..Default::default()
    })
    .await;
    // Not checked yet: intake does not need the target, so the service is ready.
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
    let job = accepted(app.post_deletion(&deletion("1")).await).await["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The key column's type is not known yet: a key is stored as sent.
    let early = accepted(app.post_deletion(&deletion("07")).await).await;
    assert_eq!(early["tenant_id"], "07", "{early}");

    target.restart().unwrap();
    let (_, body, retry) = readyz_until(&app, "the refusal", |s, _| {
        s == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    // Read with the check once the target answered: keys are stored as the bigint column prints
    // them.
    let later = accepted(app.post_deletion(&deletion("+07")).await).await;
    assert_eq!(later["tenant_id"], "7", "{later}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(
            r#"soft_delete.statements[0]: column "deleted_at" of relation "accounts" does not exist"#
        ) && detail.contains("SQLSTATE 42703"),
        "{body}"
    );
    assert_eq!(retry.as_deref(), Some("5"));

    // The worker is alive (it heartbeats every 100 ms) and polls every 20 ms, yet claims nothing.
    let since: time::OffsetDateTime = sqlx::query_scalar("SELECT now()")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let beats: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM deprov.workers WHERE heartbeat_at > $1 + interval '500 ms'",
        )
        .bind(since)
        .fetch_one(&app.db)
        .await
        .unwrap();
        if beats > 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no heartbeat");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (state, attempts): (String, i32) =
        sqlx::query_as("SELECT state, attempts FROM deprov.jobs WHERE id = $1::uuid")
            .bind(&job)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("queued", 0));

    // The schema is fixed: the next check passes, the service is ready and the job runs.
    let saas = sqlx::PgPool::connect(&target.url("postgres"))
        .await
        .unwrap();
    sqlx::raw_sql("ALTER TABLE app.accounts ADD COLUMN deleted_at timestamptz")
        .execute(&saas)
        .await
        .unwrap();
    readyz_until(&app, "the check passing", |s, _| s == StatusCode::OK).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let view: Value = app.get_job(&job).await.json().await.unwrap();
        if view["state"] == "completed" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM app.accounts ORDER BY id")
        .fetch_all(&saas)
        .await
        .unwrap();
    assert_eq!(left, [2]);
}

/// PostgreSQL's Describe accepts DDL and utility statements as readily as DML, and some take `$1`
/// (`CREATE TABLE … AS SELECT … $1`, `EXPLAIN ANALYZE DELETE … $1`, which runs its DELETE): as
/// `[soft_delete] statements` or `undo_statements` each is refused by its kind, comments before it
/// or not, while DML (a `WITH` before it included) is accepted. Nothing is run.
#[tokio::test]
async fn ddl_and_utility_statements_are_refused_as_soft_delete_and_undo_statements() {
    let extra = r#"
[soft_delete]
statements = [
  "UPDATE app.accounts SET deleted_at = now() WHERE id = $1",
  "TRUNCATE app.accounts",
  "-- tidy up\n/* really /* nested */ */ drop TABLE app.accounts",
  "WITH gone AS (UPDATE app.accounts SET deleted_at = now() WHERE id = $1 RETURNING id) SELECT count(*) FROM gone",
  "EXPLAIN ANALYZE DELETE FROM app.accounts WHERE id = $1",
]
undo_statements = [
  "CREATE TABLE app.kept AS SELECT * FROM app.accounts WHERE id = $1",
  "GRANT SELECT ON app.accounts TO PUBLIC",
  "/* restore */ UPDATE app.accounts SET deleted_at = NULL WHERE id = $1",
]
"#;
    let setup = "ALTER TABLE app.accounts ADD COLUMN deleted_at timestamptz; \
                 INSERT INTO app.accounts VALUES (1)";
    let err = refused_at_start(extra, setup).await;
    let found = refusals(&err);
    assert_eq!(
        found,
        [
            ("soft_delete.statements[1]", None),
            ("soft_delete.statements[2]", None),
            ("soft_delete.statements[4]", None),
            ("soft_delete.undo_statements[0]", None),
            ("soft_delete.undo_statements[1]", None),
        ],
        "{err}"
    );
    let message = err.to_string();
    let rule = "soft-delete and undo statements must be UPDATE, DELETE, INSERT, MERGE or SELECT";
    for (setting, kind) in [
        ("soft_delete.statements[1]", "TRUNCATE"),
        ("soft_delete.statements[2]", "DROP"),
        ("soft_delete.statements[4]", "EXPLAIN"),
        ("soft_delete.undo_statements[0]", "CREATE"),
        ("soft_delete.undo_statements[1]", "GRANT"),
    ] {
        let expected = format!("{setting}: is a {kind} statement; {rule}");
        assert!(message.contains(&expected), "{expected}\nnot in: {message}");
    }
}

/// A statement using `$2` (or beyond) without `$1` was refused with PostgreSQL's "could not
/// determine data type of parameter $1", which reads as a type problem: it is refused for what it
/// is, a parameter the engine never gives.
#[tokio::test]
async fn a_parameter_beyond_1_without_1_is_refused_in_plain_words() {
    let extra = r#"
[sources.shop]
token = "shop-token-0123456789abcdef"
tenant = { pointer = "/tenant" }
tenant_lookup = "SELECT id FROM app.accounts WHERE installation_id = $3"
[soft_delete]
statements = ["UPDATE app.accounts SET deleted_at = now() WHERE id = $2"]
undo_statements = ["UPDATE app.accounts SET deleted_at = NULL WHERE $1 IS NULL"]
orphans = "SELECT id FROM app.accounts WHERE id = $2"
"#;
    let err = refused_at_start(
        extra,
        "ALTER TABLE app.accounts ADD COLUMN deleted_at timestamptz",
    )
    .await;
    let found = refusals(&err);
    assert_eq!(
        found,
        [
            ("soft_delete.statements[0]", None),
            // `$1` used where no type can be inferred: the server's error stands.
            ("soft_delete.undo_statements[0]", Some("42P18")),
            ("soft_delete.orphans", None),
            ("sources.shop.tenant_lookup", None),
        ],
        "{err}"
    );
    let message = err.to_string();
    for expected in [
        "soft_delete.statements[0]: must use $1 (the tenant key) and no other parameter, but uses $2",
        "soft_delete.undo_statements[0]: could not determine data type of parameter $1",
        "soft_delete.orphans: uses parameters; the orphans statement is run without any",
        "sources.shop.tenant_lookup: must use $1 (the value to look up) and no other parameter, \
         but uses a parameter beyond $1",
    ] {
        assert!(message.contains(expected), "{expected}\nnot in: {message}");
    }
    assert_eq!(
        message.matches("could not determine").count(),
        1,
        "{message}"
    );
}

/// What deprov prints of the server's errors while checking the configuration is the server's
/// message, detail and hint with the SQLSTATE: not sqlx's text for them, which ends in the line of
/// PostgreSQL's C source that raised the error (`… at line 1188`) and leaves the detail out.
#[tokio::test]
async fn the_check_shows_the_servers_message_detail_and_hint_not_its_source_line() {
    let pg = crate::process::start_pg(Some(
        "ALTER TABLE app.accounts ADD COLUMN deleted_at timestamptz; \
         CREATE VIEW app.per_installation AS SELECT id % 10 AS bucket, max(id) AS id \
         FROM app.accounts GROUP BY id % 10",
    ))
    .await;
    let no_source_line = |text: &str| {
        assert!(
            !text.contains(" at line ") && !text.contains("error returned from database"),
            "{text}"
        );
    };

    // A statement the server refuses with a detail and a hint.
    let view =
        "[soft_delete]\nstatements = [\"UPDATE app.per_installation SET id = 0 WHERE id = $1\"]\n";
    let (code, text) = run_to_exit(&pg, &["config", "check"], view).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(
            r#"soft_delete.statements[0]: REFUSED: cannot update view "per_installation"; detail: Views containing GROUP BY are not automatically updatable.; hint: To enable updating the view, provide an INSTEAD OF UPDATE trigger or an unconditional ON UPDATE DO INSTEAD rule. (SQLSTATE 55000)"#
        ),
        "{text}"
    );
    no_source_line(&text);

    // A check that cannot run to its end: the table is locked past `[hard_delete] lock_timeout`.
    let db = crate::process::connect(&pg).await;
    let mut lock = db.begin().await.unwrap();
    sqlx::raw_sql("LOCK app.accounts IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let valid = format!("[soft_delete]\nstatements = [{SOFT_DELETE:?}]\n");
    let (code, text) = run_to_exit(&pg, &["config", "check"], &valid).await;
    lock.rollback().await.unwrap();
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(
            "cannot check the configured statements on the target database: \
             canceling statement due to lock timeout (SQLSTATE 55P03)"
        ),
        "{text}"
    );
    no_source_line(&text);

    // A target database that does not exist.
    let (code, text) =
        run_on_url_to_exit(&pg.url("no_such_db"), &["config", "check"], &valid).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(r#"database "no_such_db" does not exist (SQLSTATE 3D000)"#),
        "{text}"
    );
    no_source_line(&text);
}

/// An operator command whose state database refuses connections says where it tried and why: its pool alone retried the refused connection for 10 s and then printed only
/// `pool timed out while waiting for an open connection`.
#[tokio::test]
async fn an_operator_command_names_the_state_database_it_cannot_reach_and_why() {
    let port = crate::helpers::closed_port();
    let down = format!("postgres://postgres@127.0.0.1:{port}/deprov_state");
    for args in [&["jobs", "list"][..], &["kill-switch", "status"][..]] {
        let (code, text) = run_on_url_to_exit(&down, args, "").await;
        assert_eq!(code, Some(1), "{args:?}: {text}");
        assert!(
            text.contains(&format!(
                "cannot reach the state database at 127.0.0.1:{port}/deprov_state: "
            )) && text.contains("Connection refused"),
            "{args:?}: {text}"
        );
        assert!(!text.contains("pool timed out"), "{args:?}: {text}");
    }
}

/// A target that refuses connections is named so: sqlx's pool retries a refused connection until
/// its acquire timeout and reported only `pool timed out while waiting for an open connection`,
/// both in `deprov config check` and in the warning `deprov serve` logs when it starts without its
/// target.
#[tokio::test]
async fn a_target_refusing_connections_is_reported_as_refused_not_as_a_pool_timeout() {
    let down = format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        crate::helpers::closed_port()
    );
    let quick = "[pools.target]\nmax_connections = 2\nacquire_timeout = \"200ms\"\n";
    let (code, text) = run_on_url_to_exit(&down, &["config", "check"], quick).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("cannot reach the target database to check the configuration: ")
            && text.contains("Connection refused"),
        "{text}"
    );
    assert!(!text.contains("pool timed out"), "{text}");

    // `serve` starts without its target and says why in its warning.
    let pg = crate::process::start_pg(None).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("deprov.toml");
    std::fs::write(
        &config,
        format!("[tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n{quick}"),
    )
    .unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .arg("serve")
        .env("DEPROV_DATABASE_URL", pg.url("postgres"))
        .env("DEPROV_TARGET_URL", &down)
        .env("DEPROV_CONFIG", &config)
        .env(
            "DEPROV_LISTEN",
            format!("127.0.0.1:{}", crate::helpers::closed_port()),
        )
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .env_remove("DEPROV_POOLER_MODE")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let warning = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if let Some(line) = text
            .lines()
            .find(|l| l.contains("target database not reachable at start"))
        {
            break line.to_owned();
        }
        if tokio::time::Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("no start-up warning about the target: {text}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(warning.contains("Connection refused"), "{warning}");
    assert!(!warning.contains("pool timed out"), "{warning}");
}
