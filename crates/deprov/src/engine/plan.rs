//! The planner: from the catalog's foreign-key graph to an ordered list of deletion steps.
//!
//! The tenant's rows are exactly what `DELETE FROM root WHERE key = $1` would remove: the root row and,
//! transitively, every row referencing a removed row through an `ON DELETE CASCADE` foreign key
//! (PostgreSQL docs §5.4.5 "Foreign Keys"). The planner finds the tables that can hold such rows (the
//! *closure*), and for each a *path*: the chain of cascading foreign keys from the table up to the root,
//! through which its tenant rows are found. A table with several cascading parents gets one step per
//! parent, so rows reachable through any parent are deleted.
//!
//! Steps are ordered leaves first (a depth-first post-order over "is referenced by" edges between
//! closure tables, whatever their action; a cycle is broken at a SET NULL key into nullable columns
//! where it has one), so when a step deletes a batch, the rows below it are
//! already gone and PostgreSQL's own cascade has nothing left to do but SET NULL / SET DEFAULT side
//! effects — which it applies exactly as the cascade would, because deprov deletes with plain `DELETE`s.
//! The last step deletes the root row itself: a real cascade over whatever is left, normally nothing.
//!
//! RESTRICT / NO ACTION references into the closure are *blockers*: if a row outside the tenant
//! references a tenant row, the cascade would fail, so the job fails before any destructive statement.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use sha2::{Digest, Sha256};

use super::catalog::{Catalog, ForeignKey, OnDelete};
use crate::sql::{QualifiedName, SqlType};

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// `tenant.root_table` is not in the target database.
    #[error("root table {0} not found in the target database")]
    NoRoot(QualifiedName),
    /// `tenant.key_column` is not a column of the root table.
    #[error("key column {column:?} not found in {table}")]
    NoKeyColumn {
        /// The root table.
        table: QualifiedName,
        /// The configured column.
        column: String,
    },
}

/// One deletion step: the tenant rows of `table` found through `path`.
#[derive(Debug, Clone)]
pub struct Step {
    /// The table (oid) whose rows this step deletes.
    pub table: u32,
    /// Indexes into [`Catalog::foreign_keys`]: the first hop leaves `table`, the last reaches the
    /// root. Empty for the root step.
    pub path: Vec<usize>,
}

/// The plan for one tenant root, shared by `deprov plan` and the engine.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The catalog the plan was made from.
    pub catalog: Catalog,
    /// Root table oid.
    pub root: u32,
    /// Root key column and its type (`$1` is cast to it).
    pub key_column: String,
    /// Type of the key column.
    pub key_type: SqlType,
    /// Tables that can hold tenant rows.
    pub closure: BTreeSet<u32>,
    /// Steps, leaves first; the last is the root row.
    pub steps: Vec<Step>,
    /// Foreign keys into the closure whose referencing rows outside the tenant make the cascade fail:
    /// RESTRICT, NO ACTION, SET NULL into a NOT NULL column (indexes into `catalog.foreign_keys`).
    pub blockers: Vec<usize>,
    /// SET NULL / SET DEFAULT foreign keys into the closure: PostgreSQL applies them as rows go.
    pub side_effects: Vec<usize>,
    /// Foreign keys into the closure whose referencing columns have no index.
    pub unindexed: Vec<usize>,
    /// Shortest cascading path of each closure table to the root.
    pub tree_paths: BTreeMap<u32, Vec<usize>>,
    /// Tables without steps: PostgreSQL's cascade deletes their rows under their parents' batches
    /// (empty unless [`Plan::absorb`] was applied).
    pub absorbed: BTreeSet<u32>,
    /// Tables whose only steps are those through a NOT NULL foreign key straight to the root: that
    /// step finds every tenant row the table's keys to the root name. A row reached only through
    /// another path (one naming another tenant, or none) is deleted by PostgreSQL's cascade under
    /// the batches of its parent on that path (empty unless [`Plan::absorb`] was applied; see
    /// [`super::absorb`]).
    pub covered: BTreeSet<u32>,
    /// Estimated rows one row of a table deletes with the cascade to its absorbed descendants, for
    /// tables that have some (itself included; see [`Plan::first_batch_rows`]).
    pub cascade_estimate: BTreeMap<u32, f64>,
    /// Tables of a foreign-key cycle with an order-sensitive key that the cascade deletes under the
    /// cycle's entry table: they have no steps, whatever [`Plan::absorb`] decides
    /// ([`super::cycles`]). Also in `absorbed`.
    pub cycle_absorbed: BTreeSet<u32>,
    /// Order-sensitive keys (RESTRICT, NO ACTION, SET NULL into NOT NULL, SET DEFAULT) on foreign-key
    /// cycles the leaves-first order cannot honour (indexes into `catalog.foreign_keys`;
    /// [`super::cycles`]): a tenant of such a plan is deleted only by one bounded cascade.
    pub unordered: Vec<usize>,
    /// When the plan was made for one tenant ([`Plan::absorb_tenant`]): the most rows it holds per
    /// table straight under the root, by the planner's statistics and the rows written since
    /// ([`super::estimate::DirectRows::at_most`]). Empty otherwise.
    pub tenant_rows: BTreeMap<u32, i64>,
}

