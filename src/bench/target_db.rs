//! The database steps of `deprov-lab bench delete --target-url` ([`super::target`]): the scratch
//! databases' names, the template copy, the catalog reads and the table-by-table comparison.

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};

use super::error::TargetError;
use deprov::sql::{QualifiedName, SqlBuilder, SqlType};
use deprov_demo::{differing_tables, table_digest};

/// The generated names of the three scratch databases.
#[derive(Debug, Clone)]
pub(super) struct Names {
    pub(super) cascade: String,
    pub(super) deprov: String,
    pub(super) state: String,
}

impl Names {
    /// `<source>_dpv_<role>_<8 hex>`: the source's name kept to letters, digits and `_` (at most
    /// 30), so the whole stays under PostgreSQL's 63 bytes and needs no quoting to read.
    pub(super) fn new(source: &str) -> Self {
        let base: String = source
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(30)
            .collect();
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let name = |role: &str| format!("{base}_dpv_{role}_{suffix}");
        Self {
            cascade: name("cascade"),
            deprov: name("deprov"),
            state: name("state"),
        }
    }

    pub(super) fn all(&self) -> [&str; 3] {
        [&self.cascade, &self.deprov, &self.state]
    }
}

/// A small pool on the server's `postgres` database, else `template1` (never on `database`, which
/// must have no session for the copy). A server that refuses the connection (down, a wrong port or
/// password) is reported at once with its cause.
pub(super) async fn admin_pool(
    source: &PgConnectOptions,
    database: &str,
) -> Result<PgPool, sqlx::Error> {
    let mut last = None;
    for admin in ["postgres", "template1"]
        .into_iter()
        .filter(|d| *d != database)
    {
        let options = source.clone().database(admin);
        // One connection first: a pool would retry a refused connection until its acquire
        // timeout and then report only that it timed out.
        match PgConnection::connect_with(&options).await {
            Ok(conn) => {
                let _ = conn.close().await;
                return PgPoolOptions::new()
                    .max_connections(2)
                    .connect_with(options)
                    .await;
            }
            // No such database: the other one may exist.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => {
                last = Some(sqlx::Error::Database(e));
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("one of the two is not the source"))
}

/// `CREATE DATABASE to TEMPLATE from`, with no attempt to end other sessions on `from` (it is the
/// user's database): SQLSTATE 55006 becomes [`TargetError::SourceBusy`].
pub(super) async fn copy_database(admin: &PgPool, from: &str, to: &str) -> Result<(), TargetError> {
    let mut b = SqlBuilder::new();
    b.sql("CREATE DATABASE ")
        .ident(to)
        .sql(" TEMPLATE ")
        .ident(from);
    match deprov::db::query(b.build().as_query()).execute(admin).await {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e))
            if e.code().as_deref() == Some(deprov::sqlstate::OBJECT_IN_USE) =>
        {
            let sessions: i64 = deprov::db::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            )
            .bind(from)
            .fetch_one(admin)
            .await?;
            Err(TargetError::SourceBusy {
                database: from.to_owned(),
                sessions,
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// `CHECKPOINT`; without the privilege (SQLSTATE 42501: superuser or `pg_checkpoint`) a note instead.
pub(super) async fn checkpoint(admin: &PgPool, notes: &mut Vec<String>) -> Result<(), sqlx::Error> {
    match super::side::checkpoint(admin).await {
        Err(sqlx::Error::Database(e))
            if e.code().as_deref() == Some(deprov::sqlstate::INSUFFICIENT_PRIVILEGE) =>
        {
            let note =
                "no CHECKPOINT before the measured phases (it needs superuser or pg_checkpoint)";
            if !notes.iter().any(|n| n == note) {
                notes.push(note.into());
            }
            Ok(())
        }
        other => other,
    }
}

/// The key column's type as `format_type` prints it.
pub(super) async fn key_type(
    pool: &PgPool,
    root: &QualifiedName,
    column: &str,
) -> Result<SqlType, TargetError> {
    let ty: Option<String> = deprov::db::query_scalar(
        "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
         WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(root.to_string())
    .bind(column)
    .fetch_optional(pool)
    .await?;
    ty.map(SqlType::from_catalog)
        .ok_or_else(|| TargetError::NoRoot {
            root: root.clone(),
            column: column.to_owned(),
        })
}

/// Fails with [`TargetError::NoTenant`] when no root row has the key, [`TargetError::BadKey`] when
/// the key does not read as `key_type`.
pub(super) async fn tenant_exists(
    pool: &PgPool,
    root: &QualifiedName,
    column: &str,
    key_type: &SqlType,
    tenant: &str,
) -> Result<(), TargetError> {
    let mut b = SqlBuilder::new();
    b.sql("SELECT EXISTS (SELECT 1 FROM ")
        .table(root)
        .sql(" WHERE ")
        .ident(column)
        .sql(" = $1::")
        .ty(key_type)
        .sql(")");
    let found: bool = deprov::db::query_scalar(b.build().as_query())
        .bind(tenant)
        .fetch_one(pool)
        .await
        .map_err(|e| match e.as_database_error() {
            // Class 22, data exception (PostgreSQL docs, Appendix A): the key text does not read
            // as the column's type.
            Some(d) if d.code().is_some_and(|c| c.starts_with("22")) => TargetError::BadKey {
                tenant: tenant.to_owned(),
                key_type: key_type.as_str().to_owned(),
                message: d.message().to_owned(),
            },
            _ => TargetError::Db(e),
        })?;
    if found {
        Ok(())
    } else {
        Err(TargetError::NoTenant {
            root: root.clone(),
            column: column.to_owned(),
            tenant: tenant.to_owned(),
        })
    }
}

/// A key of `key_type` that no root row has, for the warm-up request of
/// [`super::side::Deprov::serve`]: the first of a fresh UUID (uuid and text keys) and `-4242`
/// (integer and numeric keys) that casts to the type and is absent. `None` when neither does.
pub(super) async fn absent_key(
    pool: &PgPool,
    root: &QualifiedName,
    column: &str,
    key_type: &SqlType,
) -> Result<Option<String>, TargetError> {
    for key in [uuid::Uuid::new_v4().to_string(), "-4242".to_owned()] {
        match tenant_exists(pool, root, column, key_type, &key).await {
            Err(TargetError::NoTenant { .. }) => return Ok(Some(key)),
            // Present, or not a value of the type.
            Ok(()) | Err(TargetError::BadKey { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The tables whose contents differ between the two copies ([`table_digest`] of each).
pub(super) async fn compare(
    a: &PgConnectOptions,
    b: &PgConnectOptions,
    tables: &[QualifiedName],
) -> Result<Vec<QualifiedName>, sqlx::Error> {
    let mut digests = Vec::new();
    for options in [a, b] {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        let mut digest = deprov_demo::DatabaseDigest::new();
        for table in tables {
            digest.insert(table.clone(), table_digest(&pool, table).await?);
        }
        pool.close().await;
        digests.push(digest);
    }
    Ok(differing_tables(&digests[0], &digests[1]))
}
