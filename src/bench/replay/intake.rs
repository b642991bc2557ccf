//! `deprov-lab bench intake`: how many deletion requests deprov's intake accepts durably per second on
//! this machine, beside pgbench's single-row `INSERT` rate on the same server in the same run, and
//! intake's p99 while the target database is saturated with lock waits.
//!
//! deprov serves in-process (HTTP intake only, no worker) with its state database through PgBouncer
//! in transaction mode (`DEPROV_POOLER_MODE=transaction`; `--direct` for both it and pgbench without
//! PgBouncer). Every request names a distinct tenant, so each is a new stored request and job.
//! 1. Throughput: `--concurrency` HTTP clients in a closed loop for `--secs` (each sends its next
//!    request when the last is answered): accepted (202) per second, their p99, and the rows
//!    counted in `deprov.deletion_requests` afterwards (accepted must equal durable: intake commits
//!    with `synchronous_commit = on` before answering).
//! 2. pgbench, `--pgbench-clients` (deprov's intake pool, 8) for `--secs`, one autocommitted
//!    single-row `INSERT` per transaction, through the same path (`-M extended` through PgBouncer,
//!    `-M prepared` directly). Goal: intake ≥ 1.0× pgbench's rate.
//! 3. Latency at a fixed rate (`--rate`, default half the measured throughput), open loop, in
//!    `--latency-rounds` rounds of two `--latency-secs` segments: first with the target idle (the
//!    baseline), then with the target database (`saas`) saturated: one transaction holds `LOCK TABLE
//!    app.accounts IN ACCESS EXCLUSIVE MODE` and `--lock-waiters` sessions wait on it. Each
//!    condition's p99 is over all its segments, so drift during the run (the state tables grow,
//!    autovacuum, a WAL checkpoint) falls on both alike instead of on whichever phase came second.
//!    Before the first round the state database is vacuumed and analyzed (the throughput phase and
//!    pgbench inserted ~100,000 rows: autovacuum's clean-up would land in one segment).
//!    Each round starts with a `CHECKPOINT` (and the server keeps `min_wal_size = 1GB` of recycled
//!    WAL): on a fresh server every new 16 MB WAL segment is zero-filled while commits wait, and
//!    the kernel writes dirty data back in bursts of 20–80 MB; either stalled intake for 100–240 ms
//!    in whichever segment it fell, the target idle or not (`--lock-waiters 0` showed it too).
//!    Each round's p99 is printed, and where in their segments the slow requests fell.
//!    Goal: the saturated p99 ≤ 1.5× the baseline.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{Connection as _, PgConnection};

use super::load::{self, Outcome, Shot};
use super::pgbench::{self, PgbenchResult};
use super::stage::{self, Stage, connect};
use super::{Goal, ReplayError};
use deprov_demo::DemoSize;
use deprov_testkit::BouncerOptions;

/// `deprov-lab bench intake` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct IntakeArgs {
    /// Seconds of the throughput phase, and of pgbench.
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    /// HTTP clients of the closed loop. Enough that requests wait for a writer, so the phase
    /// measures intake's capacity rather than one client's round trip: with 32, each client
    /// waited ~7 ms per request while the machine was ~30% idle.
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    /// pgbench clients (deprov's intake pool has 8 connections).
    #[arg(long, default_value_t = 8)]
    pub pgbench_clients: u32,
    /// Fixed rate of the latency phases, requests/s (default: half the measured throughput).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seconds of each latency segment (one per condition and round).
    #[arg(long, default_value_t = 4)]
    pub latency_secs: u64,
    /// Rounds of the latency phases: each runs a segment with the target idle, then one with it
    /// saturated. Each condition's p99 is over `rounds × secs` (24 s by default): at 3 × 3 s one
    /// stall of ~0.5 s in one segment, idle or saturated, was over 5 % of that condition's
    /// requests and alone decided its p99.
    #[arg(long, default_value_t = 6)]
    pub latency_rounds: u32,
    /// Sessions waiting on a lock in the target database during the saturated phase.
    #[arg(long, default_value_t = 50)]
    pub lock_waiters: u32,
    /// PgBouncer `default_pool_size`.
    #[arg(long, default_value_t = 20)]
    pub pool_size: u32,
    /// Connect deprov and pgbench to PostgreSQL directly instead of through PgBouncer.
    #[arg(long)]
    pub direct: bool,
    /// deprov's `[intake] group_writers` for this run (default: the configuration's, 2).
    #[arg(long)]
    pub group_writers: Option<usize>,
    /// Server settings, `name=value` (repeatable; `postgres -c name=value`), to measure what one
    /// does: `--server-setting deadlock_timeout=1h`.
    #[arg(long = "server-setting", value_name = "NAME=VALUE", value_parser = crate::bench::args::parse_setting)]
    pub server_settings: Vec<(String, String)>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// One condition of the fixed-rate latency phases (all its segments).
