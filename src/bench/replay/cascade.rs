//! `deprov-lab bench cascade-incident`: incident 1 (the cascading account delete) replayed through PgBouncer.
//!
//! Procedure, on one [`Stage`] (`saas` holds one tenant of `--rows` rows and `--small-tenants` others;
//! `saas_cascade` is a copy; PgBouncer in transaction mode with `--pool-size` servers per database and
//! `--max-client-conn`):
//! 1. Baseline: the [`Foreground`] (other tenants' reads and writes, `--fg-rate` ops/s) on `saas` for
//!    `--baseline-secs`: its p99 is the baseline.
//! 2. Naive, on `saas_cascade`, with the foreground running there: a request handler that runs
//!    `DELETE FROM app.accounts WHERE id = $1` (one transaction, cascading through every table), then
//!    `--retries` retries of the same request, one every `--retry-interval-ms`, each a new client
//!    connection running the same `DELETE` — they queue behind the first one's row lock, each holding
//!    a PgBouncer server meanwhile.
//! 3. deprov, on `saas`, with the foreground running there: the same requests at the same times as
//!    `POST /v1/deletion-requests` (same `external_id`) to deprov serving in-process through the same
//!    PgBouncer (`DEPROV_POOLER_MODE=transaction`, `deploy/example.toml`), its worker deleting.
//!
//! Each side is watched by a [`Sampler`] (SHOW POOLS and locks every 50 ms) from 1 s before the
//! first request until the pooler is back at baseline: no client queued in PgBouncer, and no
//! foreground operation slower than the *slow* threshold (2× the baseline p99, at least the baseline
//! p99 + 10 ms) or failed, for 1 s. Finally the two databases are compared table by table.

use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{Connection as _, PgConnection};
use tokio::task::JoinSet;

use super::foreground::{Foreground, is_max_client_conn};
use super::load::{self, Outcome, Shot};
use super::sampler::{Peaks, Sampler, Series};
use super::stage::{self, Stage, connect};
use super::{Goal, ReplayError};
use crate::bench::side::Keys;
use deprov_demo::DemoSize;
use deprov_testkit::BouncerOptions;

/// `deprov-lab bench cascade-incident` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct CascadeArgs {
    /// Rows of the deleted tenant, over all its tables.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Other tenants (about 2,000 rows each); the foreground works on them.
    #[arg(long, default_value_t = 60)]
    pub small_tenants: u32,
    /// Retries of the deletion request after the first.
    #[arg(long, default_value_t = 20)]
    pub retries: usize,
    /// Time between two retries, in ms.
    #[arg(long, default_value_t = 25)]
    pub retry_interval_ms: u64,
    /// Foreground operations per second (other tenants' reads and writes).
    #[arg(long, default_value_t = 200)]
    pub fg_rate: u32,
    /// The foreground's connection pool cap (client connections to PgBouncer).
    #[arg(long, default_value_t = 150)]
    pub fg_max_conns: u32,
    /// PgBouncer `default_pool_size` (server connections per database).
    #[arg(long, default_value_t = 20)]
    pub pool_size: u32,
    /// PgBouncer `max_client_conn`.
    #[arg(long, default_value_t = 100)]
    pub max_client_conn: u32,
    /// Seconds of foreground alone, for its baseline p99.
    #[arg(long, default_value_t = 5)]
    pub baseline_secs: u64,
    /// Longest wait for the pooler to return to baseline after the deletion, in s.
    #[arg(long, default_value_t = 120)]
    pub recovery_timeout_secs: u64,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// One side's figures (the naive path's or deprov's).
