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
