//! The worker: leases jobs and runs them (resolve → soft delete → hard delete). PLACEHOLDER — being
//! written on the engine branch; the signatures below are the contract the HTTP/CLI layer uses.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db::Pools;

/// What one [`Worker::step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// No claimable job.
    Idle,
    /// Ran one job to a hand-back (completed, failed, held, or re-queued for retry).
    Ran {
        /// The job.
        job_id: uuid::Uuid,
        /// Its state after the hand-back.
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
}

/// Worker failures that are not a job's own error (the state database is unreachable).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// State database error.
    #[error("state database: {0}")]
    Db(#[from] sqlx::Error),
}

impl Worker {
    /// A worker named `id` (use something unique per process, e.g. `hostname-pid`).
    pub fn new(pools: Pools, config: Arc<Config>, id: String) -> Self {
        Self { pools, config, id }
    }

    /// Claims at most one job and runs it until it is handed back. Tests drive this directly.
    ///
    /// # Errors
    /// [`WorkerError`] when the state database cannot be reached.
    pub async fn step(&self) -> Result<StepOutcome, WorkerError> {
        Ok(StepOutcome::Idle)
    }

    /// Runs [`Self::step`] until `cancel` fires, polling every `worker.poll_interval` when idle.
    pub async fn run(&self, cancel: CancellationToken) {
        cancel.cancelled().await;
    }
}
