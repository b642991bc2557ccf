//! `deprov-lab bench deadline-incident`: incident 2 (deadlines that destroyed the pool) replayed through
//! PgBouncer.
//!
//! PgBouncer runs in transaction mode with `--pool-size` servers per database. Two callers, one after
//! the other, each at `--base-rate` requests/s for `--warmup-secs`, then `--burst-factor`× that for
//! `--burst-secs` (the cron burst), then the base rate again for `--after-secs`, every request with a
//! `--deadline-ms` caller deadline, and every statement holding its server for `--service-ms`:
//! - **deprov**: `POST /v1/deletion-requests` (a distinct tenant each) to deprov serving in-process
//!   through PgBouncer (`DEPROV_POOLER_MODE=transaction`, intake pool of 8, no worker). The service
//!   time is a trigger on `deprov.deletion_requests` sleeping `--service-ms` (a slow state database):
//!   once per `INSERT` statement with `--service-per statement` (the default: a database slow per
//!   round trip, e.g. a stalled disk; intake's group commit stores a group of requests in one
//!   statement, as the naive client runs one statement per request), or once per stored row with
//!   `--service-per row` (a database slow per row: a group of n requests holds its server n × the
//!   service time, so a full group outlasts a short deadline).
//!   At the deadline the HTTP client gives up; deprov's handler carries on in its own task and its
//!   connection goes back to its pool.
//! - **naive**: a lookup (`SELECT pg_sleep(service), (SELECT count(*) FROM app.users WHERE
//!   account_id = $2)`) from a sqlx pool of `--client-conns` connections that, when the deadline fires
//!   while it holds a connection, closes that connection and opens a new one for the next request
//!   (the pgx behaviour of the incident; no CancelRequest is sent).
//!
//! The default base rate is half the pool's capacity (`pool_size / service time`), so the burst asks
//! for 1.5× what the pool can serve and requests queue in PgBouncer past their deadline. From the
//! burst's start to the end of the after-period it counts server connections opened
//! (`pg_stat_database.sessions` and PgBouncer's `new connection to server` log lines of the database)
//! and closed, and the lowest number of usable servers (`SHOW POOLS` every 50 ms).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::load::{self, Outcome, Shot};
use super::sampler::Sampler;
use super::stage::{self, Stage, connect};
use super::{Goal, ReplayError};
use deprov_demo::DemoSize;
use deprov_testkit::BouncerOptions;

/// `deprov-lab bench deadline-incident` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct DeadlineArgs {
    /// PgBouncer `default_pool_size`: server connections per database.
    #[arg(long, default_value_t = 4)]
    pub pool_size: u32,
    /// Server time of every request, in ms.
    #[arg(long, default_value_t = 10)]
    pub service_ms: u64,
    /// Base rate in requests/s (default: half of pool_size ÷ service time).
    #[arg(long)]
    pub base_rate: Option<f64>,
    /// The burst's rate as a multiple of the base rate.
    #[arg(long, default_value_t = 3.0)]
    pub burst_factor: f64,
    /// The callers' deadline, in ms.
    #[arg(long, default_value_t = 200)]
    pub deadline_ms: u64,
    /// Seconds at the base rate before the burst.
    #[arg(long, default_value_t = 2)]
    pub warmup_secs: u64,
    /// Seconds of burst.
    #[arg(long, default_value_t = 3)]
    pub burst_secs: u64,
    /// Seconds at the base rate after the burst (still counted).
    #[arg(long, default_value_t = 3)]
    pub after_secs: u64,
    /// The naive client's connection pool (deprov's intake pool has 8).
    #[arg(long, default_value_t = 8)]
    pub client_conns: u32,
    /// What the service time is charged on, on deprov's side (the naive client runs one statement
    /// per request, so for it both are the same).
    #[arg(long, value_enum, default_value_t = ServicePer::Statement)]
    pub service_per: ServicePer,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// What the bench's slow state database charges its service time on (`--service-per`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ServicePer {
    /// Once per `INSERT` statement (a `FOR EACH STATEMENT` trigger).
    Statement,
    /// Once per stored row (a `FOR EACH ROW` trigger).
    Row,
}