impl Plan {
    /// Plans deletion below `root` keyed by `key_column`.
    ///
    /// # Errors
    /// [`PlanError`] when the root table or key column does not exist.
    pub fn new(
        catalog: Catalog,
        root: &QualifiedName,
        key_column: &str,
    ) -> Result<Self, PlanError> {
        let root_oid = catalog
            .find(root)
            .ok_or_else(|| PlanError::NoRoot(root.clone()))?;
        let key_type = catalog.tables[&root_oid]
            .columns
            .get(key_column)
            .cloned()
            .ok_or_else(|| PlanError::NoKeyColumn {
                table: root.clone(),
                column: key_column.into(),
            })?;
        let fks = &catalog.foreign_keys;

        let tree_paths = shortest_paths(fks, root_oid);
        let closure: BTreeSet<u32> = tree_paths.keys().copied().collect();

        let steps = leaves_first_steps(&catalog, &closure, &tree_paths, root_oid);

        let into_closure = |pred: &dyn Fn(OnDelete) -> bool| -> Vec<usize> {
            fks.iter()
                .enumerate()
                .filter(|(_, fk)| closure.contains(&fk.to) && pred(fk.on_delete))
                .map(|(i, _)| i)
                .collect()
        };
        let blockers: Vec<usize> = fks
            .iter()
            .enumerate()
            .filter(|(_, fk)| closure.contains(&fk.to) && fk.blocks())
            .map(|(i, _)| i)
            .collect();
        let side_effects = into_closure(&|a| matches!(a, OnDelete::SetNull | OnDelete::SetDefault));
        let unindexed = fks
            .iter()
            .enumerate()
            .filter(|(_, fk)| closure.contains(&fk.to) && !fk.indexed)
            .map(|(i, _)| i)
            .collect();
        let mut plan = Self {
            root: root_oid,
            key_column: key_column.into(),
            key_type,
            closure,
            steps,
            blockers,
            side_effects,
            unindexed,
            tree_paths,
            absorbed: BTreeSet::new(),
            covered: BTreeSet::new(),
            cascade_estimate: BTreeMap::new(),
            cycle_absorbed: BTreeSet::new(),
            unordered: Vec::new(),
            tenant_rows: BTreeMap::new(),
            catalog,
        };
        let order: Vec<u32> = plan.steps.iter().map(|s| s.table).collect();
        let cycles = super::cycles::cycle_shapes(&super::cycles::Graph {
            fks: &plan.catalog.foreign_keys,
            closure: &plan.closure,
            root: plan.root,
            order: &order,
        });
        plan.steps.retain(|s| !cycles.absorbed.contains(&s.table));
        plan.absorbed = cycles.absorbed.clone();
        plan.cycle_absorbed = cycles.absorbed;
        plan.unordered = cycles.unordered;
        plan.order_table_steps();
        Ok(plan)
    }

    /// Orders each table's steps. Block-range steps go first: one reads the whole table once
    /// whatever runs before it, so running it first lets it delete the rows in table order, and
    /// the table's index-driven steps find only what it could not reach. A tree's steps go
    /// shortest path first: its children go in descending key order *within each parent*
    /// ([`super::queries`]), so only a step under one parent row (its key straight to the root)
    /// walks the whole tree leaves first; a step under another table's rows meets a node before
    /// its descendants that hang under other parents, and PostgreSQL's cascade deletes all of
    /// them under that one row's delete, past any batch bound. Correctness does not depend on the
    /// order of one table's steps: each deletes the table's rows found through its own path, and
    /// the table's children are already empty.
    fn order_table_steps(&mut self) {
        let mut ordered = Vec::with_capacity(self.steps.len());
        let mut rest = std::mem::take(&mut self.steps).into_iter().peekable();
        while let Some(first) = rest.next() {
            let mut group = vec![first];
            while let Some(next) = rest.next_if(|s| s.table == group[0].table) {
                group.push(next);
            }
            let tree = self.is_tree(group[0].table);
            group.sort_by_key(|s| (!self.block_step(s), if tree { s.path.len() } else { 0 }));
            ordered.extend(group);
        }
        self.steps = ordered;
    }

