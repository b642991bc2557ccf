//! On the demo schema (24 tables, composite and quoted keys, a self-referencing folder tree, SET NULL
//! references from other tenants and inside the tenant), deprov's batched delete of a tenant leaves
//! exactly what PostgreSQL's cascading `DELETE` of the tenant's root row leaves, and no other
//! tenant's row is removed or changed beyond what the cascade itself does.

use std::time::Instant;

use deprov::queue::JobState;
use deprov::worker::{Progress, StepOutcome};
use deprov_demo::DemoSize;

use crate::demo_env::{DemoDb, DemoServer, demo_config, differing};

/// Rows per batch: small, so the large tenant takes hundreds of batches and keyset cursors.
const BATCH_ROWS: u32 = 50;

/// Deletes `tenant` from database `work` with deprov and compares with the cascade run on a clone
/// taken just before. Returns (deprov's `rows_deleted`, rows the cascade removed).
async fn delete_and_compare(
    server: &DemoServer,
    work: &DemoDb,
    work_name: &str,
    tenant: i64,
) -> (i64, i64) {
    let others_before = work.others(tenant).await;
    let before = work.digest().await;
    let (expected, cascade_rows) = server
        .cascade(work_name, &format!("cascade_{tenant}"), tenant)
        .await;

    let job_id = work.request(tenant).await;
    let started = Instant::now();
    let worker = work.worker("equivalence");
    assert_eq!(
        worker.step().await.unwrap(),
        StepOutcome::Ran {
            job_id,
            state: "completed".into()
        }
    );
    assert_eq!(worker.step().await.unwrap(), StepOutcome::Idle);
    let elapsed = started.elapsed();

    let job = work.job(job_id).await;
    assert_eq!(job.state(), JobState::Completed, "{job:?}");
    assert_eq!((job.attempts, job.step.as_str()), (1, "done"));
    let after = work.digest().await;
    assert_eq!(
        after,
        expected,
        "tenant {tenant}: deprov's result differs from the cascade's in {:?}",
        differing(&after, &expected)
    );
    assert_ne!(after, before, "tenant {tenant}: nothing was deleted");
    let others_after = work.others(tenant).await;
    assert_eq!(
        others_after,
        others_before,
        "tenant {tenant}: other tenants' rows changed in {:?}",
        differing(&others_after, &others_before)
    );

    // Every row the cascade removed is gone here too; deprov's batches removed all but what
    // PostgreSQL's own cascade below a batch removed.
    let removed: i64 =
        before.values().map(|d| d.rows).sum::<i64>() - after.values().map(|d| d.rows).sum::<i64>();
    assert_eq!(removed, cascade_rows, "tenant {tenant}: rows removed");
    let progress = Progress::from_json(&job.progress);
    println!(
        "tenant {tenant}: {cascade_rows} rows in the cascade, deprov's batches deleted {} \
         (PostgreSQL's cascade {}), {} batches, longest {:.1} ms, {elapsed:?}",
        progress.rows_deleted,
        cascade_rows - progress.rows_deleted,
        progress.batches,
        progress.longest_batch_ms
    );
    assert!(
        progress.rows_deleted > 0 && progress.rows_deleted <= cascade_rows,
        "tenant {tenant}: {progress:?}"
    );
    assert_eq!(progress.soft_deleted_rows, Some(1));
    assert!(progress.tables.iter().all(|t| t.done), "{progress:?}");
    let per_table: i64 = progress.tables.iter().map(|t| t.rows_deleted).sum();
    assert_eq!(per_table, progress.rows_deleted, "{progress:?}");
    assert!(
        progress.batches as f64 >= progress.rows_deleted as f64 / f64::from(BATCH_ROWS),
        "a batch deleted more than batch_rows: {progress:?}"
    );
    (progress.rows_deleted, cascade_rows)
}

/// The large tenant (20k rows, 50 rows a batch), then a small tenant of the same database: each
/// equals the cascade, spares the other tenants and accounts for its rows.
#[tokio::test]
async fn demo_tenants_deleted_by_deprov_equal_the_cascade() {
    let server = DemoServer::start().await;
    let size = DemoSize {
        large_tenant_rows: 20_000,
        ..DemoSize::test()
    };
    let tenants = server.load("work", &size).await;
    let work = DemoDb::open(&server, "work", &demo_config(BATCH_ROWS)).await;

    let (deleted, cascade_rows) = delete_and_compare(&server, &work, "work", tenants.large).await;
    assert_eq!(
        cascade_rows,
        tenants.large_total_rows() as i64,
        "the cascade removed other than the large tenant's rows: {:?}",
        tenants.large_rows
    );
    assert!(
        deleted >= cascade_rows / 2,
        "deprov's batches should do most of the work"
    );

    let small = tenants.small[1];
    let (deleted, cascade_rows) = delete_and_compare(&server, &work, "work", small).await;
    assert!(cascade_rows > 100 && deleted > 0);
}
