//! The load that runs beside a deletion in `deprov-lab bench delete`: other tenants' reads and writes (the
//! foreground, whose p99 latency must stay near its baseline) and a writer touching the deleted
//! tenant's own rows (whose longest wait is how long the deletion blocks the tenant's traffic).
//!
//! Both are open loops at a fixed rate (a missed tick is skipped, not queued), each operation timed
//! from its start to its answer. Writes set a column to itself (`SET email = email`): a real row
//! version, WAL and row lock, but no change in content, so the database still equals the cascade's
//! copy afterwards.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// One completed operation.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    /// When it was sent.
    pub at: Instant,
    /// From sending it to its answer.
    pub took: Duration,
    /// Whether it was a write.
    pub write: bool,
}

/// Timings of one workload over one run.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Every completed operation, in the order each client completed them.
    pub ops: Vec<Timed>,
    /// Operations that failed (any database error).
    pub errors: u64,
}

impl Samples {
    /// Operations timed.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether none were timed.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The `q` quantile (0..=1) of the latencies by the nearest-rank method, in ms; 0 with no samples.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(self.ops.iter().map(|o| o.took), q)
    }

    /// The `q` quantile of the writes' latencies, as [`Self::quantile_ms`].
    pub fn write_quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(self.ops.iter().filter(|o| o.write).map(|o| o.took), q)
    }

    /// The `q` quantile of the reads' latencies, as [`Self::quantile_ms`].
    pub fn read_quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(self.ops.iter().filter(|o| !o.write).map(|o| o.took), q)
    }

    /// The longest latency, in ms.
    pub fn max_ms(&self) -> f64 {
        self.ops
            .iter()
            .map(|o| o.took)
            .max()
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }

    /// Adds `other`'s samples to these.
    pub fn merge(&mut self, other: Samples) {
        self.ops.extend(other.ops);
        self.errors += other.errors;
    }

    /// The operations sent within one of `spans` (each `[start, end)`); errors are not kept (they
    /// carry no time).
    pub fn within(&self, spans: &[(Instant, Instant)]) -> Samples {
        Samples {
            ops: self
                .ops
                .iter()
                .filter(|o| spans.iter().any(|&(a, b)| a <= o.at && o.at < b))
                .copied()
                .collect(),
            errors: 0,
        }
    }
}

/// The nearest-rank `q` quantile of `latencies` in ms; 0 with none.
fn quantile_ms(latencies: impl Iterator<Item = Duration>, q: f64) -> f64 {
    let mut sorted: Vec<Duration> = latencies.collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1000.0
}

/// One kind of operation on one row key.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// `SELECT id, email FROM app.users WHERE account_id = $1` (key: an account id).
    ReadUsers,
    /// `UPDATE app.users SET email = email WHERE id = $1` (key: a user id).
    TouchUser,
    /// `UPDATE app.projects SET name = name WHERE id = $1` (key: a project id).
    TouchProject,
    /// `UPDATE app.accounts SET name = name WHERE id = $1` (key: an account id, the tenant root).
    TouchAccount,
}

impl Op {
    /// Whether it writes (an `UPDATE`, whose commit waits for the WAL flush).
    pub fn is_write(self) -> bool {
        !matches!(self, Op::ReadUsers)
    }

    pub(crate) fn sql(self) -> &'static str {
        match self {
            Op::ReadUsers => "SELECT id, email FROM app.users WHERE account_id = $1",
            Op::TouchUser => "UPDATE app.users SET email = email WHERE id = $1",
            Op::TouchProject => "UPDATE app.projects SET name = name WHERE id = $1",
            Op::TouchAccount => "UPDATE app.accounts SET name = name WHERE id = $1",
        }
    }
}

/// A running workload; [`Running::stop`] ends it and returns its samples.
#[derive(Debug)]
pub struct Running {
    cancel: CancellationToken,
    samples: tokio::sync::oneshot::Receiver<Samples>,
}

