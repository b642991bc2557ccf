//! Letting PostgreSQL's own cascade delete the small subtrees.
//!
//! Leaves-first deletion touches every row twice: once when deprov's batch deletes it, and again
//! when its parent's batch deletes the parent and PostgreSQL's referential trigger probes the child
//! table for rows to cascade to — finding the dead tuples the first pass left (they are not vacuumed
//! yet). For a table whose rows have only a few descendants each, it is cheaper to delete the parent
//! rows in batches and let the cascade remove the descendants in the same short transaction: every
//! row is then visited once, by the same code path the naive cascade uses.
//!
//! A table is *absorbed* (it gets no steps; its parents' batches cascade to it) when all of this holds:
//! - it is not the root and not partitioned, has no reference to itself and is on no reference
//!   cycle within the closure; it references no root row directly (one root row may own millions
//!   of rows, so an estimate per root row means nothing), unless the plan is made for one tenant
//!   whose rows in it the planner's statistics give ([`Plan::absorb_tenant`]);
//! - no foreign key without an index references it from a table larger than
//!   [`SMALL_SCAN_PAGES`] (deleting one of its rows would scan that whole referencing table,
//!   whatever the row estimate says); the pages of the small ones count as rows of its own cost;
//! - every foreign key into it is `ON DELETE CASCADE`, or a SET NULL that cannot fail (no NOT NULL
//!   column): no RESTRICT / NO ACTION / SET DEFAULT whose outcome could depend on deletion order;
//! - its row estimate is known (`pg_class.reltuples` ≥ 0, i.e. it was analyzed), and so is each
//!   parent's;
//! - for each parent, the estimated rows one parent row cascades to — the child's own subtree times
//!   the fan-out `reltuples(child) / reltuples(parent)` (under the root: times the tenant's rows
//!   in the child; for a child straight under the root, under its other parents: times the
//!   fan-out or the tenant's rows in the child, whichever is fewer), summed over all absorbed
//!   children, each row with the pages its own delete scans — stays within `max_rows`
//!   (`[hard_delete] cascade_rows`); for the root row, within that or a quarter of the pages its
//!   delete makes PostgreSQL scan anyway (the tables whose key to the root has no index),
//!   whichever is more ([`ROWS_PER_SCANNED_PAGE`]).
//! - under the root, no key of it or of a table its cascade reaches into the closure is other
//!   than CASCADE, or a SET NULL whose update can meet nothing but the key itself
//!   ([`super::catalog::ForeignKey::rewrites_plainly`]; see `only_cascades_below_of`).
//!
//! A table is *covered* (its steps are reduced to those straight to the root) when it has a NOT
//! NULL `ON DELETE CASCADE` foreign key to the root and other cascading paths besides, and it is not
//! the root, not absorbed, not partitioned, has no reference to itself and is on no reference cycle
//! within the closure. Every row whose key to the root names the tenant is found by the direct
//! step; a row reached only through another path names another tenant there, so walking every
//! parent on that path again finds almost nothing for the price of one probe per parent. Such rows
//! (and rows written after the direct step) are deleted by PostgreSQL's cascade under the batches
//! of their parents on the other paths, and counted there as an absorbed table's rows are.
//!
//! A table with several paths and no key straight to the root is covered the same way by one
//! kept step — the shortest path whose first key is NOT NULL — when every foreign key into the
//! closure of it and of the absorbed tables below it is CASCADE: the rows the kept step does not
//! reach then wait for their parents' batches on the other paths without blocking or being
//! rewritten by the delete of any other table's rows. A join table under two tenant tables is
//! walked once, not once per parent table.
//!
//! The estimate is an average: a parent row with far more descendants than average makes its batch
//! slow. Batches are sized by time, so the next batch takes fewer parents; a single parent row whose
//! cascade alone exceeds the absorbing step's statement timeout makes the worker re-plan with a
//! smaller allowance, and at last fall back to the plain leaves-first plan, every path its own
//! steps, for the rest of the job (see `worker::run`). The root row is such a parent when its
//! delete is held to the batch bound ([`Plan::root_delete_bounded`]).

use std::collections::{BTreeMap, BTreeSet};

use super::catalog::OnDelete;
use super::plan::Plan;

