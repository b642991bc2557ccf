//! The trial cascade: the tenant's cascading `DELETE` run by PostgreSQL itself, in a transaction
//! that is always rolled back, bounded like a batch.
//!
//! The simulation ([`super::simulate`]) models the referential triggers only. What it cannot see —
//! user triggers that raise or skip a delete, CHECK constraints and domains that refuse a SET
//! NULL, `UNIQUE NULLS NOT DISTINCT`, rules, row-level security hiding rows from deprov's role
//! while the referential triggers (which bypass it) still find them — PostgreSQL answers for
//! itself: deprov deletes the root row inside a transaction, forces deferred constraints to be
//! checked (`SET CONSTRAINTS ALL IMMEDIATE`, PostgreSQL docs *SET CONSTRAINTS*), and rolls back,
//! whatever happened. When that finishes within the bounds, its verdict is the cascade's on the
//! current data, exactly. A tenant too large for its cascade to finish within the bounds (or whose
//! rows are locked) leaves the question [`Trial::Undecided`] and the simulation decides alone.
//!
//! The trial holds the row locks of what it reached for at most its `statement_timeout` (the same
//! ⅘ of `max_batch_duration` a cascading batch gets), like one batch. It fires user triggers
//! inside the rolled-back transaction: their writes vanish with it, but what is not transactional
//! (a sequence's `nextval`, a call out of the database) happens; `[hard_delete] trial_cascade =
//! false` turns the trial off for schemas whose triggers must not run twice.

use std::time::Duration;

use sqlx::PgPool;

use super::{EngineError, Plan, queries};
use crate::db::{self, Bounds};

/// What the trial cascade found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trial {
    /// The cascade ran to its end and every deferred constraint held: it would succeed.
    Succeeds,
    /// No row of the root table has the tenant's key (as deprov's role sees it): nothing to try.
    NoTenant,
    /// The root row is there, but its `DELETE` deleted nothing: a `BEFORE DELETE` trigger returned
    /// NULL, a rule replaced the delete, or a row-level security policy lets deprov's role see but
    /// not delete it. The cascade would leave the tenant as it is.
    DeletesNothing,
    /// The cascade failed: the server's error (message, detail, SQLSTATE; [`db::errors::error_text`]).
    Fails(String),
    /// Not decided: a statement or lock timeout (SQLSTATE 57014, 55P03), a deadlock or
    /// serialization failure (class 40), or the server short of resources or past a limit (classes
    /// 53, 54, 58, e.g. out of memory, stack depth), as the server reported it.
    Undecided(String),
}

impl Trial {
    /// The verdict in a word or a sentence, as `progress.trial` and `deprov plan --trial` show it:
    /// `succeeds`, `no tenant`, `deletes nothing`, `fails: …`, `undecided: …`.
    pub fn label(&self) -> String {
        match self {
            Self::Succeeds => "succeeds".into(),
            Self::NoTenant => "no tenant".into(),
            Self::DeletesNothing => "deletes nothing".into(),
            Self::Fails(e) => format!("fails: {e}"),
            Self::Undecided(e) => format!("undecided: {e}"),
        }
    }

    /// Why deprov refuses the tenant after this verdict, or `None` when it goes on.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Self::Succeeds | Self::NoTenant | Self::Undecided(_) => None,
            Self::DeletesNothing => Some(
                "the DELETE of the tenant's root row deletes nothing (a BEFORE DELETE trigger \
                 returning NULL, a rule, or a row-level security policy), so the cascading DELETE \
                 would leave the tenant as it is"
                    .into(),
            ),
            Self::Fails(e) => Some(format!("the cascading DELETE of the tenant fails: {e}")),
        }
    }
}

/// The trial's `statement_timeout` under `[hard_delete]`, shared by the statements of its
/// transaction ([`crate::config::HardDeleteConfig::whole_timeout`]), at most `statement_timeout`.
pub fn budget(hd: &crate::config::HardDeleteConfig) -> Duration {
    hd.statement_timeout.min(hd.whole_timeout())
}

