//! The SQLSTATE codes deprov acts on, by their PostgreSQL condition names (PostgreSQL docs,
//! Appendix A "PostgreSQL Error Codes"), and the classes it treats alike.

/// `not_null_violation`: a NOT NULL column would be set to NULL (e.g. by ON DELETE SET NULL).
pub const NOT_NULL_VIOLATION: &str = "23502";
/// `foreign_key_violation`: a RESTRICT / NO ACTION check failed, or a referenced key is missing.
pub const FOREIGN_KEY_VIOLATION: &str = "23503";
/// `serialization_failure`.
pub const SERIALIZATION_FAILURE: &str = "40001";
/// `deadlock_detected`.
pub const DEADLOCK_DETECTED: &str = "40P01";
/// `undefined_table`.
pub const UNDEFINED_TABLE: &str = "42P01";
/// `too_many_connections`: the server (or a pooler speaking for it) refused a connection.
pub const TOO_MANY_CONNECTIONS: &str = "53300";
/// `lock_not_available`: `lock_timeout` ran out (or `NOWAIT` found the lock taken).
pub const LOCK_NOT_AVAILABLE: &str = "55P03";
/// `query_canceled`: `statement_timeout` ran out, or the statement was cancelled.
pub const QUERY_CANCELED: &str = "57014";
/// `admin_shutdown`: the session was terminated (`pg_terminate_backend`, a fast shutdown).
pub const ADMIN_SHUTDOWN: &str = "57P01";
/// `crash_shutdown`: the server is restarting after a crash of another backend.
pub const CRASH_SHUTDOWN: &str = "57P02";
/// `cannot_connect_now`: the server is starting up or shutting down.
pub const CANNOT_CONNECT_NOW: &str = "57P03";
/// `character_not_in_repertoire`: text with a NUL character (`invalid byte sequence for encoding
/// "UTF8": 0x00`).
pub const CHARACTER_NOT_IN_REPERTOIRE: &str = "22021";
/// `untranslatable_character`: a `jsonb` value with `\u0000` (`unsupported Unicode escape
/// sequence`).
pub const UNTRANSLATABLE_CHARACTER: &str = "22P05";
/// `duplicate_prepared_statement`.
pub const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";
/// `indeterminate_datatype`: "could not determine data type of parameter $N".
pub const INDETERMINATE_DATATYPE: &str = "42P18";
/// `insufficient_privilege`.
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
/// `object_in_use`: e.g. `DROP DATABASE` or `CREATE DATABASE … TEMPLATE` while other sessions
/// are connected to it.
pub const OBJECT_IN_USE: &str = "55006";
/// `idle_in_transaction_session_timeout`.
pub const IDLE_IN_TRANSACTION_SESSION_TIMEOUT: &str = "25P03";

/// Class 08, `connection_exception`: the connection failed or was lost.
pub fn is_connection_exception(code: &str) -> bool {
    code.starts_with("08")
}

/// A timeout of deprov's own bounds: `lock_timeout` ([`LOCK_NOT_AVAILABLE`]) or
/// `statement_timeout` ([`QUERY_CANCELED`]).
pub fn is_timeout(code: &str) -> bool {
    code == LOCK_NOT_AVAILABLE || code == QUERY_CANCELED
}
