//! The batch of a step whose foreign key to its parent has no index: a range of the table's
//! blocks.
//!
//! Without an index on the referencing columns, PostgreSQL finds a parent's children by scanning
//! the whole child table. The general batch ([`super::batch`]) reads its parents' children one
//! parent at a time, so every batch scans the table once per parent it takes, and the parents'
//! own deletes later scan it again (their referential triggers, as in the cascade). Here a batch
//! reads a range of the table's blocks instead — a TID range scan (`ctid >= '(lo,0)' AND ctid <
//! '(hi,0)'`, PostgreSQL 14+, docs §"TID Range Scan") — and deletes, as it reads, the rows of that
//! range whose key references a tenant parent. The step's batches pass over the table once,
//! whatever the number of parents; the worker sizes the range by time as it sizes rows.
//!
//! A row written or moved behind the range after it was read is not deleted by the step; it is
//! deleted with its parent by PostgreSQL's cascade (every hop of a step's path is `ON DELETE
//! CASCADE`), as a row the general batch missed would be.
//!
//! Used only where [`crate::engine::Plan::block_step`] holds.

use super::super::plan::{Plan, Step};
use super::{Cursor, parents_after, pinned_column};
use crate::sql::{SqlBuilder, Statement};

/// The block-range batch of `step`: a `DELETE` whose command tag counts the rows it deleted.
/// `$1` = tenant key, `$2` = first block (int8), `$3` = block after the last (int8).
///
/// No `RETURNING`: returning even a constant makes PostgreSQL fetch each deleted row once more
/// (`ExecDelete` reads the old tuple for the projection), which doubles the buffer reads of a
/// table whose rows fire no trigger. The caller reads the table's size apart ([`table_blocks`]).
pub fn block_batch(plan: &Plan, step: &Step) -> Statement {
    let (&first, rest) = step.path.split_first().expect("a block step has a parent");
    let fk = &plan.catalog.foreign_keys[first];
    let mut b = SqlBuilder::new();
    if let Some(column) = pinned_column(plan, &step.path) {
        // The parent is the tenant's root row, by its key: a row is the tenant's when its key
        // equals the tenant key, as the general batch's parent read takes it (`from_path`). A
        // plain filter on the range's rows, where a semi-join with a one-row parent set would
        // hash every row of the range.
        b.sql("DELETE FROM ");
        range(&mut b, plan, step);
        b.sql(" AND ")
            .col(0, column)
            .sql(" = $1::")
            .ty(&plan.key_type);
        return b.build();
    }
    let parent = &plan.catalog.tables[&fk.to];
    let parent_types: Vec<&crate::sql::SqlType> =
        fk.to_cols.iter().map(|c| &parent.columns[c]).collect();
    b.sql("WITH par AS MATERIALIZED (SELECT ");
    b.join(&fk.to_cols, ", ", |b, i, c| {
        b.col(1, c).sql(" AS p").int(i as i64);
    });
    parents_after(&mut b, plan, fk, rest, 1, &Cursor::Start, &parent_types);
    b.sql(") DELETE FROM ");
    range(&mut b, plan, step);
    b.sql(" AND EXISTS (SELECT 1 FROM par WHERE ");
    b.join(&fk.from_cols, " AND ", |b, i, c| {
        b.sql("par.p").int(i as i64).sql(" = ").col(0, c);
    });
    b.sql(")");
    b.build()
}

/// `<table> t0 WHERE <t0 in the blocks $2 up to $3>`: the rows of `step`'s table in the range.
fn range(b: &mut SqlBuilder, plan: &Plan, step: &Step) {
    b.relation(plan.name(step.table), false)
        .sql(" t0 WHERE t0.ctid >= ('(' || $2::int8 || ',0)')::tid")
        .sql(" AND t0.ctid < ('(' || $3::int8 || ',0)')::tid");
}

/// `SELECT` the size of table `$1` (an oid, int8) in blocks (`pg_relation_size` ÷ `block_size`):
/// where a block-range step ends. Ends in its select list.
pub fn table_blocks() -> Statement {
    let mut b = SqlBuilder::new();
    b.sql("SELECT pg_relation_size(")
        .param(1)
        .sql("::int8::oid) / current_setting('block_size')::int8");
    b.build()
}
