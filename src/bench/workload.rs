//! The load that runs beside a deletion in `deprov bench delete`: other tenants' reads and writes (the
//! foreground, whose p99 latency must stay near its baseline) and a writer touching the deleted
//! tenant's own rows (whose longest wait is how long the deletion blocks the tenant's traffic).
//!
//! Both are open loops at a fixed rate (a missed tick is skipped, not queued), each operation timed
//! from its start to its answer. Writes set a column to itself (`SET email = email`): a real row
//! version, WAL and row lock, but no change in content, so the database still equals the cascade's
//! copy afterwards.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// Timings of one workload over one run.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Latency of every completed operation.
    pub latencies: Vec<Duration>,
    /// Latency of the completed writes alone (also in `latencies`).
    pub writes: Vec<Duration>,
    /// Latency of the completed reads alone (also in `latencies`).
    pub reads: Vec<Duration>,
    /// Operations that failed (any database error).
    pub errors: u64,
}

impl Samples {
    /// The `q` quantile (0..=1) of the latencies by the nearest-rank method, in ms; 0 with no samples.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.latencies, q)
    }

    /// The `q` quantile of the writes' latencies, as [`Self::quantile_ms`].
    pub fn write_quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.writes, q)
    }

    /// The `q` quantile of the reads' latencies, as [`Self::quantile_ms`].
    pub fn read_quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.reads, q)
    }

    /// The longest latency, in ms.
    pub fn max_ms(&self) -> f64 {
        self.latencies
            .iter()
            .max()
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }

    /// Adds `other`'s samples to these.
    pub fn merge(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        self.writes.extend(other.writes);
        self.reads.extend(other.reads);
        self.errors += other.errors;
    }
}

/// The nearest-rank `q` quantile of `latencies` in ms; 0 with none.
fn quantile_ms(latencies: &[Duration], q: f64) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    let mut sorted = latencies.to_vec();
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
/// whatever else the benchmark's runtime is busy with (deprov's worker, in `deprov bench delete`)
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
            Ok(_) => {
                let took = started.elapsed();
                samples.latencies.push(took);
                if op.is_write() {
                    samples.writes.push(took);
                } else {
                    samples.reads.push(took);
                }
            }
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
    fn nearest_rank_quantiles() {
        let s = Samples {
            latencies: (1..=100).map(Duration::from_millis).collect(),
            writes: vec![Duration::from_millis(7)],
            reads: vec![Duration::from_millis(3)],
            errors: 0,
        };
        assert!((s.quantile_ms(0.99) - 99.0).abs() < 1e-9);
        assert!((s.quantile_ms(0.5) - 50.0).abs() < 1e-9);
        assert!((s.max_ms() - 100.0).abs() < 1e-9);
        assert!((s.write_quantile_ms(0.99) - 7.0).abs() < 1e-9);
        assert!((s.read_quantile_ms(0.99) - 3.0).abs() < 1e-9);
        assert!((Samples::default().quantile_ms(0.99)).abs() < 1e-9);
    }
}
