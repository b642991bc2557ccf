//! The generated case: a schema (tables, keys, foreign keys, partitioning) and its rows.
//!
//! Kept as plain data so a case can be printed, rendered to DDL ([`crate::ddl`]) and replayed from its
//! seed alone.

/// Column types the generator uses. Keys are `bigint`, `uuid` or `text`; the root's `deleted_at`
/// (written by the soft delete) is `timestamptz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Int,
    Uuid,
    Text,
    Time,
}

impl Ty {
    pub fn sql(self) -> &'static str {
        match self {
            Ty::Int => "bigint",
            Ty::Uuid => "uuid",
            Ty::Text => "text",
            Ty::Time => "timestamptz",
        }
    }
}

/// `ON DELETE` actions; `SetNullCols` is PostgreSQL 15's `SET NULL (column, ...)` naming only the
/// foreign key's own (not shared) columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // `NO ACTION` is the SQL name
pub enum Action {
    Cascade,
    SetNull,
    SetNullCols,
    SetDefault,
    Restrict,
    NoAction,
}

impl Action {
    pub fn sql(self) -> &'static str {
        match self {
            Action::Cascade => " ON DELETE CASCADE",
            Action::SetNull | Action::SetNullCols => " ON DELETE SET NULL",
            Action::SetDefault => " ON DELETE SET DEFAULT",
            Action::Restrict => " ON DELETE RESTRICT",
            Action::NoAction => " ON DELETE NO ACTION",
        }
    }
}

/// `DEFERRABLE` variants of a foreign key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deferral {
    NotDeferrable,
    Immediate,
    Deferred,
}

#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub ty: Ty,
    pub not_null: bool,
    /// An integer `DEFAULT` (for `SET DEFAULT`); `None` = NULL.
    pub default: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct ForeignKey {
    pub name: String,
    /// Referencing columns (indexes into the table's columns); may share columns with other keys.
    pub cols: Vec<usize>,
    pub parent: usize,
    /// Referenced columns of the parent: its primary key or a unique constraint.
    pub parent_cols: Vec<usize>,
    pub action: Action,
    pub deferral: Deferral,
    /// Points at a later table (a cycle through nullable columns); filled after all tables' rows.
    pub back_edge: bool,
}

#[derive(Debug, Clone)]
pub enum Partitioning {
    /// `PARTITION BY HASH (col)` with `modulus` partitions.
    Hash { col: usize, modulus: i64 },
    /// `PARTITION BY LIST (col)` over bigint values: one partition per group, plus a DEFAULT one.
    List { col: usize, groups: Vec<Vec<i64>> },
}

#[derive(Debug, Clone)]
pub struct Table {
    pub name: String,
    pub columns: Vec<Column>,
    pub pk: Option<Vec<usize>>,
    pub uniques: Vec<Vec<usize>>,
    pub fks: Vec<ForeignKey>,
    /// Columns whose values the generator makes unique (ids, unique codes).
    pub generated: Vec<usize>,
    pub partition: Option<Partitioning>,
    /// Whether to index each foreign key's columns.
    pub index_fks: bool,
    /// Rows as text (NULL = `None`), in the table's column order.
    pub rows: Vec<Vec<Option<String>>>,
    /// The tenant (index into `Case::tenants`) each row was generated for.
    pub row_tenant: Vec<usize>,
}

impl Table {
    pub fn new(name: String) -> Self {
        Self {
            name,
            columns: Vec::new(),
            pk: None,
            uniques: Vec::new(),
            fks: Vec::new(),
            generated: Vec::new(),
            partition: None,
            index_fks: false,
            rows: Vec::new(),
            row_tenant: Vec::new(),
        }
    }

    pub fn add_column(&mut self, name: String, ty: Ty, not_null: bool) -> usize {
        let mut name = name;
        while self.columns.iter().any(|c| c.name == name) {
            name.push('_');
        }
        self.columns.push(Column {
            name,
            ty,
            not_null,
            default: None,
        });
        self.columns.len() - 1
    }

    /// Keys other tables may reference: the primary key, then unique constraints.
    pub fn keys(&self) -> Vec<Vec<usize>> {
        self.pk.iter().chain(self.uniques.iter()).cloned().collect()
    }
}

/// One generated case.
#[derive(Debug, Clone)]
pub struct Case {
    pub seed: u64,
    /// Schema holding every generated table.
    pub schema: String,
    /// `tables[0]` is the root.
    pub tables: Vec<Table>,
    /// The root's key column (index into `tables[0].columns`).
    pub root_key: usize,
    /// Root key values, one per tenant.
    pub tenants: Vec<String>,
    /// The tenant deleted (index into `tenants`).
    pub victim: usize,
    /// `hard_delete.batch_rows` (= `max_batch_rows`).
    pub batch_rows: u32,
}

impl Case {
    pub fn root(&self) -> &Table {
        &self.tables[0]
    }

    pub fn total_rows(&self) -> usize {
        self.tables.iter().map(|t| t.rows.len()).sum()
    }
}
