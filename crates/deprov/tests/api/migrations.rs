//! Started with migrations off (`--migrate false` / `DEPROV_MIGRATE=false`, as behind a transaction
//! pooler) on a state database that lacks a migration of this build, deprov refuses to start and
//! names `deprov migrate`, instead of failing every request (intake calls `deprov.record_first`,
//! made by migration 7).

use crate::process::{connect, start_pg};
use crate::sqlcheck::run_with_env_to_exit;

#[tokio::test]
async fn serve_and_worker_refuse_a_state_database_missing_a_migration() {
    let pg = start_pg(None).await;
    let db = connect(&pg).await;
    deprov::db::migrate(&db).await.unwrap();
    assert_eq!(
        deprov::db::pending_migrations(&db).await.unwrap(),
        Vec::<i64>::new()
    );
    // The database as an older deprov left it: migration 7 never ran.
    sqlx::raw_sql(
        "DROP FUNCTION deprov.record_first; DELETE FROM _sqlx_migrations WHERE version = 7",
    )
    .execute(&db)
    .await
    .unwrap();
    assert_eq!(deprov::db::pending_migrations(&db).await.unwrap(), vec![7]);
    // Turned off by the environment variable or by the flag: the refusal is right for both.
    let by_env = [("DEPROV_MIGRATE", "false")];
    for (args, env) in [
        (&["serve"][..], &by_env[..]),
        (&["worker"], &by_env),
        (&["serve", "--migrate", "false"], &[]),
        (&["worker", "--migrate=false"], &[]),
    ] {
        let (code, text) = run_with_env_to_exit(&pg.url("postgres"), args, "", env).await;
        assert_eq!(code, Some(1), "{args:?}: {text}");
        assert!(
            text.contains(
                "with migrations off (--migrate false or DEPROV_MIGRATE=false), \
                 the state database lacks migration(s) [7]"
            ) && text.contains("deprov migrate"),
            "{args:?}: {text}"
        );
        assert!(!text.contains("setting DEPROV_MIGRATE"), "{args:?}: {text}");
    }
    // `deprov migrate` applies it, and then deprov starts (its SQL check and readiness follow).
    let (code, text) = run_with_env_to_exit(&pg.url("postgres"), &["migrate"], "", &[]).await;
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(
        deprov::db::pending_migrations(&db).await.unwrap(),
        Vec::<i64>::new()
    );
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'record_first')")
            .fetch_one(&db)
            .await
            .unwrap();
    assert!(exists);
}

/// `/readyz` of the server at `base`: status and problem `detail` (empty when ready).
async fn readyz(base: &str) -> (u16, String) {
    let r = reqwest::get(format!("{base}/readyz")).await.unwrap();
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap();
    (status, body["detail"].as_str().unwrap_or("").to_owned())
}

/// Started while the state database is down, deprov cannot check its migrations at start: it must
/// not then report ready on a database missing one (every request would fail), and it becomes
/// ready without a restart once `deprov migrate` has run.
#[tokio::test]
async fn started_while_the_state_database_is_down_readiness_waits_for_a_missing_migration() {
    use deprov::app::{Application, Settings};
    let pg = start_pg(None).await;
    let db = connect(&pg).await;
    deprov::db::migrate(&db).await.unwrap();
    sqlx::raw_sql(
        "DROP FUNCTION deprov.record_first; DELETE FROM _sqlx_migrations WHERE version = 7",
    )
    .execute(&db)
    .await
    .unwrap();
    // The test server runs without fsync and stops in immediate mode: make the changes durable.
    sqlx::raw_sql("CHECKPOINT").execute(&db).await.unwrap();
    db.close().await;
    pg.stop().unwrap();

    let (_dir, config) = crate::helpers::config_file(crate::helpers::TENANT_ACCOUNTS);
    let app = Application::build(Settings {
        database_url: pg.url("postgres"),
        target_url: None,
        config,
        listen: "127.0.0.1:0".parse().unwrap(),
        operator_token: None,
        migrate: false,
        no_worker: true,
        pooler_mode: deprov::db::PoolerMode::Session,
        metrics_listen: None,
        notify_url: None,
    })
    .await
    .expect("starts while the database is down");
    let base = format!("http://{}", app.address());
    let cancel = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(cancel.clone()));
    let (status, detail) = readyz(&base).await;
    assert_eq!(status, 503, "{detail}");
    assert!(detail.contains("migrations"), "{detail}");

    pg.restart().unwrap();
    // The database answers, but migration 7 is missing: still not ready, for the same reason.
    let db = connect(&pg).await;
    assert_eq!(deprov::db::pending_migrations(&db).await.unwrap(), vec![7]);
    let (status, detail) = readyz(&base).await;
    assert_eq!(status, 503, "{detail}");
    assert!(detail.contains("migrations"), "{detail}");

    deprov::db::migrate(&db).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, detail) = readyz(&base).await;
        if status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready 30 s after the migration: {status} {detail}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    cancel.cancel();
    let _ = server.await;
}

