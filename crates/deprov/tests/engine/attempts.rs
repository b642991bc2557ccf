//! What `[worker] max_attempts` counts: runs in a row that advanced nothing. A job whose runs are
//! cut short after advancing (here: each run's target connection terminated by the server in the
//! middle of a batch, or the worker SIGKILLed after its soft delete) completes however many runs it
//! takes, without redoing its pre-checks once its soft delete committed; a job whose runs advance
//! nothing still fails after `max_attempts` of them.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use deprov::queue::JobState;
use deprov::worker::{Progress, StepOutcome};

use crate::demo_env::WorkerProcess;
use crate::harness::{config_hard, digest, env_with_config, wait_for_job};

/// The harness's configuration (7-row batches, leaves first, a 1 s lease) with `hard_delete` keys
/// added, `max_attempts` runs without progress allowed, and short pacing pauses.
fn config(hard_delete: &str, max_attempts: u32) -> String {
    config_hard(
        &format!(
            "batch_rows = 7\nmax_batch_rows = 7\nmax_batch_duration = \"800ms\"\n\
             lock_timeout = \"100ms\"\ncascade_rows = 0\n{hard_delete}"
        ),
        "installation",
        "[pacing]\nbackoff = \"1ms\"\nbackoff_max = \"2ms\"",
    )
    .replace(
        "max_attempts = 5",
        &format!("max_attempts = {max_attempts}"),
    )
}

/// Tenant 1's events (600 rows, deleted 7 per batch) terminate their own connection at every
/// 50th row deleted once the tenant is soft-deleted, five times (rows 50 to 250 of the hard
/// delete): the batch in flight rolls back, the batches before it stay committed. The trial
/// cascade, before the soft delete, is spared. A sequence counts the rows (a rolled-back batch
/// keeps its numbers); it lives outside schema `app`, which the comparison with the cascade reads.
const CUT_EVERY_50TH_EVENT: &str = "
CREATE SCHEMA fault;
CREATE SEQUENCE fault.events_deleted;
CREATE FUNCTION fault.cut() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    IF (SELECT deleted_at FROM app.accounts WHERE id = 1) IS NOT NULL THEN
        n := nextval('fault.events_deleted');
        IF n % 50 = 0 AND n <= 250 THEN
            PERFORM pg_terminate_backend(pg_backend_pid());
        END IF;
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER cut BEFORE DELETE ON app.events FOR EACH ROW EXECUTE FUNCTION fault.cut();";

#[tokio::test]
async fn a_job_cut_short_after_every_advance_completes_with_two_attempts_allowed() {
    let env = env_with_config(&config("checkpoint_interval = \"0s\"", 2)).await;
    let expected = env.cascade_copy(1).await;
    sqlx::raw_sql(CUT_EVERY_50TH_EVENT)
        .execute(&env.db)
        .await
        .unwrap();
    let id = env.request("1").await;
    let worker = env.worker("w1");
    let mut cut = 0;
    loop {
        wait_for_job(&env.db, id, "the retry to be due", |j| {
            j.run_after <= time::OffsetDateTime::now_utc()
        })
        .await;
        let outcome = worker.step().await.unwrap();
        let job = env.job(id).await;
        if job.state() == JobState::Completed {
            break;
        }
        cut += 1;
        assert_eq!(
            outcome,
            StepOutcome::Ran {
                job_id: id,
                state: "queued".into()
            },
            "run {cut}: {job:?}"
        );
        let error = job.last_error.clone().unwrap_or_default();
        assert!(error.contains("57P01"), "run {cut}: {error}");
        // The run advanced (soft delete, batches checkpointed) before it was cut: not counted.
        assert_eq!(
            (job.attempts, job.stalled_attempts),
            (cut, 0),
            "run {cut}: {job:?}"
        );
        assert!(cut <= 5, "more runs cut than the trigger cuts: {job:?}");
    }
    let job = env.job(id).await;
    assert_eq!(cut, 5, "{job:?}");
    // Six runs in all, three times the two allowed, none of them without progress.
    assert_eq!((job.attempts, job.stalled_attempts), (6, 0), "{job:?}");
    assert_eq!(digest(&env.db).await, digest(&expected).await);
    let progress = Progress::from_json(&job.progress);
    assert_eq!(progress.trial.as_deref(), Some("succeeds"));
    // The trial and the simulation ran in the first run only: the later ones kept its verdict.
    assert_eq!(progress.prechecks, 1, "{progress:?}");
    let numbered: i64 = sqlx::query_scalar("SELECT last_value FROM fault.events_deleted")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert!(numbered >= 250, "{numbered}");
}

