//! "Other tenants' rows unchanged": a per-table digest of the rows that do NOT belong to one tenant,
//! computed the same way before and after a deletion; the two must be equal.
//!
//! Ownership is read from `pg_catalog`, independently of deprov's engine: a row belongs to the tenant
//! when following one shortest chain of NOT NULL, ON DELETE CASCADE foreign keys upwards from its table
//! reaches the tenant's root row (`root.key = tenant_id`). Tables with no such chain (e.g. global lookup
//! tables) are digested whole.
//!
//! Rows of other tenants may legitimately change: a column of an ON DELETE SET NULL / SET DEFAULT
//! reference that points at a row of the tenant. In the digest such a column reads as NULL whenever
//! the referenced row belongs to the tenant — before the delete because it does, after it because the
//! column is NULL (SET NULL) — so both sides agree exactly when the delete did what the cascade does.
//! (For SET DEFAULT the column then holds its default, not NULL, and the check reports a difference;
//! the demo schema has none.) A wrongly deleted or changed row of another tenant changes the digest.

use std::collections::{BTreeMap, VecDeque};

use sqlx::PgPool;

use super::verify::{DatabaseDigest, digest_of, fetch_digest, user_tables};
use deprov::sql::{QualifiedName, SqlBuilder};

/// One foreign key as stored in `pg_constraint` (partition clones left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignKey {
    /// `conname`.
    pub name: String,
    /// The referencing table.
    pub child: QualifiedName,
    /// The referencing columns, in key order.
    pub child_columns: Vec<String>,
    /// The referenced table.
    pub parent: QualifiedName,
    /// The referenced columns, in key order.
    pub parent_columns: Vec<String>,
    /// `confdeltype`: `a` no action, `r` restrict, `c` cascade, `n` set null, `d` set default.
    pub on_delete: char,
    /// Whether every referencing column is NOT NULL.
    pub not_null: bool,
}

/// Every foreign key whose referencing or referenced table is in `schema`, sorted by child table and
/// constraint name.
///
/// # Errors
/// Any database error.
pub async fn foreign_keys(pool: &PgPool, schema: &str) -> Result<Vec<ForeignKey>, sqlx::Error> {
    type Raw = (
        String,
        String,
        String,
        String,
        String,
        String,
        Vec<String>,
        Vec<String>,
        bool,
    );
    let rows: Vec<Raw> = sqlx::query_as(
        "SELECT c.conname::text, cn.nspname::text, cc.relname::text, fn.nspname::text, fc.relname::text, \
           c.confdeltype::text, \
           ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, i) \
                 JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i), \
           ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, i) \
                 JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.i), \
           (SELECT bool_and(a.attnotnull) FROM pg_attribute a WHERE a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)) \
         FROM pg_constraint c \
         JOIN pg_class cc ON cc.oid = c.conrelid JOIN pg_namespace cn ON cn.oid = cc.relnamespace \
         JOIN pg_class fc ON fc.oid = c.confrelid JOIN pg_namespace fn ON fn.oid = fc.relnamespace \
         WHERE c.contype = 'f' AND c.conparentid = 0 AND (cn.nspname = $1 OR fn.nspname = $1) \
         ORDER BY 2, 3, 1",
    )
    .bind(schema)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(name, cs, cr, ps, pr, del, child_columns, parent_columns, not_null)| ForeignKey {
                name,
                child: QualifiedName::new(cs, cr),
                child_columns,
                parent: QualifiedName::new(ps, pr),
                parent_columns,
                on_delete: del.chars().next().unwrap_or('a'),
                not_null,
            },
        )
        .collect())
}

/// The columns of `table` in order (dropped columns left out).
///
/// # Errors
/// Any database error.
pub async fn table_columns(
    pool: &PgPool,
    table: &QualifiedName,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
    )
    .bind(&table.schema)
    .bind(&table.name)
    .fetch_all(pool)
    .await
}

/// For every table owned through a cascade chain, the first foreign key of its shortest chain towards
/// `root` (breadth-first from the root; ties go to the first key in [`foreign_keys`] order).
pub fn ownership_hops<'a>(
    fks: &'a [ForeignKey],
    root: &QualifiedName,
) -> BTreeMap<QualifiedName, &'a ForeignKey> {
    let mut hops: BTreeMap<QualifiedName, &ForeignKey> = BTreeMap::new();
    let mut queue = VecDeque::from([root.clone()]);
    while let Some(parent) = queue.pop_front() {
        for fk in fks {
            let owning =
                fk.on_delete == 'c' && fk.not_null && fk.parent == parent && fk.child != parent;
            if owning && fk.child != *root && !hops.contains_key(&fk.child) {
                hops.insert(fk.child.clone(), fk);
                queue.push_back(fk.child.clone());
            }
        }
    }
    hops
}

struct Ctx<'a> {
    hops: BTreeMap<QualifiedName, &'a ForeignKey>,
    root: &'a QualifiedName,
    key_column: &'a str,
    next_alias: usize,
}

