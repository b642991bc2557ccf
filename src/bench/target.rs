//! `deprov-lab bench delete --target-url URL --tenant KEY`: the benchmark on the user's own database
//! instead of the demo's.
//!
//! 1. The user's database read on one session, closed before the copies: the root table, its key
//!    column and a root row with the key (`check_tenant`), so that a wrong key fails before any
//!    copy. Nothing is written to it.
//! 2. Two copies of the database on its own server (`CREATE DATABASE … TEMPLATE`, which needs no
//!    other session on it: [`TargetError::SourceBusy`] otherwise) and a third, empty database for
//!    deprov's state (migrated), all three with generated names.
//! 3. Both copies `ANALYZE`d and read once (every table scanned), then a `CHECKPOINT` (skipped,
//!    with a note, without the privilege).
//! 4. Copy A: the cascading `DELETE FROM <root> WHERE <key> = $1`, one transaction, timed, while
//!    the same [`TransactionSampler`] as in step 5 watches copy A's transactions: both sides run
//!    under the same observer's load on the server.
//! 5. Copy B: the service's worker started and listening, then a deletion request recorded and
//!    woken for as intake does it, run to its end with the configuration's `[tenant]`, `[soft_delete]`, `[hard_delete]`,
//!    `[pacing]`, `[worker]` and `[pools]` (sources, `[vercel]` and `[notifications]` are left out,
//!    so no secret is needed; `grace_period` is 0), timed from the request to `completed`, while a
//!    [`TransactionSampler`] watches copy B's transactions every 5 ms. Before it, the worker
//!    serves one request for a key no root row has, as a running service has served requests
//!    before: the measured job meets warm connections, not a start (`Deprov::serve`).
//! 6. Both copies compared table by table (every table of every schema but the system ones).
//! 7. The three databases dropped (also after an error or Ctrl-C), unless `--keep-copies`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

pub use super::args::{TargetArgs, TargetRun};
use super::error::BenchError;
pub use super::error::TargetError;
use super::side::{Deprov, TimeSplit, warm};
use super::target_db::{
    Names, absent_key, admin_pool, checkpoint, compare, copy_database, key_type, tenant_exists,
};
pub use super::target_report::{TargetReport, TargetSide};
use deprov::config::{Config, ConfigError};
use deprov::db::Pools;
use deprov::queue::jobs::Job;
use deprov::sql::SqlBuilder;
use deprov::worker::Progress;
use deprov_demo::{CascadeOutcome, cascade_delete_key, drop_database};
use deprov_testkit::transactions::{Sampled, TransactionSampler};

/// How often the [`TransactionSampler`]s of both copies read `pg_stat_activity`.
const SAMPLE_PERIOD: Duration = Duration::from_millis(5);

/// Reads the configuration as `deprov` does, without `[sources]`, `[vercel]` and
/// `[notifications]` (their secrets are not needed to delete) and with `grace_period = "0s"`.
/// Returns it with a note when a grace period was set.
///
/// # Errors
/// [`ConfigError`] naming the key at fault.
pub fn bench_config(text: &str) -> Result<(Config, Option<String>), ConfigError> {
    let mut table: toml::Table = toml::from_str(text)?;
    for key in ["sources", "vercel", "notifications"] {
        table.remove(key);
    }
    let hard = table
        .entry("hard_delete")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let mut note = None;
    // A `hard_delete` that is not a table is left for the configuration's own error.
    if let Some(hard) = hard.as_table_mut()
        && let Some(grace) = hard.insert("grace_period".into(), toml::Value::from("0s"))
        && grace
            .as_str()
            .and_then(|g| humantime::parse_duration(g).ok())
            != Some(Duration::ZERO)
    {
        note = Some(format!(
            "[hard_delete] grace_period = {grace} is not waited: the hard delete follows the soft delete"
        ));
    }
    let text = toml::to_string(&table).map_err(|e| ConfigError::Invalid {
        key: "(file)".into(),
        reason: e.to_string(),
    })?;
    Ok((Config::from_toml(&text)?, note))
}

