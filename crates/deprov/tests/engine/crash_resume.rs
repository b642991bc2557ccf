//! The real `deprov worker` process, stopped in the middle of a hard delete on the demo schema:
//! * SIGKILL: the job stays `running` under the dead worker's lease with its checkpoint; once the
//!   lease expires another worker takes it over, resumes from the checkpoint and completes it, and the
//!   database equals the cascade's. Kill points are drawn from a seeded RNG (`DEPROV_CRASH_SEED`
//!   replays a run).
//! * SIGTERM: the process stops at the next batch boundary and exits by itself, handing the job back
//!   `queued` with its checkpoint; another worker completes it with the same result.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use deprov::queue::{JobState, jobs};
use deprov::worker::{Checkpoint, Progress, StepOutcome};
use deprov_demo::{DatabaseDigest, DemoSize, DemoTenants};
use rand::{Rng, SeedableRng, rngs::StdRng};
use uuid::Uuid;

use crate::demo_env::{DemoDb, DemoServer, WorkerProcess, demo_config};

/// Rows per batch: the large demo tenant (5,000 rows) takes a few hundred batches.
const BATCH_ROWS: u32 = 20;

/// The loaded demo (`pristine`), the cascade's result on a clone of it, and deprov's config file.
struct Scenario {
    server: DemoServer,
    tenants: DemoTenants,
    expected: DatabaseDigest,
    config_file: tempfile::NamedTempFile,
    config_text: String,
}

impl Scenario {
    async fn prepare() -> Self {
        let server = DemoServer::start().await;
        let tenants = server.load("pristine", &DemoSize::test()).await;
        let (expected, _) = server.cascade("pristine", "expected", tenants.large).await;
        // Every batch durable and checkpointed, so a resume repeats at most the batch in flight
        // (tests/engine/deferred_commit.rs covers batches between checkpoints).
        let config_text = demo_config(BATCH_ROWS).replace(
            "cascade_rows = 0",
            "cascade_rows = 0\ncheckpoint_interval = \"0s\"",
        );
        let config_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(config_file.path(), &config_text).unwrap();
        Self {
            server,
            tenants,
            expected,
            config_file,
            config_text,
        }
    }

    /// A fresh copy of the untouched demo, migrated, with a request recorded for the large tenant.
    async fn fresh(&self, name: &str) -> (DemoDb, Uuid) {
        self.server.clone_db("pristine", name).await;
        let db = DemoDb::open(&self.server, name, &self.config_text).await;
        let job_id = db.request(self.tenants.large).await;
        (db, job_id)
    }

    /// Starts `deprov worker` on database `name`; its log goes to a temp file.
    fn spawn(&self, name: &str) -> WorkerProcess {
        WorkerProcess::spawn(&self.server.server.url(name), None, self.config_file.path())
    }

    /// Asserts deprov's result equals the cascade's; when it does not, the message names each
    /// differing table with its rows found on one side only (at most 12 per side).
    async fn assert_equals_cascade(&self, db: &DemoDb, what: &str) {
        let after = db.digest().await;
        let tables = deprov_demo::differing_tables(&after, &self.expected);
        if tables.is_empty() {
            return;
        }
        let expected = self.server.pool("expected").await;
        let mut rows = String::new();
        for table in &tables {
            let cascade = deprov_demo::table_rows(&expected, table).await.unwrap();
            let deprov = deprov_demo::table_rows(&db.db, table).await.unwrap();
            let only = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> Vec<String> {
                a.difference(b).take(12).cloned().collect()
            };
            rows.push_str(&format!(
                "\n{table}: only after the cascade {:?}; only after deprov {:?}",
                only(&cascade, &deprov),
                only(&deprov, &cascade)
            ));
        }
        let names: Vec<String> = tables.iter().map(ToString::to_string).collect();
        panic!("{what}: result differs from the cascade's in {names:?}{rows}");
    }
}

