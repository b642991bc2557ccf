//! Recording deletion requests: deterministic IDs, deduplication, attaching to the tenant's job.
//!
//! [`record`] runs inside the caller's transaction and never touches the target database:
//! 1. a request whose ID is already stored is a duplicate: the stored IDs are returned (and its
//!    `duplicates` count grows) — unless the same Idempotency-Key / external ID now comes with another
//!    body, which is refused ([`IntakeError::Mismatch`], HTTP 422 per the IETF Idempotency-Key draft);
//! 2. otherwise the subject's active job (`queued`, `held` or `running`) is reused, or a new job is
//!    created (`held` when a kill switch blocks it: global, the request's source or its tenant); the partial unique index
//!    `jobs_one_active_per_subject` makes this safe under any concurrency;
//! 3. the request row is inserted. If a concurrent transaction inserted the same request ID first,
//!    [`IntakeError::Race`] tells the caller to roll back and run [`record`] again (it then takes path 1).

use sqlx::PgConnection;

pub use super::record::{Accepted, IntakeError, NewRequest, SubjectKind};

/// Records `req` (see the module docs) in the caller's transaction: [`super::record::record_many`]
/// with a group of one. `max_attempts` is stored on a newly created job.
///
/// # Errors
/// [`IntakeError`].
pub async fn record(
    conn: &mut PgConnection,
    req: &NewRequest,
    max_attempts: i32,
) -> Result<Accepted, IntakeError> {
    let mut answers =
        super::record::record_many(conn, std::slice::from_ref(req), max_attempts).await?;
    answers.pop().unwrap_or(Err(IntakeError::Race))
}

/// Runs [`record`] in its own transaction on `pool` (with `synchronous_commit = on`,
/// `lock_timeout = 1s`, `statement_timeout = 5s`), retrying [`IntakeError::Race`] up to 5 times.
///
/// # Errors
/// [`IntakeError`] other than a race that kept recurring.
pub async fn record_tx(
    pool: &sqlx::PgPool,
    req: &NewRequest,
    max_attempts: i32,
) -> Result<Accepted, IntakeError> {
    let mut last = IntakeError::Race;
    for _ in 0..5 {
        // The answer promises the request is stored: commit durably whatever the server's default, and
        // never wait long on a lock (the caller answers 503 and the sender retries).
        let mut tx = crate::db::begin(pool, crate::db::Bounds::STATE.durable()).await?;
        match record(&mut tx, req, max_attempts).await {
            Ok(accepted) => {
                tx.commit().await?;
                return Ok(accepted);
            }
            Err(IntakeError::Race) => {
                tx.rollback().await?;
                last = IntakeError::Race;
            }
            Err(e) => return Err(e),
        }
    }
    Err(last)
}
