//! A request for a subject — a Vercel installation, a value a source's `tenant_lookup` resolves —
//! that an earlier request resolved to a tenant follows that tenant's deletion while it has not
//! completed, whatever the target's lookup says by then: the hard delete may have emptied the rows
//! the lookup reads before it reaches the tenant's root row.

use deprov::ids::DedupBasis;
use deprov::queue::JobState;
use deprov::queue::intake::{self, NewRequest, SubjectKind};
use deprov::queue::kill_switch::{self, Scope};
use uuid::Uuid;

use crate::harness::{Env, env};

/// Engages the tenant switch on `key`: the tenant's job is held once it is keyed by the tenant.
async fn engage_tenant(env: &Env, key: &str) {
    let mut tx = env.db.begin().await.unwrap();
    kill_switch::set_scope(&mut tx, &Scope::Tenant(key.into()), true, "hold", "test")
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// A request for Vercel installation `installation` under its own delivery ID (a webhook's), so
/// that it is not a duplicate of an earlier request for the installation. Returns (request, job).
async fn delivery(env: &Env, installation: &str, delivery: &str) -> (Uuid, Uuid) {
    let req = NewRequest {
        source: "billing".into(),
        basis: DedupBasis::ExternalId,
        dedup_key: delivery.into(),
        subject_kind: SubjectKind::VercelInstallation,
        subject: installation.into(),
        external_id: Some(delivery.into()),
        reason: None,
    };
    let accepted = intake::record_tx(&env.pools.intake, &req, 5).await.unwrap();
    (accepted.request_id, accepted.job_id)
}

async fn job_of_request(env: &Env, request: Uuid) -> Uuid {
    sqlx::query_scalar("SELECT job_id FROM deprov.deletion_requests WHERE id = $1")
        .bind(request)
        .fetch_one(&env.db)
        .await
        .unwrap()
}

async fn tenant_3_exists(env: &Env) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM app.accounts WHERE id = 3)")
        .fetch_one(&env.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_late_request_for_an_installation_follows_its_tenants_unfinished_job() {
    let env = env("").await;
    engage_tenant(&env, "3").await;
    let (_, first) = delivery(&env, "icfg_3", "delivery-1").await;
    env.drain(&env.worker("w1")).await;
    let held = env.job(first).await;
    assert_eq!(
        (held.state(), held.tenant_id.as_deref()),
        (JobState::Held, Some("3"))
    );
    // The lookup no longer finds the tenant, which still exists.
    sqlx::query("UPDATE app.accounts SET installation = NULL WHERE id = 3")
        .execute(&env.db)
        .await
        .unwrap();

    let (late_request, late) = delivery(&env, "icfg_3", "delivery-2").await;
    assert_ne!(late, first, "another delivery: another job at intake");
    env.drain(&env.worker("w1")).await;

    // Merged into the held job: the late request follows it, and nothing was deleted.
    let merged = env.job(late).await;
    assert_eq!(
        (merged.state(), merged.tenant_id.as_deref()),
        (JobState::Completed, Some("3"))
    );
    assert_eq!(job_of_request(&env, late_request).await, first);
    assert_eq!(env.job(first).await.state(), JobState::Held);
    assert!(tenant_3_exists(&env).await);
}

#[tokio::test]
async fn after_a_completed_deletion_a_request_for_the_installation_asks_the_lookup_again() {
    let env = env("").await;
    let (_, first) = delivery(&env, "icfg_3", "delivery-1").await;
    env.drain(&env.worker("w1")).await;
    assert_eq!(env.job(first).await.state(), JobState::Completed);
    assert!(!tenant_3_exists(&env).await);

    // The installation now maps to tenant 1 (reinstalled under the same ID): a later request
    // deletes what the lookup finds, not the tenant deleted before.
    sqlx::query("UPDATE app.accounts SET installation = 'icfg_3' WHERE id = 1")
        .execute(&env.db)
        .await
        .unwrap();
    let (_, later) = delivery(&env, "icfg_3", "delivery-2").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(later).await;
    assert_eq!(
        (job.state(), job.tenant_id.as_deref()),
        (JobState::Completed, Some("1"))
    );
}
