//! The cascade pre-check: decides, read-only and before anything is deleted, whether
//! `DELETE FROM root WHERE key = $1` would fail, and why — by simulating PostgreSQL's referential
//! triggers over the rows the cascade would reach.
//!
//! deprov deletes leaves first, so its own statements never meet the situations below; the cascade
//! does, and deprov must refuse exactly when the cascade fails (PostgreSQL docs §5.4.5 "Foreign Keys",
//! and CREATE TABLE, "ON DELETE"). How PostgreSQL 15 runs a cascading delete
//! (`src/backend/utils/adt/ri_triggers.c`, `src/backend/commands/trigger.c`):
//!
//! - Every foreign key has AFTER ROW triggers on the referenced table (one per delete action:
//!   `RI_FKey_cascade_del`, `_restrict_del`, `_noaction_del`, `_setnull_del`, `_setdefault_del`) and a
//!   check trigger on the referencing table (`RI_FKey_check_upd`). A deleted or updated row queues its
//!   triggers in name order (`RI_ConstraintTrigger_a_<oid>`: creation order), read here from
//!   `pg_trigger`, per table or leaf partition.
//! - The actions run their statements through SPI without a query level of their own, so the events
//!   those statements queue are appended to the same list and fired after the ones before them:
//!   first in, first out (`AfterTriggerEndQuery` loops until the list is empty).
//! - CASCADE deletes the referencing rows still present. RESTRICT, and NO ACTION unless
//!   `INITIALLY DEFERRED`, fail (23503) if a referencing row is still present when they fire — also
//!   one the cascade would delete a moment later. A deferred NO ACTION is checked at commit.
//! - SET NULL / SET DEFAULT update the still-present referencing rows (the columns of
//!   `confdelsetcols`, else all); a NULL into a NOT NULL column fails at once (23502). The update
//!   queues the check of every foreign key of the row whose values changed to non-NULL ones; it fails
//!   (23503) if the referenced key is missing when it fires (at commit when deferred), unless the row
//!   is gone by then. SET DEFAULT then re-checks like NO ACTION: a row still holding the deleted key
//!   (its default is that key) fails at once.
//! - MATCH SIMPLE: a key with a NULL references nothing.
//!
//! The rows of one statement are met in scan order, which depends on the plan PostgreSQL picks. The
//! simulation runs in physical (`ctid`) order and, if a statement met several rows, again in the
//! reverse order; when the two disagree the outcome depends on row order ([`Verdict::OrderDependent`]).
//! The second run is left out when the first succeeded without updating a row and no check that
//! can fail found a referencing row deleted by the check's own generation of events: the outcome
//! is then the same in every order (`state::Run::contest`).
//!
//! Limits: keys are compared by their text form (`numeric` 1.0 ≠ 1); user triggers, rules, row-level
//! security and ON UPDATE actions (a SET NULL / SET DEFAULT writing a column that other tables
//! reference) are not simulated; rows written concurrently between the simulation's queries may be
//! missed. Rows are read in bulk per foreign key and trigger generation, in reads bounded and sized
//! like batches (`load::rows`), at most `hard_delete.max_simulated_rows` of them. A table reached
//! by several keys (its key to the root, then to a parent on another path) is read whole once: a
//! later read leaves out the rows an earlier one already returned (`Store::known`).

mod load;
mod preset;
mod scope;
mod state;
mod store;

pub(crate) use preset::shares_a_column;
pub use preset::{Preset, apply as apply_presets, detaches, presets};

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use futures::{StreamExt, TryStreamExt};
use sqlx::PgPool;

use super::catalog::{ForeignKey, OnDelete};
use super::{BatchLimits, EngineError, Plan};
use crate::sql::QualifiedName;
use load::Facts;
use state::{Event, Run};
use store::{Key, Store};

/// One probe's keys to read: `(probe, keys)`.
type Lookups = (usize, Vec<Key>);

/// Most of the simulation's reads run at once (each on its own connection of the target pool,
/// which bounds them too).
const MAX_PARALLEL_READS: usize = 4;

/// Why the cascading DELETE would fail: the error PostgreSQL would raise.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CascadeFailure {
    /// `23503` (foreign_key_violation) or `23502` (not_null_violation).
    pub sqlstate: &'static str,
    /// The foreign key constraint whose trigger raises it.
    pub constraint: String,
    /// The referencing table of that constraint.
    pub table: QualifiedName,
    /// The referenced table.
    pub references: QualifiedName,
    /// PostgreSQL's message, approximately.
    pub message: String,
}

