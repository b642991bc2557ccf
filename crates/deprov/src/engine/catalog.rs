//! Reads the foreign-key graph from `pg_catalog` (PostgreSQL docs §53.13 `pg_constraint`,
//! §53.26 `pg_index`, §53.7 `pg_attribute`).
//!
//! Foreign keys cloned onto partitions (`conparentid <> 0`) are skipped: deprov works on the
//! partitioned parent, which routes deletes itself. Only ordinary (`r`) and partitioned (`p`) tables
//! are read.

use std::collections::BTreeMap;

use sqlx::PgConnection;

use crate::sql::{QualifiedName, SqlType};

/// What a foreign key does when its referenced row is deleted (`pg_constraint.confdeltype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OnDelete {
    /// `c`: delete the referencing rows too.
    Cascade,
    /// `n`: set the referencing columns to NULL.
    SetNull,
    /// `d`: set the referencing columns to their defaults.
    SetDefault,
    /// `r`: refuse the delete at once.
    Restrict,
    /// `a`: refuse the delete if referencing rows remain when checked (end of statement or commit).
    NoAction,
}

impl OnDelete {
    fn from_code(c: &str) -> Self {
        match c {
            "c" => Self::Cascade,
            "n" => Self::SetNull,
            "d" => Self::SetDefault,
            "r" => Self::Restrict,
            _ => Self::NoAction,
        }
    }

    /// The SQL spelling: `CASCADE`, `SET NULL`, `SET DEFAULT`, `RESTRICT`, `NO ACTION`.
    pub fn as_sql(self) -> &'static str {
        match self {
            Self::Cascade => "CASCADE",
            Self::SetNull => "SET NULL",
            Self::SetDefault => "SET DEFAULT",
            Self::Restrict => "RESTRICT",
            Self::NoAction => "NO ACTION",
        }
    }

    /// Whether referencing rows make the cascade fail by the action alone (RESTRICT or NO ACTION; see
    /// also [`ForeignKey::blocks`]).
    pub fn blocks(self) -> bool {
        matches!(self, Self::Restrict | Self::NoAction)
    }
}

/// How a table's rows are keyed for keyset pagination.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum RowKey {
    /// The primary key's columns, in key order, with their types.
    Columns(Vec<(String, SqlType)>),
    /// No primary key: the physical row address `ctid` (stable while the row is not updated).
    Ctid,
}

/// One table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Table {
    /// `pg_class.oid`.
    pub oid: u32,
    /// Schema and name.
    pub name: QualifiedName,
    /// Keyset key.
    pub key: RowKey,
    /// Column name → type, for casts.
    pub columns: BTreeMap<String, SqlType>,
    /// A partitioned table (`relkind = 'p'`).
    pub partitioned: bool,
    /// The planner's row estimate (`pg_class.reltuples`, set by VACUUM / ANALYZE; negative when the
    /// table was never analyzed). Only used to decide what PostgreSQL's cascade may delete in a
    /// batch (see [`super::absorb`]), never for correctness.
    pub estimated_rows: f64,
    /// The planner's size estimate in blocks (`pg_class.relpages`, set with `reltuples`; 0 when
    /// never analyzed). Like `estimated_rows`, only used to size first batches and the root row's
    /// allowance of absorbed rows.
    pub estimated_pages: f64,
}

impl Table {
    /// The keyset key: primary-key columns, else `ctid` (with `tableoid` first on a partitioned table,
    /// where a `ctid` is unique only within one partition).
    pub fn key_columns(&self) -> Vec<(String, SqlType)> {
        match &self.key {
            RowKey::Columns(cols) => cols.clone(),
            RowKey::Ctid if self.partitioned => vec![
                ("tableoid".into(), SqlType::from_catalog("oid".into())),
                ("ctid".into(), SqlType::from_catalog("tid".into())),
            ],
            RowKey::Ctid => vec![("ctid".into(), SqlType::from_catalog("tid".into()))],
        }
    }
}

/// One foreign key.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ForeignKey {
    /// Constraint name.
    pub name: String,
    /// The referencing table's oid.
    pub from: u32,
    /// Referencing columns, in constraint order.
    pub from_cols: Vec<String>,
    /// The referenced table's oid.
    pub to: u32,
    /// Referenced columns, matching `from_cols`.
    pub to_cols: Vec<String>,
    /// The delete action.
    pub on_delete: OnDelete,
    /// `DEFERRABLE`.
    pub deferrable: bool,
    /// The columns ON DELETE SET NULL would set (`confdelsetcols`, PostgreSQL 15+, else all of
    /// `from_cols`) include a NOT NULL one: setting them fails, so such a reference blocks like
    /// RESTRICT.
    pub nulls_not_null: bool,
    /// Every referencing column is NOT NULL: each referencing row references some row.
    pub not_null: bool,
    /// Whether an index leads with exactly the referencing columns (else each cascaded delete of a
    /// referenced row scans the referencing table).
    pub indexed: bool,
    /// For an `ON DELETE SET NULL` key: the `UPDATE` its action makes of a referencing row can fail
    /// or act only through the key's own columns — the referencing table is an ordinary table
    /// with no CHECK, exclusion or constraint trigger, no unique index but its primary key, no
    /// trigger of its own, no rule but `SELECT`, and no generated column (PostgreSQL docs
    /// §5.4 "Constraints", §5.3 "Generated Columns", CREATE TRIGGER, CREATE RULE). Always false
    /// for another action.
    pub rewrites_plainly: bool,
}

