//! Kill switches with acknowledgement, against real PostgreSQL and real worker loops (`Worker::run`
//! with its heartbeat, LISTEN connection and acknowledger): engage → last destructive statement
//! started, measured from timestamps PostgreSQL records; requests recorded while engaged; laggards
//! named by `--wait`; NOTIFY lost while a listener reconnects.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;
use deprov::config::Config;
use deprov::queue::kill_switch::Status;
use deprov::queue::{JobState, jobs};
use deprov::worker::{Progress, Worker};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::harness::{Env, config_hard, env_with_config};

const OPERATOR: &str = "operator-token-0123456789";
const SOURCE: &str = "billing-token-0123456789";

/// The fixture's configuration with `[worker]` heartbeat keys and a row rate limit per job.
fn config(heartbeat: &str, stale_after: &str, rate_limit: u32) -> String {
    config_hard(
        "batch_rows = 20\nmax_batch_rows = 20\nmax_batch_duration = \"800ms\"\nlock_timeout = \"100ms\"\ncascade_rows = 0",
        "installation",
        // Intake's per-source limit off: the senders below measure loss, not admission.
        &format!("[pacing]\nrate_limit = {rate_limit}\n[intake.rate_limit]\nper_second = 0\n"),
    )
    .replace(
        "max_attempts = 5\n",
        &format!(
            "max_attempts = 5\nheartbeat_interval = \"{heartbeat}\"\nstale_after = \"{stale_after}\"\n"
        ),
    )
}

/// Runs `deprov kill-switch ARGS` against the env's state database.
async fn cli(env: &Env, args: &[&str]) -> anyhow::Result<()> {
    let url = env.server.url("target");
    let mut argv = vec!["deprov", "kill-switch", "--database-url", &url];
    argv.extend_from_slice(args);
    deprov::cli::run(deprov::cli::Cli::parse_from(argv)).await
}

