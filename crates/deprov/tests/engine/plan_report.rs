use deprov::engine::report::PlanReport;

use crate::harness::env;

fn position(report: &PlanReport, table: &str) -> usize {
    report
        .tables
        .iter()
        .position(|t| t.table == table)
        .unwrap_or_else(|| panic!("{table} not in plan"))
}

#[tokio::test]
async fn plan_orders_leaves_first_counts_rows_and_names_blockers_and_unindexed_keys() {
    let env = env("").await;
    let report = PlanReport::build(&env.pools.target, &env.config, "1")
        .await
        .unwrap();
    // Leaves before their parents, the root last.
    for (child, parent) in [
        ("\"app\".\"events\"", "\"app\".\"deployments\""),
        ("\"app\".\"log_lines\"", "\"app\".\"deployments\""),
        ("\"app\".\"deployments\"", "\"app\".\"Environments\""),
        ("\"app\".\"deployments\"", "\"app\".\"builds\""),
        ("\"app\".\"Environments\"", "\"app\".\"projects\""),
        ("\"app\".\"projects\"", "\"app\".\"accounts\""),
        ("\"app\".\"folders\"", "\"app\".\"accounts\""),
    ] {
        assert!(
            position(&report, child) < position(&report, parent),
            "{child} must precede {parent}"
        );
    }
    assert_eq!(report.tables.last().unwrap().table, "\"app\".\"accounts\"");
    // The table with two parents is reached through both.
    let deployments = &report.tables[position(&report, "\"app\".\"deployments\"")];
    assert_eq!(deployments.paths.len(), 2, "{:?}", deployments.paths);
    // Tenant 1: 10 projects, 30 environments, 120 deployments + 1 via its build, 5 events and 3 lines each.
    let rows = |t: &str| report.tables[position(&report, t)].rows;
    assert_eq!(rows("\"app\".\"projects\""), 10);
    assert_eq!(rows("\"app\".\"deployments\""), 121);
    assert_eq!(rows("\"app\".\"events\""), 605);
    assert_eq!(rows("\"app\".\"folders\""), 6);
    assert!(report.blockers.is_empty(), "{:?}", report.blockers);
    assert!(
        report
            .unindexed_foreign_keys
            .iter()
            .any(|k| k.contains("log_lines")),
        "{:?}",
        report.unindexed_foreign_keys
    );
    assert!(
        !report
            .unindexed_foreign_keys
            .iter()
            .any(|k| k.contains("\"events\"")),
        "events is covered by its primary key"
    );
    assert!(
        report
            .side_effects
            .iter()
            .any(|k| k.contains("shares") && k.contains("ON DELETE SET NULL")),
        "{:?}",
        report.side_effects
    );
    assert!(report.to_text().contains("blockers: none"));

    let blocked = PlanReport::build(&env.pools.target, &env.config, "2")
        .await
        .unwrap();
    assert_eq!(blocked.blockers.len(), 1);
    assert_eq!(
        blocked.blockers[0].table.to_string(),
        "\"app\".\"invoices\""
    );
    assert_eq!(blocked.blockers[0].rows, 1);
    let text = blocked.to_text();
    assert!(text.contains("BLOCKERS"), "{text}");
    assert!(
        text.contains("  1 row of \"app\".\"invoices\" references "),
        "{text}"
    );
}

#[tokio::test]
async fn the_plan_hash_printed_is_the_one_the_job_runs_under() {
    // The default cascade_rows (2000): the fixture's small tables are deleted by the cascade under
    // their parents' batches, which changes the plan the worker runs from the leaves-first one.
    let config = crate::harness::config_hard("batch_rows = 7", "installation", "");
    let env = crate::harness::env_with_config(&config).await;
    sqlx::query("ANALYZE").execute(&env.db).await.unwrap();
    let report = PlanReport::build(&env.pools.target, &env.config, "1")
        .await
        .unwrap();
    assert!(
        report.tables.iter().any(|t| !t.cascaded_by.is_empty()),
        "some table is deleted by the cascade: {report:?}"
    );
    let id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(id).await;
    assert_eq!(job.state(), deprov::queue::JobState::Completed, "{job:?}");
    let progress = deprov::worker::Progress::from_json(&job.progress);
    assert_eq!(
        progress.plan_hash.as_deref(),
        Some(report.plan_hash.as_str())
    );
    assert_eq!(progress.replans, 0, "{progress:?}");
}