/// `(name, from oid, from columns, to oid, to columns, confdeltype, deferrable, nulls a NOT NULL
/// column, all referencing columns NOT NULL, indexed, a SET NULL that rewrites plainly)`.
type FkRow = (
    String,
    i64,
    Vec<String>,
    i64,
    Vec<String>,
    String,
    bool,
    bool,
    bool,
    bool,
    bool,
);

impl ForeignKey {
    /// Whether a referencing row outside the tenant makes the cascade fail: RESTRICT, NO ACTION, or
    /// SET NULL into a NOT NULL column (PostgreSQL raises 23502).
    pub fn blocks(&self) -> bool {
        self.on_delete.blocks() || (self.on_delete == OnDelete::SetNull && self.nulls_not_null)
    }
}

/// Every table and foreign key of the database (system schemas excluded).
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// Tables by oid.
    pub tables: BTreeMap<u32, Table>,
    /// All foreign keys between them.
    pub foreign_keys: Vec<ForeignKey>,
}

/// Ordinary and partitioned tables (not partitions) outside the system schemas: oid, schema, name,
/// partitioned, primary-key columns in key order, `reltuples`, `relpages`.
const TABLES: &str = "SELECT c.oid::int8, n.nspname::text, c.relname::text, c.relkind = 'p', \
               coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord) \
                 FROM pg_constraint pk CROSS JOIN LATERAL unnest(pk.conkey) WITH ORDINALITY k(attnum, ord) \
                 JOIN pg_attribute a ON a.attrelid = pk.conrelid AND a.attnum = k.attnum \
                 WHERE pk.conrelid = c.oid AND pk.contype = 'p'), '{}'), c.reltuples::float8, c.relpages::float8 \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
               AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'";

/// The columns of those tables with their types (`format_type`).
const COLUMNS: &str = "SELECT a.attrelid::int8, a.attname::text, format_type(a.atttypid, a.atttypmod) \
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p') AND NOT c.relispartition \
               AND n.nspname NOT IN ('pg_catalog', 'information_schema')";

/// Foreign keys (a partitioned table's own, not its partitions' copies): name, referencing table
/// and columns, referenced table and columns, `confdeltype`, deferrable, whether the action sets a
/// NOT NULL column, whether every referencing column is NOT NULL, whether an index leads with
/// exactly the referencing columns, and for a SET NULL key whether its update of a referencing row
/// meets nothing but the key ([`ForeignKey::rewrites_plainly`]; the subqueries run for SET NULL
/// keys only).
const FOREIGN_KEYS: &str = "SELECT c.conname::text, c.conrelid::int8, \
               ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(attnum, ord) \
                     JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum ORDER BY k.ord), \
               c.confrelid::int8, \
               ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(attnum, ord) \
                     JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum ORDER BY k.ord), \
               c.confdeltype::text, c.condeferrable, \
               EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.conrelid AND a.attnotnull \
                 AND a.attnum = ANY (coalesce(c.confdelsetcols, c.conkey))), \
               NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.conrelid \
                 AND NOT a.attnotnull AND a.attnum = ANY (c.conkey)), \
               EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.conrelid AND i.indpred IS NULL \
                 AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] @> c.conkey \
                 AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] <@ c.conkey), \
               coalesce(CASE WHEN c.confdeltype = 'n' THEN \
                 (SELECT r.relkind = 'r' FROM pg_class r WHERE r.oid = c.conrelid) \
                 AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.conrelid \
                   AND k.contype IN ('c', 'x', 't')) \
                 AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.conrelid \
                   AND i.indisunique AND NOT i.indisprimary) \
                 AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.conrelid \
                   AND NOT t.tgisinternal) \
                 AND NOT EXISTS (SELECT 1 FROM pg_rewrite w WHERE w.ev_class = c.conrelid \
                   AND w.ev_type <> '1') \
                 AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.conrelid \
                   AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated <> '') \
               END, false) \
             FROM pg_constraint c WHERE c.contype = 'f' AND c.conparentid = 0";

/// The rows of the catalog's tables and foreign keys, read apart from its columns
/// ([`CatalogColumns`]) so that the two can be read side by side on two connections: each read is
/// one statement, and under READ COMMITTED every statement takes its own snapshot, so one
/// transaction around the three queries gives them no common snapshot either.
#[derive(Debug)]
pub(crate) struct CatalogPart {
    tables: Vec<TableRow>,
    fks: Vec<FkRow>,
}