/// Holds the row locks `select` (a `SELECT … FOR UPDATE`) takes until dropped (rolled back).
async fn hold(
    db: &sqlx::PgPool,
    select: &'static str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut blocker = db.begin().await.unwrap();
    sqlx::query(select).execute(&mut *blocker).await.unwrap();
    blocker
}

/// Runs `worker` on job `id` until the job ends, each run once its retry is due; returns the runs.
async fn run_until_ended(
    env: &crate::harness::Env,
    worker: &deprov::worker::Worker,
    id: uuid::Uuid,
) -> i32 {
    let mut runs = 0;
    loop {
        let job = wait_for_job(&env.db, id, "the retry to be due", |j| {
            j.run_after <= time::OffsetDateTime::now_utc()
        })
        .await;
        if job.state() != JobState::Queued {
            return runs;
        }
        assert!(runs < 20, "the job never ended: {job:?}");
        worker.step().await.unwrap();
        runs += 1;
    }
}

/// Every run stops at the soft delete, which waits on a lock held on the tenant's root row (the
/// trial cascade, waiting on it too, leaves the verdict to the simulation): nothing advances, and
/// the job fails after `max_attempts` runs.
#[tokio::test]
async fn a_job_whose_runs_never_advance_fails_after_max_attempts_runs() {
    let env = env_with_config(&config("", 3)).await;
    let id = env.request("4").await;
    let blocker = hold(
        &env.db,
        "SELECT 1 FROM app.accounts WHERE id = 4 FOR UPDATE",
    )
    .await;
    let runs = run_until_ended(&env, &env.worker("w1"), id).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Failed, "{job:?}");
    assert_eq!((runs, job.attempts, job.stalled_attempts), (3, 3, 3));
    let error = job.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("55P03") && error.contains("attempts exhausted"),
        "{error}"
    );
    let progress = Progress::from_json(&job.progress);
    assert!(progress.soft_deleted_at.is_none() && progress.rows_deleted == 0);
    blocker.rollback().await.unwrap();
}

/// Without the trial the first run soft-deletes the tenant and deletes the rows no lock holds (it
/// advanced: not counted); each later run's batches time out on the held folders (nothing
/// advanced: counted). The job fails after `max_attempts` such runs, one run more than
/// `max_attempts` in all. Retried by an operator once the lock is gone, it completes, its checks
/// run again.
#[tokio::test]
async fn runs_that_stop_advancing_after_the_soft_delete_fail_the_job_after_max_attempts() {
    let env = env_with_config(&config("trial_cascade = false", 3)).await;
    let id = env.request("4").await;
    let blocker = hold(
        &env.db,
        "SELECT 1 FROM app.folders WHERE account_id = 4 FOR UPDATE",
    )
    .await;
    let worker = env.worker("w1");
    worker.step().await.unwrap();
    let first = env.job(id).await;
    let progress = Progress::from_json(&first.progress);
    assert!(
        first.state() == JobState::Queued
            && progress.soft_deleted_at.is_some()
            && progress.rows_deleted > 0,
        "{first:?}"
    );
    assert_eq!((first.attempts, first.stalled_attempts), (1, 0));
    let runs = run_until_ended(&env, &worker, id).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Failed, "{job:?}");
    assert_eq!((runs, job.attempts, job.stalled_attempts), (3, 4, 3));
    let error = job.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("55P03") && error.contains("attempts exhausted"),
        "{error}"
    );
    // Nothing the later runs did moved the checkpoint or the count of rows.
    assert_eq!(
        Progress::from_json(&job.progress).rows_deleted,
        progress.rows_deleted
    );
    blocker.rollback().await.unwrap();
    // An operator's retry starts the counts again and has the checks run once more.
    let mut conn = env.db.acquire().await.unwrap();
    deprov::queue::operator::retry(&mut conn, id, "cli:test", "lock holder gone")
        .await
        .unwrap();
    let retried = env.job(id).await;
    assert_eq!((retried.attempts, retried.stalled_attempts), (0, 0));
    assert!(
        Progress::from_json(&retried.progress)
            .prechecked_plan
            .is_none()
    );
    env.drain(&worker).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Completed, "{job:?}");
    assert_eq!(Progress::from_json(&job.progress).prechecks, 2);
}

