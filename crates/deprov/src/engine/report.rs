//! `deprov plan`: the plan as text (or JSON), with the tenant's row counts and blockers.

use std::fmt::Write as _;

use serde::Serialize;

use super::catalog::OnDelete;
use super::simulate::{self, SimError, Verdict};
use super::{BatchLimits, BlockerHit, EngineError, Plan};
use crate::config::Config;

/// One table of a plan report.
#[derive(Debug, Clone, Serialize)]
pub struct TableReport {
    /// Position in deletion order (1 = first deleted).
    pub order: usize,
    /// Quoted, qualified name.
    pub table: String,
    /// Why the table is included: its cascading path(s) to the root.
    pub paths: Vec<String>,
    /// The tenant's rows in it now.
    pub rows: i64,
    /// With `[hard_delete] cascade_rows` > 0: the tables whose batches delete this table's rows
    /// through PostgreSQL's own cascade, by an `ON DELETE CASCADE` key from this table (empty =
    /// the table has batches of its own; see [`super::absorb`]).
    pub cascaded_by: Vec<String>,
    /// With [`TableReport::cascaded_by`]: the other tables of the plan this table references by an
    /// `ON DELETE SET NULL` / `SET DEFAULT` key, with the action (`"app"."users" (SET NULL)`):
    /// their batches delete none of its rows, they set the referencing columns.
    pub set_by: Vec<String>,
    /// With `[hard_delete] cascade_rows` > 0: the table's batches are only those through its NOT
    /// NULL key to the root; a row reached only through another path is deleted by PostgreSQL's
    /// cascade under that path's parent's batches (see [`super::absorb`]).
    pub direct_only: bool,
}

/// The cascade pre-check's answer ([`simulate::simulate`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CascadeCheck {
    /// Whether the simulation ran: only when a RESTRICT / NO ACTION / SET NULL / SET DEFAULT key
    /// references the tenant's tables ([`simulate::needs_simulation`]).
    pub simulated: bool,
    /// Whether the cascading DELETE would fail (or may, depending on row order), or the check could
    /// not decide: deprov will refuse.
    pub would_fail: bool,
    /// The simulation's verdict.
    pub verdict: Option<Verdict>,
    /// Why the simulation could not decide (too many rows, an unsupported default).
    pub error: Option<String>,
}

impl CascadeCheck {
    /// Runs the pre-check for `tenant` (read-only).
    ///
    /// # Errors
    /// Database errors (a simulation that cannot decide is reported in [`CascadeCheck::error`]).
    pub async fn run(
        target: &sqlx::PgPool,
        plan: &Plan,
        tenant: &str,
        limits: &BatchLimits,
        read_timeout: std::time::Duration,
        max_rows: u64,
    ) -> Result<Self, EngineError> {
        if !simulate::needs_simulation(plan) {
            return Ok(Self::default());
        }
        Ok(
            match simulate::simulate(target, plan, tenant, limits, read_timeout, max_rows).await {
                Ok(v) => Self {
                    simulated: true,
                    would_fail: !matches!(v, Verdict::Succeeds { .. }),
                    verdict: Some(v),
                    error: None,
                },
                Err(SimError::Db(e)) => return Err(e.into()),
                Err(e) => Self {
                    simulated: true,
                    would_fail: true,
                    verdict: None,
                    error: Some(e.to_string()),
                },
            },
        )
    }

