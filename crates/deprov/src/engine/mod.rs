//! The deletion engine: plans from the catalog ([`plan`]), renders SQL ([`queries`]) and runs it in
//! short, bounded transactions on the target database.
//!
//! Every statement here runs inside its own transaction opened by [`crate::db::begin`] with
//! `SET LOCAL lock_timeout` and `SET LOCAL statement_timeout` from `[hard_delete]` ([`BatchLimits`]),
//! so the server ends a stuck statement by itself and the connection survives (error 55P03 or 57014),
//! rather than a client deadline abandoning a query on its connection. Statements go through
//! [`crate::db::query`], so they are unnamed behind a transaction pooler.

pub mod absorb;
mod blocks;
pub mod catalog;
pub mod cycles;
mod durability;
pub mod estimate;
pub use durability::{Incarnation, flush, incarnation};
pub mod plan;
mod probe;
pub mod queries;
mod range_batch;
pub use range_batch::{IndexPass, kill_dead_entries};
pub mod report;
pub mod simulate;
pub mod statements;
pub mod trial;
pub mod whole;

use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool, Row};

pub use plan::{Plan, PlanError, Step};
pub use queries::Cursor;
pub use statements::{lookup_tenant, soft_delete, undo_soft_delete};

use crate::config::HardDeleteConfig;
use crate::sql::QualifiedName;

/// Engine failures.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A database error (see [`EngineError::is_retryable`]).
    #[error("{0}")]
    Db(#[from] sqlx::Error),
    /// The configured root table or key column does not exist.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A configured statement cannot be used as written.
    #[error("{0}")]
    Statement(String),
    /// The cascade pre-check could not decide (too many rows, an unsupported schema feature).
    #[error("{0}")]
    Simulation(String),
    /// A configured statement failed: `setting` names it as the configuration file does
    /// (`soft_delete.statements[1]`, `sources.NAME.tenant_lookup`), as the start-up check
    /// ([`crate::sqlcheck`]) names a refused one. Retryable when `source` is.
    #[error("{setting}: {}", text(source))]
    Configured {
        /// The setting, e.g. `soft_delete.undo_statements[0]`.
        setting: String,
        /// The statement's error.
        source: Box<EngineError>,
    },
    /// The target server restarted or recovered from a crash since the last checkpoint
    /// ([`Incarnation`] changed), so batches committed deferred after it may be lost: the run
    /// resumes from that checkpoint (the worker does so at once, with every later batch durable).
    /// Retryable.
    #[error(
        "the target database restarted since the last checkpoint (was {was:?}, now {now:?}): batches committed with synchronous_commit = off after it may be lost, so the job resumes from that checkpoint"
    )]
    TargetRestarted {
        /// The incarnation read when the last checkpoint was written.
        was: Incarnation,
        /// The incarnation read by the flush or the batch that found the change.
        now: Incarnation,
    },
}

/// `e` for an operator: a database error with its detail, hint and SQLSTATE
/// ([`crate::db::errors::error_text`]), anything else as it displays.
pub fn text(e: &EngineError) -> String {
    match e {
        EngineError::Db(db) => crate::db::errors::error_text(db),
        other => other.to_string(),
    }
}

impl EngineError {
    /// `self` as the error of the configured statement `setting` ([`EngineError::Configured`]).
    pub fn in_setting(self, setting: impl Into<String>) -> Self {
        Self::Configured {
            setting: setting.into(),
            source: Box::new(self),
        }
    }

    /// The database error, also inside [`EngineError::Configured`].
    pub fn db(&self) -> Option<&sqlx::Error> {
        match self {
            Self::Db(e) => Some(e),
            Self::Configured { source, .. } => source.db(),
            _ => None,
        }
    }

    /// Whether retrying later may succeed: lock timeout (55P03), statement timeout (57014),
    /// serialization failure (40001), deadlock (40P01), too many connections (53300), the
    /// connection-exception class (08xxx, also PgBouncer's 08P01), admin shutdown (57P01..57P03),
    /// a session the server ended for idling in a transaction (25P03: a worker that froze mid-batch),
    /// I/O errors, pool acquire timeouts, and [`EngineError::TargetRestarted`].
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Db(e) => is_retryable(e),
            Self::Configured { source, .. } => source.is_retryable(),
            Self::TargetRestarted { .. } => true,
            Self::Plan(_) | Self::Statement(_) | Self::Simulation(_) => false,
        }
    }

    /// The SQLSTATE, when the server sent one.
    pub fn sqlstate(&self) -> Option<String> {
        self.db()?
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned())
    }
}