    /// The qualified name of a table oid in this plan.
    pub fn name(&self, oid: u32) -> &QualifiedName {
        &self.catalog.tables[&oid].name
    }

    /// Whether a table oid in this plan is partitioned (`relkind = 'p'`): statements name it
    /// without `ONLY` ([`crate::sql::SqlBuilder::relation`]).
    pub fn partitioned(&self, oid: u32) -> bool {
        self.catalog.tables[&oid].partitioned
    }

    /// Whether `table` has an `ON DELETE CASCADE` foreign key to itself (a tree).
    pub fn is_tree(&self, table: u32) -> bool {
        self.catalog
            .foreign_keys
            .iter()
            .any(|fk| fk.from == table && fk.to == table && fk.on_delete == OnDelete::Cascade)
    }

    /// `table`'s foreign keys to itself whose action is not CASCADE (indexes into
    /// `catalog.foreign_keys`). The cascade deletes a tenant's rows of such a table together, so the
    /// action never touches them; deleting a referenced row in an earlier batch than its referencing
    /// row would apply it (set a default that may not exist, a NULL into NOT NULL, or fail a
    /// RESTRICT). A batch therefore keeps back rows still referenced through them (see
    /// [`super::queries::batch`]). The worker passes over the table's steps again while a pass
    /// deletes something and sweeps what is left in one statement ([`super::queries::sweep`]),
    /// before any parent's cascade can reach a kept-back row.
    pub fn held_self_refs(&self, table: u32) -> Vec<usize> {
        self.self_refs(table)
            .into_iter()
            .filter(|&i| self.catalog.foreign_keys[i].on_delete != OnDelete::Cascade)
            .collect()
    }

    /// `table`'s foreign keys to itself, any action (indexes into `catalog.foreign_keys`).
    pub fn self_refs(&self, table: u32) -> Vec<usize> {
        self.catalog
            .foreign_keys
            .iter()
            .enumerate()
            .filter(|(_, fk)| fk.from == table && fk.to == table)
            .map(|(i, _)| i)
            .collect()
    }

    /// Whether a batch that continues inside one parent ([`super::queries::Cursor::Within`]) runs
    /// as a key range ([`super::queries::range_bound`], [`super::queries::range_delete`]): the
    /// step has a parent, the table a primary key, children go in ascending key order (not a tree)
    /// and none are kept back (no non-CASCADE reference to itself).
    /// A step whose children go unordered inside a parent ([`Self::unordered_children`]) has no
    /// key range to continue.
    pub fn range_step(&self, step: &Step) -> bool {
        !step.path.is_empty()
            && matches!(
                self.catalog.tables[&step.table].key,
                super::catalog::RowKey::Columns(_)
            )
            && !self.is_tree(step.table)
            && self.held_self_refs(step.table).is_empty()
            && !self.unordered_children(step)
    }

    /// Whether a step's batches take a parent's children with no order inside the parent (the
    /// batch keeps `(parent, key)` order across parents, [`super::queries::batch`]). Never in a
    /// tree or a table with rows kept back (their children go in descending key order, and not
    /// every selected row is deleted); else in two children tables:
    /// - a table without a primary key (keyed by `ctid`): `ORDER BY ctid LIMIT n` over one parent's
    ///   children reads and sorts all of them, every batch, so a batch's time would not depend on
    ///   its size;
    /// - a table whose key does not lead with the foreign key's columns but an index on them
    ///   exists, under parents other than the root row: `fk = p ORDER BY key LIMIT n` lets
    ///   PostgreSQL choose the key's own index in key order, filtering `fk = p` row by row — a walk
    ///   of the whole index for each parent with few children (a join table keyed `(a_id, b_id)`,
    ///   stepped through `b`) — or the foreign key's index and a sort of all the parent's remaining
    ///   children. Without the order, the foreign key's index gives the first `n` at once. The root
    ///   row, the one parent of all the tenant's rows, keeps the key order: there a cursor inside
    ///   the parent spares each batch the dead entries of the batches before it, which at the
    ///   tenant's size would cost more than any sort.
    pub fn unordered_children(&self, step: &Step) -> bool {
        let Some(&first) = step.path.first() else {
            return false;
        };
        if self.is_tree(step.table) || !self.held_self_refs(step.table).is_empty() {
            return false;
        }
        let child = &self.catalog.tables[&step.table];
        if matches!(child.key, super::catalog::RowKey::Ctid) {
            return true;
        }
        let fk = &self.catalog.foreign_keys[first];
        let key_cols: Vec<String> = child.key_columns().into_iter().map(|(c, _)| c).collect();
        fk.indexed
            && super::queries::parent_prefix(&fk.from_cols, &key_cols) == 0
            && step.path.len() > 1
    }

