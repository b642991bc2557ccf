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

use sha2::{Digest, Sha256};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::ids::{DedupBasis, request_id};

/// What a job deletes: a tenant key, or a Vercel installation resolved by the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectKind {
    /// `subject` is the tenant key.
    Tenant,
    /// `subject` is a Vercel installation ID; `[vercel] tenant_lookup` maps it to a tenant.
    VercelInstallation,
    /// `subject` is `{source}:{value}`; `[sources.NAME] tenant_lookup` maps the value to a tenant.
    Lookup,
}

impl SubjectKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::VercelInstallation => "vercel_installation",
            Self::Lookup => "lookup",
        }
    }
}

/// A validated deletion request, ready to record.
#[derive(Debug, Clone)]
pub struct NewRequest {
    /// The authenticated source.
    pub source: String,
    /// What the deterministic ID derives from.
    pub basis: DedupBasis,
    /// The value of that basis (external ID, Idempotency-Key, tenant key or installation ID).
    pub dedup_key: String,
    /// What is deleted.
    pub subject_kind: SubjectKind,
    /// The tenant key or installation ID.
    pub subject: String,
    /// The sender's own ID, if given.
    pub external_id: Option<String>,
    /// Free text from the sender.
    pub reason: Option<String>,
}

impl NewRequest {
    /// The deterministic request ID (see [`crate::ids::request_id`]).
    pub fn id(&self) -> Uuid {
        request_id(&self.source, self.basis, &self.dedup_key)
    }

    /// SHA-256 (hex) over the request's meaningful content; equal bodies give equal fingerprints.
    pub fn fingerprint(&self) -> String {
        let canonical = serde_json::json!([
            self.subject_kind.as_str(),
            self.subject,
            self.external_id,
            self.reason,
        ]);
        hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
    }
}

/// The answer to a recorded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The deterministic request ID.
    pub request_id: Uuid,
    /// The job the request is attached to.
    pub job_id: Uuid,
    /// The job's state now.
    pub state: String,
    /// `true` when this exact request had been recorded before.
    pub duplicate: bool,
}

/// Why a request was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// The request ID exists with another fingerprint (same key, different body).
    #[error("this {basis} was already used for a different request")]
    Mismatch {
        /// `Idempotency-Key` or `external_id`.
        basis: &'static str,
    },
    /// A concurrent transaction recorded the same request first: roll back and call again.
    #[error("concurrent duplicate; retry")]
    Race,
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// A writer took the request, but its group's commit was not confirmed within the wait
    /// ([`super::group_commit::GroupCommit::record`]): the group may still commit it (e.g. behind
    /// PgBouncer, waiting in its queue for a server), so a retry is answered as its duplicate.
    #[error(
        "the state database did not confirm the request within {} ms; it may still be recorded, and a retry is safe (it is deduplicated)",
        .0.as_millis()
    )]
    Unconfirmed(std::time::Duration),
}

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
