//! A deletion request as intake records it, and the answers and errors of recording it
//! ([`crate::queue::intake`] re-exports them).

use sha2::{Digest, Sha256};
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
    /// ([`crate::queue::group_commit::GroupCommit::record`]): the group may still commit it (e.g. behind
    /// PgBouncer, waiting in its queue for a server), so a retry is answered as its duplicate.
    #[error(
        "the state database did not confirm the request within {} ms; it may still be recorded, and a retry is safe (it is deduplicated)",
        .0.as_millis()
    )]
    Unconfirmed(std::time::Duration),
}