/// Runs the benchmark on the user's database (see the module docs) and drops the scratch
/// databases, whatever the outcome, unless `--keep-copies`.
///
/// # Errors
/// [`TargetError`]; a job that ended `failed` is [`BenchError::Job`] with its error.
pub async fn run(run: &TargetRun) -> Result<TargetReport, TargetError> {
    let text = std::fs::read_to_string(&run.config).map_err(|source| ConfigError::Read {
        path: run.config.display().to_string(),
        source,
    })?;
    let (config, note) = bench_config(&text)?;
    let source = deprov::db::connect_options(&run.url)?;
    let database = source
        .get_database()
        .ok_or(TargetError::NoDatabase)?
        .to_owned();
    let admin = admin_pool(&source, &database).await?;
    // Before two copies of a large database are made for nothing (and before any is dropped).
    if let Err(e) = check_tenant(&config, &source.clone().database(&database), &run.tenant).await {
        admin.close().await;
        return Err(e);
    }
    let names = Names::new(&database);
    let measured = tokio::select! {
        r = measure(run, &config, &admin, &source, &database, &names) => r,
        _ = tokio::signal::ctrl_c() => Err(TargetError::Interrupted),
    };
    if !run.keep_copies {
        say(run.quiet, "dropping the copies and the state database");
        for name in names.all() {
            if let Err(e) = drop_database(&admin, name).await {
                eprintln!("could not drop database {name:?}: {e}");
            }
        }
    }
    admin.close().await;
    let mut report = measured?;
    report.notes.extend(note);
    Ok(report)
}

fn say(quiet: bool, text: &str) {
    if !quiet {
        eprintln!("  {text}");
    }
}

/// Everything between making the copies and dropping them.
async fn measure(
    run: &TargetRun,
    config: &Config,
    admin: &PgPool,
    source: &PgConnectOptions,
    database: &str,
    names: &Names,
) -> Result<TargetReport, TargetError> {
    let quiet = run.quiet;
    say(
        quiet,
        &format!(
            "copying {database:?} to {:?} and {:?}; deprov's state in {:?}",
            names.cascade, names.deprov, names.state
        ),
    );
    make_copies(admin, database, names).await?;
    let on = |db: &str| source.clone().database(db);
    let (copy_a, copy_b) = (on(&names.cascade), on(&names.deprov));

    say(quiet, "ANALYZE and one read of every table, on both copies");
    let tables = analyze_and_warm(&copy_a, &copy_b).await?;
    let mut notes = Vec::new();
    checkpoint(admin, &mut notes).await?;

    say(quiet, "cascade: one DELETE on the first copy");
    let (cascade, cascade_sampled, absent) = cascade_on(
        config,
        &on(&names.state),
        &copy_a,
        &names.cascade,
        &run.tenant,
    )
    .await?;
    checkpoint(admin, &mut notes).await?;

    say(
        quiet,
        "deprov: a deletion request and a worker, on the second copy",
    );
    let (job, sampled, accepted) = deprov_job(
        config,
        &on(&names.state),
        &copy_b,
        &names.deprov,
        &run.tenant,
        absent.as_deref(),
    )
    .await?;

    say(quiet, "comparing the copies table by table");
    let differing = compare(&copy_a, &copy_b, &tables).await?;
    let measured = Measured {
        tables: tables.len(),
        cascade,
        cascade_sampled,
        job,
        sampled,
        accepted,
        differing,
        notes,
    };
    Ok(measured.report(run, database, names))
}

/// The two copies of `database` (`names.cascade`, `names.deprov`) and the empty state database.
async fn make_copies(admin: &PgPool, database: &str, names: &Names) -> Result<(), TargetError> {
    for copy in [&names.cascade, &names.deprov] {
        copy_database(admin, database, copy).await?;
    }
    let mut create = SqlBuilder::new();
    create.sql("CREATE DATABASE ").ident(&names.state);
    deprov::db::query(create.build().as_query())
        .execute(admin)
        .await?;
    Ok(())
}

