//! `deprov plan`: the plan as text (or JSON), with the tenant's row counts and blockers.

use std::fmt::Write as _;

use serde::Serialize;

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
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    /// The tenant key.
    pub tenant_id: String,
    /// Plan identity (checkpoints are tied to it).
    pub plan_hash: String,
    /// Tables, leaves first.
    pub tables: Vec<TableReport>,
    /// Rows that would make the cascade (and deprov) fail.
    pub blockers: Vec<BlockerHit>,
    /// SET NULL / SET DEFAULT references PostgreSQL applies as tenant rows go.
    pub side_effects: Vec<String>,
    /// Foreign keys into the tenant's tables whose referencing columns lack an index.
    pub unindexed_foreign_keys: Vec<String>,
}

impl PlanReport {
    /// Builds the report: reads the catalog, counts the tenant's rows, finds blockers. Read-only.
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
        Ok(Self::from_parts(&plan, tenant, &counts, blockers))
    }

    /// Assembles a report from a plan and measured counts.
    pub fn from_parts(
        plan: &Plan,
        tenant: &str,
        counts: &[(u32, i64)],
        blockers: Vec<BlockerHit>,
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
            })
            .collect();
        Self {
            tenant_id: tenant.into(),
            plan_hash: plan.hash(),
            tables,
            blockers,
            side_effects: plan.side_effects.iter().map(|&i| fk_text(i)).collect(),
            unindexed_foreign_keys: plan.unindexed.iter().map(|&i| fk_text(i)).collect(),
        }
    }

    /// A readable multi-line rendering.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let total: i64 = self.tables.iter().map(|t| t.rows).sum();
        let _ = writeln!(
            out,
            "plan {} for tenant {:?}: {} tables, {} rows, deleted in this order:",
            self.plan_hash,
            self.tenant_id,
            self.tables.len(),
            total
        );
        for t in &self.tables {
            let _ = writeln!(out, "  {:>3}. {:<50} {:>12} rows", t.order, t.table, t.rows);
            for p in &t.paths {
                let _ = writeln!(out, "       via {p}");
            }
        }
        if self.blockers.is_empty() {
            let _ = writeln!(out, "blockers: none");
        } else {
            let _ = writeln!(
                out,
                "BLOCKERS (the cascade would fail; deprov will refuse):"
            );
            for b in &self.blockers {
                let _ = writeln!(
                    out,
                    "  {} rows of {} reference {} through {}",
                    b.rows, b.table, b.references, b.constraint
                );
            }
        }
        for (title, items) in [
            (
                "side effects (applied by PostgreSQL as rows go)",
                &self.side_effects,
            ),
            (
                "foreign keys without an index (slow cascades)",
                &self.unindexed_foreign_keys,
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
