//! Foreign-key cycles whose deletion order matters.
//!
//! Leaves first means: a table's rows go before the rows they reference. On a cycle of references
//! between the tenant's tables that cannot hold for every edge, and the post-order of
//! [`super::plan`] breaks one. That is harmless for a CASCADE or a SET NULL into nullable columns
//! (the row is deleted or detached a little earlier, and deleted later anyway), but not for an
//! *order-sensitive* key: RESTRICT, NO ACTION, SET NULL into a NOT NULL column, SET DEFAULT. Take
//! `customer → campaign → answer`, each CASCADE, and `customer.answer_id` NO ACTION into `answer`:
//! the cascade deletes a customer, then its campaigns and answers, and checks the NO ACTION key at
//! the end of that statement, when the customer referencing the answers is gone (PostgreSQL docs
//! §5.4.5: NO ACTION is checked at the end of the statement). Deleting `answer` first fails.
//!
//! So the tables of such a cycle that the cascade reaches only through one table of it, its
//! *entry*, get no steps of their own: the entry's batches delete its rows and PostgreSQL's cascade
//! deletes the rest of the cycle in the same statement, in the cascade's own order
//! (`Plan::cycle_absorbed`). Any other shape — a cycle the cascade enters through two tables, or
//! a table of it reached by no CASCADE key from the entry — is *unordered*
//! (`Plan::unordered`): deprov deletes such a tenant only when its whole cascade fits one bounded
//! transaction, and otherwise refuses it before anything is deleted.
//!
//! Rows of one entry row's cycle that reference rows below another entry row make a batch fail its
//! NO ACTION check (SQLSTATE 23503) while deleting them in one statement would not; the worker then
//! deletes the entry table's remaining rows in one statement.

use std::collections::BTreeSet;

use super::catalog::{ForeignKey, OnDelete};

/// Whether a key's outcome depends on whether the rows referencing through it are gone before the
/// row it references: RESTRICT, NO ACTION, SET NULL into a NOT NULL column, SET DEFAULT.
pub fn order_sensitive(fk: &ForeignKey) -> bool {
    fk.blocks() || fk.on_delete == OnDelete::SetDefault
}

/// What [`cycle_shapes`] found for a plan's steps.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Cycles {
    /// Tables deleted by the cascade under their cycle's entry.
    pub absorbed: BTreeSet<u32>,
    /// Order-sensitive keys (indexes into `catalog.foreign_keys`) on cycles of another shape.
    pub unordered: Vec<usize>,
}

/// What [`cycle_shapes`] reads of a plan being made (`Plan::new`).
pub(super) struct Graph<'a> {
    /// The catalog's foreign keys.
    pub fks: &'a [ForeignKey],
    /// Tables that can hold tenant rows.
    pub closure: &'a BTreeSet<u32>,
    /// The root table.
    pub root: u32,
    /// The table of each step, in the steps' order (leaves first).
    pub order: &'a [u32],
}

/// The cycles of `plan` that carry an order-sensitive key between two different tables: what to
/// absorb, what is unordered.
pub(super) fn cycle_shapes(plan: &Graph<'_>) -> Cycles {
    let fks = plan.fks;
    let position = |t: u32| plan.order.iter().position(|&s| s == t);
    let mut out = Cycles::default();
    let mut done: BTreeSet<u32> = BTreeSet::new();
    for (i, fk) in fks.iter().enumerate() {
        if fk.from == fk.to
            || !order_sensitive(fk)
            || !plan.closure.contains(&fk.from)
            || !plan.closure.contains(&fk.to)
        {
            continue;
        }
        // The post-order deletes `from` before `to` unless a cycle made it break this key.
        let (Some(from), Some(to)) = (position(fk.from), position(fk.to)) else {
            continue;
        };
        if from < to {
            continue;
        }
        let members = component(plan, fk.from);
        if done.contains(&fk.from) {
            if !out.absorbed.iter().any(|t| members.contains(t)) {
                out.unordered.push(i);
            }
            continue;
        }
        done.extend(members.iter().copied());
        match entry(plan, &members) {
            Some(entry) => out
                .absorbed
                .extend(members.iter().copied().filter(|&t| t != entry)),
            None => out.unordered.push(i),
        }
    }
    out
}

/// The tables on a cycle with `table` through references between closure tables (any action),
/// `table` included: its strongly connected component.
fn component(plan: &Graph<'_>, table: u32) -> BTreeSet<u32> {
    let down = reachable(plan, table, |fk| (fk.to, fk.from));
    let up = reachable(plan, table, |fk| (fk.from, fk.to));
    down.intersection(&up).copied().collect()
}

/// Closure tables reachable from `start` over foreign keys oriented by `edge` (`(from, to)` of the
/// walk), `start` included.
fn reachable(
    plan: &Graph<'_>,
    start: u32,
    edge: impl Fn(&ForeignKey) -> (u32, u32),
) -> BTreeSet<u32> {
    let mut seen = BTreeSet::from([start]);
    let mut stack = vec![start];
    while let Some(t) = stack.pop() {
        for fk in plan.fks {
            let (a, b) = edge(fk);
            if a == t && plan.closure.contains(&b) && seen.insert(b) {
                stack.push(b);
            }
        }
    }
    seen
}

/// The one table of `members` through which the cascade enters the cycle, when every other member
/// is reached by the cascade only from inside the cycle and from that table: the root if it is a
/// member, else the only member with a CASCADE key to a closure table outside. `None` otherwise.
fn entry(plan: &Graph<'_>, members: &BTreeSet<u32>) -> Option<u32> {
    let fks = plan.fks;
    let cascade_parents = |t: u32| {
        fks.iter()
            .filter(move |fk| {
                fk.from == t && fk.on_delete == OnDelete::Cascade && plan.closure.contains(&fk.to)
            })
            .map(|fk| fk.to)
    };
    let entries: Vec<u32> = members
        .iter()
        .copied()
        .filter(|&t| t == plan.root || cascade_parents(t).any(|p| !members.contains(&p)))
        .collect();
    let entry = match entries.as_slice() {
        [only] => *only,
        _ => return None,
    };
    // Every other member is deleted by the cascade from the entry, inside the cycle.
    let mut reached = BTreeSet::from([entry]);
    let mut stack = vec![entry];
    while let Some(t) = stack.pop() {
        for fk in fks {
            if fk.to == t
                && fk.on_delete == OnDelete::Cascade
                && members.contains(&fk.from)
                && reached.insert(fk.from)
            {
                stack.push(fk.from);
            }
        }
    }
    (reached.len() == members.len()).then_some(entry)
}
