//! Database errors in the words an operator needs, for what deprov prints and logs at start and in
//! `deprov config check`.
//!
//! sqlx's text for an error the server sent is `error returned from database: <message> at line
//! <N>`, where N is the line of PostgreSQL's C source that raised it (the `L` field of the
//! ErrorResponse), and it leaves out the server's detail and hint. [`error_text`] shows the message,
//! detail, hint and SQLSTATE instead.

use sqlx::postgres::PgDatabaseError;

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
