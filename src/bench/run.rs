//! The benchmark's procedure.
//!
//! 1. A throwaway PostgreSQL with durable settings (`fsync` on), `shared_buffers` and `max_wal_size`
//!    from the arguments; the demo schema (`src/demo/schema.sql`, 24 tables) with one large tenant of
//!    `--rows` rows and `--small-tenants` others; `ANALYZE`d.
//! 2. A copy (`CREATE DATABASE … TEMPLATE`). Both copies are read once (every table scanned) and a
//!    `CHECKPOINT` runs before each measured phase, so neither side starts colder than the other.
//! 3. Baseline, first half: the foreground workload ([`super::workload`]) for `--baseline-secs`, with
//!    the tenant writer running too (the same traffic as in the measured phases, minus the deletion).
//! 4. Cascade: `DELETE FROM app.accounts WHERE id = $1` on the copy, one transaction, with the
//!    foreground and the tenant writer running.
//! 5. deprov: a deletion request recorded as intake records it, and a worker (the service's own
//!    [`deprov::worker::Worker`], configured as `deploy/example.toml` plus `--batch-rows`,
//!    `--rate-limit` and `--duty-cycle`) running the job to `completed`, with the same foreground and tenant writer.
//!    Timed from the request to the job's end (soft delete, blocker checks and checkpoints included).
//! 6. Both databases `VACUUM (ANALYZE)`d, so autovacuum's clean-up of the deleted rows (a cost of
//!    the deletions) runs in neither of the next two phases.
//! 7. Paced window (`--paced-secs` > 0, `bench::paced`): deprov again, on a third copy made with
//!    the second, with `[pacing] duty_cycle` = `--paced-duty-cycle`, its worker running in
//!    segments that alternate with segments of no worker (the interleaved baseline), under the
//!    same foreground and tenant writer throughout; the copy is dropped after.
//! 8. Baseline, second half: a checkpoint, then the same traffic for `--baseline-secs` again (the
//!    tenant writer's statements now find no rows). The foreground's baseline is both halves
//!    pooled, an A-B-A design: a machine whose latency drifts during the run (disk, a neighbour)
//!    moves both halves, and the report prints each half's p99 so a drift shows.
//! 9. The two databases are compared table by table (row count and an order-independent md5).

use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

pub use super::args::BenchArgs;
pub use super::delete_report::BenchReport;
pub use super::paced::Paced;
use super::side::{
    BenchError, DeprovRun, Keys, Side, TimeSplit, checkpoint, run_deprov, side, warm,
};
use super::workload::{self, Samples};
use deprov::sql::{QualifiedName, SqlBuilder};
use deprov_demo::{DemoSize, DemoTenants, cascade_delete, clone_database, database_digest, load};
use deprov_testkit::{Throwaway, ThrowawayOptions};

async fn connect(url: &str, max: u32) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new().max_connections(max).connect(url).await
}

fn say(json: bool, text: &str) {
    if !json {
        eprintln!("  {text}");
    }
}

