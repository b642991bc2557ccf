//! `[pacing] duty_cycle`: between batches the worker rests `work × (1 − d) / d`, so the hard delete
//! works at most `d` of the wall time, whatever a row costs.

use crate::harness::{config_hard, delete_tenant_1};

const SCHEMA: &str = "CREATE SCHEMA app;
     CREATE TABLE app.accounts (id bigint PRIMARY KEY, installation text UNIQUE, deleted_at timestamptz);
     CREATE TABLE app.items (id bigint PRIMARY KEY,
         account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
     CREATE INDEX ON app.items (account_id);
     INSERT INTO app.accounts VALUES (1, 'icfg_1', NULL), (2, 'icfg_2', NULL);
     INSERT INTO app.items SELECT g, 1, 'item ' || g FROM generate_series(1, 3000) g;
     INSERT INTO app.items SELECT 100000 + g, 2, 'other' FROM generate_series(1, 100) g;";

#[tokio::test]
async fn the_worker_rests_three_times_its_work_at_a_quarter_duty_cycle() {
    // Small batches that cannot grow far (max_batch_rows), so the job has many batches to rest
    // after; the harness's 1 s lease is renewed through the rests.
    let config = config_hard(
        "batch_rows = 20\nmax_batch_rows = 200\ncascade_rows = 0",
        "installation",
        "[pacing]\nduty_cycle = 0.25",
    );
    let progress = delete_tenant_1(SCHEMA, &config).await;
    let batch_ms: f64 = progress.tables.iter().map(|t| t.batch_ms).sum();
    assert!(progress.batches >= 15, "{progress:?}");
    // The work each rest answers for is every batch and all between them (the kill-switch checks
    // and checkpoints on the state database, deprov's own time), and the first rest the run's
    // work before its first batch too (the trial cascade among it), so the rests come to at least
    // three times the batches, the state database's time and the trial together.
    let measured = batch_ms + progress.bookkeeping_ms + progress.trial_ms;
    assert!(
        progress.duty_cycle_ms >= 3.0 * measured * 0.98,
        "rested {} ms after {measured} ms of batches and bookkeeping: {progress:?}",
        progress.duty_cycle_ms,
    );
    // And not much more: what deprov does between statements is small beside them.
    assert!(
        progress.duty_cycle_ms <= 3.0 * (measured + 500.0),
        "{progress:?}"
    );
    assert_eq!(progress.rate_limited_ms, 0.0, "{progress:?}");
    assert_eq!(progress.rows_deleted, 3001, "{progress:?}");
}

/// The run's work before its first batch (claim, plan, checks, soft delete) is paced too: here a
/// soft delete that takes 400 ms (a slow `UPDATE` trigger on the root) earns 1.2 s of rest at a
/// quarter duty cycle, on top of what the batches earn. Without it a job's checks — the trial
/// cascade, ~80 ms at 1M rows — and every restarted run's start would be unpaced bursts.
#[tokio::test]
async fn the_first_rest_answers_for_the_runs_work_before_its_first_batch() {
    let schema = format!(
        "{SCHEMA}
         CREATE FUNCTION app.slow_soft_delete() RETURNS trigger LANGUAGE plpgsql AS $f$
         BEGIN PERFORM pg_sleep(0.4); RETURN NEW; END $f$;
         CREATE TRIGGER slow BEFORE UPDATE ON app.accounts
             FOR EACH ROW EXECUTE FUNCTION app.slow_soft_delete();"
    );
    let config = config_hard(
        "batch_rows = 20\nmax_batch_rows = 200\ncascade_rows = 0",
        "installation",
        "[pacing]\nduty_cycle = 0.25",
    );
    let progress = delete_tenant_1(&schema, &config).await;
    let batch_ms: f64 = progress.tables.iter().map(|t| t.batch_ms).sum();
    let measured = batch_ms + progress.bookkeeping_ms + progress.trial_ms;
    assert!(
        progress.duty_cycle_ms >= 3.0 * (measured + 400.0) * 0.98,
        "rested {} ms after {measured} ms of batches, bookkeeping and trial and a 400 ms soft \
         delete: {progress:?}",
        progress.duty_cycle_ms,
    );
    assert_eq!(progress.soft_deleted_rows, Some(1), "{progress:?}");
}

/// A worker stopped (as SIGTERM stops it) during a rest of tens of seconds: the job goes back to
/// the queue with the rest's end still in its progress, and the worker that takes it next rests
/// until then instead of deleting at once — it holds the job, renewing its lease, and runs no
/// batch. Without this, every restart of a worker would undo the duty cycle.
#[tokio::test]
async fn a_rest_cut_short_by_a_stop_is_taken_by_the_next_run() {
    use deprov::queue::{JobState, jobs};
    use deprov::worker::Progress;
    use std::time::Duration;

    let (env, workers, id, deleted) = crate::kill_switch_ack::resting_job().await;
    let owed = Progress::from_json(&env.job(id).await.progress).resting_until;
    workers.stop().await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Queued, "{job:?}");
    let p = Progress::from_json(&job.progress);
    assert!(owed.is_some());
    assert_eq!(p.resting_until, owed, "the rest's end kept for the next run: {p:?}");
    assert_eq!(p.rows_deleted, deleted, "{p:?}");

    let workers = crate::kill_switch_ack::start_workers(&env, 1, true);
    // The next run claims the job (it was queued above, so a running job is the new run's) and
    // renews its lease every third of the harness's 1 s lease while it rests: three renewals are
    // a second of holding the job without a batch.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut leases = Vec::new();
    let mut job = env.job(id).await;
    while leases.len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "renewals seen: {leases:?}; {job:?}"
        );
        job = jobs::get(&env.db, id).await.unwrap().unwrap();
        if job.state() == JobState::Running
            && leases.last() != Some(&job.lease_expires_at)
        {
            leases.push(job.lease_expires_at);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let job = env.job(id).await;
    let p = Progress::from_json(&job.progress);
    workers.stop().await;
    assert_eq!(p.rows_deleted, deleted, "no batch during the owed rest: {p:?}");
    assert_eq!(p.batches, 1, "{p:?}");
    // The new run rests until the owed end plus what its own start earned, and says so.
    let at = |t: &Option<String>| {
        time::OffsetDateTime::parse(
            t.as_deref().expect("a rest shown"),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    assert!(at(&p.resting_until) >= at(&owed), "{p:?}");
    // Stopped again inside that rest: still owed, to its new end.
    let after = Progress::from_json(&env.job(id).await.progress);
    assert!(at(&after.resting_until) >= at(&p.resting_until), "{after:?}");
    assert_eq!(after.rows_deleted, deleted, "{after:?}");
}
