//! The batch that continues inside one parent, as a key range.
//!
//! A parent with more children than a batch (an account's million audit events) is deleted over many
//! batches that each continue after the last deleted key ([`super::Cursor::Within`]). The general
//! batch ([`super::batch`]) selects those rows, materializes their `ctid`s and deletes them by TID:
//! every row is read twice and passed through several tuple stores. Inside one parent the rows of a
//! batch are exactly a key range, so this shape first finds the range's upper end (the `$2`-th key
//! after the cursor, reading keys only) and then deletes the range in one `DELETE … WHERE` whose
//! index scan deletes as it reads, as PostgreSQL's own cascade does.
//!
//! Both run as unnamed statements (`persistent(false)`), so each is planned with its actual values
//! (PostgreSQL's custom plans, docs §PREPARE "Notes"): a parent holding most of a table gets the
//! primary key's index from the cursor on, a small parent the foreign key's index. A prepared generic
//! plan would not know which parent it serves.
//!
//! Used only where [`crate::engine::Plan::range_step`] holds: children in ascending order of a
//! primary key, none kept back.

use super::super::plan::{Plan, Step};
use super::{array_values, cols, last_as_text, parent_prefix};
use crate::sql::{SqlBuilder, SqlType, Statement};

/// The referencing columns of the step's first hop, the parent's referenced types and the child's
/// key columns and types.
struct Shape<'p> {
    from_cols: &'p [String],
    parent_types: Vec<&'p SqlType>,
    key_cols: Vec<String>,
    key_types: Vec<SqlType>,
    /// The key's leading columns that are the foreign key's, left out of the cursor's comparisons
    /// (`parent_prefix`).
    lead: usize,
}

fn shape<'p>(plan: &'p Plan, step: &Step) -> Shape<'p> {
    let fk = &plan.catalog.foreign_keys[step.path[0]];
    let parent = &plan.catalog.tables[&fk.to];
    let key = plan.catalog.tables[&step.table].key_columns();
    let key_cols: Vec<String> = key.iter().map(|(c, _)| c.clone()).collect();
    Shape {
        from_cols: &fk.from_cols,
        parent_types: fk.to_cols.iter().map(|c| &parent.columns[c]).collect(),
        lead: parent_prefix(&fk.from_cols, &key_cols),
        key_cols,
        key_types: key.into_iter().map(|(_, t)| t).collect(),
    }
}

/// `tA.<fk col> = ($1)[1]::<type> AND … AND (tA.<key>) > (($1)[np+1]::<type>, …)` for table alias
/// `alias`: the parent's children after the cursor. `$1` is the cursor: parent values, then the last
/// deleted key. The key's leading foreign-key columns, if it has them, are left out of the
/// comparison (`parent_prefix`).
fn after_cursor(b: &mut SqlBuilder, s: &Shape<'_>, alias: usize) {
    b.join(s.from_cols, " AND ", |b, i, c| {
        b.col(alias, c).sql(" = ");
        array_values(b, "$1", &s.parent_types[i..=i], i);
    });
    let lead = s.lead;
    b.sql(" AND (");
    cols(b, alias, &s.key_cols[lead..]);
    b.sql(") > ");
    let key_types: Vec<&SqlType> = s.key_types.iter().collect();
    array_values(b, "$1", &key_types[lead..], s.parent_types.len() + lead);
}

/// The end of the next range: `$1` = cursor (text[]: parent values, then the last deleted key), `$2`
/// = rows (int8). Reads the keys of at most `$2` children after the cursor in key order and returns
/// `(rows int8, last_key text[])`: how many there are and the greatest (NULL when none are left).
///
/// With `jump`, the range starts at the first remaining child, read through an `OFFSET 0` fence
/// (the foreign key's index, then a sort), as [`super::batch`]'s `jump` does.
pub fn range_bound(plan: &Plan, step: &Step, jump: bool) -> Statement {
    let s = shape(plan, step);
    let knames: Vec<String> = (0..s.key_cols.len()).map(|i| format!("k{i}")).collect();
    let mut b = SqlBuilder::new();
    b.sql("WITH s AS MATERIALIZED (SELECT ");
    b.join(&s.key_cols, ", ", |b, i, c| {
        b.col(0, c).sql(" AS ").ident(&knames[i]);
    });
    b.sql(" FROM ")
        .relation(plan.name(step.table), plan.partitioned(step.table))
        .sql(" t0 WHERE ");
    after_cursor(&mut b, &s, 0);
    if jump {
        b.sql(" AND (");
        cols(&mut b, 0, &s.key_cols);
        b.sql(") >= (SELECT ");
        cols(&mut b, 1, &s.key_cols);
        b.sql(" FROM (SELECT ");
        cols(&mut b, 1, &s.key_cols);
        b.sql(" FROM ")
            .relation(plan.name(step.table), plan.partitioned(step.table))
            .sql(" t1 WHERE ");
        after_cursor(&mut b, &s, 1);
        b.sql(" OFFSET 0) t1 ORDER BY ");
        cols(&mut b, 1, &s.key_cols);
        b.sql(" LIMIT 1)");
    }
    b.sql(" ORDER BY ");
    cols(&mut b, 0, &s.key_cols);
    b.sql(" LIMIT $2) SELECT (SELECT count(*) FROM s), ");
    let out: Vec<&String> = knames.iter().collect();
    let order: Vec<(&String, bool)> = knames.iter().map(|k| (k, true)).collect();
    last_as_text(&mut b, "s", &out, &order);
    b.build()
}

/// Deletes the parent's children after the cursor up to and including a key: `$1` = cursor (as in
/// [`range_bound`]), `$2` = the range's last key (text[], [`range_bound`]'s `last_key`). The rows
/// deleted are its `rows_affected`.
pub fn range_delete(plan: &Plan, step: &Step) -> Statement {
    let s = shape(plan, step);
    let key_types: Vec<&SqlType> = s.key_types.iter().collect();
    let mut b = SqlBuilder::new();
    b.sql("DELETE FROM ")
        .relation(plan.name(step.table), plan.partitioned(step.table))
        .sql(" t0 WHERE ");
    after_cursor(&mut b, &s, 0);
    let lead = s.lead;
    b.sql(" AND (");
    cols(&mut b, 0, &s.key_cols[lead..]);
    b.sql(") <= ");
    array_values(&mut b, "$2", &key_types[lead..], lead);
    b.build()
}

/// `SELECT count(*)` of the parent's children: `$1` = the parent's values (text[]). Run by
/// `engine::range`'s read-only pass as a plain index scan of the foreign key's index.
pub fn children_count(plan: &Plan, step: &Step) -> Statement {
    let s = shape(plan, step);
    let mut b = SqlBuilder::new();
    b.sql("SELECT count(*) FROM ")
        .relation(plan.name(step.table), plan.partitioned(step.table))
        .sql(" t0 WHERE ");
    b.join(s.from_cols, " AND ", |b, i, c| {
        b.col(0, c).sql(" = ");
        array_values(b, "$1", &s.parent_types[i..=i], i);
    });
    b.build()
}