impl Plan {
    /// This plan with the tables that PostgreSQL's cascade may delete under their parents' batches
    /// removed from the steps, and the covered tables' steps reduced to those straight to the root
    /// (see the module docs). `max_rows` ≤ 0 returns the plan unchanged.
    pub fn absorb(self, max_rows: f64) -> Plan {
        self.absorb_tenant(max_rows, &BTreeMap::new())
    }

    /// [`Self::absorb`] for one tenant: a table with a cascading key straight to the root's key
    /// column may be absorbed too — its rows then go with the root row's delete — when
    /// `tenant_rows` holds the most rows the tenant can have in it (by the planner's statistics
    /// and the rows written since, [`super::estimate::DirectRows::at_most`]) and those rows with
    /// their subtrees fit the root's allowance with its other absorbed tables: `max_rows`, or
    /// [`ROWS_PER_SCANNED_PAGE`] per page of the tables the root row's delete scans, whichever is
    /// more. The root row's delete makes PostgreSQL read every table referencing it anyway (scan
    /// one without an index on its key); a tenant with a few rows in such a table then has them
    /// deleted by that read instead of by steps that read the table once more.
    pub fn absorb_tenant(mut self, max_rows: f64, tenant_rows: &BTreeMap<u32, i64>) -> Plan {
        self.tenant_rows.clone_from(tenant_rows);
        if max_rows <= 0.0 {
            return self;
        }
        let rows = |t: u32| self.catalog.tables[&t].estimated_rows;
        // Rows of `child` per row of `parent`, by the tables' estimates.
        let fan_out = |child: u32, parent: u32| rows(child) / rows(parent).max(1.0);
        // A row's own cost: itself, and the pages of the small tables its delete scans.
        let mut cost: BTreeMap<u32, f64> = self
            .closure
            .iter()
            .map(|&t| (t, 1.0 + self.small_scans(t).unwrap_or(0.0)))
            .collect();
        let mut absorbed = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let order: Vec<u32> = self
            .steps
            .iter()
            .map(|s| s.table)
            .filter(|t| seen.insert(*t))
            .collect();
        // Leaves first, so that a table's cost holds its absorbed subtree before its parents weigh
        // it. A table under the root waits for the second pass.
        let mut under_root = Vec::new();
        for table in order {
            let Some(parents) = self.absorbable(table) else {
                continue;
            };
            if parents.contains(&self.root) {
                under_root.push((table, parents));
                continue;
            }
            if parents.iter().any(|&p| rows(p) < 0.0) {
                continue;
            }
            let own = cost[&table];
            if charge(
                &mut cost,
                &parents,
                |p| fan_out(table, p) * own,
                |_| max_rows,
            ) {
                absorbed.insert(table);
            }
        }
        // Under the root, the tenant's own rows (an average per root row means nothing: one root
        // row may own millions of rows), in the root's allowance: first the tables the root row's
        // delete scans anyway (no index on their key to it), largest first — absorbing those saves
        // a pass of batches over the whole table — then the others. The root row is deleted last,
        // after every other table's rows, and its cascade takes whatever rows below the table were
        // left to it (absorbed tables', and a covered table's rows reached only through it): a
        // table with a key into the tenant's tables that is not CASCADE on itself or anywhere
        // below it, nor a SET NULL that rewrites plainly, stays a step (a RESTRICT / NO ACTION key
        // would refuse the delete of the rows it references while they remain). So does one whose
        // other parent is absorbed itself (that parent's cost was settled), or whose other
        // parent's delete scans a table without an index on its key larger than
        // [`SMALL_SCAN_PAGES`], unless the table itself is one of those scanned (its own key to
        // that parent has no index): such a parent's own delete may outlast the batch bound, which
        // runs it unbounded while it cascades to no absorbed table, and re-plans the job once it does —
        // worth it only when absorbing saves a pass of batches over a table that parent's delete
        // scans anyway. An other parent is charged the table's rows per parent row, at most the
        // tenant's rows in it: one of the tenant's parent rows cascades to the tenant's rows, not
        // to the average of a table another tenant fills.
        let mut candidates: Vec<(u32, Vec<u32>, f64)> = under_root
            .into_iter()
            .filter_map(|(t, parents)| {
                let direct = *tenant_rows.get(&t)? as f64;
                let others_fit = parents.iter().filter(|&&p| p != self.root).all(|&p| {
                    rows(p) >= 0.0
                        && !absorbed.contains(&p)
                        && (self.small_scans(p).is_some() || self.scanned_under(t, p))
                });
                (others_fit && self.only_cascades_below_of(t, &self.closure, true))
                    .then_some((t, parents, direct))
            })
            .collect();
        candidates.sort_by(|a, b| {
            let pages = |t: u32| self.catalog.tables[&t].estimated_pages;
            self.scanned_under(b.0, self.root)
                .cmp(&self.scanned_under(a.0, self.root))
                .then(pages(b.0).total_cmp(&pages(a.0)))
                .then(a.0.cmp(&b.0))
        });
        // The root row's delete reads every table whose key to it has no index, whatever is
        // absorbed: the rows it may take besides are a quarter as many as those pages.
        let root_rows = max_rows.max(ROWS_PER_SCANNED_PAGE * self.pages_scanned_under_root());
        let allowance = |p: u32| if p == self.root { root_rows } else { max_rows };
        for (table, parents, direct) in candidates {
            let own = cost[&table];
            let share = |p: u32| {
                if p == self.root {
                    direct * own
                } else {
                    fan_out(table, p).min(direct) * own
                }
            };
            if charge(&mut cost, &parents, share, allowance) {
                absorbed.insert(table);
            }
        }
        self.steps.retain(|s| !absorbed.contains(&s.table));
        self.absorbed.extend(absorbed);
        self.cascade_estimate = cost.into_iter().filter(|(_, c)| *c > 1.0).collect();
        self.cover();
        self
    }