#[derive(Debug, Clone, Serialize)]
pub struct LatencyPhase {
    /// Requests sent.
    pub sent: usize,
    /// Answered 202.
    pub accepted: usize,
    /// Not 202 (or a transport error).
    pub errors: usize,
    /// Those errors by kind (`HTTP 503`, a transport error's message) → count.
    pub error_kinds: std::collections::BTreeMap<String, usize>,
    /// p99 of the accepted, from their scheduled start, in ms.
    pub p99_ms: f64,
    /// p50, in ms.
    pub p50_ms: f64,
}

/// Everything `deprov-lab bench intake` prints.
#[derive(Debug, Clone, Serialize)]
pub struct IntakeReport {
    /// `pgbouncer` or `direct`.
    pub via: String,
    /// deprov's `[intake] group_writers` in this run.
    pub group_writers: usize,
    /// Closed-loop HTTP clients.
    pub concurrency: usize,
    /// Seconds of the throughput phase.
    pub secs: u64,
    /// Requests answered 202 in the throughput phase.
    pub accepted: usize,
    /// Requests not answered 202 there.
    pub errors: usize,
    /// Those errors by kind → count.
    pub error_kinds: std::collections::BTreeMap<String, usize>,
    /// Rows added to `deprov.deletion_requests` by the throughput phase.
    pub durable: i64,
    /// Accepted and durable requests per second.
    pub intake_per_s: f64,
    /// p99 of the throughput phase, in ms.
    pub saturated_p99_ms: f64,
    /// pgbench's run.
    pub pgbench: PgbenchResult,
    /// pgbench clients.
    pub pgbench_clients: u32,
    /// intake ÷ pgbench.
    pub ratio: f64,
    /// The latency phases' rate, requests/s.
    pub rate: f64,
    /// Rounds of the latency phases, and seconds of each segment (one per condition and round).
    pub latency_rounds: u32,
    /// Seconds of each latency segment.
    pub latency_secs: u64,
    /// Latency with the target idle.
    pub baseline: LatencyPhase,
    /// Latency with the target saturated with lock waits.
    pub locked: LatencyPhase,
    /// Each round's p99 in ms: `[target idle, target saturated]`, in the order run, to tell a
    /// steady difference from one stall that lands in one segment.
    pub rounds_p99_ms: Vec<[f64; 2]>,
    /// Requests slower than the idle p99, counted by the half second of their segment they were
    /// scheduled in: `[target idle, target saturated]`. Slow requests bunched at one offset of
    /// every saturated segment point at something the saturation does at that time.
    pub slow_by_offset: [Vec<usize>; 2],
    /// Sessions waiting on a lock in the target, lowest of the two readings (start and end).
    pub lock_waiters_seen: i64,
    /// The goals.
    pub goals: Vec<Goal>,
}

