//! A non-CASCADE reference of a table to itself, with a row kept back (still referenced from
//! outside its batch) that itself references another row of the same batch: deleting that other
//! row while the kept-back row still references it would fail the NO ACTION check (23503) and end
//! the job `failed` part-way although the cascading `DELETE` succeeds. A batch keeps back,
//! recursively, what kept-back rows reference.

use deprov::queue::JobState;

use crate::harness::{config_for, delete_tenant_1, env_with_schema};

/// Tenant 1 owns folders 1..=3000 in chains (`parent = id - 1`, a new chain every 100); folder
/// 1200 points "up" to 2500, so 2500 stays while 1200 does, and with it 2499, 2498, … Tenant 2's
/// folders are untouched.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.folders (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    parent int REFERENCES app.folders (id));
CREATE INDEX ON app.folders (account_id);
CREATE INDEX ON app.folders (parent);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.folders SELECT g, 1, CASE WHEN g % 100 = 1 THEN NULL ELSE g - 1 END
    FROM generate_series(1, 3000) g;
INSERT INTO app.folders SELECT g, 2, CASE WHEN g % 100 = 1 THEN NULL ELSE g - 1 END
    FROM generate_series(3001, 3200) g;
UPDATE app.folders SET parent = 2500 WHERE id = 1200;
";

#[tokio::test]
async fn rows_a_kept_back_row_references_are_kept_back_too() {
    for batch_rows in [13, 100] {
        let progress = delete_tenant_1(SCHEMA, &config_for(batch_rows, "id", "")).await;
        assert_eq!(
            progress.rows_deleted, 3001,
            "{batch_rows}-row batches: {progress:?}"
        );
    }
}

/// A job that fails part-way (a trigger refuses one row) after batches that committed deferred
/// (`checkpoint_interval`): they are made durable and checkpointed before the job ends, so its
/// progress counts the rows really deleted, not 0 after a rewind. The trial
/// cascade is off: it would refuse this tenant before anything is deleted (`schema_edges`).
#[tokio::test]
async fn a_job_that_fails_part_way_counts_what_it_deleted() {
    let schema = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.items (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.items (account_id);
INSERT INTO app.accounts VALUES (1, NULL);
INSERT INTO app.items SELECT g, 1 FROM generate_series(1, 600) g;
CREATE FUNCTION app.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'item % is on legal hold', OLD.id; END $$;
CREATE TRIGGER refuse BEFORE DELETE ON app.items FOR EACH ROW WHEN (OLD.id = 500)
    EXECUTE FUNCTION app.refuse();
";
    let config = crate::harness::config_hard(
        "batch_rows = 50\nmax_batch_rows = 50\ncascade_rows = 0\ncheckpoint_interval = \"300ms\"\n\
         trial_cascade = false",
        "id",
        "",
    );
    let env = env_with_schema(&config, schema).await;
    let id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Failed, "{job:?}");
    assert!(
        job.last_error
            .as_deref()
            .unwrap_or("")
            .contains("legal hold"),
        "{job:?}"
    );
    // The error says how much was already deleted, in the server's words (no sqlx decoration).
    let error = job.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("; 450 rows of the tenant were already deleted")
            && !error.contains(" at line ")
            && !error.contains("error returned from database"),
        "{error}"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.items")
        .fetch_one(&env.db)
        .await
        .unwrap();
    let progress = deprov::worker::Progress::from_json(&job.progress);
    println!(
        "{} items deleted; rows_deleted {}, rewinds {}",
        600 - left,
        progress.rows_deleted,
        progress.rewinds
    );
    // 50-row batches in key order: the batch holding item 500 fails, the ones before it stay.
    assert_eq!(left, 150, "items 1..=450 deleted");
    assert_eq!(
        (progress.rows_deleted, progress.rewinds),
        (450, 0),
        "{progress:?}"
    );
}

/// A tree whose parents have higher keys than their children: a batch, in descending key order,
/// meets each chain's parent first, and PostgreSQL's cascade deletes the rest of the chain under
/// it. Those rows are counted too, not only the statement's own.
#[tokio::test]
async fn rows_a_tree_cascades_to_under_a_batch_are_counted() {
    let schema = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.tasks (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    parent_task int REFERENCES app.tasks (id) ON DELETE CASCADE);
CREATE INDEX ON app.tasks (account_id);
CREATE INDEX ON app.tasks (parent_task);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.tasks SELECT g, 1, CASE WHEN g % 10 = 0 THEN NULL ELSE g + 1 END
    FROM generate_series(1, 2000) g;
INSERT INTO app.tasks SELECT g, 2, CASE WHEN g % 10 = 0 THEN NULL ELSE g + 1 END
    FROM generate_series(2001, 2100) g;
";
    // 7-row batches cut the chains of 10: a batch holding a chain's parent cascades to the rest.
    let progress = delete_tenant_1(schema, &config_for(7, "id", "")).await;
    let tasks = progress
        .table(r#""app"."tasks""#)
        .expect("app.tasks in the progress");
    assert_eq!(
        (tasks.rows_deleted, progress.rows_deleted),
        (2000, 2001),
        "{progress:?}"
    );
}

/// A tree (CASCADE reference to itself) with a NO ACTION reference to itself as well: row 3 is kept
/// back for row 1's reference, and its tree parent, row 2, deleted in a later batch, would take it
/// along by the cascade while row 1 still references it (23503). A kept-back row keeps back its
/// tree parent too.
#[tokio::test]
async fn a_kept_back_row_is_not_taken_by_its_tree_parents_cascade() {
    let schema = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.nodes (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    parent int REFERENCES app.nodes (id) ON DELETE CASCADE,
    ref int REFERENCES app.nodes (id));
CREATE INDEX ON app.nodes (account_id);
CREATE INDEX ON app.nodes (parent);
CREATE INDEX ON app.nodes (ref);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.nodes VALUES (1, 1, NULL, NULL), (2, 1, NULL, NULL), (3, 1, 2, NULL), (10, 2, NULL, NULL);
UPDATE app.nodes SET ref = 3 WHERE id = 1;
";
    for batch_rows in [1, 2, 50] {
        delete_tenant_1(schema, &config_for(batch_rows, "id", "")).await;
    }
}
