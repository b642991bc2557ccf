//! The one place where SQL text is assembled at run time.
//!
//! Table and column names come from the configuration file and from `pg_catalog`; they are always
//! double-quoted here (PostgreSQL docs §4.1.1 "Identifiers and Key Words": inside a quoted identifier a
//! `"` is written `""`). [`SqlBuilder`] accepts only `&'static str` fragments, quoted identifiers,
//! catalog type names and default expressions, numbered parameters and integers, so no request data can reach the SQL text:
//! values always travel as bind parameters. Every other module builds dynamic SQL through this one.

use std::fmt;

/// Quotes one identifier: `My "T"` becomes `"My ""T"""`.
pub fn quote_ident(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' {
            out.push('"');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// A schema-qualified relation name exactly as stored in `pg_catalog` (no case folding applied).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct QualifiedName {
    /// `pg_namespace.nspname`.
    pub schema: String,
    /// `pg_class.relname`.
    pub name: String,
}

impl QualifiedName {
    /// A name from its two catalog parts.
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            schema: schema.into(),
            name: name.into(),
        }
    }

    /// Parses `schema.table` as written in the configuration file.
    ///
    /// Each part is either bare (taken exactly as written: `app.UserAccounts` names the table whose
    /// catalog name is `UserAccounts`; deprov does the quoting) or double-quoted with `""` for a quote
    /// (needed only when a name contains a dot: `"my.schema"."t"`).
    ///
    /// # Errors
    /// A reason when there are not exactly two non-empty parts or a quote is unbalanced.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut cur = String::new();
        let mut chars = text.trim().chars().peekable();
        let mut quoted_part = false;
        while let Some(c) = chars.next() {
            match c {
                '"' if cur.is_empty() && !quoted_part => {
                    quoted_part = true;
                    loop {
                        match chars.next() {
                            Some('"') if chars.peek() == Some(&'"') => {
                                chars.next();
                                cur.push('"');
                            }
                            Some('"') => break,
                            Some(ch) => cur.push(ch),
                            None => return Err(format!("unbalanced double quote in {text:?}")),
                        }
                    }
                }
                '.' => {
                    parts.push(std::mem::take(&mut cur));
                    quoted_part = false;
                }
                _ if quoted_part => return Err(format!("text after a closing quote in {text:?}")),
                _ => cur.push(c),
            }
        }
        parts.push(cur);
        match parts.as_slice() {
            [schema, name] if !schema.is_empty() && !name.is_empty() => Ok(Self::new(schema, name)),
            _ => Err(format!(
                "expected a schema-qualified table name like \"app.accounts\", got {text:?}"
            )),
        }
    }
}

impl fmt::Display for QualifiedName {
    /// The quoted form, ready for SQL: `"app"."accounts"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}",
            quote_ident(&self.schema),
            quote_ident(&self.name)
        )
    }
}

/// A type name as printed by `format_type(atttypid, atttypmod)` (already quoted by PostgreSQL).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct SqlType(String);

impl SqlType {
    /// Wraps the output of `format_type()`. Only catalog output may be passed here.
    pub fn from_catalog(formatted: String) -> Self {
        Self(formatted)
    }

    /// The type as text, e.g. `bigint` or `"MyType"`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A column default expression as printed by `pg_get_expr(pg_attrdef.adbin, adrelid)`: SQL text that
/// PostgreSQL itself produced (as `pg_dump` uses it). Only catalog output may be wrapped here, and only
/// an expression without volatile functions should be evaluated (see `engine::simulate`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct CatalogExpr(String);

impl CatalogExpr {
    /// Wraps the output of `pg_get_expr()`. Only catalog output may be passed here.
    pub fn from_catalog(printed: String) -> Self {
        Self(printed)
    }