/// Runs the bench (see the module docs).
///
/// # Errors
/// [`ReplayError`] when a step cannot run.
pub async fn run(args: &IntakeArgs) -> Result<IntakeReport, ReplayError> {
    let (stage, state, deprov, group_writers) = start(args).await?;
    deprov::sources::oidc::install_crypto_provider();
    let requests = Requests {
        client: reqwest::Client::new(),
        base: &deprov.base,
        next: Arc::new(AtomicUsize::new(0)),
    };
    let throughput = throughput(args, &requests, &state).await?;
    let pgbench = pgbench_phase(args, &stage, &state).await?;

    // The two phases above inserted ~100,000 rows into the state database; autovacuum cleans up
    // after them at some moment of the latency phases, in one segment (three runs without this
    // each had a 65-159 ms stall in the second round's idle segment). Done now, it falls on
    // neither condition.
    sqlx::raw_sql("VACUUM (ANALYZE)").execute(&state).await?;
    let rate = args
        .rate
        .unwrap_or((throughput.intake_per_s / 2.0).max(1.0));
    say(
        args.json,
        "latency at a fixed rate: rounds of the target idle, then saturated with lock waits",
    );
    let rounds = latency_rounds(args, &stage, &requests, rate).await?;
    deprov.stop().await;
    let (baseline, locked) = (
        LatencyPhase::of(&rounds.idle),
        LatencyPhase::of(&rounds.saturated),
    );
    let slow_by_offset = [
        slow_by_offset(&rounds.idle, baseline.p99_ms, args.latency_secs),
        slow_by_offset(&rounds.saturated, baseline.p99_ms, args.latency_secs),
    ];

    let ratio = super::ratio(throughput.intake_per_s, pgbench.tps);
    let goals = goals(&throughput, &pgbench, ratio, &baseline, &locked);
    Ok(IntakeReport {
        via: if args.direct { "direct" } else { "pgbouncer" }.into(),
        group_writers,
        concurrency: args.concurrency,
        secs: args.secs,
        accepted: throughput.accepted,
        errors: throughput.errors,
        error_kinds: load::error_kinds(&throughput.shots),
        durable: throughput.durable,
        intake_per_s: throughput.intake_per_s,
        saturated_p99_ms: load::quantile_ms(&throughput.shots, 0.99),
        pgbench,
        pgbench_clients: args.pgbench_clients,
        ratio,
        rate,
        latency_rounds: args.latency_rounds.max(1),
        latency_secs: args.latency_secs,
        baseline,
        locked,
        rounds_p99_ms: rounds.rounds_p99_ms,
        slow_by_offset,
        lock_waiters_seen: rounds.lock_waiters_seen,
        goals,
    })
}

/// Prints `text` on stderr unless the report is printed as JSON.
fn say(json: bool, text: &str) {
    if !json {
        eprintln!("  {text}");
    }
}

/// The stage (PostgreSQL, PgBouncer, the demo's `saas`), a pool of 2 on the state database
/// (prepared for pgbench), and deprov serving intake only; returns them with the number of
/// intake's group writers configured.
async fn start(
    args: &IntakeArgs,
) -> Result<(Stage, sqlx::PgPool, stage::RunningDeprov, usize), ReplayError> {
    let bouncer = BouncerOptions {
        default_pool_size: args.pool_size,
        max_client_conn: 100 + args.lock_waiters,
        ..BouncerOptions::default()
    };
    let size = DemoSize {
        small_tenants: 20,
        large_tenant_rows: 5_000,
    };
    let settings: Vec<(String, String)> = [("min_wal_size".to_owned(), "1GB".to_owned())]
        .into_iter()
        .chain(args.server_settings.iter().cloned())
        .collect();
    let stage = Stage::start(&size, &[], &bouncer, &settings).await?;
    let state = connect(&stage.pg.url("deprov"), 2).await?;
    pgbench::prepare(&state).await?;
    let (config, group_writers) = config(args.group_writers)?;
    let deprov = stage
        .start_deprov_with(&config, "saas", false, !args.direct)
        .await?;
    Ok((stage, state, deprov, group_writers))
}

