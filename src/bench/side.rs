//! One side of `deprov-lab bench delete`: deprov's job (a request recorded as intake records it, run to
//! its end by the service's own worker) and the figures of a deletion, the cascade's or deprov's.

use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::args::BenchArgs;
pub use super::error::BenchError;
use super::workload::{self, Op, Samples};
use deprov::config::Config;
use deprov::db::Pools;
use deprov::ids::DedupBasis;
use deprov::queue::JobState;
use deprov::queue::intake::{self, NewRequest, SubjectKind};
use deprov::queue::jobs;
use deprov::sql::{QualifiedName, SqlBuilder};
use deprov::worker::Worker;
use deprov_testkit::Throwaway;

/// Figures of one deletion (the cascade's or deprov's).
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Rows deleted.
    pub rows: i64,
    /// Wall time of the whole deletion, in s.
    pub elapsed_s: f64,
    /// Rows deleted per second of wall time.
    pub rows_per_s: f64,
    /// The longest single transaction on the target, in ms.
    pub longest_transaction_ms: f64,
    /// Transactions (batches) it took.
    pub transactions: i64,
    /// The longest transaction that rolled back on a timeout (deprov retries those smaller), in ms.
    pub longest_rolled_back_ms: f64,
    /// The longest wait of one statement of the writer touching the tenant's rows, in ms.
    pub tenant_writer_longest_wait_ms: f64,
    /// Foreground p99 latency while the deletion ran, in ms.
    pub foreground_p99_ms: f64,
    /// Foreground median latency while the deletion ran, in ms.
    pub foreground_p50_ms: f64,
    /// Foreground p99 latency of the writes alone (single-row `UPDATE`s, each a commit that waits
    /// for its WAL flush), in ms.
    pub foreground_write_p99_ms: f64,
    /// Foreground p99 latency of the reads alone (an account's users by an indexed key), in ms.
    pub foreground_read_p99_ms: f64,
    /// Foreground operations timed while the deletion ran.
    pub foreground_ops: usize,
    /// Foreground operations that failed.
    pub foreground_errors: u64,
}

/// deprov's elapsed time by activity, in ms (from the job's progress; `other` is the rest: the job's
/// claim, its soft delete, the plan, blocker and simulation checks, and deprov's own work between
/// statements).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TimeSplit {
    /// Batch transactions that committed (`progress.tables[].batch_ms`).
    pub batches: f64,
    /// Read-only index passes (`progress.index_pass_ms`).
    pub index_passes: f64,
    /// Kill-switch checks and checkpoints on the state database (`progress.bookkeeping_ms`).
    pub bookkeeping: f64,
    /// The trial cascade, rolled back (`progress.trial_ms`).
    pub trial: f64,
    /// Batch transactions that rolled back on a timeout (`progress.rolled_back_ms`).
    pub rolled_back: f64,
    /// Pacing: duty-cycle rests, rate-limit waits and pauses (`progress.duty_cycle_ms` +
    /// `rate_limited_ms` + `paused_ms`).
    pub pacing: f64,
    /// The rest of the elapsed time.
    pub other: f64,
}

impl TimeSplit {
    pub(super) fn from_progress(p: &serde_json::Value, elapsed_s: f64) -> Self {
        let f = |k: &str| p[k].as_f64().unwrap_or(0.0);
        let batches = p["tables"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| t["batch_ms"].as_f64().unwrap_or(0.0))
            .sum::<f64>();
        let (index_passes, bookkeeping) = (f("index_pass_ms"), f("bookkeeping_ms"));
        let pacing = f("duty_cycle_ms") + f("rate_limited_ms") + f("paused_ms");
        let (trial, rolled_back) = (f("trial_ms"), f("rolled_back_ms"));
        Self {
            batches,
            index_passes,
            bookkeeping,
            trial,
            rolled_back,
            pacing,
            other: elapsed_s * 1000.0
                - batches
                - index_passes
                - bookkeeping
                - trial
                - rolled_back
                - pacing,
        }
    }
}

/// One run of deprov's worker in [`run_deprov`].
pub(super) struct DeprovRun<'a> {
    /// The database the tenant is deleted from.
    pub(super) target_db: &'a str,
    /// deprov's state database (migrated here).
    pub(super) state_db: &'a str,
    /// `[pacing] duty_cycle`.
    pub(super) duty_cycle: f64,
}

/// deprov set up for one [`DeprovRun`]: its configuration (`deploy/example.toml`'s, as the demo
/// writes it, with the arguments' deletion settings), its pools and its migrated state database.
pub(super) struct Deprov {
    pub(super) config: std::sync::Arc<Config>,
    pub(super) pools: Pools,
}