    /// The parents (in the closure, through `ON DELETE CASCADE` keys) whose batches may cascade to
    /// `table`'s rows, when the table itself may be absorbed: not the root, analyzed, not
    /// partitioned (its deletions are counted per partition), on no reference cycle, every key into
    /// it CASCADE or a SET NULL that cannot fail, none of them without an index, and with a parent.
    fn absorbable(&self, table: u32) -> Option<Vec<u32>> {
        let fks = &self.catalog.foreign_keys;
        if table == self.root
            || self.catalog.tables[&table].estimated_rows < 0.0
            || self.catalog.tables[&table].partitioned
            || reaches(self, table, table)
        {
            return None;
        }
        let safe_refs = fks.iter().filter(|fk| fk.to == table).all(|fk| {
            fk.from != table
                && match fk.on_delete {
                    OnDelete::Cascade => true,
                    OnDelete::SetNull => !fk.blocks(),
                    _ => false,
                }
        });
        // A row whose delete makes PostgreSQL scan a referencing table without an index costs that
        // table's size, not the estimate: unless every such table is small, the table keeps
        // batches of its own (which start at one row and grow by time), and nothing above it
        // cascades through it.
        if !safe_refs || self.small_scans(table).is_none() {
            return None;
        }
        let parents: Vec<u32> = fks
            .iter()
            .filter(|fk| {
                fk.from == table
                    && fk.on_delete == OnDelete::Cascade
                    && self.closure.contains(&fk.to)
            })
            .map(|fk| fk.to)
            .collect();
        (!parents.is_empty()).then_some(parents)
    }

    /// Reduces each covered table's steps to those through a NOT NULL foreign key straight to the
    /// root, or else to its one kept step (see the module docs).
    fn cover(&mut self) {
        let fks = &self.catalog.foreign_keys;
        let direct = |s: &super::plan::Step| s.path.len() == 1 && fks[s.path[0]].not_null;
        let mut covered = BTreeSet::new();
        let mut kept: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &table in &self.closure {
            if table == self.root
                || self.absorbed.contains(&table)
                || self.catalog.tables[&table].partitioned
                || !self.self_refs(table).is_empty()
                || reaches(self, table, table)
            {
                continue;
            }
            let steps: Vec<&super::plan::Step> =
                self.steps.iter().filter(|s| s.table == table).collect();
            if steps.len() < 2 {
                continue;
            }
            if steps.iter().any(|s| direct(s)) {
                if steps.iter().any(|s| !direct(s)) {
                    covered.insert(table);
                }
                continue;
            }
            // No key straight to the root: the shortest path whose first key is NOT NULL (one
            // with an index on it first), when the rows left to the other paths' cascades may
            // wait for them.
            let keeper = steps
                .iter()
                .filter(|s| fks[s.path[0]].not_null)
                .min_by_key(|s| (s.path.len(), !fks[s.path[0]].indexed));
            if let Some(keeper) = keeper
                && self.only_cascades_below(table)
            {
                kept.insert(table, keeper.path.clone());
                covered.insert(table);
            }
        }
        self.steps.retain(|s| match kept.get(&s.table) {
            Some(path) => s.path == *path,
            None => !covered.contains(&s.table) || direct(s),
        });
        self.covered = covered;
    }

