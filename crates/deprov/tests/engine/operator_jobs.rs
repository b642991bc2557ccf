//! Operators on jobs and scoped switches: per-tenant and per-source kill switches, `deprov jobs
//! cancel|retry` through the CLI, and the append-only audit log they write.

use clap::Parser;
use deprov::queue::intake;
use deprov::queue::kill_switch::{self, Scope};
use deprov::queue::{JobState, audit};
use deprov::worker::{Checkpoint, Progress, StepOutcome};
use uuid::Uuid;

use crate::harness::{Env, digest, env, tenant_request, wait_for_job};

async fn request_from(env: &Env, source: &str, tenant: &str) -> (Uuid, bool) {
    let req = tenant_request(source, tenant);
    let accepted = intake::record_tx(&env.pools.intake, &req, 5).await.unwrap();
    let held: bool = sqlx::query_scalar(
        "SELECT received_while_held FROM deprov.deletion_requests WHERE id = $1",
    )
    .bind(accepted.request_id)
    .fetch_one(&env.db)
    .await
    .unwrap();
    (accepted.job_id, held)
}

async fn set(env: &Env, scope: Scope, engaged: bool) -> u64 {
    let mut tx = env.db.begin().await.unwrap();
    let (_, moved) = kill_switch::set_scope(&mut tx, &scope, engaged, "drill", "test")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    moved
}

/// Runs `deprov ARGS` against the env's state database (`--database-url` after the subcommand).
async fn cli(env: &Env, command: &str, args: &[&str]) -> anyhow::Result<()> {
    let url = env.server.url("target");
    let mut argv = vec!["deprov", command, "--database-url", &url];
    argv.extend_from_slice(args);
    deprov::cli::run(deprov::cli::Cli::parse_from(argv)).await
}