/// Once the tenant is soft-deleted, every DELETE statement on tenant 1's tables (not the trial's,
/// before the soft delete) waits for advisory lock 4242, which the test holds.
const WAIT_AFTER_SOFT_DELETE: &str = "
CREATE SCHEMA fault;
CREATE FUNCTION fault.wait() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT deleted_at FROM app.accounts WHERE id = 1) IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared(4242);
    END IF;
    RETURN NULL;
END $$;
DO $$
DECLARE t regclass;
BEGIN
    FOR t IN SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'app' AND c.relkind = 'r' AND c.relname <> 'accounts' LOOP
        EXECUTE format('CREATE TRIGGER wait BEFORE DELETE ON %s FOR EACH STATEMENT \
                        EXECUTE FUNCTION fault.wait()', t);
    END LOOP;
END $$;";

/// The worker process is SIGKILLed after its soft delete committed, while its first hard-delete
/// batch waits (no checkpoint written, the run never reports back): the run that takes the job
/// over keeps the pre-checks' verdict recorded with the soft delete and goes straight on to the
/// hard delete: the trial cascade and the simulation ran once in all.
#[tokio::test]
async fn a_run_after_a_sigkill_past_the_soft_delete_does_not_redo_the_pre_checks() {
    let text = config("checkpoint_interval = \"0s\"", 2);
    let env = env_with_config(&text).await;
    let expected = env.cascade_copy(1).await;
    sqlx::raw_sql(WAIT_AFTER_SOFT_DELETE)
        .execute(&env.db)
        .await
        .unwrap();
    let mut holder = env.db.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut *holder)
        .await
        .unwrap();
    let id = env.request("1").await;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &text).unwrap();
    let mut process = WorkerProcess::spawn(&env.server.url("target"), None, file.path());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND wait_event = 'advisory'",
        )
        .fetch_one(&env.db)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        if let Some(status) = process.child.try_wait().unwrap() {
            panic!("worker exited ({status}): {}", process.log());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no batch waited: {:?}\n{}",
            env.job(id).await,
            process.log()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    process.child.kill().unwrap();
    let status = process.child.wait().unwrap();
    assert_eq!(status.signal(), Some(9));
    let left = env.job(id).await;
    let progress = Progress::from_json(&left.progress);
    assert_eq!(
        (left.state(), left.step.as_str(), left.checkpoint.is_none()),
        (JobState::Running, "hard_delete", true),
        "{left:?}"
    );
    assert!(
        progress.soft_deleted_at.is_some() && progress.hard_delete_started_at.is_none(),
        "{progress:?}"
    );
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut *holder)
        .await
        .unwrap();
    wait_for_job(&env.db, id, "the dead worker's lease to expire", |j| {
        j.lease_expires_at
            .is_some_and(|at| at < time::OffsetDateTime::now_utc())
    })
    .await;
    env.drain(&env.worker("w2")).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Completed, "{job:?}");
    assert_eq!((job.attempts, job.stalled_attempts), (2, 0), "{job:?}");
    assert_eq!(digest(&env.db).await, digest(&expected).await);
    let progress = Progress::from_json(&job.progress);
    assert_eq!(progress.trial.as_deref(), Some("succeeds"));
    assert_eq!(progress.prechecks, 1, "{progress:?}");
}