impl CascadeFailure {
    /// The failure PostgreSQL raises with `sqlstate` from the trigger of foreign key `fk`.
    fn of(plan: &Plan, fk: usize, sqlstate: &'static str, message: String) -> Self {
        let f = &plan.catalog.foreign_keys[fk];
        Self {
            sqlstate,
            constraint: f.name.clone(),
            table: plan.name(f.from).clone(),
            references: plan.name(f.to).clone(),
            message,
        }
    }

    fn referenced(plan: &Plan, fk: usize, rows: usize, at_commit: bool) -> Self {
        let f = &plan.catalog.foreign_keys[fk];
        let message = format!(
            "update or delete on table {} violates foreign key constraint {:?} on table {}: {rows} \
             row(s) still reference a deleted row{}",
            plan.name(f.to),
            f.name,
            plan.name(f.from),
            if at_commit {
                " at commit"
            } else {
                " when the check fires"
            }
        );
        Self::of(plan, fk, crate::sqlstate::FOREIGN_KEY_VIOLATION, message)
    }

    fn missing_parent(plan: &Plan, fk: usize, key: &[String]) -> Self {
        let f = &plan.catalog.foreign_keys[fk];
        let message = format!(
            "insert or update on table {} violates foreign key constraint {:?}: key ({})=({}) is \
             not present in table {}",
            plan.name(f.from),
            f.name,
            f.from_cols.join(", "),
            key.join(", "),
            plan.name(f.to)
        );
        Self::of(plan, fk, crate::sqlstate::FOREIGN_KEY_VIOLATION, message)
    }

    fn not_null(plan: &Plan, fk: usize, column: &str) -> Self {
        let f = &plan.catalog.foreign_keys[fk];
        let message = format!(
            "null value in column {column:?} of relation {} violates not-null constraint (ON DELETE {} \
             of {:?})",
            plan.name(f.from),
            f.on_delete.as_sql(),
            f.name
        );
        Self::of(plan, fk, crate::sqlstate::NOT_NULL_VIOLATION, message)
    }
}

impl fmt::Display for CascadeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (SQLSTATE {})", self.message, self.sqlstate)
    }
}

/// The simulation's answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Verdict {
    /// The cascade would succeed.
    Succeeds {
        /// Rows the simulation read.
        rows_read: usize,
        /// Row orders simulated: 2 when the outcome of the first might depend on the order
        /// statements meet their rows in (see the module docs), else 1.
        row_orders: u8,
    },
    /// The cascade would fail with this error, whatever the row order.
    Fails(CascadeFailure),
    /// The cascade fails in one row order and succeeds in another (the order is the plan's scan
    /// order): the failure found.
    OrderDependent(CascadeFailure),
}

/// Why the simulation gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A database error.
    #[error("{0}")]
    Db(#[from] sqlx::Error),
    /// More rows than `hard_delete.max_simulated_rows`.
    #[error(
        "the cascade pre-check needs more than hard_delete.max_simulated_rows = {limit} rows; \
         raise it to delete this tenant"
    )]
    TooLarge {
        /// The configured limit.
        limit: u64,
    },
    /// A schema feature the simulation cannot decide on.
    #[error("the cascade pre-check cannot decide: {0}")]
    Unsupported(String),
}

impl From<SimError> for EngineError {
    fn from(e: SimError) -> Self {
        match e {
            SimError::Db(e) => Self::Db(e),
            other => Self::Simulation(other.to_string()),
        }
    }
}

/// Whether the plan has a *conditional* foreign key: one into the closure whose action can make the
/// cascade fail — RESTRICT, NO ACTION, SET DEFAULT, or SET NULL into a NOT NULL column. Only then is
/// [`simulate`] needed. CASCADE and one SET NULL into nullable columns per table never fail by
/// themselves (a CHECK constraint or user trigger on the updated row is outside what the simulation
/// models anyway), so a schema of those alone — like most — pays nothing.
///
/// Also when a table has two SET NULL keys into the closure ([`updated_twice`]); and when a SET
/// NULL / SET DEFAULT key shares columns with another key of its table ([`detaches`]), whose
/// simulated updates are then applied before the batches ([`presets`]).
pub fn needs_simulation(plan: &Plan) -> bool {
    detaches(plan)
        || updated_twice(plan)
        || plan
            .catalog
            .foreign_keys
            .iter()
            .any(|fk| conditional(plan, fk))
}

