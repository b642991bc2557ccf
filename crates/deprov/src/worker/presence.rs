//! A worker's presence in `deprov.workers` and its acknowledgement of kill switch changes.
//!
//! ## What an acknowledgement means
//! A worker records version N (`observed_version`) only when no destructive statement of its own that
//! started on a reading older than N is still running, and every later one is preceded by a reading
//! of at least N. Kept true by one in-process lock, the *gate*: the job run holds it from its
//! kill-switch reading before a destructive statement until that statement has ended
//! ([`Presence::enter`]); the acknowledger takes the same lock to read the version and record it.
//! An acknowledgement therefore waits for a batch in flight (bounded by `[hard_delete]
//! statement_timeout`), never for a pause between batches. With each acknowledgement and each
//! heartbeat the worker also writes when its last destructive statement ended ([`Gate::during`],
//! `deprov.workers.last_destroyed_at`): written with an acknowledgement, the end of its last
//! statement before it.
//!
//! ## How a worker learns of a change
//! - `LISTEN deprov_kill_switch` on a connection of its own (`deprov-listener`), when a URL is given
//!   ([`Presence::spawn`]). After connecting and after every reconnect it re-reads, because a
//!   `NOTIFY` sent while it was not listening is lost.
//! - Every heartbeat (`[worker] heartbeat_interval`) returns the latest version: a change missed by
//!   the listener, or a worker without one, is acknowledged within one heartbeat.
//! - Every destructive statement starts on a reading of the switch taken at most
//!   `[hard_delete] max_batch_duration` before it: afresh (recording what it read), or during the
//!   batch before it (on the state database, while that batch runs on the target) when this process
//!   recorded no version since. Destruction stops within about a batch whatever happens to
//!   notifications.
//!
//! The same connection listens on [`jobs::WAKE_CHANNEL`]: an idle worker claims a job that intake
//! has just queued at once, not at its next poll ([`Presence::job_queued`]).
//!
//! `LISTEN` needs a session of its own: it cannot pass a transaction pooler (PgBouncer
//! `pool_mode = transaction`). Behind one, give `DEPROV_NOTIFY_URL` (a direct URL of the state
//! database, or a session-mode pool) or do without: then heartbeats and the per-batch re-read do the
//! work, and idle workers acknowledge within `heartbeat_interval`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::db::{self, Bounds, PoolRole};
use crate::queue::{jobs, kill_switch, workers};

/// Held while a destructive statement started on a kill switch reading runs (see the module docs);
/// dropping it lets an acknowledgement through. Destructive statements under it run through
/// [`Gate::during`], which records when each ended.
#[derive(Debug)]
pub struct Gate {
    _held: OwnedMutexGuard<()>,
    last_destroyed: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Gate {
    /// Awaits `statement` (destructive work under this gate) and records its end as this worker's
    /// last destructive statement, whatever its outcome (one rolled back held its locks too):
    /// written to `deprov.workers.last_destroyed_at` with the next heartbeat or acknowledgement.
    pub async fn during<T>(&self, statement: impl std::future::Future<Output = T>) -> T {
        let out = statement.await;
        *self
            .last_destroyed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        out
    }
}

/// Shared by all clones of one [`super::Worker`].
#[derive(Debug, Clone, Default)]
pub struct Presence {
    gate: Arc<Mutex<()>>,
    acked: Arc<AtomicI64>,
    wake: Arc<Notify>,
    listening: Arc<AtomicBool>,
    /// Heartbeat now (the listener's state changed), not at the next interval.
    beat: Arc<Notify>,
    /// Notified when a newer version is recorded ([`Self::changed`]).
    changed: Arc<Notify>,
    /// Notified when a job may have become claimable ([`Self::job_queued`]).
    queued: Arc<Notify>,
    /// When the last destructive statement under a gate ended ([`Gate::during`]).
    last_destroyed: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Presence {
    /// Takes the gate: hold it from the kill switch reading until the destructive statement ends.
    pub async fn enter(&self) -> Gate {
        Gate {
            _held: self.gate.clone().lock_owned().await,
            last_destroyed: self.last_destroyed.clone(),
        }
    }

    /// How long ago this process's last destructive statement ended ([`Gate::during`]); `None` when
    /// it has run none.
    pub fn since_destroyed(&self) -> Option<Duration> {
        self.last_destroyed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .map(|at| at.elapsed())
    }

    /// The highest version this process has recorded as acknowledged.
    pub fn acknowledged(&self) -> i64 {
        self.acked.load(Ordering::Acquire)
    }

    /// Records `version` for worker `id` in the caller's transaction when it is newer than the last
    /// recorded one; after the commit, pass what it returns to [`Self::note`]. Returns `None` when
    /// the worker has no row yet (before its first heartbeat): the version is then not recorded, and
    /// the heartbeat that registers the worker wakes the acknowledger. The caller must hold the gate.
    ///
    /// # Errors
    /// Database errors.
    pub async fn record(
        &self,
        conn: &mut sqlx::PgConnection,
        id: &str,
        version: i64,
    ) -> Result<Option<i64>, sqlx::Error> {
        if version > self.acknowledged()
            && !workers::observe(conn, id, version, self.since_destroyed()).await?
        {
            return Ok(None);
        }
        Ok(Some(version))
    }

    /// Remembers that `recorded` ([`Self::record`]'s answer) is recorded, after the commit.
    pub fn note(&self, recorded: Option<i64>) {
        if let Some(version) = recorded
            && self.acked.fetch_max(version, Ordering::AcqRel) < version
        {
            self.changed.notify_waiters();
        }
    }

    /// Completes when this process next records a newer kill switch version (the acknowledger, on
    /// a `NOTIFY` or a heartbeat, or a job run's own reading): a job resting between batches
    /// ([`crate::worker::pacing`]) reads its switches then instead of when the rest ends. Created
    /// before the change to be woken by it (tokio's `notify_waiters` wakes the futures that exist).
    pub fn changed(&self) -> tokio::sync::futures::OwnedNotified {
        self.changed.clone().notified_owned()
    }

    /// Completes when the listener heard that intake queued a job ([`jobs::WAKE_CHANNEL`]), or
    /// when it (re)connected (a notification may have been missed): an idle job loop claims then
    /// instead of at its next poll. One notification wakes one waiter; one sent while no loop
    /// waits is kept for the next wait.
    pub async fn job_queued(&self) {
        self.queued.notified().await;
    }

    /// Reads the latest version under the gate and records it.
    async fn acknowledge(&self, pool: &PgPool, id: &str) -> Result<(), sqlx::Error> {
        let _gate = self.enter().await;
        let mut tx = db::begin(pool, Bounds::STATE).await?;
        let version = kill_switch::latest_version(&mut *tx).await?;
        let recorded = self.record(&mut tx, id, version).await?;
        tx.commit().await?;
        self.note(recorded);
        Ok(())
    }

    /// Starts the heartbeat, the acknowledger and (with `notify_url`) the listener for worker `id`;
    /// they run until `cancel` fires. Await the returned set, then call [`Self::stopped`].
    pub fn spawn(
        &self,
        pool: PgPool,
        id: String,
        config: WorkerConfig,
        notify_url: Option<String>,
        cancel: CancellationToken,
    ) -> JoinSet<()> {
        let mut tasks = JoinSet::new();
        let this = self.clone();
        let (p, i, c) = (pool.clone(), id.clone(), cancel.clone());
        tasks.spawn(async move { this.heartbeats(&p, &i, &config, c).await });
        let this = self.clone();
        let c = cancel.clone();
        tasks.spawn(async move { this.acknowledger(&pool, &id, c).await });
        if let Some(url) = notify_url {
            let this = self.clone();
            tasks.spawn(async move { this.listener(&url, cancel).await });
        }
        tasks
    }

    async fn heartbeats(
        &self,
        pool: &PgPool,
        id: &str,
        config: &WorkerConfig,
        cancel: CancellationToken,
    ) {
        while !cancel.is_cancelled() {
            let listening = self.listening.load(Ordering::Acquire);
            let beat = async {
                let mut tx = db::begin(pool, Bounds::STATE).await?;
                let since = self.since_destroyed();
                let latest =
                    workers::heartbeat(&mut *tx, id, config.stale_after, listening, since).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(latest)
            };
            match beat.await {
                Ok(latest) if latest > self.acknowledged() => self.wake.notify_one(),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "worker heartbeat failed"),
            }
            tokio::select! {
                () = cancel.cancelled() => {}
                () = self.beat.notified() => {}
                () = tokio::time::sleep(config.heartbeat_interval) => {}
            }
        }
    }

