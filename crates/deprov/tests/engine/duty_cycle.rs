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
/// the queue with the rest's end still in its progress, and the worker that claims it next hands
/// it straight back, queued until that end, instead of deleting at once (and without keeping the
/// worker). Without this, every restart of a worker would undo the duty cycle.
#[tokio::test]
async fn a_rest_cut_short_by_a_stop_is_waited_out_queued() {
    use deprov::queue::{JobState, jobs};
    use deprov::worker::Progress;
    use std::time::Duration;

    let (env, workers, id, deleted) = crate::kill_switch_ack::resting_job().await;
    let owed = Progress::from_json(&env.job(id).await.progress).resting_until;
    workers.stop().await;
    let stopped = env.job(id).await;
    assert_eq!(stopped.state(), JobState::Queued, "{stopped:?}");
    let p = Progress::from_json(&stopped.progress);
    assert!(owed.is_some());
    assert_eq!(
        p.resting_until, owed,
        "the rest's end kept for the next run: {p:?}"
    );
    assert_eq!(p.rows_deleted, deleted, "{p:?}");
    let ends = time::OffsetDateTime::parse(
        owed.as_deref().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();

    let workers = crate::kill_switch_ack::start_workers(&env, 1, true);
    // The next claim hands the job back queued until the rest ends: its run_after moves from the
    // stop to the rest's end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut job = env.job(id).await;
    while !(job.state() == JobState::Queued
        && job.run_after > stopped.run_after + Duration::from_secs(5))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never handed back: {job:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        job = jobs::get(&env.db, id).await.unwrap().unwrap();
    }
    workers.stop().await;
    let off = (job.run_after - ends).abs();
    assert!(
        off < time::Duration::seconds(2),
        "queued until {} for a rest ending {ends}",
        job.run_after
    );
    let p = Progress::from_json(&job.progress);
    assert_eq!(
        p.rows_deleted, deleted,
        "no batch during the owed rest: {p:?}"
    );
    assert_eq!(p.batches, 1, "{p:?}");
    assert_eq!(p.resting_until, owed, "{p:?}");
    assert_eq!(
        job.attempts, stopped.attempts,
        "the hand-back spends no attempt: {job:?}"
    );
}