/// `ANALYZE` and one read of every table on copy A, then on copy B; returns copy B's tables.
async fn analyze_and_warm(
    copy_a: &PgConnectOptions,
    copy_b: &PgConnectOptions,
) -> Result<Vec<deprov::sql::QualifiedName>, TargetError> {
    let mut tables = Vec::new();
    for options in [copy_a, copy_b] {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        deprov::db::query("ANALYZE").execute(&pool).await?;
        tables = deprov_demo::all_user_tables(&pool).await?;
        warm(&pool, &tables).await?;
        pool.close().await;
    }
    Ok(tables)
}

/// The cascading `DELETE` of `tenant`'s root row on copy A (database `datname`, whose tenant
/// [`check_tenant`] read on the user's database before the copies), with copy A's transactions as
/// a [`TransactionSampler`] connected to `state` saw them during the delete (as deprov's job is
/// watched), and a key no root row has (for deprov's warm-up request), read before the delete.
async fn cascade_on(
    config: &Config,
    state: &PgConnectOptions,
    copy_a: &PgConnectOptions,
    datname: &str,
    tenant: &str,
) -> Result<(CascadeOutcome, Sampled, Option<String>), TargetError> {
    let root = config.root_table();
    let column = &config.tenant.key_column;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(copy_a.clone())
        .await?;
    let key_type = key_type(&pool, &root, column).await?;
    let absent = absent_key(&pool, &root, column, &key_type).await?;
    let sampler = TransactionSampler::start(state, datname, SAMPLE_PERIOD).await?;
    let cascade = cascade_delete_key(&pool, &root, column, &key_type, tenant).await;
    let sampled = sampler.stop().await;
    pool.close().await;
    Ok((cascade.map_err(TargetError::Cascade)?, sampled?, absent))
}

/// On the user's database, before it is copied: the root table and key column exist and a root
/// row has the key `tenant`. One connection, closed before the copy (`CREATE DATABASE … TEMPLATE`
/// needs the database without sessions).
///
/// # Errors
/// [`TargetError::NoRoot`], [`TargetError::BadKey`], [`TargetError::NoTenant`]; database errors.
async fn check_tenant(
    config: &Config,
    source: &PgConnectOptions,
    tenant: &str,
) -> Result<(), TargetError> {
    let root = config.root_table();
    let column = &config.tenant.key_column;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(source.clone())
        .await?;
    let checked = async {
        let key_type = key_type(&pool, &root, column).await?;
        tenant_exists(&pool, &root, column, &key_type, tenant).await
    }
    .await;
    pool.close().await;
    checked
}

/// What [`measure`] gathered on the copies, before it becomes the report.
struct Measured {
    /// Tables compared.
    tables: usize,
    /// The cascade on copy A.
    cascade: CascadeOutcome,
    /// Copy A's transactions as sampled during the cascade.
    cascade_sampled: Sampled,
    /// deprov's job on copy B, ended.
    job: Job,
    /// Copy B's transactions as sampled during the job.
    sampled: Sampled,
    /// When intake accepted the request (this process's clock).
    accepted: OffsetDateTime,
    /// Tables whose contents differ between the copies.
    differing: Vec<deprov::sql::QualifiedName>,
    /// Notes for the report (a skipped checkpoint).
    notes: Vec<String>,
}

