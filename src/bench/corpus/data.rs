//! The rows of a generated [`Schema`], set-based: one `INSERT … SELECT … FROM unnest(…) CROSS JOIN
//! LATERAL generate_series(1, rows)` per table, whose bind parameters are per-tenant arrays (the
//! block's offset and rows, and for each foreign key the referenced table's block of the same tenant
//! and of the next tenant). A row's key is computed from its table's salt and ordinal, and so is the
//! key it references: no join, no row built in Rust.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::ddl;
use super::schema::{ForeignKey, KeyType, PAYLOAD, PrimaryKey, Schema, Spread, Table};
use deprov::sql::{SqlBuilder, Statement};

/// One table's `INSERT` and its bind parameters (`bigint[]` each, one element per tenant).
#[derive(Debug, Clone)]
pub struct Insert {
    /// The statement.
    pub sql: Statement,
    /// `$1`, `$2`, …: own offset, own rows, tenant ordinal, then per foreign key its referenced
    /// block's offset and rows for the same tenant and for the next tenant.
    pub arrays: Vec<Vec<i64>>,
}

/// How long each phase of [`load`] took.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LoadTimes {
    /// `CREATE SCHEMA`, `CREATE TABLE`, partitions, in s.
    pub tables_s: f64,
    /// The `INSERT`s, in s.
    pub rows_s: f64,
    /// Indexes, foreign keys (validated), row-level security and `ANALYZE`, in s.
    pub constraints_s: f64,
}

impl LoadTimes {
    /// The whole load, in s.
    pub fn total_s(&self) -> f64 {
        self.tables_s + self.rows_s + self.constraints_s
    }
}

/// Appends the key of `table` for the ordinal expression `ordinal` (rendered by the closure).
fn key(b: &mut SqlBuilder, table: &Table, ordinal: &dyn Fn(&mut SqlBuilder)) {
    match table.key {
        KeyType::BigInt => {
            b.sql("(");
            ordinal(b);
            b.sql(")");
        }
        KeyType::Uuid => {
            b.sql("md5('").int(table.salt).sql(":' || (");
            ordinal(b);
            b.sql("))::uuid");
        }
        KeyType::Text => {
            b.sql("('c' || substr(md5('").int(table.salt).sql(":' || (");
            ordinal(b);
            b.sql(")), 1, 24))");
        }
    }
}

/// The unnest column holding parameter `n` (0-based).
fn col(b: &mut SqlBuilder, n: usize) {
    b.sql("b.c").int(n as i64);
}

/// Parameter columns of foreign key `k`: same-tenant offset, rows; next tenant's offset, rows.
fn fk_cols(k: usize) -> [usize; 4] {
    let base = 3 + 4 * k;
    [base, base + 1, base + 2, base + 3]
}

/// The referenced row's number within its block (1-based), for a block of `rows` at column `n`.
fn local(b: &mut SqlBuilder, t: &Table, f: &ForeignKey, n: usize) {
    match f.spread {
        Spread::RoundRobin => {
            b.sql("((g - 1) % ");
            col(b, n);
            b.sql(" + 1)");
        }
        Spread::Grouped => {
            b.sql("((g - 1) * ");
            col(b, n);
            b.sql(" / b.c1 + 1)");
        }
        Spread::Pairs { first_fk } => {
            b.sql("(((g - 1) / ");
            col(b, fk_cols(first_fk)[1]);
            b.sql(") % ");
            col(b, n);
            b.sql(" + 1)");
        }
        Spread::Tree => {
            let _ = t;
            b.sql("((g - 2) / 4 + 1)");
        }
    }
}

/// The `INSERT` of `t` (index `i`) with its parameter arrays.
pub fn insert(schema: &Schema, i: usize) -> Insert {
    let t = &schema.tables[i];
    let arrays = arrays(schema, i);
    let mut b = SqlBuilder::new();
    target_columns(&mut b, schema, t);
    if t.pk != PrimaryKey::Pair {
        key(&mut b, t, &|b| {
            b.sql("b.c0 + g");
        });
        b.sql(", ");
    }
    for (k, f) in t.fks.iter().enumerate() {
        reference(&mut b, schema, t, k, f);
        b.sql(", ");
    }
    if t.bare_tenant_column {
        key(&mut b, schema.root(), &|b| {
            b.sql("b.c2");
        });
        b.sql(", ");
    }
    for &p in &t.payload {
        b.sql(PAYLOAD[p].1).sql(", ");
    }
    b.sql("timestamptz '2024-01-01 00:00:00+00' + (b.c0 + g) * interval '1 second' FROM unnest(");
    b.join(&arrays, ", ", |b, n, _| {
        b.param(n + 1).sql("::bigint[]");
    });
    b.sql(") AS b(");
    b.join(&arrays, ", ", |b, n, _| {
        col_name(b, n);
    });
    b.sql(") CROSS JOIN LATERAL generate_series(1::bigint, b.c1) AS g");
    Insert {
        sql: b.build(),
        arrays,
    }
}

