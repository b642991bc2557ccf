//! What a committed batch leads to: its rows in the progress, the next batch's size, the step's
//! next position (or the next step, after held rows are passed over again or swept), and the
//! rests of the duty cycle and rate limit before the next batch.

use std::time::Duration;

use super::super::{JobRun, Stop};
use super::batches::Batches;
use super::rest::{REST_SHOWN, rfc3339_after};
use super::{Deferred, start_step};
use crate::engine::{self, BatchResult, Cursor};
use crate::telemetry;

impl JobRun {
    /// Records a committed batch transaction of `table` (its quoted name) that took `elapsed`:
    /// `deleted` rows of the table itself and `cascaded` rows per table oid of `plan` under it, in
    /// the metrics and the job's progress. Returns the rows it deleted in all.
    pub(super) fn record_committed(
        &mut self,
        plan: &crate::engine::Plan,
        table: &str,
        deleted: i64,
        cascaded: &[(u32, i64)],
        elapsed: Duration,
    ) -> i64 {
        let rows = deleted + cascaded.iter().map(|(_, n)| n).sum::<i64>();
        telemetry::batch_committed(elapsed, rows);
        self.progress
            .record_batch(table, deleted, elapsed.as_secs_f64() * 1000.0);
        for &(oid, n) in cascaded {
            self.progress
                .record_cascaded(&plan.name(oid).to_string(), n);
        }
        rows
    }

    /// Records the committed `batch` of `b`'s current step and moves `b` on. Returns the rows the
    /// batch deleted in all, its cascade included. The caller holds the kill-switch gate: a sweep
    /// of held rows runs under it.
    ///
    /// # Errors
    /// [`Stop`] when a sweep of held rows fails.
    pub(super) async fn on_committed(
        &mut self,
        b: &mut Batches,
        batch: &BatchResult,
        deferred_batch: bool,
        tenant: &str,
        deferred: &mut Deferred,
    ) -> Result<i64, Stop> {
        let w = self.worker.clone();
        let hd = &w.config.hard_delete;
        b.timeouts = 0;
        b.jumped = false;
        deferred.pending |= deferred_batch;
        let step = b.plan.steps[b.cp.step].clone();
        let table = b.plan.name(step.table).to_string();
        let block = b.plan.block_step(&step);
        if b.large_parent
            && b.plan.range_step(&step)
            && let Some(Cursor::AfterParent(parent)) = &batch.next
        {
            // A large parent's children are gone: mark their dead index entries before the
            // parent's own delete has to walk them (engine::range_batch).
            let budget = (hd.max_batch_duration * 4 / 5).max(Duration::from_millis(1));
            let started = std::time::Instant::now();
            match engine::kill_dead_entries(&w.pools.target, &b.plan, b.cp.step, parent, budget)
                .await
            {
                Ok(pass) => self
                    .progress
                    .record_index_pass(&pass, started.elapsed().as_secs_f64() * 1000.0),
                Err(e) => tracing::warn!(job = %self.job.id, error = %e, "index pass failed"),
            }
        }
        // A parent that alone filled this batch is continued as a key range. A batch of one row
        // says nothing of its parent's size (any parent with a child fills it): the next batch,
        // larger, reads the rest of that parent's children and the next parents together.
        b.large_parent = batch.parents_used == 1 && batch.selected >= b.cp.rows && b.cp.rows > 1;
        let total = self.record_committed(
            &b.plan,
            &table,
            batch.deleted,
            &batch.cascaded,
            batch.elapsed,
        );
        tracing::debug!(
            job = %self.job.id,
            step = b.cp.step,
            table = %table,
            block,
            rows = b.cp.rows,
            parents = b.cp.parents,
            selected = batch.selected,
            deleted = batch.deleted,
            cascaded = total - batch.deleted,
            ms = batch.elapsed.as_secs_f64() * 1000.0,
            "batch committed"
        );
        if b.root_step() && batch.elapsed > hd.max_batch_duration {
            // The root row ran past the bound it is not held to (`Batches::root_unbounded`): counted
            // as a step whose one row cannot be deleted within the bound. What took the time is
            // PostgreSQL's own work on the row: its referential triggers (a scan of every table
            // with a key to it without an index) and the cascade to the rows that go with it.
            self.progress.unbounded_steps += 1;
            tracing::info!(job = %self.job.id, ms = batch.elapsed.as_millis(), max_batch_ms = hd.max_batch_duration.as_millis(), "the root row's delete ran past max_batch_duration under the full statement_timeout");
        }
        // A block range is read whole, however few of its rows are the tenant's: it is sized by
        // time alone.
        let full = if block { b.cp.rows } else { batch.selected };
        let mut rows = self.sizing.next_rows(b.cp.rows, full, batch.elapsed);
        rows = b.measured.grown(&self.sizing, b.cp.step, b.cp.rows, rows);
        b.measured
            .note(&self.sizing, b.cp.step, full, batch.elapsed);
        if full > 0 {
            b.costliest
                .relax(b.cp.step, self.sizing.cost_per_row(full, batch.elapsed));
        }
        if let Some(ms_per_row) = b.costliest.cap(b.cp.step) {
            rows = rows.min(self.sizing.rows_at(ms_per_row));
        }
        b.cp.parents = self
            .sizing
            .next_parents(b.cp.parents, b.cp.rows, batch, rows);
        b.cp.rows = rows;
        b.cp.kept_back += batch.selected - batch.deleted;
        b.cp.pass_deleted += batch.deleted;
        match &batch.next {
            Some(cursor) => b.cp.cursor = cursor.clone(),
            None => self.step_done(b, step.table, tenant, deferred).await?,
        }
        Ok(total)
    }