impl Measured {
    /// The report of the run on `database` (its copies named by `names`).
    fn report(self, run: &TargetRun, database: &str, names: &Names) -> TargetReport {
        let Self {
            tables,
            cascade,
            cascade_sampled,
            job,
            sampled,
            accepted,
            differing,
            notes,
        } = self;
        let progress = Progress::from_json(&job.progress);
        let elapsed = job
            .finished_at
            .map(|end| (end - job.created_at).unsigned_abs())
            .unwrap_or_default();
        let deprov_side = TargetSide::new(
            progress.rows_deleted,
            elapsed,
            progress
                .longest_batch_ms
                .max(progress.longest_index_pass_ms),
            progress.batches,
            progress.longest_rolled_back_ms,
        );
        let soft_delete_start = stamp(progress.soft_deleted_at.as_deref())
            .map(|at| at - Duration::from_secs_f64(progress.soft_delete_ms / 1e3));
        let hard_delete_start = stamp(progress.hard_delete_started_at.as_deref());
        TargetReport {
            source_database: database.to_owned(),
            cascade_copy: names.cascade.clone(),
            deprov_copy: names.deprov.clone(),
            state_database: names.state.clone(),
            copies_kept: run.keep_copies,
            tenant: run.tenant.clone(),
            tables,
            ratio: if elapsed.is_zero() {
                0.0
            } else {
                cascade.elapsed.as_secs_f64() / elapsed.as_secs_f64()
            },
            cascade: TargetSide::new(
                cascade.total_deleted(),
                cascade.elapsed,
                cascade.elapsed_ms(),
                1,
                0.0,
            ),
            deprov_time: TimeSplit::from_progress(&job.progress, deprov_side.elapsed_s),
            deprov: deprov_side,
            job_id: job.id,
            // Both on this process's clock (the worker runs here): the request's acceptance, and
            // the soft delete's commit less its transaction's time.
            before_soft_delete_ms: soft_delete_start.map(|at| ms(at - accepted)),
            // Both on the state database's clock.
            before_hard_delete_ms: hard_delete_start.map(|at| ms(at - job.created_at)),
            soft_delete_ms: progress.soft_delete_ms,
            soft_deleted_rows: progress.soft_deleted_rows.unwrap_or(0),
            trial: progress.trial.clone(),
            trial_ms: progress.trial_ms,
            bookkeeping_ms: progress.bookkeeping_ms,
            rolled_back_ms: progress.rolled_back_ms,
            batches: progress.batches,
            timeouts: progress.timeouts,
            replans: progress.replans,
            index_passes: progress.index_passes,
            sampled,
            cascade_sampled,
            equals_cascade: differing.is_empty(),
            differing_tables: differing.iter().map(ToString::to_string).collect(),
            deprov_tables: job.progress["tables"].clone(),
            notes,
        }
    }
}

/// deprov's job on the copy `copy_b` (database `datname`), its state in `state`: its request sent
/// to a running worker (after the request for `warm_up`, a key no root row has:
/// [`Deprov::serve`]) until the job ended, with the sampler on the copy's transactions (the
/// warm-up's included). Returns the job, what was sampled, and when the request was accepted
/// (this process's clock).
async fn deprov_job(
    config: &Config,
    state: &PgConnectOptions,
    copy_b: &PgConnectOptions,
    datname: &str,
    tenant: &str,
    warm_up: Option<&str>,
) -> Result<(Job, Sampled, OffsetDateTime), TargetError> {
    let deprov = Deprov {
        config: Arc::new(config.clone()),
        pools: Pools::from_options(state, copy_b, &config.pools),
    };
    deprov::db::migrate(&deprov.pools.queue)
        .await
        .map_err(|e| BenchError::Config(e.to_string()))?;
    // Connected before the clock starts, as a running service's pools are (the cascade's pool
    // was too): the request's time is then the intake transaction's, as `created_at` has it.
    for pool in [
        &deprov.pools.intake,
        &deprov.pools.queue,
        &deprov.pools.target,
    ] {
        deprov::db::query("SELECT 1").execute(pool).await?;
    }
    let sampler = TransactionSampler::start(state, datname, SAMPLE_PERIOD).await?;
    let served = deprov
        .serve(tenant, warm_up, state.to_url_lossy().to_string())
        .await;
    let sampled = sampler.stop().await;
    deprov.pools.close().await;
    let (job, accepted) = served?;
    if job.state != "completed" {
        return Err(BenchError::Job {
            state: job.state,
            error: job.last_error.unwrap_or_default(),
        }
        .into());
    }
    Ok((job, sampled?, accepted))
}

fn stamp(text: Option<&str>) -> Option<OffsetDateTime> {
    text.and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
}

fn ms(d: time::Duration) -> f64 {
    d.as_seconds_f64() * 1e3
}
