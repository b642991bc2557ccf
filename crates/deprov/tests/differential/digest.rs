//! Order-independent table contents: a digest per table of the generated schema, and, for a report,
//! the rows that differ between two databases.

use std::collections::{BTreeMap, BTreeSet};

use deprov::sql::{QualifiedName, SqlBuilder};
use sqlx::PgPool;

/// Table → (rows, md5 over the sorted md5s of its rows as text).
pub type Digest = BTreeMap<QualifiedName, (i64, String)>;

/// Ordinary and partitioned tables of `schema` (partitions included: each is compared too), but not
/// sqlx's migration bookkeeping (`_sqlx_migrations`, created by deprov's migration in `public`).
async fn tables(db: &PgPool, schema: &str) -> Vec<QualifiedName> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname <> '_sqlx_migrations' ORDER BY 1",
    )
    .bind(schema)
    .fetch_all(db)
    .await
    .unwrap();
    names
        .into_iter()
        .map(|n| QualifiedName::new(schema, n))
        .collect()
}

pub async fn digest(db: &PgPool, schema: &str) -> Digest {
    let mut out = Digest::new();
    for table in tables(db, schema).await {
        let mut b = SqlBuilder::new();
        b.sql("SELECT count(*), coalesce(md5(string_agg(md5(t::text), '' ORDER BY md5(t::text))), '') FROM ")
            .table(&table)
            .sql(" t");
        let row: (i64, String) = sqlx::query_as(b.build().as_query())
            .fetch_one(db)
            .await
            .unwrap();
        out.insert(table, row);
    }
    out
}

/// Tables whose digests differ (or exist on one side only).
pub fn differing(a: &Digest, b: &Digest) -> Vec<QualifiedName> {
    a.keys()
        .chain(b.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|t| a.get(*t) != b.get(*t))
        .cloned()
        .collect()
}

async fn rows(db: &PgPool, table: &QualifiedName) -> BTreeSet<String> {
    deprov_demo::table_rows(db, table).await.unwrap_or_default()
}

/// For each differing table: its rows only in `expected` and only in `actual` (at most 12 each).
pub async fn row_diff(expected: &PgPool, actual: &PgPool, tables: &[QualifiedName]) -> String {
    let mut out = String::new();
    for t in tables {
        let (e, a) = (rows(expected, t).await, rows(actual, t).await);
        out.push_str(&format!(
            "  table {t}: expected {} rows, got {}\n",
            e.len(),
            a.len()
        ));
        for r in e.difference(&a).take(12) {
            out.push_str(&format!("    only expected: {r}\n"));
        }
        for r in a.difference(&e).take(12) {
            out.push_str(&format!("    only actual:   {r}\n"));
        }
    }
    out
}
