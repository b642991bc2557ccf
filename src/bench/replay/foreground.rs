//! The foreground of the cascade replay: other tenants' reads and writes through PgBouncer at a fixed
//! rate, as a service with its own connection pool would send them — an operation takes a connection
//! (the pool opens another when all are busy, up to its cap), runs one short transaction and gives the
//! connection back. When PgBouncer's servers are all held, operations queue there, the pool opens more
//! client connections, and past `max_client_conn` PgBouncer refuses them: the incident's path.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::load::{self, Outcome, Running};
use crate::bench::workload::Op;

/// A running foreground and its pool.
#[derive(Debug)]
pub struct Foreground {
    /// The load (its shots are readable while it runs).
    pub load: Running,
    pool: PgPool,
}

impl Foreground {
    /// Starts `rate` operations per second on `url` (through PgBouncer), cycling through `ops`, with
    /// a pool of at most `max_conns` client connections (each acquire waits at most 60 s).
    pub fn start(
        url: &str,
        rate: f64,
        max_conns: u32,
        ops: Vec<(Op, i64)>,
    ) -> Result<Self, sqlx::Error> {
        let pool = PgPoolOptions::new()
            .max_connections(max_conns)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(60))
            .test_before_acquire(false)
            .connect_lazy(url)?;
        let load = load::start(vec![(Duration::MAX, rate)], {
            let pool = pool.clone();
            move |i| {
                let pool = pool.clone();
                let (op, key) = ops[i % ops.len().max(1)];
                async move {
                    match run(&pool, op, key).await {
                        Ok(()) => Outcome::Ok,
                        Err(e) => Outcome::Error(e.to_string()),
                    }
                }
            }
        });
        Ok(Self { load, pool })
    }

    /// Stops the load (waiting at most `grace` for operations in flight), closes the pool and returns
    /// the operations.
    pub async fn stop(self, grace: Duration) -> Vec<load::Shot> {
        let shots = self.load.stop(grace).await;
        let _ = tokio::time::timeout(grace, self.pool.close()).await;
        shots
    }
}

/// One operation in its own transaction: behind a transaction pooler an unnamed statement must run
/// inside one (its Parse and Bind halves could otherwise reach different servers).
async fn run(pool: &PgPool, op: Op, key: i64) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(op.sql())
        .persistent(false)
        .bind(key)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// Whether an error is PgBouncer refusing a client at `max_client_conn` (SQLSTATE 08P01, "no more
/// connections allowed (max_client_conn)").
pub fn is_max_client_conn(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Error(e) if e.contains("max_client_conn"))
}
