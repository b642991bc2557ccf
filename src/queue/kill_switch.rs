//! The global kill switch (`deprov.kill_switch`, one row).
//!
//! Engaged: intake keeps recording requests (new jobs start `held`), queued jobs become `held`, no job
//! is claimed, and a running job stops at its next batch boundary and becomes `held`. Released: held
//! jobs become `queued` and resume from their checkpoints. Every change bumps `version`.

use sqlx::{PgConnection, PgExecutor};
use time::OffsetDateTime;

/// The switch's current setting.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct KillSwitch {
    /// Whether destruction is stopped.
    pub engaged: bool,
    /// Why it was last changed.
    pub reason: Option<String>,
    /// Who last changed it (a source, `operator`, or `cli`).
    pub changed_by: Option<String>,
    /// Incremented by every change.
    pub version: i64,
    /// When it was last changed.
    pub changed_at: OffsetDateTime,
}

/// Reads the switch.
///
/// # Errors
/// Database errors.
pub async fn get(db: impl PgExecutor<'_>) -> Result<KillSwitch, sqlx::Error> {
    crate::db::query_as(
        "SELECT engaged, reason, changed_by, version, changed_at FROM deprov.kill_switch",
    )
    .fetch_one(db)
    .await
}

/// Whether the switch is engaged (the check made before every batch).
///
/// # Errors
/// Database errors.
pub async fn is_engaged(db: impl PgExecutor<'_>) -> Result<bool, sqlx::Error> {
    crate::db::query_scalar("SELECT engaged FROM deprov.kill_switch")
        .fetch_one(db)
        .await
}

/// Engages or releases the switch and moves waiting jobs accordingly (`queued` → `held` on engage,
/// `held` → `queued` on release). Run it inside the caller's transaction so both happen together.
/// Returns the new setting and how many jobs moved.
///
/// # Errors
/// Database errors.
pub async fn set(
    conn: &mut PgConnection,
    engaged: bool,
    reason: &str,
    actor: &str,
) -> Result<(KillSwitch, u64), sqlx::Error> {
    let switch: KillSwitch = crate::db::query_as(
        "UPDATE deprov.kill_switch SET engaged = $1, reason = $2, changed_by = $3, version = version + 1, \
         changed_at = now() RETURNING engaged, reason, changed_by, version, changed_at",
    )
    .bind(engaged)
    .bind(reason)
    .bind(actor)
    .fetch_one(&mut *conn)
    .await?;
    let moved = if engaged {
        crate::db::query("UPDATE deprov.jobs SET state = 'held', updated_at = now() WHERE state = 'queued'")
    } else {
        crate::db::query("UPDATE deprov.jobs SET state = 'queued', run_after = now(), updated_at = now() WHERE state = 'held'")
    }
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok((switch, moved))
}
