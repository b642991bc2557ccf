//! The operator's SQL from the configuration file — `[soft_delete] statements` and
//! `undo_statements`, `[soft_delete] orphans`, `[sources.NAME] tenant_lookup` and `[vercel]
//! tenant_lookup` — as the engine binds and runs it ([`soft_delete`], [`lookup_tenant`]), and
//! [`check`], which has PostgreSQL parse and analyse such a statement the same way without running it.
//!
//! ## Describing a statement
//! To learn the type of `$1` (and, for [`check`], whether the statement is valid at all) deprov sends
//! the statement as an extended-protocol Parse + Describe ([`describe`]): the server parses and
//! analyses it — resolving every table, column, function and operator, and taking the locks a run
//! would take on the tables it names — and answers with its parameter and column types, or with the
//! error a run would get (42601 syntax error, 42P01 undefined table, 42703 undefined column, 42883
//! undefined function or operator, …). Nothing is executed. sqlx prepares such a statement under a
//! name (`sqlx_s_N`) even where deprov's own statements are unnamed (`crate::db`); [`describe`]
//! closes it again at once, inside the caller's transaction, so behind a transaction pooler
//! (PgBouncer `pool_mode = transaction`) the Parse and its Close reach the same server and no named
//! statement outlives the transaction there.

use sqlx::postgres::{PgArguments, PgDatabaseError, PgErrorPosition, PgRow, PgStatement};
use sqlx::postgres::{PgPool, PgTypeInfo};
use sqlx::query::Query;
use sqlx::{Column as _, Either, Executor as _, PgConnection, Postgres, Row as _};
use sqlx::{Statement as _, Type, TypeInfo as _};

use super::{BatchLimits, EngineError};

mod leading;

/// How the engine uses a configured statement: what it binds, and what it reads back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `$1` = the tenant key (or nothing, for a statement without parameters); the result is not read.
    /// `[soft_delete] statements` and `undo_statements` ([`soft_delete`]).
    Action,
    /// `$1` = the value to look up (or nothing); the first column of the first row is read as the
    /// tenant key. Each `tenant_lookup` ([`lookup_tenant`]).
    Lookup,
    /// No parameters; the first column of every row is read as a tenant key. `[soft_delete] orphans`
    /// (`crate::queue::reconcile`).
    Listing,
}

/// What the engine binds to `$1` of an [`Shape::Action`] or [`Shape::Lookup`] statement, chosen by the
/// type PostgreSQL infers for `$1`: the key is parsed into an integer or a uuid for those types, and
/// sent as `text` for every other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TenantParam {
    /// The statement has no parameters: nothing is bound.
    None,
    Int2,
    Int4,
    Int8,
    Uuid,
    /// Bound as a Rust `&str`: sqlx declares `$1` as `text` in its Parse.
    Text,
}

impl TenantParam {
    /// What the engine binds for `statement` (described without parameter types); `Err(n)` when it
    /// takes `n` > 1 parameters (only `$1` is ever given).
    fn of(statement: &PgStatement) -> Result<Self, usize> {
        Ok(match statement.parameters() {
            Some(Either::Left([])) => Self::None,
            Some(Either::Left([only])) => match only.name() {
                "INT2" => Self::Int2,
                "INT4" => Self::Int4,
                "INT8" => Self::Int8,
                "UUID" => Self::Uuid,
                _ => Self::Text,
            },
            Some(Either::Left(types)) => return Err(types.len()),
            _ => Self::Text,
        })
    }
}

/// Has the server parse and analyse `sql` (Parse + Describe), with `types` declared for its
/// parameters (empty: the server infers them), and returns its parameter and column types. Nothing
/// is executed. The named statement sqlx prepares is closed again before this returns (and any
/// statement sqlx had cached on `conn` before, so the Parse is never skipped for a cached one): call
/// it inside a transaction, so that behind a transaction pooler both reach the same server.
///
/// # Errors
/// The server's error for an invalid statement (a [`sqlx::Error::Database`] with its SQLSTATE);
/// connection errors.
pub async fn describe(
    conn: &mut PgConnection,
    sql: &str,
    types: &[PgTypeInfo],
) -> Result<PgStatement, sqlx::Error> {
    use sqlx::Connection as _;
    conn.clear_cached_statements().await?;
    let sql = sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(sql.to_owned()));
    let prepared = conn.prepare_with(sql, types).await;
    conn.clear_cached_statements().await?;
    prepared
}

