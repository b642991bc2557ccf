//! Differently written keys of one tenant (`"1"`, `"01"`, `" 1"`, `"+1"` for a bigint key) are one
//! tenant: the worker keys each job by the key as PostgreSQL reads it before anything is destroyed,
//! so they never run as two jobs, and a tenant kill switch on the plain key holds them all.

use deprov::queue::JobState;
use deprov::queue::kill_switch::{self, Scope};
use deprov::worker::StepOutcome;

use crate::harness::{digest, env};

/// Engages the tenant switch on `key` as stored (what the CLI does with a typed key).
async fn engage_tenant(env: &crate::harness::Env, key: &str) {
    let mut tx = env.db.begin().await.unwrap();
    kill_switch::set_scope(&mut tx, &Scope::Tenant(key.into()), true, "keep 1", "test")
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn spellings_of_one_tenant_key_delete_once_and_equal_the_cascade() {
    let env = env("").await;
    let expected = env.cascade_copy(1).await;
    let ids = [
        env.request("01").await,
        env.request(" 1").await,
        env.request("+1").await,
        env.request("1").await,
    ];
    let outcomes = env.drain(&env.worker("w1")).await;
    let jobs: Vec<_> = {
        let mut v = Vec::new();
        for id in ids {
            v.push(env.job(id).await);
        }
        v
    };
    // Every job ended completed; exactly one deleted rows, the others were merged into it.
    assert!(
        jobs.iter().all(|j| j.state() == JobState::Completed),
        "{jobs:?} {outcomes:?}"
    );
    let deleting: Vec<_> = jobs
        .iter()
        .filter(|j| deprov::worker::Progress::from_json(&j.progress).rows_deleted > 0)
        .collect();
    assert_eq!(deleting.len(), 1, "{jobs:#?}");
    assert_eq!(deleting[0].tenant_id.as_deref(), Some("1"));
    let merged = jobs
        .iter()
        .filter(|j| j.progress.to_string().contains("merged into job"))
        .count();
    assert_eq!(merged, 3, "{jobs:#?}");
    assert_eq!(digest(&env.db).await, digest(&expected).await);
}

#[tokio::test]
async fn a_tenant_kill_switch_holds_a_job_whose_key_is_written_differently() {
    let env = env("").await;
    let before = digest(&env.db).await;
    engage_tenant(&env, "1").await;
    let id = env.request("01").await;
    let outcomes = env.drain(&env.worker("w1")).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Held, "{job:?} {outcomes:?}");
    assert_eq!(
        job.tenant_id.as_deref(),
        Some("1"),
        "keyed by the canonical key"
    );
    assert!(
        !outcomes
            .iter()
            .any(|o| matches!(o, StepOutcome::Ran { state, .. } if state == "completed")),
        "{outcomes:?}"
    );
    assert_eq!(
        digest(&env.db).await,
        before,
        "nothing was deleted or soft-deleted"
    );
}

/// The converse: a tenant switch engaged on another spelling of the key (the CLI stores a key as
/// typed, `"01"`) holds the job of tenant `"1"` before anything is destroyed, the cascade
/// pre-check included (it must neither go on nor fail in the pre-check).
#[tokio::test]
async fn a_tenant_kill_switch_typed_differently_holds_the_tenants_job() {
    let env = env("").await;
    let before = digest(&env.db).await;
    engage_tenant(&env, "01").await;
    let id = env.request("1").await;
    let outcomes = env.drain(&env.worker("w1")).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Held, "{job:?} {outcomes:?}");
    assert_eq!(
        digest(&env.db).await,
        before,
        "nothing was deleted or soft-deleted"
    );
}

/// A key the key column cannot read (recorded as sent while intake did not know the column's
/// type) fails its job with a message naming the key and the column, before anything is touched.
#[tokio::test]
async fn a_key_the_column_cannot_read_fails_with_a_clear_message() {
    let env = env("").await;
    let before = digest(&env.db).await;
    let id = env.request("abc").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Failed, "{job:?}");
    let error = job.last_error.unwrap_or_default();
    assert!(
        error.starts_with(
            r#"tenant key "abc" is not a valid value of "app"."accounts".id (bigint)"#
        ) && error.contains("22P02"),
        "{error}"
    );
    assert_eq!(digest(&env.db).await, before, "nothing was touched");
}
