//! SQL for a plan's steps, built only through [`crate::sql::SqlBuilder`].
//!
//! Parameters: `$1` is the tenant key as text, cast to the root key column's type; `$2` the batch size
//! (rows, int8); `$3` the keyset position (text[], the last deleted key, in key-column order).

use super::plan::{Plan, Step};
use crate::sql::{SqlBuilder, Statement};

mod block_sql;
mod range_sql;
pub use block_sql::{block_batch, table_blocks};
pub use range_sql::{children_count, range_bound, range_delete};

/// Alias bases so nested sub-queries never shadow each other's aliases.
const STEP_BASE: usize = 0;
const REF_BASE: usize = 1000;
const MEMBER_BASE: usize = 2000;
const HELD_BASE: usize = 3000;
const JUMP_BASE: usize = 4000;

/// `FROM <table> tB JOIN <parent> tB+1 ON ... WHERE <root predicate>` for a table and its path.
///
/// When the last hop references exactly the root's key column, the root itself is not joined: the
/// predicate is put on the referencing column (`tN."account_id" = $1::bigint`), which its index serves.
fn from_path(b: &mut SqlBuilder, plan: &Plan, table: u32, path: &[usize], base: usize) {
    let fks = &plan.catalog.foreign_keys;
    let skip_root = path.last().is_some_and(|&h| to_root_key(plan, h));
    let joined = if skip_root {
        &path[..path.len() - 1]
    } else {
        path
    };
    b.sql(" FROM ")
        .relation(plan.name(table), plan.partitioned(table))
        .sql(" ")
        .alias(base);
    for (i, &h) in joined.iter().enumerate() {
        let fk = &fks[h];
        b.sql(" JOIN ")
            .relation(plan.name(fk.to), plan.partitioned(fk.to))
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

/// Whether foreign key `fk` (an index into the catalog's) references exactly the root's key column:
/// its referencing column then holds the tenant key itself.
fn to_root_key(plan: &Plan, fk: usize) -> bool {
    let fk = &plan.catalog.foreign_keys[fk];
    fk.to == plan.root && fk.to_cols == [plan.key_column.clone()]
}

/// The column of `path`'s first table that [`from_path`] sets equal to the tenant key (`$1`), when
/// it is on that table: the root's key column (an empty path: the table is the root), or the
/// referencing column of a single hop straight to it.
fn pinned_column<'p>(plan: &'p Plan, path: &[usize]) -> Option<&'p String> {
    match path {
        [] => Some(&plan.key_column),
        [h] => to_root_key(plan, *h).then(|| &plan.catalog.foreign_keys[*h].from_cols[0]),
        _ => None,
    }
}

/// Where a step's batches resume (see [`batch`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Cursor {
    /// Nothing deleted in this step yet.
    Start,
    /// Every child of parents up to and including this parent key is gone.
    AfterParent(Vec<String>),
    /// Children of this parent (first values) are gone up to this child key (last values).
    Within(Vec<String>, Vec<String>),
    /// A block-range step ([`block_batch`]) has read the table's blocks before this one.
    Block(i64),
}

/// `a, b, c` for columns of alias `alias`.
fn cols(b: &mut SqlBuilder, alias: usize, columns: &[String]) {
    b.join(columns, ", ", |b, _, c| {
        b.col(alias, c);
    });
}

/// `a DESC, b DESC` (or ascending) for columns of alias `alias`.
fn cols_ordered(b: &mut SqlBuilder, alias: usize, columns: &[String], desc: bool) {
    b.join(columns, ", ", |b, _, c| {
        b.col(alias, c).sql(if desc { " DESC" } else { "" });
    });
}