    /// One line for the text report.
    pub fn to_text(&self) -> String {
        match (&self.verdict, &self.error) {
            _ if !self.simulated => {
                "cascade pre-check: not needed (only CASCADE keys and SET NULL into nullable columns, at most one per table, reach the tenant)"
                    .into()
            }
            (_, Some(e)) => format!("cascade pre-check: CANNOT DECIDE, deprov will refuse: {e}"),
            (
                Some(Verdict::Succeeds {
                    rows_read,
                    row_orders,
                }),
                _,
            ) => {
                format!(
                    "cascade pre-check: the cascading DELETE would succeed ({rows_read} rows read, \
                     {row_orders} row order(s) simulated)"
                )
            }
            (Some(Verdict::Fails(f)), _) => format!(
                "cascade pre-check: the cascading DELETE WOULD FAIL on constraint {:?} of {}; deprov will \
                 refuse: {f}",
                f.constraint, f.table
            ),
            (Some(Verdict::OrderDependent(f)), _) => format!(
                "cascade pre-check: whether the cascading DELETE fails DEPENDS ON ROW ORDER; deprov will \
                 refuse. In one order: {f}"
            ),
            (None, None) => "cascade pre-check: no answer".into(),
        }
    }
}

/// The index a foreign key without one needs. Every row deleted from the table the key references
/// fires the key's referential trigger, which looks up the referencing rows by the key's columns
/// (PostgreSQL docs §5.4.5 "Foreign Keys": "a DELETE of a row from the referenced table … will
/// require a scan of the referencing table for rows matching the old value, it is often a good
/// idea to index the referencing columns too"): without an index, a scan of the whole referencing
/// table per deleted row, in the cascade and in deprov's batches alike. The root row's delete pays
/// one such scan per key to it, in one transaction that deprov cannot split.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexAdvice {
    /// The foreign key, as [`PlanReport::unindexed_foreign_keys`] names it.
    pub foreign_key: String,
    /// The referencing table's size in blocks by the planner's statistics (`pg_class.relpages`),
    /// what each such scan reads; `None` when never analyzed, and for a partitioned table (its
    /// partitions hold the blocks).
    pub pages: Option<f64>,
    /// The statement that creates the index: `CREATE INDEX CONCURRENTLY`, which does not block
    /// the table's writes and must run outside a transaction block (PostgreSQL docs, CREATE
    /// INDEX, "Building Indexes Concurrently"); plain `CREATE INDEX` for a partitioned table,
    /// which PostgreSQL 15 cannot index concurrently (it holds a SHARE lock on the table while
    /// it builds: index each partition concurrently and attach them to an index created `ON
    /// ONLY` the table instead where that matters).
    pub statement: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    /// The tenant key.
    pub tenant_id: String,
    /// Plan identity: the job's `progress.plan_hash` and its checkpoints' when it runs under the same
    /// schema and `[hard_delete] cascade_rows`.
    pub plan_hash: String,
    /// The tenant's rows in the root table (`[tenant] root_table`): 0 = no such tenant.
    pub root_rows: i64,
    /// Tables, leaves first.
    pub tables: Vec<TableReport>,
    /// Rows outside the tenant referencing its rows through RESTRICT / NO ACTION (or SET NULL into
    /// NOT NULL): normally each makes the cascade fail; [`PlanReport::cascade`] decides.
    pub blockers: Vec<BlockerHit>,
    /// Whether the cascading DELETE would fail, by simulation of PostgreSQL's referential triggers.
    pub cascade: CascadeCheck,
    /// SET NULL / SET DEFAULT references PostgreSQL applies as tenant rows go.
    pub side_effects: Vec<String>,
    /// Foreign keys into the tenant's tables whose referencing columns lack an index.
    pub unindexed_foreign_keys: Vec<String>,
    /// For each of those keys, the index that spares its scans, the largest referencing table
    /// first.
    pub index_advice: Vec<IndexAdvice>,
    /// Order-sensitive foreign keys on cycles of the tenant's tables that batches cannot order
    /// ([`super::cycles`]): the tenant is deleted only when its whole cascade fits one transaction
    /// of the batch bound, and refused otherwise.
    pub unordered_foreign_keys: Vec<String>,
    /// User triggers on `DELETE` on the tenant's tables (`table: trigger`,
    /// [`super::trial::delete_triggers`]); with `[hard_delete] user_triggers = "refuse"` any of
    /// them makes deprov refuse the tenant.
    pub user_triggers: Vec<String>,
    /// Whether deprov refuses the tenant for them (`user_triggers = "refuse"` and some found).
    pub refused_for_triggers: bool,
    /// With `deprov plan --trial`: the trial cascade's verdict ([`super::trial::Trial::label`]);
    /// none when it was not asked for.
    pub trial: Option<String>,
    /// Why deprov refuses the tenant after that verdict ([`super::trial::Trial::refusal`]).
    pub trial_refusal: Option<String>,
}

