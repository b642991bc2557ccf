//! The hard delete of one job run: batches in the plan's order (leaves of the foreign-key graph
//! first), each a short transaction under the job's [`BatchLimits`], with its checkpoint written
//! after each commit, timeouts absorbed by shrinking, key ranges and index passes for large
//! parents, held-row passes for non-CASCADE self-references, and pacing between batches.

use std::time::Duration;

use super::{JobRun, Stop};
use crate::engine::{self, Cursor, EngineError, Plan};
use crate::telemetry;
use crate::worker::progress::Checkpoint;

mod batches;
mod committed;
mod failed;
mod rest;
mod sweep;

impl JobRun {
    /// Deletes the tenant `tenant` by the batches of `leaves_first` (with the cascade allowance of
    /// `[hard_delete] cascade_rows` absorbed into it), from the job's stored checkpoint when it was
    /// made for the same plan, else from the first step. When the target restarted between
    /// checkpoints ([`EngineError::TargetRestarted`]) the batches go back to the last checkpoint
    /// written and go on in this run, every batch durable from then on.
    ///
    /// # Errors
    /// [`Stop`] when the kill switch or a stop request ends the run, a batch fails in a way a
    /// retry will not fix, or the state database does not take a checkpoint.
    pub(super) async fn hard_delete(
        &mut self,
        leaves_first: &Plan,
        tenant: &str,
    ) -> Result<(), Stop> {
        let mut deferred = Deferred {
            pending: false,
            incarnation: None,
            durable: self.progress.clone(),
            written: self.job.checkpoint.clone(),
            durable_only: false,
            position: None,
        };
        loop {
            let result = self.batches(leaves_first, tenant, &mut deferred).await;
            if let Err(Stop::Error(e)) = &result
                && !matches!(e, EngineError::TargetRestarted { .. })
                && let Some(at) = deferred.position.clone()
            {
                // A batch failed (or the state database did): the batches before it that
                // committed deferred are made durable and checkpointed where possible, so the job,
                // retried or failed, counts them and resumes after them.
                self.settle(&mut deferred, &at).await;
            }
            if result.is_err() && deferred.pending {
                // The stored checkpoint is older than batches that committed deferred and may be
                // lost: the resumed job redoes them from there, and counts their rows then.
                self.progress.rewind_to(&deferred.durable);
            }
            match result {
                Err(Stop::Error(EngineError::TargetRestarted { was, now }))
                    if !deferred.durable_only =>
                {
                    // Resumed in this run from the last checkpoint, with no attempt spent: a
                    // restart is not the job's fault. Every batch of the rest of the run commits
                    // durably and is checkpointed, so a target that keeps restarting (or a
                    // statistics reset, which looks the same) costs at most this one rewind.
                    tracing::warn!(job = %self.job.id, ?was, ?now, "the target restarted: resuming from the last checkpoint, every batch durable");
                    deferred.durable_only = true;
                    deferred.pending = false;
                    deferred.incarnation = None;
                }
                result => return result,
            }
        }
    }

