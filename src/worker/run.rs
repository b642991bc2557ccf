//! One job run: from a fresh lease to a hand-back [`Outcome`].

use std::time::Duration;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::progress::{Checkpoint, Progress};
use super::sizing::{self, Sizing};
use super::{Worker, backoff};
use crate::engine::simulate::{self, SimError, Verdict};
use crate::engine::{self, BatchLimits, Cursor, EngineError, Plan};

use super::pacing::Pacer;
use super::presence::Gate;
use crate::db::{self, Bounds};
use crate::queue::Job;
use crate::queue::intake::SubjectKind;
use crate::queue::jobs::{self, Outcome};
use crate::queue::kill_switch;
use crate::telemetry;

/// Statement or lock timeouts in a row a run absorbs by shrinking (and, for a lock, pausing) before
/// it hands the job back for a retry with backoff.
const MAX_LOCAL_TIMEOUTS: u32 = 4;

/// Why a run ended early.
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
}

impl JobRun {
    pub(super) fn new(worker: Worker, job: Job) -> Self {
        let limits = BatchLimits::from(&worker.config.hard_delete);
        let progress = Progress::from_json(&job.progress);
        let hd = &worker.config.hard_delete;
        let sizing = Sizing::new(hd.max_batch_duration, hd.max_batch_rows);
        Self {
            worker,
            job,
            limits,
            sizing,
            progress,
        }
    }

    /// Runs the job; `None` means the lease was lost and the job must not be touched.
    pub(super) async fn run(mut self) -> (Option<Outcome>, Progress) {
        let outcome = match self.execute().await {
            Ok(outcome) => Some(outcome),
            Err(Stop::Outcome(outcome)) => Some(outcome),
            Err(Stop::LeaseLost) => None,
            Err(Stop::Error(e)) => Some(self.classify(&e)),
        };
        (outcome, self.progress)
    }

