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
//!    [`crate::worker::Worker`], configured as `deploy/example.toml` plus `--batch-rows`,
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

use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

pub use super::paced::Paced;
use super::workload::{self, Op, Samples};
use crate::config::Config;
use crate::db::Pools;
use crate::demo::{DemoSize, cascade_delete, clone_database, database_digest, load};
use crate::ids::DedupBasis;
use crate::queue::intake::{self, NewRequest, SubjectKind};
use crate::queue::jobs;
use crate::sql::{QualifiedName, SqlBuilder};
use crate::throwaway::{Throwaway, ThrowawayOptions};
use crate::worker::Worker;

/// `deprov bench delete` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Rows of the deleted tenant, over all its tables (the load makes a little more).
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Other tenants (about 2,000 rows each); the foreground works on them.
    #[arg(long, default_value_t = 60)]
    pub small_tenants: u32,
    /// `[hard_delete] batch_rows`: the first batch's rows (later batches are sized by time).
    #[arg(long, default_value_t = 50)]
    pub batch_rows: u32,
    /// `[hard_delete] max_batch_duration` in ms: the longest transaction the sizing aims under.
    #[arg(long, default_value_t = 100)]
    pub max_batch_ms: u64,
    /// `[hard_delete] checkpoint_interval` in ms: batches between durable checkpoints commit with
    /// `synchronous_commit = off` (0 = every batch durable and checkpointed).
    #[arg(long, default_value_t = 1000)]
    pub checkpoint_interval_ms: u64,
    /// `[hard_delete] whole_cascade = false`: the tenant goes in batches even when its whole
    /// cascade fits one transaction of the batch bound.
    #[arg(long)]
    pub no_whole_cascade: bool,
    /// `[pacing] rate_limit` in rows/s (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub rate_limit: u32,
    /// `[pacing] duty_cycle` of deprov's job, 0.0001..=1 (1 = no rest).
    #[arg(long, default_value_t = 1.0, value_parser = parse_duty_cycle)]
    pub duty_cycle: f64,
    /// Seconds deprov's worker runs in the paced window: deprov on a third copy of the database
    /// with `[pacing] duty_cycle` = `--paced-duty-cycle`, under the same foreground and tenant
    /// writer, in segments of `--paced-segment-secs` each after one with no worker (the
    /// interleaved baseline), until this long or the job completed (a 1M-row tenant takes minutes
    /// at the default duty cycle); 0 = no paced window. The window's wall time is about twice it.
    #[arg(long, default_value_t = 60)]
    pub paced_secs: u64,
    /// Seconds of each segment of the paced window (at least 1).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub paced_segment_secs: u64,
    /// `[pacing] duty_cycle` of the paced window, 0.0001..=1.
    #[arg(long, default_value_t = 0.0025, value_parser = parse_duty_cycle)]
    pub paced_duty_cycle: f64,
    /// Foreground clients (each its own connection).
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Operations per second of each foreground client and of the tenant writer. With the defaults
    /// the foreground makes 800 operations/s, so a phase of 1.5 s rests its p99 on ~1,200 samples.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// Seconds of foreground (and tenant writer) with no deletion, before the deletions and again
    /// after them; the foreground's baseline p99 pools both. A short baseline's p99 varies more
    /// between its halves than the 1.25× the paced window is held to.
    #[arg(long, default_value_t = 15)]
    pub baseline_secs: u64,
    /// The server's `shared_buffers`.
    #[arg(long, default_value = "1GB")]
    pub shared_buffers: String,
    /// The server's `max_wal_size`.
    #[arg(long, default_value = "4GB")]
    pub max_wal_size: String,
    /// More server settings, `name=value` (repeatable; passed as `postgres -c name=value`), for
    /// measuring what a setting does: `--server-setting autovacuum=off`,
    /// `--server-setting wal_compression=lz4`.
    #[arg(long = "server-setting", value_name = "NAME=VALUE", value_parser = parse_setting)]
    pub server_settings: Vec<(String, String)>,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// On the user's own database instead of the demo's (`--target-url`, `--tenant`, `--config`).
    #[command(flatten)]
    pub target: super::target::TargetArgs,
}

