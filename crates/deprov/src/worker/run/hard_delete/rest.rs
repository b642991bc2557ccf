//! Waits between batches of the hard delete — the `[pacing] duty_cycle`'s rest, the rate limit's
//! wait — with the lease renewed through them and the kill switch and cancel requests obeyed
//! during them; and the rest a job still owed when its last run stopped, which the next run
//! waits out queued.

use std::future::Future;
use std::time::Duration;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Deferred, JobRun, Stop};
use crate::worker::pacing::duty_rest;
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
        // One deadline, not a sleep made anew each pass: kill switch changes that come more often
        // than a third of the lease must not put the renewal off.
        let mut renew_at = tokio::time::Instant::now() + w.config.worker.lease / 3;
        loop {
            let switched = w.presence.changed();
            tokio::select! {
                out = &mut wait => return Ok(out),
                () = tokio::time::sleep_until(renew_at) => {
                    self.checkpoint(deferred, cp).await?;
                    *checkpointed = std::time::Instant::now();
                    renew_at = tokio::time::Instant::now() + w.config.worker.lease / 3;
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
    /// during it), at most the rest a whole `[worker] lease` of work earns (so a worker's clock
    /// far ahead of this one's cannot park the job for longer), and none when the duty cycle is now
    /// off. [`JobRun::execute`] hands the job back until then before anything else: without it a
    /// worker restarted during a rest (a deploy, a crash loop) would start deleting at once, and
    /// restarts would undo the duty cycle.
    pub(in crate::worker::run) fn owed_rest(&self) -> Option<Duration> {
        let until =
            OffsetDateTime::parse(self.progress.resting_until.as_deref()?, &Rfc3339).ok()?;
        let left = Duration::try_from(until - OffsetDateTime::now_utc()).ok()?;
        let config = &self.worker.config;
        let cap = duty_rest(config.pacing.duty_cycle, config.worker.lease);
        let owed = left.min(cap);
        (!owed.is_zero()).then_some(owed)
    }
}

/// `now + after` as RFC 3339 (UTC).
pub(super) fn rfc3339_after(after: Duration) -> String {
    (OffsetDateTime::now_utc() + after)
        .format(&Rfc3339)
        .unwrap_or_default()
}
