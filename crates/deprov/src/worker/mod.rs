//! The worker: leases jobs and runs them — resolve the tenant (Vercel installations), check for
//! blockers, soft delete, wait out the grace period, hard delete in checkpointed batches — and always
//! hands the job back as `completed`, `failed`, `held` or `queued` (retry with backoff).
//!
//! Every destructive statement starts on a fresh reading of the kill switches (global, its job's
//! source and tenant), taken at most one batch bound before it; engaged, it records its checkpoint and hands the job back `held`. It records the
//! switch version it acts on, and learns of changes at once while idle ([`presence`]). After every batch it heartbeats: the lease is extended and
//! the checkpoint and progress are saved in one guarded `UPDATE` (see [`crate::queue::jobs`]). Queue
//! statements run in transactions bounded by [`crate::db::Bounds::STATE`], the engine's by
//! `[hard_delete]`; the worker awaits every statement to its end (a stop takes effect between them).
//! A worker
//! that has lost its lease stops without touching the job. A panic in a job is caught and ends the job
//! `failed`: no job is ever left `running` by a live worker; a dead worker's lease expires.

pub mod pacing;
pub mod presence;
mod progress;
mod run;
pub mod sizing;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::Config;
use crate::db::{self, Bounds, Pools};
use crate::queue::jobs::{self, Outcome};

pub use progress::{Checkpoint, Progress, TableProgress};

/// What one [`Worker::step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// No claimable job.
    Idle,
    /// Ran one job to a hand-back (completed, failed, held, or re-queued for retry).
    Ran {
        /// The job.
        job_id: Uuid,
        /// Its state after the hand-back (`lost` when another worker took the lease meanwhile).
        state: String,
    },
}

/// A worker bound to the service's pools and configuration.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Pools (queue and target are used).
    pub pools: Pools,
    /// The validated configuration.
    pub config: Arc<Config>,
    /// This worker's lease owner name.
    pub id: String,
    /// Fired to stop at the next batch boundary (SIGTERM): the job is handed back `queued`.
    pub stop: CancellationToken,
    /// Heartbeat and kill switch acknowledgement, shared by clones ([`presence`]).
    pub presence: presence::Presence,
    /// Where [`Self::run`] `LISTEN`s for kill switch changes (`None`: heartbeats only).
    pub notify_url: Option<String>,
    /// The check of the configured SQL ([`crate::sqlcheck`]): [`Self::run`] claims no job before it
    /// passed. [`Self::new`] makes one that passed.
    pub sql_check: crate::sqlcheck::Gate,
}

/// Worker failures that are not a job's own error (the state database is unreachable).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// State database error.
    #[error("state database: {0}")]
    Db(#[from] sqlx::Error),
}

/// Retry delay for attempt `n` (1-based): full jitter over `base * 2^(n-1)`, capped at `max`
/// ("Exponential Backoff And Jitter", AWS Architecture Blog, 2015).
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exp = base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
        .min(max);
    let ms = u64::try_from(exp.as_millis()).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(rand::random_range(ms / 2..=ms))
}

impl Worker {
    /// A worker named `id` (use something unique per process, e.g. `hostname-pid`).
    pub fn new(pools: Pools, config: Arc<Config>, id: String) -> Self {
        Self {
            pools,
            config,
            id,
            stop: CancellationToken::new(),
            presence: presence::Presence::default(),
            notify_url: None,
            sql_check: crate::sqlcheck::Gate::default(),
        }
    }

    /// The same worker, claiming jobs only once `gate` has passed (see [`Self::sql_check`]).
    pub fn with_sql_check(mut self, gate: crate::sqlcheck::Gate) -> Self {
        self.sql_check = gate;
        self
    }

    /// The same worker, listening for kill switch changes on `url` (a direct or session-mode URL of
    /// the state database; `None`: learn of changes by heartbeats only).
    pub fn with_notify_url(mut self, url: Option<String>) -> Self {
        self.notify_url = url;
        self
    }