/// Runs the benchmark and returns its figures (see the module docs).
///
/// # Errors
/// [`BenchError`]; a result that differs from the cascade is not an error but `equals_cascade: false`.
pub async fn run(args: &BenchArgs) -> Result<BenchReport, BenchError> {
    let (server, admin) = start_server(args).await?;
    let (tenants, tables, keys) = load_tenants(args, &server).await?;
    let bench = Bench {
        args,
        server: &server,
        admin: &admin,
        keys: &keys,
        large: tenants.large,
    };
    let (saas, copy) = bench.copies(&tables).await?;

    say(
        args.json,
        "baseline: foreground and tenant writer, no deletion",
    );
    let saas_url = server.url("saas");
    checkpoint(&admin).await?;
    let mut baseline = baseline_window(args, &saas_url, &keys).await;
    let before_p99 = baseline.quantile_ms(0.99);

    let cascade_side = bench.cascade(&copy).await?;
    let (deprov_side, progress) = bench.deprov().await?;
    let deprov_time = TimeSplit::from_progress(&progress, deprov_side.elapsed_s);
    // Both databases now hold a tenant's worth of dead rows: vacuumed (and analysed, as autovacuum
    // would after so many deletes) now, so autovacuum's clean-up of them — a cost of the
    // deletions — runs in neither the paced window nor the second baseline.
    for pool in [&saas, &copy] {
        sqlx::query("VACUUM (ANALYZE)").execute(pool).await?;
    }
    let paced = bench.paced().await?;

    say(
        args.json,
        "baseline, second half: foreground and tenant writer, no deletion",
    );
    checkpoint(&admin).await?;
    let after = baseline_window(args, &saas_url, &keys).await;
    let after_p99 = after.quantile_ms(0.99);
    baseline.merge(after);

    let equals_cascade =
        database_digest(&saas, "app").await? == database_digest(&copy, "app").await?;
    Ok(BenchReport {
        tables: tables.len(),
        ratio: if cascade_side.rows_per_s > 0.0 {
            deprov_side.rows_per_s / cascade_side.rows_per_s
        } else {
            0.0
        },
        cascade: cascade_side,
        deprov: deprov_side,
        paced,
        foreground_baseline_p99_ms: baseline.quantile_ms(0.99),
        foreground_baseline_p50_ms: baseline.quantile_ms(0.5),
        foreground_baseline_write_p99_ms: baseline.write_quantile_ms(0.99),
        foreground_baseline_read_p99_ms: baseline.read_quantile_ms(0.99),
        foreground_baseline_ops: baseline.len(),
        foreground_baseline_before_p99_ms: before_p99,
        foreground_baseline_after_p99_ms: after_p99,
        equals_cascade,
        deprov_timeouts: progress["timeouts"].as_i64().unwrap_or(0),
        deprov_index_passes: progress["index_passes"].as_i64().unwrap_or(0),
        deprov_tables: progress["tables"].clone(),
        deprov_time,
    })
}

/// The throwaway server with the arguments' settings, a pool of 2 on its `postgres` database, and
/// the empty databases `saas` and deprov's state (`deprov`, and `deprov_paced` for a paced window).
async fn start_server(args: &BenchArgs) -> Result<(Throwaway, PgPool), BenchError> {
    let server = Throwaway::start(&ThrowawayOptions {
        unsafe_fast: false,
        settings: vec![
            ("shared_buffers".into(), args.shared_buffers.clone()),
            ("max_wal_size".into(), args.max_wal_size.clone()),
        ]
        .into_iter()
        .chain(args.server_settings.iter().cloned())
        .collect(),
    })?;
    let admin = connect(&server.url("postgres"), 2).await?;
    let state_dbs: &[&str] = if args.paced_secs > 0 {
        &["deprov", "deprov_paced"]
    } else {
        &["deprov"]
    };
    for db in std::iter::once(&"saas").chain(state_dbs) {
        let mut create = SqlBuilder::new();
        create.sql("CREATE DATABASE ").ident(db);
        sqlx::query(create.build().as_query())
            .execute(&admin)
            .await?;
    }
    Ok((server, admin))
}

/// The demo schema and tenants loaded into `saas`; returns the tenants, the schema's tables and the
/// keys the foreground and the tenant writer use.
async fn load_tenants(
    args: &BenchArgs,
    server: &Throwaway,
) -> Result<(DemoTenants, Vec<QualifiedName>, Keys), BenchError> {
    let started = Instant::now();
    let saas = connect(&server.url("saas"), 4).await?;
    let tenants = load(
        &saas,
        &DemoSize {
            small_tenants: args.small_tenants,
            large_tenant_rows: args.rows,
        },
    )
    .await?;
    let tables = deprov_demo::user_tables(&saas, "app").await?;
    say(
        args.json,
        &format!(
            "loaded {} rows for tenant {} in {} tables, {} other tenants ({:.0} s)",
            tenants.large_total_rows(),
            tenants.large,
            tables.len(),
            tenants.small.len(),
            started.elapsed().as_secs_f64()
        ),
    );
    let keys = Keys::sample(&saas, tenants.large, &tenants.small).await?;
    saas.close().await;
    Ok((tenants, tables, keys))
}

/// What the measured phases share: the arguments, the server and its admin pool, the workload's
/// keys and the large tenant (deleted in every phase).
struct Bench<'a> {
    /// The benchmark's arguments.
    args: &'a BenchArgs,
    /// The throwaway server.
    server: &'a Throwaway,
    /// A pool on its `postgres` database.
    admin: &'a PgPool,
    /// The foreground's and the tenant writer's keys.
    keys: &'a Keys,
    /// The large tenant's key.
    large: i64,
}

