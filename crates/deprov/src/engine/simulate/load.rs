//! The database side of the cascade simulation: referential triggers and `SET NULL` / `SET DEFAULT`
//! facts from `pg_catalog`, and rows read in bulk by key. Read-only; every query is its own short
//! transaction bounded by `[hard_delete]`'s timeouts ([`crate::db::begin`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::SimError;
use crate::engine::{BatchLimits, Plan};
use crate::sql::{CatalogExpr, SqlBuilder};

/// What a referential trigger does when it fires (its function, `pg_trigger.tgfoid`, defined in
/// PostgreSQL's `src/backend/utils/adt/ri_triggers.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `RI_FKey_cascade_del`: delete the referencing rows.
    Cascade,
    /// `RI_FKey_restrict_del`: fail if a referencing row exists.
    Restrict,
    /// `RI_FKey_noaction_del`: fail if a referencing row exists (at commit when deferred).
    NoAction,
    /// `RI_FKey_setnull_del`: set the referencing columns to NULL.
    SetNull,
    /// `RI_FKey_setdefault_del`: set them to their defaults, then re-check like NO ACTION.
    SetDefault,
    /// `RI_FKey_check_upd` (on the referencing table): the new key must exist.
    Check,
}

/// One referential trigger of a relation.
#[derive(Debug, Clone)]
pub(super) struct Trigger {
    /// `pg_trigger.tgname` (`RI_ConstraintTrigger_a_<oid>` / `_c_<oid>`): the firing order.
    pub name: String,
    /// Index into `Catalog::foreign_keys` of the (top-level) constraint it enforces.
    pub fk: usize,
    pub kind: Kind,
    /// `tginitdeferred`: fires at commit.
    pub deferred: bool,
}

/// A column an `ON DELETE SET NULL / SET DEFAULT` action writes.
#[derive(Debug, Clone)]
pub(super) struct SetCol {
    pub column: String,
    pub not_null: bool,
    /// The value written, as text (`None` = NULL): NULL for SET NULL, the evaluated default for SET
    /// DEFAULT.
    pub value: Option<String>,
}

/// Schema facts the simulation needs beyond [`crate::engine::catalog::Catalog`].
#[derive(Debug, Default)]
pub(super) struct Facts {
    /// Referential triggers per relation (a table or a leaf partition, by `pg_class` oid), sorted by
    /// name as PostgreSQL fires them (`RelationBuildTriggers` sorts by `strcmp` of the names).
    pub triggers: HashMap<u32, Vec<Trigger>>,
    /// Per foreign key (by index): the columns its SET NULL / SET DEFAULT action writes
    /// (`confdelsetcols`, PostgreSQL 15+, else all referencing columns); empty for other actions.
    pub set_cols: Vec<Vec<SetCol>>,
}

async fn begin<'c>(
    pool: &'c PgPool,
    limits: &BatchLimits,
) -> Result<sqlx::Transaction<'c, sqlx::Postgres>, sqlx::Error> {
    crate::db::begin(pool, limits.bounds()).await
}

