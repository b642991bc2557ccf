//! A table keyed by `(account_id, id)` under its foreign key `account_id`: the common multi-tenant
//! primary key. A batch inside one parent continues after its cursor; written as a row comparison
//! on the whole key beside `account_id = $p`, PostgreSQL would position the B-tree scan by the
//! equality alone and pass every entry of the parent before the cursor, the dead entries of the
//! batches before included, so each batch would cost more than the last. The cursor compares only
//! what follows the foreign key's columns in the key; so does the read of the next parents when
//! their key leads with the column set to the tenant key.

use deprov::engine::queries;

use crate::harness::{
    buffers, config_for, delete_tenant_1, env_with_schema, explain_batch, step_on,
};

/// Tenant 1 owns 60,000 events, tenant 2 100.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.events (account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    id int NOT NULL, body text, PRIMARY KEY (account_id, id));
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.events SELECT 1, g, 'e' || g FROM generate_series(1, 60000) g;
INSERT INTO app.events SELECT 2, g, 'e' || g FROM generate_series(1, 100) g;
ANALYZE;
";

/// After 50,000 of tenant 1's events were deleted by committed batches, the next range's bound
/// and delete read about the blocks of the 100 rows they take, not the 50,000 dead entries before
/// them (about 140 leaf pages of the primary key's index). The delete fetches each of its rows from
/// the heap (a buffer access each), the bound reads the index only.
#[tokio::test]
async fn a_range_inside_a_parent_starts_at_its_cursor_not_at_the_parent_first_key() {
    let env = env_with_schema(&config_for(100, "id", ""), SCHEMA).await;
    let plan = crate::harness::accounts_plan(&env.db).await;
    let step = step_on(&plan, "events");
    assert!(plan.range_step(step), "{}", plan.describe_path(step));
    sqlx::query("DELETE FROM app.events WHERE account_id = 1 AND id <= 50000")
        .execute(&env.db)
        .await
        .unwrap();
    let cursor = vec!["1".to_string(), "1".into(), "50000".into()];

    let mut tx = env.db.begin().await.unwrap();
    let bound = queries::range_bound(&plan, step, false);
    let explained: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
        bound.text()
    )))
    .bind(&cursor)
    .bind(100_i64)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let bound_buffers = buffers(&explained);
    let delete = queries::range_delete(&plan, step);
    let deleted: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
        delete.text()
    )))
    .bind(&cursor)
    .bind(vec!["1".to_string(), "50100".into()])
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let delete_buffers = buffers(&deleted);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.events WHERE account_id = 1")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    println!("buffers: the range's bound {bound_buffers}, its delete {delete_buffers}");
    assert_eq!(left, 10_000 - 100, "the range deletes rows 50,001..=50,100");
    assert!(
        bound_buffers <= 40,
        "the bound read {bound_buffers} buffers:\n{explained:#}"
    );
    assert!(
        delete_buffers <= 100 + 40,
        "the delete read {delete_buffers} buffers:\n{deleted:#}"
    );
}

/// The whole job, 100-row batches: equal to the cascade (tenant 2's rows stay), every one of tenant
/// 1's events deleted by its own step.
#[tokio::test]
async fn a_table_keyed_under_its_parent_is_deleted_in_batches_equal_to_the_cascade() {
    whole_job(SCHEMA, r#""app"."events""#, 60_000).await;
}

/// Deletes tenant 1 of `schema` in 100-row batches, equal to the cascade ([`delete_tenant_1`]),
/// and checks that `table`'s step deleted its `rows` rows in batches of at most 100.
async fn whole_job(schema: &str, table: &str, rows: i64) {
    let progress = delete_tenant_1(schema, &config_for(100, "id", "")).await;
    let t = progress.table(table).expect("the table in the progress");
    assert_eq!(t.rows_deleted, rows, "{progress:?}");
    assert!(t.batches >= rows / 100, "{progress:?}");
}

/// Tenant 1 owns 20,000 projects keyed `(account_id, id)`, each with one task referencing it by
/// `(account_id, project_id)`.
const PARENTS_SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    id int NOT NULL, PRIMARY KEY (account_id, id));
CREATE TABLE app.tasks (id int PRIMARY KEY, account_id bigint NOT NULL, project_id int NOT NULL,
    FOREIGN KEY (account_id, project_id) REFERENCES app.projects ON DELETE CASCADE);
