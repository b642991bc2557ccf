//! A configured statement that fails as the worker (or an undo) runs it is named in the error as the
//! start-up check names a refused one (`soft_delete.statements[1]: …`), and a lookup that finds no
//! tenant says what it looked up.

use deprov::ids::DedupBasis;
use deprov::queue::JobState;
use deprov::queue::grace::{self, UndoTarget};
use deprov::queue::intake::{self, NewRequest, SubjectKind};
use deprov::worker::Progress;

use crate::harness::{Env, config_for, config_hard, config_text, env_with_config};
use crate::reconcile::grace_config;

/// Passes the statement's analysis (nothing is evaluated), fails on tenant 1's row when run.
const DIVIDES_BY_ZERO: &str =
    "UPDATE app.accounts SET deleted_at = now() WHERE id = $1 AND 1 / (id - id) = 0";

/// `config` with a second soft-delete statement that divides by zero.
fn failing_soft_delete(config: &str) -> String {
    let first = "statements = [\"UPDATE app.accounts SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL\"";
    assert!(config.contains(first), "{config}");
    config.replace(first, &format!("{first}, {DIVIDES_BY_ZERO:?}"))
}

async fn soft_deleted(env: &Env, tenant: i64) -> bool {
    sqlx::query_scalar("SELECT deleted_at IS NOT NULL FROM app.accounts WHERE id = $1")
        .bind(tenant)
        .fetch_one(&env.db)
        .await
        .unwrap()
}

/// Runs tenant 1's deletion under `config` until the worker is idle; returns the job's state and
/// stored error.
async fn run_tenant_1(env: &Env) -> (JobState, Option<String>) {
    let id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(id).await;
    (job.state(), job.last_error)
}

#[tokio::test]
async fn a_failing_soft_delete_statement_is_named_in_the_jobs_error() {
    let expected = (
        JobState::Failed,
        Some("soft_delete.statements[1]: division by zero (SQLSTATE 22012)".to_owned()),
    );
    // In batches (the soft delete in its own transaction).
    let env = env_with_config(&failing_soft_delete(&config_text(""))).await;
    assert_eq!(run_tenant_1(&env).await, expected);
    assert!(
        !soft_deleted(&env, 1).await,
        "the soft delete was rolled back"
    );
    // In the whole cascade (the soft delete first, in the cascade's transaction): the statement's
    // error, not a verdict on the cascade.
    let whole = config_hard(
        "batch_rows = 7\nwhole_cascade = true\ntrial_cascade = true",
        "installation",
        "",
    );
    let env = env_with_config(&failing_soft_delete(&whole)).await;
    assert_eq!(run_tenant_1(&env).await, expected);
    assert!(
        !soft_deleted(&env, 1).await,
        "the soft delete was rolled back"
    );
}

#[tokio::test]
async fn a_failing_tenant_lookup_is_named_in_the_jobs_error() {
    // `WHERE 1 / 0 = 1 AND installation = $1`: analysed fine, fails when run.
    let config = config_for(7, "1 / 0 = 1 AND installation", "");
    let env = env_with_config(&config).await;
    let id = env.request_installation("icfg_1").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(id).await;
    assert_eq!(
        (job.state(), job.last_error.as_deref()),
        (
            JobState::Failed,
            Some("vercel.tenant_lookup: division by zero (SQLSTATE 22012)")
        )
    );
}

#[tokio::test]
async fn a_failing_undo_statement_is_named_in_the_undos_error() {
    let config = grace_config("1h").replace(
        "undo_statements = [\"UPDATE app.accounts SET deleted_at = NULL WHERE id = $1\"]",
        &format!(
            "undo_statements = [\"UPDATE app.accounts SET deleted_at = NULL WHERE id = $1\", {:?}]",
            DIVIDES_BY_ZERO.replace("deleted_at = now()", "deleted_at = NULL")
        ),
    );
    let env = env_with_config(&config).await;
    let job = env.request("1").await;
    env.worker("w1").step().await.unwrap();
    assert!(soft_deleted(&env, 1).await);
    let in_grace = env.job(job).await.state();
    assert_eq!(in_grace, JobState::Queued, "waiting out its grace period");
    let target = UndoTarget::new(&env.pools.target, &env.config);
    let mut tx = env.db.begin().await.unwrap();
    let err = grace::undo(&mut tx, target, job, "cli", "customer came back")
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the undo statements failed: soft_delete.undo_statements[1]: division by zero (SQLSTATE 22012)"
    );
    tx.rollback().await.unwrap();
    assert!(soft_deleted(&env, 1).await, "the undo was rolled back");
    assert_eq!(env.job(job).await.state(), in_grace, "not cancelled");
}

/// A lookup subject: what source `chat` sent, `value`, to be resolved by its `tenant_lookup`.
async fn record_lookup(env: &Env, value: &str) -> uuid::Uuid {
    let req = NewRequest {
        source: "chat".into(),
        basis: DedupBasis::ExternalId,
        dedup_key: value.into(),
        subject_kind: SubjectKind::Lookup,
        subject: format!("chat:{value}"),
        external_id: None,
        reason: None,
    };
    intake::record_tx(&env.pools.intake, &req, 5)
        .await
        .unwrap()
        .job_id
}

#[tokio::test]
async fn a_lookup_that_finds_no_tenant_says_what_it_looked_up() {
    let config = config_text(
        "[sources.chat]\ntoken = \"chat-token-0123456789abc\"\ntenant = { pointer = \"/team\" }\n\
         tenant_lookup = \"SELECT id FROM app.accounts WHERE name = $1\"\n",
    );
    let env = env_with_config(&config).await;
    let vercel = env.request_installation("icfg_nope").await;
    let chat = record_lookup(&env, "T404").await;
    env.drain(&env.worker("w1")).await;
    for (id, note) in [
        (
            vercel,
            "no tenant found for Vercel installation \"icfg_nope\" (vercel.tenant_lookup returned no tenant key); nothing to delete",
        ),
        (
            chat,
            "no tenant found for \"T404\" sent by source chat (sources.chat.tenant_lookup returned no tenant key); nothing to delete",
        ),
    ] {
        let job = env.job(id).await;
        assert_eq!(job.state(), JobState::Completed, "{job:?}");
        assert_eq!(
            Progress::from_json(&job.progress).note.as_deref(),
            Some(note)
        );
    }
}