#[derive(Debug, Clone, Serialize)]
pub struct IncidentSide {
    /// Deletion requests sent (the first and its retries).
    pub requests: usize,
    /// Requests that failed (a refused connection, a database error, a non-2xx answer).
    pub requests_failed: usize,
    /// The longest time one request took to answer, in ms.
    pub longest_request_ms: f64,
    /// From the first request until the tenant was deleted (naive: every request returned; deprov:
    /// its job completed), in s.
    pub deletion_s: f64,
    /// Jobs deprov created for the requests (naive: none).
    pub jobs: Option<i64>,
    /// Foreground operations started from the first request on.
    pub fg_ops: usize,
    /// Of those, failed ones.
    pub fg_errors: usize,
    /// Of the failed ones, refused by PgBouncer's `max_client_conn`.
    pub fg_max_client_conn_errors: usize,
    /// Foreground p99 latency (successful operations, from their scheduled start), in ms.
    pub fg_p99_ms: f64,
    /// The slowest successful foreground operation, in ms.
    pub fg_max_ms: f64,
    /// PgBouncer and lock peaks from the first request on.
    pub peaks: Peaks,
    /// Clients PgBouncer refused at `max_client_conn` (its log) from the first request on.
    pub max_client_conn_rejections: usize,
    /// From the first request until the pooler was last off baseline, in s (0: never).
    pub disturbed_s: f64,
    /// From the end of the deletion until the pooler was back at baseline, in s.
    pub recovery_s: f64,
    /// Whether it got back to baseline within `--recovery-timeout-secs`.
    pub recovered: bool,
}

/// Everything `deprov-lab bench cascade-incident` prints.
#[derive(Debug, Clone, Serialize)]
pub struct CascadeReport {
    /// Rows of the deleted tenant.
    pub tenant_rows: u64,
    /// Foreground p99 with no deletion, in ms.
    pub baseline_p99_ms: f64,
    /// A foreground operation slower than this is off baseline, in ms.
    pub slow_ms: f64,
    /// The naive cascading `DELETE` and its retries.
    pub naive: IncidentSide,
    /// deprov handling the same requests.
    pub deprov: IncidentSide,
    /// Whether the two databases are equal table by table afterwards.
    pub equals_cascade: bool,
    /// The goals, met or missed.
    pub goals: Vec<Goal>,
}

/// How the deletion requests of one side went.
struct Deletion {
    /// Each request's answer time, or its error.
    requests: Vec<Result<Duration, String>>,
    done: Instant,
    jobs: Option<i64>,
}

/// Runs the replay (see the module docs).
///
/// # Errors
/// [`ReplayError`] when a step cannot run.
pub async fn run(args: &CascadeArgs) -> Result<CascadeReport, ReplayError> {
    let say = |t: &str| {
        if !args.json {
            eprintln!("  {t}");
        }
    };
    let size = DemoSize {
        small_tenants: args.small_tenants,
        large_tenant_rows: args.rows,
    };
    let bouncer = BouncerOptions {
        default_pool_size: args.pool_size,
        max_client_conn: args.max_client_conn,
        ..BouncerOptions::default()
    };
    say("loading the demo schema, copying it, starting PgBouncer");
    let stage = Stage::start(&size, &["saas_cascade"], &bouncer, &[]).await?;
    let tenant = stage.tenants.large;
    let saas_direct = connect(&stage.pg.url("saas"), 2).await?;
    let keys = Keys::sample(&saas_direct, tenant, &stage.tenants.small).await?;
    let fg_rate = f64::from(args.fg_rate);

    say("baseline: the foreground alone");
    let fg = Foreground::start(
        &stage.bouncer.url("saas"),
        fg_rate,
        args.fg_max_conns,
        keys.foreground.clone(),
    )?;
    tokio::time::sleep(Duration::from_secs(args.baseline_secs)).await;
    let baseline = fg.stop(Duration::from_secs(30)).await;
    let baseline_p99_ms = load::quantile_ms(&baseline, 0.99);
    let slow_ms = (2.0 * baseline_p99_ms).max(baseline_p99_ms + 10.0);

    say("naive: a cascading DELETE and its retries, each on its own connection");
    let interval = Duration::from_millis(args.retry_interval_ms);
    let url = stage.bouncer.url("saas_cascade");
    let naive = watch(&stage, args, "saas_cascade", &keys, slow_ms, || async {
        Ok(naive_deletion(&url, tenant, args.retries, interval).await)
    })
    .await?;

    say("deprov: the same requests to deprov serving through the same PgBouncer");
    let deprov = stage
        .start_deprov(&stage::deprov_config(), "saas", true)
        .await?;
    let state = connect(&stage.pg.url("deprov"), 1).await?;
    let side = watch(&stage, args, "saas", &keys, slow_ms, || {
        deprov_deletion(&deprov.base, &state, tenant, args.retries, interval)
    })
    .await;
    deprov.stop().await;
    let deprov = side?;

    let copy = connect(&stage.pg.url("saas_cascade"), 2).await?;
    let equals_cascade = deprov_demo::database_digest(&saas_direct, "app").await?
        == deprov_demo::database_digest(&copy, "app").await?;
    let goals = goals(&naive, &deprov, equals_cascade, args.retries);
    Ok(CascadeReport {
        tenant_rows: stage.tenants.large_total_rows(),
        baseline_p99_ms,
        slow_ms,
        naive,
        deprov,
        equals_cascade,
        goals,
    })
}