/// A state database owned by a role named `deprov`, as the Kubernetes base and
/// `deploy/pgbouncer` name it: `search_path`'s `"$user"` entry finds no schema before the first
/// migration creates schema `deprov`, and finds it after. `deprov migrate` still runs again (an
/// upgrade: nothing pending, no migration replayed) and `serve`'s start-up check sees nothing
/// pending.
#[tokio::test]
async fn a_state_role_named_deprov_migrates_again() {
    let pg = start_pg(None).await;
    let admin = connect(&pg).await;
    for statement in [
        "CREATE ROLE deprov LOGIN",
        "CREATE DATABASE state OWNER deprov",
    ] {
        sqlx::raw_sql(statement).execute(&admin).await.unwrap();
    }
    let url = format!("postgres://deprov@127.0.0.1:{}/state", pg.port());
    for run in 1..=3 {
        let (code, text) = run_with_env_to_exit(&url, &["migrate"], "", &[]).await;
        assert_eq!(code, Some(0), "run {run}: {text}");
    }
    let state = sqlx::PgPool::connect(&url).await.unwrap();
    assert_eq!(
        deprov::db::pending_migrations(&state).await.unwrap(),
        Vec::<i64>::new()
    );
    // One history, where the first run put it, each migration once.
    let mut conn = state.acquire().await.unwrap();
    let table = deprov::db::migrations_table(&mut conn)
        .await
        .unwrap()
        .unwrap();
    drop(conn);
    assert_eq!(table.to_string(), r#""public"."_sqlx_migrations""#);
    let (rows, versions): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT version) FROM public._sqlx_migrations WHERE success",
    )
    .fetch_one(&state)
    .await
    .unwrap();
    assert_eq!(rows, versions);
    assert!(rows >= 3, "{rows} migrations recorded");
}

/// `sha384sum` of the earlier text of the migration files whose comments changed (their SQL is
/// identical), as a database migrated with that text records them in `_sqlx_migrations`.
const EARLIER_CHECKSUMS: [(i64, &str); 5] = [
    (
        2,
        "e56045970f28b370f54974665eca801871d4ddbd74c0446165db68b1b3575adf0c4d630051ba628035bccd8da9691e96",
    ),
    (
        3,
        "ad39bd459fe230f61b6a26f525f21dfd3e57469a389a58c73818d638132b7e4df28328dcc33642c50b545efcf13879a7",
    ),
    (
        4,
        "f7a7574cf36187892170e85bd78e47dddfdc3fbc132674b26bb52b4c576cd7bcb2d982abd957d46a120269fe9d89f58c",
    ),
    (
        5,
        "13b4e1a2e7ff8e891fea5d9b2eb20e8bb102b9b9bdf7f0f3745cd2b5d5ee2558bd6e7a71c42c8b0f3751d151104778c8",
    ),
    (
        6,
        "0ff3d0ab9285e7deee6a43a3b13e838a3639b54aca3b2978e5dbcc32b64edf4dab3999a7db4595a7d417bcee16ce67c0",
    ),
];