    /// The expression as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What the opening of a bounded transaction sets ([`begin_bounded`]); `crate::db::Bounds` makes
/// one.
#[derive(Debug, Clone, Copy)]
pub struct Opening {
    /// `lock_timeout`.
    pub lock: std::time::Duration,
    /// `statement_timeout`.
    pub statement: std::time::Duration,
    /// `idle_in_transaction_session_timeout`.
    pub idle: std::time::Duration,
    /// `synchronous_commit`: `Some(true)` on, `Some(false)` off, `None` the session's.
    pub synchronous_commit: Option<bool>,
    /// Plain index scans only: `enable_seqscan`, `enable_bitmapscan` and `enable_indexonlyscan`
    /// off.
    pub plain_index_scans: bool,
}

/// The opening of a bounded transaction (see `crate::db::begin`): `BEGIN; SET LOCAL lock_timeout =
/// '<n>ms'; SET LOCAL idle_in_transaction_session_timeout = '<i>ms'; SET LOCAL jit = off`, plus
/// `SET LOCAL synchronous_commit = on | off` when `opening.synchronous_commit` says, the planner
/// settings of `opening.plain_index_scans`, and last `SET LOCAL statement_timeout = '<m>ms'`. Sent
/// as one simple-protocol query. Durations are whole milliseconds, at least 1 (0 would mean "no
/// limit" to PostgreSQL).
///
/// `jit = off`: PostgreSQL compiles a statement whose estimated cost passes `jit_above_cost`
/// (PostgreSQL docs §32.2, "When to JIT?") before it runs, and the compile does not answer a
/// cancel. A batch over thousands of parents is estimated far above that cost whatever it then
/// reads, and inlining and optimising its expressions take a few hundred milliseconds: a statement
/// with a bound of tens of milliseconds would hold its transaction several times that long.
pub fn begin_bounded(opening: &Opening) -> sqlx::AssertSqlSafe<String> {
    let ms = |d: std::time::Duration| d.as_millis().max(1);
    let mut sql = format!(
        "BEGIN; SET LOCAL lock_timeout = '{}ms'; SET LOCAL idle_in_transaction_session_timeout = '{}ms'; \
         SET LOCAL jit = off",
        ms(opening.lock),
        ms(opening.idle)
    );
    match opening.synchronous_commit {
        None => {}
        Some(true) => sql.push_str("; SET LOCAL synchronous_commit = on"),
        Some(false) => sql.push_str("; SET LOCAL synchronous_commit = off"),
    }
    if opening.plain_index_scans {
        sql.push_str(
            "; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
             SET LOCAL enable_indexonlyscan = off",
        );
    }
    // statement_timeout last: it bounds the statements after it, and no statement of the opening
    // may fail after BEGIN. sqlx (0.9) counts the transaction, and so rolls it back on drop, only
    // once the whole message succeeded: an opening that failed after BEGIN would go back to the
    // pool inside an aborted transaction (25P02 for the connection's next user). Seen once: a job
    // failed with 25P02 when a trial build gave every batch a 16 ms bound on a busy machine.
    sql.push_str(&format!(
        "; SET LOCAL statement_timeout = '{}ms'",
        ms(opening.statement)
    ));
    sqlx::AssertSqlSafe(sql)
}

/// A finished statement, to be run with `db::query(stmt.as_query())`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement(String);

impl Statement {
    /// The text, for logs and `deprov plan`.
    pub fn text(&self) -> &str {
        &self.0
    }

    /// The text in the form sqlx 0.9 accepts for dynamic SQL.
    pub fn as_query(&self) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(self.0.clone())
    }
}

/// Builds a statement from static text, quoted identifiers and parameters only.
#[derive(Debug, Default)]
pub struct SqlBuilder {
    buf: String,
}

impl SqlBuilder {
    /// An empty statement.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder that goes on from a finished statement's text (to append to its select list).
    pub fn extend(stmt: &Statement) -> Self {
        Self {
            buf: stmt.0.clone(),
        }
    }

    /// Appends fixed SQL text.
    pub fn sql(&mut self, text: &'static str) -> &mut Self {
        self.buf.push_str(text);
        self
    }

    /// Appends a quoted identifier (column, alias-free name).
    pub fn ident(&mut self, name: &str) -> &mut Self {
        self.buf.push_str(&quote_ident(name));
        self
    }

    /// Appends `alias.` followed by the quoted column: `t3."account_id"`.
    pub fn col(&mut self, alias: usize, column: &str) -> &mut Self {
        self.alias(alias).sql(".").ident(column)
    }

    /// Appends a quoted, schema-qualified table name.
    pub fn table(&mut self, name: &QualifiedName) -> &mut Self {
        self.buf.push_str(&name.to_string());
        self
    }

