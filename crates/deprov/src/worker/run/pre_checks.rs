//! The checks of one job run before its first hard-delete statement: user `DELETE` triggers on the
//! tenant's tables, the trial cascade ([`crate::engine::trial`]) and the simulation
//! ([`crate::engine::simulate`]), and the verdict a later run of the job keeps. Each returns the
//! job's refusal, with the blockers listed.

use super::{JobRun, Stop};
use crate::engine::simulate::{self, SimError, Verdict};
use crate::engine::{self, EngineError};

impl JobRun {
    /// The checks before the hard delete that decide whether the tenant's cascade succeeds: user
    /// `DELETE` triggers ([`Self::refuse_user_triggers`]), the trial cascade ([`Self::trial`]) and
    /// the simulation with its blockers ([`simulate`]). `Ok(Some(refusal))` when the job must fail.
    ///
    /// A run keeps what they decided: once they passed and the tenant is soft-deleted (invisible to
    /// the application), `progress.prechecked_plan` holds the plan's hash, and a later run of the
    /// job (step `hard_delete`) with a plan of the same hash goes straight on. A plan of another
    /// hash (the schema changed) runs them again. With a grace period they run once more when it
    /// has ended: rows referencing the tenant may have been written meanwhile.
    pub(super) async fn pre_checks(
        &mut self,
        plan: &engine::Plan,
        tenant: &str,
    ) -> Result<Option<String>, Stop> {
        let hash = plan.hash();
        if self.job.step == "hard_delete"
            && self.progress.prechecked_plan.as_deref() == Some(hash.as_str())
        {
            tracing::debug!(job = %self.job.id, plan = %hash, "the pre-checks passed in an earlier run for this plan: not run again");
            return Ok(None);
        }
        let w = self.worker.clone();
        let config = &w.config;
        self.progress.prechecks += 1;
        if let Some(refusal) = self.refuse_user_triggers(plan).await? {
            return Ok(Some(refusal));
        }
        let tried = match self.trial(plan, tenant).await? {
            Ok(succeeded) => succeeded,
            Err(refusal) => return Ok(Some(refusal)),
        };
        if let Some(refusal) = self.refuse_unordered(plan) {
            return Ok(Some(refusal));
        }
        // Whether the cascading DELETE would fail: decided by simulating PostgreSQL's referential
        // triggers over the rows (engine::simulate). Only needed when a non-CASCADE key references
        // the closure; every blocker is one. find_blockers, a per-table count of referencing rows
        // outside the tenant, only names them in the message: its tenant test follows simple table
        // paths, so it can count a row the cascade reaches deeper in a tree (a false blocker).
        if simulate::needs_simulation(plan) {
            let verdict = self
                .keeping_lease(simulate::simulate(
                    &w.pools.target,
                    plan,
                    tenant,
                    &self.limits,
                    config.hard_delete.batch_timeout(),
                    config.hard_delete.max_simulated_rows,
                ))
                .await?;
            // A cascade that fails in one row order and not the other is refused even when the
            // trial (one order) succeeded.
            let order_dependent = matches!(verdict, Ok(Verdict::OrderDependent(_)));
            let why = match verdict {
                Ok(Verdict::Succeeds { .. }) => None,
                Ok(Verdict::Fails(f)) => Some(format!(
                    "the cascading DELETE of the tenant would fail on constraint {:?} of {} \
                     (referencing {}): {f}",
                    f.constraint, f.table, f.references
                )),
                Ok(Verdict::OrderDependent(f)) => Some(format!(
                    "whether the cascading DELETE of the tenant fails depends on the order PostgreSQL \
                     meets rows in; in one order it fails on constraint {:?} of {} (referencing {}): {f}",
                    f.constraint, f.table, f.references
                )),
                Err(SimError::Db(e)) => return Err(EngineError::Db(e).into()),
                Err(e) => Some(e.to_string()),
            };
            // PostgreSQL's own trial of the cascade, run in this very run on the data as it is
            // now, outranks the simulation, which compares keys by their text (`char(n)` padding,
            // `numeric` scale) — except where the presets need the simulation's rows. A trial of an
            // earlier run does not: rows may have been written since.
            if let Some(why) = why.as_ref()
                && tried
                && !order_dependent
                && !simulate::detaches(plan)
            {
                tracing::info!(job = %self.job.id, simulation = %why, "the simulation's refusal overruled: PostgreSQL's trial of the cascade succeeded");
                self.progress.note = Some(format!(
                    "the simulation said: {why}; PostgreSQL's trial of the cascade succeeded and decides"
                ));
            } else if let Some(why) = why {
                let listed = self
                    .keeping_lease(self.blockers_listed(plan, tenant))
                    .await??;
                return Ok(Some(format!(
                    "refused: {why}; {}{listed}",
                    self.done_so_far()
                )));
            }
        }
        if self.job.step == "hard_delete" || config.hard_delete.grace_period.is_zero() {
            // Written with the soft delete (or with the renewal before the first destructive
            // statement when the job is soft-deleted already).
            self.progress.prechecked_plan = Some(hash);
        }
        Ok(None)
    }