/// Where the bench's HTTP clients send their deletion requests, each for a new tenant.
struct Requests<'a> {
    /// The HTTP client.
    client: reqwest::Client,
    /// deprov's base URL.
    base: &'a str,
    /// The next tenant's number (above 20,000,000).
    next: Arc<AtomicUsize>,
}

/// The throughput phase's figures.
struct Throughput {
    /// Every request of the phase.
    shots: Vec<Shot>,
    /// Rows the phase added to `deprov.deletion_requests`.
    durable: i64,
    /// Requests answered 202.
    accepted: usize,
    /// Requests not answered 202.
    errors: usize,
    /// Accepted requests per second.
    intake_per_s: f64,
}

/// A 1 s warm-up, then the throughput phase: the closed loop for `--secs`, and the rows it stored
/// in the state database (`state`).
async fn throughput(
    args: &IntakeArgs,
    requests: &Requests<'_>,
    state: &sqlx::PgPool,
) -> Result<Throughput, ReplayError> {
    let Requests { client, base, next } = requests;
    say(args.json, "warm-up: 1 s");
    closed_loop(client, base, next, args.concurrency, Duration::from_secs(1)).await;
    say(args.json, "throughput: closed loop");
    let before = stored(state).await?;
    let secs = Duration::from_secs(args.secs);
    let (shots, elapsed) = closed_loop(client, base, next, args.concurrency, secs).await;
    let durable = stored(state).await? - before;
    let (accepted, _, errors) = load::counts(&shots);
    let intake_per_s = accepted as f64 / elapsed.as_secs_f64();
    Ok(Throughput {
        shots,
        durable,
        accepted,
        errors,
        intake_per_s,
    })
}

/// pgbench's single-row `INSERT`s on the state database (`state`), through the same path as
/// deprov's (PgBouncer, or directly with `--direct`).
async fn pgbench_phase(
    args: &IntakeArgs,
    stage: &Stage,
    state: &sqlx::PgPool,
) -> Result<PgbenchResult, ReplayError> {
    say(args.json, "pgbench: single-row INSERTs on the same server");
    let (port, mode) = if args.direct {
        (stage.pg.port(), "prepared")
    } else {
        (stage.bouncer.port(), "extended")
    };
    pgbench::run(state, port, args.pgbench_clients, args.secs, mode).await
}

/// The latency phases' requests, each condition's segments together.
struct Rounds {
    /// The requests of the segments with the target idle.
    idle: Vec<Shot>,
    /// The requests of the segments with the target saturated with lock waits.
    saturated: Vec<Shot>,
    /// Sessions waiting on a lock in the target, the lowest reading.
    lock_waiters_seen: i64,
    /// Each round's p99 in ms: `[target idle, target saturated]`.
    rounds_p99_ms: Vec<[f64; 2]>,
}

/// The latency phases at `rate` requests/s: `--latency-rounds` rounds, each a checkpoint, a
/// segment with the target idle, then one with it saturated with lock waits.
async fn latency_rounds(
    args: &IntakeArgs,
    stage: &Stage,
    requests: &Requests<'_>,
    rate: f64,
) -> Result<Rounds, ReplayError> {
    let Requests { client, base, next } = requests;
    let (mut idle, mut saturated) = (Vec::new(), Vec::new());
    let mut lock_waiters_seen = i64::MAX;
    let mut rounds_p99_ms = Vec::new();
    for _ in 0..args.latency_rounds.max(1) {
        // Between segments, not in one: the WAL written so far becomes recycled segments (kept up
        // to `min_wal_size`) and the dirty data is written now, not in a kernel writeback burst.
        crate::bench::side::checkpoint(&stage.direct).await?;
        let quiet = fixed_rate(client, base, next, rate, args.latency_secs).await;
        let saturation = Saturation::start(stage, args.lock_waiters).await?;
        let at_start = saturation.waiters(stage).await?;
        let locked = fixed_rate(client, base, next, rate, args.latency_secs).await;
        let at_end = saturation.waiters(stage).await?;
        saturation.release().await?;
        lock_waiters_seen = lock_waiters_seen.min(at_start).min(at_end);
        rounds_p99_ms.push([
            load::quantile_ms(&quiet, 0.99),
            load::quantile_ms(&locked, 0.99),
        ]);
        idle.extend(quiet);
        saturated.extend(locked);
    }
    Ok(Rounds {
        idle,
        saturated,
        lock_waiters_seen,
        rounds_p99_ms,
    })
}