impl Deprov {
    /// Builds the configuration and pools of `run` and migrates its state database.
    pub(super) async fn prepare(
        args: &BenchArgs,
        server: &Throwaway,
        run: &DeprovRun<'_>,
    ) -> Result<Self, BenchError> {
        let text = deprov_demo::run::config_toml("bench-vercel-token-0000000000", args.batch_rows)
            .replace(
                "max_batch_duration = \"100ms\"",
                &format!("max_batch_duration = \"{}ms\"", args.max_batch_ms),
            )
            .replace(
                "checkpoint_interval = \"1s\"",
                &format!(
                    "checkpoint_interval = \"{}ms\"",
                    args.checkpoint_interval_ms
                ),
            )
            .replace(
                "rate_limit = 0 ",
                &format!("rate_limit = {} ", args.rate_limit),
            )
            .replace(
                "duty_cycle = 1 ",
                &format!("duty_cycle = {:?} ", run.duty_cycle),
            )
            .replace("poll_interval = \"500ms\"", "poll_interval = \"10ms\"")
            .replace(
                "whole_cascade = true ",
                &format!("whole_cascade = {} ", !args.no_whole_cascade),
            );
        let config = std::sync::Arc::new(
            Config::from_toml(&text).map_err(|e| BenchError::Config(e.to_string()))?,
        );
        let pools = Pools::new(
            &server.url(run.state_db),
            &server.url(run.target_db),
            &config.pools,
        )?;
        deprov::db::migrate(&pools.queue)
            .await
            .map_err(|e| BenchError::Config(e.to_string()))?;
        Ok(Self { config, pools })
    }

    /// Records the deletion request for `tenant` as intake records it; returns its job (which
    /// then waits for a worker).
    pub(super) async fn record(&self, tenant: &str) -> Result<uuid::Uuid, BenchError> {
        let request = NewRequest {
            source: "billing".into(),
            basis: DedupBasis::TenantId,
            dedup_key: tenant.to_owned(),
            subject_kind: SubjectKind::Tenant,
            subject: tenant.to_owned(),
            external_id: None,
            reason: Some("deprov-lab bench delete".into()),
        };
        let max_attempts = self.config.worker.max_attempts as i32;
        Ok(
            intake::record_tx(&self.pools.intake, &request, max_attempts)
                .await
                .map_err(|e| BenchError::Config(e.to_string()))?
                .job_id,
        )
    }

    /// Runs the service's worker until the job `job_id` ends or `window` (if any) has passed since
    /// `started`, then stops it as SIGTERM stops it (its current batch ends, its checkpoint and
    /// progress are written, the job goes back to the queue). Returns the job as the worker left
    /// it (its state says whether it ended).
    pub(super) async fn work(
        &self,
        job_id: uuid::Uuid,
        started: Instant,
        window: Option<Duration>,
    ) -> Result<jobs::Job, BenchError> {
        let running = self.start_worker(None);
        let ended = self.until_ended(job_id, started, window).await;
        running.stop().await;
        ended?;
        self.job(job_id).await
    }

    /// The request for `tenant` sent to a running service: the worker is started first, listening
    /// on `notify_url` (the state database, as `DEPROV_NOTIFY_URL` has it in a deployment), and
    /// requests are recorded once it listens (or after [`LISTEN_WAIT`] without), each then woken
    /// for as intake wakes it ([`jobs::wake_workers`]). With `warm_up` (a key no root row has),
    /// that key's request is served first, so that the measured one meets the worker, its pooled
    /// connections and the state database's PL/pgSQL plans as a service that has served a request
    /// before: its time is a running service's request-to-completion time, not a start's. Returns the measured job as it ended and when its request was accepted
    /// (its intake transaction committed; this process's clock).
    pub(super) async fn serve(
        &self,
        tenant: &str,
        warm_up: Option<&str>,
        notify_url: String,
    ) -> Result<(jobs::Job, time::OffsetDateTime), BenchError> {
        let running = self.start_worker(Some(notify_url));
        let served = async {
            self.until_listening().await?;
            if let Some(key) = warm_up {
                self.warm_up(key).await?;
            }
            let job_id = self.record(tenant).await?;
            let accepted = time::OffsetDateTime::now_utc();
            self.wake().await;
            self.until_ended(job_id, Instant::now(), None).await?;
            Ok::<_, BenchError>((job_id, accepted))
        }
        .await;
        running.stop().await;
        let (job_id, requested) = served?;
        Ok((self.job(job_id).await?, requested))
    }