impl PlanReport {
    /// Builds the report: reads the catalog, counts the tenant's rows, finds blockers, simulates the
    /// cascade. Read-only.
    ///
    /// # Errors
    /// Database and planning errors.
    pub async fn build(
        target: &sqlx::PgPool,
        config: &Config,
        tenant: &str,
    ) -> Result<Self, EngineError> {
        let plan =
            super::load_plan(target, &config.root_table(), &config.tenant.key_column).await?;
        let limits = BatchLimits::from(&config.hard_delete);
        let counts = super::count_rows(target, &plan, tenant, &limits).await?;
        let blockers = super::find_blockers(target, &plan, tenant, &limits).await?;
        let cascade = CascadeCheck::run(
            target,
            &plan,
            tenant,
            &limits,
            // Reads bounded as the worker's pre-check's are.
            config.hard_delete.batch_timeout(),
            config.hard_delete.max_simulated_rows,
        )
        .await?;
        let cascade_rows = config.hard_delete.cascade_rows;
        let tenant_rows =
            super::estimate::absorbable_rows(target, &plan, tenant, &limits, cascade_rows).await?;
        let absorbing = plan
            .clone()
            .absorb_tenant(f64::from(cascade_rows), &tenant_rows);
        let mut report = Self::from_parts(&plan, tenant, &counts, blockers, cascade);
        // The hash of the plan the worker runs (its checkpoints and `progress.plan_hash`): the
        // batches with PostgreSQL's cascade let in under `cascade_rows`.
        report.plan_hash = absorbing.hash();
        report.user_triggers = super::trial::delete_triggers(
            target,
            &plan,
            limits.lock_timeout,
            limits.statement_timeout,
        )
        .await?;
        report.refused_for_triggers = !report.user_triggers.is_empty()
            && config.hard_delete.user_triggers == crate::config::UserTriggers::Refuse;
        // `tables` follows `counts`, one entry per table.
        for (t, &(oid, _)) in report.tables.iter_mut().zip(&counts) {
            t.direct_only = absorbing.covered.contains(&oid);
            if absorbing.absorbed.contains(&oid) {
                let parents =
                    plan.catalog.foreign_keys.iter().filter(|fk| {
                        fk.from == oid && fk.to != oid && plan.closure.contains(&fk.to)
                    });
                for fk in parents {
                    let parent = plan.name(fk.to).to_string();
                    let (list, entry) = match fk.on_delete {
                        OnDelete::Cascade => (&mut t.cascaded_by, parent),
                        OnDelete::SetNull | OnDelete::SetDefault => (
                            &mut t.set_by,
                            format!("{parent} ({})", fk.on_delete.as_sql()),
                        ),
                        // RESTRICT / NO ACTION: neither deletes nor changes its rows.
                        OnDelete::Restrict | OnDelete::NoAction => continue,
                    };
                    if !list.contains(&entry) {
                        list.push(entry);
                    }
                }
            }
        }
        Ok(report)
    }

