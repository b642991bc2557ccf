//! `[hard_delete] checkpoint_interval`: batches between checkpoints commit with
//! `synchronous_commit = off`, so a target that crashes can lose them. The checkpoint must never name
//! a batch the crash can lose: here the target's WAL writer is stopped (SIGSTOP), so deferred commits
//! stay in its WAL buffers, and then the target crashes (SIGKILL of the WAL writer makes the
//! postmaster reinitialize shared memory and recover from the WAL on disk). The `deprov worker`
//! process is SIGKILLed at the same moment, so it cannot flush either.
//!
//! After the crash the test checks that commits were lost (tenant rows came back), that every row
//! the stored checkpoint says is deleted is absent, and that a new worker completes the job equal to
//! the cascade. The state database is on another server: a durable commit there must not flush the
//! target's WAL for it.

use std::sync::Arc;
use std::time::Duration;

use deprov::config::Config;
use deprov::db::Pools;
use deprov::engine::Cursor;
use deprov::ids::DedupBasis;
use deprov::queue::intake::SubjectKind;
use deprov::queue::{JobState, jobs};
use deprov::worker::{Checkpoint, Progress, Worker};
use deprov_testkit::{Throwaway, ThrowawayOptions};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::demo_env::WorkerProcess;
use crate::harness::{connect, digest, record, wait_for_job};

/// Rows of the deleted tenant's one child table.
pub(crate) const ITEMS: i64 = 3_000;

const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, installation text UNIQUE, deleted_at timestamptz);
CREATE TABLE app.items (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
CREATE INDEX ON app.items (account_id);
INSERT INTO app.accounts (id, installation) VALUES (1, 'i1'), (2, 'i2');
INSERT INTO app.items SELECT g, CASE WHEN g <= 3000 THEN 1 ELSE 2 END, repeat('x', 100)
    FROM generate_series(1, 3100) g;
";

/// 50-row batches at 300 rows/s (six a second), a durable checkpoint at most every second, and a
/// lease of 3 s, so a new worker takes the job over soon after the first one is gone.
pub(crate) const CONFIG: &str = r#"
[sources.billing]
token = "billing-token-0123456789"
[tenant]
root_table = "app.accounts"
key_column = "id"
[soft_delete]
statements = ["UPDATE app.accounts SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL"]
[hard_delete]
batch_rows = 50
max_batch_rows = 50
cascade_rows = 0
checkpoint_interval = "1s"
statement_timeout = "2s"
user_triggers = "allow"
# The tenant fits one transaction; these tests watch the batches between checkpoints.
whole_cascade = false
[pacing]
rate_limit = 300
[worker]
lease = "3s"
poll_interval = "20ms"
backoff_base = "1ms"
backoff_max = "2ms"
[vercel]
source = "billing"
tenant_lookup = "SELECT id FROM app.accounts WHERE installation = $1"
"#;

pub(crate) async fn items_left(target: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM app.items WHERE account_id = 1")
        .fetch_one(target)
        .await
        .unwrap()
}

#[allow(unsafe_code)] // kill(2) on a server process this test started
fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) with a PID read from pg_stat_activity of our own throwaway server.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// Two servers (deprov's state database, and the target with its WAL writer stopped), the schema
/// loaded, the cascade's result in database `expected`, and a request recorded for tenant 1.
pub(crate) struct Setup {
    pub(crate) state_server: Throwaway,
    pub(crate) target_server: Throwaway,
    pub(crate) state: sqlx::PgPool,
    pub(crate) target: sqlx::PgPool,
    pub(crate) expected: sqlx::PgPool,
    pub(crate) config: Arc<Config>,
    pub(crate) pools: Pools,
    pub(crate) job_id: uuid::Uuid,
    walwriter: i32,
}

impl Setup {
    pub(crate) async fn prepare(config_text: &str) -> Self {
        Self::prepare_with(SCHEMA, config_text).await
    }