/// Runs one side's deletion under the foreground on `db`, sampled, until the pooler is back at
/// baseline, and returns its figures.
async fn watch<F, Fut>(
    stage: &Stage,
    args: &CascadeArgs,
    db: &str,
    keys: &Keys,
    slow_ms: f64,
    delete: F,
) -> Result<IncidentSide, ReplayError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Deletion, ReplayError>>,
{
    sqlx::query("CHECKPOINT").execute(&stage.direct).await?;
    let rejections_before = stage.bouncer.max_client_conn_rejections();
    let sampler = Sampler::start(
        &stage.bouncer,
        &stage.pg.url("postgres"),
        db,
        Duration::from_millis(50),
    )
    .await?;
    let fg = Foreground::start(
        &stage.bouncer.url(db),
        f64::from(args.fg_rate),
        args.fg_max_conns,
        keys.foreground.clone(),
    )?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = Instant::now();
    let deletion = delete().await?;
    // Back at baseline: nothing off baseline for the last second, and at least a second after the end.
    let deadline = deletion.done + Duration::from_secs(args.recovery_timeout_secs);
    let recovered = loop {
        let last = last_disturbed(
            &fg.load.snapshot(),
            fg.load.started,
            &sampler.snapshot(),
            sampler.started,
            slow_ms,
        );
        let quiet_since = last.map_or(deletion.done, |l| l.max(deletion.done));
        if quiet_since.elapsed() >= Duration::from_secs(1) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let load_started = fg.load.started;
    let sampler_started = sampler.started;
    let shots = fg.stop(Duration::from_secs(30)).await;
    let series = sampler.stop().await;
    let rejections = stage.bouncer.max_client_conn_rejections() - rejections_before;

    let since_first = |at: Instant| at.saturating_duration_since(first);
    let from = first.saturating_duration_since(load_started);
    let fg_after: Vec<&Shot> = shots.iter().filter(|s| s.at >= from).collect();
    let peaks = series.peaks(
        first.saturating_duration_since(sampler_started),
        Duration::MAX,
    );
    let last = last_disturbed(&shots, load_started, &series, sampler_started, slow_ms)
        .filter(|&l| l > first);
    let failed = deletion.requests.iter().filter(|r| r.is_err()).count();
    Ok(IncidentSide {
        requests: deletion.requests.len(),
        requests_failed: failed,
        longest_request_ms: deletion
            .requests
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .max()
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0),
        deletion_s: since_first(deletion.done).as_secs_f64(),
        jobs: deletion.jobs,
        fg_ops: fg_after.len(),
        fg_errors: fg_after
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Error(_)))
            .count(),
        fg_max_client_conn_errors: fg_after
            .iter()
            .filter(|s| is_max_client_conn(&s.outcome))
            .count(),
        fg_p99_ms: load::quantile_ms(fg_after.iter().copied(), 0.99),
        fg_max_ms: load::quantile_ms(fg_after.iter().copied(), 1.0),
        peaks,
        max_client_conn_rejections: rejections,
        disturbed_s: last.map_or(0.0, |l| since_first(l).as_secs_f64()),
        recovery_s: last.map_or(0.0, |l| {
            l.saturating_duration_since(deletion.done).as_secs_f64()
        }),
        recovered,
    })
}

/// The last moment the pooler was off baseline: a pool sample with a client queued, or the end of a
/// foreground operation that failed or took longer than `slow_ms`.
fn last_disturbed(
    shots: &[Shot],
    load_started: Instant,
    series: &Series,
    sampler_started: Instant,
    slow_ms: f64,
) -> Option<Instant> {
    let slow = Duration::from_secs_f64(slow_ms / 1000.0);
    let shot = shots
        .iter()
        .filter(|s| s.outcome != Outcome::Ok || s.latency > slow)
        .map(|s| load_started + s.end())
        .max();
    let queued = series
        .pools
        .iter()
        .filter(|p| p.cl_waiting > 0)
        .map(|p| sampler_started + p.t)
        .max();
    shot.max(queued)
}