/// How many leading columns of a child's key `key_cols` a cursor inside one parent leaves out: all
/// of the foreign key's columns `from_cols` when the key starts with them, in order, and has more;
/// else none. Inside one parent those columns equal the parent's values, in the rows and in the
/// cursor alike, so there `(fk, id) > (p, v)` is `id > v`. The shorter form is what lets the
/// B-tree scan start at the cursor: beside `fk = p`, a row comparison that leads with `fk` is
/// checked on every entry of the parent from its first (the scan is positioned by the equality),
/// the dead entries of earlier batches included, so each batch would cost more than the last.
pub(super) fn parent_prefix(from_cols: &[String], key_cols: &[String]) -> usize {
    if key_cols.len() > from_cols.len() && key_cols.starts_with(from_cols) {
        from_cols.len()
    } else {
        0
    }
}

/// `(($3::text[])[from+1]::t1, ...)`: values of the cursor array, cast to the key's types.
fn cursor_values(b: &mut SqlBuilder, types: &[&crate::sql::SqlType], from: usize) {
    array_values(b, "$3", types, from);
}

/// `((<param>::text[])[from+1]::t1, ...)`: values of a text array parameter cast to `types`.
fn array_values(
    b: &mut SqlBuilder,
    param: &'static str,
    types: &[&crate::sql::SqlType],
    from: usize,
) {
    b.sql("(");
    b.join(types, ", ", |b, i, ty| {
        b.sql("(")
            .sql(param)
            .sql("::text[])[")
            .int((from + i + 1) as i64)
            .sql("]::")
            .ty(ty);
    });
    b.sql(")");
}

/// The child-side select of [`batch`]: ctid, tableoid and key of `T` rows referencing the parent
/// values given by `parent` (a closure rendering the i-th parent value), in key order, at most `$2`.
fn children(
    b: &mut SqlBuilder,
    plan: &Plan,
    step: &Step,
    fk_index: usize,
    key_cols: &[String],
    parent: &dyn Fn(&mut SqlBuilder, usize),
) {
    let fk = &plan.catalog.foreign_keys[fk_index];
    b.sql("SELECT t0.ctid AS tid, t0.tableoid AS toid");
    b.join(key_cols, "", |b, i, c| {
        b.sql(", ").col(0, c).sql(" AS k").int(i as i64);
    });
    b.sql(" FROM ")
        .relation(plan.name(step.table), plan.partitioned(step.table))
        .sql(" t0 WHERE ");
    b.join(&fk.from_cols, " AND ", |b, i, c| {
        b.col(0, c).sql(" = ");
        parent(b, i);
    });
}

/// The batch statement of a step, driven by the step's direct parent.
///
/// Tenant rows of a table are the rows referencing tenant rows of its parent (the first hop of the
/// step's path). A batch continues the children of the cursor's parent after the cursor's child key,
/// then takes the next `$4` parents (in the order of the referenced columns) and their children in
/// key order, and keeps the first `$2` rows in (parent, key) order. They are deleted by `ctid`, a TID
/// scan whatever the table's size. Every batch starts where the last one ended, so no batch re-reads
/// the rows or dead tuples of earlier batches. Returns `(selected int8, deleted int8, parents int8,
/// parents_used int8, last_parent text[], last_row text[])`: `parents` read — one more than `$4` when
/// another parent follows those the batch took — `parents_used` among them with rows in the batch,
/// and `last_row` = parent values then child key of the last selected row.
///
/// In a table with a cascading reference to itself (a tree), children are taken in *descending* key
/// order: rows are usually created after their parents, so the leaves of the tree go first and
/// PostgreSQL's cascade has no subtrees left to remove under a batch.
///
/// In a table without a primary key (keyed by `ctid`), and under parents other than the root row
/// in a table whose key does not lead with the foreign key's columns but an index on them exists,
/// a parent's children are taken in the order that index gives, from the start each time: ordered
/// by the key inside each parent, PostgreSQL may instead walk the key's own index in key order and
/// filter the foreign key row by row, all of the index for a parent with no children.
///
/// With `jump`, the batch first reads where its rows begin: the first remaining parent, and each
/// parent's first remaining child, each found through an `OFFSET 0` fence that keeps PostgreSQL off
/// the key's index (see `first_child`). A tenant whose rows sit behind many rows of other tenants
/// in key order (a small tenant created after a large one) otherwise makes `ORDER BY key LIMIT n`
/// walk the key's index through the other tenants' rows, planned so because the planner assumes the
/// tenant's rows are spread evenly. The fenced read costs the parent's remaining rows, so the worker
/// asks for it only after a batch was cut short by its time bound.
///
/// The root step (empty path) has no parent: it deletes the root row by its key.
pub fn batch(plan: &Plan, step: &Step, cursor: &Cursor, jump: bool) -> Statement {
    let Some((&first, rest)) = step.path.split_first() else {
        return root_batch(plan, step);
    };
    let shape = BatchShape::new(plan, step, first);
    let mut b = SqlBuilder::new();
    // The next parents after the cursor's.
    b.sql(if shape.held.is_empty() {
        "WITH "
    } else {
        "WITH RECURSIVE "
    });
    shape.parents(&mut b, rest, cursor, jump);
    b.sql(", batch AS (");
    if let Cursor::Within(..) = cursor {
        shape.cursor_parent_rest(&mut b, jump);
        b.sql(" UNION ALL ");
    }
    shape.next_parents_children(&mut b, jump);
    if !shape.held.is_empty() {
        // In a table that is also a tree, a row kept back must not go by its parent's cascade
        // either: its CASCADE references to itself keep rows back too (a parent goes once its
        // children are gone, as the held passes and the sweep then allow).
        kept(&mut b, plan, step.table, &plan.self_refs(step.table));
    }
    shape.delete_and_count(&mut b);
    b.build()
}

