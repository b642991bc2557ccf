//! The data generator: 2–5 tenants and, per table, 0–40 rows per tenant (≤ ~2k rows per case).
//!
//! Rows are generated table by table in creation order, so every foreign key value names a row that
//! exists (constraints are added after loading). A row mostly references rows of its own tenant, but
//! 15% of references cross to another tenant's rows (the case where a cascade reaches, nulls or is
//! blocked by other tenants' data), some nullable references are NULL, self-references build trees
//! of random depth, and cycle columns are filled last. Integer ids restart at 1 in every table, so a
//! join on the wrong column finds rows.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;

use crate::model::{Action, Case, ForeignKey, Partitioning, Table, Ty};

const TEXT_TENANTS: &[&str] = &[
    "acme",
    "Ünï cödé",
    "a\"b",
    "o'neil",
    " spaced ",
    "",
    "ZZ",
    "a,b",
    "{x}",
    "NULL",
];
const TEXT_PREFIXES: &[&str] = &["k", "K ", "é\"", "a'b ", "{", ""];

/// Most rows a case holds; later tables get fewer rows once it is reached.
const MAX_ROWS: usize = 2000;

fn value(rng: &mut StdRng, ty: Ty, counter: usize) -> String {
    match ty {
        Ty::Int => counter.to_string(),
        Ty::Uuid => uuid::Uuid::from_u128(rng.random()).to_string(),
        Ty::Text => format!("{}{counter}", TEXT_PREFIXES.choose(rng).unwrap()),
        Ty::Time => unreachable!("no generated timestamps"),
    }
}

/// Fills `case` with tenants, rows, partition bounds and `SET DEFAULT` defaults.
pub fn fill(case: &mut Case, rng: &mut StdRng) {
    let key_ty = case.root().columns[case.root_key].ty;
    let n = rng.random_range(2..=5);
    while case.tenants.len() < n {
        let v = match key_ty {
            Ty::Int => rng.random_range(-50i64..1000).to_string(),
            Ty::Text => TEXT_TENANTS.choose(rng).unwrap().to_string(),
            _ => uuid::Uuid::from_u128(rng.random()).to_string(),
        };
        if !case.tenants.contains(&v) {
            case.tenants.push(v);
        }
    }
    case.victim = rng.random_range(0..n);
    let tenants = case.tenants.clone();
    let root = &mut case.tables[0];
    for (i, t) in tenants.iter().enumerate() {
        root.rows.push(vec![Some(t.clone()), None]);
        root.row_tenant.push(i);
    }
    for i in 1..case.tables.len() {
        let max = *[0, 2, 8, 25, 40].choose(rng).unwrap();
        let mut table = std::mem::replace(&mut case.tables[i], Table::new(String::new()));
        let step = rng.random_range(1..4);
        let mut counter = 0;
        for tenant in 0..n {
            for _ in 0..rng.random_range(0..=max) {
                if case.total_rows() + table.rows.len() >= MAX_ROWS {
                    break;
                }
                counter += step;
                if let Some(row) = row(rng, &case.tables, &table, i, tenant, counter) {
                    table.rows.push(row);
                    table.row_tenant.push(tenant);
                }
            }
        }
        if let Some(Partitioning::List { groups, .. }) = &mut table.partition {
            // One or two listed groups of tenant keys; the others go to the DEFAULT partition.
            let keys: Vec<i64> = tenants.iter().map(|t| t.parse().unwrap()).collect();
            let split = rng.random_range(1..=keys.len());
            groups.push(keys[..split.min(2)].to_vec());
            if split > 2 {
                groups.push(keys[2..split].to_vec());
            }
        }
        case.tables[i] = table;
    }
    back_edges(case, rng);
    defaults(case, rng);
}

/// One row of table `i` for `tenant`; `None` when a NOT NULL reference finds no parent row.
fn row(
    rng: &mut StdRng,
    tables: &[Table],
    table: &Table,
    i: usize,
    tenant: usize,
    counter: usize,
) -> Option<Vec<Option<String>>> {
    let mut vals: Vec<Option<Option<String>>> = vec![None; table.columns.len()];
    for &g in &table.generated {
        let nullable = !table.columns[g].not_null && !table.pk.iter().flatten().any(|&c| c == g);
        vals[g] = Some(if nullable && rng.random_bool(0.2) {
            None
        } else {
            Some(value(rng, table.columns[g].ty, counter))
        });
    }
    for fk in table.fks.iter().filter(|f| !f.back_edge) {
        let parent = if fk.parent == i {
            table
        } else {
            &tables[fk.parent]
        };
        if !reference(rng, &mut vals, table, fk, parent, tenant) {
            return None;
        }
    }
    Some(vals.into_iter().map(Option::flatten).collect())
}

