//! The paced window of `deprov-lab bench delete`: deprov at a low `[pacing] duty_cycle`, its
//! foreground p99 compared with a baseline measured in the same minutes on the same database.
//!
//! The window alternates segments of `--paced-segment-secs`: one with no worker (the interleaved
//! baseline), then one with deprov's worker running the job, stopped as SIGTERM stops it at the
//! segment's end — until deprov has run for `--paced-secs` or the job completed. The foreground
//! and the tenant writer run throughout; each operation belongs to the segment it was sent in.
//! A machine whose latency drifts over a run (the project's moved 0.49 → 1.56 ms between two
//! 15 s baselines) moves both arms alike, so the ratio of their p99s is deprov's effect and not
//! the drift's. The duty cycle runs on wall time across the segments: a rest cut short by the
//! segment's end is waited out queued (`progress.resting_until`), whatever segment it ends in.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::args::BenchArgs;
use super::side::{BenchError, Deprov, DeprovRun, Keys, Side, TimeSplit, deprov_side};
use super::workload;
use deprov_testkit::Throwaway;

/// The paced window's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Paced {
    /// Its `[pacing] duty_cycle`.
    pub duty_cycle: f64,
    /// The time deprov's worker was to run (`--paced-secs`), in s.
    pub window_s: f64,
    /// Length of each segment (`--paced-segment-secs`), in s.
    pub segment_s: f64,
    /// Segments deprov's worker ran in (as many others had none, each before one of these).
    pub segments: u32,
    /// Whether the job completed within the window (the tenant is then wholly deleted).
    pub completed: bool,
    /// deprov's figures over its segments: `rows` deleted in the window (as of the checkpoint the
    /// last stopped worker wrote), `elapsed_s` the window's wall time from the request to the
    /// last worker's stop (both arms: the duty cycle's rests run on wall time), the foreground's
    /// figures from operations sent while a worker ran (its `foreground_errors` are the whole
    /// window's: a failed operation carries no time).
    pub side: Side,
    /// Time deprov's worker ran (its segments, each to the worker's stop), in s.
    pub worker_s: f64,
    /// Share of `worker_s` deprov spent in the statements its progress times: batches (rolled back
    /// included), index passes, the trial cascade, and its checkpoints and kill-switch checks on the
    /// state database (not its plan, soft delete or simulation, which are small beside them here).
    pub worked_share: f64,
    /// Foreground p99 of the operations sent in the segments with no worker, in ms.
    pub baseline_p99_ms: f64,
    /// Foreground operations timed in the segments with no worker.
    pub baseline_ops: usize,
    /// Foreground p99 of each segment with no worker, in order, in ms. The first one ran before
    /// deprov's first statement: a later one well above it is deprov's after-effect (written-back
    /// buffers, autovacuum of its deletions) rather than the machine.
    pub idle_segments_p99_ms: Vec<f64>,
    /// Foreground p99 of each segment with a worker, in order, in ms.
    pub worker_segments_p99_ms: Vec<f64>,
}

impl Paced {
    /// The foreground's p99 while deprov ran ÷ the interleaved baseline's (0 with no baseline).
    pub fn ratio(&self) -> f64 {
        if self.baseline_p99_ms > 0.0 {
            self.side.foreground_p99_ms / self.baseline_p99_ms
        } else {
            0.0
        }
    }
}

/// Runs the paced window (see the module docs) on `run`'s databases for `tenant`.
///
/// # Errors
/// [`BenchError`]; a job that fails is [`BenchError::Job`].
pub(super) async fn run(
    args: &BenchArgs,
    server: &Throwaway,
    keys: &Keys,
    tenant: i64,
    run: &DeprovRun<'_>,
) -> Result<Paced, BenchError> {
    let window = Duration::from_secs(args.paced_secs);
    let segment = Duration::from_secs(args.paced_segment_secs.max(1)).min(window);
    let deprov = Deprov::prepare(args, server, run).await?;
    let url = server.url(run.target_db);
    let fg = workload::start(&url, args.clients, args.rate, keys.foreground.clone());
    let writer = workload::start(&url, 1, args.rate, keys.tenant.clone());
    let started = Instant::now();
    let job_id = deprov.record(&tenant.to_string()).await?;
    let (mut idle, mut working) = (Vec::new(), Vec::new());
    let mut worked = Duration::ZERO;
    let (mut job, mut completed) = (None, false);
    while worked < window && !completed {
        let quiet = Instant::now();
        tokio::time::sleep(segment).await;
        idle.push((quiet, Instant::now()));
        let from = Instant::now();
        let j = deprov
            .work(job_id, from, Some(segment.min(window - worked)))
            .await?;
        working.push((from, Instant::now()));
        worked += from.elapsed();
        // A job can also complete while its worker is being stopped (its last batch ending).
        completed = j.state == "completed";
        if j.state == "failed" {
            return Err(BenchError::Job {
                state: j.state,
                error: j.last_error.unwrap_or_default(),
            });
        }
        job = Some(j);
    }
    let elapsed = started.elapsed();
    let (writer, fg) = (writer.stop().await, fg.stop().await);
    deprov.pools.close().await;
    let Some(job) = job else {
        return Err(BenchError::Config("--paced-secs 0 has no window".into()));
    };
    let baseline = fg.within(&idle);
    let p = &job.progress;
    let mut side = deprov_side(p, elapsed, writer.within(&working), fg.within(&working));
    side.foreground_errors = fg.errors;
    let worker_s = worked.as_secs_f64();
    let t = TimeSplit::from_progress(p, worker_s);
    let work_ms = t.batches + t.index_passes + t.bookkeeping + t.trial + t.rolled_back;
    Ok(Paced {
        duty_cycle: run.duty_cycle,
        window_s: window.as_secs_f64(),
        segment_s: segment.as_secs_f64(),
        segments: working.len() as u32,
        completed,
        side,
        worker_s,
        worked_share: (work_ms / (worker_s * 1000.0)).clamp(0.0, 1.0),
        baseline_p99_ms: baseline.quantile_ms(0.99),
        baseline_ops: baseline.len(),
        idle_segments_p99_ms: each_p99(&fg, &idle),
        worker_segments_p99_ms: each_p99(&fg, &working),
    })
}

/// The p99 of `samples` sent within each of `spans`, in ms.
fn each_p99(samples: &workload::Samples, spans: &[(Instant, Instant)]) -> Vec<f64> {
    spans
        .iter()
        .map(|&span| samples.within(&[span]).quantile_ms(0.99))
        .collect()
}