/// Binds the tenant key to a configured statement's `$1` with the type PostgreSQL infers for it
/// ([`TenantParam`]): integer types and uuid are parsed, anything else is sent as text. Learning
/// that type takes a [`describe`] inside the caller's transaction.
async fn bind_tenant<'q>(
    conn: &mut PgConnection,
    sql: &'q str,
    tenant: &'q str,
) -> Result<Query<'q, Postgres, PgArguments>, EngineError> {
    let param = tenant_param(conn, sql).await?;
    bind_as(param, sql, tenant).map_err(|what| {
        EngineError::Statement(format!(
            "tenant key {tenant:?} is not a valid {what} for $1 of: {sql}"
        ))
    })
}

/// The type PostgreSQL infers for `sql`'s `$1` (a [`describe`] in the caller's transaction).
async fn tenant_param(conn: &mut PgConnection, sql: &str) -> Result<TenantParam, EngineError> {
    let described = describe(conn, sql, &[]).await?;
    TenantParam::of(&described).map_err(|n| {
        EngineError::Statement(format!(
            "takes {n} parameters; only $1 (the tenant key) is given: {sql}"
        ))
    })
}

/// `sql` with `tenant` bound as `param`; `Err(type name)` when the key is not a value of that type.
fn bind_as<'q>(
    param: TenantParam,
    sql: &'q str,
    tenant: &'q str,
) -> Result<Query<'q, Postgres, PgArguments>, &'static str> {
    let q = crate::db::query(sqlx::AssertSqlSafe(sql));
    Ok(match param {
        TenantParam::None => q,
        TenantParam::Int2 => q.bind(tenant.parse::<i16>().map_err(|_| "smallint")?),
        TenantParam::Int4 => q.bind(tenant.parse::<i32>().map_err(|_| "integer")?),
        TenantParam::Int8 => q.bind(tenant.parse::<i64>().map_err(|_| "bigint")?),
        TenantParam::Uuid => q.bind(tenant.parse::<uuid::Uuid>().map_err(|_| "uuid")?),
        TenantParam::Text => q.bind(tenant),
    })
}

/// Runs the undo statements (`[soft_delete] undo_statements`) in one bounded transaction, like
/// [`soft_delete`]; a statement's error names it (`soft_delete.undo_statements[N]`,
/// [`EngineError::Configured`]). Returns the rows affected, or `None`, running nothing, when a statement's `$1`
/// cannot take the tenant key (say `icfg_49` for a bigint): the soft delete of such a key could not
/// have run either, so there is nothing to restore.
///
/// # Errors
/// Database errors; [`EngineError::Statement`] when a statement takes more parameters than `$1`.
pub async fn undo_soft_delete(
    target: &PgPool,
    statements: &[String],
    tenant: &str,
    limits: &BatchLimits,
) -> Result<Option<u64>, EngineError> {
    let mut tx = crate::db::begin(target, limits.bounds()).await?;
    let mut rows = 0;
    for (i, sql) in statements.iter().enumerate() {
        let setting = || format!("soft_delete.undo_statements[{i}]");
        let param = tenant_param(&mut tx, sql)
            .await
            .map_err(|e| e.in_setting(setting()))?;
        let Ok(q) = bind_as(param, sql, tenant) else {
            tx.rollback().await?;
            return Ok(None);
        };
        rows += q
            .execute(&mut *tx)
            .await
            .map_err(|e| EngineError::from(e).in_setting(setting()))?
            .rows_affected();
    }
    tx.commit().await?;
    Ok(Some(rows))
}

/// Step 1: runs the soft-delete statements in one bounded transaction. Returns rows affected. A
/// statement's error names it (`soft_delete.statements[N]`, [`EngineError::Configured`]).
///
/// # Errors
/// Database errors; [`EngineError::Statement`] when a statement's `$1` cannot take the tenant key.
pub async fn soft_delete(
    target: &PgPool,
    statements: &[String],
    tenant: &str,
    limits: &BatchLimits,
) -> Result<u64, EngineError> {
    let mut tx = crate::db::begin(target, limits.bounds()).await?;
    let rows = soft_delete_in(&mut tx, statements, tenant).await?;
    tx.commit().await?;
    Ok(rows)
}