/// `name=value` of `--server-setting`: a name of letters, digits, `_` and `.`, then `=` and a value
/// of letters, digits and `_ . , : / + - % @` (the server's options are one `pg_ctl -o` string,
/// which a shell splits: a `|` or `;` would be the shell's).
pub(crate) fn parse_setting(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        return Err(format!("not a setting name: {name:?}"));
    }
    // `pg_ctl -o` hands the options to a shell: only characters no shell gives a meaning to.
    if value.is_empty()
        || !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.,:/+-%@".contains(c))
    {
        return Err(format!(
            "a value of letters, digits and _ . , : / + - % @ is needed (it goes to `pg_ctl -o` \
             through a shell), got {value:?}"
        ));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// A `--duty-cycle` / `--paced-duty-cycle` value: a number from 0.0001 to 1, as `[pacing]
/// duty_cycle` takes it — refused when the command line is read, not after the phases before it ran.
pub(crate) fn parse_duty_cycle(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(d) if (0.0001..=1.0).contains(&d) => Ok(d),
        _ => Err(format!(
            "a share of wall time from 0.0001 to 1 is needed (as [pacing] duty_cycle), got {s:?}"
        )),
    }
}

/// Figures of one deletion (the cascade's or deprov's).
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Rows deleted.
    pub rows: i64,
    /// Wall time of the whole deletion, in s.
    pub elapsed_s: f64,
    /// Rows deleted per second of wall time.
    pub rows_per_s: f64,
    /// The longest single transaction on the target, in ms.
    pub longest_transaction_ms: f64,
    /// Transactions (batches) it took.
    pub transactions: i64,
    /// The longest transaction that rolled back on a timeout (deprov retries those smaller), in ms.
    pub longest_rolled_back_ms: f64,
    /// The longest wait of one statement of the writer touching the tenant's rows, in ms.
    pub tenant_writer_longest_wait_ms: f64,
    /// Foreground p99 latency while the deletion ran, in ms.
    pub foreground_p99_ms: f64,
    /// Foreground median latency while the deletion ran, in ms.
    pub foreground_p50_ms: f64,
    /// Foreground p99 latency of the writes alone (single-row `UPDATE`s, each a commit that waits
    /// for its WAL flush), in ms.
    pub foreground_write_p99_ms: f64,
    /// Foreground p99 latency of the reads alone (an account's users by an indexed key), in ms.
    pub foreground_read_p99_ms: f64,
    /// Foreground operations timed while the deletion ran.
    pub foreground_ops: usize,
    /// Foreground operations that failed.
    pub foreground_errors: u64,
}

/// Everything the benchmark prints.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Tables of the schema.
    pub tables: usize,
    /// The naive cascade.
    pub cascade: Side,
    /// deprov's job.
    pub deprov: Side,
    /// The paced window (absent with `--paced-secs 0`).
    pub paced: Option<Paced>,
    /// Foreground p99 latency with no deletion running (both halves of the baseline pooled), in ms.
    pub foreground_baseline_p99_ms: f64,
    /// Foreground median latency with no deletion running, in ms.
    pub foreground_baseline_p50_ms: f64,
    /// Foreground writes' p99 latency with no deletion running, in ms.
    pub foreground_baseline_write_p99_ms: f64,
    /// Foreground reads' p99 latency with no deletion running, in ms.
    pub foreground_baseline_read_p99_ms: f64,
    /// Foreground operations timed for the baseline.
    pub foreground_baseline_ops: usize,
    /// Foreground p99 of the baseline's first half (before the deletions), in ms.
    pub foreground_baseline_before_p99_ms: f64,
    /// Foreground p99 of the baseline's second half (after deprov's job), in ms.
    pub foreground_baseline_after_p99_ms: f64,
    /// deprov rows/s ÷ cascade rows/s (target: ≥ 0.6).
    pub ratio: f64,
    /// Whether the database deprov worked on equals the cascade's copy, table by table.
    pub equals_cascade: bool,
    /// Batches that hit the statement or lock timeout (each retried smaller).
    pub deprov_timeouts: i64,
    /// deprov's read-only passes over a large parent's index range (`engine::range`).
    pub deprov_index_passes: i64,
    /// deprov's per-table figures, in deletion order (the job's `progress.tables`).
    pub deprov_tables: serde_json::Value,
    /// Where deprov's elapsed time went, in ms.
    pub deprov_time: TimeSplit,
}