/// Whether the cascade may update a row twice: its table has two or more SET NULL / SET DEFAULT
/// keys into the closure. The second update of a row finds a version the cascade's own transaction
/// wrote, so PostgreSQL checks every foreign key of the row that still holds values, changed or
/// not (`RI_FKey_fk_upd_check_required`, PostgreSQL 15 `ri_triggers.c`), and one whose referenced
/// row the cascade deleted before its own action reached this row fails (23503).
pub fn updated_twice(plan: &Plan) -> bool {
    !updated_twice_tables(plan).is_empty()
}

/// The tables of [`updated_twice`]: those with two or more SET NULL / SET DEFAULT keys into the
/// closure (oids).
pub(crate) fn updated_twice_tables(plan: &Plan) -> std::collections::BTreeSet<u32> {
    let fks = &plan.catalog.foreign_keys;
    let mut count: BTreeMap<u32, usize> = BTreeMap::new();
    for g in fks.iter().filter(|g| {
        plan.closure.contains(&g.to)
            && matches!(g.on_delete, OnDelete::SetNull | OnDelete::SetDefault)
    }) {
        *count.entry(g.from).or_default() += 1;
    }
    count
        .into_iter()
        .filter(|&(_, n)| n >= 2)
        .map(|(t, _)| t)
        .collect()
}

/// Whether `fk` references the closure with an action that can make the cascade fail (see
/// [`needs_simulation`]).
fn conditional(plan: &Plan, fk: &ForeignKey) -> bool {
    plan.closure.contains(&fk.to)
        && match fk.on_delete {
            OnDelete::Cascade => false,
            OnDelete::SetNull => fk.blocks(),
            _ => true,
        }
}

/// Simulates `DELETE FROM root WHERE key = tenant` (see the module docs). Read-only: every query is
/// its own transaction under `limits`' timeouts, the reads of rows sized to take half of
/// `read_timeout` and cut at it (see `load::rows`); at most `max_rows` rows are held.
///
/// # Errors
/// [`SimError`]: database errors, too many rows, or a schema it cannot simulate.
pub async fn simulate(
    target: &PgPool,
    plan: &Plan,
    tenant: &str,
    limits: &BatchLimits,
    read_timeout: std::time::Duration,
    max_rows: u64,
) -> Result<Verdict, SimError> {
    let mut facts = load::facts(target, plan, limits).await?;
    scope::narrow(&mut facts, plan);
    let ctx = Ctx {
        target,
        plan,
        limits,
        read_timeout,
        sizes: load::Sizes::default(),
        facts: &facts,
        max_rows,
    };
    let (mut store, roots) = ctx.start(tenant).await?;
    let (forward, ordered) = ctx.run(&mut store, &roots, false).await?;
    let rows_read = store.rows.len();
    if !ordered {
        return Ok(match forward {
            Ok(()) => Verdict::Succeeds {
                rows_read,
                row_orders: 1,
            },
            Err(f) => Verdict::Fails(*f),
        });
    }
    let (reverse, _) = ctx.run(&mut store, &roots, true).await?;
    Ok(match (forward, reverse) {
        (Ok(()), Ok(())) => Verdict::Succeeds {
            rows_read: store.rows.len(),
            row_orders: 2,
        },
        (Err(f), Err(_)) => Verdict::Fails(*f),
        (Err(f), Ok(())) | (Ok(()), Err(f)) => Verdict::OrderDependent(*f),
    })
}

struct Ctx<'a> {
    target: &'a PgPool,
    plan: &'a Plan,
    limits: &'a BatchLimits,
    /// The bound of one read of rows (`load::rows`).
    read_timeout: std::time::Duration,
    /// The sizes of those reads so far.
    sizes: load::Sizes,
    facts: &'a Facts,
    max_rows: u64,
}