    async fn prepare_with(schema: &str, config_text: &str) -> Self {
        let state_server = Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
        .unwrap();
        // Durable defaults; WAL buffers large enough to hold every deferred batch, and nothing else that
        // writes WAL out (the background writer flushes WAL before writing a data page).
        let target_server = Throwaway::start(&ThrowawayOptions {
            unsafe_fast: false,
            settings: vec![
                ("wal_buffers".into(), "64MB".into()),
                ("bgwriter_lru_maxpages".into(), "0".into()),
                ("autovacuum".into(), "off".into()),
            ],
        })
        .unwrap();
        let state_admin = connect(&state_server, "postgres", 1).await;
        sqlx::query("CREATE DATABASE deprov")
            .execute(&state_admin)
            .await
            .unwrap();
        let admin = connect(&target_server, "postgres", 1).await;
        sqlx::query("CREATE DATABASE target")
            .execute(&admin)
            .await
            .unwrap();
        let target = connect(&target_server, "target", 2).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(schema.to_owned()))
            .execute(&target)
            .await
            .unwrap();
        target.close().await;
        sqlx::query("CREATE DATABASE expected TEMPLATE target")
            .execute(&admin)
            .await
            .unwrap();
        let expected = connect(&target_server, "expected", 1).await;
        sqlx::query("DELETE FROM app.accounts WHERE id = 1")
            .execute(&expected)
            .await
            .unwrap();

        let state = connect(&state_server, "deprov", 2).await;
        deprov::db::migrate(&state).await.unwrap();
        let config = Arc::new(Config::from_toml(config_text).unwrap());
        let pools = Pools::new(
            &state_server.url("deprov"),
            &target_server.url("target"),
            &config.pools,
        )
        .unwrap();
        let job_id = record(
            &pools,
            &config,
            DedupBasis::TenantId,
            SubjectKind::Tenant,
            "1",
        )
        .await;
        let target = connect(&target_server, "target", 2).await;
        let walwriter: i32 =
            sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
                .fetch_one(&target)
                .await
                .unwrap();
        signal(walwriter, libc::SIGSTOP);

