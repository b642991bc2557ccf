//! One job run: from a fresh lease to a hand-back [`Outcome`].

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::progress::{Checkpoint, Progress};
use super::sizing::Sizing;
use super::{Worker, backoff};
use crate::engine::{self, BatchLimits, EngineError};
use crate::ids::KeyForm;

use super::presence::Gate;
use crate::db::{self, Bounds};
use crate::queue::Job;
use crate::queue::intake::SubjectKind;
use crate::queue::jobs::{self, Outcome};
use crate::queue::kill_switch;

mod ahead;
mod hard_delete;
mod pre_checks;
mod whole_try;

/// Statement or lock timeouts in a row a run absorbs by shrinking (and, for a lock, pausing) before
/// it hands the job back for a retry with backoff.
const MAX_LOCAL_TIMEOUTS: u32 = 4;

/// Why a run ended early.
#[derive(Debug)]
enum Stop {
    /// Hand the job back with this outcome.
    Outcome(Outcome),
    /// Another worker holds the lease now: touch nothing.
    LeaseLost,
    /// An error to classify (retry or fail).
    Error(EngineError),
}

impl From<EngineError> for Stop {
    fn from(e: EngineError) -> Self {
        Self::Error(e)
    }
}

impl From<sqlx::Error> for Stop {
    fn from(e: sqlx::Error) -> Self {
        Self::Error(EngineError::Db(e))
    }
}

pub(super) struct JobRun {
    worker: Worker,
    job: Job,
    limits: BatchLimits,
    sizing: Sizing,
    progress: Progress,
    /// How the key column reads tenant keys, once the plan is loaded.
    key_form: Option<KeyForm>,
    /// When the run began (the job's claim): the duty cycle's first rest answers for the work
    /// since. Taken by the first pacer of the run (a resume after a target restart starts anew).
    started: Option<tokio::time::Instant>,
    /// The job's `stalled_attempts` as the last heartbeat left it (0 once this run advanced the
    /// job; the claim's count until then): what [`Self::classify`] holds against `max_attempts`.
    stalled: AtomicI32,
    /// The whole cascade's tries in this run ([`Self::whole_cascade`]): at most two, the second
    /// straight after the first ([`Self::whole_again`]). Any try's verdict stands for the trial's.
    whole_tries: u8,
    /// When the last try of the whole cascade rolled back undecided (it ran out of its bound,
    /// waited too long for a lock, or met a deadlock): the rows it had deleted when it was stopped
    /// (`engine::whole::Whole::RolledBack`'s `reached`).
    whole_reached: Option<i64>,
    /// The most rows the tenant holds per table straight under the root, as the whole cascade's
    /// try read them ([`engine::estimate::DirectRows::at_most`]), kept for the hard delete's plan.
    tenant_rows: Option<std::collections::BTreeMap<u32, i64>>,
}

impl JobRun {
    pub(super) fn new(worker: Worker, job: Job) -> Self {
        let limits = BatchLimits::from(&worker.config.hard_delete);
        let progress = Progress::from_json(&job.progress);
        let hd = &worker.config.hard_delete;
        let sizing = Sizing::new(hd.max_batch_duration, hd.max_batch_rows);
        let stalled = AtomicI32::new(job.stalled_attempts);
        Self {
            worker,
            job,
            limits,
            sizing,
            progress,
            key_form: None,
            started: Some(tokio::time::Instant::now()),
            stalled,
            whole_tries: 0,
            whole_reached: None,
            tenant_rows: None,
        }
    }

    /// Runs the job; `None` means the lease was lost and the job must not be touched.
    pub(super) async fn run(mut self) -> (Option<Outcome>, Progress) {
        let outcome = match self.execute().await {
            Ok(outcome) => Some(outcome),
            Err(Stop::Outcome(outcome)) => Some(outcome),
            Err(Stop::LeaseLost) => None,
            Err(Stop::Error(e)) => {
                if let Some(db) = e.db()
                    && db::connection_lost(db)
                {
                    // The pooler or a server restarted: the other idle connections are gone too.
                    // Closed now, the retry opens fresh ones instead of failing once per dead one.
                    let pools = &self.worker.pools;
                    let closed = db::discard_idle(&pools.target) + db::discard_idle(&pools.queue);
                    tracing::warn!(job = %self.job.id, closed, "a database connection was lost: closed the idle ones too");
                }
                Some(self.classify(&e))
            }
        };
        (outcome, self.progress)
    }