    /// Runs the trial cascade ([`super::trial`]) and records its verdict: unlike the rest of the
    /// report it writes (a `DELETE`, rolled back), takes the row locks of what it reaches for at
    /// most [`super::trial::budget`] and fires delete triggers.
    ///
    /// # Errors
    /// Database and planning errors (not the trial's own verdicts).
    pub async fn run_trial(
        &mut self,
        target: &sqlx::PgPool,
        config: &Config,
    ) -> Result<(), EngineError> {
        let plan =
            super::load_plan(target, &config.root_table(), &config.tenant.key_column).await?;
        let hd = &config.hard_delete;
        let verdict = super::trial::trial_cascade(
            target,
            &plan,
            &self.tenant_id,
            hd.lock_timeout,
            super::trial::TrialBounds::whole(super::trial::budget(hd)),
        )
        .await?;
        self.trial = Some(verdict.label());
        self.trial_refusal = verdict.refusal();
        Ok(())
    }

    /// Assembles a report from a plan and measured counts.
    pub fn from_parts(
        plan: &Plan,
        tenant: &str,
        counts: &[(u32, i64)],
        blockers: Vec<BlockerHit>,
        cascade: CascadeCheck,
    ) -> Self {
        let fk_text = |i: usize| {
            let fk = &plan.catalog.foreign_keys[i];
            format!(
                "{}({}) → {}({}) [{}, ON DELETE {}]",
                plan.name(fk.from),
                fk.from_cols.join(", "),
                plan.name(fk.to),
                fk.to_cols.join(", "),
                fk.name,
                fk.on_delete.as_sql()
            )
        };
        let tables = counts
            .iter()
            .enumerate()
            .map(|(i, (oid, rows))| TableReport {
                order: i + 1,
                table: plan.name(*oid).to_string(),
                paths: plan
                    .steps
                    .iter()
                    .filter(|s| s.table == *oid)
                    .map(|s| plan.describe_path(s))
                    .collect(),
                rows: *rows,
                cascaded_by: Vec::new(),
                set_by: Vec::new(),
                direct_only: false,
            })
            .collect();
        let root_rows = counts
            .iter()
            .find(|(oid, _)| *oid == plan.root)
            .map_or(0, |&(_, rows)| rows);
        Self {
            tenant_id: tenant.into(),
            plan_hash: plan.hash(),
            root_rows,
            tables,
            blockers,
            cascade,
            side_effects: plan.side_effects.iter().map(|&i| fk_text(i)).collect(),
            unindexed_foreign_keys: plan.unindexed.iter().map(|&i| fk_text(i)).collect(),
            index_advice: index_advice(plan, &fk_text),
            unordered_foreign_keys: plan.unordered.iter().map(|&i| fk_text(i)).collect(),
            user_triggers: Vec::new(),
            refused_for_triggers: false,
            trial: None,
            trial_refusal: None,
        }
    }

    /// A readable multi-line rendering.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let total: i64 = self.tables.iter().map(|t| t.rows).sum();
        let _ = writeln!(
            out,
            "plan {} for tenant {:?}: {} tables, {} {}, deleted in batches in this order (or by \
             one transaction when the whole cascade fits a batch's time):",
            self.plan_hash,
            self.tenant_id,
            self.tables.len(),
            total,
            rows_word(total)
        );
        for t in &self.tables {
            t.write_text(&mut out);
        }
        if self.blockers.is_empty() {
            let _ = writeln!(out, "blockers: none");
        } else {
            let _ = writeln!(
                out,
                "BLOCKERS (rows outside the tenant referencing its rows; the cascade pre-check decides):"
            );
            for b in &self.blockers {
                let _ = writeln!(
                    out,
                    "  {} {} of {} {} {} through {}",
                    b.rows,
                    rows_word(b.rows),
                    b.table,
                    if b.rows == 1 {
                        "references"
                    } else {
                        "reference"
                    },
                    b.references,
                    b.constraint
                );
            }
        }
        let _ = writeln!(out, "{}", self.cascade.to_text());
        if !self.user_triggers.is_empty() {
            let _ = writeln!(
                out,
                "user triggers on DELETE (they see rows go leaves first, not in the cascade's order){}: {}",
                if self.refused_for_triggers {
                    "; deprov will refuse ([hard_delete] user_triggers = \"refuse\")"
                } else {
                    ""
                },
                self.user_triggers.join(", ")
            );
        }
        if let Some(trial) = &self.trial {
            let _ = writeln!(
                out,
                "trial cascade (the cascading DELETE run and rolled back): {trial}{}",
                if self.trial_refusal.is_some() {
                    "; deprov will refuse"
                } else {
                    ""
                }
            );
        }
        // Each key without an index once, largest table first, with the statement that indexes it.
        let unindexed: Vec<String> = self
            .index_advice
            .iter()
            .map(|a| {
                let pages = a
                    .pages
                    .map_or_else(|| "size unknown".to_string(), |p| format!("{p:.0} pages"));
                format!("{} ({pages})\n      {};", a.foreign_key, a.statement)
            })
            .collect();
        for (title, items) in [
            (
                "side effects (applied by PostgreSQL as rows go)",
                &self.side_effects,
            ),
            (
                "foreign keys without an index (each deleted referenced row scans the referencing table; largest table first, each with the statement that indexes it)",
                &unindexed,
            ),
            (
                "foreign keys on cycles batches cannot order (deleted only as one whole cascade within the batch bound, else refused)",
                &self.unordered_foreign_keys,
            ),
        ] {
            let _ = writeln!(
                out,
                "{title}:{}",
                if items.is_empty() { " none" } else { "" }
            );
            for i in items {
                let _ = writeln!(out, "  {i}");
            }
        }
        out
    }
}