impl Ctx<'_> {
    fn owned(&self, table: &QualifiedName) -> bool {
        table == self.root || self.hops.contains_key(table)
    }

    /// Writes a boolean expression: the row `alias` of `table` belongs to the tenant `$1`.
    fn write_owned(&mut self, b: &mut SqlBuilder, table: &QualifiedName, alias: usize) {
        if table == self.root {
            b.col(alias, self.key_column).sql(" = ").param(1);
            return;
        }
        let fk = self.hops[table];
        let (parent, cols, pcols) = (&fk.parent, &fk.child_columns, &fk.parent_columns);
        self.write_exists(b, parent, pcols, alias, cols);
    }

    /// `EXISTS (SELECT 1 FROM parent tN WHERE tN.pcols = alias.cols AND <tN owned>)`.
    fn write_exists(
        &mut self,
        b: &mut SqlBuilder,
        parent: &QualifiedName,
        pcols: &[String],
        alias: usize,
        cols: &[String],
    ) {
        self.next_alias += 1;
        let p = self.next_alias;
        b.sql("EXISTS (SELECT 1 FROM ")
            .table(parent)
            .sql(" ")
            .alias(p)
            .sql(" WHERE ");
        for (pc, c) in pcols.iter().zip(cols) {
            b.col(p, pc).sql(" = ").col(alias, c).sql(" AND ");
        }
        self.write_owned(b, parent, p);
        b.sql(")");
    }
}

/// The digest of each table of `schema` restricted to rows not belonging to tenant `tenant_id` of
/// `root` (keyed by `key_column`, bound as `bigint`), with SET NULL columns that reference the tenant's
/// rows read as NULL (see the module documentation). Equal results before and after a delete mean no
/// other tenant's row was removed, added or changed beyond what the cascade does.
///
/// # Errors
/// Any database error.
pub async fn other_tenants_digest(
    pool: &PgPool,
    schema: &str,
    root: &QualifiedName,
    key_column: &str,
    tenant_id: i64,
) -> Result<DatabaseDigest, sqlx::Error> {
    let fks = foreign_keys(pool, schema).await?;
    let mut ctx = Ctx {
        hops: ownership_hops(&fks, root),
        root,
        key_column,
        next_alias: 0,
    };
    let mut out = BTreeMap::new();
    for table in user_tables(pool, schema).await? {
        let columns = table_columns(pool, &table).await?;
        let unlinking: Vec<&ForeignKey> = fks
            .iter()
            .filter(|fk| {
                fk.child == table && matches!(fk.on_delete, 'n' | 'd') && ctx.owned(&fk.parent)
            })
            .collect();
        ctx.next_alias = 0;
        let stmt = digest_of(|b| {
            b.sql("SELECT md5(ROW(");
            for (i, column) in columns.iter().enumerate() {
                if i > 0 {
                    b.sql(", ");
                }
                let refs: Vec<&&ForeignKey> = unlinking
                    .iter()
                    .filter(|fk| fk.child_columns.contains(column))
                    .collect();
                if refs.is_empty() {
                    b.col(0, column);
                    continue;
                }
                b.sql("CASE WHEN ");
                for (j, fk) in refs.iter().enumerate() {
                    if j > 0 {
                        b.sql(" OR ");
                    }
                    ctx.write_exists(b, &fk.parent, &fk.parent_columns, 0, &fk.child_columns);
                }
                b.sql(" THEN NULL ELSE ").col(0, column).sql(" END");
            }
            b.sql(")::text) AS h FROM ").table(&table).sql(" ").alias(0);
            if ctx.owned(&table) {
                b.sql(" WHERE NOT (");
                ctx.write_owned(b, &table, 0);
                b.sql(")");
            }
        });
        let digest = fetch_digest(pool, &stmt, &[tenant_id]).await?;
        out.insert(table, digest);
    }
    Ok(out)
}

/// Rows violating a foreign key: `(constraint name, referencing table, rows)` for every foreign key
/// touching `schema` that has referencing rows (all key columns non-NULL, as MATCH SIMPLE checks)
/// without a referenced row. Empty when the data is consistent. Used after loading with triggers off.
///
/// # Errors
/// Any database error.
pub async fn orphaned_rows(
    pool: &PgPool,
    schema: &str,
) -> Result<Vec<(String, QualifiedName, i64)>, sqlx::Error> {
    let mut out = Vec::new();
    for fk in foreign_keys(pool, schema).await? {
        let mut b = SqlBuilder::new();
        b.sql("SELECT count(*) FROM ")
            .table(&fk.child)
            .sql(" ")
            .alias(0)
            .sql(" WHERE ");
        for c in &fk.child_columns {
            b.col(0, c).sql(" IS NOT NULL AND ");
        }
        b.sql("NOT EXISTS (SELECT 1 FROM ")
            .table(&fk.parent)
            .sql(" ")
            .alias(1)
            .sql(" WHERE ");
        b.join(&fk.child_columns, " AND ", |b, i, c| {
            b.col(1, &fk.parent_columns[i]).sql(" = ").col(0, c);
        });
        b.sql(")");
        let n: i64 = sqlx::query_scalar(b.build().as_query())
            .fetch_one(pool)
            .await?;
        if n > 0 {
            out.push((fk.name, fk.child, n));
        }
    }
    Ok(out)
}