/// The bind parameters of table `i`'s `INSERT` (see [`Insert::arrays`]), one element per tenant.
fn arrays(schema: &Schema, i: usize) -> Vec<Vec<i64>> {
    let t = &schema.tables[i];
    let tenants = schema.tenants.len();
    let offsets: Vec<Vec<i64>> = schema.tables.iter().map(Table::offsets).collect();
    let block = |table: usize, tenant: usize| -> (i64, i64) {
        let p = &schema.tables[table];
        let tenant = if p.is_global() { 0 } else { tenant };
        (offsets[table][tenant], p.rows[tenant])
    };
    let mut arrays = vec![
        offsets[i].clone(),
        t.rows.clone(),
        schema.tenants.iter().map(|x| x.ordinal).collect(),
    ];
    for f in &t.fks {
        let mut cols = [vec![], vec![], vec![], vec![]];
        for tenant in 0..tenants {
            let (off, rows) = block(f.parent, tenant);
            let (xoff, xrows) = block(f.parent, (tenant + 1) % tenants);
            cols[0].push(off);
            cols[1].push(rows);
            cols[2].push(xoff);
            cols[3].push(xrows);
        }
        arrays.extend(cols);
    }
    arrays
}

/// Appends `INSERT INTO <t> (<columns>, created_at) SELECT `: the key, the foreign keys, the bare
/// tenant column, the payload.
fn target_columns(b: &mut SqlBuilder, schema: &Schema, t: &Table) {
    b.sql("INSERT INTO ").table(&t.qualified()).sql(" (");
    let mut names: Vec<&str> = Vec::new();
    if t.pk != PrimaryKey::Pair {
        names.push("id");
    }
    names.extend(t.fks.iter().map(|f| f.column.as_str()));
    if t.bare_tenant_column {
        names.push(&schema.tenant_column);
    }
    b.join(&names, ", ", |b, _, n| {
        b.ident(n);
    });
    for &p in &t.payload {
        b.sql(", ")
            .sql(PAYLOAD[p].0.split(' ').next().unwrap_or("title"));
    }
    b.sql(", created_at) SELECT ");
}

/// Appends the value of `t`'s foreign key `f` (number `k`): the referenced row's key in the same
/// tenant's block (some rows of a cross-tenant key: the next tenant's), NULL on the rows it skips.
fn reference(b: &mut SqlBuilder, schema: &Schema, t: &Table, k: usize, f: &ForeignKey) {
    let [off, rows, xoff, xrows] = fk_cols(k);
    let parent = &schema.tables[f.parent];
    let same = |b: &mut SqlBuilder| {
        col(b, off);
        b.sql(" + ");
        local(b, t, f, rows);
    };
    let next = |b: &mut SqlBuilder| {
        col(b, xoff);
        b.sql(" + ");
        local(b, t, f, xrows);
    };
    let guarded = f.every > 1 || f.spread == Spread::Tree;
    if guarded {
        b.sql("CASE WHEN ");
        if f.spread == Spread::Tree {
            b.sql("g >= 2");
        } else {
            b.sql("g % ").int(f.every).sql(" = 0");
        }
        b.sql(" THEN ");
    }
    if f.cross_tenant {
        b.sql("CASE WHEN g % 7 = 3 THEN ");
        key(b, parent, &next);
        b.sql(" ELSE ");
        key(b, parent, &same);
        b.sql(" END");
    } else {
        key(b, parent, &same);
    }
    if guarded {
        b.sql(" END");
    }
}

fn col_name(b: &mut SqlBuilder, n: usize) {
    b.sql("c").int(n as i64);
}

/// Every table's `INSERT`, in table order (the data needs no order: foreign keys come after).
pub fn inserts(schema: &Schema) -> Vec<Insert> {
    (0..schema.tables.len())
        .map(|i| insert(schema, i))
        .collect()
}

/// Creates the schema in the database of `pool` and loads its rows: [`ddl::tables`], the
/// [`inserts`], then [`ddl::constraints`] (foreign keys validated against the rows). Returns each
/// phase's time.
///
/// # Errors
/// The first statement PostgreSQL refuses.
pub async fn load(pool: &PgPool, schema: &Schema) -> Result<LoadTimes, sqlx::Error> {
    let mut times = LoadTimes::default();
    let start = Instant::now();
    for stmt in ddl::tables(schema) {
        deprov::db::query(stmt.as_query()).execute(pool).await?;
    }
    times.tables_s = lap(start);
    let start = Instant::now();
    for ins in inserts(schema) {
        let mut q = deprov::db::query(ins.sql.as_query());
        for a in ins.arrays {
            q = q.bind(a);
        }
        q.execute(pool).await?;
    }
    times.rows_s = lap(start);
    let start = Instant::now();
    for stmt in ddl::constraints(schema) {
        deprov::db::query(stmt.as_query()).execute(pool).await?;
    }
    times.constraints_s = lap(start);
    Ok(times)
}

fn lap(start: Instant) -> f64 {
    Duration::as_secs_f64(&start.elapsed())
}