/// The bounds of one trial (or whole cascade) transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrialBounds {
    /// The whole transaction's: every statement's `statement_timeout` is what is left of it.
    pub budget: Duration,
    /// The cascading `DELETE`'s own, from its start (at most what is left of `budget` then): a
    /// tenant known to be too large for `budget` gets a short one, which the statements before it
    /// (the soft delete, the deleted-row counters) do not use up.
    pub cascade: Duration,
}

impl TrialBounds {
    /// The cascade bounded by what is left of `budget` alone.
    pub fn whole(budget: Duration) -> Self {
        Self {
            budget,
            cascade: budget,
        }
    }
}

/// A `statement_timeout` in force is lowered for the cascade only when that takes more than this
/// off it: a `SET LOCAL` is a round trip.
const LOWER_BY_MORE_THAN: Duration = Duration::from_millis(1);

/// The user triggers that fire on `DELETE` on the tenant's tables (the closure, partitions
/// included; `pg_trigger.tgisinternal` false, `tgtype` bit 3 = DELETE, PostgreSQL's
/// `pg_trigger.h`), as `table: trigger` — sorted, one entry per trigger name and table.
///
/// deprov deletes leaves first; the cascade deletes from the root down. A trigger that looks at
/// other rows of the tenant (a parent that must keep an owner, an audit row naming the parent)
/// sees them in another state under deprov, and the trial, which runs in the cascade's order,
/// cannot tell: its verdict holds for the cascade, not for deprov's batches. A statement trigger
/// fires once per batch. So `[hard_delete] user_triggers = "refuse"` (the default) refuses a
/// tenant whose tables have any.
///
/// # Errors
/// Database errors.
pub async fn delete_triggers(
    target: &PgPool,
    plan: &Plan,
    lock_timeout: Duration,
    statement_timeout: Duration,
) -> Result<Vec<String>, EngineError> {
    let oids: Vec<i64> = plan.closure.iter().map(|&o| i64::from(o)).collect();
    let mut tx = db::begin(target, Bounds::new(lock_timeout, statement_timeout)).await?;
    let found: Vec<(i64, String)> = db::query_as(
        "SELECT DISTINCT r.o, t.tgname::text \
         FROM unnest($1::int8[]) r(o) CROSS JOIN LATERAL \
           (SELECT r.o::oid AS relid UNION SELECT relid FROM pg_partition_tree(r.o::oid)) p \
         JOIN pg_trigger t ON t.tgrelid = p.relid \
         WHERE NOT t.tgisinternal AND (t.tgtype::int & 8) <> 0 ORDER BY 1, 2",
    )
    .bind(oids)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(found
        .into_iter()
        .map(|(oid, name)| format!("{}: {name}", plan.name(oid as u32)))
        .collect())
}

/// Runs the trial cascade of `tenant` on `target`: its statements bounded by `bounds` and
/// `lock_timeout` on the server; always rolled back.
///
/// # Errors
/// [`EngineError::Db`] when the target cannot be reached or the connection fails (retryable, as a
/// batch's would be); every error PostgreSQL reports inside the trial is its verdict instead.
pub async fn trial_cascade(
    target: &PgPool,
    plan: &Plan,
    tenant: &str,
    lock_timeout: Duration,
    bounds: TrialBounds,
) -> Result<Trial, EngineError> {
    let started = std::time::Instant::now();
    let mut tx = db::begin(target, Bounds::new(lock_timeout, bounds.budget)).await?;
    let outcome = cascade_in(&mut tx, plan, tenant, bounds, started).await;
    // Whatever happened, nothing of it stays: the trial only asks.
    tx.rollback().await?;
    match outcome {
        Ok(trial) => Ok(trial),
        Err(e) => verdict_of(e),
    }
}