/// The bench's goals: every accepted request durable, intake at least pgbench's rate (`ratio`),
/// and the saturated p99 within 1.5× the idle one with no errors.
fn goals(
    t: &Throughput,
    pgbench: &PgbenchResult,
    ratio: f64,
    baseline: &LatencyPhase,
    locked: &LatencyPhase,
) -> Vec<Goal> {
    let (accepted, durable, intake_per_s) = (t.accepted, t.durable, t.intake_per_s);
    vec![
        Goal::new(
            format!("every accepted request is durable ({accepted} accepted, {durable} rows)"),
            accepted as i64 == durable,
        ),
        Goal::new(
            format!(
                "intake ≥ 1.0× pgbench's single-row INSERT rate ({intake_per_s:.0}/s vs {:.0}/s = {ratio:.2}×)",
                pgbench.tps
            ),
            ratio >= 1.0,
        ),
        Goal::new(
            format!(
                "intake p99 with the target saturated with lock waits ≤ 1.5× baseline ({:.1} ms vs {:.1} ms = {:.2}×), \
                 no errors in either phase ({} and {})",
                locked.p99_ms,
                baseline.p99_ms,
                super::ratio(locked.p99_ms, baseline.p99_ms),
                baseline.errors,
                locked.errors
            ),
            baseline.errors == 0 && locked.errors == 0 && locked.p99_ms <= 1.5 * baseline.p99_ms,
        ),
    ]
}

/// [`stage::deprov_config`] with its `group_writers = …` line (`[intake]`) set to `writers` when
/// given, and the number of writers it configures.
///
/// # Errors
/// [`ReplayError::Run`] when the configuration has no such line with a number.
fn config(writers: Option<usize>) -> Result<(String, usize), ReplayError> {
    let config = stage::deprov_config();
    let mut configured = None;
    let lines: Vec<String> = config
        .lines()
        .map(|l| match l.strip_prefix("group_writers = ") {
            Some(rest) => {
                let (value, comment) = rest.split_at(rest.find('#').unwrap_or(rest.len()));
                configured = writers.or_else(|| value.trim().parse().ok());
                format!("group_writers = {} {comment}", configured.unwrap_or(0))
            }
            None => l.to_owned(),
        })
        .collect();
    match configured {
        Some(n) => Ok((lines.join("\n"), n)),
        None => Err(ReplayError::Run(
            "the bench configuration has no `group_writers = N` line".into(),
        )),
    }
}

/// How many of `shots` (each counted from its own segment's start) took longer than `over_ms`,
/// by half second of the segment (`secs` long).
fn slow_by_offset(shots: &[Shot], over_ms: f64, secs: u64) -> Vec<usize> {
    let buckets = usize::try_from(secs * 2).unwrap_or(0).max(1);
    let mut counts = vec![0; buckets];
    for shot in shots {
        if shot.outcome == Outcome::Ok && shot.latency.as_secs_f64() * 1000.0 > over_ms {
            let half = (shot.at.as_secs_f64() * 2.0) as usize;
            counts[half.min(buckets - 1)] += 1;
        }
    }
    counts
}