/// See [`EngineError::is_retryable`]: a lost connection ([`crate::db::connection_lost`]), a pool
/// acquire timeout, or one of the transient SQLSTATEs.
pub fn is_retryable(e: &sqlx::Error) -> bool {
    crate::db::connection_lost(e)
        || match e {
            sqlx::Error::Database(d) => d.code().is_some_and(|c| {
                use crate::sqlstate::*;
                is_timeout(&c)
                    || matches!(
                        c.as_ref(),
                        SERIALIZATION_FAILURE | DEADLOCK_DETECTED | TOO_MANY_CONNECTIONS
                    )
            }),
            sqlx::Error::PoolTimedOut => true,
            _ => false,
        }
}

/// Timeouts and size of one batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// Rows selected per batch.
    pub rows: i64,
    /// `lock_timeout` of the batch transaction.
    pub lock_timeout: Duration,
    /// `statement_timeout` of the batch transaction.
    pub statement_timeout: Duration,
    /// Commit with `synchronous_commit = off` ([`crate::db::Commit::Deferred`]): the caller makes
    /// the batch durable later with [`flush`] before checkpointing past it. Otherwise transactions
    /// under these limits commit with `synchronous_commit = on`.
    pub deferred: bool,
}

impl BatchLimits {
    /// The server-side bounds of a transaction with these limits.
    pub fn bounds(&self) -> crate::db::Bounds {
        let bounds = crate::db::Bounds::new(self.lock_timeout, self.statement_timeout);
        if self.deferred {
            bounds.deferred()
        } else {
            // Durable whatever the database's or role's default (`ALTER DATABASE … SET
            // synchronous_commit = off` must not make a checkpointed batch losable).
            bounds.durable()
        }
    }
}

impl BatchLimits {
    /// These limits with `statement_timeout` at most `bound`: for read-only statements sized and
    /// cut like batches, such as the cascade pre-check's reads ([`simulate::simulate`]), given
    /// [`HardDeleteConfig::batch_timeout`].
    pub fn within(self, bound: Duration) -> Self {
        Self {
            statement_timeout: self.statement_timeout.min(bound),
            ..self
        }
    }
}

impl From<&HardDeleteConfig> for BatchLimits {
    fn from(c: &HardDeleteConfig) -> Self {
        Self {
            rows: i64::from(c.batch_rows),
            lock_timeout: c.lock_timeout,
            statement_timeout: c.statement_timeout,
            deferred: false,
        }
    }
}

/// What one batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchResult {
    /// Tenant rows selected.
    pub selected: i64,
    /// Rows this batch's `DELETE` removed (cascaded rows below are not counted).
    pub deleted: i64,
    /// Parent rows the batch read.
    pub parents: i64,
    /// Parent rows with children in this batch (the cursor's parent included).
    pub parents_used: i64,
    /// Where the next batch of the step starts; `None` when the step is finished.
    pub next: Option<Cursor>,
    /// Rows PostgreSQL's cascade deleted in absorbed tables (see [`absorb`]) and, in a tree, in the
    /// step's own table beyond the statement's rows, per table oid, read from
    /// `pg_stat_get_xact_tuples_deleted` before the commit. Empty when nothing cascaded.
    pub cascaded: Vec<(u32, i64)>,
    /// Wall time of the whole transaction, BEGIN to COMMIT.
    pub elapsed: Duration,
}