impl Running {
    /// Stops every client after its current operation and merges their samples.
    pub async fn stop(self) -> Samples {
        self.cancel.cancel();
        self.samples.await.unwrap_or_default()
    }
}

/// Starts `clients` clients of the database at `url`, each on its own connection running `rate`
/// operations per second, cycling through `ops` (an operation with its key).
///
/// They run on a thread of their own with its own Tokio runtime, like a client in another process:
/// whatever else the benchmark's runtime is busy with (deprov's worker, in `deprov-lab bench delete`)
/// cannot delay them being polled, so a latency measures the database and the machine's CPU, not
/// the benchmark's scheduling. A client that cannot connect counts one error.
pub fn start(url: &str, clients: usize, rate: u32, ops: Vec<(Op, i64)>) -> Running {
    let cancel = CancellationToken::new();
    let (tx, samples) = tokio::sync::oneshot::channel();
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let (url, stop) = (url.to_owned(), cancel.clone());
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            let _ = tx.send(Samples {
                errors: clients as u64,
                ..Samples::default()
            });
            return;
        };
        let all = runtime.block_on(async {
            let mut each = tokio::task::JoinSet::new();
            for client in 0..clients {
                let (url, ops, stop) = (url.clone(), ops.clone(), stop.clone());
                each.spawn(
                    async move { run_client(&url, client, clients, period, &ops, &stop).await },
                );
            }
            let mut all = Samples::default();
            while let Some(samples) = each.join_next().await {
                all.merge(samples.unwrap_or_default());
            }
            all
        });
        let _ = tx.send(all);
    });
    Running { cancel, samples }
}

/// One client of [`start`]: its operations are `ops[client]`, `ops[client + clients]`, …
async fn run_client(
    url: &str,
    client: usize,
    clients: usize,
    period: Duration,
    ops: &[(Op, i64)],
    cancel: &CancellationToken,
) -> Samples {
    use sqlx::Connection as _;
    let mut samples = Samples::default();
    let Ok(mut conn) = sqlx::PgConnection::connect(url).await else {
        samples.errors += 1;
        return samples;
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut i = client;
    while !ops.is_empty() {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let (op, key) = ops[i % ops.len()];
        i += clients;
        let started = Instant::now();
        match sqlx::query(op.sql()).bind(key).execute(&mut conn).await {
            Ok(_) => samples.ops.push(Timed {
                at: started,
                took: started.elapsed(),
                write: op.is_write(),
            }),
            Err(_) => samples.errors += 1,
        }
    }
    let _ = conn.close().await;
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles_and_spans() {
        let t0 = Instant::now();
        let s = Samples {
            ops: (1..=100)
                .map(|i| Timed {
                    at: t0 + Duration::from_secs(i),
                    took: Duration::from_millis(i),
                    write: i == 7,
                })
                .collect(),
            errors: 2,
        };
        assert!((s.quantile_ms(0.99) - 99.0).abs() < 1e-9);
        assert!((s.quantile_ms(0.5) - 50.0).abs() < 1e-9);
        assert!((s.max_ms() - 100.0).abs() < 1e-9);
        assert!((s.write_quantile_ms(0.99) - 7.0).abs() < 1e-9);
        // The reads are the 99 others: nearest rank ⌈0.99 × 99⌉ = 99, the slowest.
        assert!((s.read_quantile_ms(0.99) - 100.0).abs() < 1e-9);
        assert!((Samples::default().quantile_ms(0.99)).abs() < 1e-9);
        // Sent at 1..=100 s: [10 s, 20 s) and [90 s, 200 s) hold 10 + 11 of them.
        let secs = |n| t0 + Duration::from_secs(n);
        let part = s.within(&[(secs(10), secs(20)), (secs(90), secs(200))]);
        assert_eq!(part.len(), 21);
        assert!((part.max_ms() - 100.0).abs() < 1e-9);
        assert!((part.quantile_ms(0.0) - 10.0).abs() < 1e-9);
        assert_eq!(part.errors, 0);
    }
}