/// One caller's figures.
#[derive(Debug, Clone, Serialize)]
pub struct DeadlineSide {
    /// Requests sent (warm-up, burst and after).
    pub sent: usize,
    /// Answered in time (deprov: 202).
    pub ok: usize,
    /// The caller's deadline fired first.
    pub deadline_fired: usize,
    /// Failed otherwise (deprov: a non-2xx status such as 503).
    pub errors: usize,
    /// Those failures by error text (`HTTP 503`, a transport error, …), counted.
    pub error_kinds: std::collections::BTreeMap<String, usize>,
    /// p99 of the requests answered in time, in ms.
    pub p99_ms: f64,
    /// Server connections opened from the burst's start to the end (PgBouncer's log, this database).
    pub server_logins: usize,
    /// `pg_stat_database.sessions` of the database over the same window.
    pub sessions: i64,
    /// Server connections PgBouncer closed over the same window (its log, this database).
    pub server_closes: usize,
    /// Why PgBouncer closed those server connections (its log's reasons, counted).
    pub close_reasons: std::collections::BTreeMap<String, usize>,
    /// Usable server connections (active + idle + used) when the burst started.
    pub usable_at_burst: i64,
    /// The lowest usable server connections from the burst's start to the end.
    pub lowest_usable: i64,
    /// Highest `cl_waiting` over the window.
    pub peak_cl_waiting: i64,
    /// Highest `maxwait` over the window, in s.
    pub peak_maxwait_s: f64,
    /// deprov: deletion requests stored (answered or not: a caller that gave up finds its request
    /// stored when it retries); naive: none.
    pub recorded: Option<i64>,
}

/// Everything `deprov-lab bench deadline-incident` prints.
#[derive(Debug, Clone, Serialize)]
pub struct DeadlineReport {
    /// PgBouncer's servers per database.
    pub pool_size: u32,
    /// Base and burst rates, requests/s.
    pub base_rate: f64,
    /// The burst's rate.
    pub burst_rate: f64,
    /// The callers' deadline, ms.
    pub deadline_ms: u64,
    /// Server time of every statement (or row, see `service_per`), ms.
    pub service_ms: u64,
    /// What deprov's side is charged the service time on.
    pub service_per: ServicePer,
    /// deprov's intake.
    pub deprov: DeadlineSide,
    /// The naive client.
    pub naive: DeadlineSide,
    /// The goals.
    pub goals: Vec<Goal>,
}

/// Runs the replay (see the module docs).
///
/// # Errors
/// [`ReplayError`] when a step cannot run.
pub async fn run(args: &DeadlineArgs) -> Result<DeadlineReport, ReplayError> {
    let bouncer = BouncerOptions {
        default_pool_size: args.pool_size,
        ..BouncerOptions::default()
    };
    let size = DemoSize {
        small_tenants: 20,
        large_tenant_rows: 5_000,
    };
    let stage = Stage::start(&size, &[], &bouncer, &[]).await?;
    let service = Duration::from_millis(args.service_ms);
    let base_rate = args
        .base_rate
        .unwrap_or(0.5 * f64::from(args.pool_size) / service.as_secs_f64().max(0.001));
    let burst_rate = base_rate * args.burst_factor;
    let deadline = Duration::from_millis(args.deadline_ms);
    let segments = vec![
        (Duration::from_secs(args.warmup_secs), base_rate),
        (Duration::from_secs(args.burst_secs), burst_rate),
        (Duration::from_secs(args.after_secs), base_rate),
    ];

    let state = slow_state_database(&stage, args.service_per, service).await?;
    let deprov_side = deprov_side(&stage, &state, args, deadline, segments.clone()).await?;
    let naive_side = naive_side(&stage, args, deadline, service, segments).await?;

    let goals = goals(args.pool_size, &deprov_side, &naive_side);
    Ok(DeadlineReport {
        pool_size: args.pool_size,
        base_rate,
        burst_rate,
        deadline_ms: args.deadline_ms,
        service_ms: args.service_ms,
        service_per: args.service_per,
        deprov: deprov_side,
        naive: naive_side,
        goals,
    })
}

