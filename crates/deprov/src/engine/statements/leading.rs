//! The first keyword of a configured statement, read past whitespace and comments: how
//! [`super::check`] refuses DDL and utility statements (`DROP`, `TRUNCATE`, `CREATE`, `ALTER`,
//! `GRANT`, …), which PostgreSQL's Describe accepts like any other statement.
//!
//! This is no SQL parser: PostgreSQL has already parsed the statement (a statement it refuses never
//! gets here), and only the keyword that starts it is read. That keyword is the statement's kind in
//! PostgreSQL's grammar, with one case to know: a statement that starts with a `WITH` clause is a
//! SELECT, INSERT, UPDATE, DELETE or MERGE (the grammar allows nothing else after one), and one that
//! starts with `(` is a parenthesized SELECT.

/// The keywords a configured statement may start with: PostgreSQL's data-manipulation statements,
/// and `WITH` (see the module docs).
pub(super) const DML: [&str; 6] = ["SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "WITH"];

/// The first keyword of `sql`, upper-cased, after whitespace, `-- …` line comments and `/* … */`
/// block comments (which nest in PostgreSQL); `(` for a statement starting with a parenthesis;
/// `None` for a statement that is empty or starts with anything else.
pub(super) fn first_keyword(sql: &str) -> Option<String> {
    let rest = skip_blanks(sql);
    if rest.starts_with('(') {
        return Some("(".into());
    }
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let word = &rest[..end];
    (!word.is_empty() && word.starts_with(|c: char| c.is_ascii_alphabetic()))
        .then(|| word.to_ascii_uppercase())
}

/// Whether a statement starting with `keyword` ([`first_keyword`]) manipulates data: one of [`DML`],
/// or `(` (a parenthesized SELECT).
pub(super) fn is_dml(keyword: &str) -> bool {
    keyword == "(" || DML.contains(&keyword)
}

/// `sql` from its first character that is neither whitespace (PostgreSQL's: space, tab, newline,
/// carriage return, form feed, vertical tab) nor inside a comment. An unterminated block comment
/// leaves nothing.
fn skip_blanks(mut sql: &str) -> &str {
    loop {
        sql = sql.trim_start_matches([' ', '\t', '\n', '\r', '\x0c', '\x0b']);
        if let Some(comment) = sql.strip_prefix("--") {
            sql = comment.find(['\n', '\r']).map_or("", |at| &comment[at..]);
        } else if sql.starts_with("/*") {
            sql = after_block_comment(sql);
        } else {
            return sql;
        }
    }
}

/// `sql` (which starts with `/*`) after the block comment it starts, nested ones included; `""`
/// when it is not terminated.
fn after_block_comment(sql: &str) -> &str {
    let mut depth = 0usize;
    let mut i = 0;
    let bytes = sql.as_bytes();
    while i + 1 < bytes.len() {
        match (bytes[i], bytes[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return &sql[i..];
                }
            }
            _ => i += 1,
        }
    }
    ""
}

#[cfg(test)]
mod tests {
    use super::{first_keyword, is_dml};

    #[test]
    fn the_first_keyword_is_read_past_whitespace_and_comments() {
        for (sql, expected) in [
            ("UPDATE app.t SET x = 1 WHERE id = $1", Some("UPDATE")),
            ("  \n\tdelete from app.t where id = $1", Some("DELETE")),
            ("-- soft delete\nUpdate app.t SET x = 1", Some("UPDATE")),
            ("-- a\r\n-- b\n  INSERT INTO t VALUES ($1)", Some("INSERT")),
            (
                "/* one */ /* two /* nested */ still two */ DROP TABLE t",
                Some("DROP"),
            ),
            ("/*x*/truncate/*y*/app.t", Some("TRUNCATE")),
            (
                "WITH d AS (DELETE FROM t WHERE id = $1) SELECT 1",
                Some("WITH"),
            ),
            ("(SELECT $1::text)", Some("(")),
            ("select_x", Some("SELECT_X")),
            ("", None),
            ("-- only a comment", None),
            ("/* unterminated", None),
            ("$1", None),
        ] {
            assert_eq!(first_keyword(sql).as_deref(), expected, "{sql:?}");
        }
    }

    #[test]
    fn only_data_manipulation_counts_as_dml() {
        for dml in ["SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "WITH", "("] {
            assert!(is_dml(dml), "{dml}");
        }
        for other in [
            "DROP", "TRUNCATE", "CREATE", "ALTER", "GRANT", "REVOKE", "COPY", "DO", "CALL",
            "EXPLAIN", "VACUUM", "SET", "SELECT_X", "VALUES",
        ] {
            assert!(!is_dml(other), "{other}");
        }
    }
}