/// Assigns the columns of `fk` in `vals` (some may already be set through a shared column): a parent
/// row's key matching the set ones, preferring `tenant`'s rows, or NULLs where allowed. False when a
/// NOT NULL column cannot be filled.
fn reference(
    rng: &mut StdRng,
    vals: &mut [Option<Option<String>>],
    table: &Table,
    fk: &ForeignKey,
    parent: &Table,
    tenant: usize,
) -> bool {
    let open: Vec<usize> = (0..fk.cols.len())
        .filter(|&j| vals[fk.cols[j]].is_none())
        .collect();
    if open.is_empty() {
        return true; // every column shared and already set (only ever the tenant column here)
    }
    let nullable = open.iter().all(|&j| !table.columns[fk.cols[j]].not_null);
    let null_set = (0..fk.cols.len()).any(|j| matches!(vals[fk.cols[j]], Some(None)));
    let matches = |r: &Vec<Option<String>>| {
        (0..fk.cols.len()).all(|j| match (&vals[fk.cols[j]], &r[fk.parent_cols[j]]) {
            (_, None) => false,
            (Some(Some(v)), Some(p)) => v == p,
            _ => true,
        })
    };
    let candidates: Vec<usize> = (0..parent.rows.len())
        .filter(|&r| null_set || matches(&parent.rows[r]))
        .collect();
    let own: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|&r| parent.row_tenant[r] == tenant)
        .collect();
    let pool = if own.is_empty() || rng.random_bool(0.15) {
        &candidates
    } else {
        &own
    };
    match pool.choose(rng) {
        Some(&r) if !(nullable && rng.random_bool(0.2)) => {
            for &j in &open {
                vals[fk.cols[j]] = Some(parent.rows[r][fk.parent_cols[j]].clone());
            }
            true
        }
        _ if nullable => {
            for &j in &open {
                vals[fk.cols[j]] = Some(None);
            }
            true
        }
        _ => false,
    }
}

/// Fills cycle columns (references to later tables), 60% of them.
fn back_edges(case: &mut Case, rng: &mut StdRng) {
    for i in 1..case.tables.len() {
        let fks: Vec<ForeignKey> = case.tables[i]
            .fks
            .iter()
            .filter(|f| f.back_edge)
            .cloned()
            .collect();
        for fk in fks {
            let parent = case.tables[fk.parent].clone();
            let table = &mut case.tables[i];
            for r in 0..table.rows.len() {
                if parent.rows.is_empty() || !rng.random_bool(0.6) {
                    continue;
                }
                let mut vals: Vec<Option<Option<String>>> =
                    table.rows[r].iter().map(|v| Some(v.clone())).collect();
                for &c in &fk.cols {
                    vals[c] = None;
                }
                let tenant = table.row_tenant[r];
                if reference(rng, &mut vals, table, &fk, &parent, tenant) {
                    table.rows[r] = vals.into_iter().map(Option::flatten).collect();
                }
            }
        }
    }
}

/// `SET DEFAULT` columns default to an existing parent key (any tenant's, the deleted one's included),
/// to NULL, or to a key that does not exist (then the cascade fails once it applies the default).
fn defaults(case: &mut Case, rng: &mut StdRng) {
    for i in 1..case.tables.len() {
        for f in 0..case.tables[i].fks.len() {
            let fk = case.tables[i].fks[f].clone();
            if fk.action != Action::SetDefault {
                continue;
            }
            let keys: Vec<i64> = case.tables[fk.parent]
                .rows
                .iter()
                .filter_map(|r| r[fk.parent_cols[0]].as_deref()?.parse().ok())
                .collect();
            let default = match rng.random_range(0..4) {
                0 | 1 => keys.choose(rng).copied(),
                2 => None,
                _ => Some(-7777),
            };
            case.tables[i].columns[fk.cols[0]].default = default;
        }
    }
}