/// deprov's slow state database: every insert statement, or every stored row (`per`), holds its
/// server `service`. Returns a pool of 1 on it, directly on PostgreSQL.
async fn slow_state_database(
    stage: &Stage,
    per: ServicePer,
    service: Duration,
) -> Result<PgPool, ReplayError> {
    let state = connect(&stage.pg.url("deprov"), 1).await?;
    sqlx::raw_sql(
        "CREATE TABLE public.bench_service_time (seconds float8 NOT NULL);
         CREATE FUNCTION public.bench_service_time() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep((SELECT seconds FROM public.bench_service_time)); RETURN NULL; END $$;",
    )
    .execute(&state)
    .await?;
    sqlx::raw_sql(match per {
        ServicePer::Statement => {
            "CREATE TRIGGER bench_service_time AFTER INSERT ON deprov.deletion_requests
               FOR EACH STATEMENT EXECUTE FUNCTION public.bench_service_time();"
        }
        ServicePer::Row => {
            "CREATE TRIGGER bench_service_time AFTER INSERT ON deprov.deletion_requests
               FOR EACH ROW EXECUTE FUNCTION public.bench_service_time();"
        }
    })
    .execute(&state)
    .await?;
    sqlx::query("INSERT INTO public.bench_service_time VALUES ($1)")
        .bind(service.as_secs_f64())
        .execute(&state)
        .await?;
    Ok(state)
}

/// deprov's side: deprov serving intake through PgBouncer, the load's requests (a distinct tenant
/// each, `deadline` each) over `segments`, and the requests stored in `state` after.
async fn deprov_side(
    stage: &Stage,
    state: &PgPool,
    args: &DeadlineArgs,
    deadline: Duration,
    segments: Vec<(Duration, f64)>,
) -> Result<DeadlineSide, ReplayError> {
    let deprov = stage
        .start_deprov(&stage::deprov_config(), "saas", false)
        .await?;
    let client = reqwest::Client::builder()
        .timeout(deadline)
        .build()
        .map_err(|e| ReplayError::Run(e.to_string()))?;
    let base = Arc::new(deprov.base.clone());
    let op = move |i: usize| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let tenant = (10_000_000 + i).to_string();
            match stage::post_request(&client, &base, &tenant, None).await {
                Ok(202) => Outcome::Ok,
                Ok(status) => Outcome::Error(format!("HTTP {status}")),
                Err(e) if e.starts_with(stage::TIMEOUT) => Outcome::Deadline,
                Err(e) => Outcome::Error(e),
            }
        }
    };
    let mut deprov_side = measure(stage, args, "deprov", segments, op).await?;
    deprov.stop().await;
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM deprov.deletion_requests")
        .fetch_one(state)
        .await?;
    deprov_side.recorded = Some(recorded);
    Ok(deprov_side)
}

/// The naive client's side: its lookups (`service` each, `deadline` each) over `segments`, from a
/// pool of `--client-conns` through PgBouncer.
async fn naive_side(
    stage: &Stage,
    args: &DeadlineArgs,
    deadline: Duration,
    service: Duration,
    segments: Vec<(Duration, f64)>,
) -> Result<DeadlineSide, ReplayError> {
    let pool = PgPoolOptions::new()
        .max_connections(args.client_conns)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(30))
        .test_before_acquire(false)
        .connect_lazy(&stage.bouncer.url("saas"))?;
    let accounts = stage.tenants.small.clone();
    let op = {
        let pool = pool.clone();
        move |i: usize| {
            let pool = pool.clone();
            let account = accounts[i % accounts.len()];
            async move { naive_lookup(&pool, deadline, service, account).await }
        }
    };
    let naive_side = measure(stage, args, "saas", segments, op).await?;
    pool.close().await;
    Ok(naive_side)
}

