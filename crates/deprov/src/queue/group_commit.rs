//! Group commit for intake: concurrent deletion requests recorded in one durable transaction.
//!
//! Every accepted request must be durable before it is answered, so each one costs a `COMMIT` that
//! waits for the WAL flush (`synchronous_commit = on`), plus its `BEGIN` round trip. Under load,
//! handlers hand their [`NewRequest`] to a bounded queue instead, and a fixed set of writer tasks
//! (`[intake] group_writers`, each on its own intake connection) each take whatever is waiting — up to `[intake] group_commit`
//! requests — and record them with [`intake::record`] in one transaction and one commit. A request
//! arriving on an idle service is alone in its group: nothing waits for a group to fill.
//!
//! The answers are exactly those of [`intake::record_tx`]: a request is answered only after the
//! commit that stored it (or after the statement that found it a duplicate was committed); a
//! [`IntakeError::Mismatch`] writes nothing, so it leaves the rest of the group untouched. When
//! anything else goes wrong inside a group (a [`IntakeError::Race`], a lock timeout, a deadlock
//! between two groups), the group is rolled back and each of its requests is recorded again in a
//! transaction of its own by [`intake::record_tx`], so one request's failure is never another's.
//! Requests in a group are recorded in the order of their subjects, so two groups lock the
//! same subjects' job rows in the same order.
//!
//! Admission is bounded like a pool acquire: a request that no writer has taken within the intake
//! pool's `acquire_timeout` gives up and is answered [`IntakeError::Db`] (`PoolTimedOut`, 503 +
//! `Retry-After` at the HTTP edge; counted in `deprov_db_pool_acquire_timeouts_total{pool="intake"}`)
//! — a writer never records a request whose caller gave up. A caller whose request a writer took
//! waits for its group's commit at most that long again, then is answered
//! [`IntakeError::Unconfirmed`] (503 + `Retry-After`; `deprov_intake_unconfirmed_total`) while the
//! group goes on: the server-side timeouts bound the group's statements, but not a wait in
//! PgBouncer's queue for a server (bounded only by its `query_wait_timeout`), and a caller's
//! deadline ends only the caller's wait — the group is neither cancelled nor its connection closed. When the queue is full (`capacity`
//! requests waiting; the service gives it `4 × group_commit × [pools.intake] max_connections`,
//! whatever the number of writers, so that a stall of a few tens of milliseconds at a few
//! thousand requests/s does not refuse anything) a request is refused at once the same way.
//!
//! A request that created a queued job wakes idle workers after its commit: one waker task sends
//! [`jobs::wake_workers`] on the intake pool, at most one notification per `WAKE_INTERVAL` (wake-ups
//! asked for meanwhile are merged into the next), so intake's own transactions never carry a
//! `NOTIFY` and a stream of requests costs a few notifications a second, not one each.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::intake::{self, Accepted, IntakeError, NewRequest};
use super::jobs;

type Answer = oneshot::Sender<Result<Accepted, IntakeError>>;

/// [`Pending::claim`]: no writer has taken the request yet.
const WAITING: u8 = 0;
/// A writer took it: it will be answered.
const TAKEN: u8 = 1;
/// Its caller gave up first: no writer records it.
const GAVE_UP: u8 = 2;

struct Pending {
    req: NewRequest,
    max_attempts: i32,
    answer: Answer,
    claim: Arc<AtomicU8>,
}

/// The handle handlers record through; cheap to clone. Writers stop once every handle is dropped
/// (after answering what is queued).
#[derive(Clone)]
pub struct GroupCommit {
    queue: mpsc::Sender<Pending>,
    /// The intake pool's `acquire_timeout`: the longest a request waits for a writer.
    wait: Duration,
    /// Asks the waker task to send [`jobs::wake_workers`]; holds at most one pending wake-up.
    wake: mpsc::Sender<()>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field(
                "waiting",
                &(self.queue.max_capacity() - self.queue.capacity()),
            )
            .finish()
    }
}

impl GroupCommit {
    /// Starts `writers` writer tasks on `pool` (at least 1), each recording up to `group` requests
    /// (at least 1; 1 = one transaction per request) per transaction; at most `capacity` requests
    /// (at least `group`) wait for a writer, each at most `wait` (the pool's `acquire_timeout`).
    /// Must be called inside a Tokio runtime.
    pub fn start(
        pool: PgPool,
        writers: usize,
        group: usize,
        capacity: usize,
        wait: Duration,
    ) -> Self {
        let (writers, group) = (writers.max(1), group.max(1));
        let (queue, rx) = mpsc::channel(capacity.max(group));
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..writers {
            tokio::spawn(write(pool.clone(), rx.clone(), group));
        }
        let (wake, wakes) = mpsc::channel(1);
        tokio::spawn(waker(pool, wakes));
        Self { queue, wait, wake }
    }

    /// After `answer` was committed: when it created a queued job, asks the waker for a
    /// notification (at once if none is pending; a pending one covers this job too).
    fn woken_by(&self, answer: &Result<Accepted, IntakeError>) {
        if let Ok(a) = answer
            && !a.duplicate
            && a.state == jobs::JobState::Queued.as_str()
        {
            let _ = self.wake.try_send(());
        }
    }

