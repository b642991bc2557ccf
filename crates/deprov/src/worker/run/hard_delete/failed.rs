//! What a batch that rolled back leads to: a retry reading first where its rows begin, a smaller
//! retry, a re-plan with less cascade, an unbounded step, a pause behind a lock holder, a sweep of
//! a cycle's entry table — or the end of the run.

use std::time::Instant;

use super::super::{JobRun, MAX_LOCAL_TIMEOUTS, Stop};
use super::Deferred;
use super::batches::Batches;
use crate::engine::{BatchLimits, EngineError, Plan};
use crate::sqlstate::{FOREIGN_KEY_VIOLATION, LOCK_NOT_AVAILABLE, QUERY_CANCELED};
use crate::worker::backoff;
use crate::worker::presence::Gate;
use crate::worker::sizing::{Costliest, Measured};

impl JobRun {
    /// Handles the error `e` of the batch that ran under `limits` since `began` (its `BEGIN`) with
    /// the kill-switch `gate` held, and leaves `b` ready for the next batch. `leaves_first` is the
    /// plan without cascade allowance (what a re-plan starts from).
    ///
    /// # Errors
    /// [`Stop`] when the error ends the run: not a timeout, or more than
    /// [`MAX_LOCAL_TIMEOUTS`] timeouts in a row, or the pause or sweep it leads to stops it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn on_failed(
        &mut self,
        b: &mut Batches,
        e: EngineError,
        limits: &BatchLimits,
        began: Option<Instant>,
        gate: Gate,
        leaves_first: &Plan,
        tenant: &str,
        deferred: &mut Deferred,
    ) -> Result<(), Stop> {
        let w = self.worker.clone();
        let step = &b.plan.steps[b.cp.step];
        let table = b.plan.name(step.table).to_string();
        let state = e.sqlstate();
        let canceled = state.as_deref() == Some(QUERY_CANCELED);
        // The batch bound, not the server's own statement_timeout, cut the batch short.
        let bound_cut = canceled && Batches::bounded(limits, &self.limits);
        tracing::debug!(
            job = %self.job.id,
            step = b.cp.step,
            %table,
            block = b.plan.block_step(step),
            rows = limits.rows,
            parents = b.cp.parents,
            sqlstate = state.as_deref().unwrap_or(""),
            bound_cut,
            ms = began.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1000.0),
            "batch rolled back"
        );
        if bound_cut && !b.jumped && !b.root_step() && !b.plan.block_step(step) {
            // Before shrinking the batch or blaming a cascade, retry it once with the same size
            // reading first where its rows begin: a tenant whose rows sit behind other tenants'
            // rows in key order makes the ordered scan walk theirs, at any batch size.
            self.note_rollback(began);
            drop(gate);
            (b.jump, b.jumped) = (true, true);
            self.progress.jumps += 1;
            return Ok(());
        }
        // The root row's step runs under the bound only when its delete takes absorbed tables'
        // rows and its scans fit the bound (`Batches::root_unbounded`): a cut there is those
        // rows', and re-plans. Another row under
        // which only covered tables' rows may cascade is cut by its own work: their rows naming
        // the tenant went with their own steps before, so what the bound cut is the row's own
        // delete and its triggers' scans, which no plan with less cascade changes. So is a row
        // whose cascade reaches only absorbed tables its delete scans anyway (no index on their
        // key to it): a re-plan would add a pass of batches over each of them and leave the row's
        // delete its scans. `Plan::absorbs_only_scanned_below` holds in both cases; such a row
        // runs under the full statement_timeout (`after_bound_cut`) instead of re-planning.
        let own_work_cut =
            bound_cut && !b.root_step() && b.plan.absorbs_only_scanned_below(step.table);
        if canceled
            && !own_work_cut
            && b.plan.absorbs_below(step.table)
            && b.cp.rows <= 1
            && b.cascade_rows > 0
        {
            self.note_rollback(began);
            self.replan_less_cascade(b, leaves_first, &table, limits);
            return Ok(());
        }
        if bound_cut {
            self.note_rollback(began);
            drop(gate);
            self.after_bound_cut(b, &table, limits);
            return Ok(());
        }
        let lock_timeout = state.as_deref() == Some(LOCK_NOT_AVAILABLE);
        if (canceled || lock_timeout) && b.timeouts < MAX_LOCAL_TIMEOUTS {
            // The batch hit statement_timeout or lock_timeout and rolled back: retry smaller;
            // after a lock timeout first give the lock holder a moment.
            self.note_rollback(began);
            drop(gate);
            b.timeouts += 1;
            self.shrink(b);
            if lock_timeout {
                self.settle(deferred, &b.cp).await;
                let pause = backoff(
                    b.timeouts,
                    w.config.pacing.backoff,
                    w.config.pacing.backoff_max,
                );
                self.pause(pause, "lock_timeout: another session holds a lock".into())
                    .await?;
                b.pacer.rested();
            }
            return Ok(());
        }
        if state.as_deref() == Some(FOREIGN_KEY_VIOLATION) && b.plan.cycle_entry(step.table) {
            // Rows of one entry row's cycle reference rows below another's: the batch failed a
            // NO ACTION check the cascade passes, deleting them all in one statement
            // (engine::cycles). So does deprov, still under the gate.
            self.note_rollback(began);
            gate.during(self.sweep_cycle(&b.plan, &mut b.cp, tenant, deferred))
                .await?;
            drop(gate);
            return Ok(());
        }
        Err(e.into())
    }

    /// After one parent row's cascade alone outlasted the batch bound (its subtree is larger than
    /// estimated): re-plans with an eighth of the cascade allowance, or a smaller one where that
    /// would leave the row's cascade as it is (at the end, leaves first: every row by its own
    /// batch), and starts the steps over; what is deleted stays deleted, and a step
    /// of the new plan under a step already finished is passed over ([`Batches::empty`]). A table
    /// with rows held back by a reference to itself counts as not finished.
    fn replan_less_cascade(
        &mut self,
        b: &mut Batches,
        leaves_first: &Plan,
        table: &str,
        limits: &BatchLimits,
    ) {
        // An allowance whose plan lets the cut row's statement cascade to the same tables would
        // only be cut again: the first one that changes them (at last 0, leaves first). The root
        // row, cut under the bound its scans fit (`Batches::root_unbounded`), goes on to the
        // first allowance under which its delete takes no absorbed table's rows: its allowance
        // has a floor in the pages it scans (`Plan::absorb_tenant`), so a smaller one may leave
        // it most of the rows that were cut.
        let step_table = b.plan.steps[b.cp.step].table;
        let root_cut = b.root_step();
        let below = b.plan.cascades_below(step_table);
        let next = loop {
            b.cascade_rows = if b.cascade_rows >= 64 {
                b.cascade_rows / 8
            } else {
                0
            };
            let next = leaves_first
                .clone()
                .absorb_tenant(f64::from(b.cascade_rows), &b.plan.tenant_rows);
            let changed = if root_cut {
                !next.absorbs_rows_below(step_table)
            } else {
                next.cascades_below(step_table) != below
            };
            if b.cascade_rows == 0 || changed {
                break next;
            }
        };
        self.progress.note = Some(format!(
            "a single row of {table} cascaded for longer than {} ms; re-planned with cascade_rows = {}",
            limits.statement_timeout.as_millis(),
            b.cascade_rows
        ));
        tracing::info!(job = %self.job.id, %table, step = b.cp.step, steps = b.plan.steps.len(), cascade_rows = b.cascade_rows, "one row cascaded past the batch bound: re-planning with less cascade");
        self.progress.replans += 1;
        self.progress.cascade_rows = Some(b.cascade_rows);
        let finished: Vec<Vec<usize>> = b.plan.steps[..b.cp.step]
            .iter()
            .filter(|s| b.plan.held_self_refs(s.table).is_empty())
            .map(|s| s.path.clone())
            .collect();
        b.plan = next;
        b.empty = (0..b.plan.steps.len())
            .filter(|&i| {
                let path = &b.plan.steps[i].path;
                finished
                    .iter()
                    .any(|done| !done.is_empty() && path.ends_with(done))
            })
            .collect();
        b.cp = Batches::fresh(
            &b.plan,
            b.cascade_rows,
            &self.worker.config.hard_delete,
            self.limits.rows,
        );
        self.pass_empty(b);
        b.unbounded_step = None;
        b.costliest = Costliest::default();
        b.measured = Measured::default();
        self.progress.plan_hash = Some(b.plan.hash());
    }

    /// After the batch bound (not the server's statement_timeout) cut a batch short: the next is
    /// smaller (a bound cut is not a failure: it does not count towards the run's timeouts, and the
    /// size reaches one row within a few cuts). When one row alone does not fit the bound (a SET
    /// NULL fan-out to many rows, a slow trigger), the step's batches of one row get the full
    /// statement_timeout instead ([`Batches::unbounded_step`]); the longest transaction then shows
    /// it. Batches that grow back past that row are bounded again.
    fn after_bound_cut(&mut self, b: &mut Batches, table: &str, limits: &BatchLimits) {
        if b.cp.rows <= 1 {
            b.unbounded_step = Some(b.cp.step);
            self.progress.unbounded_steps += 1;
            self.progress.note = Some(format!(
                "a single row of {table} could not be deleted within {} ms; the step runs under the full statement_timeout",
                limits.statement_timeout.as_millis()
            ));
        } else {
            let cut = self
                .sizing
                .cost_per_row(b.cp.rows, limits.statement_timeout);
            b.costliest.cut(b.cp.step, cut);
            self.shrink(b);
        }
    }

    /// The next batch after a timeout: a quarter of the rows, no more parents than rows.
    fn shrink(&self, b: &mut Batches) {
        b.cp.rows = self.sizing.after_timeout(b.cp.rows);
        b.cp.parents = b.cp.parents.min(b.cp.rows);
    }
}