/// Every `(version, checksum as hex)` recorded in `_sqlx_migrations`, by version.
async fn recorded_checksums(db: &sqlx::PgPool) -> Vec<(i64, String)> {
    sqlx::query_as(
        "SELECT version, encode(checksum, 'hex') FROM _sqlx_migrations WHERE success ORDER BY version",
    )
    .fetch_all(db)
    .await
    .unwrap()
}

/// A state database migrated with the earlier text of the migrations whose comments changed
/// records those files' earlier checksums: `deprov migrate` accepts it, replays nothing and leaves
/// the current files' checksums recorded, the other rows untouched.
#[tokio::test]
async fn a_database_migrated_with_the_earlier_comments_migrates_and_records_the_current_checksums()
{
    let pg = start_pg(None).await;
    let db = connect(&pg).await;
    deprov::db::migrate(&db).await.unwrap();
    let current = recorded_checksums(&db).await;
    let installed: Vec<(i64, String)> =
        sqlx::query_as("SELECT version, installed_on::text FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&db)
            .await
            .unwrap();
    for (version, earlier) in EARLIER_CHECKSUMS {
        let changed = sqlx::query(
            "UPDATE _sqlx_migrations SET checksum = decode($2, 'hex') WHERE version = $1",
        )
        .bind(version)
        .bind(earlier)
        .execute(&db)
        .await
        .unwrap()
        .rows_affected();
        assert_eq!(changed, 1, "version {version}");
    }
    assert_ne!(recorded_checksums(&db).await, current);

    let (code, text) = run_with_env_to_exit(&pg.url("postgres"), &["migrate"], "", &[]).await;
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(recorded_checksums(&db).await, current);
    let after: Vec<(i64, String)> =
        sqlx::query_as("SELECT version, installed_on::text FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(after, installed, "no migration replayed");
    // And again: nothing left to change.
    deprov::db::migrate(&db).await.unwrap();
    assert_eq!(recorded_checksums(&db).await, current);
}

/// A recorded checksum that is neither the current file's nor its earlier text's is still refused
/// (`VersionMismatch`), and left as it was.
#[tokio::test]
async fn an_unknown_recorded_checksum_is_still_refused() {
    let pg = start_pg(None).await;
    let db = connect(&pg).await;
    deprov::db::migrate(&db).await.unwrap();
    let unknown = "ab".repeat(48);
    sqlx::query("UPDATE _sqlx_migrations SET checksum = decode($1, 'hex') WHERE version = 3")
        .bind(&unknown)
        .execute(&db)
        .await
        .unwrap();
    let before = recorded_checksums(&db).await;
    assert!(before.contains(&(3, unknown)));

    let err = deprov::db::migrate(&db).await.unwrap_err();
    assert!(
        matches!(err, sqlx::migrate::MigrateError::VersionMismatch(3)),
        "{err:?}"
    );
    assert_eq!(recorded_checksums(&db).await, before);
}

/// A migration run that fails leaves no lock behind: sqlx's migrator holds a session advisory lock
/// while it runs, and `deprov migrate` started afterwards answers (with the same refusal) instead
/// of waiting for a lock that a pooled connection of the failed run still holds.
#[tokio::test]
async fn a_failed_migration_leaves_no_lock_behind() {
    let pg = start_pg(None).await;
    let db = connect(&pg).await;
    deprov::db::migrate(&db).await.unwrap();
    sqlx::query("UPDATE _sqlx_migrations SET checksum = decode($1, 'hex') WHERE version = 3")
        .bind("ab".repeat(48))
        .execute(&db)
        .await
        .unwrap();
    let err = deprov::db::migrate(&db).await.unwrap_err();
    assert!(
        matches!(err, sqlx::migrate::MigrateError::VersionMismatch(3)),
        "{err:?}"
    );
    let locks: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(locks, 0, "an advisory lock outlived the failed run");
    let (code, text) = run_with_env_to_exit(&pg.url("postgres"), &["migrate"], "", &[]).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("migration 3 was previously applied but has been modified"),
        "{text}"
    );
}
