//! A job whose tenant's whole cascade fits one batch's bound: deleted by one transaction
//! ([`engine::whole`]) instead of a trial, a soft delete and batches.
//!
//! It is tried before the pre-checks, and once more straight after for a small tenant whose first
//! try was undecided ([`JobRun::whole_again`]).

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{JobRun, Stop};
use crate::engine::trial::Trial;
use crate::engine::whole::Whole;
use crate::engine::{self};
use crate::queue::jobs::Outcome;

impl JobRun {
    /// Before the pre-checks: with `[hard_delete] trial_cascade` and `whole_cascade`, before any
    /// hard-delete statement, and with no grace period left to wait — runs the soft delete (when
    /// the job has not soft-deleted yet) and the tenant's cascade in one bounded transaction under
    /// the kill-switch gate, and commits when the cascade succeeds.
    ///
    /// `Ok(Some(Completed))` when it committed; `Ok(Some(Failed))` with the refusal when the
    /// cascade fails or deletes nothing (rolled back: nothing was deleted by it); `Ok(None)` when
    /// it did not run, found no tenant, or did not finish within its bound ([`Self::trial_budget`],
    /// shortened when the statistics say the tenant cannot fit) — the verdict is then
    /// in `progress.trial`, and the pre-checks do not run the trial again in this run.
    /// `progress.trial_ms` adds each try's transaction time.
    pub(super) async fn whole_cascade(
        &mut self,
        plan: &engine::Plan,
        tenant: &str,
    ) -> Result<Option<Outcome>, Stop> {
        if !self.whole_applies() {
            return Ok(None);
        }
        let w = self.worker.clone();
        let hd = &w.config.hard_delete;
        let soft_delete_first = matches!(self.job.step.as_str(), "soft_delete" | "resolve");
        // Two catalog reads, side by side on the target pool's connections: before the gate,
        // which a kill switch's acknowledgement waits for.
        let (budget, triggers) =
            tokio::try_join!(self.trial_budget(plan, tenant), self.user_triggers(plan))?;
        let TrialBudget {
            bounds,
            shortened,
            tenant_rows,
        } = budget;
        self.tenant_rows = tenant_rows;
        // Read before the triggers' refusal, so that a held or cancelled job is not failed by it.
        let gate = self.may_destroy().await?;
        if let Some(refusal) = self.trigger_refusal(&triggers) {
            return Ok(Some(Outcome::Failed(refusal)));
        }
        let statements: &[String] = if soft_delete_first {
            &w.config.soft_delete.statements
        } else {
            &[]
        };
        let started = std::time::Instant::now();
        // In microseconds, as PostgreSQL keeps it on the job (`jobs::finish`).
        let now = OffsetDateTime::now_utc();
        let begun = now
            .replace_nanosecond(now.nanosecond() / 1000 * 1000)
            .unwrap_or(now)
            .format(&Rfc3339)
            .ok();
        let whole = gate
            .during(engine::whole::whole_cascade(
                &w.pools.target,
                plan,
                statements,
                tenant,
                hd.lock_timeout,
                bounds,
            ))
            .await?;
        drop(gate);
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        self.progress.trial_ms += ms;
        self.whole_tries += 1;
        self.whole_reached = match &whole {
            // A shortened try says nothing of how close the whole bound would come.
            Whole::RolledBack { reached, .. } if shortened.is_none() => *reached,
            _ => None,
        };
        match whole {
            Whole::Committed {
                soft_deleted,
                deleted,
            } => {
                self.progress.trial = Some(Trial::Succeeds.label());
                self.progress.whole_cascade = true;
                self.progress.longest_batch_ms = self.progress.longest_batch_ms.max(ms);
                self.progress.batches += 1;
                if soft_delete_first {
                    self.progress.soft_deleted_rows = Some(soft_deleted);
                    self.progress.soft_deleted_at = begun.clone();
                }
                let rows: i64 = deleted.iter().map(|(_, n)| n).sum();
                crate::telemetry::batch_committed(started.elapsed(), rows);
                for (oid, rows) in deleted {
                    let name = plan.name(oid).to_string();
                    self.progress.record_cascaded(&name, rows);
                    self.progress.table_mut(&name).done = true;
                }
                // Stamped on the job by the hand-back that completes it (`jobs::finish`).
                self.progress.hard_delete_started_at = begun;
                Ok(Some(Outcome::Completed))
            }
            Whole::RolledBack { verdict, .. } => {
                self.progress.longest_rolled_back_ms = self.progress.longest_rolled_back_ms.max(ms);
                self.progress.trial = Some(with_why(verdict.label(), shortened.as_deref()));
                let Some(why) = verdict.refusal() else {
                    return Ok(None);
                };
                let listed = self.blockers_listed(plan, tenant).await?;
                Ok(Some(Outcome::Failed(format!(
                    "refused: {why} (PostgreSQL's answer, in a transaction rolled back); {}{listed}",
                    self.done_so_far()
                ))))
            }
        }
    }

