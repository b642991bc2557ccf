//! Waits between batches of the hard delete — the `[pacing] duty_cycle`'s rest, the rate limit's
//! wait — with the lease renewed through them and the kill switch and cancel requests obeyed
//! during them; and the rest a job still owed when its last run stopped, taken by the next run.

use std::future::Future;
use std::time::Duration;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Deferred, JobRun, Stop};
use crate::worker::pacing::Pacer;
use crate::worker::progress::Checkpoint;

/// Rests at least this long are written to the job's progress (`resting_until`) before they begin.
pub(super) const REST_SHOWN: Duration = Duration::from_secs(1);

impl JobRun {
    /// Runs `wait` (a rest or a rate-limit wait that ends at once on the worker's stop request)
    /// and returns its output. Meanwhile, every third of `[worker] lease`, the checkpoint `cp` is
    /// written (renewing the lease, so a live worker never looks gone) and the job's kill
    /// switches and cancel request are re-read; a kill switch change this process hears of is
    /// read at once. `checkpointed` is set to the time of the last checkpoint written.
    ///
    /// # Errors
    /// [`Stop`] when a kill switch or cancel request now stops the job (after
    /// [`JobRun::settle`]), or a checkpoint is refused.
    pub(super) async fn wait_through<T>(
        &mut self,
        wait: impl Future<Output = T>,
        deferred: &mut Deferred,
        cp: &Checkpoint,
        checkpointed: &mut std::time::Instant,
    ) -> Result<T, Stop> {
        let w = self.worker.clone();
        tokio::pin!(wait);
        loop {
            let switched = w.presence.changed();
            tokio::select! {
                out = &mut wait => return Ok(out),
                () = tokio::time::sleep(w.config.worker.lease / 3) => {
                    self.checkpoint(deferred, cp).await?;
                    *checkpointed = std::time::Instant::now();
                    // An operator's cancel (or a switch this process missed) ends the wait within
                    // a third of the lease.
                    self.recheck(deferred, cp).await?;
                }
                () = switched => {
                    // A kill switch changed during the wait: the job is held now, not when a rest
                    // of many seconds ends; an unrelated change lets the wait go on.
                    self.recheck(deferred, cp).await?;
                }
            }
        }
    }

    /// The rest this job still owes from its last run: what is left of `progress.resting_until`
    /// (a rest written before it began and not finished: the run was stopped, or its worker died,
    /// during it), at most the rest `pacer` would ask for after a whole `[worker] lease` of work
    /// (so a worker's clock far ahead of this one's cannot park the job), and none when the duty
    /// cycle is now off. Without it a worker restarted during a rest (a deploy, a crash loop)
    /// would start deleting at once, and restarts would undo the duty cycle.
    pub(super) fn owed_rest(&self, pacer: &Pacer) -> Option<Duration> {
        let until = OffsetDateTime::parse(self.progress.resting_until.as_deref()?, &Rfc3339).ok()?;
        let left = Duration::try_from(until - OffsetDateTime::now_utc()).ok()?;
        let owed = left.min(pacer.rest_after(self.worker.config.worker.lease));
        (!owed.is_zero()).then_some(owed)
    }

    /// Takes the rest [`Self::owed_rest`] gives, with the rest this run's own work so far earns
    /// (its claim, plan and checks: [`Pacer::rest_due`]), through [`Self::wait_through`], before
    /// the run's first batch; it counts in `progress.duty_cycle_ms`. A stop request ends it at once
    /// and leaves `resting_until` as it was, for the next run.
    ///
    /// # Errors
    /// As [`Self::wait_through`].
    pub(super) async fn take_owed_rest(
        &mut self,
        pacer: &mut Pacer,
        deferred: &mut Deferred,
        cp: &Checkpoint,
        checkpointed: &mut std::time::Instant,
    ) -> Result<(), Stop> {
        let Some(owed) = self.owed_rest(pacer) else {
            self.progress.resting_until = None;
            return Ok(());
        };
        let owed = owed + pacer.rest_due();
        // Written with the next checkpoint or the hand-back, so a run stopped in this rest passes
        // on all of it.
        self.progress.resting_until = Some(rfc3339_after(owed));
        tracing::info!(job = %self.job.id, rest_ms = owed.as_millis(), "pacing: resuming the rest the job's last run did not finish");
        let stop = self.worker.stop.clone();
        let started = tokio::time::Instant::now();
        self.wait_through(
            async {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(owed) => {}
                }
            },
            deferred,
            cp,
            checkpointed,
        )
        .await?;
        self.progress.duty_cycle_ms += started.elapsed().as_secs_f64() * 1000.0;
        if !stop.is_cancelled() {
            self.progress.resting_until = None;
        }
        pacer.rested();
        Ok(())
    }
}

/// `now + after` as RFC 3339 (UTC).
pub(super) fn rfc3339_after(after: Duration) -> String {
    (OffsetDateTime::now_utc() + after)
        .format(&Rfc3339)
        .unwrap_or_default()
}
