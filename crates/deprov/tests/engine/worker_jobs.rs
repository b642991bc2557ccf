use deprov::queue::JobState;
use deprov::queue::kill_switch;
use deprov::worker::{Checkpoint, Progress, StepOutcome};

use crate::harness::{config_text, digest, env, env_with_config, wait_for_job};

#[tokio::test]
async fn hard_delete_equals_the_cascade_and_spares_other_tenants() {
    let env = env("").await;
    let expected = env.cascade_copy(1).await;
    let before = digest(&env.db).await;
    let job_id = env.request("1").await;
    let outcomes = env.drain(&env.worker("w1")).await;
    assert_eq!(
        outcomes,
        vec![StepOutcome::Ran {
            job_id,
            state: "completed".into()
        }]
    );

    let job = env.job(job_id).await;
    assert_eq!(job.state(), JobState::Completed);
    assert!(job.finished_at.is_some());
    let after = digest(&env.db).await;
    assert_eq!(
        after,
        digest(&expected).await,
        "deprov's result differs from the cascade's"
    );
    assert_ne!(after, before, "nothing was deleted");

    // Figures: every tenant row is accounted for by deprov's own batches (leaves first: the cascade
    // below each batch had nothing left to do).
    let progress = Progress::from_json(&job.progress);
    let tenant_rows: i64 =
        before.values().map(|(n, _)| n).sum::<i64>() - after.values().map(|(n, _)| n).sum::<i64>();
    assert_eq!(progress.rows_deleted, tenant_rows);
    assert!(
        progress.batches > 10,
        "batch_rows = 7 should take many batches: {progress:?}"
    );
    assert!(progress.tables.iter().all(|t| t.done), "{progress:?}");
    assert_eq!(progress.soft_deleted_rows, Some(1));

    // The SET NULL reference from other tenants was applied, their rows kept.
    let nulled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app.shares WHERE account_id <> 1 AND project_id IS NULL",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(nulled, 3);
    // The deployment of another tenant's environment built from tenant 1's build went, as in the cascade.
    let gone: i64 = sqlx::query_scalar("SELECT count(*) FROM app.deployments WHERE id = 999999")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(gone, 0);
}

#[tokio::test]
async fn a_restrict_reference_fails_the_job_before_anything_is_deleted() {
    let env = env("").await;
    let before = digest(&env.db).await;
    let job_id = env.request("2").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(job_id).await;
    assert_eq!(job.state(), JobState::Failed);
    let error = job.last_error.unwrap();
    assert!(error.contains("\"app\".\"invoices\""), "{error}");
    assert!(
        error.contains("accounts_invoices") || error.contains("invoices_account_id_fkey"),
        "{error}"
    );
    assert_eq!(
        digest(&env.db).await,
        before,
        "a blocked job must not change anything, not even the soft delete"
    );
}

#[tokio::test]
async fn vercel_installation_is_resolved_by_the_worker() {
    let env = env("").await;
    let expected = env.cascade_copy(3).await;
    let job_id = env.request_installation("icfg_3").await;
    assert_eq!(
        env.job(job_id).await.tenant_id,
        None,
        "intake must not resolve: it never touches the target"
    );
    env.drain(&env.worker("w1")).await;
    let job = env.job(job_id).await;
    assert_eq!(
        (job.state(), job.tenant_id.as_deref()),
        (JobState::Completed, Some("3"))
    );
    assert_eq!(digest(&env.db).await, digest(&expected).await);

    let unknown = env.request_installation("icfg_nope").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(unknown).await;
    assert_eq!(job.state(), JobState::Completed);
    assert!(
        Progress::from_json(&job.progress)
            .note
            .unwrap()
            .contains("no tenant")
    );
}

#[tokio::test]
async fn a_tenant_without_a_root_row_completes_at_once_with_nothing_run() {
    let env = env("").await;
    let before = digest(&env.db).await;
    // Spelled as the key column does not print it: the job is keyed by "4242" first.
    let job_id = env.request(" 04242").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(job_id).await;
    assert_eq!(
        (job.state(), job.tenant_id.as_deref()),
        (JobState::Completed, Some("4242"))
    );
    let progress = Progress::from_json(&job.progress);
    let note = progress.note.clone().unwrap_or_default();
    assert!(
        note.contains("has key \"4242\"; nothing to delete"),
        "{note}"
    );
    assert_eq!(
        (
            progress.soft_deleted_at.is_some(),
            progress.prechecks,
            progress.batches,
            progress.rows_deleted
        ),
        (false, 0, 0, 0),
        "no soft delete, pre-check or batch runs for a missing tenant: {progress:?}"
    );
    assert_eq!(digest(&env.db).await, before);

    // A tenant switch on that key still holds it: held means nothing runs, not even this.
    let mut conn = env.db.acquire().await.unwrap();
    let scope = kill_switch::Scope::Tenant("4243".into());
    kill_switch::set_scope(&mut conn, &scope, true, "incident", "test")
        .await
        .unwrap();
    drop(conn);
    let held = env.request("4243").await;
    env.drain(&env.worker("w1")).await;
    assert_eq!(env.job(held).await.state(), JobState::Held);
}

