//! TCP keepalives on the sockets of deprov's pools.

use std::time::Duration;

use deprov::db::{self, Bounds};
use deprov_testkit::{Throwaway, ThrowawayOptions};
use sqlx::{Connection as _, PgConnection};

/// Every socket of a deprov pool carries TCP keepalives (set in `after_connect`), read back from the
/// kernel; a plain sqlx connection to the same server has none.
#[tokio::test]
async fn pool_connections_carry_tcp_keepalives() {
    use deprov::db::keepalive::{Keepalive, inspect};
    let pg = tokio::task::spawn_blocking(|| {
        Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .unwrap();
    let peer: std::net::SocketAddr = ([127, 0, 0, 1], pg.port()).into();
    let mut plain = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    sqlx::raw_sql("SELECT 1").execute(&mut plain).await.unwrap();
    let sockets = inspect(peer).unwrap();
    assert_eq!(sockets.len(), 1);
    assert!(!sockets[0].enabled, "sqlx sets no keepalive by itself");
    plain.close().await.unwrap();

    let bounds = deprov::config::PoolConfig {
        max_connections: 3,
        acquire_timeout: Duration::from_secs(5),
    };
    let pool = db::pool(
        &db::connect_options(&pg.url("postgres")).unwrap(),
        db::PoolRole::Queue,
        &bounds,
    );
    let held = futures::future::join_all((0..3).map(|_| db::begin(&pool, Bounds::STATE))).await;
    let sockets = inspect(peer).unwrap();
    assert_eq!(sockets.len(), 3, "{sockets:?}");
    let k = Keepalive::DEFAULT;
    for s in &sockets {
        assert!(s.enabled, "{s:?}");
        assert_eq!(s.idle_s as u64, k.idle.as_secs());
        assert_eq!(s.interval_s as u64, k.interval.as_secs());
        assert_eq!(s.retries as u32, k.retries);
        assert_eq!(s.user_timeout_ms as u128, k.detect_within().as_millis());
    }
    drop(held);
    pool.close().await;
}
