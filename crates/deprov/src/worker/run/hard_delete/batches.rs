//! The hard-delete loop's state between batches, and where a run's batches start: the stored
//! checkpoint when it was made for the same plan, else the first step.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::super::{JobRun, Stop};
use super::{Deferred, start_step};
use crate::config::HardDeleteConfig;
use crate::engine::{self, BatchLimits, Cursor, EngineError, Plan, simulate};
use crate::worker::pacing::Pacer;
use crate::worker::progress::Checkpoint;
use crate::worker::sizing::{Costliest, Measured};

/// What the batches of one run carry from one batch to the next.
pub(super) struct Batches {
    /// The plan in force: the leaves-first plan with `cascade_rows` absorbed into it.
    pub plan: Plan,
    /// Where the batches stand (written as the job's checkpoint).
    pub cp: Checkpoint,
    /// The cascade allowance in force (`[hard_delete] cascade_rows`, lowered by re-plans). Re-plans
    /// keep the tenant's rows the plan was absorbed with (`engine::Plan::tenant_rows`).
    pub cascade_rows: u32,
    /// Statement and lock timeouts in a row (not batch-bound cuts), at most
    /// [`super::super::MAX_LOCAL_TIMEOUTS`] before the run fails.
    pub timeouts: u32,
    /// The last batch took one parent and filled up: the next continues that parent as a key range.
    pub large_parent: bool,
    /// The next batch reads first where its rows begin (`engine::queries::batch`'s `jump`): for
    /// one retry after the batch bound cut a batch short.
    pub jump: bool,
    /// A jump was tried since the last committed batch (a jump cut short too did not help: the
    /// retries shrink without it).
    pub jumped: bool,
    /// The step whose batches of one row run under the full `statement_timeout`: a single row of it
    /// could not be deleted within the batch bound. Its batches of more rows (grown back past
    /// that row) and any other step's are cut at the bound.
    pub unbounded_step: Option<usize>,
    /// How often deferred batches are checkpointed (zero: every batch commits durably).
    pub every: Duration,
    /// When the last checkpoint was written.
    pub checkpointed: Instant,
    /// The duty cycle and rate limit.
    pub pacer: Pacer,
    /// The costliest rows a batch cut short in the current step met: its next batches fit them.
    pub costliest: Costliest,
    /// The cost of the current step's last measured batch: the next grows no further than fits
    /// the target at it.
    pub measured: Measured,
    /// Steps of `plan` known to have no rows left, passed over (indexes): after a re-plan, each
    /// whose path ends with the path of a step finished before it. Every row such a step would
    /// delete references, through that path's first key, a row the finished step deleted.
    pub empty: BTreeSet<usize>,
}

impl Batches {
    /// The first checkpoint of `plan` under the allowance `cascade_rows` (recorded only when it
    /// differs from the configured one) and the tenant's rows the plan was absorbed with
    /// (`Plan::tenant_rows`, recorded when there are any), with first batches of `batch_rows`.
    pub fn fresh(
        plan: &Plan,
        cascade_rows: u32,
        hd: &HardDeleteConfig,
        batch_rows: i64,
    ) -> Checkpoint {
        let mut cp = Checkpoint {
            plan: plan.hash(),
            step: 0,
            cursor: Cursor::Start,
            parents: 1,
            rows: batch_rows,
            cascade_rows: (cascade_rows != hd.cascade_rows).then_some(cascade_rows),
            tenant_rows: (!plan.tenant_rows.is_empty()).then(|| plan.tenant_rows.clone()),
            kept_back: 0,
            pass_deleted: 0,
        };
        start_step(&mut cp, plan, batch_rows, i64::from(hd.max_batch_rows));
        cp
    }

    /// The limits of the next batch: the run's, cut short at the batch bound (⅘ of
    /// `max_batch_duration`) unless it is one row of the step that runs unbounded
    /// ([`Self::unbounded_step`]) or the root row's step held to no bound
    /// ([`Self::root_unbounded`]), committed deferred with a checkpoint interval. A batch that
    /// runs longer than the sizing expected (a cascade below a parent row far larger than
    /// estimated, a stall) is retried smaller.
    pub fn limits(&self, run: &BatchLimits, hd: &HardDeleteConfig) -> BatchLimits {
        let one_row = self.cp.rows <= 1;
        BatchLimits {
            rows: self.cp.rows,
            statement_timeout: if one_row
                && (self.unbounded_step == Some(self.cp.step) || self.root_unbounded(hd))
            {
                run.statement_timeout
            } else {
                run.statement_timeout.min(hd.batch_timeout())
            },
            deferred: !self.every.is_zero(),
            ..*run
        }
    }

    /// Whether a batch under `limits` (of [`Self::limits`]) runs under the batch bound, below the
    /// run's own `statement_timeout` (`run`): false for a step that runs unbounded.
    pub fn bounded(limits: &BatchLimits, run: &BatchLimits) -> bool {
        limits.statement_timeout < run.statement_timeout
    }

    /// Whether the current step deletes the root row (its path is empty; its batch is that one
    /// row).
    pub fn root_step(&self) -> bool {
        self.plan
            .steps
            .get(self.cp.step)
            .is_some_and(|s| s.path.is_empty())
    }