    async fn acknowledger(&self, pool: &PgPool, id: &str, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.wake.notified() => {}
            }
            if let Err(e) = self.acknowledge(pool, id).await {
                // The next heartbeat wakes this again while the version is unacknowledged.
                tracing::warn!(error = %e, "cannot acknowledge the kill switch version");
            }
        }
    }

    async fn listener(&self, url: &str, cancel: CancellationToken) {
        let options = match db::connect_options(url) {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e, "DEPROV_NOTIFY_URL does not parse; polling only");
                return;
            }
        };
        let pool = db::single(&options, PoolRole::Listener);
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            let lost = self.listen_once(&pool, &cancel, &mut failures).await;
            self.listening.store(false, Ordering::Release);
            self.beat.notify_one();
            if let Err(e) = lost {
                failures = failures.saturating_add(1);
                tracing::warn!(error = %e, "kill switch listener lost; polling until it reconnects");
            }
            let wait = super::backoff(
                failures.max(1),
                Duration::from_millis(100),
                Duration::from_secs(10),
            );
            tokio::select! {
                () = cancel.cancelled() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        pool.close().await;
    }

    /// One listening session: ends when the connection is lost (`Ok`) or fails (`Err`), or at
    /// cancel. `failures` is reset once listening.
    async fn listen_once(
        &self,
        pool: &PgPool,
        cancel: &CancellationToken,
        failures: &mut u32,
    ) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener
            .listen_all([kill_switch::CHANNEL, jobs::WAKE_CHANNEL])
            .await?;
        *failures = 0;
        self.listening.store(true, Ordering::Release);
        self.beat.notify_one();
        // Changes made while not listening were not delivered: read the version now, and look
        // for jobs.
        self.wake.notify_one();
        self.queued.notify_one();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                got = listener.try_recv() => match got? {
                    Some(n) if n.channel() == jobs::WAKE_CHANNEL => self.queued.notify_one(),
                    Some(_) => self.wake.notify_one(),
                    None => return Ok(()),
                },
            }
        }
    }

    /// Marks worker `id` stopped, so it is no longer awaited as live.
    pub async fn stopped(pool: &PgPool, id: &str) {
        let done = async {
            let mut tx = db::begin(pool, Bounds::STATE).await?;
            workers::stopped(&mut *tx, id).await?;
            tx.commit().await
        };
        if let Err(e) = done.await {
            tracing::warn!(error = %e, "cannot mark the worker stopped; it drops out when its heartbeat goes stale");
        }
    }
}
