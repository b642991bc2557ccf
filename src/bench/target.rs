//! `deprov bench delete --target-url URL --tenant KEY`: the benchmark on the user's own database
//! instead of the demo's.
//!
//! 1. Two copies of the database on its own server (`CREATE DATABASE … TEMPLATE`, which needs no
//!    other session on it: [`TargetError::SourceBusy`] otherwise) and a third, empty database for
//!    deprov's state (migrated), all three with generated names; nothing is written to the
//!    user's database, and no session is opened on it.
//! 2. Both copies `ANALYZE`d and read once (every table scanned), then a `CHECKPOINT` (skipped,
//!    with a note, without the privilege).
//! 3. Copy A: the cascading `DELETE FROM <root> WHERE <key> = $1`, one transaction, timed.
//! 4. Copy B: a deletion request recorded as intake records it and the service's worker running
//!    the job to its end with the configuration's `[tenant]`, `[soft_delete]`, `[hard_delete]`,
//!    `[pacing]`, `[worker]` and `[pools]` (sources, `[vercel]` and `[notifications]` are left out,
//!    so no secret is needed; `grace_period` is 0), timed from the request to `completed`, while a
//!    [`TransactionSampler`] watches copy B's transactions every 5 ms.
//! 5. Both copies compared table by table (every table of every schema but the system ones).
//! 6. The three databases dropped (also after an error or Ctrl-C), unless `--keep-copies`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::run::{BenchError, Deprov, TimeSplit, warm};
use super::sampler::TransactionSampler;
pub use super::target_report::{TargetReport, TargetSide};
use crate::config::{Config, ConfigError};
use crate::db::Pools;
use crate::demo::{cascade_delete_key, differing_tables, drop_database, table_digest};
use crate::sql::{QualifiedName, SqlBuilder, SqlType};
use crate::worker::Progress;

/// The flags of `deprov bench delete` that run it on the user's database.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TargetArgs {
    /// Run on this database (a `postgres://` URL) instead of the demo's: two copies of it are made
    /// on its server with `CREATE DATABASE … TEMPLATE`, which needs no other session connected to
    /// it. The demo's flags (`--rows`, `--clients`, `--batch-rows`, …) are then not used.
    #[arg(long, value_name = "URL", requires = "tenant")]
    pub target_url: Option<String>,
    /// The tenant key to delete, as a deletion request gives it (with `--target-url`).
    #[arg(long, value_name = "KEY", requires = "target_url")]
    pub tenant: Option<String>,
    /// deprov's configuration file (with `--target-url`); its `[tenant]`, `[soft_delete]`,
    /// `[hard_delete]`, `[pacing]`, `[worker]` and `[pools]` are used, its sources are not read.
    #[arg(long, value_name = "FILE", env = "DEPROV_CONFIG")]
    pub config: Option<PathBuf>,
    /// Keep the two copies and the state database instead of dropping them at the end.
    #[arg(long)]
    pub keep_copies: bool,
}

impl TargetArgs {
    /// The run these flags ask for; `None` without `--target-url` (the demo's benchmark).
    ///
    /// # Errors
    /// [`TargetError::NoConfig`] with `--target-url` but no configuration file.
    pub fn resolve(&self) -> Result<Option<TargetRun>, TargetError> {
        let (Some(url), Some(tenant)) = (&self.target_url, &self.tenant) else {
            return Ok(None);
        };
        Ok(Some(TargetRun {
            url: url.clone(),
            tenant: tenant.clone(),
            config: self.config.clone().ok_or(TargetError::NoConfig)?,
            keep_copies: self.keep_copies,
            quiet: false,
        }))
    }
}

/// One run on the user's database.
#[derive(Debug, Clone)]
pub struct TargetRun {
    /// The user's database.
    pub url: String,
    /// The tenant key.
    pub tenant: String,
    /// deprov's configuration file.
    pub config: PathBuf,
    /// Keep the copies and the state database.
    pub keep_copies: bool,
    /// Print no progress lines on stderr (as with `--json`).
    pub quiet: bool,
}

/// Why the run on the user's database failed.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// `--target-url` without a configuration file.
    #[error("--target-url needs deprov's configuration: --config FILE (or DEPROV_CONFIG)")]
    NoConfig,
    /// The configuration file is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The URL names no database.
    #[error("--target-url names no database")]
    NoDatabase,
    /// The template copy found other sessions on the user's database (SQLSTATE 55006).
    #[error(
        "cannot copy database {database:?}: {sessions} other session(s) are connected to it, and \
         CREATE DATABASE … TEMPLATE needs none. Stop them (or run when the database is idle), or \
         copy the database into a scratch server first — `pg_dump -Fc -f db.dump URL` then \
         `pg_restore --create -d postgres://…scratch…/postgres db.dump` — and point --target-url \
         at the copy there"
    )]
    SourceBusy {
        /// The user's database.
        database: String,
        /// Sessions connected to it when the copy was refused.
        sessions: i64,
    },
    /// The root table or its key column is not in the database.
    #[error("{root}: no such table, or no column {column:?} in it ([tenant] of the configuration)")]
    NoRoot {
        /// `[tenant] root_table`.
        root: QualifiedName,
        /// `[tenant] key_column`.
        column: String,
    },
    /// No row of the root table has the tenant key.
    #[error("no row of {root} has {column} = {tenant:?}")]
    NoTenant {
        /// `[tenant] root_table`.
        root: QualifiedName,
        /// `[tenant] key_column`.
        column: String,
        /// The key given.
        tenant: String,
    },
    /// The cascading `DELETE` failed on the copy (deprov refuses such a tenant too).
    #[error("the cascading DELETE failed on the copy: {0}")]
    Cascade(sqlx::Error),
    /// A database step failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// deprov's job did not complete, or its state database could not be prepared.
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// Ctrl-C.
    #[error("interrupted")]
    Interrupted,
}

