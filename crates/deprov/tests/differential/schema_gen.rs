//! The schema generator: a root table keyed by bigint, uuid or text, and 3–10 tables below it.
//!
//! Every shape a tenant's data takes in real applications is drawn at random, so the planner meets
//! it on a graph it was not written for: multi-level cascade chains, tables with two parents,
//! composite keys whose tenant column is shared by several foreign keys (`(tenant, parent_id) →
//! parent(tenant, id)`), references to a non-primary UNIQUE column, self-references (trees), cycles
//! through nullable columns to a later table, tables without a primary key, a partitioned table (hash,
//! or list on a bigint tenant column), all five `ON DELETE` actions (plus `SET NULL (cols)`),
//! `DEFERRABLE` keys, and names that need quoting (mixed case, spaces, quotes, dots, reserved words).

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};

use crate::model::{Action, Case, Deferral, ForeignKey, Partitioning, Table, Ty};

const SCHEMAS: &[&str] = &["app", "Tenant \"Data\"", "public", "my.app"];
const ROOTS: &[&str] = &["accounts", "User", "order", "Tenants \"X\"", "org.units"];
const TABLES: &[&str] = &[
    "projects",
    "order",
    "user",
    "Line Items",
    "a\"quoted\"",
    "select",
    "Group",
    "deploy-ments",
    "ünïcode",
    "x.y",
    "events",
    "blobs",
    "env vars",
    "where",
    "\"lead",
    "trail ",
    "Folders",
    "check",
];
const TENANT_COLS: &[&str] = &["tenant_id", "Account Id", "user", "order", "owner\"id"];
const ID_COLS: &[&str] = &["id", "ID", "Key", "pk col", "select"];
const ROOT_KEYS: &[&str] = &["id", "Key", "tenant key", "\"k\""];

/// Seeds from here on generate tables with two references to themselves more often (seeds below
/// keep the shapes they always had, so the regression list stays meaningful).
pub const TWO_SELF_REFS_FROM: u64 = 1_000_000;

