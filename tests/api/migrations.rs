//! Started with `DEPROV_MIGRATE=false` (as behind a transaction pooler) on a state database that
//! lacks a migration of this build, deprov refuses to start and names `deprov migrate`, instead of
//! failing every request (intake calls `deprov.record_first`, made by migration 7).

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
    for command in ["serve", "worker"] {
        let (code, text) = run_with_env_to_exit(
            &pg.url("postgres"),
            &[command],
            "",
            &[("DEPROV_MIGRATE", "false")],
        )
        .await;
        assert_eq!(code, Some(1), "{command}: {text}");
        assert!(
            text.contains("lacks migration(s) [7]") && text.contains("deprov migrate"),
            "{command}: {text}"
        );
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