/// The root step's batch: the root row by its key.
fn root_batch(plan: &Plan, step: &Step) -> Statement {
    let mut b = SqlBuilder::new();
    b.sql("WITH del AS (DELETE FROM ")
        .relation(plan.name(step.table), plan.partitioned(step.table))
        .sql(" t0 WHERE ");
    b.col(0, &plan.key_column).sql(" = $1::").ty(&plan.key_type);
    b.sql(" RETURNING 1) SELECT (SELECT count(*) FROM del), (SELECT count(*) FROM del), 0::int8, 0::int8, NULL::text[], NULL::text[]");
    b.build()
}

/// What [`batch`]'s statement is built from: the step's first foreign key, its parent and child
/// tables, the names of the parent values (`p0`, …) and child keys (`k0`, …) a batch row carries,
/// and the children's order.
struct BatchShape<'p> {
    plan: &'p Plan,
    step: &'p Step,
    /// The step's first foreign key (index into the catalog's foreign keys).
    first: usize,
    fk: &'p super::catalog::ForeignKey,
    child: &'p super::catalog::Table,
    key_cols: Vec<String>,
    parent_types: Vec<&'p crate::sql::SqlType>,
    key_types: Vec<crate::sql::SqlType>,
    pnames: Vec<String>,
    knames: Vec<String>,
    /// Self-references of the table through other actions than CASCADE, whose referenced rows a
    /// batch keeps back.
    held: Vec<usize>,
    /// Children in descending key order: trees go leaves first, and so do tables with held
    /// self-references.
    desc: bool,
    /// Children of a parent taken in the order an index on the foreign key gives, with no
    /// position inside the parent ([`Plan::unordered_children`]). Every row a batch selects is deleted
    /// (nothing is kept back: no tree, no held reference), so the rest of a parent's children are
    /// exactly those still there.
    unordered: bool,
}

impl<'p> BatchShape<'p> {
    fn new(plan: &'p Plan, step: &'p Step, first: usize) -> Self {
        let fk = &plan.catalog.foreign_keys[first];
        let parent = &plan.catalog.tables[&fk.to];
        let child = &plan.catalog.tables[&step.table];
        let key = child.key_columns();
        let held = plan.held_self_refs(step.table);
        let desc = plan.is_tree(step.table) || !held.is_empty();
        Self {
            plan,
            step,
            first,
            fk,
            child,
            key_cols: key.iter().map(|(c, _)| c.clone()).collect(),
            parent_types: fk.to_cols.iter().map(|c| &parent.columns[c]).collect(),
            knames: (0..key.len()).map(|i| format!("k{i}")).collect(),
            key_types: key.into_iter().map(|(_, t)| t).collect(),
            pnames: (0..fk.to_cols.len()).map(|i| format!("p{i}")).collect(),
            unordered: plan.unordered_children(step),
            held,
            desc,
        }
    }