        Self {
            state_server,
            target_server,
            state,
            target,
            expected,
            config,
            pools,
            job_id,
            walwriter,
        }
    }

    /// Waits until a checkpoint is stored and batches committed deferred after it deleted at least
    /// `after` more of the tenant's `total` items; `alive` panics if the worker has ended. Returns
    /// the rows the stored progress counted and the items left on the target then.
    pub(crate) async fn wait_for_deferred(
        &self,
        total: i64,
        after: i64,
        mut alive: impl FnMut(),
    ) -> (i64, i64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let job = jobs::get(&self.state, self.job_id).await.unwrap().unwrap();
            let checkpointed = Checkpoint::from_json(job.checkpoint.as_ref()).is_some();
            let stored = Progress::from_json(&job.progress).rows_deleted;
            let left = items_left(&self.target).await;
            if checkpointed && total - left >= stored + after {
                return (stored, left);
            }
            alive();
            assert!(
                Instant::now() < deadline,
                "no batch committed deferred after a checkpoint (is every batch checkpointed?): {job:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Starts an in-process worker loop; cancelling the token is its stop request.
    pub(crate) fn start_worker(&self) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let worker = Worker::new(self.pools.clone(), self.config.clone(), "in-process".into());
        let cancel = CancellationToken::new();
        let running = tokio::spawn({
            let cancel = cancel.clone();
            async move { worker.run(cancel).await }
        });
        (cancel, running)
    }

    /// Crashes the target (SIGKILL of its stopped WAL writer) and waits until it has recovered;
    /// returns a new pool on it.
    pub(crate) async fn crash_target(&self) -> sqlx::PgPool {
        signal(self.walwriter, libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(pool) = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .connect(&self.target_server.url("target"))
                .await
                && let Ok(Some(pid)) = sqlx::query_scalar::<_, i32>(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'",
                )
                .fetch_optional(&pool)
                .await
                && pid != self.walwriter
            {
                // Reinitialized: a new WAL writer runs, and recovery has ended (connections wait).
                return pool;
            }
            assert!(Instant::now() < deadline, "the target did not come back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn a_target_crash_loses_deferred_batches_but_never_a_checkpointed_one() {
    let s = Setup::prepare(CONFIG).await;
    // The first worker is a `deprov worker` process, so that it can be SIGKILLed.
    let config_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config_file.path(), CONFIG).unwrap();
    let mut first = WorkerProcess::spawn(
        &s.state_server.url("deprov"),
        Some(&s.target_server.url("target")),
        config_file.path(),
    );
    // Wait for a checkpoint, then for at least 100 rows deleted by deferred batches after it
    // (about a third of a second; the next durable batch comes a second after the checkpoint).
    let (_, seen) = s
        .wait_for_deferred(ITEMS, 100, || {
            if let Some(status) = first.child.try_wait().unwrap() {
                panic!("the worker exited ({status})\n{}", first.log());
            }
        })
        .await;
    first.child.kill().unwrap();
    let target = s.crash_target().await;
    first.child.wait().unwrap();

    // The postmaster reinitialized and recovered: the deferred batches' rows are back.
    let after = items_left(&target).await;
    assert!(
        after > seen,
        "the crash lost no deferred batch ({seen} rows left before it, {after} after): the test did not test anything"
    );
    let job = jobs::get(&s.state, s.job_id).await.unwrap().unwrap();
    let cp = Checkpoint::from_json(job.checkpoint.as_ref()).expect("a checkpoint was written");
    let Cursor::Within(parent, last) = &cp.cursor else {
        panic!("the checkpoint is not within the tenant's items: {cp:?}");
    };
    assert_eq!(parent, &vec!["1".to_string()]);
    let below: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app.items WHERE account_id = 1 AND id <= $1::bigint",
    )
    .bind(&last[0])
    .fetch_one(&target)
    .await
    .unwrap();
    assert_eq!(
        below, 0,
        "the checkpoint says items up to id {} are deleted, but {below} came back after the crash",
        last[0]
    );

    // A new worker takes the job over once the first one's lease expires, and completes it.
    let done = run_to_end(&s).await;
    assert_eq!(done.state(), JobState::Completed, "{done:?}");
    assert_eq!(items_left(&target).await, 0);
    assert_eq!(digest(&target).await, digest(&s.expected).await);
    println!(
        "{seen} items left before the crash, {after} after it; checkpoint at id {}",
        last[0]
    );
}

/// A job that completes has made its deferred batches durable: a target crash right after the
/// job's end (its WAL writer stopped all along) brings back nothing.
#[tokio::test]
async fn a_completed_job_is_durable_on_the_target() {
    // Unthrottled, the whole job fits in one checkpoint interval: every batch commits deferred.
    let s = Setup::prepare(&CONFIG.replace("rate_limit = 300", "rate_limit = 0")).await;
    let done = run_to_end(&s).await;
    assert_eq!(done.state(), JobState::Completed, "{done:?}");
    let progress = Progress::from_json(&done.progress);
    assert_eq!(progress.rows_deleted, ITEMS + 1, "{progress:?}");
    let target = s.crash_target().await;
    assert_eq!(items_left(&target).await, 0);
    assert_eq!(digest(&target).await, digest(&s.expected).await);
}

/// The target crashes and recovers while the worker runs, most likely between two batches (they
/// are half a second apart): nothing the worker does fails, its pool reconnects, and the crash lost
/// the batches committed deferred since the last checkpoint. The flush before the next checkpoint
/// sees that the target restarted ([`deprov::engine::Incarnation`]) and the job goes back to its
/// checkpoint, so deprov's own batches delete those rows again: none is left for the root row's
/// cascade (a trigger records which statement deleted each item), and `rows_deleted` counts no
/// row twice. Without the incarnation check, the rows came back and the root's cascade deleted them.
#[tokio::test]
async fn a_target_restart_between_batches_sends_the_job_back_to_its_checkpoint() {
    // 600 items of the tenant; a trigger logs each deleted item with the statement that deleted it.
    let schema = SCHEMA
        .replace("g <= 3000", "g <= 600")
        .replace("(1, 3100)", "(1, 700)")
        + r#"
CREATE TABLE public.deleted_items (id bigint, by_root boolean);
CREATE FUNCTION public.log_item() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.deleted_items VALUES (OLD.id, current_query() LIKE '%DELETE FROM "app"."accounts"%');
    RETURN OLD;
END $$;
CREATE TRIGGER log_item AFTER DELETE ON app.items FOR EACH ROW EXECUTE FUNCTION public.log_item();
"#;
    // 50-row batches at 100 rows/s: a batch every half second, a checkpoint every second.
    let s = Setup::prepare_with(
        &schema,
        &CONFIG.replace("rate_limit = 300", "rate_limit = 100"),
    )
    .await;
    let (cancel, running) = s.start_worker();
    // A checkpoint, then a batch committed deferred after it.
    let (_, seen) = s
        .wait_for_deferred(600, 50, || {
            assert!(!running.is_finished(), "the worker ended");
        })
        .await;
    let target = s.crash_target().await;
    // (The worker goes on meanwhile, so the rows the crash brought back are not counted here.)
    let after = items_left(&target).await;
    let done = wait_for_job(&s.state, s.job_id, "the job to end", |j| {
        matches!(j.state(), JobState::Completed | JobState::Failed)
    })
    .await;
    cancel.cancel();
    running.await.unwrap();
    assert_eq!(done.state(), JobState::Completed, "{done:?}");
    let (by_root, by_batches): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE by_root), count(*) FILTER (WHERE NOT by_root) FROM public.deleted_items",
    )
    .fetch_one(&target)
    .await
    .unwrap();
    let progress = Progress::from_json(&done.progress);
    println!(
        "{seen} items left before the crash, {after} after; the job's last error: {:?}; rewinds {}; rows_deleted {}; items deleted by the root's cascade {by_root}",
        done.last_error, progress.rewinds, progress.rows_deleted
    );
    assert_eq!(
        by_root, 0,
        "items the crash brought back were left to the root row's cascade"
    );
    assert!(by_batches >= 600, "{by_batches}");
    assert!(progress.rewinds >= 1, "{progress:?}");
    // Batches between the checkpoint and the restart that survived it are redone as empty, so
    // they are not counted: `rows_deleted` never counts a row twice, and misses at most the rows of
    // one checkpoint interval (100 rows/s × 1 s).
    assert!(
        (501..=601).contains(&progress.rows_deleted),
        "rows_deleted after a rewind: {progress:?}"
    );
    assert_eq!(digest(&target).await, digest(&s.expected).await);
}