/// The soft-delete statements inside the caller's transaction. Returns rows affected.
///
/// # Errors
/// As [`soft_delete`].
pub(crate) async fn soft_delete_in(
    tx: &mut PgConnection,
    statements: &[String],
    tenant: &str,
) -> Result<u64, EngineError> {
    let mut rows = 0;
    for (i, sql) in statements.iter().enumerate() {
        let ran = async {
            let q = bind_tenant(&mut *tx, sql, tenant).await?;
            Ok::<_, EngineError>(q.execute(&mut *tx).await?.rows_affected())
        };
        rows += ran
            .await
            .map_err(|e| e.in_setting(format!("soft_delete.statements[{i}]")))?;
    }
    Ok(rows)
}

/// Whether a column of type `ty` can be read as a tenant key by [`key_text`]: a text type (`text`,
/// `varchar`, `char`, `name`, `citext`), `smallint`, `integer`, `bigint` or `uuid`.
pub fn is_key_type(ty: &PgTypeInfo) -> bool {
    <String as Type<Postgres>>::compatible(ty)
        || <i64 as Type<Postgres>>::compatible(ty)
        || <i32 as Type<Postgres>>::compatible(ty)
        || <i16 as Type<Postgres>>::compatible(ty)
        || <uuid::Uuid as Type<Postgres>>::compatible(ty)
}

/// Reads the first column of `row` as a tenant key: text as it is, integers and uuids printed;
/// `Ok(None)` for NULL; `Err(())` for a column of any other type (see [`is_key_type`]).
#[allow(clippy::result_unit_err)]
pub fn key_text(row: &PgRow) -> Result<Option<String>, ()> {
    if let Ok(v) = row.try_get::<Option<String>, _>(0) {
        return Ok(v);
    }
    if let Ok(v) = row.try_get::<Option<i64>, _>(0) {
        return Ok(v.map(|n| n.to_string()));
    }
    if let Ok(v) = row.try_get::<Option<i32>, _>(0) {
        return Ok(v.map(|n| n.to_string()));
    }
    if let Ok(v) = row.try_get::<Option<i16>, _>(0) {
        return Ok(v.map(|n| n.to_string()));
    }
    row.try_get::<Option<uuid::Uuid>, _>(0)
        .map(|v| v.map(|u| u.to_string()))
        .map_err(|_| ())
}

/// Resolves a tenant key with the configured lookup statement (`$1` = the lookup value; the first
/// column of the first row is the tenant key, read by [`key_text`]). `None` when no row matches or
/// the key is NULL. The caller names the setting in its errors ([`EngineError::in_setting`]).
///
/// # Errors
/// Database errors; [`EngineError::Statement`] for an unusable statement.
pub async fn lookup_tenant(
    target: &PgPool,
    sql: &str,
    value: &str,
    limits: &BatchLimits,
) -> Result<Option<String>, EngineError> {
    let mut tx = crate::db::begin(target, limits.bounds()).await?;
    let q = bind_tenant(&mut tx, sql, value).await?;
    let row = q.fetch_optional(&mut *tx).await?;
    tx.commit().await?;
    let Some(row) = row else { return Ok(None) };
    key_text(&row).map_err(|()| {
        EngineError::Statement(format!(
            "lookup must return text, an integer or a uuid: {sql}"
        ))
    })
}

/// Why PostgreSQL (or deprov, for a statement the engine cannot call) refuses a configured
/// statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The server's SQLSTATE (`42601`, `42P01`, `42703`, `42883`, …); `None` when deprov refuses a
    /// statement the server accepted (not DML, too many parameters, an unusable first column).
    pub sqlstate: Option<String>,
    /// The server's message (with its position, detail and hint when it sent them), or deprov's
    /// reason.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.sqlstate {
            Some(code) => write!(f, "{} (SQLSTATE {code})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// The outcome of [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The statement can be run as the engine runs it.
    Accepted,
    /// It cannot; the run would fail with this.
    Refused(Refusal),
}

