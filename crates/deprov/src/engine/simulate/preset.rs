//! Presets: the SET NULL / SET DEFAULT updates the cascade makes on rows it does not delete, applied
//! before deprov's batches when they would change which rows the cascade deletes.
//!
//! The cascade fires a row's referential triggers in name order (see the module docs of
//! [`super`]). When table T has a SET NULL or SET DEFAULT key F whose columns are also columns of
//! another key G of T into the tenant (the hazard, [`detaches`]), F may fire first and change a
//! row's G columns, so G's CASCADE no longer reaches it: the row survives, updated. deprov deletes
//! leaves first, so its batch for T along G would delete that row. The simulation knows which rows
//! survive updated; applying those updates first makes deprov's batches meet the rows as the
//! cascade's later triggers do. The same updates the cascade makes, so the result is equal.

use std::collections::BTreeMap;

use sqlx::PgPool;

use super::{Ctx, SimError, load};
use crate::engine::catalog::{ForeignKey, OnDelete};
use crate::engine::{BatchLimits, EngineError, Plan};
use crate::sql::{SqlBuilder, Statement};

/// One surviving row's updated columns, as the cascade leaves them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preset {
    /// The table (plan oid).
    pub table: u32,
    /// `tableoid` of the row (the table or its leaf partition).
    pub rel: u32,
    /// `ctid` of the row when simulated, as `(block,offset)`.
    pub tid: String,
    /// Columns the cascade changes, sorted.
    pub columns: Vec<String>,
    /// Their values when simulated (text form; `None` = NULL): the update only applies while unchanged.
    pub old: Vec<Option<String>>,
    /// Their values after the cascade.
    pub new: Vec<Option<String>>,
}

/// Whether the plan has the hazard the module docs describe: a SET NULL / SET DEFAULT key into the
/// tenant's tables sharing a column with another key of the same table into them.
pub fn detaches(plan: &Plan) -> bool {
    plan.catalog.foreign_keys.iter().any(|f| {
        plan.closure.contains(&f.to)
            && matches!(f.on_delete, OnDelete::SetNull | OnDelete::SetDefault)
            && shares_a_column(plan, f)
    })
}

/// Whether `f` (a foreign key of `plan`'s catalog) shares a referencing column with another key
/// of its table into the tenant's tables.
pub(crate) fn shares_a_column(plan: &Plan, f: &ForeignKey) -> bool {
    plan.catalog.foreign_keys.iter().any(|g| {
        !std::ptr::eq(g, f)
            && g.from == f.from
            && plan.closure.contains(&g.to)
            && g.from_cols.iter().any(|c| f.from_cols.contains(c))
    })
}

/// Simulates the cascade (first row order) and returns the updates it makes on rows it does not
/// delete, in tables with the hazard. Its reads are bounded as [`super::simulate`]'s
/// (`read_timeout`).
///
/// # Errors
/// [`SimError`]; [`SimError::Unsupported`] if the cascade would fail (the pre-check refuses such a
/// tenant before this runs).
pub async fn presets(
    target: &PgPool,
    plan: &Plan,
    tenant: &str,
    limits: &BatchLimits,
    read_timeout: std::time::Duration,
    max_rows: u64,
) -> Result<Vec<Preset>, SimError> {
    let facts = load::facts(target, plan, limits).await?;
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
    let (outcome, run) = ctx.run_keeping(&mut store, &roots, false).await?;
    if let Err(f) = outcome {
        return Err(SimError::Unsupported(format!(
            "the cascade would fail: {f}"
        )));
    }
    let fks = &plan.catalog.foreign_keys;
    let hazard = |table: u32| {
        fks.iter().enumerate().any(|(i, f)| {
            f.from == table
                && matches!(f.on_delete, OnDelete::SetNull | OnDelete::SetDefault)
                && fks.iter().enumerate().any(|(j, g)| {
                    j != i && g.from == table && g.from_cols.iter().any(|c| f.from_cols.contains(c))
                })
        })
    };
    let mut out = Vec::new();
    for (row, new) in run.survivors() {
        let r = &store.rows[row];
        if !hazard(r.table) {
            continue;
        }
        let tracked = &store.tracked[&r.table];
        let mut changed: Vec<(String, Option<String>, Option<String>)> = tracked
            .iter()
            .enumerate()
            .filter(|&(i, _)| r.vals[i] != new[i])
            .map(|(i, c)| {
                let text = |v: Option<u32>| v.map(|v| store.text(v).to_owned());
                (c.clone(), text(r.vals[i]), text(new[i]))
            })
            .collect();
        if changed.is_empty() {
            continue;
        }
        changed.sort();
        out.push(Preset {
            table: r.table,
            rel: r.rel,
            tid: format!("({},{})", r.tid.0, r.tid.1),
            columns: changed.iter().map(|c| c.0.clone()).collect(),
            old: changed.iter().map(|c| c.1.clone()).collect(),
            new: changed.into_iter().map(|c| c.2).collect(),
        });
    }
    Ok(out)
}