    /// (name, descending) of the batch's order: parents ascending, children in the step's
    /// direction.
    fn directed(&self) -> Vec<(&String, bool)> {
        self.pnames
            .iter()
            .map(|p| (p, false))
            .chain(self.knames.iter().map(|k| (k, self.desc)))
            .collect()
    }

    /// `par`: the next `$4` parents after the cursor's (with `jump`, from the first remaining
    /// one, read apart so the ordered scan starts there), taken from `ahead`, which reads one
    /// parent more: whether another parent follows, so that a batch that is not full and has one
    /// knows the step ends with it, with no batch after it only to find no parent.
    fn parents(&self, b: &mut SqlBuilder, rest: &[usize], cursor: &Cursor, jump: bool) {
        let (plan, fk) = (self.plan, self.fk);
        b.sql("ahead AS MATERIALIZED (SELECT ");
        b.join(&fk.to_cols, ", ", |b, i, c| {
            b.col(1, c).sql(" AS p").int(i as i64);
        });
        parents_after(b, plan, fk, rest, 1, cursor, &self.parent_types);
        if jump {
            b.sql(" AND (");
            cols(b, 1, &fk.to_cols);
            b.sql(") >= (SELECT ");
            cols(b, JUMP_BASE + 1, &fk.to_cols);
            b.sql(" FROM (SELECT ");
            cols(b, JUMP_BASE + 1, &fk.to_cols);
            parents_after(b, plan, fk, rest, JUMP_BASE + 1, cursor, &self.parent_types);
            b.sql(" OFFSET 0) ").alias(JUMP_BASE + 1).sql(" ORDER BY ");
            cols(b, JUMP_BASE + 1, &fk.to_cols);
            b.sql(" LIMIT 1)");
        }
        b.sql(" ORDER BY ");
        cols(b, 1, &fk.to_cols);
        b.sql(" LIMIT $4 + 1), par AS MATERIALIZED (SELECT * FROM ahead ORDER BY ");
        b.join(&self.pnames, ", ", |b, _, p| {
            b.ident(p);
        });
        b.sql(" LIMIT $4)");
    }

    /// The rest of the cursor parent's children (the parent's values from `$3`), after the
    /// cursor's child key (`$3` too).
    fn cursor_parent_rest(&self, b: &mut SqlBuilder, jump: bool) {
        let parent_types = &self.parent_types;
        b.sql("(SELECT ");
        b.join(&self.pnames, ", ", |b, i, p| {
            b.sql("($3::text[])[")
                .int(i as i64 + 1)
                .sql("]::")
                .ty(parent_types[i])
                .sql(" AS ")
                .ident(p);
        });
        b.sql(", c.* FROM (");
        // The cursor's parent: its i-th value from `$3`.
        let cursor_parent = |b: &mut SqlBuilder, i: usize| {
            b.sql("($3::text[])[")
                .int(i as i64 + 1)
                .sql("]::")
                .ty(parent_types[i]);
        };
        let (plan, step, first) = (self.plan, self.step, self.first);
        children(b, plan, step, first, &self.key_cols, &cursor_parent);
        if !self.unordered {
            let lead = parent_prefix(&self.fk.from_cols, &self.key_cols);
            b.sql(" AND (");
            cols(b, 0, &self.key_cols[lead..]);
            b.sql(if self.desc { ") < " } else { ") > " });
            let key_types: Vec<&crate::sql::SqlType> = self.key_types.iter().collect();
            cursor_values(b, &key_types[lead..], self.pnames.len() + lead);
            if jump {
                first_child(
                    b,
                    plan,
                    step,
                    first,
                    &self.key_cols,
                    self.desc,
                    &cursor_parent,
                    Some((&key_types, self.pnames.len())),
                );
            }
            b.sql(" ORDER BY ");
            cols_ordered(b, 0, &self.key_cols, self.desc);
        }
        b.sql(" LIMIT $2) c)");
    }