#[tokio::test]
async fn kill_switch_holds_at_a_batch_boundary_and_release_resumes_from_the_checkpoint() {
    // 20 rows/s (after a 20-row burst): from its third 7-row batch on, the job waits ~0.35 s per
    // batch, so the switch is engaged while it runs however slowly this test sees its progress
    // (without a limit the tenant's last batches could finish first on a loaded machine).
    let env = env("[pacing]\nrate_limit = 20").await;
    let expected = env.cascade_copy(1).await;
    let job_id = env.request("1").await;
    let worker = env.worker("w1");
    let running = tokio::spawn(async move { worker.step().await.unwrap() });
    wait_for_job(&env.db, job_id, "some batches", |j| {
        Progress::from_json(&j.progress).batches >= 3
    })
    .await;
    let mut conn = env.db.acquire().await.unwrap();
    kill_switch::set(&mut conn, true, "incident", "test")
        .await
        .unwrap();
    assert_eq!(
        running.await.unwrap(),
        StepOutcome::Ran {
            job_id,
            state: "held".into()
        }
    );

    let held = env.job(job_id).await;
    assert_eq!(held.state(), JobState::Held);
    let cp = Checkpoint::from_json(held.checkpoint.as_ref()).expect("checkpoint recorded");
    let deleted_when_held = Progress::from_json(&held.progress).rows_deleted;
    assert!(deleted_when_held > 0);
    // While engaged nothing is claimed and nothing more is deleted; new requests are still recorded.
    let other = env.request("3").await;
    assert_eq!(env.job(other).await.state(), JobState::Held);
    assert_eq!(env.worker("w2").step().await.unwrap(), StepOutcome::Idle);
    assert_eq!(
        Progress::from_json(&env.job(job_id).await.progress).rows_deleted,
        deleted_when_held
    );

    kill_switch::set(&mut conn, false, "over", "test")
        .await
        .unwrap();
    drop(conn);
    // The rest of the job without the limit (the test is about the hold and the resume).
    let unlimited = deprov::config::Config::from_toml(&config_text("")).unwrap();
    let w2 = deprov::worker::Worker::new(
        env.pools.clone(),
        std::sync::Arc::new(unlimited),
        "w2".into(),
    );
    let first = w2.step().await.unwrap();
    assert_eq!(
        first,
        StepOutcome::Ran {
            job_id,
            state: "completed".into()
        }
    );
    let done = env.job(job_id).await;
    let resumed = Progress::from_json(&done.progress);
    assert!(resumed.batches > 3 && cp.step < 100);
    assert_eq!(
        done.attempts, 1,
        "a claim that ended held is not counted as an attempt"
    );
    // Tenant 3's job is still queued (the oldest job ran first): the database equals tenant 1's cascade.
    assert_eq!(env.job(other).await.state(), JobState::Queued);
    assert_eq!(digest(&env.db).await, digest(&expected).await);
}

#[tokio::test]
async fn lock_timeouts_are_retried_with_backoff_and_exhausted_attempts_fail() {
    let env = env("").await;
    let job_id = env.request("4").await;
    // Hold a lock on one of tenant 4's rows the hard delete needs.
    let mut blocker = env.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM app.folders WHERE account_id = 4 FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let worker = env.worker("w1");
    let outcome = worker.step().await.unwrap();
    assert_eq!(
        outcome,
        StepOutcome::Ran {
            job_id,
            state: "queued".into()
        }
    );
    let job = env.job(job_id).await;
    assert!(
        job.last_error.as_deref().unwrap().contains("55P03"),
        "{:?}",
        job.last_error
    );
    assert_eq!(job.attempts, 1);
    // Keep failing until attempts run out: the job ends failed, never stuck running.
    let mut last = String::new();
    for _ in 0..10 {
        let job = wait_for_job(&env.db, job_id, "run_after", |j| {
            j.run_after <= time::OffsetDateTime::now_utc()
        })
        .await;
        if job.state() != JobState::Queued {
            break;
        }
        if let StepOutcome::Ran { state, .. } = worker.step().await.unwrap() {
            last = state;
        }
    }
    assert_eq!(last, "failed");
    let job = env.job(job_id).await;
    assert_eq!(job.state(), JobState::Failed);
    assert!(job.last_error.unwrap().contains("attempts exhausted"));
    blocker.rollback().await.unwrap();
}