/// The tenant's cascading `DELETE` inside `tx`, begun at `started` with a `statement_timeout` of
/// `bounds.budget`: counts the root row and deletes it within `bounds.cascade` (lowered to what
/// is left of the budget), and checks every deferred constraint (`SET CONSTRAINTS ALL IMMEDIATE`)
/// within what is left of the budget. The caller commits or rolls back. An error PostgreSQL
/// reports is returned as is: [`verdict_of`] reads it.
pub(super) async fn cascade_in(
    tx: &mut sqlx::PgConnection,
    plan: &Plan,
    tenant: &str,
    bounds: TrialBounds,
    started: std::time::Instant,
) -> Result<Trial, sqlx::Error> {
    let budget = bounds.budget;
    let left = budget.saturating_sub(started.elapsed());
    let bound = bounds.cascade.min(left).max(Duration::from_millis(1));
    if bound + LOWER_BY_MORE_THAN < budget {
        db::set_local_statement_timeout(tx, bound).await?;
    }
    let present: i64 = db::query_scalar(queries::count_root(plan).as_query())
        .bind(tenant)
        .fetch_one(&mut *tx)
        .await?;
    if present == 0 {
        return Ok(Trial::NoTenant);
    }
    let deleted = db::query(queries::delete_root(plan).as_query())
        .bind(tenant)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if deleted == 0 {
        return Ok(Trial::DeletesNothing);
    }
    // The deferred checks get what is left of the budget, so the whole transaction holds its locks
    // for about `budget`, not twice that.
    let left = budget.saturating_sub(started.elapsed());
    if left < Duration::from_millis(1) {
        return Ok(Trial::Undecided(
            "the DELETE used the whole statement_timeout; deferred checks not run".into(),
        ));
    }
    db::set_local_statement_timeout(tx, left).await?;
    db::query("SET CONSTRAINTS ALL IMMEDIATE")
        .execute(&mut *tx)
        .await?;
    Ok(Trial::Succeeds)
}

/// The verdict an error inside a trial (or a whole cascade) gives, by its SQLSTATE.
///
/// # Errors
/// [`EngineError::Db`] when the error says nothing about the data: the connection or the server
/// went away (retryable).
pub(super) fn verdict_of(e: sqlx::Error) -> Result<Trial, EngineError> {
    let Some(code) = e
        .as_database_error()
        .map(|d| d.code().map(|c| c.into_owned()))
    else {
        return Err(EngineError::Db(e));
    };
    match answer_of(&code.unwrap_or_default()) {
        Answer::Retry => Err(EngineError::Db(e)),
        Answer::Undecided => Ok(Trial::Undecided(db::errors::error_text(&e))),
        Answer::Fails => Ok(Trial::Fails(db::errors::error_text(&e))),
    }
}

/// Whether `e`, inside a trial, says nothing about the data but is out of the trial's bounds or
/// resources ([`Answer::Undecided`]).
pub(super) fn undecided(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| answer_of(&code) == Answer::Undecided)
}

/// What an error inside the trial means, by its SQLSTATE (PostgreSQL docs, Appendix A).
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// The connection or the server went away (class 08, 57P01–57P03, 53300): the job is retried.
    Retry,
    /// Not an answer about the data: the trial's own bounds (57014, 55P03), a deadlock or
    /// serialization failure (class 40), or the server's resources and limits (classes 53, 54, 58).
    Undecided,
    /// Anything else — constraint violations (class 23), a trigger's `RAISE` (P0001), a rule the
    /// cascade cannot run through, an internal error of a referential query — is the cascade failing.
    Fails,
}

fn answer_of(code: &str) -> Answer {
    use crate::sqlstate::*;
    match code {
        ADMIN_SHUTDOWN | CRASH_SHUTDOWN | CANNOT_CONNECT_NOW | TOO_MANY_CONNECTIONS => {
            Answer::Retry
        }
        _ if is_connection_exception(code) => Answer::Retry,
        QUERY_CANCELED | LOCK_NOT_AVAILABLE => Answer::Undecided,
        _ if ["40", "53", "54", "58"].iter().any(|c| code.starts_with(c)) => Answer::Undecided,
        _ => Answer::Fails,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_about_the_data_refuse_a_tenant() {
        for code in [
            "23503", "23514", "23502", "23505", "P0001", "0A000", "XX000", "42501",
        ] {
            assert_eq!(answer_of(code), Answer::Fails, "{code}");
        }
        for code in [
            "57014", "55P03", "40P01", "40001", "53200", "53100", "54001", "58030",
        ] {
            assert_eq!(answer_of(code), Answer::Undecided, "{code}");
        }
        for code in ["57P01", "57P03", "08006", "53300"] {
            assert_eq!(answer_of(code), Answer::Retry, "{code}");
        }
    }
}