/// The rows of [`COLUMNS`] ([`CatalogPart`]).
#[derive(Debug)]
pub(crate) struct CatalogColumns(Vec<(i64, String, String)>);

impl CatalogPart {
    /// The rows of [`TABLES`] and [`FOREIGN_KEYS`], two statements on `conn`; cost grows with the
    /// number of tables, not rows.
    ///
    /// # Errors
    /// Database errors.
    pub async fn read(conn: &mut PgConnection) -> Result<Self, sqlx::Error> {
        let tables = crate::db::query_as(TABLES).fetch_all(&mut *conn).await?;
        let fks = crate::db::query_as(FOREIGN_KEYS)
            .fetch_all(&mut *conn)
            .await?;
        Ok(Self { tables, fks })
    }

    /// The catalog of these rows and `columns`.
    pub fn with_columns(self, columns: CatalogColumns) -> Catalog {
        let mut catalog = Catalog::default();
        catalog.add_tables(self.tables);
        catalog.add_columns(columns.0);
        catalog.add_foreign_keys(self.fks);
        catalog
    }
}

impl CatalogColumns {
    /// The rows of [`COLUMNS`], one statement on `conn`.
    ///
    /// # Errors
    /// Database errors.
    pub async fn read(conn: &mut PgConnection) -> Result<Self, sqlx::Error> {
        Ok(Self(
            crate::db::query_as(COLUMNS).fetch_all(&mut *conn).await?,
        ))
    }
}

/// A row of [`TABLES`].
type TableRow = (i64, String, String, bool, Vec<String>, f64, f64);

impl Catalog {
    /// The tables of [`TABLES`], keyed by their primary key's columns (types filled in by
    /// [`Self::add_columns`]), else by `ctid`.
    fn add_tables(&mut self, tables: Vec<TableRow>) {
        for (oid, schema, name, partitioned, pk, estimated_rows, estimated_pages) in tables {
            let key = if pk.is_empty() {
                RowKey::Ctid
            } else {
                RowKey::Columns(
                    pk.into_iter()
                        .map(|c| (c, SqlType::from_catalog(String::new())))
                        .collect(),
                )
            };
            let oid = oid as u32;
            self.tables.insert(
                oid,
                Table {
                    oid,
                    name: QualifiedName::new(schema, name),
                    key,
                    columns: BTreeMap::new(),
                    partitioned,
                    estimated_rows,
                    estimated_pages,
                },
            );
        }
    }

    /// The columns of [`COLUMNS`] with their types, and the types of each primary key's columns.
    fn add_columns(&mut self, columns: Vec<(i64, String, String)>) {
        for (oid, col, ty) in columns {
            if let Some(t) = self.tables.get_mut(&(oid as u32)) {
                t.columns.insert(col, SqlType::from_catalog(ty));
            }
        }
        for t in self.tables.values_mut() {
            if let RowKey::Columns(cols) = &mut t.key {
                for (col, ty) in cols.iter_mut() {
                    *ty = t
                        .columns
                        .get(col)
                        .cloned()
                        .unwrap_or_else(|| SqlType::from_catalog("text".into()));
                }
            }
        }
    }

    /// The foreign keys of [`FOREIGN_KEYS`] between tables of the catalog.
    fn add_foreign_keys(&mut self, fks: Vec<FkRow>) {
        for (
            name,
            from,
            from_cols,
            to,
            to_cols,
            action,
            deferrable,
            nulls_not_null,
            not_null,
            indexed,
            rewrites_plainly,
        ) in fks
        {
            let (from, to) = (from as u32, to as u32);
            if self.tables.contains_key(&from) && self.tables.contains_key(&to) {
                self.foreign_keys.push(ForeignKey {
                    name,
                    from,
                    from_cols,
                    to,
                    to_cols,
                    on_delete: OnDelete::from_code(&action),
                    deferrable,
                    nulls_not_null,
                    not_null,
                    indexed,
                    rewrites_plainly,
                });
            }
        }
    }

    /// Whether an index is known to lead with exactly `columns` of `table` (in any order): its
    /// primary key (whose first columns they are), or the referencing columns of one of its foreign
    /// keys that [`ForeignKey::indexed`] says are.
    pub fn leads_an_index(&self, table: u32, columns: &[String]) -> bool {
        let same = |other: &[String]| {
            other.len() == columns.len() && other.iter().all(|c| columns.contains(c))
        };
        let primary = matches!(&self.tables.get(&table).map(|t| &t.key),
            Some(RowKey::Columns(cols)) if cols.len() >= columns.len()
                && same(&cols[..columns.len()].iter().map(|(c, _)| c.clone()).collect::<Vec<_>>()));
        primary
            || self
                .foreign_keys
                .iter()
                .any(|fk| fk.from == table && fk.indexed && same(&fk.from_cols))
    }

    /// The oid of the table with this exact catalog name.
    pub fn find(&self, name: &QualifiedName) -> Option<u32> {
        self.tables
            .values()
            .find(|t| &t.name == name)
            .map(|t| t.oid)
    }
}