CREATE INDEX ON app.tasks (account_id, project_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects SELECT 1, g FROM generate_series(1, 20000) g;
INSERT INTO app.projects SELECT 2, g FROM generate_series(1, 100) g;
INSERT INTO app.tasks SELECT g, 1, g FROM generate_series(1, 20000) g;
ANALYZE;
";

/// Shared buffers (hit + read) of the node of `plan` (EXPLAIN's JSON) whose subplan name is `name`.
fn subplan_buffers(plan: &serde_json::Value, name: &str) -> Option<i64> {
    if plan["Subplan Name"] == name {
        return Some(
            plan["Shared Hit Blocks"].as_i64().unwrap_or(0)
                + plan["Shared Read Blocks"].as_i64().unwrap_or(0),
        );
    }
    plan["Plans"]
        .as_array()?
        .iter()
        .find_map(|p| subplan_buffers(p, name))
}

/// A batch of the tasks' step after the cursor's parent, the 15,000th project: it reads the
/// projects' key from there, not every project of tenant 1 before it.
#[tokio::test]
async fn the_next_parents_are_read_from_the_cursor_when_their_key_leads_with_the_tenant() {
    let env = env_with_schema(&config_for(100, "id", ""), PARENTS_SCHEMA).await;
    let plan = crate::harness::accounts_plan(&env.db).await;
    let step = step_on(&plan, "tasks");
    let mut tx = env.db.begin().await.unwrap();
    let after = vec!["1".to_string(), "15000".into()];
    let explained = explain_batch(&mut tx, &plan, step, after, 100, 100).await;
    let (before, taken, left): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE project_id <= 15000), \
                count(*) FILTER (WHERE project_id BETWEEN 15001 AND 15100), count(*) FROM app.tasks",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let read = subplan_buffers(&explained[0]["Plan"], "CTE ahead").expect("the parents' CTE");
    println!("buffers of the parents' read: {read}");
    assert_eq!(
        (before, taken, left),
        (15_000, 0, 20_000 - 100),
        "the batch deletes the tasks of the 100 projects after the cursor's"
    );
    assert!(
        read <= 10,
        "the parents' read took {read} buffers:\n{explained:#}"
    );
}

/// The whole job with composite parent keys, 100-row batches: equal to the cascade.
#[tokio::test]
async fn children_of_parents_keyed_under_the_tenant_are_deleted_equal_to_the_cascade() {
    whole_job(PARENTS_SCHEMA, r#""app"."tasks""#, 20_000).await;
}

/// A tree keyed `(account_id, id)` (a CASCADE key to itself), whose children go in descending key
/// order: 1,000 of tenant 1's nodes, none under another.
const TREE_SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.nodes (account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    id int NOT NULL, parent_id int, PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, parent_id) REFERENCES app.nodes ON DELETE CASCADE);
CREATE INDEX ON app.nodes (account_id, parent_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.nodes SELECT 1, g, NULL FROM generate_series(1, 1000) g;
INSERT INTO app.nodes SELECT 2, g, NULL FROM generate_series(1, 10) g;
ANALYZE;
";

/// Inside the root parent after node 500, in descending order, a 100-row batch takes nodes 499
/// down to 400: the cursor's key value, not its parent's, bounds it.
#[tokio::test]
async fn a_tree_inside_a_parent_continues_below_its_cursor() {
    let env = env_with_schema(&config_for(100, "id", ""), TREE_SCHEMA).await;
    let plan = crate::harness::accounts_plan(&env.db).await;
    let step = plan
        .steps
        .iter()
        .find(|s| plan.name(s.table).name == "nodes" && s.path.len() == 1)
        .expect("a step on nodes under the root");
    assert!(plan.is_tree(step.table));
    let cursor = deprov::engine::Cursor::Within(vec!["1".into()], vec!["1".into(), "500".into()]);
    let stmt = queries::batch(&plan, step, &cursor, false);
    let mut tx = env.db.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(stmt.text().to_string()))
        .bind("1")
        .bind(100_i64)
        .bind(vec!["1".to_string(), "1".into(), "500".into()])
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    let gone: Vec<i32> = sqlx::query_scalar(
        "SELECT g FROM generate_series(1, 1000) g \
         WHERE NOT EXISTS (SELECT 1 FROM app.nodes WHERE account_id = 1 AND id = g) ORDER BY g",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(gone, (400..500).collect::<Vec<i32>>());
}