fn pick<'a>(rng: &mut StdRng, items: &'a [&'a str]) -> &'a str {
    items.choose(rng).expect("non-empty")
}

fn key_ty(rng: &mut StdRng) -> Ty {
    *[Ty::Int, Ty::Int, Ty::Uuid, Ty::Text].choose(rng).unwrap()
}

/// An action for a new foreign key: mostly CASCADE, as in applications; SET DEFAULT only on a single
/// bigint column (defaults are integers).
fn action(rng: &mut StdRng, int_single: bool) -> Action {
    let roll = rng.random_range(0..100);
    match roll {
        0..68 => Action::Cascade,
        68..78 => Action::SetNull,
        78..83 => Action::SetNullCols,
        83..88 if int_single => Action::SetDefault,
        83..88 => Action::SetNull,
        88..94 => Action::NoAction,
        _ => Action::Restrict,
    }
}

/// Odds that a new referencing column is NOT NULL: rarely when the action writes NULLs or defaults
/// into it (then the cascade fails as soon as it applies the action to a surviving row).
fn not_null_odds(action: Action) -> f64 {
    match action {
        Action::SetNull | Action::SetNullCols | Action::SetDefault => 0.05,
        _ => 0.4,
    }
}

fn deferral(rng: &mut StdRng) -> Deferral {
    match rng.random_range(0..10) {
        0 => Deferral::Immediate,
        1 => Deferral::Deferred,
        _ => Deferral::NotDeferrable,
    }
}

/// Generates the schema of case `seed` (no rows yet).
pub fn schema(seed: u64, rng: &mut StdRng) -> Case {
    let mut root = Table::new(pick(rng, ROOTS).into());
    let root_ty = key_ty(rng);
    let root_key = root.add_column(pick(rng, ROOT_KEYS).into(), root_ty, true);
    root.add_column("deleted_at".into(), Ty::Time, false);
    root.pk = Some(vec![root_key]);
    let mut names: Vec<&str> = TABLES.iter().copied().filter(|&t| t != root.name).collect();
    names.shuffle(rng);
    let n = rng.random_range(3..=10);
    let mut tables = vec![root];
    let mut partitioned = false;
    for i in 1..=n {
        let two_self = seed >= TWO_SELF_REFS_FROM;
        let t = table(
            rng,
            &tables,
            i,
            names[i - 1],
            root_ty,
            &mut partitioned,
            two_self,
        );
        tables.push(t);
    }
    // Cycles: a nullable reference from an earlier table to a later one.
    for c in 0..rng.random_range(0..=2) {
        let from = rng.random_range(1..tables.len());
        let to = rng.random_range(1..tables.len());
        let keys = tables[to].keys();
        let Some(key) = keys.choose(rng).cloned() else {
            continue;
        };
        if from >= to {
            continue;
        }
        let mut cols = Vec::new();
        for &k in &key {
            let (name, ty) = (
                format!("{} cyc {k}", tables[to].name),
                tables[to].columns[k].ty,
            );
            cols.push(tables[from].add_column(name, ty, false));
        }
        let act = if rng.random_bool(0.5) {
            Action::Cascade
        } else {
            Action::SetNull
        };
        let fk_name = format!("cycle {c}: {from}->{to}");
        tables[from].fks.push(ForeignKey {
            name: fk_name,
            cols,
            parent: to,
            parent_cols: key,
            action: act,
            deferral: deferral(rng),
            back_edge: true,
        });
    }
    Case {
        seed,
        schema: pick(rng, SCHEMAS).into(),
        tables,
        root_key,
        tenants: Vec::new(),
        victim: 0,
        batch_rows: rng.random_range(1..=7),
    }
}

/// Table `i`: maybe a tenant column (→ root), a key, maybe a unique code, 0–2 parents, maybe one
/// or two self-references, maybe partitioned.
fn table(
    rng: &mut StdRng,
    earlier: &[Table],
    i: usize,
    name: &str,
    root_ty: Ty,
    partitioned: &mut bool,
    two_self: bool,
) -> Table {
    let mut t = Table::new(name.into());
    t.index_fks = rng.random_bool(0.7);
    let tenant = rng.random_bool(0.65).then(|| {
        // Mostly CASCADE: a RESTRICT here blocks every tenant with rows in the table.
        let act = match action(rng, root_ty == Ty::Int) {
            _ if rng.random_bool(0.7) => Action::Cascade,
            Action::SetNullCols => Action::SetNull,
            a => a,
        };
        let not_null = rng.random_bool(not_null_odds(act));
        let c = t.add_column(pick(rng, TENANT_COLS).into(), root_ty, not_null);
        t.fks.push(ForeignKey {
            name: format!("fk tenant {i}"),
            cols: vec![c],
            parent: 0,
            parent_cols: vec![0],
            action: act,
            deferral: deferral(rng),
            back_edge: false,
        });
        (c, not_null)
    });
    let kind = rng.random_range(0..10);
    let id_ty = key_ty(rng);
    if kind < 8 {
        let id = t.add_column(pick(rng, ID_COLS).into(), id_ty, true);
        t.generated.push(id);
        match tenant {
            Some((c, true)) if kind >= 4 => {
                t.pk = Some(vec![c, id]);
                if !*partitioned && rng.random_bool(0.5) {
                    *partitioned = true;
                    t.partition = Some(if root_ty == Ty::Int && rng.random_bool(0.5) {
                        Partitioning::List {
                            col: c,
                            groups: Vec::new(),
                        }
                    } else {
                        Partitioning::Hash {
                            col: c,
                            modulus: rng.random_range(2..=4),
                        }
                    });
                }
            }
            _ => t.pk = Some(vec![id]),
        }
    } // else: no primary key
    if t.partition.is_none() && rng.random_bool(0.3) {
        let code = t.add_column("Unique Code".into(), key_ty(rng), rng.random_bool(0.5));
        t.generated.push(code);
        t.uniques.push(vec![code]);
    }
    let parents = rng.random_range(usize::from(tenant.is_none())..=2);
    for p in 0..parents {
        let parent = rng.random_range(0..i);
        parent_fk(rng, &mut t, earlier, parent, tenant, format!("fk {i}.{p}"));
    }
    if t.columns.is_empty() {
        t.add_column("payload".into(), Ty::Int, false); // no key, no reference: still a table
    }
    if t.pk.is_some() && rng.random_bool(if two_self { 0.5 } else { 0.25 }) {
        let own = Table {
            rows: Vec::new(),
            ..t.clone()
        };
        let mut all: Vec<Table> = earlier.to_vec();
        all.push(own);
        parent_fk(rng, &mut t, &all, i, tenant, format!("fk {i} self"));
        // From seed TWO_SELF_REFS_FROM on (earlier seeds keep their shapes), often a second
        // reference to itself: a tree with a NO ACTION "see also" link, or two held references.
        if two_self && rng.random_bool(0.8) {
            let own = Table {
                rows: Vec::new(),
                ..t.clone()
            };
            all.pop();
            all.push(own);
            parent_fk(rng, &mut t, &all, i, tenant, format!("fk {i} self2"));
        }
    }
    t
}

/// A foreign key from `t` to a key of `tables[parent]`. When that key starts with the parent's own
/// tenant column and `t` has one, the tenant column is usually shared (the composite-key pattern).
fn parent_fk(
    rng: &mut StdRng,
    t: &mut Table,
    tables: &[Table],
    parent: usize,
    tenant: Option<(usize, bool)>,
    name: String,
) {
    let p = &tables[parent];
    let keys = p.keys();
    let Some(key) = keys.choose(rng).cloned() else {
        return;
    };
    let parent_tenant = p.fks.iter().find(|f| f.parent == 0).map(|f| f.cols[0]);
    let share = match tenant {
        Some((c, _)) if key.len() > 1 && parent_tenant == Some(key[0]) && rng.random_bool(0.8) => {
            Some(c)
        }
        _ => None,
    };
    let int_single = key.len() == 1 && p.columns[key[0]].ty == Ty::Int;
    let mut act = action(rng, int_single);
    if act == Action::SetNullCols && share.is_none() {
        act = Action::SetNull;
    }
    if act == Action::SetNull && share.is_some() && rng.random_bool(0.8) {
        act = Action::SetNullCols; // SET NULL would null the shared NOT NULL tenant column
    }
    let not_null = rng.random_bool(not_null_odds(act));
    let mut cols = Vec::new();
    for (j, &k) in key.iter().enumerate() {
        match share {
            Some(c) if j == 0 => cols.push(c),
            _ => {
                let col_name = format!("{} {}", p.name, p.columns[k].name);
                cols.push(t.add_column(col_name, p.columns[k].ty, not_null));
            }
        }
    }
    t.fks.push(ForeignKey {
        name,
        cols,
        parent,
        parent_cols: key,
        action: act,
        deferral: deferral(rng),
        back_edge: false,
    });
}