/// [`PlanReport::index_advice`] for `plan`'s keys without an index, named by `fk_text`, the
/// largest referencing table first.
fn index_advice(plan: &Plan, fk_text: &dyn Fn(usize) -> String) -> Vec<IndexAdvice> {
    let mut advice: Vec<IndexAdvice> = plan
        .unindexed
        .iter()
        .map(|&i| {
            let fk = &plan.catalog.foreign_keys[i];
            let table = &plan.catalog.tables[&fk.from];
            let mut b = crate::sql::SqlBuilder::new();
            b.sql(if table.partitioned {
                "CREATE INDEX ON "
            } else {
                "CREATE INDEX CONCURRENTLY ON "
            })
            .table(&table.name)
            .sql(" (")
            .join(&fk.from_cols, ", ", |b, _, c| {
                b.ident(c);
            })
            .sql(")");
            IndexAdvice {
                foreign_key: fk_text(i),
                pages: (!table.partitioned && table.estimated_pages > 0.0)
                    .then_some(table.estimated_pages),
                statement: b.build().text().to_string(),
            }
        })
        .collect();
    advice.sort_by(|a, b| b.pages.unwrap_or(-1.0).total_cmp(&a.pages.unwrap_or(-1.0)));
    advice
}

impl TableReport {
    /// This table's lines of [`PlanReport::to_text`]: its place in the order, rows, paths, and
    /// what deletes its rows when it has no batches of its own.
    fn write_text(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "  {:>3}. {:<50} {:>12} {}",
            self.order,
            self.table,
            self.rows,
            rows_word(self.rows)
        );
        for p in &self.paths {
            let _ = writeln!(out, "       via {p}");
        }
        if self.direct_only {
            let _ = writeln!(
                out,
                "       batches only through its key to the root: a row reached only through another path goes with that path's parent's cascade"
            );
        }
        if !self.cascaded_by.is_empty() {
            let _ = writeln!(
                out,
                "       no batches of its own: PostgreSQL's cascade deletes its rows under the batches of {}",
                self.cascaded_by.join(", ")
            );
        }
        if !self.set_by.is_empty() {
            let _ = writeln!(
                out,
                "       the batches of {} delete none of its rows: their keys set its referencing columns instead",
                self.set_by.join(", ")
            );
        }
    }
}

/// "row" for one, else "rows": `format!("{n} {}", rows_word(n))`, for any integer count.
pub fn rows_word(n: impl Into<i128>) -> &'static str {
    if n.into() == 1 { "row" } else { "rows" }
}
