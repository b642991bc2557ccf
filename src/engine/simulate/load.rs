//! The database side of the cascade simulation: referential triggers and `SET NULL` / `SET DEFAULT`
//! facts from `pg_catalog`, and rows read in bulk by key. Read-only; every query is its own short
//! transaction bounded by `[hard_delete]`'s timeouts ([`crate::db::begin`]).

use std::collections::{BTreeMap, HashMap};

use sqlx::PgPool;

use super::SimError;
use crate::engine::{BatchLimits, Plan};
use crate::sql::{CatalogExpr, SqlBuilder};

/// What a referential trigger does when it fires (its function, `pg_trigger.tgfoid`, defined in
/// PostgreSQL's `src/backend/utils/adt/ri_triggers.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `RI_FKey_cascade_del`: delete the referencing rows.
    Cascade,
    /// `RI_FKey_restrict_del`: fail if a referencing row exists.
    Restrict,
    /// `RI_FKey_noaction_del`: fail if a referencing row exists (at commit when deferred).
    NoAction,
    /// `RI_FKey_setnull_del`: set the referencing columns to NULL.
    SetNull,
    /// `RI_FKey_setdefault_del`: set them to their defaults, then re-check like NO ACTION.
    SetDefault,
    /// `RI_FKey_check_upd` (on the referencing table): the new key must exist.
    Check,
}

/// One referential trigger of a relation.
#[derive(Debug, Clone)]
pub(super) struct Trigger {
    /// `pg_trigger.tgname` (`RI_ConstraintTrigger_a_<oid>` / `_c_<oid>`): the firing order.
    pub name: String,
    /// Index into `Catalog::foreign_keys` of the (top-level) constraint it enforces.
    pub fk: usize,
    pub kind: Kind,
    /// `tginitdeferred`: fires at commit.
    pub deferred: bool,
}

/// A column an `ON DELETE SET NULL / SET DEFAULT` action writes.
#[derive(Debug, Clone)]
pub(super) struct SetCol {
    pub column: String,
    pub not_null: bool,
    /// The value written, as text (`None` = NULL): NULL for SET NULL, the evaluated default for SET
    /// DEFAULT.
    pub value: Option<String>,
}

/// Schema facts the simulation needs beyond [`crate::engine::catalog::Catalog`].
#[derive(Debug, Default)]
pub(super) struct Facts {
    /// Referential triggers per relation (a table or a leaf partition, by `pg_class` oid), sorted by
    /// name as PostgreSQL fires them (`RelationBuildTriggers` sorts by `strcmp` of the names).
    pub triggers: HashMap<u32, Vec<Trigger>>,
    /// Per foreign key (by index): the columns its SET NULL / SET DEFAULT action writes
    /// (`confdelsetcols`, PostgreSQL 15+, else all referencing columns); empty for other actions.
    pub set_cols: Vec<Vec<SetCol>>,
}

async fn begin<'c>(
    pool: &'c PgPool,
    limits: &BatchLimits,
) -> Result<sqlx::Transaction<'c, sqlx::Postgres>, sqlx::Error> {
    crate::db::begin(pool, limits.bounds()).await
}