/// The naive path: the first request and `retries` more, one every `interval`, each a handler with
/// its own connection running the cascading `DELETE` of the tenant's root row to completion.
async fn naive_deletion(url: &str, tenant: i64, retries: usize, interval: Duration) -> Deletion {
    let start = tokio::time::Instant::now();
    let mut set = JoinSet::new();
    for k in 0..=retries {
        let url = url.to_owned();
        set.spawn(async move {
            tokio::time::sleep_until(start + interval * k as u32).await;
            let began = Instant::now();
            naive_delete(&url, tenant)
                .await
                .map(|_| began.elapsed())
                .map_err(|e| e.to_string())
        });
    }
    let mut requests = Vec::new();
    while let Some(r) = set.join_next().await {
        requests.push(r.unwrap_or_else(|e| Err(e.to_string())));
    }
    Deletion {
        requests,
        done: Instant::now(),
        jobs: None,
    }
}

/// One naive request: connect, `DELETE` the root row (the schema's `ON DELETE CASCADE` removes the
/// rest in the same transaction), commit. A retry blocks on the first one's row lock, holding its
/// server connection, and then deletes nothing.
async fn naive_delete(url: &str, tenant: i64) -> Result<u64, sqlx::Error> {
    let mut conn = PgConnection::connect(url).await?;
    let mut tx = conn.begin().await?;
    let deleted = sqlx::query("DELETE FROM app.accounts WHERE id = $1")
        .persistent(false)
        .bind(tenant)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    conn.close().await?;
    Ok(deleted)
}

