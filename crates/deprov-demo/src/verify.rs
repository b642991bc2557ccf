//! Checks that a tenant deletion really happened as it should, for the demo, tests and benchmarks.
//!
//! Two independent checks:
//! * equivalence: [`database_digest`] of the database deprov worked on equals that of a copy
//!   ([`clone_database`], taken before the delete) on which [`cascade_delete`] ran the naive cascade;
//! * other tenants unchanged: [`other_tenants_digest`](super::ownership::other_tenants_digest) before and
//!   after the delete are equal.
//!
//! A digest is order-independent: the md5 of the sorted md5s of every row's text form, so it does not
//! depend on physical row order, which differs between a batched and a cascading delete.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use sqlx::{PgPool, Row};

use deprov::sql::{QualifiedName, SqlBuilder, SqlType, Statement};

/// The contents of one table, summarised.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableDigest {
    /// `count(*)` of the rows digested.
    pub rows: i64,
    /// `md5(string_agg(md5(row_text), '' ORDER BY md5(row_text)))`; `md5('')` for no rows.
    pub md5: String,
}

/// Digests of several tables by name.
pub type DatabaseDigest = BTreeMap<QualifiedName, TableDigest>;

/// The ordinary and partitioned tables of `schema`, sorted by name. Partitions are left out: their rows
/// are read through their partitioned parent.
///
/// # Errors
/// Any database error.
pub async fn user_tables(pool: &PgPool, schema: &str) -> Result<Vec<QualifiedName>, sqlx::Error> {
    tables_of(pool, Some(schema)).await
}

/// [`user_tables`] of every schema but PostgreSQL's own (`pg_*`, `information_schema`).
///
/// # Errors
/// Any database error.
pub async fn all_user_tables(pool: &PgPool) -> Result<Vec<QualifiedName>, sqlx::Error> {
    tables_of(pool, None).await
}

/// [`user_tables`] of `schema`, or of every user schema when `None`.
async fn tables_of(pool: &PgPool, schema: Option<&str>) -> Result<Vec<QualifiedName>, sqlx::Error> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
         AND CASE WHEN $1::text IS NULL \
             THEN n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%' \
             ELSE n.nspname = $1 END \
         ORDER BY 1, 2",
    )
    .bind(schema)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(s, n)| QualifiedName::new(s, n))
        .collect())
}

/// `SELECT count(*), digest FROM (inner)`, where `inner` (written by the closure) yields one text
/// column `h` per row.
pub(crate) fn digest_of(inner: impl FnOnce(&mut SqlBuilder)) -> Statement {
    let mut b = SqlBuilder::new();
    b.sql("SELECT count(*)::bigint, coalesce(md5(string_agg(h, '' ORDER BY h)), md5('')) FROM (");
    inner(&mut b);
    b.sql(") AS digest_input");
    b.build()
}

/// Runs a statement built by [`digest_of`], binding `binds` as `$1..` (i64 values).
pub(crate) async fn fetch_digest(
    pool: &PgPool,
    stmt: &Statement,
    binds: &[i64],
) -> Result<TableDigest, sqlx::Error> {
    let mut q = sqlx::query(stmt.as_query());
    for v in binds {
        q = q.bind(*v);
    }
    let row = q.fetch_one(pool).await?;
    Ok(TableDigest {
        rows: row.try_get(0)?,
        md5: row.try_get(1)?,
    })
}

/// An order-independent digest of the full contents of `table` (every column, via the row's text
/// form). Reads the whole table: seconds for millions of rows.
///
/// # Errors
/// Any database error, e.g. the table does not exist.
pub async fn table_digest(
    pool: &PgPool,
    table: &QualifiedName,
) -> Result<TableDigest, sqlx::Error> {
    let stmt = digest_of(|b| {
        b.sql("SELECT md5(")
            .alias(0)
            .sql("::text) AS h FROM ")
            .table(table)
            .sql(" ")
            .alias(0);
    });
    fetch_digest(pool, &stmt, &[]).await
}

/// Every row of `table` in its text form (`t::text`), as a set: to show which rows two copies
/// differ by once their [`table_digest`]s do.
///
/// # Errors
/// Any database error, e.g. the table does not exist.
pub async fn table_rows(
    pool: &PgPool,
    table: &QualifiedName,
) -> Result<BTreeSet<String>, sqlx::Error> {
    let mut b = SqlBuilder::new();
    b.sql("SELECT t::text FROM ").table(table).sql(" t");
    let rows: Vec<String> = sqlx::query_scalar(b.build().as_query())
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().collect())
}

/// [`table_digest`] of every table [`user_tables`] lists in `schema`.
///
/// # Errors
/// Any database error.
pub async fn database_digest(pool: &PgPool, schema: &str) -> Result<DatabaseDigest, sqlx::Error> {
    let mut out = BTreeMap::new();
    for table in user_tables(pool, schema).await? {
        let digest = table_digest(pool, &table).await?;
        out.insert(table, digest);
    }
    Ok(out)
}

/// The tables whose digests differ between `a` and `b`, including tables present in only one, sorted.
pub fn differing_tables(a: &DatabaseDigest, b: &DatabaseDigest) -> Vec<QualifiedName> {
    let names: BTreeSet<&QualifiedName> = a.keys().chain(b.keys()).collect();
    names
        .into_iter()
        .filter(|n| a.get(*n) != b.get(*n))
        .cloned()
        .collect()
}

