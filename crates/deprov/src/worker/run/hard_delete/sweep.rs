//! One-statement sweeps of a table's remaining tenant rows: the last resort for rows kept back by
//! a non-CASCADE reference to itself, and for a cycle's entry table whose batch failed a NO ACTION
//! check the cascade passes (see [`crate::engine::cycles`]).

use super::super::{JobRun, Stop};
use super::{Deferred, start_step};
use crate::engine::{self, Plan};
use crate::telemetry;
use crate::worker::progress::Checkpoint;

impl JobRun {
    /// Deletes every tenant row left in `table` in one statement ([`engine::run_sweep`], under the
    /// full `[hard_delete] statement_timeout`), PostgreSQL cascading to the absorbed tables below,
    /// and records it as one batch of the table with the rows cascaded. The caller holds the
    /// kill-switch gate.
    ///
    /// # Errors
    /// [`Stop::Error`] with the statement's error.
    pub(super) async fn sweep(
        &mut self,
        plan: &Plan,
        table: u32,
        tenant: &str,
        deferred: &Deferred,
    ) -> Result<(), Stop> {
        let name = plan.name(table).to_string();
        let started = std::time::Instant::now();
        let swept = engine::run_sweep(
            &self.worker.pools.target,
            plan,
            table,
            tenant,
            &self.limits,
            deferred.unchanged(),
        )
        .await;
        if let Err(e) = &swept {
            telemetry::batch_failed(e.sqlstate().as_deref());
        }
        let (deleted, cascaded) = swept?;
        // A sweep is one more batch transaction of this table.
        self.record_committed(plan, &name, deleted, &cascaded, started.elapsed());
        self.progress.table_mut(&name).done = true;
        Ok(())
    }

    /// [`Self::sweep`] of the table of step `cp.step`, a cycle's entry, and `cp` moved past the
    /// table's steps. Counted as an unbounded step: its transaction may exceed the batch bound.
    ///
    /// # Errors
    /// As [`Self::sweep`] (a 23503 here is the cascade's own failure).
    pub(super) async fn sweep_cycle(
        &mut self,
        plan: &Plan,
        cp: &mut Checkpoint,
        tenant: &str,
        deferred: &Deferred,
    ) -> Result<(), Stop> {
        let table = plan.steps[cp.step].table;
        self.sweep(plan, table, tenant, deferred).await?;
        self.progress.unbounded_steps += 1;
        self.progress.note = Some(format!(
            "rows of {}'s foreign-key cycle reference each other across batches; its remaining rows were deleted in one statement",
            plan.name(table)
        ));
        cp.step = plan
            .steps
            .iter()
            .rposition(|s| s.table == table)
            .map_or(plan.steps.len(), |last| last + 1);
        cp.kept_back = 0;
        cp.pass_deleted = 0;
        start_step(cp, plan, self.limits.rows, self.sizing.max_rows);
        Ok(())
    }
}