    /// Whether every foreign key into the closure of `table`, and of the absorbed tables its
    /// cascade reaches, is `ON DELETE CASCADE`: their rows may then be deleted after any other
    /// table's (a RESTRICT / NO ACTION key would refuse the delete of the rows it references while
    /// they remain, and a SET NULL / SET DEFAULT one would rewrite rows the cascade deletes).
    fn only_cascades_below(&self, table: u32) -> bool {
        self.only_cascades_below_of(table, &self.absorbed, false)
    }

    /// [`Self::only_cascades_below`] with `absorbed` the absorbed tables (the closure: every table
    /// a cascade from `table` reaches). With `set_null`, also a table's one SET NULL key into the
    /// closure that can fail or act only through itself ([`Self::rewrites_plainly`]): the delete
    /// of the rows it references before this table's then sets the key's columns of rows the
    /// cascade deletes afterwards — an `UPDATE` that can neither fail nor fire anything, with the
    /// same rows left in the end.
    fn only_cascades_below_of(&self, table: u32, absorbed: &BTreeSet<u32>, set_null: bool) -> bool {
        let fks = &self.catalog.foreign_keys;
        let mut stack = vec![table];
        let mut visited = BTreeSet::from([table]);
        while let Some(t) = stack.pop() {
            for fk in fks.iter().filter(|fk| self.closure.contains(&fk.to)) {
                if fk.from == t
                    && fk.on_delete != OnDelete::Cascade
                    && !(set_null && self.rewrites_plainly(fk))
                {
                    return false;
                }
                if fk.to == t
                    && fk.on_delete == OnDelete::Cascade
                    && absorbed.contains(&fk.from)
                    && visited.insert(fk.from)
                {
                    stack.push(fk.from);
                }
            }
        }
        true
    }

    /// Whether `fk` is a SET NULL key into the closure whose action's `UPDATE` can fail or act
    /// only through its own columns ([`super::catalog::ForeignKey::rewrites_plainly`]) into
    /// nullable columns, its table's only SET NULL / SET DEFAULT key into the closure (a row
    /// updated twice is checked against every key it holds), and sharing no column with another
    /// of its table's keys into the closure (setting a shared column would detach the row from
    /// that key's parent too: [`super::simulate::detaches`]).
    fn rewrites_plainly(&self, fk: &super::catalog::ForeignKey) -> bool {
        fk.on_delete == OnDelete::SetNull
            && fk.rewrites_plainly
            && !fk.blocks()
            && !super::simulate::updated_twice_tables(self).contains(&fk.from)
            && !super::simulate::shares_a_column(self, fk)
    }

    /// Rows for the first batch of a step on `table`: `batch_rows` rows' worth of work by estimate —
    /// `batch_rows` divided by the rows one of its rows cascades to. When a foreign key referencing
    /// the table has no index, each deleted row scans the referencing tables: as many rows as keep
    /// those scans within [`FIRST_SCAN_ROWS`] rows by their estimates, at most `batch_rows`, and a
    /// single row when one of them was never analyzed. A table no foreign key references (a leaf:
    /// deleting its rows fires no referential action, only the heap and its WAL are written)
    /// starts with [`LEAF_FIRST_BATCH`] times `batch_rows`: at that size a batch's round trips,
    /// not its rows, are most of its time, and most such steps then need one batch, not two.
    pub fn first_batch_rows(&self, table: u32, batch_rows: i64) -> i64 {
        if self.delete_scans(table) {
            return self
                .scanned_per_delete(table)
                .map_or(1, |rows| within_first_scan(rows, batch_rows));
        }
        if !self.catalog.foreign_keys.iter().any(|fk| fk.to == table) {
            return batch_rows.saturating_mul(LEAF_FIRST_BATCH).max(1);
        }
        let per_row = self.cascade_estimate.get(&table).copied().unwrap_or(1.0);
        ((batch_rows as f64 / per_row).floor() as i64).max(1)
    }