/// deprov's elapsed time by activity, in ms (from the job's progress; `other` is the rest: the job's
/// claim, its soft delete, the plan, blocker and simulation checks, and deprov's own work between
/// statements).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TimeSplit {
    /// Batch transactions that committed (`progress.tables[].batch_ms`).
    pub batches: f64,
    /// Read-only index passes (`progress.index_pass_ms`).
    pub index_passes: f64,
    /// Kill-switch checks and checkpoints on the state database (`progress.bookkeeping_ms`).
    pub bookkeeping: f64,
    /// The trial cascade, rolled back (`progress.trial_ms`).
    pub trial: f64,
    /// Batch transactions that rolled back on a timeout (`progress.rolled_back_ms`).
    pub rolled_back: f64,
    /// Pacing: duty-cycle rests, rate-limit waits and pauses (`progress.duty_cycle_ms` +
    /// `rate_limited_ms` + `paused_ms`).
    pub pacing: f64,
    /// The rest of the elapsed time.
    pub other: f64,
}

impl TimeSplit {
    pub(super) fn from_progress(p: &serde_json::Value, elapsed_s: f64) -> Self {
        let f = |k: &str| p[k].as_f64().unwrap_or(0.0);
        let batches = p["tables"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| t["batch_ms"].as_f64().unwrap_or(0.0))
            .sum::<f64>();
        let (index_passes, bookkeeping) = (f("index_pass_ms"), f("bookkeeping_ms"));
        let pacing = f("duty_cycle_ms") + f("rate_limited_ms") + f("paused_ms");
        let (trial, rolled_back) = (f("trial_ms"), f("rolled_back_ms"));
        Self {
            batches,
            index_passes,
            bookkeeping,
            trial,
            rolled_back,
            pacing,
            other: elapsed_s * 1000.0
                - batches
                - index_passes
                - bookkeeping
                - trial
                - rolled_back
                - pacing,
        }
    }
}

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// PostgreSQL could not be started.
    #[error(transparent)]
    Server(#[from] crate::throwaway::ThrowawayError),
    /// A database step failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// The configuration built for the run is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// deprov's job did not complete.
    #[error("deprov's job ended {state}: {error}")]
    Job {
        /// Its final state.
        state: String,
        /// Its last error.
        error: String,
    },
}

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
    let tables = crate::demo::user_tables(&saas, "app").await?;
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
    clone_database(&admin, "saas", "saas_cascade").await?;
    if args.paced_secs > 0 {
        clone_database(&admin, "saas", "saas_paced").await?;
        let paced = connect(&server.url("saas_paced"), 8).await?;
        warm(&paced, &tables).await?;
        paced.close().await;
    }
    let saas = connect(&server.url("saas"), 8).await?;
    let copy = connect(&server.url("saas_cascade"), 8).await?;
    for pool in [&saas, &copy] {
        warm(pool, &tables).await?;
    }

    say(
        args.json,
        "baseline: foreground and tenant writer, no deletion",
    );
    let (saas_url, copy_url) = (server.url("saas"), server.url("saas_cascade"));
    checkpoint(&admin).await?;
    let mut baseline = baseline_window(args, &saas_url, &keys).await;
    let before_p99 = baseline.quantile_ms(0.99);

    say(args.json, "cascade: one DELETE on the copy");
    checkpoint(&admin).await?;
    let fg = workload::start(&copy_url, args.clients, args.rate, keys.foreground.clone());
    let writer = workload::start(&copy_url, 1, args.rate, keys.tenant.clone());
    let root = QualifiedName::new("app", "accounts");
    let cascade = cascade_delete(&copy, &root, "id", tenants.large).await?;
    let cascade_side = side(
        cascade.total_deleted(),
        cascade.elapsed,
        cascade.elapsed_ms(),
        1,
        writer.stop().await,
        fg.stop().await,
    );

    say(args.json, "deprov: a deletion request and a worker");
    checkpoint(&admin).await?;
    let unthrottled = DeprovRun {
        target_db: "saas",
        state_db: "deprov",
        duty_cycle: args.duty_cycle,
    };
    let (deprov_side, progress) =
        run_deprov(args, &server, &keys, tenants.large, &unthrottled).await?;
    let deprov_time = TimeSplit::from_progress(&progress, deprov_side.elapsed_s);
    // Both databases now hold a tenant's worth of dead rows: vacuumed (and analysed, as autovacuum
    // would after so many deletes) now, so autovacuum's clean-up of them — a cost of the
    // deletions — runs in neither the paced window nor the second baseline.
    for pool in [&saas, &copy] {
        sqlx::query("VACUUM (ANALYZE)").execute(pool).await?;
    }

    let paced = if args.paced_secs == 0 {
        None
    } else {
        say(
            args.json,
            &format!(
                "deprov paced: duty_cycle {} on a third copy for {} s in {} s segments, each after \
                 one with no worker",
                args.paced_duty_cycle, args.paced_secs, args.paced_segment_secs
            ),
        );
        checkpoint(&admin).await?;
        let run = DeprovRun {
            target_db: "saas_paced",
            state_db: "deprov_paced",
            duty_cycle: args.paced_duty_cycle,
        };
        let paced = super::paced::run(args, &server, &keys, tenants.large, &run).await?;
        // Its dead rows are no part of the second baseline (nor is autovacuum's clean-up).
        crate::demo::drop_database(&admin, "saas_paced").await?;
        Some(paced)
    };

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