/// `CREATE DATABASE to TEMPLATE from` through `admin`, a pool on another database (e.g. `postgres`).
///
/// PostgreSQL refuses to copy a database others are connected to, so connections to `from` are
/// terminated first (pools on it reconnect on their next use); a connection that sneaks in before the
/// copy starts (SQLSTATE 55006) is terminated again, up to 10 attempts.
///
/// # Errors
/// Any database error, e.g. `to` already exists or `from` stays busy.
pub async fn clone_database(admin: &PgPool, from: &str, to: &str) -> Result<(), sqlx::Error> {
    let mut b = SqlBuilder::new();
    b.sql("CREATE DATABASE ")
        .ident(to)
        .sql(" TEMPLATE ")
        .ident(from);
    let create = b.build();
    let mut attempt = 0;
    loop {
        attempt += 1;
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
            .bind(from)
            .execute(admin)
            .await?;
        match sqlx::query(create.as_query()).execute(admin).await {
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some(deprov::sqlstate::OBJECT_IN_USE) && attempt < 10 =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other.map(|_| ()),
        }
    }
}

/// `DROP DATABASE IF EXISTS name WITH (FORCE)` through `admin`, a pool on another database.
///
/// # Errors
/// Any database error.
pub async fn drop_database(admin: &PgPool, name: &str) -> Result<(), sqlx::Error> {
    let mut b = SqlBuilder::new();
    b.sql("DROP DATABASE IF EXISTS ")
        .ident(name)
        .sql(" WITH (FORCE)");
    sqlx::query(b.build().as_query())
        .execute(admin)
        .await
        .map(|_| ())
}

/// What one naive cascading delete did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CascadeOutcome {
    /// Rows the `DELETE` itself removed from the root table (0 or 1 for a primary key).
    pub root_rows: u64,
    /// Rows deleted per table, the cascade included (`pg_stat_xact_user_tables.n_tup_del`); tables with
    /// none are absent.
    pub deleted: BTreeMap<QualifiedName, i64>,
    /// Rows updated per table (`n_tup_upd`: ON DELETE SET NULL / SET DEFAULT), tables with none absent.
    pub updated: BTreeMap<QualifiedName, i64>,
    /// Wall time of the transaction, `BEGIN` to `COMMIT` included.
    pub elapsed: Duration,
}

impl CascadeOutcome {
    /// Rows deleted over all tables.
    pub fn total_deleted(&self) -> i64 {
        self.deleted.values().sum()
    }

    /// [`Self::elapsed`] in milliseconds.
    pub fn elapsed_ms(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e3
    }
}

/// Runs the naive `DELETE FROM root_table WHERE key_column = $1` in one transaction (all locks held
/// to the end) — the reference deprov's batched delete must equal — and reports per-table counts read
/// from `pg_stat_xact_user_tables` before the commit. `tenant_id` is bound as `bigint`.
///
/// # Errors
/// Any database error (e.g. a RESTRICT reference blocks the delete); the transaction is rolled back.
pub async fn cascade_delete(
    pool: &PgPool,
    root_table: &QualifiedName,
    key_column: &str,
    tenant_id: i64,
) -> Result<CascadeOutcome, sqlx::Error> {
    let bigint = SqlType::from_catalog("bigint".into());
    cascade_delete_key(
        pool,
        root_table,
        key_column,
        &bigint,
        &tenant_id.to_string(),
    )
    .await
}

/// [`cascade_delete`] for a tenant key given as text, as deprov receives it: `$1` is cast to
/// `key_type`, the key column's type as `format_type` prints it (so an index on the key column
/// serves the `DELETE` whatever the type: `bigint`, `uuid`, `text`, …).
///
/// # Errors
/// Any database error, e.g. a key that is not a valid value of `key_type` (SQLSTATE 22P02) or a
/// RESTRICT reference that blocks the delete; the transaction is rolled back.
pub async fn cascade_delete_key(
    pool: &PgPool,
    root_table: &QualifiedName,
    key_column: &str,
    key_type: &SqlType,
    key: &str,
) -> Result<CascadeOutcome, sqlx::Error> {
    let mut b = SqlBuilder::new();
    b.sql("DELETE FROM ")
        .table(root_table)
        .sql(" WHERE ")
        .ident(key_column)
        .sql(" = $1::")
        .ty(key_type);
    run_cascade(pool, &b.build(), key.to_owned()).await
}

/// Runs `delete` (one parameter, `key`) in one transaction and reads its per-table counts.
async fn run_cascade(
    pool: &PgPool,
    delete: &Statement,
    key: String,
) -> Result<CascadeOutcome, sqlx::Error> {
    let started = Instant::now();
    let mut tx = pool.begin().await?;
    let done = sqlx::query(delete.as_query())
        .bind(key)
        .execute(&mut *tx)
        .await?;
    let stats: Vec<(String, String, i64, i64)> = sqlx::query_as(
        "SELECT schemaname::text, relname::text, n_tup_del, n_tup_upd FROM pg_stat_xact_user_tables \
         WHERE n_tup_del > 0 OR n_tup_upd > 0",
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let elapsed = started.elapsed();
    let mut deleted = BTreeMap::new();
    let mut updated = BTreeMap::new();
    for (schema, name, del, upd) in stats {
        let table = QualifiedName::new(schema, name);
        if del > 0 {
            deleted.insert(table.clone(), del);
        }
        if upd > 0 {
            updated.insert(table, upd);
        }
    }
    Ok(CascadeOutcome {
        root_rows: done.rows_affected(),
        deleted,
        updated,
        elapsed,
    })
}
