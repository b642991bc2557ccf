//! SIGKILL of a real `deprov worker` while its held-row sweep runs: the sweep is one statement in
//! one transaction, so the kill leaves it rolled back (every kept-back row still there), and the
//! worker that takes the job over after the lease sweeps again and completes it, equal to the
//! cascade.

use std::time::{Duration, Instant};

use deprov::queue::JobState;
use deprov::worker::{Progress, StepOutcome};

use crate::demo_env::{WorkerProcess, wait_no_worker_backends};
use crate::harness::{config_for, digest, env_with_schema};

/// Tenant 1's 1,500 folders form one ring through a NO ACTION self-reference (`parent = id + 1`,
/// the last pointing at the first): every batch keeps all its rows back (each is referenced from
/// outside it), so the table ends in one sweep. A statement deleting 1,000 rows or more (the sweep,
/// the trial cascade, the reference cascade) sleeps 3 s in a statement trigger: long enough to
/// kill the worker inside it. Tenant 2's folders are untouched.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.folders (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    parent int REFERENCES app.folders (id));
CREATE INDEX ON app.folders (account_id);
CREATE INDEX ON app.folders (parent);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.folders SELECT g, 1, NULL FROM generate_series(1, 1500) g;
UPDATE app.folders SET parent = CASE WHEN id = 1500 THEN 1 ELSE id + 1 END;
INSERT INTO app.folders SELECT g, 2, NULL FROM generate_series(2001, 2100) g;
CREATE FUNCTION app.slow_bulk_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT count(*) FROM gone) >= 1000 THEN PERFORM pg_sleep(3); END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER slow_bulk_delete AFTER DELETE ON app.folders REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION app.slow_bulk_delete();
ANALYZE;
";

async fn tenant_folders(db: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM app.folders WHERE account_id = 1")
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_worker_killed_inside_its_sweep_leaves_the_rows_and_the_takeover_sweeps_again() {
    // 20-row batches; the sweep needs more than the harness's 900 ms statement_timeout allows
    // (and a lease longer than the statement_timeout).
    let config_text = config_for(20, "id", "")
        .replace(
            "statement_timeout = \"900ms\"",
            "statement_timeout = \"5s\"",
        )
        .replace("lease = \"1s\"", "lease = \"6s\"");
    let env = env_with_schema(&config_text, SCHEMA).await;
    let expected = env.cascade_copy(1).await;
    let config_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config_file.path(), &config_text).unwrap();
    let id = env.request("1").await;
    let mut proc = WorkerProcess::spawn(&env.server.url("target"), None, config_file.path());

    // The sweep is running when a deprov target connection sleeps in the trigger inside the
    // sweep's statement (`engine::queries::sweep`; the trial cascade, which sleeps in it too until
    // its bound cuts it, is a DELETE of the root row).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sweeping: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'deprov-target' \
             AND wait_event = 'PgSleep' AND query LIKE 'WITH RECURSIVE s AS (%'",
        )
        .fetch_one(&env.db)
        .await
        .unwrap();
        if sweeping > 0 {
            break;
        }
        if let Some(status) = proc.child.try_wait().unwrap() {
            panic!("worker exited ({status})\n{}", proc.log());
        }
        assert!(Instant::now() < deadline, "no sweep seen\n{}", proc.log());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = env.job(id).await;
    proc.child.kill().unwrap(); // SIGKILL
    proc.child.wait().unwrap();
    // The killed process's backend finishes its statement, finds its client gone and aborts.
    wait_no_worker_backends(&env.db).await;
    assert_eq!(
        tenant_folders(&env.db).await,
        1500,
        "the killed sweep rolled back: {before:?}"
    );
    let killed = env.job(id).await;
    assert_eq!(killed.state(), JobState::Running, "{killed:?}");
    assert_eq!(Progress::from_json(&killed.progress).held_sweeps, 0);

    // Another worker takes the job over once the dead worker's 6 s lease has expired.
    let worker = env.worker("w2");
    let started = Instant::now();
    loop {
        match worker.step().await.unwrap() {
            StepOutcome::Idle => {
                assert!(started.elapsed() < Duration::from_secs(15), "never claimed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            ran => {
                assert_eq!(
                    ran,
                    StepOutcome::Ran {
                        job_id: id,
                        state: "completed".into()
                    },
                    "{:?}",
                    env.job(id).await
                );
                break;
            }
        }
    }
    let done = env.job(id).await;
    assert_eq!(done.attempts, 2, "{done:?}");
    let p = Progress::from_json(&done.progress);
    assert_eq!(p.held_sweeps, 1, "{p:?}");
    assert_eq!(tenant_folders(&env.db).await, 0);
    assert_eq!(digest(&env.db).await, digest(&expected).await);
}