/// One run of deprov's worker in [`run_deprov`].
pub(super) struct DeprovRun<'a> {
    /// The database the tenant is deleted from.
    pub(super) target_db: &'a str,
    /// deprov's state database (migrated here).
    pub(super) state_db: &'a str,
    /// `[pacing] duty_cycle`.
    pub(super) duty_cycle: f64,
}

/// deprov set up for one [`DeprovRun`]: its configuration (`deploy/example.toml`'s, as the demo
/// writes it, with the arguments' deletion settings), its pools and its migrated state database.
pub(super) struct Deprov {
    pub(super) config: std::sync::Arc<Config>,
    pub(super) pools: Pools,
}

impl Deprov {
    /// Builds the configuration and pools of `run` and migrates its state database.
    pub(super) async fn prepare(
        args: &BenchArgs,
        server: &Throwaway,
        run: &DeprovRun<'_>,
    ) -> Result<Self, BenchError> {
        let text = crate::demo::run::config_toml("bench-vercel-token-0000000000", args.batch_rows)
            .replace(
                "max_batch_duration = \"100ms\"",
                &format!("max_batch_duration = \"{}ms\"", args.max_batch_ms),
            )
            .replace(
                "checkpoint_interval = \"1s\"",
                &format!(
                    "checkpoint_interval = \"{}ms\"",
                    args.checkpoint_interval_ms
                ),
            )
            .replace(
                "rate_limit = 0 ",
                &format!("rate_limit = {} ", args.rate_limit),
            )
            .replace(
                "duty_cycle = 1 ",
                &format!("duty_cycle = {:?} ", run.duty_cycle),
            )
            .replace("poll_interval = \"500ms\"", "poll_interval = \"10ms\"")
            .replace(
                "whole_cascade = true ",
                &format!("whole_cascade = {} ", !args.no_whole_cascade),
            );
        let config = std::sync::Arc::new(
            Config::from_toml(&text).map_err(|e| BenchError::Config(e.to_string()))?,
        );
        let pools = Pools::new(
            &server.url(run.state_db),
            &server.url(run.target_db),
            &config.pools,
        )?;
        crate::db::migrate(&pools.queue)
            .await
            .map_err(|e| BenchError::Config(e.to_string()))?;
        Ok(Self { config, pools })
    }

    /// Records the deletion request for `tenant` as intake records it; returns its job (which
    /// then waits for a worker).
    pub(super) async fn record(&self, tenant: &str) -> Result<uuid::Uuid, BenchError> {
        let request = NewRequest {
            source: "billing".into(),
            basis: DedupBasis::TenantId,
            dedup_key: tenant.to_owned(),
            subject_kind: SubjectKind::Tenant,
            subject: tenant.to_owned(),
            external_id: None,
            reason: Some("deprov bench delete".into()),
        };
        let max_attempts = self.config.worker.max_attempts as i32;
        Ok(
            intake::record_tx(&self.pools.intake, &request, max_attempts)
                .await
                .map_err(|e| BenchError::Config(e.to_string()))?
                .job_id,
        )
    }