    /// Whether `fk` is a cascading single-column key straight to the root's key column: a key whose
    /// rows naming the tenant the planner's statistics count ([`super::estimate::tenant_rows`]).
    pub fn keys_the_tenant(&self, fk: &ForeignKey) -> bool {
        fk.to == self.root
            && fk.on_delete == OnDelete::Cascade
            && fk.from_cols.len() == 1
            && fk.to_cols == std::slice::from_ref(&self.key_column)
    }

    /// Whether a step's batches are block ranges of its table ([`super::queries::block_batch`]):
    /// the step has a parent, its foreign key to it has no index, and the table is not partitioned,
    /// not a tree, keeps no rows back (no non-CASCADE reference to itself) and is referenced by no
    /// foreign key without an index (deleting one of its rows would scan that referencing table, so
    /// its batches must be able to shrink to one row, not one block's rows).
    pub fn block_step(&self, step: &Step) -> bool {
        step.path
            .first()
            .is_some_and(|&fk| !self.catalog.foreign_keys[fk].indexed)
            && !self.partitioned(step.table)
            && !self.is_tree(step.table)
            && self.held_self_refs(step.table).is_empty()
            && !self
                .catalog
                .foreign_keys
                .iter()
                .any(|fk| fk.to == step.table && !fk.indexed)
    }

    /// Human-readable path of a step: `app.deployments → app.environments → app.accounts`.
    pub fn describe_path(&self, step: &Step) -> String {
        let mut parts = vec![self.name(step.table).to_string()];
        for &h in &step.path {
            parts.push(self.name(self.catalog.foreign_keys[h].to).to_string());
        }
        parts.join(" → ")
    }

    /// Identifies the plan's shape; a checkpoint is only resumed under the plan that wrote it.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.key_type.as_str());
        for s in &self.steps {
            h.update(self.describe_path(s).as_bytes());
            for &p in &s.path {
                h.update(self.catalog.foreign_keys[p].name.as_bytes());
            }
            h.update(b"\n");
        }
        for &t in &self.absorbed {
            h.update(b"absorbed ");
            h.update(self.name(t).to_string().as_bytes());
        }
        for &t in &self.covered {
            h.update(b"covered ");
            h.update(self.name(t).to_string().as_bytes());
        }
        hex::encode(&h.finalize()[..8])
    }
}

/// Most paths enumerated per table; beyond it the table keeps only its shortest path and PostgreSQL's
/// cascade removes rows reachable through the others (still correct, just not leaves-first).
pub const MAX_PATHS: usize = 64;

/// The tenant's closure with each table's shortest path to the root (foreign-key indexes, child to
/// parent): breadth-first over cascading foreign keys from `root_oid`.
fn shortest_paths(fks: &[super::catalog::ForeignKey], root_oid: u32) -> BTreeMap<u32, Vec<usize>> {
    let mut tree_paths: BTreeMap<u32, Vec<usize>> = BTreeMap::from([(root_oid, Vec::new())]);
    let mut queue = VecDeque::from([root_oid]);
    while let Some(parent) = queue.pop_front() {
        for (i, fk) in fks.iter().enumerate() {
            if fk.to == parent
                && fk.on_delete == OnDelete::Cascade
                && !tree_paths.contains_key(&fk.from)
            {
                let mut path = vec![i];
                path.extend(tree_paths[&parent].iter().copied());
                tree_paths.insert(fk.from, path);
                queue.push_back(fk.from);
            }
        }
    }
    tree_paths
}

/// The plan's steps, leaves first (post-order over "is referenced by" edges inside `closure`):
/// one per path from the root to each table (at most `MAX_PATHS`, else its shortest path in
/// `tree_paths`), the root's own step last.
fn leaves_first_steps(
    catalog: &Catalog,
    closure: &BTreeSet<u32>,
    tree_paths: &BTreeMap<u32, Vec<usize>>,
    root_oid: u32,
) -> Vec<Step> {
    // Leaves first: post-order over "is referenced by" edges inside the closure.
    let edges = ordering_keys(catalog, closure);
    let mut order = Vec::new();
    let mut visited = BTreeSet::new();
    post_order(catalog, &edges, root_oid, &mut visited, &mut order);

    let mut steps = Vec::new();
    for &table in &order {
        if table != root_oid {
            let mut paths = Vec::new();
            let mut on_path = BTreeSet::from([table]);
            all_paths(
                catalog,
                closure,
                root_oid,
                table,
                &mut on_path,
                &mut Vec::new(),
                &mut paths,
            );
            if paths.is_empty() {
                paths.push(tree_paths[&table].clone()); // more than MAX_PATHS: the shortest one
            }
            steps.extend(paths.into_iter().map(|path| Step { table, path }));
        }
    }
    steps.push(Step {
        table: root_oid,
        path: Vec::new(),
    });
    steps
}