    /// Whether the current step is the root row's and runs under the full `statement_timeout`
    /// from its first batch: unless its delete takes absorbed tables' rows and its scans fit the
    /// batch bound ([`Plan::root_delete_bounded`]). The row cannot be split: what outlasts the
    /// bound when its scans do not fit it is PostgreSQL's own work on the row (its referential
    /// triggers' scans of tables without an index on their key to it), the same in any plan, so
    /// a cut could only lead to the same delete under the full timeout after a rolled-back try
    /// (`failed`). A root row held to the bound and cut there re-plans with less cascade instead,
    /// its absorbed tables' rows then deleted by steps of their own.
    pub fn root_unbounded(&self, hd: &HardDeleteConfig) -> bool {
        self.root_step() && !self.plan.root_delete_bounded(hd.batch_timeout())
    }

    /// Whether every step is done.
    pub fn done(&self) -> bool {
        self.cp.step >= self.plan.steps.len()
    }
}

impl JobRun {
    /// The most rows the tenant holds per table straight under the root by the statistics
    /// ([`engine::estimate::DirectRows::at_most`]), for the plan's absorption
    /// ([`engine::Plan::absorb_tenant`]): those the whole cascade's try read, else read now; none
    /// when nothing is absorbed (`cascade_rows` 0).
    ///
    /// # Errors
    /// [`Stop`] on a database error.
    async fn tenant_rows(
        &mut self,
        plan: &Plan,
        tenant: &str,
        cascade_rows: u32,
    ) -> Result<BTreeMap<u32, i64>, Stop> {
        if let Some(rows) = self.tenant_rows.take().filter(|_| cascade_rows > 0) {
            return Ok(rows);
        }
        let target = &self.worker.pools.target;
        Ok(
            engine::estimate::absorbable_rows(target, plan, tenant, &self.limits, cascade_rows)
                .await?,
        )
    }

    /// The state the batches of this run start from: the stored checkpoint (in
    /// `deferred.written`) when it was made for the same plan, else the first step — after the
    /// cascade's SET NULL / SET DEFAULT updates that keep rows out of a later CASCADE when the
    /// plan has such keys ([`simulate::presets`]).
    ///
    /// # Errors
    /// [`Stop`] when the kill switch holds the job before the updates, or they fail.
    pub(super) async fn start_batches(
        &mut self,
        leaves_first: &Plan,
        tenant: &str,
        deferred: &mut Deferred,
    ) -> Result<Batches, Stop> {
        let w = self.worker.clone();
        let hd = &w.config.hard_delete;
        let stored = Checkpoint::from_json(deferred.written.as_ref());
        let cascade_rows = stored
            .as_ref()
            .and_then(|cp| cp.cascade_rows)
            .unwrap_or(hd.cascade_rows);
        // A run that resumes plans with the figures its checkpoint was made with.
        let tenant_rows = match &stored {
            Some(cp) => cp.tenant_rows.clone().unwrap_or_default(),
            None => self.tenant_rows(leaves_first, tenant, cascade_rows).await?,
        };
        let plan = leaves_first
            .clone()
            .absorb_tenant(f64::from(cascade_rows), &tenant_rows);
        let starting = !matches!(&stored, Some(cp) if cp.plan == plan.hash());
        let cp = match stored {
            Some(cp) if cp.plan == plan.hash() => cp,
            Some(_) => {
                // The schema changed since the checkpoint: start over (deletes are idempotent).
                self.progress.note = Some(
                    "schema changed since the last checkpoint; restarted from the first step"
                        .into(),
                );
                Batches::fresh(&plan, cascade_rows, hd, self.limits.rows)
            }
            None => Batches::fresh(&plan, cascade_rows, hd, self.limits.rows),
        };
        self.progress.plan_hash = Some(plan.hash());
        for step in &leaves_first.steps {
            self.progress
                .table_mut(&leaves_first.name(step.table).to_string());
        }
        if starting && simulate::detaches(leaves_first) {
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
            let updated = gate
                .during(simulate::apply_presets(
                    &w.pools.target,
                    leaves_first,
                    &presets,
                    &self.limits,
                ))
                .await?;
            drop(gate);
            self.progress.presets = updated;
        }
        deferred.durable = self.progress.clone();
        // The run's claim, plan and checks before the first batch are work the duty cycle paces.
        let pacer = Pacer::new(
            &w.config.pacing,
            w.config.worker.lease,
            hd.max_batch_duration,
        )
        .working_since(
            self.started
                .take()
                .unwrap_or_else(tokio::time::Instant::now),
        );
        // With a checkpoint interval, batches commit deferred (synchronous_commit = off); the
        // target's incarnation says whether it restarted before they were flushed.
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
        Ok(Batches {
            plan,
            cp,
            cascade_rows,
            timeouts: 0,
            large_parent: false,
            jump: false,
            jumped: false,
            unbounded_step: None,
            every,
            checkpointed: Instant::now(),
            pacer,
            costliest: Costliest::default(),
            measured: Measured::default(),
            empty: BTreeSet::new(),
        })
    }
}