    /// Parents for the first batch of `step` (of `rows` rows), whose foreign key to its parent has
    /// no index: each parent's children are then a scan of the step's table, so as many parents as
    /// keep those scans within [`FIRST_SCAN_ROWS`] rows by the table's estimate, at most `rows`,
    /// and one when the table was never analyzed.
    pub fn first_unindexed_parents(&self, step: &super::plan::Step, rows: i64) -> i64 {
        let estimate = self.catalog.tables[&step.table].estimated_rows;
        if estimate < 0.0 || self.partitioned(step.table) {
            return 1;
        }
        within_first_scan(estimate, rows)
    }

    /// The rows one deleted row of `table` makes PostgreSQL scan: the estimated rows of every table
    /// referencing it through a foreign key without an index. `None` when one of them was never
    /// analyzed or is partitioned (its estimate is its partitions').
    fn scanned_per_delete(&self, table: u32) -> Option<f64> {
        self.scanned_by_delete(table)
            .map(|t| (t.estimated_rows >= 0.0 && !t.partitioned).then_some(t.estimated_rows))
            .sum()
    }

    /// The tables a deleted row of `table` makes PostgreSQL scan whole: those referencing it
    /// through a foreign key without an index on its referencing columns, once per such key.
    fn scanned_by_delete(&self, table: u32) -> impl Iterator<Item = &super::catalog::Table> + '_ {
        self.catalog
            .foreign_keys
            .iter()
            .filter(move |fk| fk.to == table && !fk.indexed)
            .map(|fk| &self.catalog.tables[&fk.from])
    }

    /// The size of a step's first batch: [`Plan::first_batch_rows`] of its table — for a block
    /// step ([`Plan::block_step`]) in blocks, as many as hold those rows by the table's estimates
    /// (every row of a block range may be the tenant's), at most `batch_rows`; `batch_rows` blocks
    /// when the table was never analyzed. A block step over a key straight to the root, in a table
    /// where the tenant holds no more rows than that ([`Plan::tenant_rows`]), starts with as many
    /// blocks as hold [`FIRST_SCAN_ROWS`] rows, if more: no range holds more of the tenant's rows
    /// than the table does, so a longer first range costs only its read.
    pub fn first_batch(&self, step: &super::plan::Step, batch_rows: i64) -> i64 {
        let rows = self.first_batch_rows(step.table, batch_rows);
        if !self.block_step(step) {
            return rows;
        }
        let t = &self.catalog.tables[&step.table];
        if t.estimated_rows <= 0.0 || t.estimated_pages <= 0.0 {
            return batch_rows.max(1);
        }
        let per_block = (t.estimated_rows / t.estimated_pages).max(1.0);
        let blocks = ((rows as f64 / per_block).ceil() as i64).clamp(1, batch_rows.max(1));
        if self
            .direct_tenant_rows(step)
            .is_some_and(|held| held <= rows)
        {
            return blocks.max((FIRST_SCAN_ROWS / per_block).floor() as i64);
        }
        blocks
    }

    /// The most rows the tenant holds in `step`'s table ([`Plan::tenant_rows`]) when the step's
    /// path is one key whose rows those figures count ([`Plan::keys_the_tenant`]).
    fn direct_tenant_rows(&self, step: &super::plan::Step) -> Option<i64> {
        let [hop] = step.path[..] else {
            return None;
        };
        self.keys_the_tenant(&self.catalog.foreign_keys[hop])
            .then(|| self.tenant_rows.get(&step.table).copied())
            .flatten()
    }

    /// The pages a deleted row of `table` makes PostgreSQL scan (the referencing tables whose
    /// foreign key into it has no index, by `pg_class.relpages`) when each of them is small:
    /// analyzed, not partitioned, at most [`SMALL_SCAN_PAGES`]. `Some(0.0)` when the delete scans
    /// none; `None` when it scans a larger one, or one whose size is not known.
    fn small_scans(&self, table: u32) -> Option<f64> {
        self.scanned_by_delete(table)
            .map(|t| {
                let small = t.estimated_rows >= 0.0
                    && !t.partitioned
                    && t.estimated_pages <= SMALL_SCAN_PAGES;
                small.then_some(t.estimated_pages.max(0.0))
            })
            .sum()
    }

    /// Whether deleting a row of `table` makes PostgreSQL scan a whole referencing table: a foreign
    /// key into it has no index on its referencing columns.
    fn delete_scans(&self, table: u32) -> bool {
        self.scanned_by_delete(table).next().is_some()
    }

    /// The pages of the tables the root row's delete makes PostgreSQL scan whole (a foreign key to
    /// the root without an index on its referencing columns), by `pg_class.relpages`; a
    /// partitioned or never analyzed table counts none.
    fn pages_scanned_under_root(&self) -> f64 {
        self.closure
            .iter()
            .filter(|&&t| t != self.root && self.scanned_under(t, self.root))
            .map(|t| &self.catalog.tables[t])
            .filter(|t| !t.partitioned)
            .map(|t| t.estimated_pages.max(0.0))
            .sum()
    }

    /// Whether deleting a row of `parent` makes PostgreSQL scan `table` whole: a foreign key from
    /// `table` to `parent` has no index on its referencing columns.
    fn scanned_under(&self, table: u32, parent: u32) -> bool {
        self.catalog
            .foreign_keys
            .iter()
            .any(|fk| fk.from == table && fk.to == parent && !fk.indexed)
    }

    /// The tables PostgreSQL's cascade may delete rows of under a statement on `table`: the
    /// absorbed and covered ones other than `table` when it absorbs below
    /// ([`Plan::absorbs_below`]), else none.
    pub fn absorbed_below(&self, table: u32) -> Vec<u32> {
        if self.absorbs_below(table) {
            self.absorbed
                .union(&self.covered)
                .copied()
                .filter(|&t| t != table)
                .collect()
        } else {
            Vec::new()
        }
    }

    /// The absorbed and covered tables below `table` (referencing it, directly or not, inside the
    /// closure): those whose rows a statement on `table` may let PostgreSQL's cascade delete. Under
    /// two plans with the same set, deleting a row of `table` makes the cascade do the same work.
    pub fn cascades_below(&self, table: u32) -> BTreeSet<u32> {
        self.absorbed
            .union(&self.covered)
            .copied()
            .filter(|&t| t != table && reaches(self, table, t))
            .collect()
    }

    /// Whether a step on `table` deletes rows whose cascade removes absorbed tables' rows: tables
    /// without steps of their own, whose rows only the cascade from `table`'s rows deletes (a
    /// covered table's rows naming the tenant go with its own steps).
    pub fn absorbs_rows_below(&self, table: u32) -> bool {
        self.absorbed_straight_below(table).next().is_some()
    }

    /// The absorbed tables with a foreign key to `table` (other than `table` itself), once per key.
    fn absorbed_straight_below(&self, table: u32) -> impl Iterator<Item = u32> + '_ {
        self.catalog
            .foreign_keys
            .iter()
            .filter(move |fk| {
                fk.to == table && fk.from != table && self.absorbed.contains(&fk.from)
            })
            .map(|fk| fk.from)
    }

    /// Whether every absorbed table straight below `table` is one a delete of `table`'s rows scans
    /// anyway (its key to `table` has no index), with no absorbed table below it in turn. A plan
    /// with less cascade would give those tables steps of their own, a pass over each, and leave
    /// the delete of a `table` row the same scans: when such a delete outlasts the batch bound,
    /// the scans are what a re-plan cannot shorten. The absorbed rows themselves are few: they fit
    /// `[hard_delete] cascade_rows` by the statistics. True when no absorbed table is straight
    /// below `table` ([`Self::absorbs_rows_below`] false).
    pub fn absorbs_only_scanned_below(&self, table: u32) -> bool {
        self.absorbed_straight_below(table)
            .all(|child| self.scanned_under(child, table) && !self.absorbs_rows_below(child))
    }

    /// Whether the root row's delete is held to the batch bound `bound` (a `statement_timeout`):
    /// it takes absorbed tables' rows ([`Self::absorbs_rows_below`]), and the tables it scans
    /// whole (no index on their key to the root) are few enough pages to be read within the
    /// bound at [`SCANNED_PAGES_PER_MS`]. The absorbed rows were weighed by the statistics in
    /// rows, not in time: a cut at the bound then shows they cost more than their scans, and a
    /// plan with less cascade gives them steps of their own. A root row whose scans alone may
    /// outlast the bound runs as long as they take in any plan, and is not held to it.
    pub fn root_delete_bounded(&self, bound: std::time::Duration) -> bool {
        self.absorbs_rows_below(self.root)
            && self.pages_scanned_under_root()
                <= SCANNED_PAGES_PER_MS * bound.as_secs_f64() * 1000.0
    }

    /// Whether a step on `table` deletes rows whose cascade removes absorbed tables' rows, or a
    /// covered table's rows reached through `table`.
    pub fn absorbs_below(&self, table: u32) -> bool {
        self.absorbs_rows_below(table)
            || self.catalog.foreign_keys.iter().any(|fk| {
                fk.to == table
                    && fk.from != table
                    && self.covered.contains(&fk.from)
                    && fk.on_delete == OnDelete::Cascade
            })
    }
}