    /// `b`'s current step on `table` has no rows left. Rows kept back as still referenced through
    /// a non-CASCADE self-reference must be gone before a parent's cascade reaches them (it would
    /// fire that reference on them while their referencing rows remain). Once their referencing
    /// rows are deleted they can go: after the table's last step, its steps run again while a
    /// pass deletes something, then what is left goes in one statement. Else the next step.
    async fn step_done(
        &mut self,
        b: &mut Batches,
        table: u32,
        tenant: &str,
        deferred: &mut Deferred,
    ) -> Result<(), Stop> {
        let last_of_table = !b.plan.steps[b.cp.step + 1..]
            .iter()
            .any(|s| s.table == table);
        if last_of_table && b.cp.kept_back > 0 {
            if b.cp.pass_deleted > 0 {
                self.progress.held_passes += 1;
                b.cp.step = b
                    .plan
                    .steps
                    .iter()
                    .position(|s| s.table == table)
                    .expect("the step's own table");
            } else {
                self.sweep(&b.plan, table, tenant, deferred).await?;
                self.progress.held_sweeps += 1;
                b.cp.step += 1;
            }
        } else {
            b.cp.step += 1;
            if last_of_table {
                self.progress
                    .table_mut(&b.plan.name(table).to_string())
                    .done = true;
            }
        }
        if last_of_table {
            b.cp.kept_back = 0;
            b.cp.pass_deleted = 0;
        }
        self.pass_empty(b);
        Ok(())
    }

    /// Moves `b` past the steps known empty from its current one on ([`Batches::empty`]), marking
    /// a table done whose last step is passed over, and starts the step it stops at.
    pub(super) fn pass_empty(&mut self, b: &mut Batches) {
        while b.empty.contains(&b.cp.step) {
            let table = b.plan.steps[b.cp.step].table;
            b.cp.step += 1;
            if !b.plan.steps[b.cp.step..].iter().any(|s| s.table == table) {
                self.progress
                    .table_mut(&b.plan.name(table).to_string())
                    .done = true;
            }
        }
        start_step(&mut b.cp, &b.plan, self.limits.rows, self.sizing.max_rows);
    }

    /// Between two batches, after one that took `elapsed` (under the batch bound when `bounded`)
    /// and deleted `rows` in all: the duty cycle's rest and the rate limit's wait, with
    /// the lease renewed through them every third of the lease (a live worker never looks gone)
    /// and a kill switch engaged meanwhile holding the job at once; then a pause when the target
    /// is under pressure (`[pacing]`, [`crate::worker::pacing::Pacer::pause`]).
    ///
    /// # Errors
    /// [`Stop`] when a kill switch, cancel request or lost lease ends the run during the wait.
    pub(super) async fn between_batches(
        &mut self,
        b: &mut Batches,
        rows: i64,
        elapsed: Duration,
        bounded: bool,
        deferred: &mut Deferred,
    ) -> Result<(), Stop> {
        let w = self.worker.clone();
        let rest = b.pacer.rest_due();
        if rest >= REST_SHOWN {
            // Visible in the job's progress while it lasts, not only once it ended.
            self.progress.resting_until = Some(rfc3339_after(rest));
            self.checkpoint(deferred, &b.cp).await?;
            b.checkpointed = std::time::Instant::now();
        }
        let admit = b.pacer.admit(rows, &w.stop);
        let waited = self
            .wait_through(admit, deferred, &b.cp, &mut b.checkpointed)
            .await?;
        if !w.stop.is_cancelled() {
            // Kept when a stop request cut the rest short: the next run takes what is left.
            self.progress.resting_until = None;
        }
        self.progress.duty_cycle_ms += waited.duty_cycle.as_secs_f64() * 1000.0;
        self.progress.rate_limited_ms += waited.rate_limit.as_secs_f64() * 1000.0;
        if let Some((pause, reason)) = b.pacer.pause(&w.pools.target, elapsed, bounded).await {
            self.settle(deferred, &b.cp).await;
            self.pause(pause, reason).await?;
            b.pacer.rested();
        }
        Ok(())
    }
}