impl Bench<'_> {
    /// The copies of `saas` (`saas_cascade`, and `saas_paced` for a paced window), every database
    /// read once (`tables`); returns pools of 8 on `saas` and on `saas_cascade`.
    async fn copies(&self, tables: &[QualifiedName]) -> Result<(PgPool, PgPool), BenchError> {
        let (args, server, admin) = (self.args, self.server, self.admin);
        clone_database(admin, "saas", "saas_cascade").await?;
        if args.paced_secs > 0 {
            clone_database(admin, "saas", "saas_paced").await?;
            let paced = connect(&server.url("saas_paced"), 8).await?;
            warm(&paced, tables).await?;
            paced.close().await;
        }
        let saas = connect(&server.url("saas"), 8).await?;
        let copy = connect(&server.url("saas_cascade"), 8).await?;
        for pool in [&saas, &copy] {
            warm(pool, tables).await?;
        }
        Ok((saas, copy))
    }

    /// The cascade phase: one `DELETE` of the large tenant on `copy` (`saas_cascade`) under the
    /// foreground and the tenant writer.
    async fn cascade(&self, copy: &PgPool) -> Result<Side, BenchError> {
        let args = self.args;
        say(args.json, "cascade: one DELETE on the copy");
        let copy_url = self.server.url("saas_cascade");
        checkpoint(self.admin).await?;
        let fg = workload::start(
            &copy_url,
            args.clients,
            args.rate,
            self.keys.foreground.clone(),
        );
        let writer = workload::start(&copy_url, 1, args.rate, self.keys.tenant.clone());
        let root = QualifiedName::new("app", "accounts");
        let cascade = cascade_delete(copy, &root, "id", self.large).await?;
        Ok(side(
            cascade.total_deleted(),
            cascade.elapsed,
            cascade.elapsed_ms(),
            1,
            writer.stop().await,
            fg.stop().await,
        ))
    }

    /// The deprov phase: a deletion request and a worker on `saas`, unthrottled but for
    /// `--duty-cycle`; returns deprov's side and the job's progress.
    async fn deprov(&self) -> Result<(Side, serde_json::Value), BenchError> {
        say(self.args.json, "deprov: a deletion request and a worker");
        checkpoint(self.admin).await?;
        let unthrottled = DeprovRun {
            target_db: "saas",
            state_db: "deprov",
            duty_cycle: self.args.duty_cycle,
        };
        run_deprov(self.args, self.server, self.keys, self.large, &unthrottled).await
    }

    /// The paced window on `saas_paced` (none with `--paced-secs 0`), the copy dropped after.
    async fn paced(&self) -> Result<Option<Paced>, BenchError> {
        let args = self.args;
        if args.paced_secs == 0 {
            return Ok(None);
        }
        say(
            args.json,
            &format!(
                "deprov paced: duty_cycle {} on a third copy for {} s in {} s segments, each after \
                 one with no worker",
                args.paced_duty_cycle, args.paced_secs, args.paced_segment_secs
            ),
        );
        checkpoint(self.admin).await?;
        let run = DeprovRun {
            target_db: "saas_paced",
            state_db: "deprov_paced",
            duty_cycle: args.paced_duty_cycle,
        };
        let paced = super::paced::run(args, self.server, self.keys, self.large, &run).await?;
        // Its dead rows are no part of the second baseline (nor is autovacuum's clean-up).
        deprov_demo::drop_database(self.admin, "saas_paced").await?;
        Ok(Some(paced))
    }
}

/// One window of the baseline: the foreground and the tenant writer on `url` for
/// `--baseline-secs`, no deletion; the foreground's samples.
async fn baseline_window(args: &BenchArgs, url: &str, keys: &Keys) -> Samples {
    let running = workload::start(url, args.clients, args.rate, keys.foreground.clone());
    let writer = workload::start(url, 1, args.rate, keys.tenant.clone());
    tokio::time::sleep(Duration::from_secs(args.baseline_secs)).await;
    let samples = running.stop().await;
    writer.stop().await;
    samples
}