/// Adds `share(p)` (the rows one row of parent `p` would cascade to through an absorbed table) to
/// the cost of each of `parents` when every one of them stays within its `allowance(p)`; whether
/// it did.
fn charge(
    cost: &mut BTreeMap<u32, f64>,
    parents: &[u32],
    share: impl Fn(u32) -> f64,
    allowance: impl Fn(u32) -> f64,
) -> bool {
    if !parents.iter().all(|&p| cost[&p] + share(p) <= allowance(p)) {
        return false;
    }
    for &p in parents {
        *cost.get_mut(&p).expect("closure table") += share(p);
    }
    true
}

/// The most pages a referencing table without an index on its key may have for a delete that
/// scans it to be weighed like rows ([`Plan::absorb`]): each such page counts as one row of the
/// deleted row's cost. A larger table, or one never analyzed, makes every deleted row cost its
/// size, and keeps the table it references out of any cascade.
pub const SMALL_SCAN_PAGES: f64 = 16.0;

/// Rows the root row's delete may cascade to through absorbed tables per page it reads anyway
/// ([`Plan::absorb_tenant`]): the rows it deletes besides stay few beside the pages it scans
/// whatever is absorbed, while each table absorbed saves a pass of batches over it. Below
/// `cascade_rows` the configured allowance holds.
pub const ROWS_PER_SCANNED_PAGE: f64 = 0.25;