/// Reads the referential triggers and the SET NULL / SET DEFAULT columns of every foreign key of the
/// plan. Three catalog queries, plus one per SET DEFAULT column to evaluate its default.
///
/// # Errors
/// Database errors; [`SimError::Unsupported`] for a SET DEFAULT column whose default calls a volatile
/// function (its value at the cascade cannot be known in advance).
pub(super) async fn facts(
    pool: &PgPool,
    plan: &Plan,
    limits: &BatchLimits,
) -> Result<Facts, SimError> {
    let fks = &plan.catalog.foreign_keys;
    let index: HashMap<(u32, &str), usize> = fks
        .iter()
        .enumerate()
        .map(|(i, fk)| ((fk.from, fk.name.as_str()), i))
        .collect();
    let mut tx = begin(pool, limits).await?;
    // Clones of a constraint on partitions (conparentid) map to their top-level constraint.
    let triggers: Vec<(i64, String, i64, String, String, bool)> = crate::db::query_as(
        "WITH RECURSIVE con AS ( \
           SELECT oid, oid AS top FROM pg_constraint WHERE contype = 'f' AND conparentid = 0 \
           UNION ALL SELECT c.oid, con.top FROM pg_constraint c JOIN con ON c.conparentid = con.oid) \
         SELECT t.tgrelid::int8, t.tgname::text, top.conrelid::int8, top.conname::text, p.proname::text, \
                t.tginitdeferred \
         FROM pg_trigger t JOIN con ON con.oid = t.tgconstraint JOIN pg_constraint top ON top.oid = con.top \
           JOIN pg_proc p ON p.oid = t.tgfoid \
         WHERE t.tgenabled IN ('O', 'A') AND p.proname IN ('RI_FKey_cascade_del', 'RI_FKey_restrict_del', \
           'RI_FKey_noaction_del', 'RI_FKey_setnull_del', 'RI_FKey_setdefault_del', 'RI_FKey_check_upd')",
    )
    .fetch_all(&mut *tx)
    .await?;
    let set_cols: Vec<(i64, String, Vec<String>)> = crate::db::query_as(
        "SELECT c.conrelid::int8, c.conname::text, \
           ARRAY(SELECT a.attname::text FROM unnest(CASE WHEN cardinality(c.confdelsetcols) > 0 \
                   THEN c.confdelsetcols ELSE c.conkey END) k(n) \
                 JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY a.attnum) \
         FROM pg_constraint c WHERE c.contype = 'f' AND c.conparentid = 0 AND c.confdeltype IN ('n', 'd')",
    )
    .fetch_all(&mut *tx)
    .await?;
    // NOT NULL and defaults of the referencing tables' columns; `volatile` when the default's node
    // tree calls a volatile function (`nextval`, `random`, ...).
    let from_tables: Vec<i64> = fks.iter().map(|fk| i64::from(fk.from)).collect();
    let columns: Vec<(i64, String, bool, Option<String>, bool)> = crate::db::query_as(
        "SELECT a.attrelid::int8, a.attname::text, a.attnotnull, pg_get_expr(d.adbin, d.adrelid), \
           coalesce(EXISTS (SELECT 1 FROM regexp_matches(d.adbin::text, ':(?:op)?funcid (\\d+)', 'g') m \
             JOIN pg_proc p ON p.oid = m[1]::oid WHERE p.provolatile = 'v'), false) \
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
         WHERE a.attrelid::int8 = ANY ($1::int8[]) AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(&from_tables)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;

    let mut facts = Facts {
        set_cols: vec![Vec::new(); fks.len()],
        ..Facts::default()
    };
    for (rel, name, from, con, proname, deferred) in triggers {
        let Some(&fk) = index.get(&(from as u32, con.as_str())) else {
            continue;
        };
        let kind = match proname.as_str() {
            "RI_FKey_cascade_del" => Kind::Cascade,
            "RI_FKey_restrict_del" => Kind::Restrict,
            "RI_FKey_noaction_del" => Kind::NoAction,
            "RI_FKey_setnull_del" => Kind::SetNull,
            "RI_FKey_setdefault_del" => Kind::SetDefault,
            _ => Kind::Check,
        };
        facts.triggers.entry(rel as u32).or_default().push(Trigger {
            name,
            fk,
            kind,
            deferred,
        });
    }
    for list in facts.triggers.values_mut() {
        list.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    }
    let columns: BTreeMap<(u32, String), (bool, Option<String>, bool)> = columns
        .into_iter()
        .map(|(rel, col, nn, def, vol)| ((rel as u32, col), (nn, def, vol)))
        .collect();
    for (from, con, cols) in set_cols {
        let Some(&i) = index.get(&(from as u32, con.as_str())) else {
            continue;
        };
        let fk = &fks[i];
        let set_default = fk.on_delete == crate::engine::catalog::OnDelete::SetDefault;
        for column in cols {
            let (not_null, default, volatile) = columns
                .get(&(fk.from, column.clone()))
                .cloned()
                .unwrap_or((false, None, false));
            let value = match default {
                Some(expr) if set_default => {
                    if volatile {
                        return Err(SimError::Unsupported(format!(
                            "column {:?} of {} (ON DELETE SET DEFAULT of {:?}) has a volatile default",
                            column,
                            plan.name(fk.from),
                            fk.name
                        )));
                    }
                    let ty = &plan.catalog.tables[&fk.from].columns[&column];
                    let mut b = SqlBuilder::new();
                    b.sql("SELECT (")
                        .expr(&CatalogExpr::from_catalog(expr))
                        .sql("::")
                        .ty(ty)
                        .sql(")::text");
                    let mut tx = begin(pool, limits).await?;
                    let v: Option<String> = crate::db::query_scalar(b.build().as_query())
                        .fetch_one(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    v
                }
                _ => None,
            };
            facts.set_cols[i].push(SetCol {
                column,
                not_null,
                value,
            });
        }
    }
    Ok(facts)
}

/// One row read: `(tableoid, ctid as text, tracked column values as text)`.
pub(super) type Loaded = (i64, String, Vec<Option<String>>);

/// Most keys bound to one query.
const KEYS_PER_QUERY: usize = 5000;

/// Reads the rows of `table` whose columns `by` equal one of `keys` (each a value per column, as
/// text, cast to the column's type), returning the `tracked` columns as text. `FROM ONLY` unless the
/// table is partitioned, as the referential triggers query (`ri_triggers.c`).
///
/// # Errors
/// Database errors.
pub(super) async fn rows(
    pool: &PgPool,
    plan: &Plan,
    limits: &BatchLimits,
    table: u32,
    by: &[String],
    keys: &[Vec<String>],
    tracked: &[String],
) -> Result<Vec<Loaded>, SimError> {
    let t = &plan.catalog.tables[&table];
    let mut b = SqlBuilder::new();
    b.sql("SELECT t0.tableoid::int8, t0.ctid::text, ARRAY[");
    b.join(tracked, ", ", |b, _, c| {
        b.col(0, c).sql("::text");
    });
    b.sql("]::text[] FROM ");
    if !t.partitioned {
        b.sql("ONLY ");
    }
    b.table(&t.name).sql(" t0 JOIN unnest(");
    b.join(by, ", ", |b, i, _| {
        b.param(i + 1).sql("::text[]");
    });
    b.sql(") AS t1(");
    b.join(by, ", ", |b, i, _| {
        b.sql("k").int(i as i64);
    });
    b.sql(") ON ");
    b.join(by, " AND ", |b, i, c| {
        b.col(0, c)
            .sql(" = t1.k")
            .int(i as i64)
            .sql("::")
            .ty(&t.columns[c]);
    });
    let stmt = b.build();
    let mut out = Vec::new();
    for chunk in keys.chunks(KEYS_PER_QUERY) {
        let mut q = crate::db::query_as::<Loaded>(stmt.as_query());
        for i in 0..by.len() {
            let column: Vec<&str> = chunk.iter().map(|k| k[i].as_str()).collect();
            q = q.bind(column);
        }
        let mut tx = begin(pool, limits).await?;
        out.extend(q.fetch_all(&mut *tx).await?);
        tx.commit().await?;
    }
    Ok(out)
}