/// Tenants 1 and 2, each with a user and a project; comments belong to a project (CASCADE) and
/// name their author (SET NULL). One comment of tenant 2's project is by tenant 1's user.
const SET_NULL_SCHEMA: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, name text, installation text UNIQUE, deleted_at timestamptz);
CREATE TABLE app.users (id bigint PRIMARY KEY, account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.users (account_id);
CREATE TABLE app.projects (id bigint PRIMARY KEY, account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.comments (
    id bigint PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE,
    author_id bigint REFERENCES app.users ON DELETE SET NULL
);
CREATE INDEX ON app.comments (project_id);
CREATE INDEX ON app.comments (author_id);
INSERT INTO app.accounts (id) VALUES (1), (2);
INSERT INTO app.users VALUES (10, 1), (20, 2);
INSERT INTO app.projects VALUES (100, 1), (200, 2);
INSERT INTO app.comments VALUES (1000, 100, 10), (1001, 100, 20), (2000, 200, 10), (2001, 200, 20);
ANALYZE;
"#;

/// A table PostgreSQL's cascade deletes under its parents' batches is said to be deleted only by
/// the parents whose keys CASCADE into it; a SET NULL parent is named for what it does.
#[tokio::test]
async fn a_set_null_parent_is_not_said_to_delete_an_absorbed_tables_rows() {
    let config = crate::harness::config_hard("batch_rows = 7", "installation", "");
    let env = crate::harness::env_with_schema(&config, SET_NULL_SCHEMA).await;
    let report = PlanReport::build(&env.pools.target, &env.config, "1")
        .await
        .unwrap();
    let comments = &report.tables[position(&report, "\"app\".\"comments\"")];
    assert_eq!(comments.cascaded_by, ["\"app\".\"projects\""], "{report:?}");
    assert_eq!(
        comments.set_by,
        ["\"app\".\"users\" (SET NULL)"],
        "{report:?}"
    );
    let text = report.to_text();
    assert!(
        text.contains(
            "no batches of its own: PostgreSQL's cascade deletes its rows under the batches of \"app\".\"projects\"\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "the batches of \"app\".\"users\" (SET NULL) delete none of its rows: their keys set its referencing columns instead"
        ),
        "{text}"
    );
    // What happens: tenant 1's project's comments go; tenant 2's comment by tenant 1's user stays,
    // without its author.
    let id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    assert_eq!(
        env.job(id).await.state(),
        deprov::queue::JobState::Completed
    );
    let comments: Vec<(i64, i64, Option<i64>)> =
        sqlx::query_as("SELECT id, project_id, author_id FROM app.comments ORDER BY id")
            .fetch_all(&env.db)
            .await
            .unwrap();
    assert_eq!(comments, [(2000, 200, None), (2001, 200, Some(20))]);
}

#[tokio::test]
async fn each_key_without_an_index_comes_with_the_statement_that_indexes_it_largest_table_first() {
    let env = env("").await;
    // Log lines of every deployment, long ones: the larger of two tables with a key without an
    // index.
    sqlx::raw_sql(
        "INSERT INTO app.log_lines SELECT d.id, repeat('x', 200) \
         FROM app.deployments d, generate_series(1, 20); \
         CREATE TABLE app.tags (project_id bigint REFERENCES app.projects ON DELETE CASCADE, tag text); \
         INSERT INTO app.tags SELECT id, 'tag' FROM app.projects; ANALYZE app.log_lines, app.tags",
    )
    .execute(&env.db)
    .await
    .unwrap();
    let report = PlanReport::build(&env.pools.target, &env.config, "1")
        .await
        .unwrap();
    assert_eq!(
        report.index_advice.len(),
        report.unindexed_foreign_keys.len(),
        "{:?}",
        report.index_advice
    );
    let pages: Vec<f64> = report
        .index_advice
        .iter()
        .map(|a| a.pages.unwrap_or(-1.0))
        .collect();
    assert!(pages.windows(2).all(|w| w[0] >= w[1]), "{pages:?}");
    let log_lines = &report.index_advice[0];
    assert!(
        log_lines
            .foreign_key
            .starts_with("\"app\".\"log_lines\"(deployment_id)"),
        "{:?}",
        report.index_advice
    );
    assert!(pages[0] > pages[pages.len() - 1], "{pages:?}");
    assert_eq!(
        log_lines.statement,
        r#"CREATE INDEX CONCURRENTLY ON "app"."log_lines" ("deployment_id")"#
    );
    // The table's blocks, what each deployment's delete reads.
    assert!(log_lines.pages.is_some_and(|p| p >= 10.0), "{log_lines:?}");
    assert!(report.to_text().contains(&log_lines.statement));

    // Run as printed, each statement gives its key an index: none is left to advise.
    for advice in &report.index_advice {
        sqlx::raw_sql(sqlx::AssertSqlSafe(advice.statement.clone()))
            .execute(&env.db)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", advice.statement));
    }
    let after = PlanReport::build(&env.pools.target, &env.config, "1")
        .await
        .unwrap();
    assert!(after.unindexed_foreign_keys.is_empty(), "{after:?}");
    assert!(after.index_advice.is_empty(), "{:?}", after.index_advice);
}