    fn classify(&self, e: &EngineError) -> Outcome {
        let code = e
            .sqlstate()
            .map(|c| format!(" (SQLSTATE {c})"))
            .unwrap_or_default();
        let message = format!("{e}{code}");
        let attempts = u32::try_from(self.job.attempts).unwrap_or(1);
        if !e.is_retryable() {
            Outcome::Failed(message)
        } else if self.job.attempts >= self.job.max_attempts {
            Outcome::Failed(format!("{message}; attempts exhausted ({attempts})"))
        } else {
            let w = &self.worker.config.worker;
            Outcome::RetryAfter(message, backoff(attempts, w.backoff_base, w.backoff_max))
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
        let (version, blocked_by, cancel) = kill_switch::check_job(&mut *tx, self.job.id).await?;
        w.presence.record(&mut tx, &w.id, version).await?;
        tx.commit().await?;
        w.presence.note(version);
        if cancel {
            tracing::info!(job = %self.job.id, "cancelled by an operator: stopping");
            return Err(Stop::Outcome(Outcome::Cancelled));
        }
        if let Some(switch) = blocked_by {
            tracing::info!(job = %self.job.id, %switch, version, "kill switch engaged: holding the job");
            return Err(Stop::Outcome(Outcome::Held));
        }
        Ok(gate)
    }

    async fn heartbeat(&self, step: &str, checkpoint: Option<&Checkpoint>) -> Result<(), Stop> {
        let cp = checkpoint.map(Checkpoint::to_json);
        let w = &self.worker;
        let mut tx = db::begin(&w.pools.queue, Bounds::STATE).await?;
        let owned = jobs::heartbeat(
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
        if owned { Ok(()) } else { Err(Stop::LeaseLost) }
    }

    async fn execute(&mut self) -> Result<Outcome, Stop> {
        let w = self.worker.clone();
        let config = &w.config;
        self.may_destroy().await?;

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
        // One job per tenant however its key was written ("7", "07", " 7" are one bigint row):
        // before anything is destroyed, the job is keyed by the key as PostgreSQL prints it, or
        // merged into the active job that already has that key. Its kill switches are then checked
        // against that key (may_destroy before the soft delete).
        if self.job.step == "soft_delete" || self.job.step == "resolve" {
            let canonical =
                engine::canonical_tenant_key(&w.pools.target, &plan, &tenant, &self.limits).await?;
            if canonical != tenant {
                match jobs::resolve_tenant(&w.pools.queue, self.job.id, &w.id, &canonical).await? {
                    jobs::Resolved::Rekeyed => {
                        self.progress.note = Some(format!(
                            "tenant key {tenant:?} is {canonical:?} as the key column reads it"
                        ));
                        self.job.tenant_id = Some(canonical.clone());
                        tenant = canonical;
                    }
                    // Completed as merged into the job that deletes that tenant: hand nothing back.
                    jobs::Resolved::MergedInto(_) | jobs::Resolved::LeaseLost => {
                        return Err(Stop::LeaseLost);
                    }
                }
            }
        }
        // Whether the cascading DELETE would fail: decided by simulating PostgreSQL's referential
        // triggers over the rows (engine::simulate). Only needed when a non-CASCADE key references
        // the closure; every blocker is one. find_blockers, a per-table count of referencing rows
        // outside the tenant, only names them in the message: its tenant test follows simple table
        // paths, so it can count a row the cascade reaches deeper in a tree (a false blocker).
        if simulate::needs_simulation(&plan) {
            let verdict = simulate::simulate(
                &w.pools.target,
                &plan,
                &tenant,
                &self.limits,
                config.hard_delete.max_simulated_rows,
            )
            .await;
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
            if let Some(why) = why {
                let blockers =
                    engine::find_blockers(&w.pools.target, &plan, &tenant, &self.limits).await?;
                let all: Vec<String> = blockers
                    .iter()
                    .map(|b| format!("{} rows of {} ({})", b.rows, b.table, b.constraint))
                    .collect();
                let listed = if all.is_empty() {
                    String::new()
                } else {
                    format!(
                        ". Rows outside the tenant referencing it (RESTRICT / NO ACTION, or SET NULL into \
                         a NOT NULL column): {}",
                        all.join("; ")
                    )
                };
                return Ok(Outcome::Failed(format!(
                    "refused: {why}; {}{listed}",
                    self.done_so_far()
                )));
            }
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
            let gate = self.may_destroy().await?;
            let rows = engine::soft_delete(
                &w.pools.target,
                &config.soft_delete.statements,
                &tenant,
                &self.limits,
            )
            .await?;
            drop(gate);
            self.progress.soft_deleted_rows = Some(rows);
            self.progress.soft_deleted_at = OffsetDateTime::now_utc().format(&Rfc3339).ok();
            self.heartbeat("hard_delete", None).await?;
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

    /// What a refusal leaves behind: "nothing was deleted", or how far an earlier run got.
    fn done_so_far(&self) -> String {
        if self.progress.rows_deleted == 0 && self.progress.soft_deleted_at.is_none() {
            "nothing was deleted".to_owned()
        } else {
            format!(
                "deletion stopped here: {} rows were deleted before this run{}",
                self.progress.rows_deleted,
                if self.progress.soft_deleted_at.is_some() {
                    " and the tenant is soft-deleted"
                } else {
                    ""
                }
            )
        }
    }

    /// Resolves a Vercel installation, or a `lookup` subject (`{source}:{value}`, from a webhook
    /// source with `tenant_lookup`), to a tenant key; `None` = no such tenant (nothing to delete).
    async fn resolve(&mut self) -> Result<Option<String>, Stop> {
        let w = &self.worker;
        let (lookup, value) = if self.job.subject_kind == SubjectKind::Lookup.as_str() {
            let (source, value) = self.job.subject.split_once(':').unwrap_or(("", ""));
            let sql = w
                .config
                .sources
                .get(source)
                .and_then(|s| s.tenant_lookup.clone());
            if sql.is_none() {
                return Err(Stop::Error(EngineError::Statement(format!(
                    "sources.{source}.tenant_lookup is no longer configured; cannot resolve {value:?}"
                ))));
            }
            (sql, value.to_owned())
        } else {
            let sql = w
                .config
                .vercel
                .as_ref()
                .and_then(|v| v.tenant_lookup.clone());
            (sql, self.job.subject.clone())
        };
        let tenant = match lookup {
            Some(sql) => engine::lookup_tenant(&w.pools.target, &sql, &value, &self.limits).await?,
            None => Some(value),
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
                    "no tenant found for installation {:?}; nothing to delete",
                    self.job.subject
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

    async fn hard_delete(&mut self, leaves_first: &Plan, tenant: &str) -> Result<(), Stop> {
        let w = self.worker.clone();
        let hd = &w.config.hard_delete;
        let stored = Checkpoint::from_json(self.job.checkpoint.as_ref());
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
                .map_or(batch_rows, |s| plan.first_batch_rows(s.table, batch_rows)),
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
        let mut timeouts = 0;
        let hd = &w.config.hard_delete;
        let mut pacer = Pacer::new(
            &w.config.pacing,
            w.config.worker.lease,
            hd.max_batch_duration,
        );
        let mut large_parent = false;
        while cp.step < plan.steps.len() {
            let gate = self.may_destroy().await?;
            let step = &plan.steps[cp.step];
            let table = plan.name(step.table).to_string();
            let cascades = plan.absorbs_below(step.table);
            let limits = BatchLimits {
                rows: cp.rows,
                // A batch that lets PostgreSQL cascade is cut short early when a parent row has far
                // more descendants than estimated: then the plan falls back to leaves first.
                statement_timeout: if cascades {
                    self.limits.statement_timeout.min(
                        (hd.max_batch_duration * 4 / 5)
                            .max(hd.lock_timeout + Duration::from_millis(1)),
                    )
                } else {
                    self.limits.statement_timeout
                },
                ..self.limits
            };
            let started = std::time::Instant::now();
            let result = engine::run_batch(
                &w.pools.target,
                &plan,
                engine::BatchStart {
                    step: cp.step,
                    cursor: &cp.cursor,
                    parents: cp.parents,
                    large_parent,
                },
                tenant,
                &limits,
            )
            .await;
            if let Err(e) = &result {
                telemetry::batch_failed(e.sqlstate().as_deref());
            }
            let batch = match result {
                Ok(batch) => batch,
                Err(e) if e.sqlstate().as_deref() == Some("57014") && cascades && cp.rows <= 1 => {
                    // One parent row's cascade alone outlasts the budget: its subtree is larger
                    // than estimated. Re-plan with an eighth of the cascade allowance (at the end,
                    // leaves first: every row by its own batch) and start the steps over; what is
                    // deleted stays deleted.
                    self.note_rollback(started);
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
                    self.progress.plan_hash = Some(plan.hash());
                    continue;
                }
                Err(e)
                    if matches!(e.sqlstate().as_deref(), Some("57014" | "55P03"))
                        && timeouts < MAX_LOCAL_TIMEOUTS =>
                {
                    // The batch hit statement_timeout or lock_timeout and rolled back: retry
                    // smaller; after a lock timeout first give the lock holder a moment.
                    self.note_rollback(started);
                    drop(gate);
                    timeouts += 1;
                    cp.rows = self.sizing.after_timeout(cp.rows);
                    cp.parents = cp.parents.min(cp.rows);
                    if e.sqlstate().as_deref() == Some("55P03") {
                        let pause = backoff(
                            timeouts,
                            w.config.pacing.backoff,
                            w.config.pacing.backoff_max,
                        );
                        self.pause(pause, "lock_timeout: another session holds a lock".into())
                            .await?;
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            timeouts = 0;
            if large_parent
                && plan.range_step(step)
                && let Some(Cursor::AfterParent(parent)) = &batch.next
            {
                // A large parent's children are gone: mark their dead index entries before the
                // parent's own delete has to walk them (engine::range).
                let budget = (hd.max_batch_duration * 4 / 5).max(Duration::from_millis(1));
                match engine::kill_dead_entries(&w.pools.target, &plan, cp.step, parent, budget)
                    .await
                {
                    Ok(pass) => self.progress.record_index_pass(&pass),
                    Err(e) => tracing::warn!(job = %self.job.id, error = %e, "index pass failed"),
                }
            }
            // A parent that alone filled this batch is continued as a key range.
            large_parent = batch.parents_used == 1 && batch.selected >= cp.rows;
            let cascaded: i64 = batch.cascaded.iter().map(|(_, n)| n).sum();
            telemetry::batch_committed(batch.elapsed, batch.deleted + cascaded);
            self.progress
                .record_batch(&table, batch.deleted, batch.elapsed.as_secs_f64() * 1000.0);
            for &(oid, rows) in &batch.cascaded {
                self.progress
                    .record_cascaded(&plan.name(oid).to_string(), rows);
            }
            let rows = self
                .sizing
                .next_rows(cp.rows, batch.selected, batch.elapsed);
            cp.parents = sizing::next_parents(cp.parents, cp.rows, &batch, rows);
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
                        let started = std::time::Instant::now();
                        let swept = engine::run_sweep(
                            &w.pools.target,
                            &plan,
                            step.table,
                            tenant,
                            &self.limits,
                        )
                        .await;
                        if let Err(e) = &swept {
                            telemetry::batch_failed(e.sqlstate().as_deref());
                        }
                        let n = swept?;
                        let elapsed = started.elapsed();
                        // A sweep is one more short batch transaction of this table.
                        telemetry::batch_committed(elapsed, n);
                        self.progress.held_sweeps += 1;
                        self.progress
                            .record_batch(&table, n, elapsed.as_secs_f64() * 1000.0);
                        cp.step += 1;
                        self.progress.table_mut(&table).done = true;
                    }
                    cp.cursor = Cursor::Start;
                    cp.parents = 1;
                    cp.kept_back = 0;
                    cp.pass_deleted = 0;
                    cp.rows = plan.steps.get(cp.step).map_or(self.limits.rows, |s| {
                        plan.first_batch_rows(s.table, self.limits.rows)
                    });
                }
                None => {
                    if last_of_table {
                        cp.kept_back = 0;
                        cp.pass_deleted = 0;
                    }
                    cp.step += 1;
                    cp.cursor = Cursor::Start;
                    cp.parents = 1;
                    // Cost per row differs per table (a parent's delete checks every child table):
                    // each step starts small again and grows by measurement.
                    cp.rows = plan.steps.get(cp.step).map_or(self.limits.rows, |s| {
                        plan.first_batch_rows(s.table, self.limits.rows)
                    });
                    if !plan.steps[cp.step..].iter().any(|s| s.table == step.table) {
                        self.progress.table_mut(&table).done = true;
                    }
                }
            }
            drop(gate);
            self.heartbeat("hard_delete", Some(&cp)).await?;
            let waited = pacer.admit(batch.deleted + cascaded, &w.stop).await;
            self.progress.rate_limited_ms += waited.as_secs_f64() * 1000.0;
            if let Some((pause, reason)) = pacer.pause(&w.pools.target, batch.elapsed).await {
                self.pause(pause, reason).await?;
            }
        }
        Ok(())
    }

    /// Records a batch transaction that rolled back on a timeout after running since `started`.
    fn note_rollback(&mut self, started: std::time::Instant) {
        self.progress.timeouts += 1;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
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