#[tokio::test]
async fn tenant_and_source_switches_hold_only_their_jobs_and_release_only_what_nothing_else_blocks()
{
    let env = env("").await;
    let (t1, _) = request_from(&env, "billing", "1").await;
    let (t3, _) = request_from(&env, "partner", "3").await;
    let (t4, _) = request_from(&env, "billing", "4").await;
    assert_eq!(set(&env, Scope::Tenant("1".into()), true).await, 1);
    assert_eq!(
        set(&env, Scope::Source("billing".into()), true).await,
        1,
        "tenant 4's job"
    );
    for (job, state) in [
        (t1, JobState::Held),
        (t3, JobState::Queued),
        (t4, JobState::Held),
    ] {
        assert_eq!(env.job(job).await.state(), state);
    }
    // Requests keep being recorded: attached to a held job, or creating a held job.
    let (again, while_held) = request_from(&env, "partner", "1").await;
    assert_eq!((again, while_held), (t1, true));
    let (t5, while_held) = request_from(&env, "billing", "5").await;
    assert!(while_held);
    assert_eq!(env.job(t5).await.state(), JobState::Held);
    let (t6, while_held) = request_from(&env, "partner", "6").await;
    assert!(!while_held);

    // Only the unblocked jobs run.
    let worker = env.worker("w1");
    let ran: Vec<Uuid> = env
        .drain(&worker)
        .await
        .into_iter()
        .map(|o| match o {
            StepOutcome::Ran { job_id, .. } => job_id,
            StepOutcome::Idle => unreachable!(),
        })
        .collect();
    assert_eq!(ran, vec![t3, t6]);

    // Released for tenant 1: its job stays held, a request of it came from billing.
    assert_eq!(set(&env, Scope::Tenant("1".into()), false).await, 0);
    assert_eq!(env.job(t1).await.state(), JobState::Held);
    assert_eq!(worker.step().await.unwrap(), StepOutcome::Idle);
    assert_eq!(set(&env, Scope::Source("billing".into()), false).await, 3);
    for job in [t1, t4, t5] {
        assert_eq!(env.job(job).await.state(), JobState::Queued);
    }

    let history: Vec<(i64, String, Option<String>, bool)> = sqlx::query_as(
        "SELECT version, scope, key, engaged FROM deprov.kill_switch_history ORDER BY version",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(
        history,
        vec![
            (1, "tenant".into(), Some("1".into()), true),
            (2, "source".into(), Some("billing".into()), true),
            (3, "tenant".into(), Some("1".into()), false),
            (4, "source".into(), Some("billing".into()), false),
        ]
    );
    let global = kill_switch::get(&env.db).await.unwrap();
    assert_eq!((global.engaged, global.version), (false, 0));
    assert_eq!(kill_switch::latest_version(&env.db).await.unwrap(), 4);
    let entries = audit::list(&env.db, 10, None, Some("kill_switch."))
        .await
        .unwrap();
    let targets: Vec<_> = entries
        .iter()
        .map(|e| (e.action.as_str(), e.target.as_deref()))
        .collect();
    assert_eq!(
        targets,
        vec![
            ("kill_switch.release", Some("source:billing")),
            ("kill_switch.release", Some("tenant:1")),
            ("kill_switch.engage", Some("source:billing")),
            ("kill_switch.engage", Some("tenant:1")),
        ]
    );
}

#[tokio::test]
async fn cancel_stops_a_running_job_at_its_next_batch_and_a_queued_one_at_once() {
    // 20 rows/s (after a 20-row burst): from its third 7-row batch on, the job waits ~0.35 s per
    // batch, so the cancel lands while it runs however slowly this test sees its progress (without
    // a limit the tenant's last batches could finish first on a loaded machine).
    let env = env("[pacing]\nrate_limit = 20").await;
    let running = env.request("1").await;
    let queued = env.request("3").await;
    let worker = env.worker("w1");
    let task = tokio::spawn(async move { worker.step().await.unwrap() });
    wait_for_job(&env.db, running, "some batches", |j| {
        Progress::from_json(&j.progress).batches >= 3
    })
    .await;
    let id = running.to_string();
    cli(
        &env,
        "jobs",
        &["cancel", &id, "--reason", "wrong tenant", "--actor", "bob"],
    )
    .await
    .unwrap();
    assert_eq!(
        task.await.unwrap(),
        StepOutcome::Ran {
            job_id: running,
            state: "cancelled".into()
        }
    );
    let job = env.job(running).await;
    assert_eq!(job.state(), JobState::Cancelled);
    assert!(job.finished_at.is_some() && job.lease_owner.is_none());
    let deleted = Progress::from_json(&job.progress).rows_deleted;
    assert!(deleted > 0);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.projects WHERE account_id = 1")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert!(left > 0, "stopped before the end");

    cli(
        &env,
        "jobs",
        &["cancel", &queued.to_string(), "--reason", "duplicate"],
    )
    .await
    .unwrap();
    assert_eq!(env.job(queued).await.state(), JobState::Cancelled);
    assert_eq!(env.worker("w2").step().await.unwrap(), StepOutcome::Idle);
    let err = cli(
        &env,
        "jobs",
        &["cancel", &queued.to_string(), "--reason", "again"],
    )
    .await
    .expect_err("an ended job cannot be cancelled");
    assert!(err.to_string().contains("cancelled"), "{err}");

    let entries = audit::list(&env.db, 10, None, Some("job.")).await.unwrap();
    let seen: Vec<_> = entries
        .iter()
        .map(|e| {
            (
                e.actor.as_str(),
                e.target.clone().unwrap(),
                e.details["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("cli", format!("job:{queued}"), "cancelled"),
            ("cli:bob", format!("job:{running}"), "cancel_requested"),
        ]
    );
    assert_eq!(entries[1].reason, "wrong tenant");
}

#[tokio::test]
async fn retry_re_drives_a_failed_job_from_its_checkpoint_to_the_cascades_result() {
    let env = env("").await;
    let expected = env.cascade_copy(4).await;
    let job_id = env.request("4").await;
    // A lock on one of tenant 4's folders outlasts every attempt: the job fails part way.
    let mut blocker = env.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM app.folders WHERE account_id = 4 FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let worker = env.worker("w1");
    for _ in 0..20 {
        if env.job(job_id).await.state() == JobState::Failed {
            break;
        }
        // Not a sleep: a claim waits for the retry's backoff (1-2 ms) to pass.
        worker.step().await.unwrap();
    }
    let failed = env.job(job_id).await;
    assert_eq!(failed.state(), JobState::Failed, "{failed:?}");
    let cp = Checkpoint::from_json(failed.checkpoint.as_ref()).expect("a checkpoint");
    assert!(cp.step > 0, "the failure came after some steps");
    let before = Progress::from_json(&failed.progress);
    assert!(before.rows_deleted > 0);
    blocker.rollback().await.unwrap();

    let id = job_id.to_string();
    let err = cli(
        &env,
        "jobs",
        &["retry", &Uuid::now_v7().to_string(), "--reason", "x"],
    )
    .await
    .expect_err("no such job");
    assert!(err.to_string().contains("no job"), "{err}");
    cli(
        &env,
        "jobs",
        &["retry", &id, "--reason", "lock holder gone"],
    )
    .await
    .unwrap();
    let queued = env.job(job_id).await;
    assert_eq!((queued.state(), queued.attempts), (JobState::Queued, 0));
    assert_eq!(
        queued.checkpoint, failed.checkpoint,
        "the checkpoint is kept"
    );
    assert_eq!(
        worker.step().await.unwrap(),
        StepOutcome::Ran {
            job_id,
            state: "completed".into()
        }
    );
    let done = env.job(job_id).await;
    assert_eq!(done.attempts, 1);
    assert_eq!(digest(&env.db).await, digest(&expected).await);
    let err = cli(&env, "jobs", &["retry", &id, "--reason", "again"])
        .await
        .expect_err("completed");
    assert!(err.to_string().contains("only failed jobs"), "{err}");
    let entry = &audit::list(&env.db, 1, None, Some("job.retry"))
        .await
        .unwrap()[0];
    assert_eq!(entry.details["previous_state"], "failed");
    assert_eq!(entry.details["new_state"], "queued");
    cli(&env, "jobs", &["list"]).await.unwrap();
    cli(&env, "jobs", &["show", &id, "--json"]).await.unwrap();
    cli(&env, "audit", &["list"]).await.unwrap();
}

#[tokio::test]
async fn the_audit_log_refuses_update_delete_and_truncate_even_for_a_superuser() {
    let env = env("").await;
    let mut tx = env.db.begin().await.unwrap();
    audit::record(
        &mut *tx,
        "test",
        "job.cancel",
        Some("job:x"),
        "why",
        &serde_json::json!({}),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    for statement in [
        "UPDATE deprov.audit_log SET reason = 'rewritten'",
        "DELETE FROM deprov.audit_log",
        "TRUNCATE deprov.audit_log",
    ] {
        let err = sqlx::query(statement)
            .execute(&env.db)
            .await
            .expect_err(statement);
        let code = err
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "{statement}: {err}");
    }
    let rows: Vec<(String,)> = sqlx::query_as("SELECT reason FROM deprov.audit_log")
        .fetch_all(&env.db)
        .await
        .unwrap();
    assert_eq!(rows, vec![("why".to_owned(),)]);
}

/// Claims the next job for a worker that then dies.
async fn claim_for_a_dead_worker(env: &Env) -> Uuid {
    deprov::queue::jobs::claim(&env.db, "dead-worker", std::time::Duration::from_secs(30))
        .await
        .unwrap()
        .expect("a job to claim")
        .id
}

#[tokio::test]
async fn a_dead_workers_job_under_a_kill_switch_is_held_and_can_be_cancelled_at_once() {
    let env = env("").await;
    let expected = env.cascade_copy(1).await;
    let stranded = env.request("1").await;
    let to_cancel = env.request("3").await;
    assert_eq!(claim_for_a_dead_worker(&env).await, stranded);
    assert_eq!(claim_for_a_dead_worker(&env).await, to_cancel);
    set(&env, Scope::Global, true).await;
    // The dead worker's leases run out (made to have expired instead of waiting them out).
    sqlx::query("UPDATE deprov.jobs SET lease_expires_at = now() - interval '1 second'")
        .execute(&env.db)
        .await
        .unwrap();

    // Its worker is gone: the cancel ends the job now instead of waiting for a batch boundary that
    // no worker will reach while the switch is engaged.
    cli(
        &env,
        "jobs",
        &["cancel", &to_cancel.to_string(), "--reason", "wrong tenant"],
    )
    .await
    .unwrap();
    let cancelled = env.job(to_cancel).await;
    assert_eq!(cancelled.state(), JobState::Cancelled, "{cancelled:?}");
    assert!(cancelled.finished_at.is_some() && cancelled.lease_owner.is_none());
    let entry = &audit::list(&env.db, 1, None, Some("job.cancel"))
        .await
        .unwrap()[0];
    assert_eq!(entry.details["outcome"], "cancelled");

    // A live worker finds nothing to claim, but hands the stranded job back `held`.
    let worker = env.worker("w1");
    assert_eq!(worker.step().await.unwrap(), StepOutcome::Idle);
    let held = env.job(stranded).await;
    assert_eq!(held.state(), JobState::Held, "{held:?}");
    assert!(held.lease_owner.is_none() && held.lease_expires_at.is_none());

    // Releasing the switch queues it like any held job, and it completes to the cascade's result.
    assert_eq!(set(&env, Scope::Global, false).await, 1);
    assert_eq!(
        worker.step().await.unwrap(),
        StepOutcome::Ran {
            job_id: stranded,
            state: "completed".into()
        }
    );
    assert_eq!(digest(&env.db).await, digest(&expected).await);
}