/// `UPDATE` of `columns` of `table` for the rows in `unnest($1 int8[] tableoid, $2 text[] ctid, then
/// per column its old and its new value as text[])`, only where every old value is still there.
fn preset_statement(plan: &Plan, table: u32, columns: &[String]) -> Statement {
    let types = &plan.catalog.tables[&table].columns;
    let mut b = SqlBuilder::new();
    b.sql("UPDATE ")
        .relation(plan.name(table), plan.partitioned(table))
        .sql(" d SET ");
    b.join(columns, ", ", |b, i, c| {
        b.ident(c)
            .sql(" = u.n")
            .int(i as i64)
            .sql("::")
            .ty(&types[c]);
    });
    b.sql(" FROM unnest($1::int8[], $2::text[]");
    for i in 0..columns.len() {
        b.sql(", $").int(3 + 2 * i as i64).sql("::text[], $");
        b.int(4 + 2 * i as i64).sql("::text[]");
    }
    b.sql(") u(toid, tid");
    for i in 0..columns.len() {
        b.sql(", o").int(i as i64).sql(", n").int(i as i64);
    }
    b.sql(") WHERE d.tableoid = u.toid::oid AND d.ctid = u.tid::tid");
    for (i, c) in columns.iter().enumerate() {
        b.sql(" AND d.")
            .ident(c)
            .sql("::text IS NOT DISTINCT FROM u.o")
            .int(i as i64);
    }
    b.build()
}

/// Applies `presets` in transactions of at most `limits.rows` rows, each under `limits`' timeouts.
/// Returns the rows updated.
///
/// # Errors
/// [`EngineError::Db`]; [`EngineError::Simulation`] when a row changed since it was simulated (the
/// job fails before its first batch and may be retried: a new simulation sees the new values).
pub async fn apply(
    target: &PgPool,
    plan: &Plan,
    presets: &[Preset],
    limits: &BatchLimits,
) -> Result<u64, EngineError> {
    let mut groups: BTreeMap<(u32, Vec<String>), Vec<&Preset>> = BTreeMap::new();
    for p in presets {
        groups
            .entry((p.table, p.columns.clone()))
            .or_default()
            .push(p);
    }
    let mut updated = 0;
    for ((table, columns), rows) in groups {
        let stmt = preset_statement(plan, table, &columns);
        for chunk in rows.chunks(usize::try_from(limits.rows.max(1)).unwrap_or(1)) {
            let mut tx = crate::db::begin(target, limits.bounds()).await?;
            let mut q = crate::db::query(stmt.as_query())
                .bind(chunk.iter().map(|p| i64::from(p.rel)).collect::<Vec<_>>())
                .bind(chunk.iter().map(|p| p.tid.clone()).collect::<Vec<_>>());
            for i in 0..columns.len() {
                q = q
                    .bind(chunk.iter().map(|p| p.old[i].clone()).collect::<Vec<_>>())
                    .bind(chunk.iter().map(|p| p.new[i].clone()).collect::<Vec<_>>());
            }
            let n = q.execute(&mut *tx).await?.rows_affected();
            if n != chunk.len() as u64 {
                return Err(EngineError::Simulation(format!(
                    "{} of {} rows of {} changed since the cascade pre-check; nothing of this \
                     chunk was updated, retry the job",
                    chunk.len() as u64 - n,
                    chunk.len(),
                    plan.name(table)
                )));
            }
            tx.commit().await?;
            updated += n;
        }
    }
    Ok(updated)
}