/// Rows in `deprov.deletion_requests`.
async fn stored(pool: &sqlx::PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM deprov.deletion_requests")
        .fetch_one(pool)
        .await
}

/// `clients` HTTP clients, each sending a request for a new tenant as soon as its last one was
/// answered, for `length`. Returns every request and the time the phase took.
async fn closed_loop(
    client: &reqwest::Client,
    base: &str,
    next: &Arc<AtomicUsize>,
    clients: usize,
    length: Duration,
) -> (Vec<Shot>, Duration) {
    let started = Instant::now();
    let end = started + length;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (client, base, next) = (client.clone(), base.to_owned(), next.clone());
        tasks.spawn(async move {
            let mut shots = Vec::new();
            while Instant::now() < end {
                let tenant = (20_000_000 + next.fetch_add(1, Ordering::Relaxed)).to_string();
                let at = started.elapsed();
                let outcome = answer(stage::post_request(&client, &base, &tenant, None).await);
                shots.push(Shot {
                    at,
                    latency: started.elapsed() - at,
                    outcome,
                });
            }
            shots
        });
    }
    let mut all = Vec::new();
    while let Some(shots) = tasks.join_next().await {
        all.extend(shots.unwrap_or_default());
    }
    (all, started.elapsed())
}

fn answer(result: Result<u16, String>) -> Outcome {
    match result {
        Ok(202) => Outcome::Ok,
        Ok(status) => Outcome::Error(format!("HTTP {status}")),
        Err(e) => Outcome::Error(e),
    }
}

/// `rate` requests/s (new tenants), open loop, for `secs`.
async fn fixed_rate(
    client: &reqwest::Client,
    base: &str,
    next: &Arc<AtomicUsize>,
    rate: f64,
    secs: u64,
) -> Vec<Shot> {
    let (client, base, next) = (client.clone(), Arc::new(base.to_owned()), next.clone());
    let running = load::start(vec![(Duration::from_secs(secs), rate)], move |_| {
        let (client, base, next) = (client.clone(), base.clone(), next.clone());
        async move {
            let tenant = (20_000_000 + next.fetch_add(1, Ordering::Relaxed)).to_string();
            answer(stage::post_request(&client, &base, &tenant, None).await)
        }
    });
    running.finish(Duration::from_secs(30)).await
}

impl LatencyPhase {
    /// The figures of `shots` (one condition's segments together).
    fn of(shots: &[Shot]) -> Self {
        let (accepted, _, errors) = load::counts(shots);
        Self {
            sent: shots.len(),
            accepted,
            errors,
            error_kinds: load::error_kinds(shots),
            p99_ms: load::quantile_ms(shots, 0.99),
            p50_ms: load::quantile_ms(shots, 0.5),
        }
    }
}

/// The target saturated with lock waits: a holder of an exclusive lock on `app.accounts` and
/// sessions queued behind it, all directly on PostgreSQL.
struct Saturation {
    holder: PgConnection,
    waiters: tokio::task::JoinSet<()>,
}

