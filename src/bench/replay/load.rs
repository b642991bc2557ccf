//! A fixed-rate, open-loop load: operations start on a schedule (segments of a rate each), each in its
//! own task, whether or not earlier ones have answered — as real callers do. An operation's latency is
//! counted from its *scheduled* start, so a stalled system shows its whole queue (no coordinated
//! omission). Finished operations land in a shared list, readable while the load runs.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How one operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It answered in time (for HTTP: a 2xx status).
    Ok,
    /// The caller's deadline fired first; the caller gave up.
    Deadline,
    /// It failed; the message (an HTTP status as `HTTP 503`, or a database/transport error).
    Error(String),
}

/// One finished operation.
#[derive(Debug, Clone)]
pub struct Shot {
    /// Scheduled start, from the load's start.
    pub at: Duration,
    /// From the scheduled start to the answer (or to the deadline / error).
    pub latency: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

impl Shot {
    /// When it ended, from the load's start.
    pub fn end(&self) -> Duration {
        self.at + self.latency
    }
}

/// A running load; [`Running::stop`] ends scheduling and waits for the operations in flight.
#[derive(Debug)]
pub struct Running {
    /// When the load started (offsets of [`Shot`] are from here).
    pub started: Instant,
    /// Operations finished so far.
    pub shots: Arc<Mutex<Vec<Shot>>>,
    cancel: CancellationToken,
    scheduler: tokio::task::JoinHandle<()>,
}

impl Running {
    /// A copy of the operations finished so far.
    pub fn snapshot(&self) -> Vec<Shot> {
        self.shots.lock().expect("not poisoned").clone()
    }

    /// Stops starting operations, waits (at most `grace`) for those in flight, and returns every
    /// finished one. Operations still running after `grace` are abandoned and not counted.
    pub async fn stop(self, grace: Duration) -> Vec<Shot> {
        self.cancel.cancel();
        let shots = self.shots.clone();
        let _ = tokio::time::timeout(grace, self.scheduler).await;
        shots.lock().expect("not poisoned").clone()
    }

    /// Waits until the schedule has ended and every operation has finished (at most `grace` after
    /// the schedule's end), and returns them.
    pub async fn finish(self, grace: Duration) -> Vec<Shot> {
        let shots = self.shots.clone();
        let cancel = self.cancel.clone();
        let mut scheduler = self.scheduler;
        // The scheduler ends by itself after the last segment and its in-flight operations.
        if tokio::time::timeout(grace, &mut scheduler).await.is_err() {
            cancel.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(1), scheduler).await;
        }
        shots.lock().expect("not poisoned").clone()
    }
}

/// Starts `op(i)` for i = 0, 1, … at `rate` operations per second during each `(length, rate)`
/// segment in turn (a segment of `Duration::MAX` lasts until [`Running::stop`]). `op` returns its
/// [`Outcome`]; its latency is measured here.
pub fn start<F, Fut>(segments: Vec<(Duration, f64)>, op: F) -> Running
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let started = Instant::now();
    let shots = Arc::new(Mutex::new(Vec::new()));
    let cancel = CancellationToken::new();
    let scheduler = tokio::spawn({
        let shots = shots.clone();
        let cancel = cancel.clone();
        async move {
            let op = Arc::new(op);
            let mut tasks = JoinSet::new();
            let mut i = 0usize;
            let mut segment_start = Duration::ZERO;
            'segments: for (length, rate) in segments {
                let rate = rate.max(0.001);
                // Whole operations per segment (no drift from adding a rounded period).
                let count = if length == Duration::MAX {
                    u64::MAX
                } else {
                    (length.as_secs_f64() * rate).round() as u64
                };
                for k in 0..count {
                    let at = segment_start + Duration::from_secs_f64(k as f64 / rate);
                    tokio::select! {
                        () = cancel.cancelled() => break 'segments,
                        () = tokio::time::sleep_until((started + at).into()) => {}
                    }
                    let (op, shots) = (op.clone(), shots.clone());
                    let scheduled = at;
                    let index = i;
                    tasks.spawn(async move {
                        let outcome = op(index).await;
                        let latency = started.elapsed().saturating_sub(scheduled);
                        shots.lock().expect("not poisoned").push(Shot {
                            at: scheduled,
                            latency,
                            outcome,
                        });
                    });
                    // Reap finished tasks as we go, so the set stays small.
                    while tasks.try_join_next().is_some() {}
                    i += 1;
                }
                segment_start = segment_start.saturating_add(length);
            }
            while tasks.join_next().await.is_some() {}
        }
    });
    Running {
        started,
        shots,
        cancel,
        scheduler,
    }
}

/// The `q` quantile (0..=1) of the latencies of `shots` that ended [`Outcome::Ok`], nearest rank,
/// in ms; 0 when there are none.
pub fn quantile_ms<'a>(shots: impl IntoIterator<Item = &'a Shot>, q: f64) -> f64 {
    let mut ok: Vec<Duration> = shots
        .into_iter()
        .filter(|s| s.outcome == Outcome::Ok)
        .map(|s| s.latency)
        .collect();
    if ok.is_empty() {
        return 0.0;
    }
    ok.sort_unstable();
    let rank = ((q * ok.len() as f64).ceil() as usize).clamp(1, ok.len());
    ok[rank - 1].as_secs_f64() * 1000.0
}

/// How many shots failed with each error text (e.g. `HTTP 503`), so a report can say what failed.
pub fn error_kinds<'a>(
    shots: impl IntoIterator<Item = &'a Shot>,
) -> std::collections::BTreeMap<String, usize> {
    let mut kinds = std::collections::BTreeMap::new();
    for s in shots {
        if let Outcome::Error(e) = &s.outcome {
            *kinds.entry(e.clone()).or_insert(0) += 1;
        }
    }
    kinds
}

/// Counts of each [`Outcome`] kind: (ok, deadline, error).
pub fn counts<'a>(shots: impl IntoIterator<Item = &'a Shot>) -> (usize, usize, usize) {
    shots
        .into_iter()
        .fold((0, 0, 0), |(o, d, e), s| match s.outcome {
            Outcome::Ok => (o + 1, d, e),
            Outcome::Deadline => (o, d + 1, e),
            Outcome::Error(_) => (o, d, e + 1),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn starts_at_the_scheduled_rate_and_counts_every_outcome() {
        let load = start(
            vec![
                (Duration::from_millis(100), 100.0),
                (Duration::from_millis(100), 300.0),
            ],
            |i| async move {
                match i % 3 {
                    0 => Outcome::Ok,
                    1 => Outcome::Deadline,
                    _ => Outcome::Error("x".into()),
                }
            },
        );
        let shots = load.finish(Duration::from_secs(5)).await;
        // 10 in the first 100 ms, 30 in the next.
        assert_eq!(shots.len(), 40);
        assert_eq!(counts(&shots), (14, 13, 13));
        assert!(shots.iter().all(|s| s.at < Duration::from_millis(200)));
        assert!(quantile_ms(&shots, 0.99) >= 0.0);
    }
}
