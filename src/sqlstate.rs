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