/// Reads the referential triggers and the SET NULL / SET DEFAULT columns of every foreign key of the
/// plan. Three catalog queries, plus one per SET DEFAULT column to evaluate its default.
///
/// # Errors
/// Database errors; [`SimError::Unsupported`] for a SET DEFAULT column whose default calls a volatile
/// function (its value at the cascade cannot be known in advance).
pub(super) async fn facts(
    pool: &PgPool,
    plan: &Plan,
    limits: &BatchLimits,
) -> Result<Facts, SimError> {
    let fks = &plan.catalog.foreign_keys;
    let index: HashMap<(u32, &str), usize> = fks
        .iter()
        .enumerate()
        .map(|(i, fk)| ((fk.from, fk.name.as_str()), i))
        .collect();
    let mut tx = begin(pool, limits).await?;
    // Clones of a constraint on partitions (conparentid) map to their top-level constraint.
    let triggers: Vec<(i64, String, i64, String, String, bool)> = crate::db::query_as(
        "WITH RECURSIVE con AS ( \
           SELECT oid, oid AS top FROM pg_constraint WHERE contype = 'f' AND conparentid = 0 \
           UNION ALL SELECT c.oid, con.top FROM pg_constraint c JOIN con ON c.conparentid = con.oid) \
         SELECT t.tgrelid::int8, t.tgname::text, top.conrelid::int8, top.conname::text, p.proname::text, \
                t.tginitdeferred \
         FROM pg_trigger t JOIN con ON con.oid = t.tgconstraint JOIN pg_constraint top ON top.oid = con.top \
           JOIN pg_proc p ON p.oid = t.tgfoid \
         WHERE t.tgenabled IN ('O', 'A') AND p.proname IN ('RI_FKey_cascade_del', 'RI_FKey_restrict_del', \
           'RI_FKey_noaction_del', 'RI_FKey_setnull_del', 'RI_FKey_setdefault_del', 'RI_FKey_check_upd')",
    )
    .fetch_all(&mut *tx)
    .await?;
    let set_cols: Vec<(i64, String, Vec<String>)> = crate::db::query_as(
        "SELECT c.conrelid::int8, c.conname::text, \
           ARRAY(SELECT a.attname::text FROM unnest(CASE WHEN cardinality(c.confdelsetcols) > 0 \
                   THEN c.confdelsetcols ELSE c.conkey END) k(n) \
                 JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY a.attnum) \
         FROM pg_constraint c WHERE c.contype = 'f' AND c.conparentid = 0 AND c.confdeltype IN ('n', 'd')",
    )
    .fetch_all(&mut *tx)
    .await?;
    // NOT NULL and default of each column a SET NULL / SET DEFAULT action writes; `volatile` when
    // the default's node tree calls a volatile function (`nextval`, `random`, ...). Only those
    // columns: reading every default of every referencing table is a long catalog transaction on
    // a wide schema.
    let (rels, names): (Vec<i64>, Vec<String>) = set_cols
        .iter()
        .filter(|(from, con, _)| index.contains_key(&(*from as u32, con.as_str())))
        .flat_map(|(from, _, cols)| cols.iter().map(move |c| (*from, c.clone())))
        .unzip();
    let columns: Vec<(i64, String, bool, Option<String>, bool)> = crate::db::query_as(
        "SELECT a.attrelid::int8, a.attname::text, a.attnotnull, pg_get_expr(d.adbin, d.adrelid), \
           coalesce(EXISTS (SELECT 1 FROM regexp_matches(d.adbin::text, ':(?:op)?funcid (\\d+)', 'g') m \
             JOIN pg_proc p ON p.oid = m[1]::oid WHERE p.provolatile = 'v'), false) \
         FROM unnest($1::int8[], $2::text[]) AS w(rel, col) \
           JOIN pg_attribute a ON a.attrelid = w.rel::oid AND a.attname = w.col \
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
         WHERE a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(&rels)
    .bind(&names)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;

    let mut facts = Facts {
        set_cols: vec![Vec::new(); fks.len()],
        ..Facts::default()
    };
    add_triggers(&mut facts, triggers, &index);
    let columns: BTreeMap<(u32, String), (bool, Option<String>, bool)> = columns
        .into_iter()
        .map(|(rel, col, nn, def, vol)| ((rel as u32, col), (nn, def, vol)))
        .collect();
    for (from, con, cols) in set_cols {
        let Some(&i) = index.get(&(from as u32, con.as_str())) else {
            continue;
        };
        let fk = &fks[i];
        let set_default = fk.on_delete == crate::engine::catalog::OnDelete::SetDefault;
        for column in cols {
            let (not_null, default, volatile) = columns
                .get(&(fk.from, column.clone()))
                .cloned()
                .unwrap_or((false, None, false));
            let value = match default {
                Some(expr) if set_default => {
                    default_value(pool, plan, limits, fk, &column, expr, volatile).await?
                }
                _ => None,
            };
            facts.set_cols[i].push(SetCol {
                column,
                not_null,
                value,
            });
        }
    }
    Ok(facts)
}

/// The referential triggers of [`facts`]' read, by table, each table's in name order (the order
/// PostgreSQL fires them in), for the foreign keys of `index`.
fn add_triggers(
    facts: &mut Facts,
    triggers: Vec<(i64, String, i64, String, String, bool)>,
    index: &HashMap<(u32, &str), usize>,
) {
    for (rel, name, from, con, proname, deferred) in triggers {
        let Some(&fk) = index.get(&(from as u32, con.as_str())) else {
            continue;
        };
        let kind = match proname.as_str() {
            "RI_FKey_cascade_del" => Kind::Cascade,
            "RI_FKey_restrict_del" => Kind::Restrict,
            "RI_FKey_noaction_del" => Kind::NoAction,
            "RI_FKey_setnull_del" => Kind::SetNull,
            "RI_FKey_setdefault_del" => Kind::SetDefault,
            _ => Kind::Check,
        };
        facts.triggers.entry(rel as u32).or_default().push(Trigger {
            name,
            fk,
            kind,
            deferred,
        });
    }
    for list in facts.triggers.values_mut() {
        list.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    }
}

/// The value `ON DELETE SET DEFAULT` of `fk` writes into `column`: its default `expr`, evaluated
/// once by the target in its own bounded transaction and cast to the column's type, as text.
///
/// # Errors
/// [`SimError::Unsupported`] for a volatile default (each row would get another value); the
/// target's errors.
async fn default_value(
    pool: &PgPool,
    plan: &Plan,
    limits: &BatchLimits,
    fk: &crate::engine::catalog::ForeignKey,
    column: &str,
    expr: String,
    volatile: bool,
) -> Result<Option<String>, SimError> {
    if volatile {
        return Err(SimError::Unsupported(format!(
            "column {:?} of {} (ON DELETE SET DEFAULT of {:?}) has a volatile default",
            column,
            plan.name(fk.from),
            fk.name
        )));
    }
    let ty = &plan.catalog.tables[&fk.from].columns[column];
    let mut b = SqlBuilder::new();
    b.sql("SELECT (")
        .expr(&CatalogExpr::from_catalog(expr))
        .sql("::")
        .ty(ty)
        .sql(")::text");
    let mut tx = begin(pool, limits).await?;
    let v: Option<String> = crate::db::query_scalar(b.build().as_query())
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(v)
}

/// One row read: `(tableoid, ctid as text, tracked column values as text)`.
pub(super) type Loaded = (i64, String, Vec<Option<String>>);

/// Most keys bound to one query of a table read through an index on the looked-up columns.
const MAX_KEYS_PER_LOOKUP: u64 = 20_000;
/// Keys of the first such query; later ones are sized by time.
const FIRST_KEYS: u64 = 500;
/// Most keys bound to one block range of a table read without such an index (a hash of them is
/// built per query).
const KEYS_PER_SCAN: usize = 50_000;
/// Most keys of a column whose rows a read leaves out (see [`rows`]). PostgreSQL plans each read
/// with its parameters as constants and estimates `= ANY(array)` element by element, and casts the
/// array on every read: a large array costs each read more than the rows it leaves out, which the
/// caller drops anyway (`Store::add` keeps a row's first copy).
const MAX_KNOWN_KEYS: usize = 1_000;
/// Blocks of the first range; later ones are sized by time.
const FIRST_BLOCKS: u64 = 128;
/// Reads cut short by their timeout in a row before the error is given up to the caller (each is
/// retried with half the keys or blocks).
const MAX_CUTS: u32 = 8;

/// The size (keys, or blocks) of the next read of each table by each set of columns, and the ceiling
/// below the smallest size cut short so far: kept across the simulation's reads, so that each
/// generation does not find the table's limit again by a read cut short. A read's time need not
/// grow linearly with its keys: past some count PostgreSQL may plan a scan of the whole table.
#[derive(Debug, Default)]
pub(super) struct Sizes(std::sync::Mutex<HashMap<(u32, Vec<String>), Chunk>>);

/// See [`Sizes`].
#[derive(Debug, Clone, Copy)]
struct Chunk {
    size: u64,
    ceiling: u64,
}

impl Chunk {
    /// After a read of `self.size` that took `took`, aiming at `target`.
    fn grown(self, took: Duration, target: Duration) -> Self {
        Self {
            size: resize(self.size, took, target, 1).min(self.ceiling),
            ..self
        }
    }

    /// After a read of `self.size` that was cut short.
    fn cut(self) -> Self {
        Self {
            size: self.size.div_ceil(2),
            ceiling: self.ceiling.min(self.size.saturating_sub(1)).max(1),
        }
    }
}

/// Reads the rows of `table` whose columns `by` equal one of `keys` (each a value per column, as
/// text, cast to the column's type), returning the `tracked` columns as text. `FROM ONLY` unless the
/// table is partitioned, as the referential triggers query (`ri_triggers.c`). Rows whose column
/// holds one of the `known` keys of that column (the caller holds them already) are left out, for
/// columns not of an array type and at most [`MAX_KNOWN_KEYS`] keys.
///
/// Every read is its own transaction under `limits`' lock timeout and a statement timeout of
/// `read_timeout` (the caller bounds it like a batch), sized to take about half of that: where an index leads with the `by` columns (a primary
/// key, an indexed foreign key), a chunk of keys looked up through it; elsewhere (an ORM's
/// unindexed foreign key) a range of the table's blocks (`ctid` range, a TID range scan, PostgreSQL
/// 14+) matched against a chunk of keys, so each read scans a part of the table rather than all of
/// it, and the table is scanned once per [`KEYS_PER_SCAN`] keys rather than once per few thousand.
/// A read cut short is retried with half the keys or blocks; a read of one key cut short (a key
/// with very many rows) runs again under `limits`' own `statement_timeout`. Rows moved by a
/// concurrent `UPDATE` between two block ranges may be missed or read twice, as rows written
/// between any two of the simulation's reads may (module docs).
///
/// # Errors
/// Database errors, also `limits`' own timeout (57014) of a read that was cut [`MAX_CUTS`] times
/// in a row or could not be split.
pub(super) async fn rows(
    pool: &PgPool,
    plan: &Plan,
    (limits, read_timeout, sizes): (&BatchLimits, Duration, &Sizes),
    table: u32,
    (by, keys): (&[String], &[Vec<String>]),
    tracked: &[String],
    known: &[(&str, &[String])],
) -> Result<Vec<Loaded>, SimError> {
    let t = &plan.catalog.tables[&table];
    let scanned = !t.partitioned && !plan.catalog.leads_an_index(table, by);
    // An array-typed column's keys are array literals, which `::type[]` cannot take element-wise.
    let known: Vec<(&str, &[String])> = known
        .iter()
        .filter(|(c, k)| {
            k.len() <= MAX_KNOWN_KEYS
                && t.columns
                    .get(*c)
                    .is_some_and(|ty| !ty.as_str().ends_with(']'))
        })
        .copied()
        .collect();
    let mut b = SqlBuilder::new();
    b.sql("SELECT t0.tableoid::int8, t0.ctid::text, ARRAY[");
    b.join(tracked, ", ", |b, _, c| {
        b.col(0, c).sql("::text");
    });
    b.sql("]::text[] FROM ");
    if !t.partitioned {
        b.sql("ONLY ");
    }
    b.table(&t.name).sql(" t0 JOIN unnest(");
    b.join(by, ", ", |b, i, _| {
        b.param(i + 1).sql("::text[]");
    });
    b.sql(") AS t1(");
    b.join(by, ", ", |b, i, _| {
        b.sql("k").int(i as i64);
    });
    b.sql(") ON ");
    b.join(by, " AND ", |b, i, c| {
        b.col(0, c)
            .sql(" = t1.k")
            .int(i as i64)
            .sql("::")
            .ty(&t.columns[c]);
    });
    b.sql(" WHERE true");
    if scanned {
        b.sql(" AND t0.ctid >= ")
            .param(by.len() + 1)
            .sql("::tid AND t0.ctid < ")
            .param(by.len() + 2)
            .sql("::tid");
    }
    // Rows already held are left out: a constant array is matched through a hash (PostgreSQL 14+),
    // and `IS NOT TRUE` keeps the rows whose column is NULL.
    let first_known = by.len() + if scanned { 3 } else { 1 };
    for (i, (c, _)) in known.iter().enumerate() {
        b.sql(" AND (")
            .col(0, c)
            .sql(" = ANY(")
            .param(first_known + i)
            .sql("::text[]::")
            .ty(&t.columns[*c])
            .sql("[])) IS NOT TRUE");
    }
    let read = Read {
        pool,
        limits,
        bounded: limits.within(read_timeout),
        stmt: b.build(),
        columns: by.len(),
        known: known.iter().map(|(_, k)| *k).collect(),
    };
    let at = (table, by.to_vec());
    let stored = sizes.0.lock().map_or(None, |m| m.get(&at).copied());
    let mut chunk = stored.unwrap_or(if scanned {
        Chunk {
            size: FIRST_BLOCKS,
            ceiling: u64::MAX,
        }
    } else {
        Chunk {
            size: FIRST_KEYS,
            ceiling: MAX_KEYS_PER_LOOKUP,
        }
    });
    let rows = if scanned {
        read.by_blocks(t, keys, &mut chunk).await
    } else {
        read.by_keys(keys, &mut chunk).await
    };
    if let Ok(mut m) = sizes.0.lock() {
        m.insert(at, chunk);
    }
    rows
}

/// One statement of [`rows`] and how to run it.
struct Read<'a> {
    pool: &'a PgPool,
    /// The lock timeout, and the statement timeout of a read that may not be cut.
    limits: &'a BatchLimits,
    /// The limits of a read that may be cut short.
    bounded: BatchLimits,
    stmt: crate::sql::Statement,
    /// Key columns (`$1`..`$n`); a block range's bounds follow them.
    columns: usize,
    /// The keys of rows left out (see [`rows`]), one parameter each, after those.
    known: Vec<&'a [String]>,
}