    /// Runs the service's worker until the job `job_id` ends or `window` (if any) has passed since
    /// `started`, then stops it as SIGTERM stops it (its current batch ends, its checkpoint and
    /// progress are written, the job goes back to the queue). Returns the job as the worker left
    /// it (its state says whether it ended).
    pub(super) async fn work(
        &self,
        job_id: uuid::Uuid,
        started: Instant,
        window: Option<Duration>,
    ) -> Result<jobs::Job, BenchError> {
        let cancel = CancellationToken::new();
        let worker = Worker::new(
            self.pools.clone(),
            self.config.clone(),
            "bench-worker".into(),
        );
        let running = tokio::spawn({
            let cancel = cancel.clone();
            async move { worker.run(cancel).await }
        });
        let ended = |state: &str| matches!(state, "completed" | "failed");
        loop {
            let job = jobs::get(&self.pools.queue, job_id).await?;
            if job.is_some_and(|j| ended(&j.state))
                || window.is_some_and(|w| started.elapsed() >= w)
            {
                break;
            }
            // Polled slowly, so the polling is no load beside the deletion: the time comes from the
            // job's own timestamps.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cancel.cancel();
        let _ = running.await;
        match jobs::get(&self.pools.queue, job_id).await? {
            Some(job) => Ok(job),
            None => Err(BenchError::Job {
                state: "missing".into(),
                error: "the job's row is gone".into(),
            }),
        }
    }
}

/// The figures of a job from its progress (`p`): rows deleted, its longest transaction (its
/// read-only index passes are transactions too, holding no row locks), batches and the longest
/// rolled-back one, with the workloads' samples.
pub(super) fn deprov_side(
    p: &serde_json::Value,
    elapsed: Duration,
    writer: Samples,
    fg: Samples,
) -> Side {
    let mut side = side(
        p["rows_deleted"].as_i64().unwrap_or(0),
        elapsed,
        p["longest_batch_ms"]
            .as_f64()
            .unwrap_or(0.0)
            .max(p["longest_index_pass_ms"].as_f64().unwrap_or(0.0)),
        p["batches"].as_i64().unwrap_or(0),
        writer,
        fg,
    );
    side.longest_rolled_back_ms = p["longest_rolled_back_ms"].as_f64().unwrap_or(0.0);
    side
}

/// deprov's job run to its end by one worker under the foreground and the tenant writer.
async fn run_deprov(
    args: &BenchArgs,
    server: &Throwaway,
    keys: &Keys,
    tenant: i64,
    run: &DeprovRun<'_>,
) -> Result<(Side, serde_json::Value), BenchError> {
    let deprov = Deprov::prepare(args, server, run).await?;
    let saas_url = server.url(run.target_db);
    let fg = workload::start(&saas_url, args.clients, args.rate, keys.foreground.clone());
    let writer = workload::start(&saas_url, 1, args.rate, keys.tenant.clone());
    let job_id = deprov.record(&tenant.to_string()).await?;
    let job = deprov.work(job_id, Instant::now(), None).await?;
    let (writer, fg) = (writer.stop().await, fg.stop().await);
    if job.state != "completed" {
        return Err(BenchError::Job {
            state: job.state,
            error: job.last_error.unwrap_or_default(),
        });
    }
    deprov.pools.close().await;
    // From the intake transaction to the one that ended the job, both on the server's clock.
    let elapsed = job
        .finished_at
        .map(|end| (end - job.created_at).unsigned_abs())
        .unwrap_or_default();
    Ok((
        deprov_side(&job.progress, elapsed, writer, fg),
        job.progress,
    ))
}

pub(super) fn side(
    rows: i64,
    elapsed: Duration,
    longest_ms: f64,
    transactions: i64,
    writer: Samples,
    fg: Samples,
) -> Side {
    let secs = elapsed.as_secs_f64();
    Side {
        rows,
        elapsed_s: secs,
        rows_per_s: if secs > 0.0 { rows as f64 / secs } else { 0.0 },
        longest_transaction_ms: longest_ms,
        longest_rolled_back_ms: 0.0,
        transactions,
        tenant_writer_longest_wait_ms: writer.max_ms(),
        foreground_p99_ms: fg.quantile_ms(0.99),
        foreground_p50_ms: fg.quantile_ms(0.5),
        foreground_write_p99_ms: fg.write_quantile_ms(0.99),
        foreground_read_p99_ms: fg.read_quantile_ms(0.99),
        foreground_ops: fg.len(),
        foreground_errors: fg.errors,
    }
}

/// Row keys the workloads use, sampled before the copy (so both copies have them).
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// Other tenants: reads of an account's users, writes to single users.
    pub(crate) foreground: Vec<(Op, i64)>,
    /// The deleted tenant: its account row, its users and its projects.
    pub(crate) tenant: Vec<(Op, i64)>,
}

