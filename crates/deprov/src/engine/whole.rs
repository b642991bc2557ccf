//! The whole cascade in one bounded transaction: the trial cascade ([`super::trial`]) that commits.
//!
//! A tenant whose cascading `DELETE` finishes within the trial's budget
//! ([`crate::config::HardDeleteConfig::whole_timeout`]) needs no batches: deprov runs
//! the soft-delete statements and the cascade in one transaction under the trial's bounds
//! (`statement_timeout` the trial's budget, `lock_timeout`), forces deferred constraints to be
//! checked (`SET CONSTRAINTS ALL IMMEDIATE`), and commits. The result is the cascade's by
//! construction, in PostgreSQL's own order, and the transaction stays within `max_batch_duration`. When
//! the cascade fails, deletes nothing, finds no tenant or does not finish within the bounds, the
//! transaction rolls back — the soft delete with it — and the verdict is the trial's: nothing was
//! deleted, and the worker goes on as after a trial.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::trial::{Trial, TrialBounds, cascade_in, verdict_of};
use super::{EngineError, Plan, cascaded_since, deleted_so_far, statements};
use crate::db::{self, Bounds};

/// What the whole cascade did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whole {
    /// Committed: the tenant is deleted.
    Committed {
        /// Rows the soft-delete statements affected.
        soft_deleted: u64,
        /// Rows deleted per closure table (oid; partitions summed into their table), those with any,
        /// from `pg_stat_get_xact_tuples_deleted` before the commit (PostgreSQL docs, *The
        /// Cumulative Statistics System*, "Statistics Functions").
        deleted: Vec<(u32, i64)>,
    },
    /// Rolled back.
    RolledBack {
        /// The verdict (never [`Trial::Succeeds`]).
        verdict: Trial,
        /// When the verdict is [`Trial::Undecided`]: the rows, in the closure's tables, the cascade
        /// had deleted when it was stopped — how far it got within the bounds. `None` otherwise,
        /// or when they could not be read.
        reached: Option<i64>,
    },
}

/// Runs `soft_delete` and the cascading `DELETE` of `tenant` in one transaction on `target`,
/// everything within `bounds.budget` (the trial's, [`super::trial::budget`]), the cascade also
/// within `bounds.cascade`, each lock wait within `lock_timeout`, and commits when the cascade
/// succeeded.
///
/// # Errors
/// [`EngineError::Db`] when the target cannot be reached or the connection fails (retryable);
/// [`EngineError::Statement`] when a soft-delete statement cannot take the tenant key. Any other
/// error PostgreSQL reports is the verdict ([`Whole::RolledBack`]).
pub async fn whole_cascade(
    target: &PgPool,
    plan: &Plan,
    soft_delete: &[String],
    tenant: &str,
    lock_timeout: Duration,
    bounds: TrialBounds,
) -> Result<Whole, EngineError> {
    let started = Instant::now();
    let mut tx = db::begin(target, Bounds::new(lock_timeout, bounds.budget)).await?;
    let whole = attempt(&mut tx, plan, soft_delete, tenant, bounds, started).await;
    if let Ok(Whole::Committed { .. }) = whole {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    whole
}

/// [`whole_cascade`] inside `tx`, begun at `started`: the cascade runs in a savepoint
/// ([`db::savepoint`]) after the closure's deleted-row counters are read, so that when it is
/// undecided the rows it had deleted can still be counted ([`Whole::RolledBack`]'s `reached`):
/// a subtransaction rolled back keeps its deletes in the transaction's counters (PostgreSQL's
/// `pgstat_relation.c`, `AtEOSubXact_PgStat_Relations`: attempted actions are counted whether they
/// commit or abort). The caller commits `tx` when this returns [`Whole::Committed`], and rolls it
/// back otherwise.
async fn attempt(
    tx: &mut sqlx::PgConnection,
    plan: &Plan,
    soft_delete: &[String],
    tenant: &str,
    bounds: TrialBounds,
    started: Instant,
) -> Result<Whole, EngineError> {
    let closure: Vec<u32> = plan.closure.iter().copied().collect();
    let before = match deleted_so_far(tx, &closure).await {
        Ok(before) => before,
        Err(e) => {
            return verdict_of(e).map(|verdict| Whole::RolledBack {
                verdict,
                reached: None,
            });
        }
    };
    let mut sp = match db::savepoint(tx).await {
        Ok(sp) => sp,
        Err(e) => {
            return verdict_of(e).map(|verdict| Whole::RolledBack {
                verdict,
                reached: None,
            });
        }
    };
    let outcome = async {
        let soft_deleted = statements::soft_delete_in(&mut sp, soft_delete, tenant).await?;
        let trial = cascade_in(&mut sp, plan, tenant, bounds, started).await?;
        if trial != Trial::Succeeds {
            return Ok(Err(trial));
        }
        let deleted = cascaded_since(&mut sp, &before).await?;
        Ok::<_, EngineError>(Ok((soft_deleted, deleted)))
    }
    .await;
    let verdict = match outcome {
        Ok(Ok((soft_deleted, deleted))) => {
            sp.commit().await?;
            return Ok(Whole::Committed {
                soft_deleted,
                deleted,
            });
        }
        Ok(Err(verdict)) => Ok(verdict),
        Err(EngineError::Db(e)) => verdict_of(e),
        // A soft-delete statement's error is not the cascade's verdict: the job fails naming the
        // statement, unless it is only out of time or locks (then the batches go on).
        Err(e @ EngineError::Configured { .. }) if e.db().is_some_and(super::trial::undecided) => {
            Ok(Trial::Undecided(e.to_string()))
        }
        Err(e) => Err(e),
    };
    let undecided = matches!(verdict, Ok(Trial::Undecided(_)));
    let rolled_back = sp.rollback().await.is_ok();
    let reached = if undecided && rolled_back {
        cascaded_since(tx, &before)
            .await
            .ok()
            .map(|since| since.iter().map(|(_, rows)| rows).sum())
    } else {
        None
    };
    verdict.map(|verdict| Whole::RolledBack { verdict, reached })
}
