//! The grace period: visible waiting, cancel, undo (`deprov jobs undo`), reinstalls, and the refusal
//! once the hard delete started.

use clap::Parser;
use deprov::queue::grace::{self, GraceError, ReinstallOf, Reinstalled, UndoTarget};
use deprov::queue::{JobState, audit};
use deprov::worker::{Progress, StepOutcome};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

use crate::harness::{Env, connect, digest, env_with_config};
use crate::reconcile::{grace_config, send};

fn ran(job_id: Uuid, state: &str) -> StepOutcome {
    StepOutcome::Ran {
        job_id,
        state: state.into(),
    }
}

fn parse(t: Option<&str>) -> OffsetDateTime {
    OffsetDateTime::parse(t.expect("a time"), &Rfc3339).unwrap()
}

/// Runs `deprov jobs ARGS` against the env (state and target are one database); `config` is the
/// env's configuration text, written to a file for `--config`.
async fn jobs_cli(env: &Env, config: &str, args: &[&str]) -> anyhow::Result<()> {
    let path = std::env::temp_dir().join(format!("deprov-grace-{}.toml", Uuid::now_v7()));
    std::fs::write(&path, config).unwrap();
    let url = env.server.url("target");
    let path_s = path.to_string_lossy().into_owned();
    let mut argv = vec!["deprov", "jobs", "--database-url", &url];
    argv.extend_from_slice(args);
    if args.first() == Some(&"undo") {
        argv.extend_from_slice(&["--config", &path_s, "--target-url", &url]);
    }
    let result = deprov::cli::run(deprov::cli::Cli::parse_from(argv)).await;
    let _ = std::fs::remove_file(&path);
    result
}

async fn soft_deleted(env: &Env, tenant: i64) -> bool {
    sqlx::query_scalar("SELECT deleted_at IS NOT NULL FROM app.accounts WHERE id = $1")
        .bind(tenant)
        .fetch_one(&env.db)
        .await
        .unwrap()
}

async fn projects(env: &Env, tenant: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM app.projects WHERE account_id = $1")
        .bind(tenant)
        .fetch_one(&env.db)
        .await
        .unwrap()
}