    /// Before the hard delete starts, the job's refusal when the plan has order-sensitive keys on
    /// foreign-key cycles that leaves-first batches cannot order ([`engine::cycles`]): such a
    /// tenant is deleted only by the whole cascade in one transaction
    /// ([`Self::whole_cascade`]), which did not run or did not fit.
    fn refuse_unordered(&self, plan: &engine::Plan) -> Option<String> {
        if plan.unordered.is_empty() || !self.before_hard_delete() {
            return None;
        }
        let keys: Vec<String> = plan
            .unordered
            .iter()
            .map(|&i| {
                let fk = &plan.catalog.foreign_keys[i];
                format!(
                    "{} of {} ({}, referencing {})",
                    fk.name,
                    plan.name(fk.from),
                    fk.on_delete.as_sql(),
                    plan.name(fk.to)
                )
            })
            .collect();
        let hd = &self.worker.config.hard_delete;
        let why = if hd.trial_cascade && hd.whole_cascade {
            format!(
                "its cascade did not finish within one transaction of {} ms ({})",
                engine::trial::budget(hd).as_millis(),
                self.progress.trial.as_deref().unwrap_or("not tried")
            )
        } else {
            "[hard_delete] trial_cascade and whole_cascade, which delete such a tenant in one \
             transaction, are not both on"
                .to_owned()
        };
        Some(format!(
            "refused: foreign keys on a cycle of the tenant's tables make the order of deletion \
             matter in a way batches cannot follow: {}; such a tenant is deleted only as one \
             cascade, and {why}; {}",
            keys.join(", "),
            self.done_so_far()
        ))
    }

    /// Whether no hard-delete statement has run for this job yet.
    pub(super) fn before_hard_delete(&self) -> bool {
        self.progress.hard_delete_started_at.is_none()
    }

    /// With `[hard_delete] user_triggers = "refuse"`, before the hard delete starts: the job's
    /// refusal when the tenant's tables have user `DELETE` triggers
    /// ([`engine::trial::delete_triggers`]).
    pub(super) async fn refuse_user_triggers(
        &self,
        plan: &engine::Plan,
    ) -> Result<Option<String>, Stop> {
        let found = self.user_triggers(plan).await?;
        Ok(self.trigger_refusal(&found))
    }

    /// The user `DELETE` triggers on the tenant's tables ([`engine::trial::delete_triggers`], one
    /// catalog read) when [`Self::refuse_user_triggers`] applies: with `[hard_delete]
    /// user_triggers = "refuse"`, before the hard delete starts and before a second try of the
    /// whole cascade. Empty otherwise, without a read.
    pub(super) async fn user_triggers(&self, plan: &engine::Plan) -> Result<Vec<String>, Stop> {
        let hd = &self.worker.config.hard_delete;
        if hd.user_triggers == crate::config::UserTriggers::Allow
            || !self.before_hard_delete()
            || self.whole_tries > 0
        {
            return Ok(Vec::new());
        }
        Ok(engine::trial::delete_triggers(
            &self.worker.pools.target,
            plan,
            hd.lock_timeout,
            hd.statement_timeout,
        )
        .await?)
    }