    /// [`Self::hard_delete`]'s batches; `deferred` tracks what is not yet durable. Each turn: the
    /// kill switch read under the gate, one batch, then what it leads to — a retry or the end of
    /// the run when it rolled back ([`Self::on_failed`]), the next position and the rests before
    /// the next batch when it committed ([`Self::on_committed`], [`Self::between_batches`]).
    async fn batches(
        &mut self,
        leaves_first: &Plan,
        tenant: &str,
        deferred: &mut Deferred,
    ) -> Result<(), Stop> {
        let w = self.worker.clone();
        let hd = &w.config.hard_delete;
        let mut b = self.start_batches(leaves_first, tenant, deferred).await?;
        let mut ahead = None;
        while !b.done() {
            let checked = std::time::Instant::now();
            let gate = match self
                .may_destroy_ahead(ahead.take(), hd.max_batch_duration)
                .await
            {
                Ok(gate) => gate,
                Err(stop) => {
                    self.settle(deferred, &b.cp).await;
                    return Err(stop);
                }
            };
            self.progress.bookkeeping_ms += checked.elapsed().as_secs_f64() * 1000.0;
            let limits = b.limits(&self.limits, hd);
            let bounded = batches::Batches::bounded(&limits, &self.limits);
            let began = std::sync::OnceLock::new();
            // The switches for the next batch are read on the state database while this one runs
            // on the target (super::ahead).
            let (result, read) = tokio::join!(
                gate.during(engine::run_batch(
                    &w.pools.target,
                    &b.plan,
                    engine::BatchStart {
                        step: b.cp.step,
                        cursor: &b.cp.cursor,
                        parents: b.cp.parents,
                        large_parent: b.large_parent,
                        unchanged: deferred.unchanged(),
                        began: &began,
                        jump: b.jump,
                    },
                    tenant,
                    &limits,
                )),
                self.read_ahead()
            );
            ahead = read;
            // A jump serves one attempt: one cut short too is retried without it.
            b.jump = false;
            let batch = match result {
                Ok(batch) => batch,
                Err(e) => {
                    telemetry::batch_failed(e.sqlstate().as_deref());
                    let began = began.get().copied();
                    self.on_failed(
                        &mut b,
                        e,
                        &limits,
                        began,
                        gate,
                        leaves_first,
                        tenant,
                        deferred,
                    )
                    .await?;
                    continue;
                }
            };
            // A sweep after the batch (on_committed) is a destructive statement too.
            let rows = gate
                .during(self.on_committed(&mut b, &batch, limits.deferred, tenant, deferred))
                .await?;
            drop(gate);
            deferred.position = Some(b.cp.clone());
            if !deferred.pending || b.checkpointed.elapsed() >= b.every {
                self.checkpoint(deferred, &b.cp).await?;
                b.checkpointed = std::time::Instant::now();
            }
            if b.done() {
                // The last batch: no rest after it (the duty cycle is the job's; the job is done).
                break;
            }
            self.between_batches(&mut b, rows, batch.elapsed, bounded, deferred)
                .await?;
        }
        if deferred.pending {
            // The last batches are made durable and checkpointed before the job may complete.
            self.checkpoint(deferred, &b.cp).await?;
        }
        Ok(())
    }

    /// Writes the checkpoint `cp` (with progress and the lease renewal). When batches committed
    /// deferred since the last one (`deferred.pending`), flushes them first ([`engine::flush`]), so
    /// a checkpoint never names a batch a target crash can lose: a later durable commit would not
    /// do, since one that deleted nothing writes no WAL and flushes nothing. Then remembers the
    /// progress written as the durable one.
    ///
    /// # Errors
    /// [`Stop`] when the flush fails, the lease is lost, or the target restarted since the last
    /// checkpoint ([`EngineError::TargetRestarted`]: the deferred batches since may be lost, so no
    /// checkpoint is written past them; the job resumes from the last one).
    async fn checkpoint(&mut self, deferred: &mut Deferred, cp: &Checkpoint) -> Result<(), Stop> {
        let written = std::time::Instant::now();
        if deferred.pending {
            let now = engine::flush(&self.worker.pools.target, &self.limits)
                .await
                .map_err(EngineError::from)?;
            if let Some(was) = &deferred.incarnation
                && *was != now
            {
                tracing::warn!(job = %self.job.id, ?was, ?now, "the target restarted since the last checkpoint: resuming from it");
                return Err(EngineError::TargetRestarted {
                    was: was.clone(),
                    now,
                }
                .into());
            }
            deferred.pending = false;
        }
        self.heartbeat("hard_delete", Some(cp)).await?;
        deferred.durable = self.progress.clone();
        deferred.written = Some(cp.to_json());
        self.progress.bookkeeping_ms += written.elapsed().as_secs_f64() * 1000.0;
        Ok(())
    }

    /// During a wait between batches: reads the job's kill switches and cancel request as before a
    /// batch ([`Self::may_destroy`]) and stops the run (after [`Self::settle`]) when one of them
    /// would stop the next batch; otherwise the wait goes on.
    ///
    /// # Errors
    /// [`Stop`] as [`Self::may_destroy`] gives it.
    async fn recheck(&mut self, deferred: &mut Deferred, cp: &Checkpoint) -> Result<(), Stop> {
        match self.may_destroy().await {
            Ok(gate) => {
                drop(gate);
                Ok(())
            }
            Err(stop) => {
                self.settle(deferred, cp).await;
                Err(stop)
            }
        }
    }

