//! A hard delete with `[hard_delete] checkpoint_interval` stopped between two checkpoints, by the
//! kill switch (the job is `held`) or by a stop request (the job is handed back `queued`), or paused
//! there after a lock timeout: before it stops or pauses, the run flushes the batches it committed
//! deferred and writes the checkpoint there
//! (`settle()` in `worker::run::hard_delete`). Without that, the stop would hand back the last
//! checkpoint's counts and leave the batches after it in the WAL buffers, where a target crash
//! loses them.
//!
//! Same servers as [`crate::deferred_commit`]: the target's WAL writer is stopped (SIGSTOP), so a
//! deferred commit stays in the WAL buffers until something flushes them; after the stop the target
//! crashes and recovers from the WAL on disk, and nothing the job deleted may come back.

use deprov::engine::Cursor;
use deprov::queue::kill_switch::{self, Scope};
use deprov::queue::{Job, JobState, jobs};
use deprov::worker::{Checkpoint, Progress};
use tokio::task::JoinHandle;

use crate::deferred_commit::{CONFIG, ITEMS, Setup, items_left, run_to_end};
use crate::demo_env::WorkerProcess;
use crate::harness::{digest, wait_for_job};

/// The global kill switch engaged while batches commit deferred between two checkpoints: the job
/// is `held`, and a target crash right after brings back no row, because the stop made the batches
/// durable and checkpointed them: the stored progress counts every row deleted before the stop and
/// the stored checkpoint is at the stop's position. Released, the job resumes from there and
/// completes equal to the cascade, every row counted once.
#[tokio::test]
async fn a_kill_switch_stop_between_checkpoints_leaves_nothing_a_target_crash_can_lose() {
    let s = Setup::prepare(CONFIG).await;
    let (cancel, running) = s.start_worker();
    let seen = deferred_after_checkpoint(&s, &running).await;
    engage(&s, true).await;
    let stopped = wait_for_job(&s.state, s.job_id, "the job to stop", |j| {
        j.state() != JobState::Running
    })
    .await;
    cancel.cancel();
    running.await.unwrap();
    assert_eq!(stopped.state(), JobState::Held, "{stopped:?}");

    let target = crash_and_check(&s, &stopped, seen, "kill switch").await;

    engage(&s, false).await;
    let done = run_to_end(&s).await;
    assert_completed(&s, &target, &done).await;
}

/// A stop request (the worker's cancellation token, as on SIGTERM) while batches commit deferred
/// between two checkpoints: the job is handed back `queued`, and a target crash right after brings
/// back no row, because the stop made the batches durable and checkpointed them: the stored
/// progress counts every row deleted before the stop and the stored checkpoint is at the stop's
/// position. A new worker resumes from there and completes the job equal to the cascade, every row
/// counted once.
#[tokio::test]
async fn a_stop_request_between_checkpoints_leaves_nothing_a_target_crash_can_lose() {
    let s = Setup::prepare(CONFIG).await;
    let (cancel, running) = s.start_worker();
    let seen = deferred_after_checkpoint(&s, &running).await;
    cancel.cancel();
    running.await.unwrap();
    let stopped = jobs::get(&s.state, s.job_id).await.unwrap().unwrap();
    assert_eq!(stopped.state(), JobState::Queued, "{stopped:?}");
    assert_eq!(stopped.last_error, None, "{stopped:?}");

    let target = crash_and_check(&s, &stopped, seen, "stop request").await;

    let done = run_to_end(&s).await;
    assert_completed(&s, &target, &done).await;
}

/// A batch hits `lock_timeout` (another session holds the tenant's items `FOR UPDATE`) while
/// batches commit deferred between two checkpoints: before the back-off pause the run flushes them
/// and writes the checkpoint there, so a target crash during the pause brings back no row. The
/// worker is a `deprov worker` process SIGKILLed during the pause, so nothing else flushes for it;
/// a new worker completes the job equal to the cascade.
#[tokio::test]
async fn a_lock_timeout_pause_between_checkpoints_leaves_nothing_a_target_crash_can_lose() {
    // Back-off pauses of 1–2 s (jittered), shorter than the 3 s lease the checkpoint renews.
    let config = CONFIG.replace(
        "rate_limit = 300",
        "rate_limit = 300\nbackoff = \"2s\"\nbackoff_max = \"2s\"",
    );
    let s = Setup::prepare(&config).await;
    let config_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config_file.path(), &config).unwrap();
    let mut worker = WorkerProcess::spawn(
        &s.state_server.url("deprov"),
        Some(&s.target_server.url("target")),
        config_file.path(),
    );
    let (stored, left) = s
        .wait_for_deferred(ITEMS, 100, || {
            if let Some(status) = worker.child.try_wait().unwrap() {
                panic!("the worker exited ({status})\n{}", worker.log());
            }
        })
        .await;
    let mut holder = s.target.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *holder).await.unwrap();
    sqlx::query("SELECT id FROM app.items WHERE account_id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    // The lock timeout is counted in the progress the checkpoint before the pause writes.
    let paused = wait_for_job(
        &s.state,
        s.job_id,
        "a lock timeout in the stored progress",
        |j| Progress::from_json(&j.progress).timeouts >= 1,
    )
    .await;
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    assert_eq!(paused.state(), JobState::Running, "{paused:?}");

    let target = crash_and_check(&s, &paused, Seen { stored, left }, "lock_timeout pause").await;
    // The holder's session died with the crash.
    holder.detach();

    let done = run_to_end(&s).await;
    assert_completed(&s, &target, &done).await;
}