/// Runs the in-process worker `name` until it has completed `job_id`, polling while it finds nothing
/// to claim (at most 5 s). Returns how long it was idle before the step that claimed the job.
async fn take_over(db: &DemoDb, job_id: Uuid, name: &str) -> Duration {
    let worker = db.worker(name);
    let started = Instant::now();
    loop {
        let idle = started.elapsed();
        match worker.step().await.unwrap() {
            StepOutcome::Idle => {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "job never claimable: {:?}",
                    db.job(job_id).await
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            ran => {
                let expected = StepOutcome::Ran {
                    job_id,
                    state: "completed".into(),
                };
                assert_eq!(ran, expected, "{:?}", db.job(job_id).await);
                return idle;
            }
        }
    }
}

/// SIGKILLs the worker once the job shows `k` batches, then resumes with another worker. Returns the
/// total batches.
async fn kill_and_resume(s: &Scenario, name: &str, k: i64, baseline: &Progress) -> i64 {
    let (db, job_id) = s.fresh(name).await;
    let mut proc = s.spawn(name);
    let pid = proc.child.id();
    proc.wait_for(&db, job_id, |j| {
        Progress::from_json(&j.progress).batches >= k
    })
    .await;
    proc.child.kill().unwrap(); // SIGKILL
    let status = proc.child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    // The dead process's backends may still be finishing a statement it had sent.
    db.wait_no_worker_backends().await;

    let killed = db.job(job_id).await;
    assert_eq!(killed.state(), JobState::Running, "{killed:?}");
    let owner = killed.lease_owner.clone().unwrap_or_default();
    assert!(owner.contains(&format!("-{pid}-")), "lease of {owner:?}");
    assert_eq!(killed.attempts, 1);
    let cp = Checkpoint::from_json(killed.checkpoint.as_ref()).expect("a checkpoint at the kill");
    let at_kill = Progress::from_json(&killed.progress);
    assert!(at_kill.batches >= k, "{at_kill:?}");

    let remaining = killed.lease_expires_at.expect("a lease") - time::OffsetDateTime::now_utc();
    let idle = take_over(&db, job_id, "resumer").await;
    // Nobody took the job while the dead worker's lease was still valid.
    assert!(
        idle.as_secs_f64() >= remaining.as_seconds_f64() - 0.1,
        "claimed after {idle:?}, lease had {remaining} left"
    );
    let done = db.job(job_id).await;
    assert_eq!(done.state(), JobState::Completed, "{done:?}");
    assert_eq!(done.attempts, 2, "the dead worker's claim and the takeover");
    assert_eq!(done.lease_owner, None);
    let fin = Progress::from_json(&done.progress);
    println!(
        "K={k}: killed pid {pid} at {} batches / {} rows (checkpoint step {} {:?}); takeover after \
         {idle:?} idle; {} batches / {} rows in all (uninterrupted: {} / {})",
        at_kill.batches,
        at_kill.rows_deleted,
        cp.step,
        cp.cursor,
        fin.batches,
        fin.rows_deleted,
        baseline.batches,
        baseline.rows_deleted
    );
    s.assert_equals_cascade(&db, &format!("K={k}")).await;
    // Resumed, not restarted: the soft delete was not redone, the figures carry on from the kill,
    // and the work after the kill is what was left: a restart re-walks the finished steps (a few
    // batches more than the uninterrupted run); a resume takes the same number of batches, or one
    // fewer when the batch in flight at the kill committed without its checkpoint.
    assert_eq!(fin.soft_deleted_at, at_kill.soft_deleted_at);
    assert_eq!(fin.note, None, "{fin:?}");
    assert!(fin.rows_deleted >= at_kill.rows_deleted && fin.batches > k);
    // A batch committed just before the kill but not yet checkpointed is not counted.
    let lost = baseline.rows_deleted - fin.rows_deleted;
    assert!(
        (0..=i64::from(BATCH_ROWS)).contains(&lost),
        "{fin:?} vs {baseline:?}"
    );
    assert!(
        fin.batches <= baseline.batches + 1,
        "{fin:?} vs {baseline:?}"
    );
    fin.batches
}

/// Three kill points, each in its own fresh copy of the demo.
#[tokio::test]
async fn sigkilled_worker_is_taken_over_and_resumes_from_its_checkpoint() {
    let s = Scenario::prepare().await;
    // Reference: an uninterrupted run in-process gives the batch count and figures.
    let (db, job_id) = s.fresh("baseline").await;
    take_over(&db, job_id, "baseline").await;
    s.assert_equals_cascade(&db, "uninterrupted").await;
    let baseline = Progress::from_json(&db.job(job_id).await.progress);
    let total = baseline.batches;
    assert!(
        total >= 60,
        "too few batches to kill in between: {baseline:?}"
    );

    let seed: u64 = match std::env::var("DEPROV_CRASH_SEED") {
        Ok(v) => v.parse().unwrap(),
        Err(_) => rand::random(),
    };
    let mut rng = StdRng::seed_from_u64(seed);
    // Early, middle and late in the first half, so the kill never comes after the job finished.
    let ks: Vec<i64> = (0..3)
        .map(|i| rng.random_range(2 + i * total / 6..(i + 1) * total / 6))
        .collect();
    println!("DEPROV_CRASH_SEED={seed} kill points K={ks:?} of {total} batches");
    for (i, k) in ks.iter().enumerate() {
        kill_and_resume(&s, &format!("run_{i}"), *k, &baseline).await;
    }
}

/// SIGTERM: the worker hands the job back `queued` with its checkpoint and exits 0 by itself.
#[tokio::test]
#[allow(unsafe_code)] // kill(2) on the worker process this test started
async fn sigtermed_worker_hands_the_job_back_and_exits() {
    let s = Scenario::prepare().await;
    let (db, job_id) = s.fresh("work").await;
    let mut proc = s.spawn("work");
    let k = 10;
    proc.wait_for(&db, job_id, |j| {
        Progress::from_json(&j.progress).batches >= k
    })
    .await;
    let pid = i32::try_from(proc.child.id()).unwrap();
    // SAFETY: kill(2) on our own child's pid; it has not been reaped, so the pid is still its own.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let started = Instant::now();
    let status = proc.wait_exit(Duration::from_secs(10)).await;
    let stopped_in = started.elapsed();
    assert!(status.success(), "{status}\n{}", proc.log());

    let handed_back = jobs::get(&db.db, job_id).await.unwrap().unwrap();
    assert_eq!(handed_back.state(), JobState::Queued, "{handed_back:?}");
    assert_eq!(handed_back.lease_owner, None);
    assert_eq!(handed_back.last_error, None, "a shutdown is not an error");
    assert_eq!(
        handed_back.attempts, 0,
        "a shutdown does not use an attempt"
    );
    let cp = Checkpoint::from_json(handed_back.checkpoint.as_ref()).expect("checkpoint kept");
    let at_stop = Progress::from_json(&handed_back.progress);
    assert!(at_stop.batches >= k, "{at_stop:?}");
    println!(
        "SIGTERM at >= {k} batches: exited in {stopped_in:?} at {} batches (step {} {:?})",
        at_stop.batches, cp.step, cp.cursor
    );

    let idle = take_over(&db, job_id, "after-sigterm").await;
    assert!(
        idle < Duration::from_millis(500),
        "queued job claimable at once: {idle:?}"
    );
    let done = db.job(job_id).await;
    assert_eq!((done.state(), done.attempts), (JobState::Completed, 1));
    let fin = Progress::from_json(&done.progress);
    assert!(fin.batches > at_stop.batches && fin.rows_deleted > at_stop.rows_deleted);
    assert_eq!(fin.soft_deleted_at, at_stop.soft_deleted_at);
    s.assert_equals_cascade(&db, "after SIGTERM").await;
}

/// The job, polled until `pred` holds (at most 60 s), tolerating errors while the server is down;
/// fails at once if the worker process exited.
async fn wait_through_outage(
    proc: &mut WorkerProcess,
    db: &DemoDb,
    id: Uuid,
    pred: impl Fn(&deprov::queue::Job) -> bool,
) -> deprov::queue::Job {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(job)) = jobs::get(&db.db, id).await
            && pred(&job)
        {
            return job;
        }
        if let Some(status) = proc.child.try_wait().unwrap() {
            panic!("worker exited ({status}) during the outage\n{}", proc.log());
        }
        assert!(Instant::now() < deadline, "timed out\n{}", proc.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// PostgreSQL crashes mid-job (`pg_ctl stop -m immediate`: the state and the target database are on
/// this one server) and is started again: the same worker process, untouched, completes the job
/// from its checkpoint, equal to the cascade. Twice in one job, at seeded batch counts.
#[tokio::test]
async fn postgres_crash_mid_job_completes_without_an_operator() {
    let s = Scenario::prepare().await;
    let (db, job_id) = s.fresh("outage").await;
    let seed: u64 = match std::env::var("DEPROV_CRASH_SEED") {
        Ok(v) => v.parse().unwrap(),
        Err(_) => rand::random(),
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let first = rng.random_range(5..40);
    let second = first + rng.random_range(5..40);
    println!("DEPROV_CRASH_SEED={seed} crash points at {first} and {second} batches");
    let mut proc = s.spawn("outage");
    // Each crash comes while the job runs, after a batch committed since the last restart: a slow
    // poll can first see the job past both crash points, or handed back after the first crash.
    let mut seen = 0;
    for k in [first, second] {
        let before = wait_through_outage(&mut proc, &db, job_id, |j| {
            let batches = Progress::from_json(&j.progress).batches;
            j.state() == JobState::Running && batches >= k && batches > seen
        })
        .await;
        seen = Progress::from_json(&before.progress).batches;
        s.server.server.stop().unwrap();
        s.server.server.restart().unwrap();
    }
    let done = wait_through_outage(&mut proc, &db, job_id, |j| {
        matches!(j.state(), JobState::Completed | JobState::Failed)
    })
    .await;
    assert_eq!(
        done.state(),
        JobState::Completed,
        "{done:?}\n{}",
        proc.log()
    );
    let fin = Progress::from_json(&done.progress);
    assert!(fin.batches > seen, "{fin:?}");
    // Resumed from the checkpoint under the same plan (a restart from the first step leaves a note).
    assert_eq!(fin.note, None, "{fin:?}");
    println!(
        "completed after two crashes: {} attempts, {} batches, {} rows; last error {:?}",
        done.attempts, fin.batches, fin.rows_deleted, done.last_error
    );
    // Shown only when the test fails: what the worker did around the crashes.
    println!("worker log:\n{}", proc.log());
    s.assert_equals_cascade(&db, "after two PostgreSQL crashes")
        .await;
}