/// The statement's error as a [`Refusal`], when it is the server refusing the statement; `None` when
/// the check could not run: what [`super::is_retryable`] retries (connection errors, timeouts, lock
/// waits, deadlocks), resource, shutdown, system and internal errors (classes 53, 57, 58, XX), and
/// errors about the connection's state rather than the statement (classes 25 and 26, and 42P05: a
/// prepared statement of that name already exists).
fn refusal(e: &sqlx::Error, context: &str) -> Option<Refusal> {
    let sqlx::Error::Database(d) = e else {
        return None;
    };
    let code = d.code()?.into_owned();
    let not_the_statement = ["53", "57", "58", "XX", "25", "26"]
        .iter()
        .any(|class| code.starts_with(class))
        || code == crate::sqlstate::DUPLICATE_PREPARED_STATEMENT;
    if super::is_retryable(e) || not_the_statement {
        return None;
    }
    // The server's message, not sqlx's text for it (which ends in the C source line that raised
    // it: `… at line 1188`), with the detail and hint sqlx leaves out.
    let mut message = format!("{context}{}", d.message());
    if let Some(pg) = d.try_downcast_ref::<PgDatabaseError>() {
        if let Some(PgErrorPosition::Original(at)) = pg.position() {
            message.push_str(&format!(" at character {at}"));
        }
        message.push_str(&crate::db::errors::detail_and_hint(pg));
    }
    Some(Refusal {
        sqlstate: Some(code),
        message,
    })
}

fn refused(message: String) -> Verdict {
    Verdict::Refused(Refusal {
        sqlstate: None,
        message,
    })
}

/// Has the server parse and analyse `sql` as the engine would run it with `shape` ([`describe`]),
/// without running it, and refuses what a run would refuse: the server's error for an invalid
/// statement (with its detail and hint); a statement that does not start with UPDATE, DELETE,
/// INSERT, MERGE, SELECT or WITH (DDL and utility statements: DROP, TRUNCATE, CREATE, GRANT,
/// EXPLAIN, CALL, …; read by `leading::first_keyword` past comments); no `$1` or more than `$1`
/// ([`Shape::Action`], [`Shape::Lookup`]; `$2` without `$1` too, see `describe_or_refuse`) or
/// any parameter ([`Shape::Listing`]); a `$1` whose inferred type the engine does not bind as such and that does not
/// accept the key as `text` (e.g. `numeric_column = $1`: 42883); for lookups and listings, no first
/// column or one that is not a key type ([`is_key_type`]). Run it inside a transaction on `conn`
/// (one per statement: a refused statement aborts it) and roll that back.
///
/// # Errors
/// When the check could not run: connection errors, and the server's errors that are not about the
/// statement (timeouts, lock waits, deadlocks, shutdown, resources, the connection's state).
pub async fn check(
    conn: &mut PgConnection,
    sql: &str,
    shape: Shape,
) -> Result<Verdict, sqlx::Error> {
    let described = match describe_or_refuse(conn, sql, shape).await? {
        Ok(s) => s,
        Err(verdict) => return Ok(verdict),
    };
    if let Some(kind) = leading::first_keyword(sql).filter(|k| !leading::is_dml(k)) {
        return Ok(refused(format!(
            "is a {kind} statement; {} must be UPDATE, DELETE, INSERT, MERGE or SELECT (a WITH \
             clause before one is fine): DDL and other utility statements are refused",
            kind_of(shape)
        )));
    }
    let param = match TenantParam::of(&described) {
        Err(n) if shape == Shape::Listing => {
            return Ok(refused(format!(
                "takes {n} parameters; the orphans statement is run without any"
            )));
        }
        Err(n) => {
            return Ok(refused(format!(
                "takes {n} parameters ($1 to ${n}); only $1 is given ({})",
                given(shape)
            )));
        }
        Ok(TenantParam::None) if shape != Shape::Listing => {
            // A forgotten `WHERE … = $1` makes a statement act on the same rows whatever the
            // tenant: every tenant soft-deleted, or one lookup result for every installation.
            return Ok(refused(format!(
                "uses no $1: it would do the same whatever {} (write it as $1, e.g. WHERE id = $1)",
                given(shape)
            )));
        }
        Ok(TenantParam::None) => TenantParam::None,
        Ok(_) if shape == Shape::Listing => {
            return Ok(refused(
                "takes 1 parameter ($1); the orphans statement is run without any".into(),
            ));
        }
        Ok(p) => p,
    };
    if shape != Shape::Action {
        match described.columns().first() {
            None => {
                return Ok(refused(
                    "returns no columns; its first column must be the tenant key".into(),
                ));
            }
            Some(c) if !is_key_type(c.type_info()) => {
                return Ok(refused(format!(
                    "its first column {:?} is of type {}; a tenant key must be text, an integer \
                     or uuid (cast it, e.g. with ::text)",
                    c.name(),
                    c.type_info().name().to_lowercase()
                )));
            }
            Some(_) => {}
        }
    }
    let inferred = described
        .parameters()
        .and_then(|p| p.left())
        .and_then(|t| t.first())
        .map(|t| t.name().to_owned());
    if param == TenantParam::Text && inferred.as_deref() != Some("TEXT") {
        // The engine sends such a key as text: the statement must take it so.
        let text = <&str as Type<Postgres>>::type_info();
        if let Err(e) = describe(conn, sql, &[text]).await {
            let context = format!(
                "$1 is inferred as {}, and deprov sends the key as text: ",
                inferred.as_deref().unwrap_or("unknown").to_lowercase()
            );
            return refusal(&e, &context).map(Verdict::Refused).ok_or(e);
        }
    }
    Ok(Verdict::Accepted)
}

