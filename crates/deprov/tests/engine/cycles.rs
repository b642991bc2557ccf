//! Foreign-key cycles whose deletion order matters (`engine::cycles`): a NO ACTION key from a table
//! into its own cascade descendants. The cascade deletes the referencing row in the same statement
//! as the referenced one and passes its check; deleting leaves first would delete the referenced
//! row first and fail (23503) after the soft delete.

use deprov::queue::JobState;

use crate::harness::{config_hard, delete_tenant_1, digest, env_with_schema};

/// `customer → campaign → answer`, each CASCADE, and `customer.answer_id` NOT NULL NO ACTION into
/// `answer`. Tenant 1 has 100 customers, tenant 2 has 100; `{answer}` picks the answer each
/// customer references; `{extra}` adds DDL.
fn schema(answer: &str, extra: &str) -> String {
    format!(
        "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.customer (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, answer_id int NOT NULL);
CREATE TABLE app.campaign (id int PRIMARY KEY,
    customer_id int NOT NULL REFERENCES app.customer ON DELETE CASCADE);
CREATE TABLE app.answer (id int PRIMARY KEY, account_id bigint,
    campaign_id int NOT NULL REFERENCES app.campaign ON DELETE CASCADE);
CREATE INDEX ON app.customer (account_id);
CREATE INDEX ON app.customer (answer_id);
CREATE INDEX ON app.campaign (customer_id);
CREATE INDEX ON app.answer (campaign_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.customer SELECT g, 1 + (g - 1) / 100, {answer} FROM generate_series(1, 200) g;
INSERT INTO app.campaign SELECT g, g FROM generate_series(1, 200) g;
INSERT INTO app.answer SELECT g, 1 + (g - 1) / 100, g FROM generate_series(1, 200) g;
ALTER TABLE app.customer ADD FOREIGN KEY (answer_id) REFERENCES app.answer;
{extra}
ANALYZE;
"
    )
}

/// Batches of 7 customers, the trial cascade on (it succeeds), the whole cascade off.
fn batches() -> String {
    config_hard(
        "batch_rows = 7\nmax_batch_rows = 7\nmax_batch_duration = \"800ms\"\n\
         lock_timeout = \"100ms\"\ncascade_rows = 0",
        "id",
        "",
    )
}

#[tokio::test]
async fn a_cycle_through_a_no_action_key_is_deleted_under_its_entry_table() {
    // Each customer references its own answer.
    let progress = delete_tenant_1(&schema("g", ""), &batches()).await;
    assert_eq!(progress.rows_deleted, 301, "{progress:?}");
    assert!(progress.batches > 10, "{progress:?}");
    assert_eq!(progress.unbounded_steps, 0, "{progress:?}");
}

#[tokio::test]
async fn rows_referencing_across_batches_are_deleted_in_one_statement() {
    // Customer g references customer g+1's answer (100 wraps to 1): every batch of customers
    // deletes an answer a customer of a later batch still references.
    let progress = delete_tenant_1(
        &schema("CASE WHEN g % 100 = 0 THEN g - 99 ELSE g + 1 END", ""),
        &batches(),
    )
    .await;
    assert_eq!(progress.rows_deleted, 301, "{progress:?}");
    assert_eq!(progress.unbounded_steps, 1, "{progress:?}");
}

#[tokio::test]
async fn a_cycle_entered_twice_is_refused_before_anything_or_deleted_whole() {
    // `answer` also cascades from the account directly: the cascade enters the cycle through two
    // tables, and no order of steps keeps the NO ACTION check.
    let schema = schema(
        "g",
        "ALTER TABLE app.answer ADD FOREIGN KEY (account_id) REFERENCES app.accounts ON DELETE CASCADE;",
    );
    let env = env_with_schema(&batches(), &schema).await;
    let before = digest(&env.db).await;
    let id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), JobState::Failed, "{job:?}");
    let error = job.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("foreign keys on a cycle") && error.contains("nothing was deleted"),
        "{error}"
    );
    assert_eq!(
        digest(&env.db).await,
        before,
        "nothing deleted, not even soft"
    );

    // With the whole cascade on, the tenant fits one transaction and is deleted as the cascade
    // deletes it.
    let whole = config_hard(
        "batch_rows = 7\nmax_batch_rows = 7\nmax_batch_duration = \"800ms\"\n\
         lock_timeout = \"100ms\"\ncascade_rows = 0\nwhole_cascade = true",
        "id",
        "",
    );
    let progress = delete_tenant_1(&schema, &whole).await;
    assert!(progress.whole_cascade, "{progress:?}");
    assert_eq!(progress.rows_deleted, 301, "{progress:?}");
}

/// `project → segment → form_field → api_key`, each CASCADE (child → parent), closed by
/// `api_key.project_id`, a nullable SET NULL key into `project`; `form_field`'s key to the account
/// is made first, so a walk from the root meets the cycle at `form_field`. Tenant 1 owns 2 API
/// keys, 10 form fields, 20 segments and 20 projects.
const SET_NULL_CYCLE: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.form_field (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, api_key_id int);
CREATE TABLE app.segment (id int PRIMARY KEY,
    form_field_id int NOT NULL REFERENCES app.form_field ON DELETE CASCADE);
CREATE TABLE app.project (id int PRIMARY KEY,
    segment_id int NOT NULL REFERENCES app.segment ON DELETE CASCADE);
CREATE TABLE app.api_key (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    project_id int REFERENCES app.project ON DELETE SET NULL);
ALTER TABLE app.form_field ADD FOREIGN KEY (api_key_id) REFERENCES app.api_key ON DELETE CASCADE;
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.api_key SELECT g, 1 + (g - 1) / 2, NULL FROM generate_series(1, 4) g;
INSERT INTO app.form_field SELECT g, 1 + (g - 1) / 10, ((g - 1) / 10) * 2 + 1 + g % 2
    FROM generate_series(1, 20) g;
INSERT INTO app.segment SELECT g, 1 + (g - 1) / 2 FROM generate_series(1, 40) g;
INSERT INTO app.project SELECT g, g FROM generate_series(1, 40) g;
UPDATE app.api_key SET project_id = (id - 1) * 10 + 1;
ANALYZE;
";

#[tokio::test]
async fn a_cycle_closed_by_a_nullable_set_null_key_is_broken_at_that_key() {
    let config = config_hard("cascade_rows = 0", "id", "");
    let env = env_with_schema(&config, SET_NULL_CYCLE).await;
    let plan = crate::harness::accounts_plan(&env.db).await;
    let position = |name: &str| {
        plan.steps
            .iter()
            .position(|s| plan.name(s.table).name == name)
            .unwrap_or_else(|| panic!("no step on {name}: {:?}", plan.steps))
    };
    // Every CASCADE key goes child first; only the SET NULL key is deleted parent first.
    assert!(
        position("project") < position("segment"),
        "{:?}",
        plan.steps
    );
    assert!(
        position("segment") < position("form_field"),
        "{:?}",
        plan.steps
    );
    assert!(
        position("form_field") < position("api_key"),
        "{:?}",
        plan.steps
    );

    // Each table's rows go by its own steps: no API key's delete cascades to form fields.
    let progress = delete_tenant_1(SET_NULL_CYCLE, &config).await;
    assert_eq!(progress.rows_deleted, 53, "{progress:?}");
    for (table, rows) in [
        ("api_key", 2),
        ("form_field", 10),
        ("segment", 20),
        ("project", 20),
    ] {
        let t = progress
            .table(&format!("\"app\".\"{table}\""))
            .expect(table);
        assert_eq!(t.rows_deleted, rows, "{table}: {progress:?}");
    }
}