#[tokio::test]
async fn batches_grow_with_time_to_spare_and_shrink_at_once_on_a_statement_timeout() {
    // Grow: from 7 rows, up to 1000, aiming at half of 100 ms.
    let config = config_text("")
        .replace("max_batch_rows = 7", "max_batch_rows = 1000")
        .replace("\"800ms\"", "\"100ms\"");
    let env = env_with_config(&config).await;
    let job_id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let grown = Progress::from_json(&env.job(job_id).await.progress);
    assert_eq!(env.job(job_id).await.state(), JobState::Completed);
    assert!(
        grown.batches * 7 < grown.rows_deleted / 2,
        "batches did not grow: {grown:?}"
    );

    // Shrink: 60 ms per deleted event of one deployment of tenant 3, so a batch of 7 of them
    // (420 ms) exceeds statement_timeout (200 ms) while one (60 ms) does not.
    let config = config_text("")
        .replace("\"900ms\"", "\"200ms\"")
        .replace("\"800ms\"", "\"100ms\"");
    let env = env_with_config(&config).await;
    let expected = env.cascade_copy(3).await;
    sqlx::raw_sql(
        "CREATE FUNCTION app.slow() RETURNS trigger LANGUAGE plpgsql AS \
           'BEGIN IF OLD.deployment_id = (SELECT min(id) FROM app.deployments WHERE env_id / 1000 = 3) \
                  THEN PERFORM pg_sleep(0.06); END IF; RETURN OLD; END'; \
         CREATE TRIGGER slow BEFORE DELETE ON app.events FOR EACH ROW EXECUTE FUNCTION app.slow();",
    )
    .execute(&env.db)
    .await
    .unwrap();
    let job_id = env.request("3").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(job_id).await;
    let progress = Progress::from_json(&job.progress);
    assert_eq!(job.state(), JobState::Completed, "{:?}", job.last_error);
    assert_eq!(
        job.attempts, 1,
        "the timeout was absorbed by shrinking, not by a retry"
    );
    assert!(progress.timeouts >= 1, "{progress:?}");
    assert!(progress.longest_batch_ms < 200.0, "{progress:?}");
    assert_eq!(digest(&env.db).await, digest(&expected).await);
}

#[tokio::test]
async fn a_tree_is_deleted_leaves_first_by_deprovs_own_batches() {
    // Two rows per batch against folder chains six deep: ascending order would delete a chain's root
    // first and let the cascade take the other five inside that batch.
    let config = config_text("")
        .replace("batch_rows = 7", "batch_rows = 2")
        .replace("max_batch_rows = 7", "max_batch_rows = 2");
    let env = env_with_config(&config).await;
    let expected = env.cascade_copy(1).await;
    let job_id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let progress = Progress::from_json(&env.job(job_id).await.progress);
    let folders = progress.table("\"app\".\"folders\"").unwrap();
    assert_eq!(
        folders.rows_deleted, 6,
        "every folder deleted by a batch, none by the cascade: {folders:?}"
    );
    assert_eq!(digest(&env.db).await, digest(&expected).await);
}