/// deprov: the same requests at the same times as `POST /v1/deletion-requests` with one
/// `external_id` (retries of one request), then waits for the tenant's jobs to end (at most 10 min).
async fn deprov_deletion(
    base: &str,
    state: &sqlx::PgPool,
    tenant: i64,
    retries: usize,
    interval: Duration,
) -> Result<Deletion, ReplayError> {
    deprov::sources::oidc::install_crypto_provider();
    let client = reqwest::Client::new();
    let start = tokio::time::Instant::now();
    let mut set = JoinSet::new();
    let external = format!("uninstall-{tenant}");
    for k in 0..=retries {
        let (client, base, external) = (client.clone(), base.to_owned(), external.clone());
        set.spawn(async move {
            tokio::time::sleep_until(start + interval * k as u32).await;
            let began = Instant::now();
            match stage::post_request(&client, &base, &tenant.to_string(), Some(&external)).await {
                Ok(status) if (200..300).contains(&status) => Ok(began.elapsed()),
                Ok(status) => Err(format!("HTTP {status}")),
                Err(e) => Err(e),
            }
        });
    }
    let mut requests = Vec::new();
    while let Some(r) = set.join_next().await {
        requests.push(r.unwrap_or_else(|e| Err(e.to_string())));
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let tenant_text = tenant.to_string();
    loop {
        let (jobs, open, failed): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE state NOT IN ('completed', 'failed')), \
                    count(*) FILTER (WHERE state = 'failed') \
             FROM deprov.jobs WHERE tenant_id = $1",
        )
        .bind(&tenant_text)
        .fetch_one(state)
        .await?;
        if jobs > 0 && open == 0 {
            if failed > 0 {
                return Err(ReplayError::Run(format!(
                    "deprov's job for tenant {tenant} failed"
                )));
            }
            return Ok(Deletion {
                requests,
                done: Instant::now(),
                jobs: Some(jobs),
            });
        }
        if Instant::now() > deadline {
            return Err(ReplayError::Run(format!(
                "deprov's job for tenant {tenant} did not end in 10 min"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn goals(naive: &IncidentSide, deprov: &IncidentSide, equals: bool, retries: usize) -> Vec<Goal> {
    vec![
        Goal::new(
            format!(
                "deprov: {} requests answered 2xx and recorded as one job ({} failed, {} job(s))",
                retries + 1,
                deprov.requests_failed,
                deprov.jobs.unwrap_or(0)
            ),
            deprov.requests_failed == 0 && deprov.jobs == Some(1),
        ),
        Goal::new(
            format!(
                "deprov: no foreground errors and no max_client_conn rejections ({} errors, {} rejections; naive: {}, {})",
                deprov.fg_errors,
                deprov.max_client_conn_rejections,
                naive.fg_errors,
                naive.max_client_conn_rejections
            ),
            deprov.fg_errors == 0 && deprov.max_client_conn_rejections == 0,
        ),
        Goal::new(
            format!(
                "deprov: no client queued in PgBouncer over 100 ms (maxwait peak {:.3} s; naive {:.3} s)",
                deprov.peaks.maxwait_s, naive.peaks.maxwait_s
            ),
            deprov.peaks.maxwait_s <= 0.1,
        ),
        Goal::new(
            format!(
                "deprov: pooler at baseline within 1 s of the deletion's end ({:.2} s; naive {:.2} s)",
                deprov.recovery_s, naive.recovery_s
            ),
            deprov.recovered && deprov.recovery_s <= 1.0,
        ),
        Goal::new(
            "deprov: the database equals the naive cascade's copy, table by table".into(),
            equals,
        ),
    ]
}

impl CascadeReport {
    /// The printed table and goal lines.
    pub fn to_text(&self) -> String {
        let (n, d) = (&self.naive, &self.deprov);
        let mut out = String::new();
        let mut both = |name: &str, f: &dyn Fn(&IncidentSide) -> String| {
            super::row(&mut out, name, f(n), f(d))
        };
        both("", &|s| {
            if s.jobs.is_some() {
                "deprov".into()
            } else {
                "naive".into()
            }
        });
        both("deletion requests (failed)", &|s| {
            format!("{} ({})", s.requests, s.requests_failed)
        });
        both("jobs created", &|s| {
            s.jobs.map_or("-".into(), |j| j.to_string())
        });
        both("longest request answer (ms)", &|s| {
            format!("{:.1}", s.longest_request_ms)
        });
        both("tenant deleted after (s)", &|s| {
            format!("{:.2}", s.deletion_s)
        });
        both("foreground ops (errors)", &|s| {
            format!("{} ({})", s.fg_ops, s.fg_errors)
        });
        both("  of which refused at max_client_conn", &|s| {
            s.fg_max_client_conn_errors.to_string()
        });
        both("foreground p99 (ms)", &|s| format!("{:.1}", s.fg_p99_ms));
        both("foreground p99 ÷ baseline p99", &|s| {
            format!("{:.2}", super::ratio(s.fg_p99_ms, self.baseline_p99_ms))
        });
        both("foreground slowest (ms)", &|s| {
            format!("{:.1}", s.fg_max_ms)
        });
        both("PgBouncer clients active+waiting, peak", &|s| {
            s.peaks.clients.to_string()
        });
        both("PgBouncer cl_waiting, peak", &|s| {
            s.peaks.cl_waiting.to_string()
        });
        both("PgBouncer maxwait, peak (s)", &|s| {
            format!("{:.3}", s.peaks.maxwait_s)
        });
        both("PgBouncer max_client_conn rejections (log)", &|s| {
            s.max_client_conn_rejections.to_string()
        });
        both("locks granted (pg_locks), peak", &|s| {
            s.peaks.locks_granted.to_string()
        });
        both("locks waiting (pg_locks), peak", &|s| {
            s.peaks.locks_waiting.to_string()
        });
        both("sessions waiting on a lock, peak", &|s| {
            s.peaks.lock_waiters.to_string()
        });
        both("pool samples (every 50 ms)", &|s| {
            s.peaks.samples.to_string()
        });
        both("off baseline for, from the first request (s)", &|s| {
            format!("{:.2}", s.disturbed_s)
        });
        both("back at baseline after the deletion (s)", &|s| {
            if s.recovered {
                format!("{:.2}", s.recovery_s)
            } else {
                "not yet".into()
            }
        });
        out.push_str(&format!(
            "
tenant rows {}; foreground baseline p99 {:.2} ms; off baseline = a client queued in PgBouncer, \
             or a foreground op failed or slower than {:.1} ms\n",
            self.tenant_rows, self.baseline_p99_ms, self.slow_ms
        ));
        out.push_str(&format!(
            "naive path reproduced the pile-up (clients queued in PgBouncer): {}\n",
            if self.naive.peaks.cl_waiting > 0 {
                "yes"
            } else {
                "no"
            }
        ));
        out.push_str(&super::goal_lines(&self.goals));
        out
    }
}