pub(crate) struct Workers {
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts `n` worker loops named `w1..wn`, listening on the state database when `listen`.
pub(crate) fn start_workers(env: &Env, n: usize, listen: bool) -> Workers {
    let cancel = CancellationToken::new();
    let tasks = (1..=n)
        .map(|i| {
            let url = listen.then(|| env.server.url("target"));
            let w = Worker::new(env.pools.clone(), env.config.clone(), format!("w{i}"))
                .with_notify_url(url);
            let c = cancel.clone();
            tokio::spawn(async move { w.run(c).await })
        })
        .collect();
    Workers { cancel, tasks }
}

impl Workers {
    pub(crate) async fn stop(self) {
        self.cancel.cancel();
        for t in self.tasks {
            t.await.unwrap();
        }
    }
}

pub(crate) async fn status(db: &PgPool) -> Status {
    let mut conn = db.acquire().await.unwrap();
    Status::read(&mut conn).await.unwrap()
}

/// Polls (5 ms) until `pred` holds, at most `secs`.
pub(crate) async fn until<F, Fut>(secs: u64, what: &str, mut pred: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !pred().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every `DELETE`/`UPDATE` statement on schema `app` logs its start (`statement_timestamp()`).
const LOG_DESTRUCTIVE: &str = r#"
CREATE TABLE public.destructive_log (at timestamptz NOT NULL, tbl text NOT NULL, op text NOT NULL,
    pid int NOT NULL DEFAULT pg_backend_pid());
CREATE FUNCTION public.log_destructive() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN INSERT INTO public.destructive_log (at, tbl, op) VALUES (statement_timestamp(), TG_TABLE_NAME, TG_OP); RETURN NULL; END $f$;
DO $d$ DECLARE t regclass; BEGIN
  FOR t IN SELECT c.oid::regclass FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'app' AND c.relkind = 'r' LOOP
    EXECUTE format('CREATE TRIGGER log_destructive BEFORE DELETE OR UPDATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION public.log_destructive()', t);
  END LOOP; END $d$;
"#;

/// Four more tenants (11..14) like the fixture's, with 40 events per deployment (~6,500 rows each).
const BIG_TENANTS: &str = r#"
INSERT INTO app.accounts SELECT a, 'acct ' || a, 'icfg_' || a FROM generate_series(11, 14) a;
INSERT INTO app.projects SELECT a * 100 + p, a, 'p' || p FROM generate_series(11, 14) a, generate_series(1, 10) p;
INSERT INTO app."Environments" SELECT pr.id * 10 + e, pr.id, 'env' || e FROM app.projects pr, generate_series(1, 3) e WHERE pr.account_id > 10;
INSERT INTO app.builds SELECT pr.id * 10 + b, pr.id FROM app.projects pr, generate_series(1, 2) b WHERE pr.account_id > 10;
INSERT INTO app.deployments SELECT e."Id" * 10 + d, e."Id", e."projectId" * 10 + 1 FROM app."Environments" e, generate_series(1, 4) d WHERE e."projectId" > 1000;
INSERT INTO app.events SELECT d.id, s, 'e' || s FROM app.deployments d, generate_series(1, 40) s WHERE d.id BETWEEN 100000 AND 500000;
ANALYZE;
"#;

/// Serves deprov's HTTP API on a free port; returns its base URL.
async fn serve_api(env: &Env, cancel: CancellationToken) -> String {
    let state = deprov::http::AppState::new(env.pools.clone(), env.config.clone(), Some(OPERATOR));
    let router = deprov::http::router(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await
            .unwrap()
    });
    format!("http://{address}")
}

#[tokio::test]
async fn engaged_mid_delete_the_last_destructive_statement_starts_within_a_second_and_no_request_is_lost()
 {
    let env = env_with_config(&config("200ms", "2s", 1000)).await;
    sqlx::raw_sql(BIG_TENANTS).execute(&env.db).await.unwrap();
    sqlx::raw_sql(LOG_DESTRUCTIVE)
        .execute(&env.db)
        .await
        .unwrap();
    let big: Vec<Uuid> = {
        let mut ids = Vec::new();
        for t in 11..=14 {
            ids.push(env.request(&t.to_string()).await);
        }
        ids
    };
    let workers = start_workers(&env, 4, true);
    // Every worker is mid-delete: running, with rows of its tenant deleted.
    until(
        30,
        "four jobs running with 200 rows deleted each",
        || async {
            let mut n = 0;
            for id in &big {
                let j = jobs::get(&env.db, *id).await.unwrap().unwrap();
                if j.state() == JobState::Running
                    && Progress::from_json(&j.progress).rows_deleted >= 200
                {
                    n += 1;
                }
            }
            n == 4
        },
    )
    .await;

    // Requests arrive over HTTP before, during and after the engage, from four senders.
    let stop_api = CancellationToken::new();
    let base = serve_api(&env, stop_api.clone()).await;
    let sending = Arc::new(AtomicBool::new(true));
    let senders: Vec<_> = (0..4)
        .map(|s| {
            let (base, sending) = (base.clone(), sending.clone());
            tokio::spawn(async move {
                let client = {
                    deprov::sources::oidc::install_crypto_provider();
                    reqwest::Client::new()
                };
                let mut answers: Vec<(u16, Value)> = Vec::new();
                let mut i = 0;
                while sending.load(Ordering::Acquire) {
                    // Nonexistent tenants (nothing to delete), one duplicate in five.
                    let tenant = 900_000 + s * 10_000 + if i % 5 == 4 { i - 1 } else { i };
                    let r = client
                        .post(format!("{base}/v1/deletion-requests"))
                        .bearer_auth(SOURCE)
                        .json(&json!({"tenant_id": tenant.to_string()}))
                        .send()
                        .await
                        .unwrap();
                    answers.push((r.status().as_u16(), r.json().await.unwrap()));
                    i += 1;
                }
                answers
            })
        })
        .collect();

    let engaged = tokio::time::Instant::now();
    cli(
        &env,
        &[
            "on",
            "--reason",
            "incident drill",
            "--actor",
            "alice",
            "--wait",
            "--timeout",
            "10s",
        ],
    )
    .await
    .expect("every live worker acknowledges");
    let acked_after = engaged.elapsed();
    // The promise of an acknowledgement: once `--wait` returned, no destructive statement starts.
    let waited: time::OffsetDateTime = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&env.db)
        .await
        .unwrap();
    let st = status(&env.db).await;
    let version = st.latest_version;
    assert_eq!(st.workers.len(), 4, "four live workers");
    assert!(st.pending(version).is_empty());
    until(20, "20 requests recorded while engaged", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM deprov.deletion_requests WHERE received_while_held",
        )
        .fetch_one(&env.db)
        .await
        .unwrap();
        n >= 20
    })
    .await;
    sending.store(false, Ordering::Release);
    let mut answers = Vec::new();
    for s in senders {
        answers.extend(s.await.unwrap());
    }
    // The four jobs stop at their next batch boundary, none completed.
    until(10, "all four jobs held", || async {
        let mut held = 0;
        for id in &big {
            held += usize::from(
                jobs::get(&env.db, *id).await.unwrap().unwrap().state() == JobState::Held,
            );
        }
        held == 4
    })
    .await;

    // Engage = the changing transaction's start (earlier than its commit: the figure errs long).
    let (engage_at, gap_ms, after_engage): (time::OffsetDateTime, f64, i64) = sqlx::query_as(
        "SELECT h.changed_at, \
           (extract(epoch FROM (SELECT max(at) FROM public.destructive_log) - h.changed_at) * 1000)::float8, \
           (SELECT count(*) FROM public.destructive_log WHERE at >= h.changed_at) \
         FROM deprov.kill_switch_history h WHERE h.version = $1",
    )
    .bind(version)
    .fetch_one(&env.db)
    .await
    .unwrap();
    // Each worker's own account of its last destructive statement, written with its
    // acknowledgement (one clock reading for both): it ended no later than that acknowledgement
    // (a heartbeat after it estimates the same end again, late by at most its own round trip), and
    // the latest of them no earlier than the last statement the target logged
    // (statement_timestamp(), its start).
    let accounts: Vec<(
        String,
        Option<time::OffsetDateTime>,
        Option<time::OffsetDateTime>,
    )> = sqlx::query_as(
        "SELECT id, last_destroyed_at, observed_at FROM deprov.workers \
             WHERE stopped_at IS NULL ORDER BY id",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(accounts.len(), 4, "{accounts:?}");
    for (id, last, observed) in &accounts {
        let (last, observed) = (
            last.expect("every worker deleted"),
            observed.expect("acked"),
        );
        assert!(
            last <= observed + time::Duration::milliseconds(5),
            "{id}: last destructive statement ended {last}, acknowledged at {observed}"
        );
    }
    let last_logged: time::OffsetDateTime =
        sqlx::query_scalar("SELECT max(at) FROM public.destructive_log")
            .fetch_one(&env.db)
            .await
            .unwrap();
    let latest = accounts.iter().filter_map(|(_, l, _)| *l).max().unwrap();
    assert!(
        latest >= last_logged,
        "the workers' latest {latest} is before the last logged statement start {last_logged}"
    );
    let shown: Value = reqwest::Client::new()
        .get(format!("{base}/v1/kill-switch"))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let shown: Vec<&str> = shown["live_workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["last_destroyed_at"].as_str())
        .collect();
    assert_eq!(
        shown.len(),
        4,
        "GET /v1/kill-switch shows each worker's: {shown:?}"
    );
    let statements: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT (at, pid)) FROM public.destructive_log")
            .fetch_one(&env.db)
            .await
            .unwrap();
    println!(
        "engage -> last destructive statement started: {gap_ms:.1} ms ({after_engage} logged statement \
         triggers at or after the engage, {statements} statements in all); --wait returned after {} ms",
        acked_after.as_millis()
    );
    assert!(
        statements > 20,
        "the workers were deleting ({statements} statements)"
    );
    assert!(
        gap_ms <= 1000.0,
        "last destructive statement {gap_ms} ms after the engage at {engage_at}"
    );
    let after_wait: i64 =
        sqlx::query_scalar("SELECT count(*) FROM public.destructive_log WHERE at > $1")
            .bind(waited)
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(
        after_wait, 0,
        "destructive statements started after every worker acknowledged"
    );
    for id in &big {
        let j = jobs::get(&env.db, *id).await.unwrap().unwrap();
        let p = Progress::from_json(&j.progress);
        assert!(p.rows_deleted > 0 && j.finished_at.is_none(), "{j:?}");
    }

    // Zero requests lost: every answer is 202 and its request is stored, attached to its job.
    let mut held_while_engaged = 0;
    for (status, body) in &answers {
        assert_eq!(*status, 202, "{body}");
        let id: Uuid = body["request_id"].as_str().unwrap().parse().unwrap();
        let job: Uuid = body["job_id"].as_str().unwrap().parse().unwrap();
        let (stored_job, while_held): (Uuid, bool) = sqlx::query_as(
            "SELECT job_id, received_while_held FROM deprov.deletion_requests WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&env.db)
        .await
        .expect("every answered request is recorded");
        assert_eq!(stored_job, job);
        held_while_engaged += usize::from(while_held);
    }
    let distinct: std::collections::BTreeSet<&str> = answers
        .iter()
        .map(|(_, b)| b["request_id"].as_str().unwrap())
        .collect();
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deprov.deletion_requests WHERE subject::bigint >= 900000",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(stored as usize, distinct.len());
    assert!(
        held_while_engaged >= 20,
        "requests received while engaged: {held_while_engaged}"
    );
    let running: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deprov.jobs WHERE state = 'running'")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(running, 0);
    stop_api.cancel();
    workers.stop().await;
    assert!(
        status(&env.db).await.workers.is_empty(),
        "stopped workers are not live"
    );
}

#[tokio::test]
async fn wait_names_a_live_worker_that_has_not_acknowledged_and_times_out() {
    let env = env_with_config(&config("100ms", "1s", 0)).await;
    let workers = start_workers(&env, 1, true);
    until(10, "w1 registered", || async {
        status(&env.db).await.workers.len() == 1
    })
    .await;
    // A worker whose process hangs: live (its heartbeat holds for an hour), acknowledging nothing.
    sqlx::query("INSERT INTO deprov.workers (id, live_until) VALUES ('stuck-worker', now() + interval '1 hour')")
        .execute(&env.db)
        .await
        .unwrap();
    let err = cli(
        &env,
        &["on", "--reason", "drill", "--wait", "--timeout", "500ms"],
    )
    .await
    .expect_err("times out");
    let message = err.to_string();
    assert!(
        message.contains("stuck-worker") && !message.contains("w1"),
        "{message}"
    );
    let st = status(&env.db).await;
    assert_eq!(
        st.pending(st.latest_version),
        vec!["stuck-worker".to_owned()]
    );
    let w1 = st.workers.iter().find(|w| w.id == "w1").unwrap();
    assert_eq!(w1.observed_version, st.latest_version);
    assert!(w1.listening);
    // Once it is no longer live, nothing is awaited.
    sqlx::query("UPDATE deprov.workers SET live_until = now() WHERE id = 'stuck-worker'")
        .execute(&env.db)
        .await
        .unwrap();
    cli(&env, &["off", "--wait", "--timeout", "5s"])
        .await
        .unwrap();
    workers.stop().await;
}

#[tokio::test]
async fn idle_workers_acknowledge_by_notify_and_after_a_lost_listener_sooner_than_their_heartbeat()
{
    // Heartbeats every 5 s: acknowledgements within a second come from LISTEN/NOTIFY or the re-read
    // after a reconnect, not from heartbeats.
    let env = env_with_config(&config("5s", "30s", 0)).await;
    let workers = start_workers(&env, 2, true);
    until(10, "two listening workers", || async {
        let st = status(&env.db).await;
        st.workers.len() == 2 && st.workers.iter().all(|w| w.listening)
    })
    .await;
    let acknowledged_within = |reason: &'static str| {
        let env = &env;
        async move {
            let started = tokio::time::Instant::now();
            cli(
                env,
                &["on", "--reason", reason, "--wait", "--timeout", "3s"],
            )
            .await
            .unwrap();
            started.elapsed()
        }
    };
    let by_notify = acknowledged_within("first").await;
    // The listeners' connections die; the next change's NOTIFY reaches nobody.
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'deprov-listener') t",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(killed, 2);
    let after_loss = acknowledged_within("second").await;
    println!(
        "acknowledged by 2 idle workers: {by_notify:?} by NOTIFY, {after_loss:?} after the listeners were killed"
    );
    assert!(by_notify < Duration::from_secs(1), "{by_notify:?}");
    assert!(after_loss < Duration::from_secs(2), "{after_loss:?}");
    workers.stop().await;
}

