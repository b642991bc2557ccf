//! The loader's two paths (superuser without per-row triggers, ordinary role with them) give the same data.

use sqlx::Executor;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::super::*;
use deprov_testkit::{Throwaway, ThrowawayOptions};

#[tokio::test]
async fn ordinary_role_and_superuser_load_equal_data() {
    let pg = Throwaway::start(&ThrowawayOptions {
        unsafe_fast: true,
        ..Default::default()
    })
    .unwrap();
    let admin = PgPool::connect(&pg.url("postgres")).await.unwrap();
    for stmt in [
        "CREATE DATABASE by_superuser",
        "CREATE ROLE loader LOGIN",
        "CREATE DATABASE by_loader OWNER loader",
    ] {
        sqlx::query(stmt).execute(&admin).await.unwrap();
    }
    let su = PgPool::connect(&pg.url("by_superuser")).await.unwrap();
    let loader = PgPoolOptions::new()
        .after_connect(|conn, _| {
            Box::pin(async move { conn.execute("SET ROLE loader").await.map(|_| ()) })
        })
        .connect(&pg.url("by_loader"))
        .await
        .unwrap();
    let is_su: String = sqlx::query_scalar("SHOW is_superuser")
        .fetch_one(&loader)
        .await
        .unwrap();
    assert_eq!(is_su, "off");
    let size = DemoSize {
        small_tenants: 3,
        large_tenant_rows: 3_000,
    };
    let a = load(&su, &size).await.unwrap();
    let b = load(&loader, &size).await.unwrap();
    assert_eq!(a, b);
    let digest_a = database_digest(&su, "app").await.unwrap();
    assert_eq!(digest_a, database_digest(&loader, "app").await.unwrap());
    assert_eq!(digest_a.len(), 24);
}