// SQLSTATE 42P18 (indeterminate_datatype) names a parameter the statement does not use (below one
// it does) or uses where no type can be inferred.
use crate::sqlstate::INDETERMINATE_DATATYPE;

/// [`describe`] inside a savepoint, the server's refusal as a [`Verdict`]. A statement refused with
/// [`INDETERMINATE_DATATYPE`] is described again with `$1` declared `text`: when that passes with
/// more parameters than `$1`, or fails the same way again (now about a parameter beyond `$1`), the
/// statement uses a parameter the engine never gives (`WHERE id = $2` without `$1`), and is refused
/// for that rather than for `$1`'s type. An orphans statement ([`Shape::Listing`]) refused with it
/// uses a parameter.
///
/// # Errors
/// What [`check`] returns as errors.
async fn describe_or_refuse(
    conn: &mut PgConnection,
    sql: &str,
    shape: Shape,
) -> Result<Result<PgStatement, Verdict>, sqlx::Error> {
    let mut savepoint = crate::db::savepoint(conn).await?;
    let first = describe(&mut savepoint, sql, &[]).await;
    let refused_first = match first {
        Ok(s) => {
            savepoint.commit().await?;
            return Ok(Ok(s));
        }
        Err(e) => refusal(&e, "").ok_or(e)?,
    };
    savepoint.rollback().await?;
    if refused_first.sqlstate.as_deref() != Some(INDETERMINATE_DATATYPE) {
        return Ok(Err(Verdict::Refused(refused_first)));
    }
    if shape == Shape::Listing {
        return Ok(Err(refused(
            "uses parameters; the orphans statement is run without any".into(),
        )));
    }
    let beyond = |uses: String| {
        Ok(Err(refused(format!(
            "must use $1 ({}) and no other parameter, but uses {uses}",
            given(shape)
        ))))
    };
    let text = <&str as Type<Postgres>>::type_info();
    match describe(conn, sql, &[text]).await {
        Ok(s) => match s.parameters() {
            Some(Either::Left(types)) if types.len() > 1 => beyond(format!("${}", types.len())),
            _ => Ok(Err(Verdict::Refused(refused_first))),
        },
        Err(e) => match refusal(&e, "") {
            Some(r) if r.sqlstate.as_deref() == Some(INDETERMINATE_DATATYPE) => {
                beyond("a parameter beyond $1".into())
            }
            Some(_) => Ok(Err(Verdict::Refused(refused_first))),
            None => Err(e),
        },
    }
}

/// What statements of `shape` are, in words.
fn kind_of(shape: Shape) -> &'static str {
    match shape {
        Shape::Action => "soft-delete and undo statements",
        Shape::Lookup => "a tenant_lookup",
        Shape::Listing => "the orphans statement",
    }
}

/// What `$1` is for a statement of `shape`, in words.
fn given(shape: Shape) -> &'static str {
    match shape {
        Shape::Action => "the tenant key",
        Shape::Lookup => "the value to look up",
        Shape::Listing => "nothing",
    }
}