#[tokio::test]
async fn without_a_listener_workers_acknowledge_by_heartbeat() {
    let env = env_with_config(&config("100ms", "1s", 0)).await;
    let workers = start_workers(&env, 2, false);
    until(10, "two workers", || async {
        status(&env.db).await.workers.len() == 2
    })
    .await;
    cli(
        &env,
        &["on", "--reason", "no listener", "--wait", "--timeout", "3s"],
    )
    .await
    .unwrap();
    let st = status(&env.db).await;
    assert!(
        st.workers
            .iter()
            .all(|w| !w.listening && w.observed_version == st.latest_version)
    );
    workers.stop().await;
}

#[tokio::test]
async fn a_worker_that_reads_the_version_before_its_first_heartbeat_still_records_it() {
    let env = env_with_config(&config("100ms", "30s", 0)).await;
    cli(&env, &["on", "--reason", "drill"]).await.unwrap();
    cli(&env, &["off", "--reason", "drill over"]).await.unwrap();
    // The worker's first heartbeat (the INSERT that registers it) waits on an advisory lock this
    // test holds, so its acknowledger — woken once LISTEN is set up — reads the version while the
    // worker has no row yet. Every UPDATE of deprov.workers is logged, even one that updates nothing.
    sqlx::raw_sql(
        "CREATE TABLE public.workers_updates (at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE FUNCTION public.log_workers_update() RETURNS trigger LANGUAGE plpgsql AS
           $f$ BEGIN INSERT INTO public.workers_updates DEFAULT VALUES; RETURN NULL; END $f$;
         CREATE TRIGGER log_update AFTER UPDATE ON deprov.workers
           FOR EACH STATEMENT EXECUTE FUNCTION public.log_workers_update();
         CREATE FUNCTION public.hold_insert() RETURNS trigger LANGUAGE plpgsql AS
           $f$ BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN NEW; END $f$;
         CREATE TRIGGER hold_insert BEFORE INSERT ON deprov.workers
           FOR EACH ROW EXECUTE FUNCTION public.hold_insert();",
    )
    .execute(&env.db)
    .await
    .unwrap();
    let mut gate = env.db.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut *gate)
        .await
        .unwrap();
    let workers = start_workers(&env, 1, true);
    until(
        10,
        "the acknowledger's read before the worker is registered",
        || async {
            let updates: i64 = sqlx::query_scalar("SELECT count(*) FROM public.workers_updates")
                .fetch_one(&env.db)
                .await
                .unwrap();
            updates > 0
        },
    )
    .await;
    let registered: i64 = sqlx::query_scalar("SELECT count(*) FROM deprov.workers")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(registered, 0, "the acknowledger ran first");
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut *gate)
        .await
        .unwrap();
    // Before the fix the worker took the version as recorded although its row did not exist, and
    // reported "not acknowledged" until the next change of a switch.
    until(
        5,
        "the new worker to acknowledge the current version",
        || async {
            let st = status(&env.db).await;
            st.latest_version > 0
                && st.workers.len() == 1
                && st.workers[0].observed_version == st.latest_version
        },
    )
    .await;
    workers.stop().await;
}