/// What the test saw before stopping the job: the rows the stored progress counted, and the items
/// left on the target.
#[derive(Debug, Clone, Copy)]
struct Seen {
    stored: i64,
    left: i64,
}

/// Waits until a checkpoint is stored and batches committed deferred after it deleted at least 100
/// more rows (two batches, a third of a second after it; the next checkpoint comes a second after
/// it, so a stop at the next batch boundary finds deferred batches to settle).
async fn deferred_after_checkpoint(s: &Setup, running: &JoinHandle<()>) -> Seen {
    let (stored, left) = s
        .wait_for_deferred(ITEMS, 100, || {
            assert!(!running.is_finished(), "the worker ended");
        })
        .await;
    Seen { stored, left }
}

/// Engages (or releases) the global kill switch.
async fn engage(s: &Setup, engaged: bool) {
    let mut tx = s.state.begin().await.unwrap();
    kill_switch::set_scope(&mut tx, &Scope::Global, engaged, "drill", "test")
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Crashes the target after the job `stopped` (as stored when it was handed back) and checks that
/// the stop made every deleted row durable and stored its counts and position. Returns a pool on
/// the recovered target.
async fn crash_and_check(s: &Setup, stopped: &Job, seen: Seen, how: &str) -> sqlx::PgPool {
    let before = items_left(&s.target).await;
    let progress = Progress::from_json(&stopped.progress);
    let cp = Checkpoint::from_json(stopped.checkpoint.as_ref()).expect("a checkpoint was written");
    let Cursor::Within(parent, last) = &cp.cursor else {
        panic!("the checkpoint is not within the tenant's items: {cp:?}");
    };
    assert_eq!(parent, &vec!["1".to_string()]);
    assert!(
        ITEMS - before >= seen.stored + 100,
        "the job stopped before the deferred batches the test saw: {seen:?}, {before} items left"
    );

    let target = s.crash_target().await;
    let after = items_left(&target).await;
    let (below, above): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE id <= $1::bigint), count(*) FILTER (WHERE id > $1::bigint) \
         FROM app.items WHERE account_id = 1",
    )
    .bind(&last[0])
    .fetch_one(&target)
    .await
    .unwrap();
    println!(
        "{how}: seen {} items left with {} rows checkpointed; at the stop {before} items left \
         ({} deleted), stored rows_deleted {}, rewinds {}, checkpoint at id {}; after the target \
         crash {after} items left",
        seen.left,
        seen.stored,
        ITEMS - before,
        progress.rows_deleted,
        progress.rewinds,
        last[0]
    );
    assert_eq!(
        after,
        before,
        "{} items came back after the target crash: the stop ({how}) left deferred batches in the \
         WAL buffers",
        after - before
    );
    assert_eq!(
        (progress.rows_deleted, progress.rewinds),
        (ITEMS - before, 0),
        "the progress stored at the stop ({how}) does not count the {} items deleted before it \
         without a rewind: {progress:?}",
        ITEMS - before
    );
    assert_eq!(
        (below, above),
        (0, before),
        "the checkpoint stored at the stop ({how}), at item id {}, is not where the job stopped",
        last[0]
    );
    target
}

/// The resumed job completed equal to the cascade and counted every row once.
async fn assert_completed(s: &Setup, target: &sqlx::PgPool, done: &Job) {
    assert_eq!(done.state(), JobState::Completed, "{done:?}");
    let progress = Progress::from_json(&done.progress);
    assert_eq!(
        (progress.rows_deleted, progress.rewinds),
        (ITEMS + 1, 0),
        "{progress:?}"
    );
    assert_eq!(items_left(target).await, 0);
    assert_eq!(digest(target).await, digest(&s.expected).await);
}