/// Every simple cascading path from `table` to the root, in foreign-key order (depth-first).
/// Leaves `out` empty when there are more than [`MAX_PATHS`].
fn all_paths(
    catalog: &Catalog,
    closure: &BTreeSet<u32>,
    root: u32,
    table: u32,
    on_path: &mut BTreeSet<u32>,
    prefix: &mut Vec<usize>,
    out: &mut Vec<Vec<usize>>,
) -> bool {
    if table == root {
        out.push(prefix.clone());
        return out.len() <= MAX_PATHS;
    }
    for (i, fk) in catalog.foreign_keys.iter().enumerate() {
        if fk.from != table
            || fk.on_delete != OnDelete::Cascade
            || !closure.contains(&fk.to)
            || on_path.contains(&fk.to)
        {
            continue;
        }
        prefix.push(i);
        on_path.insert(fk.to);
        let fits = all_paths(catalog, closure, root, fk.to, on_path, prefix, out);
        on_path.remove(&fk.to);
        prefix.pop();
        if !fits {
            out.clear();
            return false;
        }
    }
    true
}

/// The foreign keys (indexes into `catalog.foreign_keys`) between two different closure tables that
/// order the steps: every one, whatever its action, except a SET NULL into nullable columns that
/// would close a cycle of the others. Such a key is the one a cycle breaks best: the parent's rows
/// going first only set the child's column to NULL, as the cascade would have, and the child's rows
/// are deleted later anyway; breaking a CASCADE key instead would make each parent row's delete
/// cascade to its whole subtree, and breaking an order-sensitive one may fail
/// ([`super::cycles`]). Keys are taken in catalog order, the others before any such SET NULL.
fn ordering_keys(catalog: &Catalog, closure: &BTreeSet<u32>) -> BTreeSet<usize> {
    let fks = &catalog.foreign_keys;
    let between = |fk: &super::catalog::ForeignKey| {
        fk.from != fk.to && closure.contains(&fk.from) && closure.contains(&fk.to)
    };
    let detaches = |fk: &super::catalog::ForeignKey| {
        fk.on_delete == OnDelete::SetNull && !super::cycles::order_sensitive(fk)
    };
    let mut edges: BTreeSet<usize> = (0..fks.len())
        .filter(|&i| between(&fks[i]) && !detaches(&fks[i]))
        .collect();
    for (i, fk) in fks.iter().enumerate() {
        if between(fk) && detaches(fk) && !references(fks, &edges, fk.to, fk.from) {
            edges.insert(i);
        }
    }
    edges
}

/// Whether rows of `from` can reference rows of `to` through a chain of the keys `edges`.
fn references(
    fks: &[super::catalog::ForeignKey],
    edges: &BTreeSet<usize>,
    from: u32,
    to: u32,
) -> bool {
    let mut seen = BTreeSet::from([from]);
    let mut stack = vec![from];
    while let Some(t) = stack.pop() {
        if t == to {
            return true;
        }
        for &i in edges {
            if fks[i].from == t && seen.insert(fks[i].to) {
                stack.push(fks[i].to);
            }
        }
    }
    false
}

fn post_order(
    catalog: &Catalog,
    edges: &BTreeSet<usize>,
    table: u32,
    visited: &mut BTreeSet<u32>,
    out: &mut Vec<u32>,
) {
    if !visited.insert(table) {
        return;
    }
    for &i in edges {
        let fk = &catalog.foreign_keys[i];
        // CASCADE and RESTRICT / NO ACTION must go child-first, and SET NULL / SET DEFAULT
        // child-first means PostgreSQL has no rows to update.
        if fk.to == table {
            post_order(catalog, edges, fk.from, visited, out);
        }
    }
    out.push(table);
}

impl Plan {
    /// Whether `table` is the entry of a cycle whose other tables its batches delete by cascade
    /// (see the module docs): a batch failing a NO ACTION check (23503) there may succeed as one
    /// statement over all the table's remaining rows.
    pub fn cycle_entry(&self, table: u32) -> bool {
        self.catalog
            .foreign_keys
            .iter()
            .any(|fk| fk.to == table && fk.from != table && self.cycle_absorbed.contains(&fk.from))
    }
}
