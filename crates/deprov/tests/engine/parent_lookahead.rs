//! A batch reads one parent beyond the `parents` it takes (`engine::queries::batch`'s `ahead`):
//! when it is not full and no parent follows its own, it ends its step (`next` is `None`), so no
//! batch runs only to find that there is no parent left; when one follows, the step goes on after
//! the last parent the batch took, and that parent is not counted as read.

use deprov::engine::{self, BatchLimits, BatchResult, BatchStart, Cursor};

use crate::harness::{config_text, env_with_schema};

/// Tenant 1: three projects with two tasks each; tenant 2: one project with one task.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.tasks (id int PRIMARY KEY,
    project_id int NOT NULL REFERENCES app.projects ON DELETE CASCADE);
CREATE INDEX ON app.tasks (project_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects VALUES (1, 1), (2, 1), (3, 1), (4, 2);
INSERT INTO app.tasks VALUES (1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (6, 3), (7, 4);
";

async fn tasks_left(db: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM app.tasks")
        .fetch_one(db)
        .await
        .unwrap()
}

/// Runs one batch of the tasks step of tenant 1 from `cursor`, taking at most `parents` parents
/// and 100 rows.
async fn tasks_batch(env: &crate::harness::Env, cursor: Cursor, parents: i64) -> BatchResult {
    let plan = crate::harness::accounts_plan(&env.db).await;
    let step = plan
        .steps
        .iter()
        .position(|s| plan.name(s.table).to_string() == "\"app\".\"tasks\"")
        .unwrap();
    let limits = BatchLimits {
        rows: 100,
        lock_timeout: std::time::Duration::from_secs(1),
        statement_timeout: std::time::Duration::from_secs(5),
        deferred: false,
    };
    let began = std::sync::OnceLock::new();
    let at = BatchStart {
        step,
        cursor: &cursor,
        parents,
        large_parent: false,
        unchanged: None,
        began: &began,
        jump: false,
    };
    engine::run_batch(&env.db, &plan, at, "1", &limits)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_batch_that_is_not_full_ends_its_step_unless_another_parent_follows() {
    let env = env_with_schema(&config_text(""), SCHEMA).await;

    // Two of the three projects: a third follows, so the step goes on after project 2.
    let first = tasks_batch(&env, Cursor::Start, 2).await;
    assert_eq!((first.selected, first.deleted, first.parents), (4, 4, 2));
    assert_eq!(first.next, Some(Cursor::AfterParent(vec!["2".into()])));
    assert_eq!(tasks_left(&env.db).await, 3);

    // The last project: no parent follows, and the batch is not full: the step ends with it.
    let last = tasks_batch(&env, first.next.unwrap(), 2).await;
    assert_eq!((last.selected, last.deleted, last.parents), (2, 2, 1));
    assert_eq!(last.next, None);
    // Tenant 2's task stays.
    assert_eq!(tasks_left(&env.db).await, 1);
}

#[tokio::test]
async fn a_batch_that_takes_every_parent_ends_its_step() {
    let env = env_with_schema(&config_text(""), SCHEMA).await;
    // Exactly as many parents as the tenant has: nothing is read ahead, nothing is left.
    let only = tasks_batch(&env, Cursor::Start, 3).await;
    assert_eq!((only.selected, only.parents, only.next), (6, 3, None));
    assert_eq!(tasks_left(&env.db).await, 1);
}