    /// Serves the request for `key` (no root row has it) to its end: the worker completes such a
    /// job at once, having read the root table and nothing else destroyed.
    ///
    /// # Errors
    /// [`BenchError::Job`] when that job has not completed within [`WARM_UP_WAIT`].
    async fn warm_up(&self, key: &str) -> Result<(), BenchError> {
        let job_id = self.request(key).await?;
        self.until_ended(job_id, Instant::now(), Some(WARM_UP_WAIT))
            .await?;
        let job = self.job(job_id).await?;
        if job.state() == deprov::queue::JobState::Completed {
            return Ok(());
        }
        Err(BenchError::Job {
            state: job.state().as_str().to_string(),
            error: format!(
                "the warm-up request (key {key:?}, no root row) did not complete within {} s: {}",
                WARM_UP_WAIT.as_secs(),
                job.last_error.unwrap_or_default()
            ),
        })
    }

    /// [`Self::record`], then the wake-up intake sends after its commit.
    async fn request(&self, tenant: &str) -> Result<uuid::Uuid, BenchError> {
        let job_id = self.record(tenant).await?;
        self.wake().await;
        Ok(job_id)
    }

    /// The wake-up intake sends after its commit ([`jobs::wake_workers`]).
    async fn wake(&self) {
        if let Err(e) = jobs::wake_workers(&self.pools.intake).await {
            // The worker still polls: the job only waits for its next poll.
            tracing::warn!(error = %e, "could not wake the worker");
        }
    }

    fn start_worker(&self, notify_url: Option<String>) -> RunningWorker {
        let cancel = CancellationToken::new();
        let worker = Worker::new(self.pools.clone(), self.config.clone(), WORKER_ID.into())
            .with_notify_url(notify_url);
        let handle = tokio::spawn({
            let cancel = cancel.clone();
            async move { worker.run(cancel).await }
        });
        RunningWorker { cancel, handle }
    }

