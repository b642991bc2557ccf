//! The start-up check of the configured SQL through PgBouncer in transaction mode: a typo stops
//! deprov naming the setting, and the check — whose Describe sqlx prepares under a name — leaves no
//! prepared statement on the one shared server for the next client to collide with.

use deprov::app::{Application, Settings};
use deprov::config::{Config, PoolConfig};
use deprov::db::{self, Bounds, PoolRole, PoolerMode};
use deprov_testkit::BouncerOptions;

use super::{config, setup};
use crate::helpers::OPERATOR_TOKEN;

const CHECKED: &str = "[soft_delete]\n\
    undo_statements = [\"UPDATE app.accounts SET deleted_at = NULL WHERE id = $1\"]\n\
    orphans = \"SELECT id FROM app.accounts WHERE deleted_at IS NOT NULL\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_through_pgbouncer_refuses_a_typo_and_leaves_no_prepared_statement() {
    let s = setup(BouncerOptions {
        default_pool_size: 1,
        ..BouncerOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deprov.toml");
    let broken = config().replace(
        "statements = [\"UPDATE app.accounts",
        "statements = [\"UPDATE app.accounts SET deleted_at = now() WHERE id = $1\", \"UPDATE app.acounts",
    );
    std::fs::write(&path, &broken).unwrap();
    let settings = Settings {
        database_url: s.bouncer.url("deprov"),
        target_url: Some(s.bouncer.url("saas")),
        config: path,
        listen: "127.0.0.1:0".parse().unwrap(),
        operator_token: Some(OPERATOR_TOKEN.into()),
        migrate: false,
        no_worker: false,
        metrics_listen: None,
        pooler_mode: PoolerMode::Transaction,
        notify_url: None,
    };
    let err = Application::build(settings)
        .await
        .expect_err("deprov must refuse to start");
    let settings = crate::helpers::refusals(&err);
    assert_eq!(
        settings,
        [("soft_delete.statements[1]", Some("42P01"))],
        "{err}"
    );

    // A valid configuration, checked twice by two clients sharing the one server: a named
    // statement left behind by the first would make the second's Describe fail (42P05).
    let valid = Config::from_toml(&config().replace("[soft_delete]\n", CHECKED)).unwrap();
    assert_eq!(deprov::sqlcheck::configured(&valid).len(), 3);
    let options = db::connect_options(&s.bouncer.url("saas")).unwrap();
    let bounds = PoolConfig {
        max_connections: 1,
        acquire_timeout: std::time::Duration::from_secs(5),
    };
    for client in 0..2 {
        let pool = db::pool(&options, PoolRole::Cli, &bounds);
        let findings = deprov::sqlcheck::check(&pool, &valid).await.unwrap();
        assert!(findings.is_empty(), "client {client}: {findings:?}");
        pool.close().await;
    }
    let pool = db::pool(&options, PoolRole::Cli, &bounds);
    let mut tx = db::begin(&pool, Bounds::STATE).await.unwrap();
    let left: Vec<String> = db::query_scalar("SELECT name FROM pg_prepared_statements")
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    pool.close().await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(s.bouncer.server_closes_of("saas"), 0, "{}", s.bouncer.log());
}