/// Pages a sequential scan is taken to read per millisecond when weighing whether the root row's
/// delete fits the batch bound by its scans alone ([`Plan::root_delete_bounded`]): a heap page in
/// shared buffers takes a few microseconds to read and test; this errs towards slower scans.
pub const SCANNED_PAGES_PER_MS: f64 = 100.0;

/// How many times `batch_rows` a leaf table's first batch takes ([`Plan::first_batch_rows`]).
/// Deleting a row no key references fires no trigger: it writes the row's heap page and a WAL
/// record, and reads the page when it is not in shared buffers.
pub const LEAF_FIRST_BATCH: i64 = 8;

/// Rows a step's first batch may make PostgreSQL scan where a foreign key has no index (the
/// referencing tables its deleted rows' triggers scan, or its own table per parent): a few
/// milliseconds of sequential scan, well within any batch bound. Batches after it are sized by
/// their measured time.
pub const FIRST_SCAN_ROWS: f64 = 20_000.0;

/// `limit` or fewer: how many scans of `scanned` rows each fit in [`FIRST_SCAN_ROWS`], at least 1.
fn within_first_scan(scanned: f64, limit: i64) -> i64 {
    let fit = (FIRST_SCAN_ROWS / scanned.max(1.0)).floor() as i64;
    fit.clamp(1, limit.max(1))
}

/// Whether `to` is reachable from `from` over "is referenced by" edges inside the closure (any action).
fn reaches(plan: &Plan, from: u32, to: u32) -> bool {
    let mut stack = vec![from];
    let mut visited = BTreeSet::new();
    while let Some(t) = stack.pop() {
        for fk in &plan.catalog.foreign_keys {
            if fk.to == t && plan.closure.contains(&fk.from) {
                if fk.from == to {
                    return true;
                }
                if visited.insert(fk.from) {
                    stack.push(fk.from);
                }
            }
        }
    }
    false
}
