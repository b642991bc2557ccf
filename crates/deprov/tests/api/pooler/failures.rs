//! What transaction pooling breaks without the pooler mode, on a real PgBouncer.

use std::time::Duration;

use deprov::db::{self, Bounds, PoolerMode};
use deprov_testkit::{BouncerOptions, PoolMode};
use serde_json::Value;
use sqlx::{Connection as _, PgConnection};

use super::setup;

/// What transaction mode breaks, on one shared server connection: sqlx's default named statements
/// collide between clients, and a plain `SET` leaks to the next client; deprov's unnamed statements
/// inside bounded transactions do neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_statements_and_session_settings_break_behind_transaction_pooling() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: 1,
        ..BouncerOptions::default()
    })
    .await;
    let url = s.bouncer.url("deprov");
    let mut a = PgConnection::connect(&url).await.unwrap();
    let mut b = PgConnection::connect(&url).await.unwrap();

    // sqlx's default: a named prepared statement (`sqlx_s_1`) per client, left on the server.
    let one: i32 = sqlx::query_scalar("SELECT $1::int4")
        .bind(1)
        .fetch_one(&mut a)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let err = sqlx::query_scalar::<_, i32>("SELECT $1::int4")
        .bind(2)
        .fetch_one(&mut b)
        .await
        .unwrap_err();
    let code = err
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("42P05"), "{err}"); // prepared statement already exists

    // A plain SET outside a transaction stays on the server: the other client gets it.
    sqlx::raw_sql("SET statement_timeout = '1234ms'")
        .execute(&mut a)
        .await
        .unwrap();
    let leaked: String = sqlx::raw_sql("SHOW statement_timeout")
        .fetch_one(&mut b)
        .await
        .map(|r| sqlx::Row::get(&r, 0))
        .unwrap();
    assert_eq!(leaked, "1234ms");
    sqlx::raw_sql("RESET statement_timeout")
        .execute(&mut b)
        .await
        .unwrap();

    // deprov's way, interleaved on the same server: unnamed statements in bounded transactions.
    PoolerMode::Transaction.apply();
    assert!(PoolerMode::unnamed_statements());
    for i in 0..20 {
        for conn in [&mut a, &mut b] {
            let mut tx = db::begin_on(
                conn,
                Bounds::new(Duration::from_millis(77), Duration::from_secs(3)),
            )
            .await
            .unwrap();
            let (n, timeout): (i32, String) =
                db::query_as("SELECT $1::int4, current_setting('statement_timeout')")
                    .bind(i)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
            tx.commit().await.unwrap();
            assert_eq!((n, timeout.as_str()), (i, "3s"));
        }
    }
    let after: String = sqlx::raw_sql("SHOW statement_timeout")
        .fetch_one(&mut b)
        .await
        .map(|r| sqlx::Row::get(&r, 0))
        .unwrap();
    assert_eq!(after, "0", "SET LOCAL ended with its transaction");
}

/// `deprov kill-switch` through PgBouncer (one server connection), each call a new process: without
/// the pooler mode the second call fails on the named statement the first left on the server
/// (42P05); with `DEPROV_POOLER_MODE=transaction` every call works, and `deprov migrate` refuses to
/// run through the pooler. In transaction mode every process closes its pool cleanly before
/// exiting, so PgBouncer closes no server connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_needs_the_pooler_mode_behind_transaction_pooling() {
    let s = setup(BouncerOptions {
        pool_mode: PoolMode::Transaction,
        default_pool_size: 1,
        ..BouncerOptions::default()
    })
    .await;
    let url = s.bouncer.url("deprov");
    let deprov = |mode: &str, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
            .args(args)
            .env("DEPROV_DATABASE_URL", &url)
            .env("DEPROV_POOLER_MODE", mode)
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let text = crate::process::output_text(&out);
        (out.status.success(), text)
    };
    let (ok, text) = deprov("session", &["kill-switch", "status"]);
    assert!(ok, "{text}");
    let (ok, text) = deprov("session", &["kill-switch", "status"]);
    assert!(
        !ok && text.contains("already exists"),
        "{text}\n{}",
        s.bouncer.log()
    );
    // One call in transaction mode first: PgBouncer has handled the failed call's disconnect (its
    // process has exited) by the time it serves a later client, so the counts below start after it.
    let (ok, text) = deprov("transaction", &["kill-switch", "status"]);
    assert!(ok, "{text}");
    let (logins, closes) = (s.bouncer.server_logins(), s.bouncer.server_closes());

    for args in [
        &["kill-switch", "status"][..],
        &["kill-switch", "on", "--reason", "pooler test"],
        &["kill-switch", "status", "--json"],
    ] {
        let (ok, text) = deprov("transaction", args);
        assert!(ok, "{args:?}: {text}");
    }
    let (_, text) = deprov("transaction", &["kill-switch", "status", "--json"]);
    let status: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(status["engaged"], true, "{status}");
    assert_eq!(status["reason"], "pooler test");
    let (ok, text) = deprov("transaction", &["migrate"]);
    assert!(!ok && text.contains("direct DEPROV_DATABASE_URL"), "{text}");
    // Each process closed its pool before exiting: in transaction mode PgBouncer kept its one server
    // connection (opened again at most once: the failed session-mode call's exit may have closed it).
    assert_eq!(s.bouncer.server_closes(), closes, "{}", s.bouncer.log());
    assert!(
        s.bouncer.server_logins() <= logins + 1,
        "{}",
        s.bouncer.log()
    );
}
