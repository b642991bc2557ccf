//! The kill-switch reading for the next batch, taken while the batch before it runs.
//!
//! Before every destructive statement a job run needs a reading of its switches
//! ([`JobRun::may_destroy`]): a state-database transaction of three round trips. Taken in turn with
//! the batches it would add that wait to every batch; taken *during* the batch before (on the state
//! database, while the batch runs on the target) it costs no time. Such a reading is used only when
//! it keeps the acknowledgement's promise ([`crate::worker::presence`]): every destructive statement
//! after an acknowledged version N starts on a reading of at least N. So the reading, checked under
//! the gate just before the next batch, must
//! - be of the version this process last recorded (`Presence::acknowledged`): a version recorded
//!   since it was taken (by the acknowledger, between the batches) makes it stale, and a newer one
//!   not yet recorded must be recorded first — both go through a fresh reading, which records;
//! - have found nothing that stops the job (no engaged switch over it, no cancel request): a stop
//!   is always confirmed by a fresh reading;
//! - be younger than `[hard_delete] max_batch_duration`: after a rest or a pause the next batch
//!   reads afresh, so an engage without `--wait` stops destruction as soon as a reading before
//!   every batch would, give or take one batch.

use std::time::{Duration, Instant};

use super::{JobRun, Stop};
use crate::db::{self, Bounds};
use crate::queue::kill_switch;
use crate::worker::presence::Gate;

/// A reading of a job's switches taken ahead of its next batch ([`JobRun::read_ahead`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ahead {
    /// The kill-switch version read.
    version: i64,
    /// Nothing read stops the job: no engaged switch over it, no cancel request.
    clear: bool,
    /// When the reading was taken.
    at: Instant,
}

impl JobRun {
    /// Reads the job's switches for the batch after the one running now, recording nothing (the
    /// batch in flight may have started on an older version). `None` when the state database did
    /// not answer: the next batch then reads afresh, and reports the error if it persists.
    pub(super) async fn read_ahead(&self) -> Option<Ahead> {
        let w = &self.worker;
        let read = async {
            let mut tx = db::begin(&w.pools.queue, Bounds::STATE).await?;
            let check = kill_switch::check_job(&mut *tx, self.job.id).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(check)
        };
        match read.await {
            Ok(check) => Some(Ahead {
                version: check.version,
                clear: !check.cancel && self.blocked_by(&check).is_none(),
                at: Instant::now(),
            }),
            Err(e) => {
                tracing::debug!(job = %self.job.id, error = %e, "kill switch read ahead failed: the next batch reads afresh");
                None
            }
        }
    }

    /// The gate for the next destructive statement: on `ahead` when it may stand in for a fresh
    /// reading (see the module docs) and is younger than `max_age`, else on a fresh reading
    /// ([`Self::may_destroy`]).
    ///
    /// # Errors
    /// [`Stop`] as [`Self::may_destroy`] gives it.
    pub(super) async fn may_destroy_ahead(
        &self,
        ahead: Option<Ahead>,
        max_age: Duration,
    ) -> Result<Gate, Stop> {
        let w = &self.worker;
        if let Some(a) = ahead
            && !w.stop.is_cancelled()
        {
            let gate = w.presence.enter().await;
            // Decided under the gate: the acknowledger records a version only while holding it.
            if a.stands_for_fresh(w.presence.acknowledged(), max_age) {
                return Ok(gate);
            }
        }
        self.may_destroy().await
    }
}

impl Ahead {
    /// Whether this reading may stand in for a fresh one before a destructive statement, with
    /// `acknowledged` the version this process last recorded (read under the gate): it found
    /// nothing that stops the job, is of exactly that version, and is at most `max_age` old.
    fn stands_for_fresh(&self, acknowledged: i64, max_age: Duration) -> bool {
        self.clear && self.version == acknowledged && self.at.elapsed() <= max_age
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(version: i64, clear: bool, age_ms: u64) -> Ahead {
        Ahead {
            version,
            clear,
            at: Instant::now() - Duration::from_millis(age_ms),
        }
    }

    #[test]
    fn only_a_clear_young_reading_of_the_recorded_version_stands_for_a_fresh_one() {
        let max = Duration::from_millis(800);
        assert!(reading(7, true, 0).stands_for_fresh(7, max));
        assert!(
            !reading(7, true, 0).stands_for_fresh(8, max),
            "a version recorded since the reading makes it stale"
        );
        assert!(
            !reading(8, true, 0).stands_for_fresh(7, max),
            "a newer version must be recorded by a fresh reading first"
        );
        assert!(
            !reading(7, false, 0).stands_for_fresh(7, max),
            "a stop is confirmed afresh"
        );
        assert!(
            !reading(7, true, 5_000).stands_for_fresh(7, max),
            "after a rest the batch reads afresh"
        );
    }
}
