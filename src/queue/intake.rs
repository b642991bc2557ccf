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

use crate::ids::{DedupBasis, JobId, request_id};

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
}

/// Records `req` (see the module docs). `max_attempts` is stored on a newly created job.
///
/// # Errors
/// [`IntakeError`].
pub async fn record(
    conn: &mut PgConnection,
    req: &NewRequest,
    max_attempts: i32,
) -> Result<Accepted, IntakeError> {
    let id = req.id();
    let fingerprint = req.fingerprint();
    let existing: Option<(String, Uuid, String)> = crate::db::query_as(
        "SELECT r.fingerprint, r.job_id, j.state FROM deprov.deletion_requests r \
         JOIN deprov.jobs j ON j.id = r.job_id WHERE r.id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some((stored, job_id, state)) = existing {
        if stored != fingerprint {
            match req.basis {
                DedupBasis::IdempotencyKey => {
                    return Err(IntakeError::Mismatch {
                        basis: "Idempotency-Key",
                    });
                }
                DedupBasis::ExternalId => {
                    return Err(IntakeError::Mismatch {
                        basis: "external_id",
                    });
                }
                DedupBasis::TenantId | DedupBasis::InstallationId => {}
            }
        }
        crate::db::query(
            "UPDATE deprov.deletion_requests SET duplicates = duplicates + 1, last_duplicate_at = now() WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *conn)
        .await?;
        return Ok(Accepted {
            request_id: id,
            job_id,
            state,
            duplicate: true,
        });
    }

    let tenant_id = (req.subject_kind == SubjectKind::Tenant).then_some(req.subject.as_str());
    let held = super::kill_switch::blocking_request(&mut *conn, &req.source, tenant_id)
        .await?
        .is_some();
    let created: Option<(Uuid, String)> = crate::db::query_as(
        "INSERT INTO deprov.jobs (id, subject_kind, subject, tenant_id, state, step, max_attempts) \
         VALUES ($1, $2, $3, $4, CASE WHEN $5 THEN 'held' ELSE 'queued' END, \
                 CASE WHEN $2 = 'tenant' THEN 'soft_delete' ELSE 'resolve' END, $6) \
         ON CONFLICT (subject_kind, subject) WHERE state IN ('queued', 'held', 'running') DO NOTHING \
         RETURNING id, state",
    )
    .bind(JobId::new().0)
    .bind(req.subject_kind.as_str())
    .bind(&req.subject)
    .bind(tenant_id)
    .bind(held)
    .bind(max_attempts)
    .fetch_optional(&mut *conn)
    .await?;
    let (job_id, state) = match created {
        Some(job) => job,
        None => {
            let active: Option<(Uuid, String)> = crate::db::query_as(
                "SELECT id, state FROM deprov.jobs WHERE subject_kind = $1 AND subject = $2 \
                 AND state IN ('queued', 'held', 'running')",
            )
            .bind(req.subject_kind.as_str())
            .bind(&req.subject)
            .fetch_optional(&mut *conn)
            .await?;
            // The active job finished between the two statements: start over.
            active.ok_or(IntakeError::Race)?
        }
    };

    let inserted = crate::db::query(
        "INSERT INTO deprov.deletion_requests (id, source, dedup_basis, dedup_key, subject_kind, subject, \
           external_id, reason, fingerprint, job_id, received_while_held) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (id) DO NOTHING",
    )
    .bind(id)
    .bind(&req.source)
    .bind(req.basis.as_str())
    .bind(&req.dedup_key)
    .bind(req.subject_kind.as_str())
    .bind(&req.subject)
    .bind(&req.external_id)
    .bind(&req.reason)
    .bind(&fingerprint)
    .bind(job_id)
    .bind(held)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Err(IntakeError::Race);
    }
    Ok(Accepted {
        request_id: id,
        job_id,
        state,
        duplicate: false,
    })
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