    /// Hands back the jobs a kill switch blocks whose worker is gone ([`jobs::hand_back_stranded`]),
    /// then claims at most one job and runs it until it is handed back. Tests drive this directly.
    ///
    /// # Errors
    /// [`WorkerError`] when the state database cannot be reached.
    pub async fn step(&self) -> Result<StepOutcome, WorkerError> {
        let mut tx = db::begin(&self.pools.queue, Bounds::STATE).await?;
        let stranded = jobs::hand_back_stranded(&mut *tx).await?;
        if stranded > 0 {
            tracing::info!(
                jobs = stranded,
                "jobs whose worker stopped while a kill switch blocks them handed back"
            );
        }
        let claimed = jobs::claim(&mut *tx, &self.id, self.config.worker.lease).await?;
        tx.commit().await?;
        let Some(job) = claimed else {
            return Ok(StepOutcome::Idle);
        };
        let job_id = job.id;
        let mut progress = Progress::from_json(&job.progress);
        if job.stalled_attempts > job.max_attempts {
            // The runs since the job last advanced make max_attempts already, the last of them
            // ended without reporting back (its worker was lost): no further run.
            let error = format!(
                "attempts exhausted ({} in a row advanced nothing, of {} allowed; {} in all); last error: {}",
                job.stalled_attempts - 1,
                job.max_attempts,
                job.attempts - 1,
                job.last_error
                    .as_deref()
                    .unwrap_or("none (the worker holding the lease stopped)")
            );
            return self
                .hand_back(job_id, Outcome::Failed(error), &progress)
                .await;
        }
        let runner = run::JobRun::new(self.clone(), job);
        let handle = tokio::spawn(runner.run());
        let outcome = match handle.await {
            Ok((outcome, p)) => {
                progress = p;
                outcome
            }
            Err(join) => Some(Outcome::Failed(format!(
                "internal error: job task ended abnormally: {join}"
            ))),
        };
        match outcome {
            Some(outcome) => self.hand_back(job_id, outcome, &progress).await,
            None => Ok(StepOutcome::Ran {
                job_id,
                state: "lost".into(),
            }),
        }
    }

    async fn hand_back(
        &self,
        job_id: Uuid,
        outcome: Outcome,
        progress: &Progress,
    ) -> Result<StepOutcome, WorkerError> {
        if let Outcome::Failed(e) | Outcome::RetryAfter(e, _) = &outcome {
            tracing::warn!(%job_id, error = %e, "job handed back with an error");
        }
        let mut tx = db::begin(&self.pools.queue, Bounds::STATE).await?;
        let owned = jobs::finish(&mut *tx, job_id, &self.id, &outcome, &progress.to_json()).await?;
        tx.commit().await?;
        let state = if !owned {
            "lost"
        } else {
            match outcome {
                Outcome::Completed => "completed",
                Outcome::Failed(_) => "failed",
                Outcome::RetryAfter(..) | Outcome::Wait(_) => "queued",
                Outcome::Held => "held",
                Outcome::Cancelled => "cancelled",
            }
        };
        Ok(StepOutcome::Ran {
            job_id,
            state: state.into(),
        })
    }

    /// Runs [`Self::step`] until `cancel` fires, polling every `worker.poll_interval` when idle and
    /// backing off when the state database is unreachable; it claims the first job only once
    /// [`Self::sql_check`] has passed. `cancel` also stops a running job at its
    /// next batch boundary. Meanwhile the worker is live in `deprov.workers` and acknowledges kill
    /// switch changes ([`presence`]) and, with `[notifications]`, delivers finished jobs' events
    /// ([`crate::notify`]); at the end it is marked stopped.
    pub async fn run(&self, cancel: CancellationToken) {
        let presence_stop = CancellationToken::new();
        let mut tasks = self.presence.spawn(
            self.pools.queue.clone(),
            self.id.clone(),
            self.config.worker.clone(),
            self.notify_url.clone(),
            presence_stop.clone(),
        );
        if let Some(n) = &self.config.notifications {
            match crate::notify::Dispatcher::new(self.pools.queue.clone(), n.clone(), &self.id) {
                Ok(d) => {
                    tasks.spawn(d.run(presence_stop.clone()));
                }
                Err(e) => tracing::error!(error = %e, "notifications will not be sent"),
            }
        }
        self.run_jobs(cancel).await;
        presence_stop.cancel();
        while tasks.join_next().await.is_some() {}
        presence::Presence::stopped(&self.pools.queue, &self.id).await;
    }

    async fn run_jobs(&self, cancel: CancellationToken) {
        if self.sql_check.status() != crate::sqlcheck::Status::Passed {
            tracing::warn!(
                "the configured SQL has not passed its check against the target: no job is claimed until it does"
            );
            if !self.sql_check.wait_until_passed(&cancel).await {
                return;
            }
        }
        let mut worker = self.clone();
        worker.stop = cancel.clone();
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            let wait = match worker.step().await {
                Ok(StepOutcome::Ran { .. }) => {
                    failures = 0;
                    continue;
                }
                Ok(StepOutcome::Idle) => {
                    failures = 0;
                    self.config.worker.poll_interval
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %e, "worker cannot reach the state database");
                    backoff(
                        failures,
                        self.config.worker.poll_interval,
                        Duration::from_secs(30),
                    )
                }
            };
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
                // Woken by the listener when a job is queued: claimed now, not after `wait`.
                () = self.presence.job_queued() => {}
            }
        }
    }
}