    /// The outcome of a run that stopped on `e`. The message is the server's (message, detail, hint,
    /// SQLSTATE: [`crate::db::errors::error_text`]) and, when batches had deleted rows, how many.
    /// A retryable error fails the job only when this run advanced nothing and the runs before it
    /// since the job last advanced make `max_attempts` (`stalled_attempts`, [`jobs::heartbeat`]);
    /// a run that advanced the job is retried however many claims it had in all.
    fn classify(&self, e: &EngineError) -> Outcome {
        // Only a database error carries a SQLSTATE; a configured statement's names its setting.
        let text = engine::text(e);
        let deleted = self.progress.rows_deleted;
        let message = if deleted > 0 {
            format!(
                "{text}; {deleted} {} of the tenant were already deleted",
                engine::report::rows_word(deleted)
            )
        } else {
            text
        };
        let stalled = self.stalled.load(Ordering::Relaxed);
        if !e.is_retryable() {
            Outcome::Failed(message)
        } else if stalled >= self.job.max_attempts {
            Outcome::Failed(format!(
                "{message}; attempts exhausted ({stalled} in a row advanced nothing, {} in all)",
                self.job.attempts
            ))
        } else {
            let w = &self.worker.config.worker;
            let n = u32::try_from(stalled).unwrap_or(1).max(1);
            Outcome::RetryAfter(message, backoff(n, w.backoff_base, w.backoff_max))
        }
    }

    /// Stops before a destructive statement when an operator cancelled the job, a kill switch blocks
    /// it (global, its tenant, a source of its requests) or the worker is stopping. Otherwise returns the gate: hold it until
    /// the destructive statement has ended (see [`super::presence`]). Records the switch version read.
    async fn may_destroy(&self) -> Result<Gate, Stop> {
        if self.worker.stop.is_cancelled() {
            return Err(Stop::Outcome(Outcome::Wait(Duration::ZERO)));
        }
        let w = &self.worker;
        let gate = w.presence.enter().await;
        let mut tx = db::begin(&w.pools.queue, Bounds::STATE).await?;
        let check = kill_switch::check_job(&mut *tx, self.job.id).await?;
        let version = check.version;
        let recorded = w.presence.record(&mut tx, &w.id, version).await?;
        tx.commit().await?;
        w.presence.note(recorded);
        let blocked_by = self.blocked_by(&check);
        if check.cancel {
            tracing::info!(job = %self.job.id, "cancelled by an operator: stopping");
            return Err(Stop::Outcome(Outcome::Cancelled));
        }
        if let Some(switch) = blocked_by {
            tracing::info!(job = %self.job.id, %switch, version, "kill switch engaged: holding the job");
            return Err(Stop::Outcome(Outcome::Held));
        }
        Ok(gate)
    }

    /// The engaged switch that blocks the job in `check`: one the state database matched as stored
    /// (`global`, `source:…`, `tenant:…`), else a tenant switch matched in the key column's form
    /// ([`Self::tenant_switch`]).
    fn blocked_by(&self, check: &kill_switch::JobCheck) -> Option<String> {
        check
            .blocked_by
            .clone()
            .or_else(|| self.tenant_switch(&check.tenant_keys))
    }

    /// The engaged tenant switch among `keys` whose key is the job's tenant in the key column's
    /// form ([`KeyForm`]): a switch engaged as `"07001"` (written as typed by `deprov kill-switch`
    /// when it could not read the key column's type) holds tenant `"7001"` of an integer key
    /// column. `None` before the plan is loaded.
    fn tenant_switch(&self, keys: &[String]) -> Option<String> {
        let (form, tenant) = (self.key_form?, self.job.tenant_id.as_deref()?);
        keys.iter()
            .find(|k| form.canonical_or_as_sent(k) == tenant)
            .map(|k| format!("tenant:{k}"))
    }