/// Reads the catalog and plans deletion below `root`. The catalog is read in two transactions
/// bounded by [`crate::db::Bounds::STATE`], side by side on two of `target`'s connections (one
/// after the other when the pool has one): its tables and foreign keys, and its columns
/// (`catalog::CatalogPart`).
///
/// # Errors
/// Database errors, or [`PlanError`].
pub async fn load_plan(
    target: &PgPool,
    root: &QualifiedName,
    key_column: &str,
) -> Result<Plan, EngineError> {
    let bounds = crate::db::Bounds::STATE;
    let (part, columns) = tokio::try_join!(
        async {
            let mut tx = crate::db::begin(target, bounds).await?;
            let part = catalog::CatalogPart::read(&mut tx).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(part)
        },
        async {
            let mut tx = crate::db::begin(target, bounds).await?;
            let columns = catalog::CatalogColumns::read(&mut tx).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(columns)
        }
    )?;
    Ok(Plan::new(part.with_columns(columns), root, key_column)?)
}

/// One found blocker: rows outside the tenant referencing tenant rows through RESTRICT / NO ACTION.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BlockerHit {
    /// Referencing table.
    pub table: QualifiedName,
    /// Constraint name.
    pub constraint: String,
    /// Referenced (tenant) table.
    pub references: QualifiedName,
    /// How many referencing rows.
    pub rows: i64,
}

/// Counts the rows that would make the cascade fail. Read-only; each check is its own bounded
/// transaction.
///
/// # Errors
/// Database errors.
pub async fn find_blockers(
    target: &PgPool,
    plan: &Plan,
    tenant: &str,
    limits: &BatchLimits,
) -> Result<Vec<BlockerHit>, EngineError> {
    let mut hits = Vec::new();
    for &fk_index in &plan.blockers {
        let stmt = queries::blocker_count(plan, fk_index);
        let mut tx = crate::db::begin(target, limits.bounds()).await?;
        let rows: i64 = crate::db::query_scalar(stmt.as_query())
            .bind(tenant)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        if rows > 0 {
            let fk = &plan.catalog.foreign_keys[fk_index];
            hits.push(BlockerHit {
                table: plan.name(fk.from).clone(),
                constraint: fk.name.clone(),
                references: plan.name(fk.to).clone(),
                rows,
            });
        }
    }
    Ok(hits)
}

/// Where a batch starts within its step.
#[derive(Debug, Clone, Copy)]
pub struct BatchStart<'c> {
    /// The step (index into [`Plan::steps`]).
    pub step: usize,
    /// Where the step's last batch ended.
    pub cursor: &'c Cursor,
    /// Parent rows to read at most.
    pub parents: i64,
    /// The step's last batch was filled by the cursor's parent alone: with a [`Cursor::Within`], a
    /// step where [`Plan::range_step`] holds continues that parent as a key range
    /// ([`queries::range_bound`]).
    pub large_parent: bool,
    /// The target's incarnation while batches committed deferred since the last checkpoint: the
    /// batch checks it in its transaction, before it commits (in its own statement, see `probe`;
    /// [`before_batch`] for a tree's step) and fails with [`EngineError::TargetRestarted`],
    /// rolled back, if the target restarted since. `None`: no check.
    pub unchanged: Option<&'c Incarnation>,
    /// Set to when the batch's transaction began (after the wait for a connection, which holds no
    /// lock), so that the caller can time a batch that failed and rolled back from its `BEGIN`, as
    /// [`BatchResult::elapsed`] times one that committed. Left unset when no connection came.
    pub began: &'c std::sync::OnceLock<Instant>,
    /// Read first where the batch's rows begin, apart from the ordered scan ([`queries::batch`]'s
    /// `jump`): for a retry after the time bound cut a batch short.
    pub jump: bool,
}