async fn started_at(env: &Env, job: Uuid) -> Option<OffsetDateTime> {
    sqlx::query_scalar("SELECT hard_delete_started_at FROM deprov.jobs WHERE id = $1")
        .bind(job)
        .fetch_one(&env.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_job_in_grace_shows_until_when_waits_and_a_cancel_keeps_the_soft_delete() {
    let env = env_with_config(&grace_config("1h")).await;
    let worker = env.worker("w1");
    let job = env.request("1").await;
    assert_eq!(worker.step().await.unwrap(), ran(job, "queued"));
    let j = env.job(job).await;
    let p = Progress::from_json(&j.progress);
    let soft = parse(p.soft_deleted_at.as_deref());
    let until = parse(p.grace_until.as_deref());
    assert_eq!(until - soft, time::Duration::hours(1));
    assert!(
        (j.run_after - until).abs() < time::Duration::seconds(1),
        "claimable again when the grace period ends: {} vs {until}",
        j.run_after
    );
    assert_eq!((j.step.as_str(), j.attempts), ("hard_delete", 0));
    assert!(
        p.note.as_deref().unwrap().contains("grace period until"),
        "{p:?}"
    );
    assert_eq!(started_at(&env, job).await, None);
    assert!(soft_deleted(&env, 1).await);
    assert_eq!(projects(&env, 1).await, 10, "nothing hard-deleted");
    assert_eq!(worker.step().await.unwrap(), StepOutcome::Idle);

    let id = job.to_string();
    jobs_cli(&env, "", &["cancel", &id, "--reason", "keep it soft"])
        .await
        .unwrap();
    assert_eq!(env.job(job).await.state(), JobState::Cancelled);
    assert!(soft_deleted(&env, 1).await, "a cancel does not undo");
    assert_eq!(projects(&env, 1).await, 10);
    assert_eq!(worker.step().await.unwrap(), StepOutcome::Idle);
}

#[tokio::test]
async fn undo_in_grace_restores_the_tenant_exactly_and_is_audited() {
    let config = grace_config("1h");
    let env = env_with_config(&config).await;
    let pristine = connect(&env.server, "pristine", 2).await;
    let worker = env.worker("w1");
    let job = env.request("1").await;
    assert_eq!(worker.step().await.unwrap(), ran(job, "queued"));
    assert!(soft_deleted(&env, 1).await);
    assert_ne!(digest(&env.db).await, digest(&pristine).await);

    let id = job.to_string();
    jobs_cli(
        &env,
        &config,
        &[
            "undo",
            &id,
            "--reason",
            "customer came back",
            "--actor",
            "carol",
        ],
    )
    .await
    .unwrap();
    let j = env.job(job).await;
    assert_eq!(j.state(), JobState::Cancelled);
    let undone: Option<OffsetDateTime> =
        sqlx::query_scalar("SELECT undone_at FROM deprov.jobs WHERE id = $1")
            .bind(job)
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert!(undone.is_some());
    assert_eq!(
        digest(&env.db).await,
        digest(&pristine).await,
        "every row as before the deletion"
    );
    let entry = &audit::list(&env.db, 1, None, Some("job.undo"))
        .await
        .unwrap()[0];
    assert_eq!(
        (
            entry.actor.as_str(),
            entry.reason.as_str(),
            entry.target.clone()
        ),
        (
            "cli:carol",
            "customer came back",
            Some(format!("job:{job}"))
        )
    );
    assert_eq!(entry.details["outcome"], "undone");
    assert_eq!(entry.details["restored_rows"], 1);
    assert_eq!(worker.step().await.unwrap(), StepOutcome::Idle);
}

#[tokio::test]
async fn a_reinstall_in_grace_cancels_the_deletion_and_restores_the_tenant() {
    let env = env_with_config(&grace_config("1h")).await;
    let pristine = connect(&env.server, "pristine", 2).await;
    let worker = env.worker("w1");
    let job = send(&env, "billing", "3", Some("uninstall-1")).await.job_id;
    assert_eq!(worker.step().await.unwrap(), ran(job, "queued"));
    let target = UndoTarget::new(&env.pools.target, &env.config);
    let of = ReinstallOf {
        subject_kind: "tenant",
        subject: "3",
        tenant: Some("3"),
        source: Some("billing"),
    };
    let mut tx = env.db.begin().await.unwrap();
    let outcome = grace::reinstall(&mut tx, target, of, "source:billing", "event installed")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let Reinstalled::Undone(undone) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        (undone.job_id, undone.restored, undone.restored_rows),
        (job, true, 1)
    );
    assert_eq!(env.job(job).await.state(), JobState::Cancelled);
    assert_eq!(digest(&env.db).await, digest(&pristine).await);

    // Again: nothing pending any more.
    let mut tx = env.db.begin().await.unwrap();
    let again = grace::reinstall(&mut tx, target, of, "source:billing", "event installed")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again, Reinstalled::NothingPending { job_id: Some(job) });
    let outcomes: Vec<String> = audit::list(&env.db, 10, None, Some("job.reinstall"))
        .await
        .unwrap()
        .iter()
        .map(|e| e.details["outcome"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(outcomes, vec!["nothing_pending", "undone"]);

    // A later uninstall of the tenant is a new deletion: a new job.
    let later = send(&env, "billing", "3", Some("uninstall-2")).await;
    assert!(!later.duplicate);
    assert_ne!(later.job_id, job);
    assert_eq!(later.state, "queued");
}

#[tokio::test]
async fn undo_and_reinstall_are_refused_once_the_hard_delete_started() {
    let config = grace_config("0s");
    let env = env_with_config(&config).await;
    let worker = env.worker("w1");
    let done = env.request("1").await;
    assert_eq!(worker.step().await.unwrap(), ran(done, "completed"));
    let started = started_at(&env, done).await.expect("stamped");
    let p = Progress::from_json(&env.job(done).await.progress);
    assert_eq!(parse(p.hard_delete_started_at.as_deref()), started);

    let target = UndoTarget::new(&env.pools.target, &env.config);
    let mut tx = env.db.begin().await.unwrap();
    let err = grace::undo(&mut tx, target, done, "cli", "too late?")
        .await
        .expect_err("refused");
    tx.rollback().await.unwrap();
    assert!(
        matches!(&err, GraceError::HardDeleteStarted { job, .. } if *job == done),
        "{err}"
    );
    let err = jobs_cli(&env, &config, &["undo", &done.to_string(), "--reason", "x"])
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("nothing to undo"), "{err}");

    // Failed part way through its hard delete (a lock outlasts every attempt): refused too.
    let mut blocker = env.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM app.folders WHERE account_id = 4 FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let failed = env.request("4").await;
    for _ in 0..20 {
        if env.job(failed).await.state() == JobState::Failed {
            break;
        }
        // Not a sleep: a claim waits for the retry's backoff (1-2 ms) to pass.
        worker.step().await.unwrap();
    }
    blocker.rollback().await.unwrap();
    assert_eq!(env.job(failed).await.state(), JobState::Failed);
    assert!(started_at(&env, failed).await.is_some());
    let mut tx = env.db.begin().await.unwrap();
    let err = grace::undo(&mut tx, target, failed, "cli", "x")
        .await
        .expect_err("refused");
    tx.rollback().await.unwrap();
    assert!(matches!(err, GraceError::HardDeleteStarted { .. }), "{err}");
    assert!(soft_deleted(&env, 4).await, "nothing was undone");

    // A reinstall of tenant 1 after its hard delete: nothing to undo, answered and recorded.
    let mut tx = env.db.begin().await.unwrap();
    let of = ReinstallOf {
        subject_kind: "tenant",
        subject: "1",
        tenant: Some("1"),
        source: Some("billing"),
    };
    let outcome = grace::reinstall(&mut tx, target, of, "source:billing", "installed")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(
        matches!(&outcome, Reinstalled::TooLate { job_id, state, .. } if *job_id == done && state == "completed"),
        "{outcome:?}"
    );
    let entry = &audit::list(&env.db, 1, None, Some("job.reinstall"))
        .await
        .unwrap()[0];
    assert_eq!(entry.details["outcome"], "too_late");
    assert_eq!(
        entry.target.as_deref(),
        Some(format!("job:{done}").as_str())
    );
}

#[tokio::test]
async fn a_reinstall_of_a_running_job_stops_it_cancelled_and_a_second_reinstall_undoes() {
    use deprov::queue::jobs::{self, Outcome};
    let env = env_with_config(&grace_config("1h")).await;
    let pristine = connect(&env.server, "pristine", 2).await;
    let job = env.request("1").await;
    assert_eq!(env.worker("w1").step().await.unwrap(), ran(job, "queued"));
    // Another worker claims it right now (before its hard delete): make it claimable and claim it.
    sqlx::query("UPDATE deprov.jobs SET run_after = now() WHERE id = $1")
        .bind(job)
        .execute(&env.db)
        .await
        .unwrap();
    let claimed = jobs::claim(&env.db, "w-other", std::time::Duration::from_secs(30))
        .await
        .unwrap()
        .expect("claimable");
    assert_eq!(claimed.id, job);
    let target = UndoTarget::new(&env.pools.target, &env.config);
    let of = ReinstallOf {
        subject_kind: "tenant",
        subject: "1",
        tenant: Some("1"),
        source: Some("billing"),
    };
    let reinstall = || async {
        let mut tx = env.db.begin().await.unwrap();
        let out = grace::reinstall(&mut tx, target, of, "source:billing", "installed")
            .await
            .unwrap();
        tx.commit().await.unwrap();
        out
    };
    assert_eq!(
        reinstall().await,
        Reinstalled::CancelRequested { job_id: job }
    );
    // Its worker can no longer start the hard delete, and its hand-back (to wait out the grace
    // period) ends the job cancelled instead of queued.
    let mut tx = env.db.begin().await.unwrap();
    let stamp = grace::mark_hard_delete_started(&mut *tx, job, "w-other")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(stamp, None);
    let handed = jobs::finish(
        &env.db,
        job,
        "w-other",
        &Outcome::Wait(std::time::Duration::from_secs(3600)),
        &claimed.progress,
    )
    .await
    .unwrap();
    assert!(handed);
    let j = env.job(job).await;
    assert_eq!(j.state(), JobState::Cancelled);
    assert!(j.finished_at.is_some());
    assert!(soft_deleted(&env, 1).await, "not undone yet");
    let Reinstalled::Undone(undone) = reinstall().await else {
        panic!("second reinstall undoes")
    };
    assert_eq!((undone.job_id, undone.restored), (job, true));
    assert_eq!(digest(&env.db).await, digest(&pristine).await);
}

/// Runs a reinstall of tenant `tenant` reported by `source` (`None`: a source whose reinstalls
/// reach any source's deletion) in its own transaction.
async fn reinstall_from(env: &Env, source: Option<&str>, tenant: &str) -> Reinstalled {
    let target = UndoTarget::new(&env.pools.target, &env.config);
    let of = ReinstallOf {
        subject_kind: "tenant",
        subject: tenant,
        tenant: Some(tenant),
        source,
    };
    let mut tx = env.db.begin().await.unwrap();
    let actor = format!("source:{}", source.unwrap_or("app"));
    let outcome = grace::reinstall(&mut tx, target, of, &actor, "back")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    outcome
}

#[tokio::test]
async fn a_reinstall_reaches_only_a_deletion_its_source_requested_and_no_other_sources() {
    let env = env_with_config(&grace_config("1h")).await;
    let worker = env.worker("w1");
    let job = send(&env, "acme", "3", Some("uninstall-1")).await.job_id;
    assert_eq!(worker.step().await.unwrap(), ran(job, "queued"));

    // billing never asked for tenant 3's deletion: its reinstall finds nothing.
    assert_eq!(
        reinstall_from(&env, Some("billing"), "3").await,
        Reinstalled::NothingPending { job_id: None }
    );
    assert_eq!(env.job(job).await.state(), JobState::Queued);
    assert!(soft_deleted(&env, 3).await, "nothing was undone");

    // Once both asked, neither's reinstall withdraws the other's request.
    assert_eq!(
        send(&env, "billing", "3", Some("uninstall-2")).await.job_id,
        job
    );
    assert_eq!(
        reinstall_from(&env, Some("billing"), "3").await,
        Reinstalled::RequestedByOthers {
            job_id: job,
            sources: vec!["acme".into()]
        }
    );
    assert_eq!(
        reinstall_from(&env, Some("acme"), "3").await,
        Reinstalled::RequestedByOthers {
            job_id: job,
            sources: vec!["billing".into()]
        }
    );
    assert_eq!(env.job(job).await.state(), JobState::Queued);
    assert!(soft_deleted(&env, 3).await, "nothing was undone");
    let outcomes: Vec<String> = audit::list(&env.db, 10, None, Some("job.reinstall"))
        .await
        .unwrap()
        .iter()
        .map(|e| e.details["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        outcomes,
        [
            "requested_by_others",
            "requested_by_others",
            "nothing_pending"
        ]
    );

    // The application's install flow (`reinstalls = "any"`) reaches it whoever asked.
    let Reinstalled::Undone(undone) = reinstall_from(&env, None, "3").await else {
        panic!("undone")
    };
    assert_eq!((undone.job_id, undone.restored), (job, true));
    assert_eq!(env.job(job).await.state(), JobState::Cancelled);
    assert!(!soft_deleted(&env, 3).await, "restored");
}

#[tokio::test]
async fn undoing_a_job_whose_key_the_column_cannot_read_restores_nothing_and_cancels_it() {
    let env = env_with_config(&grace_config("1h")).await;
    let pristine = connect(&env.server, "pristine", 2).await;
    // A signed sender's key is never refused; app.accounts.id is a bigint.
    let job = send(&env, "billing", "icfg_49", Some("uninstall-1"))
        .await
        .job_id;
    let target = UndoTarget::new(&env.pools.target, &env.config);
    let mut tx = env.db.begin().await.unwrap();
    let undone = grace::undo(&mut tx, target, job, "cli", "wrong sender")
        .await
        .expect("nothing of such a tenant can exist: nothing to restore");
    tx.commit().await.unwrap();
    assert_eq!((undone.restored, undone.restored_rows), (false, 0));
    assert_eq!(env.job(job).await.state(), JobState::Cancelled);
    assert_eq!(digest(&env.db).await, digest(&pristine).await);
}
