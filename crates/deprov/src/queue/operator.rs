//! Operator actions on jobs: cancel and retry, each written to the audit log in the same
//! transaction ([`super::audit`]). Run them inside the caller's transaction.
//!
//! - Cancel: a `queued` or `held` job becomes `cancelled` at once; a `running` job gets
//!   `cancel_requested_at`, and its worker stops before its next destructive statement and hands it
//!   back `cancelled` (what is deleted stays deleted; the checkpoint is kept) — unless its lease has
//!   expired (its worker is gone), when it is `cancelled` at once.
//! - Retry: a `failed` job becomes `queued` (or `held` while a kill switch blocks it) with its
//!   attempts reset; the worker resumes the hard delete from the stored checkpoint. Refused while
//!   another active job deletes the same subject (the one-active-job-per-subject rule).

use sqlx::PgConnection;
use uuid::Uuid;

use super::audit;

/// Why an operator action was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// No job with this ID.
    #[error("no job {0}")]
    NotFound(Uuid),
    /// The job's state does not allow the action, or another job is active for the subject.
    #[error("{0}")]
    Conflict(String),
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// What [`cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The job was queued or held: it is `cancelled` now.
    Now,
    /// The job is running: its worker stops at the next batch boundary and hands it back
    /// `cancelled`.
    AtNextBatch,
}

async fn lock_state(conn: &mut PgConnection, id: Uuid) -> Result<String, ActionError> {
    crate::db::query_scalar("SELECT state FROM deprov.jobs WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or(ActionError::NotFound(id))
}

/// Cancels job `id` (see the module docs) and records `job.cancel` by `actor` for `reason`.
///
/// # Errors
/// [`ActionError::NotFound`]; [`ActionError::Conflict`] when the job already ended; database errors.
pub async fn cancel(
    conn: &mut PgConnection,
    id: Uuid,
    actor: &str,
    reason: &str,
) -> Result<Cancelled, ActionError> {
    let state = lock_state(conn, id).await?;
    let outcome = match state.as_str() {
        "queued" | "held" => {
            crate::db::query(
                "UPDATE deprov.jobs SET state = 'cancelled', cancel_requested_at = now(), \
                 finished_at = now(), last_error = 'cancelled by an operator: ' || $2, updated_at = now() \
                 WHERE id = $1",
            )
            .bind(id)
            .bind(reason)
            .execute(&mut *conn)
            .await?;
            Cancelled::Now
        }
        "running" => {
            // A running job whose lease expired has no worker to stop it (its worker is gone, and a
            // kill switch may keep any other from taking it over): it is cancelled at once.
            let now: bool = crate::db::query_scalar(
                "UPDATE deprov.jobs SET cancel_requested_at = now(), updated_at = now(), \
                   state = CASE WHEN lease_expires_at < now() THEN 'cancelled' ELSE state END, \
                   finished_at = CASE WHEN lease_expires_at < now() THEN now() END, \
                   last_error = CASE WHEN lease_expires_at < now() \
                     THEN 'cancelled by an operator (the lease of its worker had expired): ' || $2 ELSE last_error END, \
                   lease_owner = CASE WHEN lease_expires_at < now() THEN NULL ELSE lease_owner END, \
                   lease_expires_at = CASE WHEN lease_expires_at < now() THEN NULL ELSE lease_expires_at END \
                 WHERE id = $1 RETURNING state = 'cancelled'",
            )
            .bind(id)
            .bind(reason)
            .fetch_one(&mut *conn)
            .await?;
            if now {
                Cancelled::Now
            } else {
                Cancelled::AtNextBatch
            }
        }
        other => {
            return Err(ActionError::Conflict(format!(
                "job {id} is {other}: only queued, held or running jobs can be cancelled"
            )));
        }
    };
    let details = serde_json::json!({
        "previous_state": state,
        "outcome": if outcome == Cancelled::Now { "cancelled" } else { "cancel_requested" },
    });
    audit::record(
        &mut *conn,
        actor,
        "job.cancel",
        Some(&format!("job:{id}")),
        reason,
        &details,
    )
    .await?;
    Ok(outcome)
}

/// Re-drives failed job `id` from its checkpoint (see the module docs) and records `job.retry` by
/// `actor` for `reason`. Its attempt counts start again, and its next run redoes the checks before
/// the hard delete (`progress.prechecked_plan` is dropped: the operator may have changed what made
/// it fail, or a blocker may have appeared). Returns the job's new state (`queued` or `held`).
///
/// # Errors
/// [`ActionError::NotFound`]; [`ActionError::Conflict`] when the job is not `failed` or another
/// active job deletes the same subject; database errors.
pub async fn retry(
    conn: &mut PgConnection,
    id: Uuid,
    actor: &str,
    reason: &str,
) -> Result<String, ActionError> {
    let state = lock_state(conn, id).await?;
    if state != "failed" {
        return Err(ActionError::Conflict(format!(
            "job {id} is {state}: only failed jobs can be retried"
        )));
    }
    let other: Option<Uuid> = crate::db::query_scalar(
        "SELECT o.id FROM deprov.jobs j JOIN deprov.jobs o ON o.subject_kind = j.subject_kind \
           AND o.subject = j.subject AND o.id <> j.id AND o.state IN ('queued', 'held', 'running') \
         WHERE j.id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(other) = other {
        return Err(ActionError::Conflict(format!(
            "job {other} is already active for the same subject; retry refused"
        )));
    }
    let (new_state, attempts, last_error): (String, i32, Option<String>) = crate::db::query_as(
        "UPDATE deprov.jobs j SET state = CASE WHEN deprov.job_blocked_by(j.id) IS NULL THEN 'queued' ELSE 'held' END, \
           attempts = 0, stalled_attempts = 0, progress = j.progress - 'prechecked_plan', \
           run_after = now(), finished_at = NULL, cancel_requested_at = NULL, \
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now() \
         FROM (SELECT attempts, last_error FROM deprov.jobs WHERE id = $1) old \
         WHERE j.id = $1 RETURNING j.state, old.attempts, old.last_error",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    if new_state == "queued" {
        super::jobs::wake_on_commit(&mut *conn).await?;
    }
    let details = serde_json::json!({
        "previous_state": state, "new_state": new_state,
        "previous_attempts": attempts, "previous_error": last_error,
    });
    audit::record(
        &mut *conn,
        actor,
        "job.retry",
        Some(&format!("job:{id}")),
        reason,
        &details,
    )
    .await?;
    Ok(new_state)
}
