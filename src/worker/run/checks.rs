//! The checks of one job run before its first hard-delete statement that ask PostgreSQL rather
//! than the simulation: user `DELETE` triggers on the tenant's tables, and the trial cascade
//! ([`crate::engine::trial`]). Each returns the job's refusal, with the blockers listed.

use super::{JobRun, Stop};
use crate::engine;

impl JobRun {
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
        let hd = &self.worker.config.hard_delete;
        if hd.user_triggers == crate::config::UserTriggers::Allow || !self.before_hard_delete() {
            return Ok(None);
        }
        let found = engine::trial::delete_triggers(
            &self.worker.pools.target,
            plan,
            hd.lock_timeout,
            hd.statement_timeout,
        )
        .await?;
        if found.is_empty() {
            return Ok(None);
        }
        Ok(Some(format!(
            "refused: the tenant's tables have user triggers on DELETE ({}); deprov deletes leaves \
             first, not in the cascade's order, so a trigger that looks at other rows can act \
             differently (or fail part-way); set [hard_delete] user_triggers = \"allow\" if they \
             do not depend on that order; {}",
            found.join(", "),
            self.done_so_far()
        )))
    }

    /// Before any hard-delete statement of the job (before the soft delete, and again when the hard
    /// delete starts after a grace period), asks PostgreSQL whether the cascading DELETE succeeds
    /// on the data as it is: the trial cascade ([`engine::trial`]), bounded like a cascading batch
    /// and always rolled back. `Ok(true)` when it succeeded in this run; `Err(refusal)` when the
    /// cascade fails or deletes nothing. Records the verdict in `progress.trial`.
    pub(super) async fn trial(
        &mut self,
        plan: &engine::Plan,
        tenant: &str,
    ) -> Result<Result<bool, String>, Stop> {
        let hd = &self.worker.config.hard_delete;
        if !hd.trial_cascade || !self.before_hard_delete() {
            return Ok(Ok(false));
        }
        let started = std::time::Instant::now();
        let verdict = engine::trial::trial_cascade(
            &self.worker.pools.target,
            plan,
            tenant,
            hd.lock_timeout,
            engine::trial::budget(hd),
        )
        .await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        self.progress.trial_ms = ms;
        self.progress.longest_rolled_back_ms = self.progress.longest_rolled_back_ms.max(ms);
        self.progress.trial = Some(verdict.label());
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
            .map(|b| format!("{} rows of {} ({})", b.rows, b.table, b.constraint))
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
