//! Which foreign keys' delete actions the simulation must follow: only those whose rows can bear on
//! the verdict. The rest of the closure is never read.
//!
//! A verdict is decided by the *conditional* keys ([`super::needs_simulation`]): whether a row
//! referencing a deleted row through one of them is still present when its trigger fires. That
//! needs the rows of the referencing and referenced tables of those keys, and — to know which of
//! them the cascade deletes, and when — the rows of every table above them on a cascade path. A
//! table outside that set only ever queues cascade deletes into tables outside it (its cascade
//! children would otherwise be in the set, and so would it), so leaving its events out changes
//! neither which events the kept tables receive nor their first-in-first-out order.
//!
//! A table with two SET NULL / SET DEFAULT keys into the closure ([`super::updated_twice`]) joins
//! the set with every table it references in the closure: the second update of one of its rows
//! checks each of the row's keys, whose parents must then be known.
//!
//! Not narrowed when a SET NULL / SET DEFAULT key shares columns with another key of its table
//! ([`super::detaches`]) or a SET DEFAULT key references the closure: their updates queue checks on
//! other keys of the updated rows, whose parents must then be known.

use std::collections::BTreeSet;

use super::load::{Facts, Kind};
use crate::engine::Plan;
use crate::engine::catalog::OnDelete;

/// Per foreign key of `plan.catalog` (by index): whether the simulation follows its delete action.
pub(super) fn followed(plan: &Plan) -> Vec<bool> {
    let fks = &plan.catalog.foreign_keys;
    let into_closure = |to: u32| plan.closure.contains(&to);
    if everything(plan) {
        return vec![true; fks.len()];
    }
    let mut tables: BTreeSet<u32> = BTreeSet::new();
    for f in fks.iter().filter(|f| super::conditional(plan, f)) {
        tables.extend([f.from, f.to]);
    }
    for t in super::updated_twice_tables(plan) {
        tables.insert(t);
        tables.extend(
            fks.iter()
                .filter(|f| f.from == t && into_closure(f.to))
                .map(|f| f.to),
        );
    }
    // Every cascade parent (in the closure) of a table in the set joins it, up to the root.
    let mut grew = true;
    while grew {
        grew = false;
        for f in fks {
            if f.on_delete == OnDelete::Cascade
                && into_closure(f.to)
                && tables.contains(&f.from)
                && tables.insert(f.to)
            {
                grew = true;
            }
        }
    }
    fks.iter().map(|f| tables.contains(&f.from)).collect()
}

/// Whether the simulation follows every key: a SET NULL / SET DEFAULT key shares columns with
/// another key of its table ([`super::detaches`]), or a SET DEFAULT key references the closure.
fn everything(plan: &Plan) -> bool {
    super::detaches(plan)
        || plan
            .catalog
            .foreign_keys
            .iter()
            .any(|f| plan.closure.contains(&f.to) && f.on_delete == OnDelete::SetDefault)
}

/// Drops from `facts` the delete-action triggers of the keys the simulation does not follow
/// ([`followed`]); check triggers stay.
pub(super) fn narrow(facts: &mut Facts, plan: &Plan) {
    let followed = followed(plan);
    for triggers in facts.triggers.values_mut() {
        triggers.retain(|t| t.kind == Kind::Check || followed[t.fk]);
    }
}

/// The CASCADE keys (indexes into `plan.catalog`) straight to the root's key column whose
/// referencing rows naming the tenant the simulation leaves unread ([`super::store::Store::leave_unread`]):
/// the root row's delete queues its triggers first, so PostgreSQL's cascade deletes those rows in
/// the queue's first generation, before any trigger that those deletes (or later ones) queue can
/// fire (first in, first out: see the module docs of [`super`]). Nothing can see the rows in
/// between when their table:
///
/// - is not partitioned, and its key column is not an array (its rows are left out of reads by
///   that column, [`super::load::rows`]);
/// - is referenced by no foreign key the simulation follows ([`followed`]): deleting its rows
///   queues nothing followed;
/// - has no SET NULL / SET DEFAULT key into the closure (`Plan::side_effects`): the cascade never
///   updates its rows;
/// - has no conditional key ([`super::conditional`]) to the root: such a key's check is itself an
///   event of the first generation, which may fire before the rows are deleted.
///
/// None when every key is followed (a key that detaches its rows, or a SET DEFAULT into the
/// closure): the updates of those rows queue checks this reasoning does not cover.
pub(super) fn unread(plan: &Plan) -> Vec<usize> {
    if everything(plan) {
        return Vec::new();
    }
    let fks = &plan.catalog.foreign_keys;
    let followed = followed(plan);
    (0..fks.len())
        .filter(|&i| {
            let f = &fks[i];
            let t = f.from;
            let Some(table) = plan.catalog.tables.get(&t) else {
                return false;
            };
            plan.keys_the_tenant(f)
                && t != plan.root
                && !table.partitioned
                && table
                    .columns
                    .get(&f.from_cols[0])
                    .is_some_and(|ty| !ty.as_str().ends_with(']'))
                && !fks
                    .iter()
                    .enumerate()
                    .any(|(j, g)| followed[j] && g.to == t)
                && !plan.side_effects.iter().any(|&g| fks[g].from == t)
                && !fks
                    .iter()
                    .any(|g| g.from == t && g.to == plan.root && super::conditional(plan, g))
        })
        .collect()
}
