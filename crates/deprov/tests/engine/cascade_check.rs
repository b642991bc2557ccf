//! The cascade pre-check (`engine::simulate`) on schemas where the cascade's outcome depends on the
//! order PostgreSQL fires its referential triggers in, and on a SET DEFAULT naming a missing row.

use deprov::engine::report::PlanReport;
use deprov::queue::JobState;

use crate::harness::{config_text, digest, env_with_schema, plan_cli};

/// Requests tenant 1's deletion and asserts the job failed naming `constraint`, saying nothing was
/// deleted, and changed nothing; returns its error message.
async fn refused(env: &crate::harness::Env, constraint: &str) -> String {
    let before = digest(&env.db).await;
    let job_id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(job_id).await;
    assert_eq!(job.state(), JobState::Failed);
    let message = job.last_error.unwrap();
    assert!(message.contains(constraint), "{message}");
    assert!(message.contains("nothing was deleted"), "{message}");
    assert_eq!(
        digest(&env.db).await,
        before,
        "a refused job changes nothing"
    );
    message
}

/// Account 1 has a project, a list and a task in both; account 2 the same, unrelated.
const DATA: &str = "
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects VALUES (10, 1), (11, 2);
INSERT INTO app.lists VALUES (20, 1), (21, 2);
INSERT INTO app.tasks VALUES (30, 20, 10), (31, 21, 11);
";

/// `tasks` references a project (RESTRICT) and a list (CASCADE); both reference the account.
/// PostgreSQL fires the account's triggers in creation order. When the projects' key comes first,
/// the projects go first and their RESTRICT check is queued before the lists' cascade deletes the
/// task: the cascade fails. When the lists' key comes first, the task is gone before the check.
fn schema(projects_first: bool) -> String {
    let projects = "CREATE TABLE app.projects (id bigint PRIMARY KEY, \
        account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);";
    let lists = "CREATE TABLE app.lists (id bigint PRIMARY KEY, \
        account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);";
    let (a, b) = if projects_first {
        (projects, lists)
    } else {
        (lists, projects)
    };
    format!(
        "CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz, installation text);
{a}
{b}
CREATE TABLE app.tasks (id bigint PRIMARY KEY,
    list_id bigint NOT NULL REFERENCES app.lists ON DELETE CASCADE,
    project_id bigint REFERENCES app.projects ON DELETE RESTRICT);
{DATA}"
    )
}

#[tokio::test]
async fn a_restrict_check_fired_before_the_cascade_reaches_its_row_fails_the_job_up_front() {
    let env = env_with_schema(&config_text(""), &schema(true)).await;
    let cascade = env.try_cascade_copy(1).await;
    let error = cascade.expect_err("the cascade fails in this order");
    assert!(
        error.to_string().contains("tasks_project_id_fkey"),
        "{error}"
    );

    refused(&env, "tasks_project_id_fkey").await;

    let report = PlanReport::build(&env.pools.target, &env.config, "1")
        .await
        .unwrap();
    assert!(report.cascade.would_fail, "{:?}", report.cascade);
    assert!(report.to_text().contains("tasks_project_id_fkey"));
    // Scripts can rely on the exit status: deprov would refuse this tenant.
    let (ok, text) = plan_cli(&env, "1", &[], &config_text(""));
    assert!(!ok, "plan exits non-zero when deprov would refuse:\n{text}");
    assert!(text.contains("tasks_project_id_fkey"), "{text}");
}

#[tokio::test]
async fn the_same_schema_with_the_keys_created_the_other_way_round_completes_like_the_cascade() {
    let env = env_with_schema(&config_text(""), &schema(false)).await;
    let expected = env.try_cascade_copy(1).await.expect("the cascade succeeds");
    let job_id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(job_id).await;
    assert_eq!(job.state(), JobState::Completed, "{:?}", job.last_error);
    assert_eq!(digest(&env.db).await, digest(&expected).await);

    let report = PlanReport::build(&env.pools.target, &env.config, "2")
        .await
        .unwrap();
    assert!(report.cascade.simulated && !report.cascade.would_fail);
    // Tenant 1 is deleted now (`plan` would say there is no such tenant): tenant 2 is planned.
    let (ok, text) = plan_cli(&env, "2", &[], &config_text(""));
    assert!(ok, "{text}");
}

#[tokio::test]
async fn a_set_default_naming_a_missing_row_is_refused_before_anything_is_deleted() {
    let schema = format!(
        "{}
CREATE TABLE app.notes (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    project_id bigint DEFAULT -1 REFERENCES app.projects ON DELETE SET DEFAULT);
-- account 2's note on account 1's project: the cascade sets it to -1, which names no project.
INSERT INTO app.notes VALUES (40, 1, 10), (41, 2, 10);",
        schema(false)
    );
    let env = env_with_schema(&config_text(""), &schema).await;
    let error = env
        .try_cascade_copy(1)
        .await
        .expect_err("the cascade fails");
    assert!(
        error.to_string().contains("notes_project_id_fkey"),
        "{error}"
    );

    let message = refused(&env, "notes_project_id_fkey").await;
    assert!(message.contains("(project_id)=(-1)"), "{message}");

    // Tenant 2 can go: its project is referenced by nobody else.
    let job_id = env.request("2").await;
    env.drain(&env.worker("w1")).await;
    assert_eq!(env.job(job_id).await.state(), JobState::Completed);
}
