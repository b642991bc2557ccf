//! `deprov reconcile`: the listing of every category with exact rows, the paced release, and that
//! replaying a reconcile or the same requests changes nothing.

use deprov::engine::BatchLimits;
use deprov::ids::DedupBasis;
use deprov::queue::intake::{self, Accepted, NewRequest, SubjectKind};
use deprov::queue::reconcile::{self, Acting, Actions, Filter, Orphans, Report};
use deprov::queue::{JobState, audit, kill_switch};
use deprov::worker::StepOutcome;
use uuid::Uuid;

use crate::harness::{Env, config_text, env_with_config};

/// The fixture's configuration with undo statements, the orphans statement and `grace_period`.
pub fn grace_config(grace: &str) -> String {
    config_text("")
        .replace(
            "[soft_delete]\n",
            "[soft_delete]\n\
             undo_statements = [\"UPDATE app.accounts SET deleted_at = NULL WHERE id = $1\"]\n\
             orphans = \"SELECT id FROM app.accounts WHERE deleted_at IS NOT NULL\"\n",
        )
        .replace(
            "[hard_delete]\n",
            &format!("[hard_delete]\ngrace_period = \"{grace}\"\n"),
        )
}

/// Records a request for `tenant` from `source`, keyed by `external_id` (else the tenant).
pub async fn send(env: &Env, source: &str, tenant: &str, external_id: Option<&str>) -> Accepted {
    let req = NewRequest {
        source: source.into(),
        basis: if external_id.is_some() {
            DedupBasis::ExternalId
        } else {
            DedupBasis::TenantId
        },
        dedup_key: external_id.unwrap_or(tenant).into(),
        subject_kind: SubjectKind::Tenant,
        subject: tenant.into(),
        external_id: external_id.map(str::to_owned),
        reason: None,
    };
    intake::record_tx(&env.pools.intake, &req, 5).await.unwrap()
}

fn limits(env: &Env) -> BatchLimits {
    BatchLimits::from(&env.config.hard_delete)
}

async fn report(env: &Env, filter: &Filter, orphans: Option<&str>) -> Report {
    let mut tx = env.db.begin().await.unwrap();
    let r = reconcile::report(&mut tx, &env.pools.target, orphans, &limits(env), filter)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    r
}

async fn apply(
    env: &Env,
    filter: &Filter,
    actions: Actions,
    rate: f64,
    commit: bool,
) -> reconcile::Applied {
    let mut tx = env.db.begin().await.unwrap();
    let acting = Acting {
        actor: "cli:alice",
        reason: "after incident 7",
        rate,
        max_attempts: 5,
    };
    let applied = reconcile::apply(
        &mut tx,
        &env.pools.target,
        env.config.soft_delete.orphans.as_deref(),
        &limits(env),
        filter,
        actions,
        &acting,
    )
    .await
    .unwrap();
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    applied
}