/// Runs one batch from `at`, in its own transaction: at most `limits.rows` child rows of at most
/// `at.parents` parent rows (see [`queries::batch`], and [`BatchStart::large_parent`]).
///
/// # Errors
/// Database errors (timeouts are retryable: the batch rolled back and can run again).
pub async fn run_batch(
    target: &PgPool,
    plan: &Plan,
    at: BatchStart<'_>,
    tenant: &str,
    limits: &BatchLimits,
) -> Result<BatchResult, EngineError> {
    let BatchStart {
        step,
        cursor,
        parents,
        large_parent,
        unchanged,
        began,
        jump,
    } = at;
    if plan.block_step(&plan.steps[step]) {
        return blocks::run_blocks(target, plan, at, tenant, limits).await;
    }
    if let Cursor::Within(parent, last) = cursor
        && large_parent
        && plan.range_step(&plan.steps[step])
    {
        return range_batch::run_range(
            target,
            plan,
            step,
            (parent, last),
            range_batch::Shape {
                unchanged,
                began,
                jump,
            },
            limits,
        )
        .await;
    }
    let stmt = queries::batch(plan, &plan.steps[step], cursor, jump);
    let position: Vec<String> = match cursor {
        Cursor::Start => Vec::new(),
        Cursor::AfterParent(p) => p.clone(),
        Cursor::Within(p, k) => p.iter().chain(k).cloned().collect(),
        // A step that ran block ranges under an earlier plan: start its batches over.
        Cursor::Block(_) => Vec::new(),
    };
    // Timed from BEGIN: the wait for a connection holds no lock.
    let conn = crate::db::acquire(target).await?;
    let started = *began.get_or_init(Instant::now);
    let mut tx = crate::db::begin_acquired(conn, limits.bounds()).await?;
    // Tables PostgreSQL's cascade may delete rows of under the statement: the absorbed ones below
    // the step and, in a tree (a CASCADE reference of the table to itself), the step's own table
    // (not a partitioned one: its statistics are its partitions', so there only the statement's
    // rows are counted).
    let table = plan.steps[step].table;
    let mut counted = plan.absorbed_below(table);
    let own = plan.is_tree(table)
        && !plan.catalog.tables[&table].partitioned
        && !counted.contains(&table);
    // A tree's own counter moves during its statement: read before it, by a statement of its own.
    // Otherwise the batch's statement reads what comes before it (probe).
    let (separate, probe) = if own {
        counted.push(table);
        let before = before_batch(&mut tx, unchanged, &counted).await?;
        (Some(before), probe::Probe::new(None, &[]))
    } else {
        (None, probe::Probe::new(unchanged, &counted))
    };
    let stmt = probe.append(&stmt, 5);
    let query = crate::db::query(stmt.as_query())
        .persistent(false)
        .bind(tenant)
        .bind(limits.rows)
        .bind(position)
        .bind(parents.max(1));
    let (mut tx, row) = probe.fetch_one(tx, query, target, limits).await?;
    let selected: i64 = row.try_get(0)?;
    let deleted: i64 = row.try_get(1)?;
    let seen: i64 = row.try_get(2)?;
    let used: i64 = row.try_get(3)?;
    let last_parent: Option<Vec<String>> = row.try_get(4)?;
    let last_row: Option<Vec<String>> = row.try_get(5)?;
    let before = match separate {
        Some(before) => before,
        None => probe.read(&row, 6)?,
    };
    let mut cascaded = cascaded_since(&mut tx, &before).await?;
    // The step's own table counts the statement's rows too: only those beyond them cascaded.
    for (oid, n) in &mut cascaded {
        if *oid == table {
            *n -= deleted;
        }
    }
    cascaded.retain(|&(_, n)| n > 0);
    tx.commit().await?;
    // `seen` counts one parent beyond those the batch took when there is one: then the step
    // goes on after the last parent taken; else a batch that is not full ends it.
    let next = next_cursor(
        plan,
        step,
        (last_row, last_parent),
        selected >= limits.rows,
        seen > parents.max(1),
    );
    Ok(BatchResult {
        selected,
        deleted,
        parents: seen.min(parents.max(1)),
        parents_used: used,
        next,
        cascaded,
        elapsed: started.elapsed(),
    })
}

/// Where step `step` goes on after a batch that ended at `last` (its last row's key, parent key
/// first, and its last parent's key): within that parent when the batch was `full` (it selected
/// its row limit), after the parent when `more_parents` follow it, else nowhere (the step is
/// done). A step without a path (the root's own rows) has no cursor.
fn next_cursor(
    plan: &Plan,
    step: usize,
    last: (Option<Vec<String>>, Option<Vec<String>>),
    full: bool,
    more_parents: bool,
) -> Option<Cursor> {
    let path = &plan.steps[step].path;
    let split = path
        .first()
        .map_or(0, |&fk| plan.catalog.foreign_keys[fk].to_cols.len());
    match last {
        _ if path.is_empty() => None,
        (Some(mut row), _) if full => {
            let child = row.split_off(split);
            Some(Cursor::Within(row, child))
        }
        (_, Some(parent)) if more_parents => Some(Cursor::AfterParent(parent)),
        _ => None,
    }
}