    /// The children of each parent of `par` (at most `$2` each, in key order), then the first `$2`
    /// of them all in (parent, key) order: the batch.
    fn next_parents_children(&self, b: &mut SqlBuilder, jump: bool) {
        let (plan, step, first) = (self.plan, self.step, self.first);
        b.sql("(SELECT ");
        b.join(&self.pnames, ", ", |b, _, p| {
            b.sql("par.").ident(p);
        });
        b.sql(", c.* FROM par CROSS JOIN LATERAL (");
        // The lateral parent: its i-th value from `par`.
        let par_parent = |b: &mut SqlBuilder, i: usize| {
            b.sql("par.").ident(&self.pnames[i]);
        };
        children(b, plan, step, first, &self.key_cols, &par_parent);
        if !self.unordered {
            if jump {
                first_child(
                    b,
                    plan,
                    step,
                    first,
                    &self.key_cols,
                    self.desc,
                    &par_parent,
                    None,
                );
            }
            b.sql(" ORDER BY ");
            cols_ordered(b, 0, &self.key_cols, self.desc);
        }
        b.sql(" LIMIT $2) c) ORDER BY ");
        b.join(&self.directed(), ", ", |b, _, (c, d)| {
            b.ident(c).sql(if *d { " DESC" } else { "" });
        });
        b.sql(" LIMIT $2)");
    }

    /// `del`: the batch's rows deleted by `ctid` (but those kept back), then the statement's
    /// result row: rows selected, deleted, parents read (with the one ahead), parents used, the
    /// last parent and the last selected row as text.
    fn delete_and_count(&self, b: &mut SqlBuilder) {
        let (plan, step) = (self.plan, self.step);
        b.sql(", del AS (DELETE FROM ")
            .relation(plan.name(step.table), plan.partitioned(step.table))
            .sql(" d ");
        if self.child.partitioned {
            b.sql("USING batch WHERE d.tableoid = batch.toid AND d.ctid = batch.tid");
        } else {
            b.sql("WHERE d.ctid = ANY (ARRAY(SELECT tid FROM batch))");
        }
        if !self.held.is_empty() {
            b.sql(" AND NOT EXISTS (SELECT 1 FROM kept WHERE kept.tid = d.ctid AND kept.toid = d.tableoid)");
        }
        b.sql(" RETURNING 1) SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM del), (SELECT count(*) FROM ahead), ");
        b.sql("(SELECT count(*) FROM (SELECT DISTINCT ");
        b.join(&self.pnames, ", ", |b, _, p| {
            b.ident(p);
        });
        b.sql(" FROM batch) u), (SELECT ARRAY[");
        b.join(&self.pnames, ", ", |b, _, p| {
            b.ident(p).sql("::text");
        });
        b.sql("] FROM par ORDER BY ");
        b.join(&self.pnames, ", ", |b, _, p| {
            b.ident(p).sql(" DESC");
        });
        b.sql(" LIMIT 1), ");
        let directed = self.directed();
        let order: Vec<&String> = self.pnames.iter().chain(self.knames.iter()).collect();
        let reversed: Vec<(&String, bool)> = directed.iter().map(|&(c, d)| (c, !d)).collect();
        last_as_text(b, "batch", &order, &reversed);
    }
}