    /// Waits until the bench's worker reports a `LISTEN` connection in `deprov.workers`, at most
    /// [`LISTEN_WAIT`].
    async fn until_listening(&self) -> Result<(), BenchError> {
        let since = Instant::now();
        while since.elapsed() < LISTEN_WAIT {
            let live = deprov::queue::workers::live(&self.pools.queue).await?;
            if live.iter().any(|w| w.id == WORKER_ID && w.listening) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!("the worker is not listening: the job waits for its poll");
        Ok(())
    }

    /// Polls the job until it ended ([`ended`]) or `window` (if any) has passed since `started`.
    async fn until_ended(
        &self,
        job_id: uuid::Uuid,
        started: Instant,
        window: Option<Duration>,
    ) -> Result<(), BenchError> {
        loop {
            let job = jobs::get(&self.pools.queue, job_id).await?;
            if job.is_some_and(|j| ended(&j)) || window.is_some_and(|w| started.elapsed() >= w) {
                return Ok(());
            }
            // Polled slowly, so the polling is no load beside the deletion: the time comes from the
            // job's own timestamps.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn job(&self, job_id: uuid::Uuid) -> Result<jobs::Job, BenchError> {
        match jobs::get(&self.pools.queue, job_id).await? {
            Some(job) => Ok(job),
            None => Err(BenchError::Job {
                state: "missing".into(),
                error: "the job's row is gone".into(),
            }),
        }
    }
}

/// Whether `job` has ended: completed, failed or cancelled (no worker will run it again).
fn ended(job: &jobs::Job) -> bool {
    matches!(
        job.state(),
        JobState::Completed | JobState::Failed | JobState::Cancelled
    )
}

/// The bench's worker's name (`deprov.workers.id`, the jobs' lease owner).
const WORKER_ID: &str = "bench-worker";

/// How long [`Deprov::serve`] waits for its worker to listen before it sends the request anyway.
const LISTEN_WAIT: Duration = Duration::from_secs(5);

/// How long [`Deprov::serve`] waits for its warm-up request's job to complete.
const WARM_UP_WAIT: Duration = Duration::from_secs(30);

/// A worker [`Deprov`] started; [`Self::stop`] stops it as SIGTERM does.
struct RunningWorker {
    cancel: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl RunningWorker {
    async fn stop(self) {
        self.cancel.cancel();
        let _ = self.handle.await;
    }
}

/// The figures of a job from its progress (`p`): rows deleted, its longest transaction (its
/// read-only index passes are transactions too, holding no row locks), batches and the longest
/// rolled-back one, with the workloads' samples.
pub(super) fn deprov_side(
    p: &serde_json::Value,
    elapsed: Duration,
    writer: Samples,
    fg: Samples,
) -> Side {
    let mut side = side(
        p["rows_deleted"].as_i64().unwrap_or(0),
        elapsed,
        p["longest_batch_ms"]
            .as_f64()
            .unwrap_or(0.0)
            .max(p["longest_index_pass_ms"].as_f64().unwrap_or(0.0)),
        p["batches"].as_i64().unwrap_or(0),
        writer,
        fg,
    );
    side.longest_rolled_back_ms = p["longest_rolled_back_ms"].as_f64().unwrap_or(0.0);
    side
}

/// deprov's job run to its end by one worker under the foreground and the tenant writer.
pub(super) async fn run_deprov(
    args: &BenchArgs,
    server: &Throwaway,
    keys: &Keys,
    tenant: i64,
    run: &DeprovRun<'_>,
) -> Result<(Side, serde_json::Value), BenchError> {
    let deprov = Deprov::prepare(args, server, run).await?;
    let saas_url = server.url(run.target_db);
    let fg = workload::start(&saas_url, args.clients, args.rate, keys.foreground.clone());
    let writer = workload::start(&saas_url, 1, args.rate, keys.tenant.clone());
    let (job, _) = deprov
        .serve(&tenant.to_string(), Some("-1"), server.url(run.state_db))
        .await?;
    let (writer, fg) = (writer.stop().await, fg.stop().await);
    if job.state != "completed" {
        return Err(BenchError::Job {
            state: job.state,
            error: job.last_error.unwrap_or_default(),
        });
    }
    deprov.pools.close().await;
    // From the intake transaction to the one that ended the job, both on the server's clock.
    let elapsed = job
        .finished_at
        .map(|end| (end - job.created_at).unsigned_abs())
        .unwrap_or_default();
    Ok((
        deprov_side(&job.progress, elapsed, writer, fg),
        job.progress,
    ))
}

pub(super) fn side(
    rows: i64,
    elapsed: Duration,
    longest_ms: f64,
    transactions: i64,
    writer: Samples,
    fg: Samples,
) -> Side {
    let secs = elapsed.as_secs_f64();
    Side {
        rows,
        elapsed_s: secs,
        rows_per_s: if secs > 0.0 { rows as f64 / secs } else { 0.0 },
        longest_transaction_ms: longest_ms,
        longest_rolled_back_ms: 0.0,
        transactions,
        tenant_writer_longest_wait_ms: writer.max_ms(),
        foreground_p99_ms: fg.quantile_ms(0.99),
        foreground_p50_ms: fg.quantile_ms(0.5),
        foreground_write_p99_ms: fg.write_quantile_ms(0.99),
        foreground_read_p99_ms: fg.read_quantile_ms(0.99),
        foreground_ops: fg.len(),
        foreground_errors: fg.errors,
    }
}

/// Row keys the workloads use, sampled before the copy (so both copies have them).
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// Other tenants: reads of an account's users, writes to single users.
    pub(crate) foreground: Vec<(Op, i64)>,
    /// The deleted tenant: its account row, its users and its projects.
    pub(crate) tenant: Vec<(Op, i64)>,
}

impl Keys {
    pub(crate) async fn sample(
        pool: &PgPool,
        tenant: i64,
        others: &[i64],
    ) -> Result<Self, sqlx::Error> {
        let other_users: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM app.users WHERE account_id <> $1 ORDER BY id LIMIT 2000",
        )
        .bind(tenant)
        .fetch_all(pool)
        .await?;
        let foreground = other_users
            .iter()
            .enumerate()
            .flat_map(|(i, &user)| {
                [
                    (Op::ReadUsers, others[i % others.len().max(1)]),
                    (Op::TouchUser, user),
                ]
            })
            .collect();
        let users: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM app.users WHERE account_id = $1 ORDER BY id LIMIT 500",
        )
        .bind(tenant)
        .fetch_all(pool)
        .await?;
        let projects: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM app.projects WHERE account_id = $1 ORDER BY id LIMIT 500",
        )
        .bind(tenant)
        .fetch_all(pool)
        .await?;
        let mut tenant_ops = vec![(Op::TouchAccount, tenant)];
        for i in 0..users.len().max(projects.len()) {
            if let Some(&u) = users.get(i) {
                tenant_ops.push((Op::TouchUser, u));
            }
            if let Some(&p) = projects.get(i) {
                tenant_ops.push((Op::TouchProject, p));
            }
        }
        Ok(Self {
            foreground,
            tenant: tenant_ops,
        })
    }
}

/// Reads every table once (a sequential scan), so both copies start with the same warm caches.
pub(super) async fn warm(pool: &PgPool, tables: &[QualifiedName]) -> Result<(), sqlx::Error> {
    for table in tables {
        let mut b = SqlBuilder::new();
        b.sql("SELECT count(*) FROM ").table(table);
        sqlx::query(b.build().as_query()).execute(pool).await?;
    }
    Ok(())
}

/// `CHECKPOINT` (PostgreSQL docs, SQL Commands → CHECKPOINT): waits until every dirty buffer is
/// written and synced, so the write-back falls here rather than in a measured window; the WAL
/// segments before it are recycled (up to `min_wal_size`, §30.5) instead of new ones zero-filled.
pub(crate) async fn checkpoint(admin: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("CHECKPOINT").execute(admin).await?;
    Ok(())
}
