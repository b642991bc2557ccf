//! Where an instance's deprovisioning stands: the job of the request recorded for the instance
//! (deterministic request ID over the source and the instance ID), read from the state database.

use uuid::Uuid;

use crate::ids::{DedupBasis, request_id};
use crate::queue::JobState;

/// Where the deletion requested for one instance stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// No deprovision of the instance was ever received.
    Unknown,
    /// The job is queued, held by a kill switch, or running.
    InProgress {
        /// The job.
        job_id: Uuid,
        /// `true` while a kill switch holds it.
        held: bool,
    },
    /// The job completed and deleted the tenant.
    Deleted,
    /// The job completed finding nothing to delete: the lookup found no tenant, or the tenant had no
    /// rows (already gone).
    Gone,
    /// The job failed or an operator cancelled it; an operator must act.
    Failed {
        /// The job.
        job_id: Uuid,
        /// `true` when the job was cancelled by an operator, else it failed.
        cancelled: bool,
        /// Whether anything of the tenant was deleted or soft-deleted before it stopped.
        touched: bool,
    },
}

/// The request ID of every deprovision of `instance_id` by `source`: retries collapse into it.
pub fn request_of(source: &str, instance_id: &str) -> Uuid {
    request_id(source, DedupBasis::InstallationId, instance_id)
}

/// Where the deletion requested by `source` for `instance_id` stands.
///
/// # Errors
/// Database errors.
pub async fn standing(
    db: &sqlx::PgPool,
    source: &str,
    instance_id: &str,
) -> Result<Standing, sqlx::Error> {
    let row: Option<(Uuid, String, bool, i64, bool)> = crate::db::query_as(
        "SELECT j.id, j.state, j.tenant_id IS NULL, \
                COALESCE((j.progress ->> 'rows_deleted')::bigint, 0), \
                COALESCE(j.progress ->> 'soft_deleted_at', '') <> '' \
         FROM deprov.deletion_requests r JOIN deprov.jobs j ON j.id = r.job_id WHERE r.id = $1",
    )
    .bind(request_of(source, instance_id))
    .fetch_optional(db)
    .await?;
    let Some((job_id, state, no_tenant, rows, soft_deleted)) = row else {
        return Ok(Standing::Unknown);
    };
    Ok(match JobState::parse(&state).unwrap_or(JobState::Failed) {
        JobState::Queued | JobState::Running => Standing::InProgress {
            job_id,
            held: false,
        },
        JobState::Held => Standing::InProgress { job_id, held: true },
        JobState::Completed if no_tenant || rows == 0 => Standing::Gone,
        JobState::Completed => Standing::Deleted,
        s @ (JobState::Failed | JobState::Cancelled) => Standing::Failed {
            job_id,
            cancelled: s == JobState::Cancelled,
            touched: rows > 0 || soft_deleted,
        },
    })
}