/// ` FROM <path> WHERE <tenant> AND <parent key> IS NOT NULL [AND (<parent key>) > <cursor>]`: the
/// tenant's parents of a step after the cursor's parent, the parent table as alias `base`.
fn parents_after(
    b: &mut SqlBuilder,
    plan: &Plan,
    fk: &super::catalog::ForeignKey,
    rest: &[usize],
    base: usize,
    cursor: &Cursor,
    parent_types: &[&crate::sql::SqlType],
) {
    from_path(b, plan, fk.to, rest, base);
    // A parent key with a NULL is referenced by nothing (MATCH SIMPLE), and a NULL cannot be a cursor.
    for c in &fk.to_cols {
        b.sql(" AND ").col(base, c).sql(" IS NOT NULL");
    }
    if !matches!(cursor, Cursor::Start) {
        // A parent key that leads with the column set to the tenant key (`(account_id, id)`)
        // compares only what follows it, as a cursor inside a parent does (`parent_prefix`).
        let lead = pinned_column(plan, rest)
            .map_or(0, |c| parent_prefix(std::slice::from_ref(c), &fk.to_cols));
        b.sql(" AND (");
        cols(b, base, &fk.to_cols[lead..]);
        b.sql(") > ");
        cursor_values(b, &parent_types[lead..], lead);
    }
}

/// ` AND (t0.<key>) >= (<the parent's first remaining child key>)` (`<=` and the last key when
/// `desc`), for a batch that jumps (see [`batch`]): the children of the parent given by `parent`
/// (after the cursor's key at `after`, a position in `$3`, when given) are read through an
/// `OFFSET 0` fence, so PostgreSQL finds them by the foreign key's index and only then orders
/// them; the batch's own ordered scan then starts at the first of them.
#[allow(clippy::too_many_arguments)]
fn first_child(
    b: &mut SqlBuilder,
    plan: &Plan,
    step: &Step,
    fk_index: usize,
    key_cols: &[String],
    desc: bool,
    parent: &dyn Fn(&mut SqlBuilder, usize),
    after: Option<(&[&crate::sql::SqlType], usize)>,
) {
    let fk = &plan.catalog.foreign_keys[fk_index];
    let j = JUMP_BASE;
    b.sql(" AND (");
    cols(b, 0, key_cols);
    b.sql(if desc {
        ") <= (SELECT "
    } else {
        ") >= (SELECT "
    });
    cols(b, j, key_cols);
    b.sql(" FROM (SELECT ");
    cols(b, j, key_cols);
    b.sql(" FROM ")
        .relation(plan.name(step.table), plan.partitioned(step.table))
        .sql(" ")
        .alias(j)
        .sql(" WHERE ");
    b.join(&fk.from_cols, " AND ", |b, i, c| {
        b.col(j, c).sql(" = ");
        parent(b, i);
    });
    if let Some((key_types, from)) = after {
        b.sql(" AND (");
        cols(b, j, key_cols);
        b.sql(if desc { ") < " } else { ") > " });
        cursor_values(b, key_types, from);
    }
    b.sql(" OFFSET 0) ").alias(j).sql(" ORDER BY ");
    cols_ordered(b, j, key_cols, desc);
    b.sql(" LIMIT 1)");
}