    /// Records `req` like [`intake::record_tx`], in a group with whatever else is waiting.
    ///
    /// # Errors
    /// As [`intake::record_tx`]; also [`IntakeError::Db`] with `PoolTimedOut` when the queue is
    /// full, no writer took the request within `wait`, or the writers have stopped; and
    /// [`IntakeError::Unconfirmed`] when a writer took it but its group's commit did not answer
    /// within `wait` after that (at most 2 × `wait` in all).
    pub async fn record(
        &self,
        req: NewRequest,
        max_attempts: i32,
    ) -> Result<Accepted, IntakeError> {
        let started = Instant::now();
        let (answer, mut answered) = oneshot::channel();
        let claim = Arc::new(AtomicU8::new(WAITING));
        let pending = Pending {
            req,
            max_attempts,
            answer,
            claim: claim.clone(),
        };
        let gave_up = || {
            crate::telemetry::pool_acquired("intake", started.elapsed(), true);
            Err(IntakeError::Db(sqlx::Error::PoolTimedOut))
        };
        if self.queue.try_send(pending).is_err() {
            return gave_up();
        }
        if let Ok(answer) = tokio::time::timeout(self.wait, &mut answered).await {
            let answer = answer.unwrap_or(Err(IntakeError::Db(sqlx::Error::PoolTimedOut)));
            self.woken_by(&answer);
            return answer;
        }
        if claim
            .compare_exchange(WAITING, GAVE_UP, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return gave_up();
        }
        // A writer took it meanwhile: its answer comes after its transaction, which may wait in
        // PgBouncer's queue for a server beyond any server-side bound. The caller stops waiting;
        // the group goes on and may still commit the request.
        match tokio::time::timeout(self.wait, answered).await {
            Ok(answer) => {
                let answer = answer.unwrap_or(Err(IntakeError::Db(sqlx::Error::PoolTimedOut)));
                self.woken_by(&answer);
                answer
            }
            Err(_) => {
                let waited = started.elapsed();
                tracing::warn!(
                    waited_ms = waited.as_millis(),
                    "intake: a group's commit was not confirmed in time; answered 503, the group goes on"
                );
                crate::telemetry::intake_unconfirmed();
                Err(IntakeError::Unconfirmed(waited))
            }
        }
    }
}

/// The shortest time between two notifications of the waker: under a steady stream of new jobs it
/// sends at most 1 s / this many, on one intake connection at a time, however many requests arrive.
/// Idle workers need one wake-up; busy ones claim their next job without it.
const WAKE_INTERVAL: Duration = Duration::from_millis(100);

/// The waker: one [`jobs::wake_workers`] per wake-up asked for, at most one per [`WAKE_INTERVAL`]
/// (those asked for meanwhile are merged into the next), until every [`GroupCommit`] handle is
/// dropped. A failed notification is logged; workers still find the job at their next poll.
async fn waker(pool: PgPool, mut wakes: mpsc::Receiver<()>) {
    while wakes.recv().await.is_some() {
        if let Err(e) = jobs::wake_workers(&pool).await {
            tracing::debug!(error = %e, "could not notify workers of a queued job; they find it at their next poll");
        }
        tokio::time::sleep(WAKE_INTERVAL).await;
    }
}

/// One writer: takes the next group off the queue and records it, until the queue closes.
async fn write(pool: PgPool, rx: Arc<Mutex<mpsc::Receiver<Pending>>>, group: usize) {
    loop {
        let mut batch = Vec::with_capacity(group);
        {
            let mut rx = rx.lock().await;
            if rx.recv_many(&mut batch, group).await == 0 {
                return;
            }
        }
        batch.retain(|p| {
            p.claim
                .compare_exchange(WAITING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
        if batch.is_empty() {
            continue;
        }
        record_group(&pool, batch).await;
    }
}

/// Records `batch` in one transaction, or each request alone when the group fails (module docs).
async fn record_group(pool: &PgPool, mut batch: Vec<Pending>) {
    if batch.len() == 1 {
        return record_each(pool, batch).await;
    }
    batch.sort_by(|a, b| {
        (a.req.subject_kind.as_str(), &a.req.subject)
            .cmp(&(b.req.subject_kind.as_str(), &b.req.subject))
    });
    let tx = match crate::db::begin(pool, crate::db::Bounds::STATE.durable()).await {
        Ok(tx) => tx,
        // No connection within acquire_timeout: each request alone would wait as long again.
        Err(sqlx::Error::PoolTimedOut) => {
            for p in batch {
                let _ = p
                    .answer
                    .send(Err(IntakeError::Db(sqlx::Error::PoolTimedOut)));
            }
            return;
        }
        Err(_) => return record_each(pool, batch).await,
    };
    match try_group(tx, &batch).await {
        Ok(results) => {
            for (p, result) in batch.into_iter().zip(results) {
                let _ = p.answer.send(result);
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, requests = batch.len(), "group rolled back; recording its requests one by one");
            record_each(pool, batch).await;
        }
    }
}

/// Records each request of `batch` in a transaction of its own ([`intake::record_tx`]).
async fn record_each(pool: &PgPool, batch: Vec<Pending>) {
    for p in batch {
        let result = intake::record_tx(pool, &p.req, p.max_attempts).await;
        let _ = p.answer.send(result);
    }
}

/// The group's answers after its commit; `Err` when the group must be retried one by one (nothing
/// of it was committed — or, when the commit's answer was lost, all of it: recorded again, each
/// request is then found stored and answered as a duplicate).
async fn try_group(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    batch: &[Pending],
) -> Result<Vec<Result<Accepted, IntakeError>>, IntakeError> {
    let reqs: Vec<NewRequest> = batch.iter().map(|p| p.req.clone()).collect();
    let max_attempts = batch.first().map_or(1, |p| p.max_attempts);
    let results = super::record::record_many(&mut tx, &reqs, max_attempts).await?;
    tx.commit().await?;
    Ok(results)
}