/// Checks the config helper stays valid (heartbeat keys in `[worker]`).
#[test]
fn the_test_configuration_parses() {
    let c = Config::from_toml(&config("100ms", "1s", 0)).unwrap();
    assert_eq!(c.worker.heartbeat_interval, Duration::from_millis(100));
}

/// An env whose jobs rest for tens of seconds after their first batch (duty cycle 0.0002), with
/// tenant 11's job running in one worker loop that has rested since its first batch; returns the
/// job and the rows deleted when its rest began (its progress shows when the rest ends).
pub(crate) async fn resting_job() -> (Env, Workers, Uuid, i64) {
    let text = config("200ms", "2s", 0).replace(
        "[pacing]\nrate_limit = 0\n",
        "[pacing]\nrate_limit = 0\nduty_cycle = 0.0002\n",
    );
    assert!(text.contains("duty_cycle = 0.0002"));
    let env = env_with_config(&text).await;
    sqlx::raw_sql(BIG_TENANTS).execute(&env.db).await.unwrap();
    let id = env.request("11").await;
    let workers = start_workers(&env, 1, true);
    let progress =
        || async { Progress::from_json(&jobs::get(&env.db, id).await.unwrap().unwrap().progress) };
    until(30, "the rest after the first batch, shown", || async {
        progress().await.resting_until.is_some()
    })
    .await;
    let p = progress().await;
    assert_eq!(p.batches, 1, "{p:?}");
    let ends = time::OffsetDateTime::parse(
        p.resting_until.as_deref().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let left = ends - time::OffsetDateTime::now_utc();
    assert!(
        left > time::Duration::seconds(10),
        "rest ends in {left}: {p:?}"
    );
    (env, workers, id, p.rows_deleted)
}

#[tokio::test]
async fn a_job_resting_for_its_duty_cycle_is_cancelled_within_a_third_of_its_lease() {
    let (env, workers, id, deleted) = resting_job().await;
    let url = env.server.url("target");
    let cancelled = tokio::time::Instant::now();
    let id_text = id.to_string();
    deprov::cli::run(deprov::cli::Cli::parse_from([
        "deprov",
        "jobs",
        "--database-url",
        &url,
        "cancel",
        &id_text,
        "--reason",
        "wrong tenant",
    ]))
    .await
    .unwrap();
    until(5, "the job cancelled", || async {
        jobs::get(&env.db, id).await.unwrap().unwrap().state() == JobState::Cancelled
    })
    .await;
    let took = cancelled.elapsed();
    let p = Progress::from_json(&jobs::get(&env.db, id).await.unwrap().unwrap().progress);
    workers.stop().await;
    // The harness's lease is 1 s: the rest re-reads the job every third of it.
    assert!(took < Duration::from_secs(2), "cancelled after {took:?}");
    assert_eq!(p.rows_deleted, deleted, "{p:?}");
}

#[tokio::test]
async fn a_job_resting_for_its_duty_cycle_is_held_as_soon_as_the_switch_is_engaged() {
    let (env, workers, id, deleted) = resting_job().await;
    let progress =
        || async { Progress::from_json(&jobs::get(&env.db, id).await.unwrap().unwrap().progress) };
    let engaged = tokio::time::Instant::now();
    cli(
        &env,
        &["on", "--reason", "drill", "--wait", "--timeout", "5s"],
    )
    .await
    .expect("the resting worker acknowledges");
    until(5, "the job held", || async {
        jobs::get(&env.db, id).await.unwrap().unwrap().state() == JobState::Held
    })
    .await;
    let held_after = engaged.elapsed();
    let p = progress().await;
    workers.stop().await;
    assert!(
        held_after < Duration::from_secs(5),
        "held {held_after:?} after the engage"
    );
    // The rest was cut short: nothing near the tens of seconds it was owed, no batch after it.
    assert!(p.duty_cycle_ms < 5_000.0, "{p:?}");
    assert_eq!(
        p.rows_deleted, deleted,
        "no batch ran during the rest: {p:?}"
    );
    assert_eq!(p.batches, 1, "{p:?}");
}