impl Read<'_> {
    /// The time a read is sized to take: half its timeout.
    fn target(&self) -> Duration {
        self.bounded.statement_timeout / 2
    }

    /// One read of `keys` (and the block range `blocks`, for a scanned table), in its own bounded
    /// transaction. `Ok(None)` when the timeout cut it short.
    /// `may_cut`: under the bounded limits, and a cut returns `Ok(None)` to be retried smaller;
    /// otherwise under the full limits, where a cut is the error.
    async fn once(
        &self,
        keys: &[Vec<String>],
        blocks: Option<(u64, u64)>,
        may_cut: bool,
    ) -> Result<Option<Vec<Loaded>>, SimError> {
        let mut q = crate::db::query_as::<Loaded>(self.stmt.as_query()).persistent(false);
        for i in 0..self.columns {
            let column: Vec<&str> = keys.iter().map(|k| k[i].as_str()).collect();
            q = q.bind(column);
        }
        if let Some((from, to)) = blocks {
            q = q.bind(tid(from)).bind(tid(to));
        }
        for keys in &self.known {
            q = q.bind(*keys);
        }
        let limits = if may_cut { &self.bounded } else { self.limits };
        let mut tx = begin(self.pool, limits).await?;
        match q.fetch_all(&mut *tx).await {
            Ok(rows) => {
                tx.commit().await?;
                Ok(Some(rows))
            }
            Err(sqlx::Error::Database(e))
                if may_cut && e.code().as_deref() == Some(crate::sqlstate::QUERY_CANCELED) =>
            {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Keys looked up through an index, in chunks sized by time.
    async fn by_keys(
        &self,
        keys: &[Vec<String>],
        chunk: &mut Chunk,
    ) -> Result<Vec<Loaded>, SimError> {
        let mut out = Vec::new();
        let (mut at, mut cuts) = (0, 0);
        while at < keys.len() {
            let size = usize::try_from(chunk.size).unwrap_or(usize::MAX);
            let part = &keys[at..keys.len().min(at.saturating_add(size))];
            let started = Instant::now();
            match self.once(part, None, size > 1 && cuts < MAX_CUTS).await? {
                Some(rows) => {
                    out.extend(rows);
                    at += part.len();
                    cuts = 0;
                    // A short last part says little about a full one.
                    if part.len() == size {
                        *chunk = chunk.grown(started.elapsed(), self.target());
                    }
                }
                None => {
                    cuts += 1;
                    *chunk = chunk.cut();
                }
            }
        }
        Ok(out)
    }

    /// A table without an index on the looked-up columns: per chunk of keys, its blocks in ranges
    /// sized by time, then the rest of the table from the last block read (rows appended meanwhile).
    async fn by_blocks(
        &self,
        table: &crate::engine::catalog::Table,
        keys: &[Vec<String>],
        chunk: &mut Chunk,
    ) -> Result<Vec<Loaded>, SimError> {
        let blocks = self.blocks(table).await?;
        let mut out = Vec::new();
        for part in keys.chunks(KEYS_PER_SCAN) {
            let (mut at, mut cuts) = (0u64, 0);
            loop {
                let span = chunk.size;
                let last = at + span >= blocks;
                let to = if last { u64::from(u32::MAX) } else { at + span };
                let started = Instant::now();
                match self
                    .once(part, Some((at, to)), span > 1 && cuts < MAX_CUTS)
                    .await?
                {
                    Some(rows) => {
                        out.extend(rows);
                        if last {
                            break;
                        }
                        at = to;
                        cuts = 0;
                        *chunk = chunk.grown(started.elapsed(), self.target());
                    }
                    None => {
                        cuts += 1;
                        *chunk = chunk.cut();
                    }
                }
            }
        }
        Ok(out)
    }

    /// The table's size in blocks (`pg_relation_size` over `block_size`).
    async fn blocks(&self, table: &crate::engine::catalog::Table) -> Result<u64, SimError> {
        let mut tx = begin(self.pool, self.limits).await?;
        let n: i64 = crate::db::query_scalar(
            "SELECT pg_relation_size($1::oid) / current_setting('block_size')::int8",
        )
        .bind(i64::from(table.oid))
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// `(block,0)`: the first tuple address of a block, as text for a `::tid` cast.
fn tid(block: u64) -> String {
    format!("({block},0)")
}

/// The next chunk's size after one of `size` took `took`, aiming at `target`: at most 4× larger or
/// smaller, at least `min`.
fn resize(size: u64, took: Duration, target: Duration, min: u64) -> u64 {
    let ratio = target.as_secs_f64() / took.as_secs_f64().max(1e-4);
    ((size as f64 * ratio.clamp(0.25, 4.0)) as u64).max(min)
}