/// Runs the load on `db`'s pool and measures the window from the burst's start to the end.
async fn measure<F, Fut>(
    stage: &Stage,
    args: &DeadlineArgs,
    db: &str,
    segments: Vec<(Duration, f64)>,
    op: F,
) -> Result<DeadlineSide, ReplayError>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Outcome> + Send + 'static,
{
    let sampler = Sampler::start(
        &stage.bouncer,
        &stage.pg.url("postgres"),
        db,
        Duration::from_millis(50),
    )
    .await?;
    let running = load::start(segments, op);
    let burst_at = running.started + Duration::from_secs(args.warmup_secs);
    let end_at = burst_at + Duration::from_secs(args.burst_secs + args.after_secs);
    tokio::time::sleep_until(burst_at.into()).await;
    let reasons0 = stage.bouncer.server_close_reasons_of(db);
    let (sessions0, logins0, closes0) = (
        stage.sessions(db).await?,
        stage.bouncer.server_logins_of(db),
        stage.bouncer.server_closes_of(db),
    );
    let at_burst = sampler
        .snapshot()
        .pool_at(burst_at.saturating_duration_since(sampler.started))
        .unwrap_or_default();
    tokio::time::sleep_until(end_at.into()).await;
    let (sessions1, logins1, closes1) = (
        stage.sessions(db).await?,
        stage.bouncer.server_logins_of(db),
        stage.bouncer.server_closes_of(db),
    );
    let mut close_reasons = stage.bouncer.server_close_reasons_of(db);
    for (why, n) in reasons0 {
        if let Some(now) = close_reasons.get_mut(&why) {
            *now -= n;
        }
    }
    close_reasons.retain(|_, n| *n > 0);
    let sampler_started = sampler.started;
    let series = sampler.stop().await;
    let shots: Vec<Shot> = running.finish(Duration::from_secs(30)).await;
    let peaks = series.peaks(
        burst_at.saturating_duration_since(sampler_started),
        end_at.saturating_duration_since(sampler_started),
    );
    let (ok, deadline_fired, errors) = load::counts(&shots);
    Ok(DeadlineSide {
        sent: shots.len(),
        ok,
        deadline_fired,
        errors,
        error_kinds: load::error_kinds(&shots),
        p99_ms: load::quantile_ms(&shots, 0.99),
        server_logins: logins1 - logins0,
        sessions: sessions1 - sessions0,
        server_closes: closes1 - closes0,
        close_reasons,
        usable_at_burst: at_burst.usable(),
        lowest_usable: peaks.min_usable,
        peak_cl_waiting: peaks.cl_waiting,
        peak_maxwait_s: peaks.maxwait_s,
        recorded: None,
    })
}

/// One naive lookup: take a connection, run the query in a transaction; when the deadline fires
/// while the connection is held, close it (dropped without returning it: the socket closes) — the
/// pool opens a new one for a later request.
async fn naive_lookup(
    pool: &PgPool,
    deadline: Duration,
    service: Duration,
    account: i64,
) -> Outcome {
    let started = tokio::time::Instant::now();
    let mut conn = match tokio::time::timeout(deadline, pool.acquire()).await {
        Err(_) => return Outcome::Deadline,
        Ok(Err(e)) => return Outcome::Error(e.to_string()),
        Ok(Ok(conn)) => conn,
    };
    let work = async {
        use sqlx::Connection as _;
        let mut tx = conn.begin().await?;
        sqlx::query("SELECT pg_sleep($1), (SELECT count(*) FROM app.users WHERE account_id = $2)")
            .persistent(false)
            .bind(service.as_secs_f64())
            .bind(account)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    };
    match tokio::time::timeout_at(started + deadline, work).await {
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(e)) => Outcome::Error(e.to_string()),
        Err(_) => {
            drop(conn.detach());
            Outcome::Deadline
        }
    }
}

