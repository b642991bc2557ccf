//! Why a benchmark could not run: on its own throwaway server ([`BenchError`]) or on the user's
//! database ([`TargetError`]).

use deprov::config::ConfigError;
use deprov::db::errors::error_text;
use deprov::sql::QualifiedName;

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// PostgreSQL could not be started.
    #[error(transparent)]
    Server(#[from] deprov_testkit::ThrowawayError),
    /// A database step failed (the server's message, detail, hint and SQLSTATE).
    #[error("database: {}", error_text(.0))]
    Db(#[from] sqlx::Error),
    /// The configuration built for the run is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// deprov's job did not complete.
    #[error("deprov's job ended {state}: {error}")]
    Job {
        /// Its final state.
        state: String,
        /// Its last error.
        error: String,
    },
}

/// Why the run on the user's database failed.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// `--target-url` without a configuration file.
    #[error("--target-url needs deprov's configuration: --config FILE (or DEPROV_CONFIG)")]
    NoConfig,
    /// The configuration file is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The URL names no database.
    #[error("--target-url names no database")]
    NoDatabase,
    /// The template copy found other sessions on the user's database (SQLSTATE 55006).
    #[error(
        "cannot copy database {database:?}: {sessions} other session(s) are connected to it, and \
         CREATE DATABASE … TEMPLATE needs none. Stop them (or run when the database is idle), or \
         copy the database into a scratch server first — `pg_dump -Fc -f db.dump URL` then \
         `pg_restore --create -d postgres://…scratch…/postgres db.dump` — and point --target-url \
         at the copy there"
    )]
    SourceBusy {
        /// The user's database.
        database: String,
        /// Sessions connected to it when the copy was refused.
        sessions: i64,
    },
    /// The root table or its key column is not in the database.
    #[error("{root}: no such table, or no column {column:?} in it ([tenant] of the configuration)")]
    NoRoot {
        /// `[tenant] root_table`.
        root: QualifiedName,
        /// `[tenant] key_column`.
        column: String,
    },
    /// No row of the root table has the tenant key.
    #[error("no row of {root} has {column} = {tenant:?}")]
    NoTenant {
        /// `[tenant] root_table`.
        root: QualifiedName,
        /// `[tenant] key_column`.
        column: String,
        /// The key given.
        tenant: String,
    },
    /// The tenant key does not read as the key column's type (SQLSTATE class 22).
    #[error("tenant key {tenant:?} is not a valid {key_type}: {message}")]
    BadKey {
        /// The key given.
        tenant: String,
        /// The key column's type.
        key_type: String,
        /// PostgreSQL's message.
        message: String,
    },
    /// The cascading `DELETE` failed on the copy: deprov refuses such a tenant before deleting
    /// anything, so there is nothing to compare.
    #[error(
        "the cascading DELETE failed on the copy: {}; deprov refuses such a tenant before it \
         deletes anything (`deprov plan --tenant KEY` shows why, and the rows that block it)",
        error_text(.0)
    )]
    Cascade(sqlx::Error),
    /// A database step failed (the server's message, detail, hint and SQLSTATE).
    #[error("database: {}", error_text(.0))]
    Db(#[from] sqlx::Error),
    /// deprov's job did not complete, or its state database could not be prepared.
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// Ctrl-C.
    #[error("interrupted")]
    Interrupted,
}
