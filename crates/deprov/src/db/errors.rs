//! Database errors in the words an operator needs, for what deprov prints and logs at start and in
//! `deprov config check`.
//!
//! sqlx's text for an error the server sent is `error returned from database: <message> at line
//! <N>`, where N is the line of PostgreSQL's C source that raised it (the `L` field of the
//! ErrorResponse), and it leaves out the server's detail and hint. [`error_text`] shows the message,
//! detail, hint and SQLSTATE instead. And when the server refuses connections, sqlx's pool retries
//! until its acquire timeout and then reports only `pool timed out while waiting for an open
//! connection`; [`unreachable_text`] finds the cause with one connection attempt of its own.

use sqlx::postgres::PgDatabaseError;
use sqlx::{Connection as _, PgConnection, PgPool};

/// `e` for an operator: for an error the server sent, its message, then `; detail: …` and `; hint:
/// …` when it sent them, and ` (SQLSTATE xxxxx)`; sqlx's own text for anything else.
pub fn error_text(e: &sqlx::Error) -> String {
    let sqlx::Error::Database(d) = e else {
        return e.to_string();
    };
    let mut text = d.message().to_owned();
    if let Some(pg) = d.try_downcast_ref::<PgDatabaseError>() {
        text.push_str(&detail_and_hint(pg));
    }
    if let Some(code) = d.code() {
        text.push_str(&format!(" (SQLSTATE {code})"));
    }
    text
}

/// The server's detail and hint of `pg`, each as `; detail: …` / `; hint: …`, or nothing.
pub fn detail_and_hint(pg: &PgDatabaseError) -> String {
    let mut text = String::new();
    if let Some(detail) = pg.detail() {
        text.push_str(&format!("; detail: {detail}"));
    }
    if let Some(hint) = pg.hint() {
        text.push_str(&format!("; hint: {hint}"));
    }
    text
}

/// [`error_text`] of `e`, an error from using `pool`, except that for a pool acquire timeout
/// (`PoolTimedOut`) one connection is attempted with `pool`'s options, outside the pool and bounded
/// by its acquire timeout, and its error given instead (`Connection refused (os error 111)`, an
/// unknown host, a refused password, a database that does not exist): what sqlx's pool retried
/// until it timed out. When that attempt connects (it is closed at once) or times out too, the
/// pool's timeout is the answer.
pub async fn unreachable_text(pool: &PgPool, e: &sqlx::Error) -> String {
    if !matches!(e, sqlx::Error::PoolTimedOut) {
        return error_text(e);
    }
    let options = pool.connect_options();
    let wait = pool.options().get_acquire_timeout();
    match tokio::time::timeout(wait, PgConnection::connect_with(&options)).await {
        Ok(Err(cause)) => error_text(&cause),
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            error_text(e)
        }
        Err(_) => error_text(e),
    }
}

/// The text of `e`, one error of a chain, for an operator: [`error_text`] when it is a database
/// error (sqlx's, or the engine's [`crate::engine::EngineError::Db`]) — with a hint to run
/// `deprov migrate` when what is missing is deprov's own schema or one of its tables — else its
/// own text.
pub fn cause_text(e: &(dyn std::error::Error + 'static)) -> String {
    let Some(db) = as_database(e) else {
        return e.to_string();
    };
    let mut text = error_text(db);
    if missing_state_schema(db) {
        text.push_str("; the state database has no deprov schema yet: run `deprov migrate`");
    }
    text
}

/// Whether `e` says deprov's schema, or a table of it, does not exist (SQLSTATE 3F000 / 42P01).
fn missing_state_schema(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(d) = e else {
        return false;
    };
    matches!(d.code().as_deref(), Some("3F000" | "42P01")) && d.message().contains("\"deprov")
}

/// Whether `e` is an error the server sent (sqlx's, or the engine's): [`cause_text`] has said all
/// of it, and its source, the server's error in sqlx's words (`… at line N`, PostgreSQL's C source
/// line), adds nothing.
pub fn from_server(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(as_database(e), Some(sqlx::Error::Database(_)))
}

/// `e` as sqlx's error: itself, or the one the engine's [`crate::engine::EngineError::Db`] holds.
fn as_database<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e sqlx::Error> {
    e.downcast_ref::<sqlx::Error>().or_else(|| {
        match e.downcast_ref::<crate::engine::EngineError>() {
            Some(crate::engine::EngineError::Db(d)) => Some(d),
            _ => None,
        }
    })
}