/// `, kept AS (…)`: the rows of `batch` (in `table`) to keep back, because a row that stays still
/// references them through one of the self-references `held` (deleting them would apply that
/// reference's action: fail a NO ACTION / RESTRICT, set a NULL or a default, or cascade to a row
/// that must stay). A row
/// stays when it is outside the batch, or kept back itself: so the set is recursive, from the
/// batch's rows referenced from outside it down the references of kept rows (a kept row's own
/// parent in the batch is kept too). Each kept row carries the values of its `held` references'
/// columns (`h<i>_<j>`) for the next step. The statement must start `WITH RECURSIVE`.
fn kept(b: &mut SqlBuilder, plan: &Plan, table: u32, held: &[usize]) {
    let (outside, row) = (HELD_BASE, HELD_BASE + 1);
    let in_batch = |b: &mut SqlBuilder, t: usize| {
        b.alias(t)
            .sql(".ctid = ANY (ARRAY(SELECT tid FROM batch)) AND EXISTS (SELECT 1 FROM batch b1 WHERE b1.tid = ")
            .alias(t)
            .sql(".ctid AND b1.toid = ")
            .alias(t)
            .sql(".tableoid)");
    };
    let select = |b: &mut SqlBuilder| {
        b.sql("SELECT ")
            .alias(row)
            .sql(".ctid AS tid, ")
            .alias(row)
            .sql(".tableoid AS toid");
        for (i, &h) in held.iter().enumerate() {
            for (j, c) in plan.catalog.foreign_keys[h].from_cols.iter().enumerate() {
                b.sql(", ")
                    .col(row, c)
                    .sql(" AS ")
                    .ident(&format!("h{i}_{j}"));
            }
        }
        b.sql(" FROM ")
            .relation(plan.name(table), plan.partitioned(table))
            .sql(" ")
            .alias(row);
    };
    b.sql(", kept AS (");
    // Referenced from outside the batch.
    select(b);
    b.sql(" WHERE ");
    in_batch(b, row);
    b.sql(" AND (");
    b.join(held, " OR ", |b, _, &h| {
        let fk = &plan.catalog.foreign_keys[h];
        b.sql("EXISTS (SELECT 1 FROM ")
            .relation(plan.name(table), plan.partitioned(table))
            .sql(" ")
            .alias(outside)
            .sql(" WHERE ");
        b.join(&fk.from_cols, " AND ", |b, j, from| {
            b.col(outside, from).sql(" = ").col(row, &fk.to_cols[j]);
        });
        b.sql(" AND NOT EXISTS (SELECT 1 FROM batch b2 WHERE b2.tid = ")
            .alias(outside)
            .sql(".ctid AND b2.toid = ")
            .alias(outside)
            .sql(".tableoid))");
    });
    // Referenced by a kept row.
    b.sql(") UNION ");
    select(b);
    b.sql(" JOIN kept ON ");
    b.join(held, " OR ", |b, i, &h| {
        let fk = &plan.catalog.foreign_keys[h];
        b.sql("(");
        b.join(&fk.to_cols, " AND ", |b, j, to| {
            b.col(row, to).sql(" = kept.").ident(&format!("h{i}_{j}"));
        });
        b.sql(")");
    });
    b.sql(" WHERE ");
    in_batch(b, row);
    b.sql(")");
}