impl Ctx<'_> {
    /// A store holding the root rows of `tenant`, and their indexes: where both runs start. The
    /// rows of the keys of [`scope::unread`] that name a root row are left unread.
    async fn start(&self, tenant: &str) -> Result<(Store, Vec<usize>), SimError> {
        let mut store = Store::new(self.plan, self.facts);
        let root = store.probe(self.plan.root, std::slice::from_ref(&self.plan.key_column));
        let key = vec![store.intern(tenant)];
        self.fetch(&mut store, vec![(root, key)]).await?;
        let roots: Vec<usize> = (0..store.rows.len()).collect();
        for fk in scope::unread(self.plan) {
            for &r in &roots {
                let key = store.key(store.referenced_probe(fk), &store.rows[r].vals);
                if let Some(key) = key {
                    store.leave_unread(store.referencing_probe(fk), key);
                }
            }
        }
        Ok((store, roots))
    }

    /// Reads the rows of the given `(probe, key)` lookups, one query per probe. Probes of different
    /// tables are read side by side, up to [`MAX_PARALLEL_READS`] at a time and no more than the
    /// target pool's connections: a probe's read leaves out the rows earlier reads of the same
    /// table returned ([`Store::known`]), so a table's probes are read one after another, in waves.
    /// The rows are added in the order of the probes within each wave, whatever order the reads
    /// finish in, so a simulation meets its rows in the same order at any parallelism.
    async fn fetch(&self, store: &mut Store, needs: Vec<(usize, Key)>) -> Result<(), SimError> {
        let mut by_probe: BTreeMap<usize, Vec<Key>> = BTreeMap::new();
        for (p, k) in needs {
            by_probe.entry(p).or_default().push(k);
        }
        let mut by_table: BTreeMap<u32, VecDeque<Lookups>> = BTreeMap::new();
        for (p, keys) in by_probe {
            by_table
                .entry(store.probes[p].table)
                .or_default()
                .push_back((p, keys));
        }
        let parallel = usize::try_from(self.target.options().get_max_connections())
            .unwrap_or(1)
            .clamp(1, MAX_PARALLEL_READS);
        while !by_table.is_empty() {
            let mut wave: Vec<Lookups> = by_table
                .values_mut()
                .filter_map(VecDeque::pop_front)
                .collect();
            by_table.retain(|_, left| !left.is_empty());
            wave.sort_by_key(|(p, _)| *p);
            let read = {
                let store = &*store;
                futures::stream::iter(wave.into_iter().map(|(p, keys)| async move {
                    let (table, cols) = (store.probes[p].table, &store.probes[p].cols);
                    let texts: Vec<Vec<String>> = keys.iter().map(|k| store.texts(k)).collect();
                    let rows = load::rows(
                        self.target,
                        self.plan,
                        (self.limits, self.read_timeout, &self.sizes),
                        table,
                        (cols, &texts),
                        &store.tracked[&table],
                        &store.known(table, p),
                    )
                    .await?;
                    Ok::<_, SimError>((p, keys, rows))
                }))
                .buffered(parallel)
                .try_collect::<Vec<_>>()
                .await?
            };
            for (p, keys, rows) in read {
                store.add(p, keys, rows);
                if store.rows.len() as u64 > self.max_rows {
                    return Err(SimError::TooLarge {
                        limit: self.max_rows,
                    });
                }
            }
        }
        Ok(())
    }

    /// One run: deletes the root rows, fires the queue generation by generation (each generation's
    /// rows read first, in bulk), then the events deferred to commit. Returns the outcome and whether
    /// another row order might change it: a statement met several rows, and the run failed or was
    /// contested (`state::Run::contested`).
    async fn run(
        &self,
        store: &mut Store,
        roots: &[usize],
        reverse: bool,
    ) -> Result<(Result<(), Box<CascadeFailure>>, bool), SimError> {
        let (outcome, run) = self.run_keeping(store, roots, reverse).await?;
        let ordered = run.multi && (outcome.is_err() || run.contested);
        Ok((outcome, ordered))
    }

    /// [`Self::run`], returning the run itself (what it deleted and updated).
    async fn run_keeping(
        &self,
        store: &mut Store,
        roots: &[usize],
        reverse: bool,
    ) -> Result<(Result<(), Box<CascadeFailure>>, Run), SimError> {
        let mut run = Run::new(reverse);
        run.delete(store, self.facts, roots);
        let mut fired: u64 = 0;
        let mut commit_phase = false;
        loop {
            let generation: Vec<Event> = if run.queue.is_empty() && !commit_phase {
                commit_phase = true;
                std::mem::take(&mut run.at_commit)
            } else {
                run.queue.drain(..).collect()
            };
            if generation.is_empty() {
                if commit_phase && run.queue.is_empty() {
                    break;
                }
                continue;
            }
            let needs = run.needs(store, &generation);
            self.fetch(store, needs).await?;
            run.next_generation();
            fired += generation.len() as u64;
            if fired > self.max_rows.saturating_mul(4) {
                return Err(SimError::TooLarge {
                    limit: self.max_rows,
                });
            }
            for ev in generation {
                if let Err(f) = run.fire(store, self.facts, self.plan, ev) {
                    return Ok((Err(f), run));
                }
            }
        }
        Ok((Ok(()), run))
    }
}
