//! The fallback for a cycle's entry table whose batch failed a NO ACTION check the cascade passes
//! (see [`crate::engine::cycles`]).

use super::super::{JobRun, Stop};
use super::Deferred;
use crate::engine::{self, Cursor, Plan};
use crate::telemetry;
use crate::worker::progress::Checkpoint;

impl JobRun {
    /// Deletes every tenant row left in the table of step `cp.step` in one statement under the
    /// full `[hard_delete] statement_timeout` ([`engine::run_sweep`]), PostgreSQL cascading to the
    /// rest of the cycle, and moves `cp` past the table's steps. The caller holds the kill-switch
    /// gate. Counted as an unbounded step: its transaction may exceed the batch bound.
    ///
    /// # Errors
    /// [`Stop::Error`] with the statement's error (a 23503 here is the cascade's own failure).
    pub(super) async fn sweep_cycle(
        &mut self,
        plan: &Plan,
        cp: &mut Checkpoint,
        tenant: &str,
        deferred: &Deferred,
    ) -> Result<(), Stop> {
        let table = plan.steps[cp.step].table;
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
        let elapsed = started.elapsed();
        let cascaded_rows: i64 = cascaded.iter().map(|(_, n)| n).sum();
        telemetry::batch_committed(elapsed, deleted + cascaded_rows);
        self.progress
            .record_batch(&name, deleted, elapsed.as_secs_f64() * 1000.0);
        for (oid, rows) in cascaded {
            self.progress
                .record_cascaded(&plan.name(oid).to_string(), rows);
        }
        self.progress.unbounded_steps += 1;
        self.progress.note = Some(format!(
            "rows of {name}'s foreign-key cycle reference each other across batches; its remaining rows were deleted in one statement"
        ));
        self.progress.table_mut(&name).done = true;
        cp.step = plan
            .steps
            .iter()
            .rposition(|s| s.table == table)
            .map_or(plan.steps.len(), |last| last + 1);
        cp.cursor = Cursor::Start;
        cp.parents = 1;
        cp.kept_back = 0;
        cp.pass_deleted = 0;
        cp.rows = plan
            .steps
            .get(cp.step)
            .map_or(self.limits.rows, |s| plan.first_batch(s, self.limits.rows));
        Ok(())
    }
}