/// Rows deleted per table of `before` since it was read ([`deleted_so_far`]), those with any.
pub(crate) async fn cascaded_since(
    tx: &mut PgConnection,
    before: &[(u32, i64)],
) -> Result<Vec<(u32, i64)>, sqlx::Error> {
    let tables: Vec<u32> = before.iter().map(|&(oid, _)| oid).collect();
    let after = deleted_so_far(tx, &tables).await?;
    Ok(difference(after, before))
}

/// The rows deleted per table between two reads of the same tables' counters ([`deleted_so_far`]),
/// those with any.
pub(crate) fn difference(after: Vec<(u32, i64)>, before: &[(u32, i64)]) -> Vec<(u32, i64)> {
    after
        .into_iter()
        .zip(before)
        .map(|((oid, n), (_, m))| (oid, n - m))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Deletes the tenant rows of `table` that its batches kept back (or, at a cycle's entry, all its
/// rows left: [`cycles`]), in one short transaction ([`queries::sweep`]) under `limits`' lock and
/// statement timeouts, after [`before_batch`] with `unchanged`. Returns the rows deleted in
/// `table` and those PostgreSQL's cascade deleted in absorbed tables, per table oid.
///
/// # Errors
/// [`EngineError::Db`], including 57014 / 55P03 when the rows take longer than the timeouts.
pub async fn run_sweep(
    target: &PgPool,
    plan: &Plan,
    table: u32,
    tenant: &str,
    limits: &BatchLimits,
    unchanged: Option<&Incarnation>,
) -> Result<(i64, Vec<(u32, i64)>), EngineError> {
    let stmt = queries::sweep(plan, table);
    let mut tx = crate::db::begin(target, limits.bounds()).await?;
    let before = before_batch(&mut tx, unchanged, &plan.absorbed_below(table)).await?;
    let deleted: i64 = crate::db::query_scalar(stmt.as_query())
        .bind(tenant)
        .fetch_one(&mut *tx)
        .await?;
    let cascaded = cascaded_since(&mut tx, &before).await?;
    tx.commit().await?;
    Ok((deleted, cascaded))
}

/// A tenant key as the root's key column reads it ([`canonical_tenant_key`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantKey {
    /// The key PostgreSQL prints back after reading it into the key column's type.
    pub key: String,
    /// Whether a root row has that key (read in the same statement).
    pub present: bool,
}

/// The tenant key as PostgreSQL reads it into the root's key column, printed back, and whether a
/// root row has it ([`queries::canonical_key`]): the worker keys a job by it before its first
/// destructive statement, so differently written keys of one tenant cannot run as two jobs or slip
/// past a tenant kill switch; and a job for a key no root row has has nothing to delete.
///
/// # Errors
/// [`EngineError::Statement`] naming the key and the column when the key is not a valid value of
/// the column's type (a data exception, SQLSTATE class 22, e.g. 22P02); [`EngineError::Db`] for
/// connection and timeout errors.
pub async fn canonical_tenant_key(
    target: &PgPool,
    plan: &Plan,
    tenant: &str,
    limits: &BatchLimits,
) -> Result<TenantKey, EngineError> {
    let stmt = queries::canonical_key(plan);
    let mut tx = crate::db::begin(target, limits.bounds()).await?;
    let key = crate::db::query_as::<(String, bool)>(stmt.as_query())
        .bind(tenant)
        .fetch_one(&mut *tx)
        .await;
    let (key, present) = match key {
        Err(sqlx::Error::Database(e)) if e.code().is_some_and(|c| c.starts_with("22")) => {
            return Err(EngineError::Statement(format!(
                "tenant key {tenant:?} is not a valid value of {}.{} ({}): {} (SQLSTATE {})",
                plan.name(plan.root),
                plan.key_column,
                plan.key_type.as_str(),
                e.message(),
                e.code().unwrap_or_default()
            )));
        }
        key => key?,
    };
    tx.commit().await?;
    Ok(TenantKey { key, present })
}

/// `SELECT`-list expression: the rows deleted so far in each table of `$1` (`int8[]` of oids; a
/// partitioned table's partitions summed into it), in that order, as one `int8[]` (see
/// [`deleted_so_far`]).
macro_rules! deleted_counts {
    () => {
        concat!(deleted_counts_head!(), "$1", deleted_counts_tail!())
    };
}

/// [`deleted_counts!`] up to its parameter: the probe (`probe`) puts its own parameter number
/// between this and [`deleted_counts_tail!`].
macro_rules! deleted_counts_head {
    () => {
        "ARRAY(SELECT (SELECT sum(pg_stat_get_xact_tuples_deleted(p.relid))::int8 \
           FROM (SELECT o::oid AS relid UNION SELECT relid FROM pg_partition_tree(o::oid)) p) \
         FROM unnest("
    };
}
use deleted_counts_head;

/// [`deleted_counts!`] after its parameter.
macro_rules! deleted_counts_tail {
    () => {
        "::int8[]) WITH ORDINALITY u(o, i) ORDER BY i)"
    };
}
use deleted_counts_tail;

/// In a batch's transaction, before its destructive statement: the rows deleted so far per table
/// of `tables` (`deleted_so_far`) and, with `unchanged`, whether the target is still that
/// [`Incarnation`] — in one read-only statement. Fails with [`EngineError::TargetRestarted`] when
/// it is not, so a batch never runs on a target that may have lost the deferred batches before it
/// (it would go on past rows that came back, and a NO ACTION key to those rows could fail it).
/// `None`: nothing to check (no deferred batch since the last checkpoint).
///
/// # Errors
/// [`EngineError::TargetRestarted`]; database errors.
pub async fn before_batch(
    tx: &mut PgConnection,
    unchanged: Option<&Incarnation>,
    tables: &[u32],
) -> Result<Vec<(u32, i64)>, EngineError> {
    let Some(was) = unchanged else {
        return Ok(deleted_so_far(tx, tables).await?);
    };
    let oids: Vec<i64> = tables.iter().map(|&t| i64::from(t)).collect();
    let (started, stats_reset, counts): (String, Option<String>, Vec<i64>) =
        crate::db::query_as(concat!(
            "SELECT ",
            durability::incarnation_columns!(),
            ", ",
            deleted_counts!()
        ))
        .bind(oids)
        .fetch_one(&mut *tx)
        .await?;
    durability::expect(
        was,
        Incarnation {
            started,
            stats_reset,
        },
    )?;
    Ok(tables.iter().copied().zip(counts).collect())
}

/// Rows deleted in each of `tables` (oids; a partitioned table's partitions summed into it) by
/// this backend and not yet reported to the statistics system (`pg_stat_get_xact_tuples_deleted`,
/// PostgreSQL docs §28.2.25: it accumulates across transactions until the backend flushes its
/// statistics, so a batch takes the difference). No query for no tables.
pub(crate) async fn deleted_so_far(
    tx: &mut PgConnection,
    tables: &[u32],
) -> Result<Vec<(u32, i64)>, sqlx::Error> {
    if tables.is_empty() {
        return Ok(Vec::new());
    }
    let oids: Vec<i64> = tables.iter().map(|&t| i64::from(t)).collect();
    let counts: Vec<i64> = crate::db::query_scalar(concat!("SELECT ", deleted_counts!()))
        .bind(oids)
        .fetch_one(&mut *tx)
        .await?;
    Ok(tables.iter().copied().zip(counts).collect())
}

/// Tenant row counts per table of the plan (plan order), read-only.
///
/// # Errors
/// Database errors.
pub async fn count_rows(
    target: &PgPool,
    plan: &Plan,
    tenant: &str,
    limits: &BatchLimits,
) -> Result<Vec<(u32, i64)>, EngineError> {
    let mut out: Vec<(u32, i64)> = Vec::new();
    for step in &plan.steps {
        if out.iter().any(|(t, _)| *t == step.table) {
            continue;
        }
        let stmt = queries::count_table(plan, step.table);
        let mut tx = crate::db::begin(target, limits.bounds()).await?;
        let n: i64 = crate::db::query_scalar(stmt.as_query())
            .bind(tenant)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        out.push((step.table, n));
    }
    Ok(out)
}