    /// The bounds of the whole cascade's try, or of the trial: [`engine::trial::budget`], the
    /// cascading `DELETE`'s own an eighth of it (at least 5 ms, from the `DELETE`'s start) when
    /// the planner's statistics say the tenant has more rows than the whole bound could delete
    /// ([`engine::estimate`]) — then the full try would only run until its `statement_timeout`
    /// and roll back, while a short one still lets PostgreSQL meet a failure at the start of the
    /// cascade (a RESTRICT key on the root, a CHECK refusing a SET NULL). With the reason when
    /// shortened, and the estimate per table
    /// ([`engine::estimate::tenant_rows`]) for the hard delete's plan. Never shortened for a plan
    /// with [`engine::Plan::unordered`] keys, which only the whole cascade can delete.
    pub(super) async fn trial_budget(
        &self,
        plan: &engine::Plan,
        tenant: &str,
    ) -> Result<TrialBudget, Stop> {
        let budget = engine::trial::budget(&self.worker.config.hard_delete);
        if !plan.unordered.is_empty() {
            return Ok(TrialBudget {
                bounds: engine::trial::TrialBounds::whole(budget),
                shortened: None,
                tenant_rows: None,
            });
        }
        let per_table =
            engine::estimate::tenant_rows(&self.worker.pools.target, plan, tenant, &self.limits)
                .await?;
        let rows: i64 = per_table.values().map(|r| r.estimate).sum();
        let mut out = TrialBudget {
            bounds: engine::trial::TrialBounds::whole(budget),
            shortened: None,
            tenant_rows: Some(engine::estimate::at_most(&per_table)),
        };
        if (rows as f64) < budget.as_secs_f64() * 1000.0 * engine::estimate::MAX_CASCADE_ROWS_PER_MS
        {
            return Ok(out);
        }
        out.bounds.cascade = (budget / 8)
            .max(std::time::Duration::from_millis(5))
            .min(budget);
        out.shortened = Some(format!(
            "bounded to {} ms: the planner's statistics estimate {rows} rows of the tenant \
             in the tables referencing the root, more than {} ms can delete",
            out.bounds.cascade.as_millis(),
            budget.as_millis()
        ));
        Ok(out)
    }

    /// Whether [`Self::whole_cascade`] runs: with `[hard_delete] trial_cascade` and
    /// `whole_cascade`, before any hard-delete statement, and with no grace period left to wait.
    pub(super) fn whole_applies(&self) -> bool {
        let hd = &self.worker.config.hard_delete;
        let soft_delete_first = matches!(self.job.step.as_str(), "soft_delete" | "resolve");
        hd.trial_cascade
            && hd.whole_cascade
            && self.before_hard_delete()
            && if soft_delete_first {
                hd.grace_period.is_zero()
            } else {
                self.grace_remaining().is_none()
            }
    }

    /// Whether to try the whole cascade once more, straight after its first try and before the
    /// pre-checks: that one try in this run was undecided (it ran out of its bound, waited too
    /// long for a lock, or met a deadlock) having deleted at most `[hard_delete] cascade_rows`
    /// rows — no more than one batch may let PostgreSQL cascade to. Such a tenant is small, or
    /// slow to delete for a reason a second try may not meet again: the first try read its pages
    /// into shared buffers and prepared the referential triggers' queries on its connection
    /// (PostgreSQL caches them per session), and a lock may have been released. When the second
    /// try fits, it saves the pre-checks, the soft delete's own transaction and every batch (the
    /// cascade committed is PostgreSQL's own verdict); when it does not, it costs one more
    /// transaction within the same bounds, rolled back. A tenant whose first try got further
    /// goes on in batches.
    pub(super) fn whole_again(&self) -> bool {
        let cascade_rows = i64::from(self.worker.config.hard_delete.cascade_rows);
        self.whole_tries == 1 && self.whole_reached.is_some_and(|rows| rows <= cascade_rows)
    }
}

/// A trial's verdict `label`, with why its bound was shortened, if it was.
pub(super) fn with_why(label: String, shortened: Option<&str>) -> String {
    match shortened {
        Some(why) => format!("{label} ({why})"),
        None => label,
    }
}

/// The bound of a try of the whole cascade or of the trial ([`JobRun::trial_budget`]).
pub(super) struct TrialBudget {
    /// How long the try's transaction, and its cascading `DELETE` from its start, may run.
    pub bounds: engine::trial::TrialBounds,
    /// Why it is shorter than the trial's own budget, when it is.
    pub shortened: Option<String>,
    /// The most rows the tenant can hold per table straight under the root by the statistics
    /// ([`engine::estimate::DirectRows::at_most`]), when read.
    pub tenant_rows: Option<std::collections::BTreeMap<u32, i64>>,
}
