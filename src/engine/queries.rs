//! SQL for a plan's steps, built only through [`crate::sql::SqlBuilder`].
//!
//! Parameters: `$1` is the tenant key as text, cast to the root key column's type; `$2` the batch size
//! (rows, int8); `$3` the keyset position (text[], the last deleted key, in key-column order).

use super::plan::{Plan, Step};
use crate::sql::{SqlBuilder, Statement};

/// Alias bases so nested sub-queries never shadow each other's aliases.
const STEP_BASE: usize = 0;
const REF_BASE: usize = 1000;
const MEMBER_BASE: usize = 2000;

/// `FROM <table> tB JOIN <parent> tB+1 ON ... WHERE <root predicate>` for a table and its path.
///
/// When the last hop references exactly the root's key column, the root itself is not joined: the
/// predicate is put on the referencing column (`tN."account_id" = $1::bigint`), which its index serves.
fn from_path(b: &mut SqlBuilder, plan: &Plan, table: u32, path: &[usize], base: usize) {
    let fks = &plan.catalog.foreign_keys;
    let skip_root = path
        .last()
        .is_some_and(|&h| fks[h].to == plan.root && fks[h].to_cols == [plan.key_column.clone()]);
    let joined = if skip_root {
        &path[..path.len() - 1]
    } else {
        path
    };
    b.sql(" FROM ").table(plan.name(table)).sql(" ").alias(base);
    for (i, &h) in joined.iter().enumerate() {
        let fk = &fks[h];
        b.sql(" JOIN ")
            .table(plan.name(fk.to))
            .sql(" ")
            .alias(base + i + 1)
            .sql(" ON ");
        b.join(&fk.from_cols, " AND ", |b, j, from| {
            b.col(base + i, from)
                .sql(" = ")
                .col(base + i + 1, &fk.to_cols[j]);
        });
    }
    b.sql(" WHERE ");
    if skip_root {
        let fk = &fks[*path.last().expect("skip_root implies a hop")];
        b.col(base + joined.len(), &fk.from_cols[0]);
    } else {
        b.col(base + joined.len(), &plan.key_column);
    }
    b.sql(" = $1::").ty(&plan.key_type);
}

/// The batch statement of a step: select up to `$2` tenant rows after the keyset position (`$3`, only
/// when `resume`), delete them, and return `(selected int8, deleted int8, last_key text[])`.
pub fn batch(plan: &Plan, step: &Step, resume: bool) -> Statement {
    let key = plan.catalog.tables[&step.table].key_columns();
    let mut b = SqlBuilder::new();
    b.sql("WITH batch AS (SELECT ");
    b.join(&key, ", ", |b, i, (col, _)| {
        b.col(STEP_BASE, col).sql(" AS k").int(i as i64);
    });
    from_path(&mut b, plan, step.table, &step.path, STEP_BASE);
    if resume {
        b.sql(" AND (");
        b.join(&key, ", ", |b, _, (col, _)| {
            b.col(STEP_BASE, col);
        });
        b.sql(") > (");
        b.join(&key, ", ", |b, i, (_, ty)| {
            b.sql("($3::text[])[").int(i as i64 + 1).sql("]::").ty(ty);
        });
        b.sql(")");
    }
    b.sql(" ORDER BY ");
    b.join(&key, ", ", |b, _, (col, _)| {
        b.col(STEP_BASE, col);
    });
    b.sql(" LIMIT $2), del AS (DELETE FROM ")
        .table(plan.name(step.table))
        .sql(" d USING batch WHERE ");
    b.join(&key, " AND ", |b, i, (col, _)| {
        b.sql("d.").ident(col).sql(" = batch.k").int(i as i64);
    });
    b.sql(" RETURNING 1) SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM del), (SELECT ARRAY[");
    b.join(&key, ", ", |b, i, _| {
        b.sql("k").int(i as i64).sql("::text");
    });
    b.sql("] FROM batch ORDER BY ");
    b.join(&key, ", ", |b, i, _| {
        b.sql("k").int(i as i64).sql(" DESC");
    });
    b.sql(" LIMIT 1)");
    b.build()
}

/// `SELECT count(*)` of the tenant rows of a table over all of its steps (a row reachable through two
/// parents counts once).
pub fn count_table(plan: &Plan, table: u32) -> Statement {
    let key = plan.catalog.tables[&table].key_columns();
    let steps: Vec<&Step> = plan.steps.iter().filter(|s| s.table == table).collect();
    let mut b = SqlBuilder::new();
    b.sql("SELECT count(*) FROM (");
    b.join(&steps, " UNION ", |b, _, step| {
        b.sql("SELECT ");
        b.join(&key, ", ", |b, _, (col, _)| {
            b.col(STEP_BASE, col);
        });
        from_path(b, plan, table, &step.path, STEP_BASE);
    });
    b.sql(") s");
    b.build()
}

/// Counts rows of the referencing table of blocker `fk` that reference a tenant row and are not tenant
/// rows themselves: each one would make the cascade fail. Returns `int8`.
pub fn blocker_count(plan: &Plan, fk_index: usize) -> Statement {
    let fk = &plan.catalog.foreign_keys[fk_index];
    let target_steps: Vec<&Step> = plan.steps.iter().filter(|s| s.table == fk.to).collect();
    let member_steps: Vec<&Step> = plan.steps.iter().filter(|s| s.table == fk.from).collect();
    let from_key = plan.catalog.tables[&fk.from].key_columns();
    let mut b = SqlBuilder::new();
    b.sql("SELECT count(*) FROM ")
        .table(plan.name(fk.from))
        .sql(" ")
        .alias(REF_BASE)
        .sql(" WHERE (");
    b.join(&target_steps, " OR ", |b, _, step| {
        b.sql("EXISTS (SELECT 1");
        from_path(b, plan, fk.to, &step.path, STEP_BASE);
        for (j, from) in fk.from_cols.iter().enumerate() {
            b.sql(" AND ")
                .col(STEP_BASE, &fk.to_cols[j])
                .sql(" = ")
                .col(REF_BASE, from);
        }
        b.sql(")");
    });
    b.sql(")");
    for step in member_steps {
        b.sql(" AND NOT EXISTS (SELECT 1");
        from_path(&mut b, plan, fk.from, &step.path, MEMBER_BASE);
        for (col, _) in &from_key {
            b.sql(" AND ")
                .col(MEMBER_BASE, col)
                .sql(" = ")
                .col(REF_BASE, col);
        }
        b.sql(")");
    }
    b.build()
}

/// `DELETE` of the root row: `$1` only.
pub fn delete_root(plan: &Plan) -> Statement {
    let mut b = SqlBuilder::new();
    b.sql("DELETE FROM ")
        .table(plan.name(plan.root))
        .sql(" WHERE ")
        .ident(&plan.key_column)
        .sql(" = $1::")
        .ty(&plan.key_type);
    b.build()
}
