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
    assert!(blocked.to_text().contains("BLOCKERS"));
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