/// Statistics resets (`pg_stat_reset_shared('bgwriter')`, which look like a restart) during a job
/// in deferred mode: the first one rewinds the run, which goes on at once with every batch
/// durable; a second reset changes nothing, no attempt is spent, and `rows_deleted` misses at most
/// one checkpoint interval of rows (rewinds do not add up in it).
#[tokio::test]
async fn statistics_resets_cost_one_rewind_and_no_attempt() {
    let schema = SCHEMA
        .replace("g <= 3000", "g <= 1500")
        .replace("(1, 3100)", "(1, 1600)");
    // 50-row batches at 200 rows/s: four a second, a checkpoint every second; 7.5 s in all.
    let s = Setup::prepare_with(
        &schema,
        &CONFIG.replace("rate_limit = 300", "rate_limit = 200"),
    )
    .await;
    let (cancel, running) = s.start_worker();
    let alive = || assert!(!running.is_finished(), "the worker ended");
    let reset = || async {
        sqlx::query("SELECT pg_stat_reset_shared('bgwriter')")
            .execute(&s.target)
            .await
            .unwrap();
    };
    s.wait_for_deferred(1500, 50, alive).await;
    reset().await;
    let seen = items_left(&s.target).await;
    // A second reset once 100 more items are gone: in deferred mode it would rewind again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while items_left(&s.target).await > seen - 100 {
        alive();
        assert!(Instant::now() < deadline, "the job stopped deleting");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    reset().await;
    let left = items_left(&s.target).await;
    assert!(left > 0, "the job ended before the second reset");
    let done = wait_for_job(&s.state, s.job_id, "the job to end", |j| {
        matches!(j.state(), JobState::Completed | JobState::Failed)
    })
    .await;
    cancel.cancel();
    running.await.unwrap();
    let progress = Progress::from_json(&done.progress);
    println!(
        "{seen} items left after the first reset, {left} after the second; attempts {}, rewinds {}, rows_deleted {}",
        done.attempts, progress.rewinds, progress.rows_deleted
    );
    assert_eq!(done.state(), JobState::Completed, "{done:?}");
    assert_eq!(done.attempts, 1, "a restart spent an attempt: {done:?}");
    assert_eq!(progress.rewinds, 1, "{progress:?}");
    // 1,501 rows (1,500 items and the account); one interval (1 s at 200 rows/s, plus a batch)
    // may be missing.
    assert!(
        (1501 - 250..=1501).contains(&progress.rows_deleted),
        "rows_deleted {progress:?}"
    );
    assert_eq!(items_left(&s.target).await, 0);
    assert_eq!(digest(&s.target).await, digest(&s.expected).await);
}

/// Runs an in-process worker until the job is `completed` or `failed`.
pub(crate) async fn run_to_end(s: &Setup) -> deprov::queue::Job {
    let (cancel, running) = s.start_worker();
    let done = wait_for_job(&s.state, s.job_id, "the job to end", |j| {
        matches!(j.state(), JobState::Completed | JobState::Failed)
    })
    .await;
    cancel.cancel();
    running.await.unwrap();
    done
}
