//! The full demo size, measured once by hand (ignored by default).

use std::time::Instant;

use sqlx::PgPool;

use super::super::verify::differing_tables;
use super::super::*;
use super::{accounts, setup};

/// The demo size, durable server settings: `cargo test --release -p deprov-demo --lib tests::size::load_demo_size -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "loads the full demo size (about 1.1M rows); run by hand to measure"]
async fn load_demo_size() {
    let started = Instant::now();
    let s = setup(&DemoSize::default(), false).await;
    let loaded = started.elapsed();
    let total: i64 = sqlx::query_scalar("SELECT sum(n_live_tup)::bigint FROM pg_stat_user_tables")
        .fetch_one(&s.demo)
        .await
        .unwrap();
    println!(
        "loaded {} rows in the large tenant, {total} rows in all, {} small tenants, in {:.1} s (server start included)",
        s.tenants.large_total_rows(),
        s.tenants.small.len(),
        loaded.as_secs_f64()
    );
    for (table, n) in &s.tenants.large_rows {
        println!("  {table}: {n}");
    }
    assert!(s.tenants.large_total_rows() >= 1_000_000);
    s.demo.close().await;
    let step = Instant::now();
    verify::clone_database(&s.admin, "demo", "copy")
        .await
        .unwrap();
    println!("clone_database: {:.1} s", step.elapsed().as_secs_f64());
    let copy = PgPool::connect(&s.pg.url("copy")).await.unwrap();
    let step = Instant::now();
    let before = database_digest(&copy, "app").await.unwrap();
    println!("database_digest: {:.1} s", step.elapsed().as_secs_f64());
    let step = Instant::now();
    let others = other_tenants_digest(&copy, "app", &accounts(), "id", s.tenants.large)
        .await
        .unwrap();
    println!(
        "other_tenants_digest: {:.1} s",
        step.elapsed().as_secs_f64()
    );
    let outcome = cascade_delete(&copy, &accounts(), "id", s.tenants.large)
        .await
        .unwrap();
    println!(
        "cascade_delete: {} rows in {:.0} ms",
        outcome.total_deleted(),
        outcome.elapsed_ms()
    );
    let after = database_digest(&copy, "app").await.unwrap();
    assert_eq!(
        differing_tables(&before, &after).len(),
        s.tenants.large_rows.len()
    );
    let others_after = other_tenants_digest(&copy, "app", &accounts(), "id", s.tenants.large)
        .await
        .unwrap();
    assert_eq!(others, others_after);
}
