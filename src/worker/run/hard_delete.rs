//! The hard delete of one job run: batches in the plan's order (leaves of the foreign-key graph
//! first), each a short transaction under the job's [`BatchLimits`], with its checkpoint written
//! after each commit, timeouts absorbed by shrinking, key ranges and index passes for large
//! parents, held-row passes for non-CASCADE self-references, and pacing between batches.

use std::time::Duration;

use super::{JobRun, MAX_LOCAL_TIMEOUTS, Stop};
use crate::engine::simulate;
use crate::engine::{self, BatchLimits, Cursor, EngineError, Plan};
use crate::telemetry;
use crate::worker::backoff;
use crate::worker::pacing::Pacer;
use crate::worker::progress::Checkpoint;

mod rest;
mod sweep;
use rest::{REST_SHOWN, rfc3339_after};

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

    /// [`Self::hard_delete`]'s batches; `deferred` tracks what is not yet durable.
    async fn batches(
        &mut self,
        leaves_first: &Plan,
        tenant: &str,
        deferred: &mut Deferred,
    ) -> Result<(), Stop> {
        let w = self.worker.clone();
        let hd = &w.config.hard_delete;
        let stored = Checkpoint::from_json(deferred.written.as_ref());
        let mut cascade_rows = stored
            .as_ref()
            .and_then(|cp| cp.cascade_rows)
            .unwrap_or(hd.cascade_rows);
        let mut plan = leaves_first.clone().absorb(f64::from(cascade_rows));
        let batch_rows = self.limits.rows;
        let lowered = |rows: u32| (rows != hd.cascade_rows).then_some(rows);
        let fresh = |plan: &Plan, cascade_rows: u32| Checkpoint {
            plan: plan.hash(),
            step: 0,
            cursor: Cursor::Start,
            parents: 1,
            rows: plan
                .steps
                .first()
                .map_or(batch_rows, |s| plan.first_batch(s, batch_rows)),
            cascade_rows: lowered(cascade_rows),
            kept_back: 0,
            pass_deleted: 0,
        };
        let starting = !matches!(&stored, Some(cp) if cp.plan == plan.hash());
        let mut cp = match stored {
            Some(cp) if cp.plan == plan.hash() => cp,
            Some(_) => {
                // The schema changed since the checkpoint: start over (deletes are idempotent).
                self.progress.note = Some(
                    "schema changed since the last checkpoint; restarted from the first step"
                        .into(),
                );
                fresh(&plan, cascade_rows)
            }
            None => fresh(&plan, cascade_rows),
        };
        self.progress.plan_hash = Some(plan.hash());
        for step in &leaves_first.steps {
            self.progress
                .table_mut(&leaves_first.name(step.table).to_string());
        }
        if starting && simulate::detaches(leaves_first) {
            // The cascade's SET NULL / SET DEFAULT updates that keep rows out of a later CASCADE
            // (engine::simulate::preset) go first, so the batches meet those rows as it would.
            let gate = self.may_destroy().await?;
            let presets = simulate::presets(
                &w.pools.target,
                leaves_first,
                tenant,
                &self.limits,
                hd.batch_timeout(),
                hd.max_simulated_rows,
            )
            .await
            .map_err(EngineError::from)?;
            let updated =
                simulate::apply_presets(&w.pools.target, leaves_first, &presets, &self.limits)
                    .await?;
            drop(gate);
            self.progress.presets = updated;
        }
        deferred.durable = self.progress.clone();
        let mut timeouts = 0;
        let hd = &w.config.hard_delete;
        // The run's claim, plan and checks before the first batch are work the duty cycle paces.
        let mut pacer = Pacer::new(
            &w.config.pacing,
            w.config.worker.lease,
            hd.max_batch_duration,
        )
        .working_since(
            self.started
                .take()
                .unwrap_or_else(tokio::time::Instant::now),
        );
        let mut large_parent = false;
        // The next batch reads first where its rows begin (`engine::queries::batch`'s `jump`):
        // for one retry after the batch bound cut a batch short, once between two batches that
        // commit (a jump that is cut short too did not help: the retries shrink without it).
        let mut jump = false;
        let mut jumped = false;
        // The step whose batches run under the full `statement_timeout`: its single row could not
        // be deleted within the batch bound (see below). Any other batch is cut at the bound.
        let mut unbounded_step: Option<usize> = None;
        // With a checkpoint interval, batches commit deferred (synchronous_commit = off); `pending`
        // says some have since the last checkpoint, which are flushed before the next one, and
        // the target's incarnation says whether it restarted in between.
        let every = if deferred.durable_only {
            Duration::ZERO
        } else {
            hd.checkpoint_every(w.config.worker.lease)
        };
        if !every.is_zero() {
            deferred.incarnation = Some(
                engine::incarnation(&w.pools.target, &self.limits)
                    .await
                    .map_err(EngineError::from)?,
            );
        }
        let mut checkpointed = std::time::Instant::now();
        while cp.step < plan.steps.len() {
            let checked = std::time::Instant::now();
            let gate = match self.may_destroy().await {
                Ok(gate) => gate,
                Err(stop) => {
                    self.settle(deferred, &cp).await;
                    return Err(stop);
                }
            };
            self.progress.bookkeeping_ms += checked.elapsed().as_secs_f64() * 1000.0;
            let step = &plan.steps[cp.step];
            let table = plan.name(step.table).to_string();
            let cascades = plan.absorbs_below(step.table);
            let limits = BatchLimits {
                rows: cp.rows,
                // Every batch is cut short at ⅘ of max_batch_duration when it runs longer than the
                // sizing expected, and retried smaller: a batch that lets PostgreSQL cascade when a
                // parent row has far more descendants than estimated (then the plan falls back to
                // leaves first), any batch on a stall.
                statement_timeout: if unbounded_step == Some(cp.step) {
                    self.limits.statement_timeout
                } else {
                    self.limits.statement_timeout.min(hd.batch_timeout())
                },
                deferred: !every.is_zero(),
                ..self.limits
            };
            let began = std::sync::OnceLock::new();
            let result = engine::run_batch(
                &w.pools.target,
                &plan,
                engine::BatchStart {
                    step: cp.step,
                    cursor: &cp.cursor,
                    parents: cp.parents,
                    large_parent,
                    unchanged: deferred.unchanged(),
                    began: &began,
                    jump,
                },
                tenant,
                &limits,
            )
            .await;
            if let Err(e) = &result {
                telemetry::batch_failed(e.sqlstate().as_deref());
            }
            // A jump serves one attempt: one cut short too is retried without it.
            jump = false;
            let batch = match result {
                Ok(batch) => batch,
                Err(e)
                    if e.sqlstate().as_deref() == Some("57014")
                        && limits.statement_timeout < self.limits.statement_timeout
                        && !jumped
                        && !step.path.is_empty()
                        && !plan.block_step(step) =>
                {
                    // The batch bound cut the batch short. Before shrinking it or blaming a
                    // cascade, retry it once with the same size reading first where its rows
                    // begin: a tenant whose rows sit behind other tenants' rows in key order
                    // makes the ordered scan walk theirs, at any batch size.
                    self.note_rollback(began.get().copied());
                    drop(gate);
                    (jump, jumped) = (true, true);
                    self.progress.jumps += 1;
                    continue;
                }
                Err(e)
                    if e.sqlstate().as_deref() == Some("57014")
                        && cascades
                        && cp.rows <= 1
                        && cascade_rows > 0 =>
                {
                    // One parent row's cascade alone outlasts the budget: its subtree is larger
                    // than estimated. Re-plan with an eighth of the cascade allowance (at the end,
                    // leaves first: every row by its own batch) and start the steps over; what is
                    // deleted stays deleted.
                    self.note_rollback(began.get().copied());
                    cascade_rows = if cascade_rows >= 64 {
                        cascade_rows / 8
                    } else {
                        0
                    };
                    self.progress.note = Some(format!(
                        "a single row of {table} cascaded for longer than {} ms; re-planned with cascade_rows = {cascade_rows}",
                        limits.statement_timeout.as_millis()
                    ));
                    self.progress.replans += 1;
                    self.progress.cascade_rows = Some(cascade_rows);
                    plan = leaves_first.clone().absorb(f64::from(cascade_rows));
                    cp = fresh(&plan, cascade_rows);
                    unbounded_step = None;
                    self.progress.plan_hash = Some(plan.hash());
                    continue;
                }
                Err(e)
                    if e.sqlstate().as_deref() == Some("57014")
                        && limits.statement_timeout < self.limits.statement_timeout =>
                {
                    // The batch bound, not the server's own statement_timeout, cut the batch
                    // short: the batch was slower than the sizing expected. Retry smaller (a
                    // bound cut is not a failure: it does not count towards the run's timeouts,
                    // and the size reaches one row within a few cuts). When one row alone does
                    // not fit the bound (a SET NULL fan-out to many rows, a slow trigger), the
                    // step's batches get the full statement_timeout instead; the longest
                    // transaction then shows it.
                    self.note_rollback(began.get().copied());
                    drop(gate);
                    if cp.rows <= 1 {
                        unbounded_step = Some(cp.step);
                        self.progress.unbounded_steps += 1;
                        self.progress.note = Some(format!(
                            "a single row of {table} could not be deleted within {} ms; the step runs under the full statement_timeout",
                            limits.statement_timeout.as_millis()
                        ));
                    } else {
                        cp.rows = self.sizing.after_timeout(cp.rows);
                        cp.parents = cp.parents.min(cp.rows);
                    }
                    continue;
                }
                Err(e)
                    if matches!(e.sqlstate().as_deref(), Some("57014" | "55P03"))
                        && timeouts < MAX_LOCAL_TIMEOUTS =>
                {
                    // The batch hit statement_timeout or lock_timeout and rolled back: retry
                    // smaller; after a lock timeout first give the lock holder a moment.
                    self.note_rollback(began.get().copied());
                    drop(gate);
                    timeouts += 1;
                    cp.rows = self.sizing.after_timeout(cp.rows);
                    cp.parents = cp.parents.min(cp.rows);
                    if e.sqlstate().as_deref() == Some("55P03") {
                        self.settle(deferred, &cp).await;
                        let pause = backoff(
                            timeouts,
                            w.config.pacing.backoff,
                            w.config.pacing.backoff_max,
                        );
                        self.pause(pause, "lock_timeout: another session holds a lock".into())
                            .await?;
                        pacer.rested();
                    }
                    continue;
                }
                Err(e)
                    if e.sqlstate().as_deref() == Some("23503") && plan.cycle_entry(step.table) =>
                {
                    // Rows of one entry row's cycle reference rows below another's: the batch
                    // failed a NO ACTION check the cascade passes, deleting them all in one
                    // statement (engine::cycles). So does deprov, still under the gate.
                    self.note_rollback(began.get().copied());
                    self.sweep_cycle(&plan, &mut cp, tenant, deferred).await?;
                    drop(gate);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            timeouts = 0;
            jumped = false;
            deferred.pending |= limits.deferred;
            if large_parent
                && plan.range_step(step)
                && let Some(Cursor::AfterParent(parent)) = &batch.next
            {
                // A large parent's children are gone: mark their dead index entries before the
                // parent's own delete has to walk them (engine::range).
                let budget = (hd.max_batch_duration * 4 / 5).max(Duration::from_millis(1));
                let started = std::time::Instant::now();
                match engine::kill_dead_entries(&w.pools.target, &plan, cp.step, parent, budget)
                    .await
                {
                    Ok(pass) => self
                        .progress
                        .record_index_pass(&pass, started.elapsed().as_secs_f64() * 1000.0),
                    Err(e) => tracing::warn!(job = %self.job.id, error = %e, "index pass failed"),
                }
            }
            // A parent that alone filled this batch is continued as a key range.
            large_parent = batch.parents_used == 1 && batch.selected >= cp.rows;
            let cascaded: i64 = batch.cascaded.iter().map(|(_, n)| n).sum();
            tracing::debug!(
                job = %self.job.id,
                step = cp.step,
                table = %table,
                block = plan.block_step(step),
                rows = cp.rows,
                parents = cp.parents,
                selected = batch.selected,
                deleted = batch.deleted,
                cascaded,
                ms = batch.elapsed.as_secs_f64() * 1000.0,
                "batch committed"
            );
            telemetry::batch_committed(batch.elapsed, batch.deleted + cascaded);
            self.progress
                .record_batch(&table, batch.deleted, batch.elapsed.as_secs_f64() * 1000.0);
            for &(oid, rows) in &batch.cascaded {
                self.progress
                    .record_cascaded(&plan.name(oid).to_string(), rows);
            }
            // A block range is read whole, however few of its rows are the tenant's: it is sized
            // by time alone.
            let full = if plan.block_step(step) {
                cp.rows
            } else {
                batch.selected
            };
            let rows = self.sizing.next_rows(cp.rows, full, batch.elapsed);
            cp.parents = self.sizing.next_parents(cp.parents, cp.rows, &batch, rows);
            cp.rows = rows;
            cp.kept_back += batch.selected - batch.deleted;
            cp.pass_deleted += batch.deleted;
            let last_of_table = !plan.steps[cp.step + 1..]
                .iter()
                .any(|s| s.table == step.table);
            match batch.next {
                Some(cursor) => cp.cursor = cursor,
                None if last_of_table && cp.kept_back > 0 => {
                    // Rows kept back as still referenced through a non-CASCADE self-reference must
                    // be gone before a parent's cascade reaches them (it would fire that reference
                    // on them while their referencing rows remain). Once their referencing rows are
                    // deleted they can go: pass over the table's steps again while a pass deletes
                    // something, then delete what is left in one statement.
                    if cp.pass_deleted > 0 {
                        self.progress.held_passes += 1;
                        cp.step = plan
                            .steps
                            .iter()
                            .position(|s| s.table == step.table)
                            .expect("the step's own table");
                    } else {
                        self.sweep(&plan, step.table, tenant, deferred).await?;
                        self.progress.held_sweeps += 1;
                        cp.step += 1;
                    }
                    cp.kept_back = 0;
                    cp.pass_deleted = 0;
                    start_step(&mut cp, &plan, self.limits.rows);
                }
                None => {
                    if last_of_table {
                        cp.kept_back = 0;
                        cp.pass_deleted = 0;
                    }
                    cp.step += 1;
                    start_step(&mut cp, &plan, self.limits.rows);
                    if !plan.steps[cp.step..].iter().any(|s| s.table == step.table) {
                        self.progress.table_mut(&table).done = true;
                    }
                }
            }
            drop(gate);
            deferred.position = Some(cp.clone());
            if !deferred.pending || checkpointed.elapsed() >= every {
                self.checkpoint(deferred, &cp).await?;
                checkpointed = std::time::Instant::now();
            }
            if cp.step >= plan.steps.len() {
                // The last batch: no rest after it (the duty cycle is the job's; the job is done).
                break;
            }
            // The duty cycle's rest and the rate limit's wait can be long (a low duty cycle, a
            // batch that cascaded to many rows at a low rate): the lease is renewed through them
            // every third of the lease, so a live worker never looks gone (a lease that ran out
            // lets another worker take the job over), and a kill switch engaged meanwhile holds
            // the job at once.
            let rest = pacer.rest_due();
            if rest >= REST_SHOWN {
                // Visible in the job's progress while it lasts, not only once it ended.
                self.progress.resting_until = Some(rfc3339_after(rest));
                self.checkpoint(deferred, &cp).await?;
                checkpointed = std::time::Instant::now();
            }
            let admit = pacer.admit(batch.deleted + cascaded, &w.stop);
            let waited = self
                .wait_through(admit, deferred, &cp, &mut checkpointed)
                .await?;
            if !w.stop.is_cancelled() {
                // Kept when a stop request cut the rest short: the next run takes what is left.
                self.progress.resting_until = None;
            }
            self.progress.duty_cycle_ms += waited.duty_cycle.as_secs_f64() * 1000.0;
            self.progress.rate_limited_ms += waited.rate_limit.as_secs_f64() * 1000.0;
            if let Some((pause, reason)) = pacer.pause(&w.pools.target, batch.elapsed).await {
                self.settle(deferred, &cp).await;
                self.pause(pause, reason).await?;
                pacer.rested();
            }
        }
        if deferred.pending {
            // The last batches are made durable and checkpointed before the job may complete.
            self.checkpoint(deferred, &cp).await?;
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

/// Puts `cp` at the start of its step `cp.step`: no cursor, one parent, and the step's first batch
/// size ([`Plan::first_batch`] of `batch_rows`). Cost per row differs per table (a parent's delete
/// checks every child table): each step starts small again and grows by measurement.
fn start_step(cp: &mut Checkpoint, plan: &Plan, batch_rows: i64) {
    cp.cursor = Cursor::Start;
    cp.parents = 1;
    cp.rows = plan
        .steps
        .get(cp.step)
        .map_or(batch_rows, |s| plan.first_batch(s, batch_rows));
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
    /// What the next batch must find the target to be ([`engine::check_unchanged`]): the
    /// incarnation, while deferred batches are not yet flushed; else nothing to check.
    fn unchanged(&self) -> Option<&engine::Incarnation> {
        self.incarnation.as_ref().filter(|_| self.pending)
    }
}