#[tokio::test]
async fn an_installation_resolving_to_a_tenant_with_an_active_job_merges_into_it() {
    let env = env("").await;
    let expected = env.cascade_copy(3).await;
    // A tenant job for 3 exists but is not due yet; the Vercel job for its installation runs first.
    let tenant_job = env.request("3").await;
    sqlx::query("UPDATE deprov.jobs SET run_after = now() + interval '1 hour' WHERE id = $1")
        .bind(tenant_job)
        .execute(&env.db)
        .await
        .unwrap();
    let vercel_job = env.request_installation("icfg_3").await;
    env.drain(&env.worker("w1")).await;
    let merged = env.job(vercel_job).await;
    assert_eq!(merged.state(), JobState::Completed);
    assert!(
        Progress::from_json(&merged.progress)
            .note
            .unwrap()
            .contains(&tenant_job.to_string())
    );
    // The installation's request now follows the tenant's job, which has deleted nothing yet.
    let attached: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT DISTINCT job_id FROM deprov.deletion_requests")
            .fetch_all(&env.db)
            .await
            .unwrap();
    assert_eq!(attached, vec![tenant_job]);
    assert_eq!(env.job(tenant_job).await.state(), JobState::Queued);
    assert_eq!(Progress::from_json(&merged.progress).rows_deleted, 0);

    sqlx::query("UPDATE deprov.jobs SET run_after = now() WHERE id = $1")
        .bind(tenant_job)
        .execute(&env.db)
        .await
        .unwrap();
    env.drain(&env.worker("w1")).await;
    assert_eq!(env.job(tenant_job).await.state(), JobState::Completed);
    assert_eq!(digest(&env.db).await, digest(&expected).await);
}

#[tokio::test]
async fn a_resolved_installation_job_is_keyed_by_its_tenant_so_tenant_requests_attach_to_it() {
    let env = env("").await;
    let vercel_job = env.request_installation("icfg_4").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(vercel_job).await;
    assert_eq!(job.state(), JobState::Completed);
    // While it was active, the partial unique index on (subject_kind, subject) made any tenant
    // request for "4" attach to it rather than start a second deletion of the same tenant.
    assert_eq!(
        (
            job.subject_kind.as_str(),
            job.subject.as_str(),
            job.tenant_id.as_deref()
        ),
        ("tenant", "4", Some("4"))
    );
}

#[tokio::test]
async fn set_null_into_a_not_null_column_blocks_like_restrict() {
    let env = env("").await;
    // The cascade would try to set notes.project_id to NULL and fail (23502).
    sqlx::raw_sql(
        "CREATE TABLE app.notes (id bigint PRIMARY KEY, project_id bigint NOT NULL REFERENCES app.projects ON DELETE SET NULL); \
         INSERT INTO app.notes VALUES (1, 101);",
    )
    .execute(&env.db)
    .await
    .unwrap();
    let before = digest(&env.db).await;
    let job_id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(job_id).await;
    assert_eq!(job.state(), JobState::Failed);
    let error = job.last_error.unwrap();
    assert!(
        error.contains("\"app\".\"notes\"") && error.contains("nothing was deleted"),
        "{error}"
    );
    assert_eq!(digest(&env.db).await, before);
}

#[tokio::test]
async fn a_worker_waiting_on_the_rate_limit_keeps_its_lease() {
    // 7-row batches at 5 rows/s: every batch waits ~1.4 s for the rate limit, longer than the 1 s
    // lease. The lease must be renewed through the wait: a live worker's job is never taken over.
    let env = env_with_config(&config_text("[pacing]\nrate_limit = 5")).await;
    let job_id = env.request("1").await;
    let w1 = env.worker("w1");
    let task = tokio::spawn(async move { w1.step().await.unwrap() });
    let w2 = env.worker("w2");
    wait_for_job(&env.db, job_id, "its first batch", |j| {
        Progress::from_json(&j.progress).batches >= 1
    })
    .await;
    let mut polls = 0;
    loop {
        let (state, leased, deleted): (String, bool, i64) = sqlx::query_as(
            "SELECT state, lease_expires_at > now(), \
               coalesce((progress->>'rows_deleted')::bigint, 0) FROM deprov.jobs WHERE id = $1",
        )
        .bind(job_id)
        .fetch_one(&env.db)
        .await
        .unwrap();
        assert_eq!(state, "running");
        assert!(
            leased,
            "the lease ran out while its worker waited ({deleted} rows deleted)"
        );
        assert_eq!(w2.step().await.unwrap(), StepOutcome::Idle, "taken over");
        if deleted >= 28 {
            break;
        }
        polls += 1;
        assert!(
            polls < 400,
            "the job made no progress: {deleted} rows deleted"
        );
        // A poll of the job's row, not a wait for something to happen.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut tx = env.db.begin().await.unwrap();
    let cancelled = deprov::queue::operator::cancel(&mut tx, job_id, "test", "enough")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(cancelled, deprov::queue::operator::Cancelled::AtNextBatch);
    assert_eq!(
        task.await.unwrap(),
        StepOutcome::Ran {
            job_id,
            state: "cancelled".into()
        }
    );
    assert_eq!(env.job(job_id).await.attempts, 1);
}