/// `(SELECT ARRAY[c1::text, …] FROM (SELECT * FROM <from> ORDER BY o1 [DESC], … LIMIT 1) last)`:
/// the first row of `from` in `order` (`true` = descending), printed as text. The row is found
/// first and only then printed: text for one row, not for every row.
fn last_as_text(
    b: &mut SqlBuilder,
    from: &'static str,
    out: &[&String],
    order: &[(&String, bool)],
) {
    b.sql("(SELECT ARRAY[");
    b.join(out, ", ", |b, _, c| {
        b.ident(c).sql("::text");
    });
    b.sql("] FROM (SELECT * FROM ").sql(from).sql(" ORDER BY ");
    b.join(order, ", ", |b, _, (c, desc)| {
        b.ident(c).sql(if *desc { " DESC" } else { "" });
    });
    b.sql(" LIMIT 1) last)");
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

/// Deletes, in one statement, every tenant row of `table` still present over all of its steps,
/// with every row that references one of them, transitively, through a self-reference that makes
/// the cascade fail while the referencing row remains (RESTRICT, NO ACTION, SET NULL into NOT NULL:
/// [`crate::engine::catalog::ForeignKey::blocks`]). It is the last resort for rows a table's batches
/// keep back ([`Plan::held_self_refs`]) when another pass over the steps deletes none of them: they
/// reference each other in a cycle, or rows the steps do not reach reference them (rows the cascade
/// reaches only below a tree's descendants). Since the cascade succeeds (the pre-check,
/// `engine::simulate`, runs whenever such a key exists), it deletes those referencing rows too;
/// deleted together, as the cascade deletes them, no such check fails at commit.
/// `$1` = tenant key; returns `int8` (rows deleted in `table`).
pub fn sweep(plan: &Plan, table: u32) -> Statement {
    let steps: Vec<&Step> = plan.steps.iter().filter(|s| s.table == table).collect();
    let fks = &plan.catalog.foreign_keys;
    let blocking: Vec<usize> = plan
        .held_self_refs(table)
        .into_iter()
        .filter(|&h| fks[h].blocks())
        .collect();
    // The referenced columns the recursion follows, each carried once.
    let mut carried: Vec<&String> = Vec::new();
    for &h in &blocking {
        for c in &fks[h].to_cols {
            if !carried.contains(&c) {
                carried.push(c);
            }
        }
    }
    let mut b = SqlBuilder::new();
    b.sql("WITH RECURSIVE s AS (");
    b.join(&steps, " UNION ", |b, _, step| {
        b.sql("SELECT ")
            .col(STEP_BASE, "tableoid")
            .sql(" AS toid, ")
            .col(STEP_BASE, "ctid")
            .sql(" AS tid");
        for (i, c) in carried.iter().enumerate() {
            b.sql(", ").col(STEP_BASE, c).sql(" AS c").int(i as i64);
        }
        from_path(b, plan, table, &step.path, STEP_BASE);
    });
    if !blocking.is_empty() {
        b.sql(" UNION SELECT ")
            .col(REF_BASE, "tableoid")
            .sql(", ")
            .col(REF_BASE, "ctid");
        for c in &carried {
            b.sql(", ").col(REF_BASE, c);
        }
        b.sql(" FROM ")
            .relation(plan.name(table), plan.partitioned(table))
            .sql(" ")
            .alias(REF_BASE)
            .sql(" JOIN s ON ");
        b.join(&blocking, " OR ", |b, _, &h| {
            b.sql("(");
            b.join(&fks[h].from_cols, " AND ", |b, j, from| {
                let at = carried
                    .iter()
                    .position(|c| **c == fks[h].to_cols[j])
                    .expect("carried above");
                b.col(REF_BASE, from).sql(" = s.c").int(at as i64);
            });
            b.sql(")");
        });
    }
    b.sql("), del AS (DELETE FROM ")
        .relation(plan.name(table), plan.partitioned(table))
        .sql(" d USING s WHERE d.tableoid = s.toid AND d.ctid = s.tid RETURNING 1) SELECT count(*) FROM del");
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
        .relation(plan.name(fk.from), plan.partitioned(fk.from))
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

/// `SELECT count(*)` of the root rows with the tenant's key (`$1`, bound as text).
pub fn count_root(plan: &Plan) -> Statement {
    root_rows(plan, "SELECT count(*) FROM ")
}

/// `DELETE` of the root row (`$1`, bound as text): the cascading `DELETE` itself, run only by the
/// trial cascade ([`super::trial`]), which always rolls it back.
pub fn delete_root(plan: &Plan) -> Statement {
    root_rows(plan, "DELETE FROM ")
}

/// `<head> [ONLY] root WHERE key = $1::<key type>`.
fn root_rows(plan: &Plan, head: &'static str) -> Statement {
    let mut b = SqlBuilder::new();
    b.sql(head)
        .relation(plan.name(plan.root), plan.partitioned(plan.root))
        .sql(" WHERE ")
        .ident(&plan.key_column)
        .sql(" = $1::")
        .ty(&plan.key_type);
    b.build()
}

/// `SELECT $1::<key type>::text, EXISTS (SELECT FROM [ONLY] root WHERE key = $1::<key type>)`: the
/// tenant key as PostgreSQL reads it into the root's key column and prints it back (`" 7"`, `"+7"`
/// and `"07"` are all `7` for a `bigint` key), so two spellings of one tenant are one key; and
/// whether a root row has it. `$1` is bound as text.
pub fn canonical_key(plan: &Plan) -> Statement {
    let mut b = SqlBuilder::new();
    b.sql("SELECT $1::")
        .ty(&plan.key_type)
        .sql("::text, EXISTS (SELECT FROM ")
        .relation(plan.name(plan.root), plan.partitioned(plan.root))
        .sql(" WHERE ")
        .ident(&plan.key_column)
        .sql(" = $1::")
        .ty(&plan.key_type)
        .sql(")");
    b.build()
}