/// Engages or releases the kill switch of tenant 1.
async fn engage(env: &Env, engaged: bool) {
    let mut tx = env.db.begin().await.unwrap();
    kill_switch::set_scope(
        &mut tx,
        &kill_switch::Scope::Tenant("1".into()),
        engaged,
        "incident 7",
        "test",
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

fn ran(job_id: Uuid, state: &str) -> StepOutcome {
    StepOutcome::Ran {
        job_id,
        state: state.into(),
    }
}

#[tokio::test]
async fn reconcile_lists_held_failed_in_grace_collapsed_and_orphans_with_exact_rows() {
    let env = env_with_config(&grace_config("1h")).await;
    let worker = env.worker("w1");
    // Tenant 3: soft-deleted, then waiting in its grace period.
    let in_grace = send(&env, "billing", "3", None).await.job_id;
    assert_eq!(worker.step().await.unwrap(), ran(in_grace, "queued"));
    // Tenant 2: an invoice (RESTRICT) refuses it: failed, nothing deleted.
    let failed = send(&env, "billing", "2", None).await.job_id;
    assert_eq!(worker.step().await.unwrap(), ran(failed, "failed"));
    // Tenant 1 during the incident: held, a second request collapsed onto it, one retried delivery.
    engage(&env, true).await;
    let first = send(&env, "billing", "1", None).await;
    let second = send(&env, "partner", "1", Some("evt-1")).await;
    let again = send(&env, "billing", "1", None).await;
    assert_eq!(
        (second.job_id, again.job_id, again.duplicate),
        (first.job_id, first.job_id, true)
    );
    let held = first.job_id;
    // Tenant 4: soft-deleted on the target, but its job was never created (an orphan).
    sqlx::query("UPDATE app.accounts SET deleted_at = now() WHERE id = 4")
        .execute(&env.db)
        .await
        .unwrap();

    let r = report(
        &env,
        &Filter::default(),
        env.config.soft_delete.orphans.as_deref(),
    )
    .await;
    let requests =
        |rows: &[reconcile::RequestRow]| -> Vec<(Uuid, String, i32, Uuid, String, Uuid)> {
            rows.iter()
                .map(|r| {
                    (
                        r.request_id,
                        r.source.clone(),
                        r.duplicates,
                        r.job_id,
                        r.job_state.clone(),
                        r.first_request_id,
                    )
                })
                .collect()
        };
    assert_eq!(
        requests(&r.received_while_held),
        vec![
            (
                first.request_id,
                "billing".into(),
                1,
                held,
                "held".into(),
                first.request_id
            ),
            (
                second.request_id,
                "partner".into(),
                0,
                held,
                "held".into(),
                first.request_id
            ),
        ]
    );
    assert_eq!(
        requests(&r.collapsed),
        vec![(
            second.request_id,
            "partner".into(),
            0,
            held,
            "held".into(),
            first.request_id
        )]
    );
    let jobs = |rows: &[reconcile::JobRow]| -> Vec<(Uuid, String, Option<String>, bool)> {
        rows.iter()
            .map(|j| {
                (
                    j.job_id,
                    j.state.clone(),
                    j.blocked_by.clone(),
                    j.grace_until.is_some(),
                )
            })
            .collect()
    };
    assert_eq!(
        jobs(&r.held),
        vec![(held, "held".into(), Some("tenant:1".into()), false)]
    );
    assert_eq!(
        jobs(&r.failed),
        vec![(failed, "failed".into(), None, false)]
    );
    assert!(
        r.failed[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("invoices")
    );
    assert_eq!(
        jobs(&r.in_grace),
        vec![(in_grace, "queued".into(), None, true)]
    );
    assert_eq!(
        r.orphans,
        Orphans::Found {
            tenants: vec!["4".into()]
        },
        "tenant 3 is soft-deleted too, but its job is in grace"
    );

    // Filters narrow every category.
    let only_1 = Filter {
        tenant: Some("1".into()),
        ..Filter::default()
    };
    let r1 = report(&env, &only_1, env.config.soft_delete.orphans.as_deref()).await;
    assert_eq!(
        (r1.held.len(), r1.failed.len(), r1.in_grace.len()),
        (1, 0, 0)
    );
    assert_eq!(r1.orphans, Orphans::Found { tenants: vec![] });
    let partner = Filter {
        source: Some("partner".into()),
        states: vec![JobState::Held],
        ..Filter::default()
    };
    let rp = report(&env, &partner, None).await;
    assert_eq!(
        jobs(&rp.held),
        vec![(held, "held".into(), Some("tenant:1".into()), false)]
    );
    assert!(rp.failed.is_empty() && rp.in_grace.is_empty());
    assert_eq!(
        rp.orphans,
        Orphans::NotConfigured,
        "no statement: never an empty list"
    );
    let later = Filter {
        received_after: Some(time::OffsetDateTime::now_utc() + time::Duration::hours(1)),
        ..Filter::default()
    };
    let rl = report(&env, &later, None).await;
    assert!(rl.held.is_empty() && rl.received_while_held.is_empty() && rl.collapsed.is_empty());

    // Resume skips a job a switch still blocks; once released (the release queues it) nothing is held.
    let resume = Actions {
        resume: true,
        ..Actions::default()
    };
    let a = apply(&env, &Filter::default(), resume, 10.0, true).await;
    assert!(a.actions.is_empty());
    assert_eq!(
        a.skipped
            .iter()
            .map(|s| (s.job_id, s.why.as_str()))
            .collect::<Vec<_>>(),
        vec![(held, "kill switch tenant:1 is engaged")]
    );
    assert_eq!(env.job(held).await.state(), JobState::Held);
    engage(&env, false).await;
    assert_eq!(env.job(held).await.state(), JobState::Queued);
}

#[tokio::test]
async fn a_paced_release_spreads_claimable_times_and_replaying_it_changes_nothing() {
    let env = env_with_config(&grace_config("0s")).await;
    let worker = env.worker("w1");
    let failed = send(&env, "billing", "2", None).await.job_id;
    assert_eq!(worker.step().await.unwrap(), ran(failed, "failed"));
    // Tenants 1, 3, 4 soft-deleted on the target with no job: orphans.
    sqlx::query("UPDATE app.accounts SET deleted_at = now() WHERE id IN (1, 3, 4)")
        .execute(&env.db)
        .await
        .unwrap();
    // A job handed back `held` while its switch was being released: nothing blocks it now.
    let stray = send(&env, "partner", "9", None).await.job_id;
    sqlx::query("UPDATE deprov.jobs SET state = 'held' WHERE id = $1")
        .bind(stray)
        .execute(&env.db)
        .await
        .unwrap();
    let all = Actions {
        resume: true,
        retry: true,
        create_orphan_jobs: true,
        cancel: false,
    };
    let audit_before = audit::list(&env.db, 1000, None, None).await.unwrap().len();

    // Dry run: the same actions, rolled back.
    let dry = apply(&env, &Filter::default(), all, 0.5, false).await;
    let planned: Vec<(String, Option<String>)> = dry
        .actions
        .iter()
        .map(|a| (a.action.clone(), a.tenant_id.clone()))
        .collect();
    let expected = vec![
        ("retry".to_owned(), Some("2".to_owned())),
        ("resume".to_owned(), Some("9".to_owned())),
        ("create_orphan_job".to_owned(), Some("1".to_owned())),
        ("create_orphan_job".to_owned(), Some("3".to_owned())),
        ("create_orphan_job".to_owned(), Some("4".to_owned())),
    ];
    assert_eq!(planned, expected);
    let count = |db: &sqlx::PgPool| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM deprov.jobs")
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    assert_eq!(count(&env.db).await, 2, "a dry run creates nothing");
    assert_eq!(env.job(failed).await.state(), JobState::Failed);
    assert_eq!(
        audit::list(&env.db, 1000, None, None).await.unwrap().len(),
        audit_before
    );

    // Applied at 0.5 jobs/s: claimable 0, 2, 4, 6, 8 s after the reconcile, in that order.
    let applied = apply(&env, &Filter::default(), all, 0.5, true).await;
    let done: Vec<(String, Option<String>)> = applied
        .actions
        .iter()
        .map(|a| (a.action.clone(), a.tenant_id.clone()))
        .collect();
    assert_eq!(done, expected);
    let offsets: Vec<(String, f64)> = sqlx::query_as(
        "SELECT tenant_id, (extract(epoch FROM run_after - min(run_after) OVER ()) * 1000)::float8 \
         FROM deprov.jobs WHERE state = 'queued' ORDER BY run_after",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(
        offsets,
        vec![
            ("2".into(), 0.0),
            ("9".into(), 2000.0),
            ("1".into(), 4000.0),
            ("3".into(), 6000.0),
            ("4".into(), 8000.0),
        ]
    );
    let claimable: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deprov.jobs WHERE state = 'queued' AND run_after <= now()",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(
        claimable, 1,
        "only the first released job is claimable at once"
    );
    let entries = audit::list(&env.db, 1000, None, None).await.unwrap();
    let new: Vec<(&str, &str, &str)> = entries[..entries.len() - audit_before]
        .iter()
        .rev()
        .map(|e| (e.action.as_str(), e.actor.as_str(), e.reason.as_str()))
        .collect();
    assert_eq!(
        new,
        vec![
            ("job.retry", "cli:alice", "after incident 7"),
            ("job.resume", "cli:alice", "after incident 7"),
            ("job.create_orphan", "cli:alice", "after incident 7"),
            ("job.create_orphan", "cli:alice", "after incident 7"),
            ("job.create_orphan", "cli:alice", "after incident 7"),
        ]
    );

    // Replay: the same reconcile again, and the same requests again: nothing new.
    let snapshot = |db: &sqlx::PgPool| {
        let db = db.clone();
        async move {
            sqlx::query_as::<_, (Uuid, String, i32, time::OffsetDateTime)>(
                "SELECT id, state, attempts, run_after FROM deprov.jobs ORDER BY id",
            )
            .fetch_all(&db)
            .await
            .unwrap()
        }
    };
    let before = snapshot(&env.db).await;
    let replay = apply(&env, &Filter::default(), all, 0.5, true).await;
    assert!(
        replay.actions.is_empty() && replay.skipped.is_empty(),
        "{replay:?}"
    );
    let again = send(&env, "billing", "2", None).await;
    assert!(again.duplicate);
    assert_eq!(again.job_id, failed);
    let requests: Vec<(Uuid, i32)> = sqlx::query_as(
        "SELECT job_id, duplicates FROM deprov.deletion_requests WHERE source = 'reconcile' ORDER BY subject",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(requests.len(), 3);
    assert_eq!(snapshot(&env.db).await, before);
    assert_eq!(count(&env.db).await, 5);

    // Workers claim them one by one: the first now, the next not before its time.
    assert!(
        matches!(worker.step().await.unwrap(), StepOutcome::Ran { job_id, .. } if job_id == failed)
    );
    assert_eq!(worker.step().await.unwrap(), StepOutcome::Idle);
}

#[tokio::test]
async fn deprov_reconcile_is_a_dry_run_until_apply_and_then_retries_at_the_given_rate() {
    use clap::Parser;
    let config = grace_config("0s");
    let env = env_with_config(&config).await;
    let worker = env.worker("w1");
    let failed = send(&env, "billing", "2", None).await.job_id;
    assert_eq!(worker.step().await.unwrap(), ran(failed, "failed"));
    let path = std::env::temp_dir().join(format!("deprov-reconcile-{}.toml", Uuid::now_v7()));
    std::fs::write(&path, &config).unwrap();
    let url = env.server.url("target");
    let path_s = path.to_string_lossy().into_owned();
    let run = |extra: &[&str]| {
        let mut argv = vec![
            "deprov",
            "reconcile",
            "--database-url",
            &url,
            "--config",
            &path_s,
        ];
        argv.extend_from_slice(extra);
        deprov::cli::run(deprov::cli::Cli::parse_from(argv))
    };
    run(&[]).await.unwrap();
    run(&["--retry", "--reason", "lock gone", "--json"])
        .await
        .unwrap();
    assert_eq!(env.job(failed).await.state(), JobState::Failed, "dry run");
    let err = run(&["--retry", "--apply"]).await.expect_err("no reason");
    assert!(err.to_string().contains("--reason"), "{err}");
    let err = run(&["--retry", "--apply", "--reason", "x", "--rate", "fast"])
        .await
        .expect_err("bad rate");
    assert!(err.to_string().contains("--rate"), "{err}");
    run(&[
        "--retry",
        "--apply",
        "--reason",
        "lock gone",
        "--rate",
        "2/s",
        "--state",
        "failed",
        "--actor",
        "erin",
    ])
    .await
    .unwrap();
    let job = env.job(failed).await;
    assert_eq!((job.state(), job.attempts), (JobState::Queued, 0));
    let entry = &audit::list(&env.db, 1, None, Some("job.retry"))
        .await
        .unwrap()[0];
    assert_eq!(
        (entry.actor.as_str(), entry.reason.as_str()),
        ("cli:erin", "lock gone")
    );
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_running_job_whose_worker_stopped_is_listed_until_a_worker_takes_it_over() {
    let env = env_with_config(&grace_config("0s")).await;
    // Tenant 3's worker is alive (lease 1 h). Tenant 1's worker stopped: its lease (0 ms) expired.
    let alive = send(&env, "billing", "3", None).await.job_id;
    let claimed =
        deprov::queue::jobs::claim(&env.db, "w-alive", std::time::Duration::from_secs(3600))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(claimed.id, alive);
    let gone = send(&env, "billing", "1", None).await.job_id;
    let claimed = deprov::queue::jobs::claim(&env.db, "w-gone", std::time::Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, gone);

    let r = report(&env, &Filter::default(), None).await;
    let stalled: Vec<_> = r
        .stalled
        .iter()
        .map(|j| (j.job_id, j.state.as_str()))
        .collect();
    assert_eq!(stalled, [(gone, "running")], "{r:#?}");
    assert!(r.held.is_empty() && r.failed.is_empty(), "{r:#?}");

    // A worker looking for work takes it over and completes it; then nothing is stalled.
    env.drain(&env.worker("w1")).await;
    assert_eq!(env.job(gone).await.state(), JobState::Completed);
    let r = report(&env, &Filter::default(), None).await;
    assert!(r.stalled.is_empty(), "{r:#?}");
}