    /// Awaits `work` (a read-only check before the soft delete: the simulation, the blocker
    /// counts), renewing the lease every third of `[worker] lease` meanwhile, so a check that takes
    /// longer than the lease on a large tenant never lets another worker take over a live run.
    ///
    /// # Errors
    /// [`Stop::LeaseLost`] when a renewal found the lease taken, or the state database's error of a
    /// renewal; either only once `work` has finished.
    async fn keeping_lease<T>(
        &self,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, Stop> {
        let step = self.job.step.clone();
        let stored = Checkpoint::from_json(self.job.checkpoint.as_ref());
        tokio::pin!(work);
        // A failed renewal does not drop `work`: that would abandon its statement mid-flight on its
        // connection (crate::db). The check finishes, bounded by its own timeouts, and then the run
        // stops.
        let mut failed = None;
        loop {
            tokio::select! {
                out = &mut work => return failed.map_or(Ok(out), Err),
                () = tokio::time::sleep(self.worker.config.worker.lease / 3), if failed.is_none() => {
                    if let Err(stop) = self.heartbeat(&step, stored.as_ref()).await {
                        failed = Some(stop);
                    }
                }
            }
        }
    }

    async fn heartbeat(&self, step: &str, checkpoint: Option<&Checkpoint>) -> Result<(), Stop> {
        let cp = checkpoint.map(Checkpoint::to_json);
        let w = &self.worker;
        let mut tx = db::begin(&w.pools.queue, Bounds::STATE).await?;
        let stalled = jobs::heartbeat(
            &mut *tx,
            self.job.id,
            &w.id,
            w.config.worker.lease,
            step,
            cp.as_ref(),
            &self.progress.to_json(),
        )
        .await?;
        tx.commit().await?;
        let stalled = stalled.ok_or(Stop::LeaseLost)?;
        self.stalled.store(stalled, Ordering::Relaxed);
        Ok(())
    }

    async fn execute(&mut self) -> Result<Outcome, Stop> {
        let w = self.worker.clone();
        let config = &w.config;
        // A first claim was of a job no kill switch blocked as stored and none could have asked
        // to cancel (the claim's own test; a queued job is cancelled at once): when the whole
        // cascade may delete it, its gate reads the switches before anything is destroyed.
        if !(self.whole_applies() && self.job.attempts <= 1) {
            self.may_destroy().await?;
        }
        // A rest the last run was stopped in (progress.resting_until): the job waits it out queued,
        // before any statement on the target and without keeping this worker.
        if let Some(owed) = self.owed_rest() {
            tracing::info!(job = %self.job.id, rest_ms = owed.as_millis(), "pacing: the job owes the rest its last run was stopped in; handed back until it ends");
            return Ok(Outcome::Wait(owed));
        }
        self.progress.resting_until = None;

        let mut tenant = match &self.job.tenant_id {
            Some(t) => t.clone(),
            None => match self.resolve().await? {
                Some(t) => t,
                None => return Ok(Outcome::Completed),
            },
        };

        let plan = engine::load_plan(
            &w.pools.target,
            &config.root_table(),
            &config.tenant.key_column,
        )
        .await?;
        self.key_form = Some(KeyForm::of(plan.key_type.as_str()));
        // Unknown on a later run (step `hard_delete`): its walk goes on from the checkpoint.
        let mut present = true;
        if self.job.step == "soft_delete" || self.job.step == "resolve" {
            (tenant, present) = self.rekey(&plan, tenant).await?;
        }
        // Keyed now by the tenant as the key column reads it: a tenant switch on that key holds
        // the job before the pre-check, which would otherwise fail it for a held tenant. The
        // whole cascade reads the switches itself, before its own check.
        if !present || !self.whole_applies() {
            drop(self.may_destroy().await?);
        }
        if !present {
            // The cascading DELETE of a missing root row deletes nothing, so neither does the job:
            // no soft delete, no pre-check, no batch (each would scan the tenant's tables for
            // nothing, whole tables where a foreign key has no index).
            self.progress.note = Some(format!(
                "no row of {} has key {tenant:?}; nothing to delete",
                plan.name(plan.root)
            ));
            return Ok(Outcome::Completed);
        }
        if let Some(outcome) = self.whole_cascade(&plan, &tenant).await? {
            return Ok(outcome);
        }
        if self.whole_again()
            && let Some(outcome) = self.whole_cascade(&plan, &tenant).await?
        {
            return Ok(outcome);
        }
        if let Some(refusal) = self.pre_checks(&plan, &tenant).await? {
            return Ok(Outcome::Failed(refusal));
        }

        // The checks above may have taken a while: renew the lease (or learn it was lost) before
        // the first destructive statement.
        let step = self.job.step.clone();
        self.heartbeat(
            &step,
            Checkpoint::from_json(self.job.checkpoint.as_ref()).as_ref(),
        )
        .await?;

        if self.job.step == "soft_delete" || self.job.step == "resolve" {
            self.soft_delete(&tenant).await?;
        }

        if let Some((wait, until)) = self.grace_remaining() {
            // Visible as such: `progress.grace_until`; until then an operator can cancel the job
            // or undo its soft delete (queue::grace).
            self.progress.grace_until = until.format(&Rfc3339).ok();
            self.progress.note = Some(format!(
                "soft-deleted; waiting in the grace period until {}: cancel or undo before then",
                self.progress.grace_until.as_deref().unwrap_or("?")
            ));
            return Ok(Outcome::Wait(wait));
        }
        self.start_hard_delete().await?;
        self.hard_delete(&plan, &tenant).await?;
        self.progress.note = None;
        // Tables PostgreSQL's cascade emptied under other tables' batches have no steps to mark them.
        for t in &mut self.progress.tables {
            t.done = true;
        }
        Ok(Outcome::Completed)
    }

    /// One job per tenant however its key was written ("7", "07", " 7" are one bigint row): before
    /// anything is destroyed, the job is keyed by `tenant` as PostgreSQL prints it in the key
    /// column, or merged into the active job that already has that key. Its kill switches are then
    /// checked against that key (the caller's `may_destroy` before the soft delete). Returns the
    /// key the job now has, and whether a root row has it.
    ///
    /// # Errors
    /// [`Stop::LeaseLost`] when the job was merged into another (it is completed as such: hand
    /// nothing back) or lost its lease; database errors.
    async fn rekey(&mut self, plan: &engine::Plan, tenant: String) -> Result<(String, bool), Stop> {
        let w = self.worker.clone();
        let engine::TenantKey {
            key: canonical,
            present,
        } = engine::canonical_tenant_key(&w.pools.target, plan, &tenant, &self.limits).await?;
        if canonical == tenant {
            return Ok((tenant, present));
        }
        match jobs::resolve_tenant(&w.pools.queue, self.job.id, &w.id, &canonical).await? {
            jobs::Resolved::Rekeyed => {
                self.progress.note = Some(format!(
                    "tenant key {tenant:?} is {canonical:?} as the key column reads it"
                ));
                self.job.tenant_id = Some(canonical.clone());
                Ok((canonical, present))
            }
            jobs::Resolved::MergedInto(_) | jobs::Resolved::LeaseLost => Err(Stop::LeaseLost),
        }
    }

    /// Runs `[soft_delete] statements` for `tenant` under the kill-switch gate, records it in the
    /// progress, and moves the job to its `hard_delete` step (the heartbeat).
    ///
    /// # Errors
    /// [`Stop`] when a kill switch holds the job, the statements fail, or the lease is lost.
    async fn soft_delete(&mut self, tenant: &str) -> Result<(), Stop> {
        let w = self.worker.clone();
        let gate = self.may_destroy().await?;
        let started = std::time::Instant::now();
        let rows = gate
            .during(engine::soft_delete(
                &w.pools.target,
                &w.config.soft_delete.statements,
                tenant,
                &self.limits,
            ))
            .await?;
        drop(gate);
        self.progress.soft_delete_ms = started.elapsed().as_secs_f64() * 1e3;
        self.progress.soft_deleted_rows = Some(rows);
        self.progress.soft_deleted_at = OffsetDateTime::now_utc().format(&Rfc3339).ok();
        self.heartbeat("hard_delete", None).await?;
        Ok(())
    }

    /// What a refusal leaves behind: "nothing was deleted", or how far an earlier run got.
    fn done_so_far(&self) -> String {
        if self.progress.rows_deleted == 0 && self.progress.soft_deleted_at.is_none() {
            "nothing was deleted".to_owned()
        } else {
            format!(
                "deletion stopped here: {} {} deleted before this run{}",
                self.progress.rows_deleted,
                if self.progress.rows_deleted == 1 {
                    "row was"
                } else {
                    "rows were"
                },
                if self.progress.soft_deleted_at.is_some() {
                    " and the tenant is soft-deleted"
                } else {
                    ""
                }
            )
        }
    }

    /// Resolves a Vercel installation, or a `lookup` subject (`{source}:{value}`, from a webhook
    /// source with `tenant_lookup`, or an Open Service Broker instance with `[osb] tenant_lookup`),
    /// to a tenant key; `None` = no such tenant (nothing to delete).
    /// An earlier request for the same subject whose deletion has not completed decides before the
    /// target's lookup does ([`jobs::unfinished_tenant_of_subject`]): this job then merges into
    /// that tenant's active job, or deletes the tenant again after a failed or cancelled one.
    async fn resolve(&mut self) -> Result<Option<String>, Stop> {
        let w = &self.worker;
        // The statement, the setting that holds it, the value it looks up, and what that value is.
        let (lookup, setting, value, what) =
            if self.job.subject_kind == SubjectKind::Lookup.as_str() {
                let (source, value) = self.job.subject.split_once(':').unwrap_or(("", ""));
                // The Open Service Broker's source: its instances are looked up by `[osb]
                // tenant_lookup` (the source itself has none, checked at load).
                let osb = w.config.osb.as_ref().filter(|o| o.source == source);
                let (setting, sql) = match osb {
                    Some(o) => ("osb.tenant_lookup".to_owned(), o.tenant_lookup.clone()),
                    None => (
                        format!("sources.{source}.tenant_lookup"),
                        w.config
                            .sources
                            .get(source)
                            .and_then(|s| s.tenant_lookup.clone()),
                    ),
                };
                if sql.is_none() {
                    return Err(Stop::Error(EngineError::Statement(format!(
                        "{setting} is no longer configured; cannot resolve {value:?}"
                    ))));
                }
                let what = format!("{value:?} sent by source {source}");
                (sql, setting, value.to_owned(), what)
            } else {
                let sql = w
                    .config
                    .vercel
                    .as_ref()
                    .and_then(|v| v.tenant_lookup.clone());
                let what = format!("Vercel installation {:?}", self.job.subject);
                (
                    sql,
                    "vercel.tenant_lookup".to_owned(),
                    self.job.subject.clone(),
                    what,
                )
            };
        let recorded = jobs::unfinished_tenant_of_subject(
            &w.pools.queue,
            &self.job.subject_kind,
            &self.job.subject,
            self.job.id,
        )
        .await?;
        let tenant = match (recorded, lookup) {
            // deprov's own record first: the rows the lookup reads may be deleted by now.
            (Some(t), _) => {
                self.progress.note = Some(format!(
                    "{what} was resolved to tenant {t:?} by an earlier request whose deletion has \
                     not completed: this request follows that tenant's job"
                ));
                Some(t)
            }
            (None, Some(sql)) => engine::lookup_tenant(&w.pools.target, &sql, &value, &self.limits)
                .await
                .map_err(|e| e.in_setting(&setting))?,
            (None, None) => Some(value),
        };
        match &tenant {
            Some(t) => match jobs::resolve_tenant(&w.pools.queue, self.job.id, &w.id, t).await? {
                jobs::Resolved::Rekeyed => self.job.tenant_id = Some(t.clone()),
                // Completed as merged: hand nothing back.
                jobs::Resolved::MergedInto(_) | jobs::Resolved::LeaseLost => {
                    return Err(Stop::LeaseLost);
                }
            },
            None => {
                self.progress.note = Some(format!(
                    "no tenant found for {what} ({setting} returned no tenant key); nothing to delete"
                ))
            }
        }
        Ok(tenant)
    }

    /// Stamps the job's `hard_delete_started_at` before its first hard-delete statement (from then
    /// on its soft delete cannot be undone), unless an operator cancelled it meanwhile.
    async fn start_hard_delete(&mut self) -> Result<(), Stop> {
        let w = &self.worker;
        let mut tx = db::begin(&w.pools.queue, Bounds::STATE).await?;
        let started =
            crate::queue::grace::mark_hard_delete_started(&mut *tx, self.job.id, &w.id).await?;
        tx.commit().await?;
        match started {
            Some(at) => {
                self.progress.hard_delete_started_at = at.format(&Rfc3339).ok();
                self.progress.note = None;
                Ok(())
            }
            // Cancelled (may_destroy says so) or the lease is lost.
            None => {
                self.may_destroy().await?;
                Err(Stop::LeaseLost)
            }
        }
    }

    /// The rest of the grace period and its end, while the job is in one.
    fn grace_remaining(&self) -> Option<(Duration, OffsetDateTime)> {
        let grace = self.worker.config.hard_delete.grace_period;
        if grace.is_zero() {
            return None;
        }
        let soft = self
            .progress
            .soft_deleted_at
            .as_deref()
            .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())?;
        let due = soft + grace;
        let now = OffsetDateTime::now_utc();
        (due > now).then(|| (Duration::try_from(due - now).unwrap_or_default(), due))
    }
}