impl Keys {
    pub(crate) async fn sample(
        pool: &PgPool,
        tenant: i64,
        others: &[i64],
    ) -> Result<Self, sqlx::Error> {
        let other_users: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM app.users WHERE account_id <> $1 ORDER BY id LIMIT 2000",
        )
        .bind(tenant)
        .fetch_all(pool)
        .await?;
        let foreground = other_users
            .iter()
            .enumerate()
            .flat_map(|(i, &user)| {
                [
                    (Op::ReadUsers, others[i % others.len().max(1)]),
                    (Op::TouchUser, user),
                ]
            })
            .collect();
        let users: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM app.users WHERE account_id = $1 ORDER BY id LIMIT 500",
        )
        .bind(tenant)
        .fetch_all(pool)
        .await?;
        let projects: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM app.projects WHERE account_id = $1 ORDER BY id LIMIT 500",
        )
        .bind(tenant)
        .fetch_all(pool)
        .await?;
        let mut tenant_ops = vec![(Op::TouchAccount, tenant)];
        for i in 0..users.len().max(projects.len()) {
            if let Some(&u) = users.get(i) {
                tenant_ops.push((Op::TouchUser, u));
            }
            if let Some(&p) = projects.get(i) {
                tenant_ops.push((Op::TouchProject, p));
            }
        }
        Ok(Self {
            foreground,
            tenant: tenant_ops,
        })
    }
}

/// Reads every table once (a sequential scan), so both copies start with the same warm caches.
pub(super) async fn warm(pool: &PgPool, tables: &[QualifiedName]) -> Result<(), sqlx::Error> {
    for table in tables {
        let mut b = SqlBuilder::new();
        b.sql("SELECT count(*) FROM ").table(table);
        sqlx::query(b.build().as_query()).execute(pool).await?;
    }
    Ok(())
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

/// `CHECKPOINT` (PostgreSQL docs, SQL Commands → CHECKPOINT): waits until every dirty buffer is
/// written and synced, so the write-back falls here rather than in a measured window; the WAL
/// segments before it are recycled (up to `min_wal_size`, §30.5) instead of new ones zero-filled.
pub(crate) async fn checkpoint(admin: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("CHECKPOINT").execute(admin).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_duty_cycle, parse_setting};

    #[test]
    fn duty_cycles_are_refused_when_the_command_line_is_read() {
        assert_eq!(parse_duty_cycle("0.0025"), Ok(0.0025));
        assert_eq!(parse_duty_cycle("1"), Ok(1.0));
        assert_eq!(parse_duty_cycle("1e-4"), Ok(0.0001));
        for bad in ["0", "1.5", "-1", "nan", "inf", "0.00001", "half", ""] {
            assert!(parse_duty_cycle(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn server_settings_are_name_equals_a_value_pg_ctl_keeps_whole() {
        assert_eq!(
            parse_setting("autovacuum=off"),
            Ok(("autovacuum".into(), "off".into()))
        );
        assert_eq!(
            parse_setting("auto_explain.log_min_duration=10ms"),
            Ok(("auto_explain.log_min_duration".into(), "10ms".into()))
        );
        for bad in [
            "autovacuum",
            "=off",
            "a b=1",
            "x=",
            "x=1 -c fsync=off",
            "x='1'",
            "log_line_prefix=%m|%a",
            "x=1;touch",
            "x=$(id)",
        ] {
            assert!(parse_setting(bad).is_err(), "{bad:?} was taken");
        }
    }
}