fn goals(pool_size: u32, d: &DeadlineSide, n: &DeadlineSide) -> Vec<Goal> {
    let room = i64::from(pool_size) - d.usable_at_burst;
    vec![
        Goal::new(
            format!(
                "deprov opened no server connection beyond its pool: {} opened with {} of {} in use at the \
                 burst, {} closed ({} sessions) (naive: {} opened, {} closed, {} sessions)",
                d.server_logins,
                d.usable_at_burst,
                pool_size,
                d.server_closes,
                d.sessions,
                n.server_logins,
                n.server_closes,
                n.sessions
            ),
            d.server_closes == 0 && (d.server_logins as i64) <= room && d.sessions <= room,
        ),
        Goal::new(
            format!(
                "deprov never drained its pool: lowest usable servers {} (at the burst {}) (naive: {}, at the burst {})",
                d.lowest_usable, d.usable_at_burst, n.lowest_usable, n.usable_at_burst
            ),
            d.lowest_usable >= d.usable_at_burst,
        ),
    ]
}

impl DeadlineReport {
    /// The printed table and goal lines.
    pub fn to_text(&self) -> String {
        let (d, n) = (&self.deprov, &self.naive);
        let mut out = String::new();
        let mut both = |name: &str, f: &dyn Fn(&DeadlineSide) -> String| {
            super::row(&mut out, name, f(n), f(d))
        };
        both("", &|s| {
            if s.recorded.is_some() {
                "deprov".into()
            } else {
                "naive".into()
            }
        });
        both("requests sent", &|s| s.sent.to_string());
        both("answered in time", &|s| s.ok.to_string());
        both("deadline fired", &|s| s.deadline_fired.to_string());
        both("other errors", &|s| s.errors.to_string());
        both("p99 of answered (ms)", &|s| format!("{:.1}", s.p99_ms));
        both("stored (deprov: rows in deletion_requests)", &|s| {
            s.recorded.map_or("-".into(), |r| r.to_string())
        });
        both("server connections opened (PgBouncer log)", &|s| {
            s.server_logins.to_string()
        });
        both("server connections opened (pg sessions)", &|s| {
            s.sessions.to_string()
        });
        both("server connections closed (PgBouncer log)", &|s| {
            s.server_closes.to_string()
        });
        both("usable servers at the burst's start", &|s| {
            s.usable_at_burst.to_string()
        });
        both("lowest usable servers", &|s| s.lowest_usable.to_string());
        both("PgBouncer cl_waiting, peak", &|s| {
            s.peak_cl_waiting.to_string()
        });
        both("PgBouncer maxwait, peak (s)", &|s| {
            format!("{:.3}", s.peak_maxwait_s)
        });
        for (name, side) in [("naive", n), ("deprov", d)] {
            for (what, count) in &side.error_kinds {
                out.push_str(&format!("{name}: {count} request(s) failed with: {what}\n"));
            }
        }
        for (name, side) in [("naive", n), ("deprov", d)] {
            for (why, count) in &side.close_reasons {
                out.push_str(&format!(
                    "{name}: {count} server connection(s) closed because: {why}\n"
                ));
            }
        }
        out.push_str(&format!(
            "\nPgBouncer pool {} servers per database; base {:.0} req/s, burst {:.0} req/s; deadline {} ms; \
             service time {} ms per {} (deprov's side); counts from the burst's start to the end\n",
            self.pool_size,
            self.base_rate,
            self.burst_rate,
            self.deadline_ms,
            self.service_ms,
            match self.service_per {
                ServicePer::Statement => "statement",
                ServicePer::Row => "stored row",
            }
        ));
        out.push_str(&super::goal_lines(&self.goals));
        out
    }
}