    /// Appends a table as a statement's target or `FROM` item: `ONLY "s"."t"`, or without `ONLY`
    /// when `partitioned` (a partitioned table holds no rows of its own; its partitions are
    /// reached through it). `ONLY` keeps a statement off the tables that `INHERITS` from it: a
    /// foreign key covers only its own table, and PostgreSQL's referential triggers query `ONLY`
    /// the same way (`ri_triggers.c`), so the cascade never touches an inheriting child's rows.
    pub fn relation(&mut self, name: &QualifiedName, partitioned: bool) -> &mut Self {
        if !partitioned {
            self.buf.push_str("ONLY ");
        }
        self.table(name)
    }

    /// Appends a catalog type name.
    pub fn ty(&mut self, ty: &SqlType) -> &mut Self {
        self.buf.push_str(ty.as_str());
        self
    }

    /// Appends a parenthesized catalog expression: `(<expr>)`.
    pub fn expr(&mut self, expr: &CatalogExpr) -> &mut Self {
        self.buf.push('(');
        self.buf.push_str(expr.as_str());
        self.buf.push(')');
        self
    }

    /// Appends the table alias `tN`.
    pub fn alias(&mut self, n: usize) -> &mut Self {
        self.buf.push('t');
        self.buf.push_str(&n.to_string());
        self
    }

    /// Appends the bind parameter `$n`.
    pub fn param(&mut self, n: usize) -> &mut Self {
        self.buf.push('$');
        self.buf.push_str(&n.to_string());
        self
    }

    /// Appends an integer literal.
    pub fn int(&mut self, n: i64) -> &mut Self {
        self.buf.push_str(&n.to_string());
        self
    }

    /// Appends `items` separated by `sep`, each rendered by `f`.
    pub fn join<T>(
        &mut self,
        items: &[T],
        sep: &'static str,
        mut f: impl FnMut(&mut Self, usize, &T),
    ) -> &mut Self {
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.sql(sep);
            }
            f(self, i, item);
        }
        self
    }

    /// The finished statement.
    pub fn build(&self) -> Statement {
        Statement(self.buf.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opening_sets_statement_timeout_last() {
        for (synchronous_commit, plain_index_scans) in [(None, false), (Some(false), true)] {
            let sql = begin_bounded(&Opening {
                lock: std::time::Duration::from_millis(5),
                statement: std::time::Duration::from_millis(16),
                idle: std::time::Duration::from_millis(1016),
                synchronous_commit,
                plain_index_scans,
            })
            .0;
            assert!(sql.starts_with("BEGIN; "), "{sql}");
            assert!(
                sql.ends_with("; SET LOCAL statement_timeout = '16ms'"),
                "nothing may follow it: {sql}"
            );
            assert_eq!(sql.matches("statement_timeout").count(), 1, "{sql}");
        }
    }

    #[test]
    fn quotes_every_identifier() {
        assert_eq!(quote_ident("accounts"), "\"accounts\"");
        assert_eq!(quote_ident("My \"T\""), "\"My \"\"T\"\"\"");
        assert_eq!(
            QualifiedName::new("app", "Order Items").to_string(),
            "\"app\".\"Order Items\""
        );
    }

    #[test]
    fn parses_configured_names() {
        assert_eq!(
            QualifiedName::parse("app.accounts").unwrap(),
            QualifiedName::new("app", "accounts")
        );
        assert_eq!(
            QualifiedName::parse("app.UserAccounts").unwrap(),
            QualifiedName::new("app", "UserAccounts")
        );
        assert_eq!(
            QualifiedName::parse("\"my.schema\".\"a\"\"b\"").unwrap(),
            QualifiedName::new("my.schema", "a\"b")
        );
        for bad in ["accounts", "a.b.c", ".x", "x.", "\"a.b", "\"a\"x.b"] {
            assert!(
                QualifiedName::parse(bad).is_err(),
                "{bad} should be refused"
            );
        }
    }

    #[test]
    fn builder_only_takes_safe_parts() {
        let mut b = SqlBuilder::new();
        b.sql("SELECT ")
            .col(0, "Id")
            .sql(" FROM ")
            .table(&QualifiedName::new("s", "t"))
            .sql(" t0 WHERE ");
        b.col(0, "k")
            .sql(" = ")
            .param(1)
            .sql("::")
            .ty(&SqlType::from_catalog("bigint".into()));
        assert_eq!(
            b.build().text(),
            "SELECT t0.\"Id\" FROM \"s\".\"t\" t0 WHERE t0.\"k\" = $1::bigint"
        );
    }
}