    /// Before a pause or a stop: when batches committed deferred since the last checkpoint
    /// (`deferred.pending`), makes them durable ([`engine::flush`]) and writes the checkpoint `cp`,
    /// so a pause never outlasts the lease and a stopped job resumes where it stopped. Best effort:
    /// if either fails, the last checkpoint written stays (`deferred.pending` stays set, so a run
    /// that then ends goes back to its counts), and a resumed job redoes the batches after it
    /// (deletes are idempotent).
    async fn settle(&mut self, deferred: &mut Deferred, cp: &Checkpoint) {
        if deferred.pending
            && let Err(e) = self.checkpoint(deferred, cp).await
        {
            tracing::warn!(job = %self.job.id, error = ?e, "could not checkpoint deferred batches");
        }
    }

    /// Records a batch transaction that rolled back on a timeout after running since `began` (its
    /// `BEGIN`; the wait for a connection before it holds no lock).
    fn note_rollback(&mut self, began: Option<std::time::Instant>) {
        self.progress.timeouts += 1;
        let ms = began.map_or(0.0, |b| b.elapsed().as_secs_f64() * 1000.0);
        self.progress.rolled_back_ms += ms;
        self.progress.longest_rolled_back_ms = self.progress.longest_rolled_back_ms.max(ms);
    }

    /// Pauses between batches (pacing), recorded in the progress; a stop request (SIGTERM) ends the
    /// pause at once, and the next batch boundary hands the job back.
    async fn pause(&mut self, pause: Duration, reason: String) -> Result<(), Stop> {
        tracing::info!(job = %self.job.id, pause_ms = pause.as_millis(), %reason, "pacing: pausing the hard delete");
        self.progress.pauses += 1;
        self.progress.paused_ms += pause.as_secs_f64() * 1000.0;
        self.progress.last_pause_reason = Some(reason);
        tokio::select! {
            () = self.worker.stop.cancelled() => {}
            () = tokio::time::sleep(pause) => {}
        }
        Ok(())
    }
}

/// Puts `cp` at the start of its step `cp.step`: no cursor, and the step's first batch size
/// ([`Plan::first_batch`] of `batch_rows`, at most `max_rows`; one row for the root step). Cost
/// per row differs per table (a parent's delete checks every child table): each step starts small
/// again and grows by measurement. The first batch reads as many parents as it has rows when its
/// foreign key to them has an index (each parent's children are then one index lookup, at most the
/// batch's rows each), so a step whose parents have few children does not spend a batch on one
/// parent first; else as many parents as the table's estimate lets scan within a first batch
/// ([`Plan::first_unindexed_parents`]: each parent's children are a scan of the table).
fn start_step(cp: &mut Checkpoint, plan: &Plan, batch_rows: i64, max_rows: i64) {
    cp.cursor = Cursor::Start;
    let step = plan.steps.get(cp.step);
    cp.rows = match step {
        // The root step deletes one row by its key (`Batches::root_unbounded`), not through
        // smaller sizes that are the same row.
        Some(s) if s.path.is_empty() => 1,
        Some(s) => plan.first_batch(s, batch_rows),
        None => batch_rows,
    }
    .min(max_rows.max(1));
    cp.parents = match step {
        Some(s)
            if s.path
                .first()
                .is_some_and(|&fk| !plan.catalog.foreign_keys[fk].indexed) =>
        {
            plan.first_unindexed_parents(s, cp.rows)
        }
        _ => cp.rows.max(1),
    };
}

/// What of a run's hard delete is durable on the target.
struct Deferred {
    /// Batches committed deferred (`synchronous_commit = off`) since the last checkpoint.
    pending: bool,
    /// The target's incarnation when the run started or last checkpointed (with a checkpoint
    /// interval only): a batch or flush that reads another one means the target restarted in
    /// between.
    incarnation: Option<engine::Incarnation>,
    /// The progress written with the last checkpoint (or the run's at its start).
    durable: crate::worker::Progress,
    /// The last checkpoint written (or the job's at the run's start): where the batches resume
    /// after the target restarted.
    written: Option<serde_json::Value>,
    /// Set once the target restarted during the run: from then on every batch commits durably
    /// and is checkpointed (as with `checkpoint_interval = "0s"`).
    durable_only: bool,
    /// Where the batches stand after the last one committed (the checkpoint to write for it).
    position: Option<Checkpoint>,
}

impl Deferred {
    /// What the next batch must find the target to be ([`engine::before_batch`]): the
    /// incarnation, while deferred batches are not yet flushed; else nothing to check.
    fn unchanged(&self) -> Option<&engine::Incarnation> {
        self.incarnation.as_ref().filter(|_| self.pending)
    }
}