/// The generated names of the three scratch databases.
#[derive(Debug, Clone)]
struct Names {
    cascade: String,
    deprov: String,
    state: String,
}

impl Names {
    /// `<source>_dpv_<role>_<8 hex>`: the source's name kept to letters, digits and `_` (at most
    /// 30), so the whole stays under PostgreSQL's 63 bytes and needs no quoting to read.
    fn new(source: &str) -> Self {
        let base: String = source
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(30)
            .collect();
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let name = |role: &str| format!("{base}_dpv_{role}_{suffix}");
        Self {
            cascade: name("cascade"),
            deprov: name("deprov"),
            state: name("state"),
        }
    }

    fn all(&self) -> [&str; 3] {
        [&self.cascade, &self.deprov, &self.state]
    }
}

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
    if let Some(hard) = hard.as_table_mut() {
        if let Some(grace) = hard.insert("grace_period".into(), toml::Value::from("0s"))
            && grace
                .as_str()
                .and_then(|g| humantime::parse_duration(g).ok())
                != Some(Duration::ZERO)
        {
            note = Some(format!(
                "[hard_delete] grace_period = {grace} is not waited: the hard delete follows the soft delete"
            ));
        }
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
    let source = crate::db::connect_options(&run.url)?;
    let database = source
        .get_database()
        .ok_or(TargetError::NoDatabase)?
        .to_owned();
    let admin = admin_pool(&source, &database).await?;
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

/// A small pool on the server's `postgres` database, else `template1` (never on `database`, which
/// must have no session for the copy).
async fn admin_pool(source: &PgConnectOptions, database: &str) -> Result<PgPool, sqlx::Error> {
    let mut last = None;
    for admin in ["postgres", "template1"]
        .into_iter()
        .filter(|d| *d != database)
    {
        match PgPoolOptions::new()
            .max_connections(2)
            .connect_with(source.clone().database(admin))
            .await
        {
            Ok(pool) => return Ok(pool),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("one of the two is not the source"))
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
    for copy in [&names.cascade, &names.deprov] {
        copy_database(admin, database, copy).await?;
    }
    let mut create = SqlBuilder::new();
    create.sql("CREATE DATABASE ").ident(&names.state);
    crate::db::query(create.build().as_query())
        .execute(admin)
        .await?;
    let on = |db: &str| source.clone().database(db);
    let (copy_a, copy_b) = (on(&names.cascade), on(&names.deprov));

    say(quiet, "ANALYZE and one read of every table, on both copies");
    let root = config.root_table();
    let column = &config.tenant.key_column;
    let mut tables = Vec::new();
    for options in [&copy_a, &copy_b] {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        crate::db::query("ANALYZE").execute(&pool).await?;
        tables = user_tables(&pool).await?;
        warm(&pool, &tables).await?;
        pool.close().await;
    }
    let mut notes = Vec::new();
    checkpoint(admin, &mut notes).await?;

    say(quiet, "cascade: one DELETE on the first copy");
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(copy_a.clone())
        .await?;
    let key_type = key_type(&pool, &root, column).await?;
    tenant_exists(&pool, &root, column, &key_type, &run.tenant).await?;
    let cascade = cascade_delete_key(&pool, &root, column, &key_type, &run.tenant)
        .await
        .map_err(TargetError::Cascade)?;
    pool.close().await;
    checkpoint(admin, &mut notes).await?;

    say(
        quiet,
        "deprov: a deletion request and a worker, on the second copy",
    );
    let state = on(&names.state);
    let deprov = Deprov {
        config: Arc::new(config.clone()),
        pools: Pools::from_options(&state, &copy_b, &config.pools),
    };
    crate::db::migrate(&deprov.pools.queue)
        .await
        .map_err(|e| BenchError::Config(e.to_string()))?;
    // Connected before the clock starts, as a running service's pools are (the cascade's pool
    // was too): the request's time is then the intake transaction's, as `created_at` has it.
    for pool in [&deprov.pools.intake, &deprov.pools.queue, &deprov.pools.target] {
        crate::db::query("SELECT 1").execute(pool).await?;
    }
    let sampler =
        TransactionSampler::start(&state, &names.deprov, Duration::from_millis(5)).await?;
    let requested = OffsetDateTime::now_utc();
    let job_id = deprov.record(&run.tenant).await?;
    let job = deprov.work(job_id, Instant::now(), None).await;
    let sampled = sampler.stop().await;
    deprov.pools.close().await;
    let job = job?;
    if job.state != "completed" {
        return Err(BenchError::Job {
            state: job.state,
            error: job.last_error.unwrap_or_default(),
        }
        .into());
    }
    let sampled = sampled?;

    say(quiet, "comparing the copies table by table");
    let differing = compare(&copy_a, &copy_b, &tables).await?;
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
    Ok(TargetReport {
        source_database: database.to_owned(),
        cascade_copy: names.cascade.clone(),
        deprov_copy: names.deprov.clone(),
        state_database: names.state.clone(),
        copies_kept: run.keep_copies,
        tenant: run.tenant.clone(),
        tables: tables.len(),
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
        // Both on this process's clock (the worker runs here): the request, and the soft delete's
        // commit less its transaction's time.
        before_soft_delete_ms: soft_delete_start.map(|at| ms(at - requested)),
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
        equals_cascade: differing.is_empty(),
        differing_tables: differing.iter().map(ToString::to_string).collect(),
        deprov_tables: job.progress["tables"].clone(),
        notes,
    })
}

fn stamp(text: Option<&str>) -> Option<OffsetDateTime> {
    text.and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
}

fn ms(d: time::Duration) -> f64 {
    d.as_seconds_f64() * 1e3
}

/// `CREATE DATABASE to TEMPLATE from`, with no attempt to end other sessions on `from` (it is the
/// user's database): SQLSTATE 55006 becomes [`TargetError::SourceBusy`].
async fn copy_database(admin: &PgPool, from: &str, to: &str) -> Result<(), TargetError> {
    let mut b = SqlBuilder::new();
    b.sql("CREATE DATABASE ")
        .ident(to)
        .sql(" TEMPLATE ")
        .ident(from);
    match crate::db::query(b.build().as_query()).execute(admin).await {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55006") => {
            let sessions: i64 = crate::db::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            )
            .bind(from)
            .fetch_one(admin)
            .await?;
            Err(TargetError::SourceBusy {
                database: from.to_owned(),
                sessions,
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// `CHECKPOINT`; without the privilege (SQLSTATE 42501: superuser or `pg_checkpoint`) a note instead.
async fn checkpoint(admin: &PgPool, notes: &mut Vec<String>) -> Result<(), sqlx::Error> {
    match super::run::checkpoint(admin).await {
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {
            let note =
                "no CHECKPOINT before the measured phases (it needs superuser or pg_checkpoint)";
            if !notes.iter().any(|n| n == note) {
                notes.push(note.into());
            }
            Ok(())
        }
        other => other,
    }
}

/// The ordinary and partitioned tables of every schema but PostgreSQL's own, sorted (partitions are
/// read through their parent).
async fn user_tables(pool: &PgPool) -> Result<Vec<QualifiedName>, sqlx::Error> {
    let rows: Vec<(String, String)> = crate::db::query_as(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
         AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%' ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(s, n)| QualifiedName::new(s, n))
        .collect())
}

/// The key column's type as `format_type` prints it.
async fn key_type(
    pool: &PgPool,
    root: &QualifiedName,
    column: &str,
) -> Result<SqlType, TargetError> {
    let ty: Option<String> = crate::db::query_scalar(
        "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
         WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(root.to_string())
    .bind(column)
    .fetch_optional(pool)
    .await?;
    ty.map(SqlType::from_catalog)
        .ok_or_else(|| TargetError::NoRoot {
            root: root.clone(),
            column: column.to_owned(),
        })
}

/// Fails with [`TargetError::NoTenant`] when no root row has the key.
async fn tenant_exists(
    pool: &PgPool,
    root: &QualifiedName,
    column: &str,
    key_type: &SqlType,
    tenant: &str,
) -> Result<(), TargetError> {
    let mut b = SqlBuilder::new();
    b.sql("SELECT EXISTS (SELECT 1 FROM ")
        .table(root)
        .sql(" WHERE ")
        .ident(column)
        .sql(" = $1::")
        .ty(key_type)
        .sql(")");
    let found: bool = crate::db::query_scalar(b.build().as_query())
        .bind(tenant)
        .fetch_one(pool)
        .await?;
    if found {
        Ok(())
    } else {
        Err(TargetError::NoTenant {
            root: root.clone(),
            column: column.to_owned(),
            tenant: tenant.to_owned(),
        })
    }
}

/// The tables whose contents differ between the two copies ([`table_digest`] of each).
async fn compare(
    a: &PgConnectOptions,
    b: &PgConnectOptions,
    tables: &[QualifiedName],
) -> Result<Vec<QualifiedName>, sqlx::Error> {
    let mut digests = Vec::new();
    for options in [a, b] {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        let mut digest = crate::demo::DatabaseDigest::new();
        for table in tables {
            digest.insert(table.clone(), table_digest(&pool, table).await?);
        }
        pool.close().await;
        digests.push(digest);
    }
    Ok(differing_tables(&digests[0], &digests[1]))
}
