//! The planner's estimate of a tenant's size, read from the column statistics `ANALYZE` keeps:
//! whether a cascade can fit a transaction's bound at all is known before trying it.
//!
//! For each cascading foreign key straight to the root's key column, the rows of the referencing
//! table holding the tenant's key, estimated as PostgreSQL's planner estimates `col = const`
//! (`src/backend/utils/adt/selfuncs.c`, `var_eq_const`; PostgreSQL docs §14.2 "Statistics Used by
//! the Planner" and §76.1 "Row Estimation Examples"): the value's frequency in `most_common_vals`
//! times `pg_class.reltuples`, else the frequency left over by the most common values and NULLs
//! shared evenly among the other distinct values. Tables never analyzed, partitioned tables and
//! keys of several columns count nothing, so the sum is a lower bound of the tenant's rows beyond
//! what statistics cannot see, and a tenant grown since the last `ANALYZE` is underestimated.
//! Where an upper bound is needed ([`DirectRows::at_most`]), every row written to the table since
//! its statistics were taken counts as the tenant's.

use std::collections::BTreeMap;

use sqlx::PgPool;

use super::{BatchLimits, EngineError, Plan};

/// Rows per millisecond no cascading `DELETE` is taken to exceed (2 million rows/s): with the
/// estimate, a bound in milliseconds is known to be too short when `estimate ≥ bound_ms × this`.
pub const MAX_CASCADE_ROWS_PER_MS: f64 = 2_000.0;

/// The tenant's rows in one table straight under the root, by the statistics
/// ([`tenant_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectRows {
    /// The planner's estimate (see the module docs), rounded up.
    pub estimate: i64,
    /// Rows inserted, updated or deleted in the table since its statistics were taken
    /// (`n_mod_since_analyze`, PostgreSQL docs §28.2.18 "pg_stat_all_tables"): a tenant may have
    /// gained as many since.
    pub written_since: i64,
}

impl DirectRows {
    /// The most rows the tenant can hold in the table by these figures: the estimate and every
    /// row written since.
    pub fn at_most(&self) -> i64 {
        self.estimate.saturating_add(self.written_since)
    }
}

/// Per table of the closure with a cascading foreign key straight to the root's key column (oid),
/// the rows holding `tenant` by the planner's statistics (see the module docs), and the rows
/// written to the table since; a table with two such keys counts both. Tables without statistics
/// are left out: their rows are unknown, not none. What [`Plan::absorb_tenant`] weighs (as
/// [`DirectRows::at_most`]). One catalog query in its own transaction under `limits`.
///
/// # Errors
/// Database errors.
pub async fn tenant_rows(
    target: &PgPool,
    plan: &Plan,
    tenant: &str,
    limits: &BatchLimits,
) -> Result<BTreeMap<u32, DirectRows>, EngineError> {
    let mut keys = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for fk in plan.catalog.foreign_keys.iter().filter(|fk| {
        plan.keys_the_tenant(fk)
            && fk.from != plan.root
            && plan.closure.contains(&fk.from)
            && !plan.catalog.tables[&fk.from].partitioned
    }) {
        let name = plan.name(fk.from);
        keys.0.push(i64::from(fk.from));
        keys.1.push(name.schema.clone());
        keys.2.push(name.name.clone());
        keys.3.push(fk.from_cols[0].clone());
    }
    if keys.0.is_empty() {
        return Ok(BTreeMap::new());
    }
    // `pg_stats` is a view over every column's statistics: the names are also given as a
    // constant array, which PostgreSQL applies inside the view before it builds its rows.
    let mut tx = crate::db::begin(target, limits.bounds()).await?;
    let rows: Vec<(i64, f64, i64)> = crate::db::query_as(
        "SELECT s.rel, sum(greatest(c.reltuples, 0) * CASE \
             WHEN array_position(s.vals, $5) IS NOT NULL THEN s.freqs[array_position(s.vals, $5)] \
             ELSE greatest(1 - s.null_frac - coalesce((SELECT sum(f) FROM unnest(s.freqs) f), 0), 0) \
               / greatest(CASE WHEN s.n_distinct >= 0 THEN s.n_distinct \
                               ELSE -s.n_distinct * greatest(c.reltuples, 0) END \
                          - coalesce(cardinality(s.freqs), 0), 1) \
           END)::float8, \
                max(coalesce(pg_stat_get_mod_since_analyze(s.rel::oid), 0))::int8 \
         FROM (SELECT w.rel, st.null_frac, st.n_distinct, st.most_common_vals::text::text[] AS vals, \
                      st.most_common_freqs AS freqs \
               FROM pg_stats st \
                 JOIN unnest($1::int8[], $2::text[], $3::text[], $4::text[]) AS w(rel, sch, tab, col) \
                   ON (st.schemaname, st.tablename, st.attname) = (w.sch, w.tab, w.col) \
               WHERE st.tablename = ANY($3::text[]) AND st.attname = ANY($4::text[]) \
                 AND NOT st.inherited) s \
           JOIN pg_class c ON c.oid = s.rel::oid \
         GROUP BY s.rel",
    )
    .bind(&keys.0)
    .bind(&keys.1)
    .bind(&keys.2)
    .bind(&keys.3)
    .bind(tenant)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows
        .into_iter()
        .filter_map(|(rel, n, written)| {
            let rows = DirectRows {
                estimate: n.max(0.0).ceil() as i64,
                written_since: written.max(0),
            };
            Some((u32::try_from(rel).ok()?, rows))
        })
        .collect())
}

/// The tenant's most rows per table straight under the root ([`DirectRows::at_most`] of
/// [`tenant_rows`]) for [`Plan::absorb_tenant`] under the allowance `cascade_rows`; none without
/// one (0: nothing is absorbed, and nothing is read).
///
/// # Errors
/// Database errors.
pub async fn absorbable_rows(
    target: &PgPool,
    plan: &Plan,
    tenant: &str,
    limits: &BatchLimits,
    cascade_rows: u32,
) -> Result<BTreeMap<u32, i64>, EngineError> {
    if cascade_rows == 0 {
        return Ok(BTreeMap::new());
    }
    Ok(at_most(&tenant_rows(target, plan, tenant, limits).await?))
}

/// [`DirectRows::at_most`] per table.
pub fn at_most(rows: &BTreeMap<u32, DirectRows>) -> BTreeMap<u32, i64> {
    rows.iter().map(|(&t, r)| (t, r.at_most())).collect()
}