    /// The job's refusal for the user `DELETE` triggers `found` ([`Self::user_triggers`]); `None`
    /// when there are none.
    pub(super) fn trigger_refusal(&self, found: &[String]) -> Option<String> {
        if found.is_empty() {
            return None;
        }
        Some(format!(
            "refused: the tenant's tables have user triggers on DELETE ({}); deprov deletes leaves \
             first, not in the cascade's order, so a trigger that looks at other rows can act \
             differently (or fail part-way); set [hard_delete] user_triggers = \"allow\" if they \
             do not depend on that order; {}",
            found.join(", "),
            self.done_so_far()
        ))
    }

    /// Before any hard-delete statement of the job (before the soft delete, and again when the hard
    /// delete starts after a grace period), asks PostgreSQL whether the cascading DELETE succeeds
    /// on the data as it is: the trial cascade ([`engine::trial`]), bounded like a cascading batch
    /// (shortened when the statistics say the tenant cannot fit: [`Self::trial_budget`]) and always
    /// rolled back. `Ok(true)` when it succeeded in this run; `Err(refusal)` when the cascade fails
    /// or deletes nothing. Records the verdict in `progress.trial`.
    pub(super) async fn trial(
        &mut self,
        plan: &engine::Plan,
        tenant: &str,
    ) -> Result<Result<bool, String>, Stop> {
        let hd = &self.worker.config.hard_delete;
        if !hd.trial_cascade || !self.before_hard_delete() || self.whole_tries > 0 {
            return Ok(Ok(false));
        }
        let super::whole_try::TrialBudget {
            bounds,
            shortened,
            tenant_rows,
        } = self.trial_budget(plan, tenant).await?;
        self.tenant_rows = tenant_rows;
        let started = std::time::Instant::now();
        let verdict = engine::trial::trial_cascade(
            &self.worker.pools.target,
            plan,
            tenant,
            hd.lock_timeout,
            bounds,
        )
        .await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        self.progress.trial_ms += ms;
        self.progress.longest_rolled_back_ms = self.progress.longest_rolled_back_ms.max(ms);
        self.progress.trial = Some(super::whole_try::with_why(
            verdict.label(),
            shortened.as_deref(),
        ));
        let Some(why) = verdict.refusal() else {
            return Ok(Ok(verdict == engine::trial::Trial::Succeeds));
        };
        let listed = self.blockers_listed(plan, tenant).await?;
        Ok(Err(format!(
            "refused: {why} (PostgreSQL's answer to a trial of it, rolled back); {}{listed}",
            self.done_so_far()
        )))
    }

    /// `. Rows outside the tenant referencing it (…): N rows of T (C); …` for a refusal's message,
    /// from [`engine::find_blockers`]; empty when it finds none.
    pub(super) async fn blockers_listed(
        &self,
        plan: &engine::Plan,
        tenant: &str,
    ) -> Result<String, Stop> {
        let blockers =
            engine::find_blockers(&self.worker.pools.target, plan, tenant, &self.limits).await?;
        let all: Vec<String> = blockers
            .iter()
            .map(|b| {
                format!(
                    "{} {} of {} ({})",
                    b.rows,
                    engine::report::rows_word(b.rows),
                    b.table,
                    b.constraint
                )
            })
            .collect();
        Ok(if all.is_empty() {
            String::new()
        } else {
            format!(
                ". Rows outside the tenant referencing it (RESTRICT / NO ACTION, or SET NULL into \
                 a NOT NULL column): {}",
                all.join("; ")
            )
        })
    }
}
