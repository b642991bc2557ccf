//! Differential test: on random schemas and data, deprov's batched, checkpointed hard delete of a
//! tenant must leave exactly what `DELETE FROM root WHERE key = $1` (PostgreSQL's own cascade) leaves,
//! and when that cascade fails, deprov must fail the job and change nothing.
//!
//! - `DEPROV_DIFF_CASES=n`: random cases to run (default 200), seeds `DEPROV_DIFF_BASE..+n`
//!   (default base 0).
//! - `DEPROV_DIFF_SEED=s`: replay exactly one case (the regression list is skipped).
//!
//! Every seed that failed and was fixed goes into [`REGRESSION_SEEDS`], which runs first. One throwaway server
//! serves the whole test process; every case creates and drops its own two databases.

// Tests set up and inspect databases directly (clippy.toml's rules are the service's).
#![allow(clippy::disallowed_methods)]

mod case;
mod data_gen;
mod ddl;
mod digest;
mod model;
mod schema_gen;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use deprov_testkit::{Throwaway, ThrowawayOptions};
use futures::StreamExt;
use sqlx::postgres::PgPoolOptions;

/// Seeds that once failed and are fixed; they run first, always.
const REGRESSION_SEEDS: &[u64] = &[
    // ON DELETE SET NULL into a NOT NULL column ("blobs"."org.units Key") fails the cascade (23502);
    // deprov used to soft-delete and delete batches before failing. Now a blocker, found up front.
    40,
    // The cascade fails through ON DELETE SET DEFAULT (the default names a missing row or a row the
    // cascade deletes); deprov found out only mid-way, after deleting batches. Now the cascade
    // pre-check (engine::simulate) refuses before anything is deleted.
    19, 46, 88, 120, 198,
    // PostgreSQL fires referential triggers in trigger-name (constraint-creation) order, so a
    // RESTRICT / NO ACTION (or SET NULL into NOT NULL) reference from a row the cascade also deletes
    // fails the cascade when its check fires first; deprov (leaves first) completed. Now simulated.
    26, 64, 129, 169, 176,
    // A self-reference with SET DEFAULT to a missing key: the cascade deletes the tenant's rows of the
    // table in one statement, deprov's batches deleted parents first and set their children to the
    // default. Now a batch skips rows still referenced through a non-CASCADE self-reference.
    104,
    // A parent whose referenced unique key is NULL was read as a batch parent; its NULL cursor
    // value failed to decode. Such parents have no children (MATCH SIMPLE) and are skipped now.
    1004,
    // A NO ACTION DEFERRED self-reference: rows kept back as still referenced were deleted later by
    // a parent's cascade while rows referencing them (reached only below a tree's descendants)
    // remained, failing the check at that batch's commit. Now kept-back rows get more passes and a
    // final sweep with their referencing rows (engine::queries::sweep).
    1069,
    // A SET NULL on a column shared with a CASCADE key fires first in the cascade and keeps rows out
    // of the later CASCADE; deprov deleted them along the CASCADE key. Now the cascade's updates of
    // such rows are applied first (engine::simulate::preset).
    1140,
    // A row updated twice by the cascade (SET NULL, then SET DEFAULT) has its every foreign key
    // checked on the second update, changed or not (its old version is the transaction's own); the
    // unchanged key named a deleted row and the cascade failed. deprov completed.
    5_000_006,
    // The same with two SET NULL keys into nullable columns: a schema with no other key the
    // cascade can fail on skipped the pre-check. Now two such keys on one table require it.
    100_259,
];

/// Cases run at once (the machine has 2 cores; a case is mostly round trips).
const PARALLEL: usize = 3;

/// The process's one server, shared by the tests running at the same time; stopped (dropped) when
/// the last of them ends.
fn server() -> Arc<Throwaway> {
    static SERVER: Mutex<Weak<Throwaway>> = Mutex::new(Weak::new());
    let mut slot = SERVER.lock().unwrap();
    if let Some(s) = slot.upgrade() {
        return s;
    }
    let s = Arc::new(
        Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
        .unwrap(),
    );
    *slot = Arc::downgrade(&s);
    s
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number"))
    })
}

/// Runs the seeds; panics listing every failing seed after printing each one's report.
async fn run_seeds(seeds: Vec<u64>) {
    let server = server();
    let admin = PgPoolOptions::new()
        .max_connections(PARALLEL as u32)
        .connect(&server.url("postgres"))
        .await
        .unwrap();
    let started = Instant::now();
    let results: Vec<(u64, Result<case::Passed, case::Failure>)> = futures::stream::iter(seeds)
        .map(|seed| {
            let (server, admin) = (server.clone(), admin.clone());
            async move {
                let handle = tokio::spawn(async move { case::run(&server, &admin, seed).await });
                let result = handle.await.unwrap_or_else(|e| {
                    Err(case::Failure {
                        kind: case::Kind::Panicked,
                        report: format!(
                            "seed {seed} (replay: DEPROV_DIFF_SEED={seed}) panicked: {e}"
                        ),
                    })
                });
                (seed, result)
            }
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    admin.close().await;
    let mut failed = Vec::new();
    let mut kinds: BTreeMap<case::Kind, Vec<u64>> = BTreeMap::new();
    let (mut refused, mut rows, mut cascaded) = (0, 0, 0);
    for (seed, r) in &results {
        match r {
            Ok(p) => {
                refused += usize::from(p.refused);
                cascaded += usize::from(p.cascaded);
                rows += p.rows;
            }
            Err(f) => {
                eprintln!("\n==== FAILED ({:?}) {}\n", f.kind, f.report);
                failed.push(*seed);
                kinds.entry(f.kind).or_default().push(*seed);
            }
        }
    }
    failed.sort_unstable();
    for (kind, seeds) in &mut kinds {
        seeds.sort_unstable();
        eprintln!("  {kind:?}: {seeds:?}");
    }
    eprintln!(
        "differential: {} cases ({refused} refused as the cascade failed, {cascaded} with subtrees deleted by PostgreSQL's cascade under deprov's batches, {rows} rows) in {:.1?}; {} failed: {failed:?}",
        results.len(),
        started.elapsed(),
        failed.len()
    );
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
    // Odd seeds run with `cascade_rows` on: a run of many cases must really exercise that path.
    assert!(
        results.len() < 50 || cascaded > 0,
        "no case let PostgreSQL's cascade delete a subtree under deprov's batches"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_seeds() {
    if env_u64("DEPROV_DIFF_SEED").is_some() {
        return;
    }
    run_seeds(REGRESSION_SEEDS.to_vec()).await;
}

/// Tables with two references to themselves (a tree and a held link, or two held links): 60 cases
/// from [`schema_gen::TWO_SELF_REFS_FROM`] (`DEPROV_DIFF_TWO_SELF` sets the count). Skipped when
/// `DEPROV_DIFF_SEED` replays one case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_self_references() {
    if env_u64("DEPROV_DIFF_SEED").is_some() {
        return;
    }
    let base = schema_gen::TWO_SELF_REFS_FROM;
    run_seeds((base..base + env_u64("DEPROV_DIFF_TWO_SELF").unwrap_or(60)).collect()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_schemas() {
    let seeds = match env_u64("DEPROV_DIFF_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = env_u64("DEPROV_DIFF_BASE").unwrap_or(0);
            (base..base + env_u64("DEPROV_DIFF_CASES").unwrap_or(200)).collect()
        }
    };
    run_seeds(seeds).await;
}