impl Saturation {
    /// Takes the lock and starts `n` waiters; returns once PostgreSQL shows `n` sessions waiting
    /// (polled, at most 30 s).
    async fn start(stage: &Stage, n: u32) -> Result<Self, ReplayError> {
        let url = stage.pg.url("saas");
        let mut holder = PgConnection::connect(&url).await?;
        sqlx::raw_sql("BEGIN; LOCK TABLE app.accounts IN ACCESS EXCLUSIVE MODE")
            .execute(&mut holder)
            .await?;
        let mut waiters = tokio::task::JoinSet::new();
        for _ in 0..n {
            let url = url.clone();
            waiters.spawn(async move {
                if let Ok(mut conn) = PgConnection::connect(&url).await {
                    let _ = sqlx::query("SELECT count(*) FROM app.accounts")
                        .execute(&mut conn)
                        .await;
                    let _ = conn.close().await;
                }
            });
        }
        let saturation = Self { holder, waiters };
        let deadline = Instant::now() + Duration::from_secs(30);
        while saturation.waiters(stage).await? < i64::from(n) {
            if Instant::now() > deadline {
                return Err(ReplayError::Run(format!(
                    "{n} lock waiters did not appear in 30 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(saturation)
    }

    /// Sessions of `saas` waiting on a lock now.
    async fn waiters(&self, stage: &Stage) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'saas' AND wait_event_type = 'Lock'",
        )
        .fetch_one(&stage.direct)
        .await
    }

    /// Releases the lock and waits for the waiters to finish.
    async fn release(mut self) -> Result<(), ReplayError> {
        sqlx::raw_sql("ROLLBACK").execute(&mut self.holder).await?;
        while self.waiters.join_next().await.is_some() {}
        self.holder.close().await?;
        Ok(())
    }
}

impl IntakeReport {
    /// The printed table and goal lines.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let mut line =
            |name: &str, value: String| out.push_str(&format!("{name:<60} {value:>16}\n"));
        line("path to PostgreSQL", self.via.clone());
        line("intake group writers", self.group_writers.to_string());
        line(
            &format!(
                "intake, {} HTTP clients, {} s: accepted (errors)",
                self.concurrency, self.secs
            ),
            format!("{} ({})", self.accepted, self.errors),
        );
        for (what, count) in &self.error_kinds {
            line(&format!("    {what}"), count.to_string());
        }
        line(
            "  rows stored in deprov.deletion_requests",
            self.durable.to_string(),
        );
        line(
            "  accepted and durable requests/s",
            format!("{:.0}", self.intake_per_s),
        );
        line(
            "  p99 at saturation (ms)",
            format!("{:.1}", self.saturated_p99_ms),
        );
        line(
            &format!(
                "pgbench single-row INSERT, {} clients: tps",
                self.pgbench_clients
            ),
            format!("{:.0}", self.pgbench.tps),
        );
        line(
            "  transactions (rows counted)",
            format!("{} ({})", self.pgbench.transactions, self.pgbench.rows),
        );
        line("intake ÷ pgbench", format!("{:.2}", self.ratio));
        out.push_str(&format!(
            "latency: {} rounds of {} s target idle, then {} s target saturated\n",
            self.latency_rounds, self.latency_secs, self.latency_secs
        ));
        let mut phase = |name: &str, p: &LatencyPhase| {
            out.push_str(&format!(
                "{:<60} {:>16}\n",
                format!("{name} at {:.0} req/s: p50 / p99 (ms)", self.rate),
                format!("{:.1} / {:.1}", p.p50_ms, p.p99_ms)
            ));
            out.push_str(&format!(
                "{:<60} {:>16}\n",
                "  sent (accepted, errors)",
                format!("{} ({}, {})", p.sent, p.accepted, p.errors)
            ));
            for (what, count) in &p.error_kinds {
                out.push_str(&format!("{:<60} {count:>16}\n", format!("    {what}")));
            }
        };
        phase("intake, target idle", &self.baseline);
        phase("intake, target saturated with lock waits", &self.locked);
        let rounds: Vec<String> = self
            .rounds_p99_ms
            .iter()
            .map(|[idle, locked]| format!("{idle:.1}/{locked:.1}"))
            .collect();
        out.push_str(&format!(
            "  p99 by round, idle/saturated (ms): {}\n",
            rounds.join("  ")
        ));
        let [quiet, locked] = &self.slow_by_offset;
        out.push_str(&format!(
            "  requests over the idle p99 by 0.5 s of their segment: idle {quiet:?}, saturated {locked:?}\n"
        ));
        out.push_str(&format!(
            "{:<60} {:>16}\n",
            "  sessions waiting on a lock in the target (lowest reading)", self.lock_waiters_seen
        ));
        out.push('\n');
        out.push_str(&super::goal_lines(&self.goals));
        out
    }
}
