//! The read-only pass that marks a large parent's dead index entries (`engine::kill_dead_entries`).

use std::time::Duration;

use deprov::engine::kill_dead_entries;

use crate::harness::{config_text, env_with_schema};

const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.events (id bigserial PRIMARY KEY,
  account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, payload text);
CREATE INDEX events_account_idx ON app.events (account_id);
CREATE TABLE app.notes (id bigserial PRIMARY KEY,
  account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.events (account_id, payload) SELECT 1, 'e' || g FROM generate_series(1, 5000) g;
INSERT INTO app.events (account_id, payload) SELECT 2, 'e' || g FROM generate_series(1, 100) g;
INSERT INTO app.notes (account_id) SELECT 1 FROM generate_series(1, 100);
";

/// Index items of `app.events_account_idx` marked dead (LP_DEAD), over all its pages but the
/// metapage (pageinspect's `bt_page_items`).
async fn dead_items(db: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM generate_series(1, (pg_relation_size('app.events_account_idx') / 8192)::int - 1) b, \
         bt_page_items('app.events_account_idx', b) i WHERE i.dead",
    )
    .fetch_one(db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_pass_over_a_deleted_parents_index_range_marks_its_dead_entries() {
    let env = env_with_schema(&config_text(""), SCHEMA).await;
    sqlx::query("CREATE EXTENSION pageinspect")
        .execute(&env.db)
        .await
        .unwrap();
    let plan = crate::harness::accounts_plan(&env.db).await;
    let step_of = |table: &str| {
        plan.steps
            .iter()
            .position(|s| plan.name(s.table).to_string() == table)
            .unwrap()
    };
    // The children are gone (committed), their index entries not yet marked.
    sqlx::query("DELETE FROM app.events WHERE account_id = 1")
        .execute(&env.db)
        .await
        .unwrap();
    assert_eq!(dead_items(&env.db).await, 0);

    let pass = kill_dead_entries(
        &env.db,
        &plan,
        step_of("\"app\".\"events\""),
        &["1".to_owned()],
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(pass.statements, 1, "{pass:?}");
    assert!(pass.finished, "{pass:?}");
    // 5,000 dead entries of one key sit in deduplicated posting-list items; every one is marked.
    let dead = dead_items(&env.db).await;
    assert!(dead > 0, "no index item was marked dead");
    let other_keys_dead: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM generate_series(1, (pg_relation_size('app.events_account_idx') / 8192)::int - 1) b, \
         bt_page_items('app.events_account_idx', b) i WHERE i.dead AND i.data <> '01 00 00 00 00 00 00 00'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(other_keys_dead, 0, "entries of other parents were marked");
    // Other tenants' rows are untouched (the pass only reads).
    let others: i64 = sqlx::query_scalar("SELECT count(*) FROM app.events WHERE account_id = 2")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(others, 100);

    // A foreign key without an index: nothing to mark, nothing run.
    let pass = kill_dead_entries(
        &env.db,
        &plan,
        step_of("\"app\".\"notes\""),
        &["1".to_owned()],
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(pass.statements, 0, "{pass:?}");
}
