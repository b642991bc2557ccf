//! A table with a NOT NULL key straight to the root and other cascading paths besides: its
//! block-range step runs before its other steps, and with `cascade_rows` > 0 it is *covered*
//! (`engine::absorb`): only the direct step runs, and a row reached only through another path goes
//! with that path's parent's cascade, counted there.

use deprov::engine::Plan;

use crate::harness::{config_hard, delete_tenant_1, env_with_schema};

/// 3 tenants × 20 threads × 50 jobs. `jobs.account_id` has no index (a block-range step);
/// `jobs.thread_id` has one. Seven jobs name tenant 2 in `account_id` but sit under tenant 1's
/// threads: the cascade deletes them with tenant 1.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.threads (id int PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.jobs (id int PRIMARY KEY,
    thread_id int NOT NULL REFERENCES app.threads ON DELETE CASCADE,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
CREATE INDEX ON app.threads (account_id);
CREATE INDEX ON app.jobs (thread_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL), (3, NULL);
INSERT INTO app.threads SELECT g, 1 + g % 3 FROM generate_series(1, 60) g;
INSERT INTO app.jobs SELECT g, 1 + g % 60, 1 + (1 + g % 60) % 3, repeat('x', 40)
    FROM generate_series(1, 3000) g;
UPDATE app.jobs SET account_id = 2 WHERE account_id = 1 AND id <= 400 AND id % 7 = 0;
ANALYZE;
";

async fn plan(config: &str) -> Plan {
    let env = env_with_schema(config, SCHEMA).await;
    crate::harness::accounts_plan(&env.db).await
}

fn jobs(plan: &Plan) -> u32 {
    plan.steps
        .iter()
        .map(|s| s.table)
        .find(|&t| plan.name(t).name == "jobs")
        .expect("a step on jobs")
}

#[tokio::test]
async fn a_tables_block_range_step_runs_before_its_other_steps() {
    let plan = plan(&config_hard("cascade_rows = 0", "id", "")).await;
    let jobs = jobs(&plan);
    let steps: Vec<_> = plan.steps.iter().filter(|s| s.table == jobs).collect();
    assert_eq!(steps.len(), 2, "{:?}", plan.steps);
    assert!(
        plan.block_step(steps[0]),
        "{}",
        plan.describe_path(steps[0])
    );
    assert!(
        !plan.block_step(steps[1]),
        "{}",
        plan.describe_path(steps[1])
    );
}

#[tokio::test]
async fn a_covered_table_keeps_only_its_direct_step_and_its_other_rows_go_with_the_cascade() {
    let leaves_first = plan(&config_hard("", "id", "")).await;
    let absorbing = leaves_first.clone().absorb(1000.0);
    let jobs = jobs(&absorbing);
    assert!(absorbing.covered.contains(&jobs), "{:?}", absorbing.covered);
    let steps: Vec<_> = absorbing.steps.iter().filter(|s| s.table == jobs).collect();
    assert_eq!(steps.len(), 1, "{:?}", absorbing.steps);
    assert_eq!(
        absorbing.describe_path(steps[0]),
        r#""app"."jobs" → "app"."accounts""#
    );
    let threads = absorbing
        .steps
        .iter()
        .find(|s| absorbing.name(s.table).name == "threads")
        .expect("a step on threads")
        .table;
    assert_eq!(absorbing.absorbed_below(threads), vec![jobs]);
    assert!(absorbing.absorbed_below(jobs).is_empty());

    // Leaves first (cascade_rows = 0) keeps every path's step.
    assert!(leaves_first.clone().absorb(0.0).covered.is_empty());

    let progress = delete_tenant_1(
        SCHEMA,
        &config_hard(
            "batch_rows = 50\nmax_batch_duration = \"800ms\"\nlock_timeout = \"100ms\"",
            "id",
            "",
        ),
    )
    .await;
    let t = progress
        .table(r#""app"."jobs""#)
        .expect("jobs in the progress");
    // Tenant 1's 1,000 jobs: 981 by the direct step, and the 19 that name tenant 2 with the
    // threads' cascade; each counted once.
    assert_eq!(t.rows_deleted, 1000, "{progress:?}");
    assert_eq!(progress.rows_deleted, 1 + 20 + 1000, "{progress:?}");
}

/// A join table under two tenant tables, with no key straight to the root: 3 tenants × 10
/// environments and 20 invites; each invite in three environments. Twenty links join tenant 1's
/// invites to tenant 2's environments: only the invites' path reaches them. `extra` is added to
/// `env_invites`' columns.
fn join_schema(extra: &str) -> String {
    format!(
        "CREATE SCHEMA app;
         CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
         CREATE TABLE app.envs (id int PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
         CREATE TABLE app.invites (id int PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
         CREATE TABLE app.env_invites (
             env_id int NOT NULL REFERENCES app.envs ON DELETE CASCADE,
             invite_id int NOT NULL REFERENCES app.invites ON DELETE CASCADE{extra},
             PRIMARY KEY (env_id, invite_id));
         CREATE INDEX ON app.envs (account_id);
         CREATE INDEX ON app.invites (account_id);
         CREATE INDEX ON app.env_invites (invite_id);
         INSERT INTO app.accounts VALUES (1, NULL), (2, NULL), (3, NULL);
         INSERT INTO app.envs SELECT g, 1 + g % 3 FROM generate_series(0, 29) g;
         INSERT INTO app.invites SELECT g, 1 + g % 3 FROM generate_series(0, 59) g;
         INSERT INTO app.env_invites (env_id, invite_id)
             SELECT (i % 3) + 3 * ((i / 3 + k) % 10), i FROM generate_series(0, 59) i, generate_series(0, 2) k;
         INSERT INTO app.env_invites (env_id, invite_id)
             SELECT 1 + 3 * (i % 10), i FROM generate_series(0, 59, 3) i;"
    )
}

#[tokio::test]
async fn a_join_table_under_two_tenant_tables_keeps_one_step_and_the_other_path_cascades() {
    let schema = join_schema("");
    let env = env_with_schema(&config_hard("", "id", ""), &schema).await;
    let leaves_first = crate::harness::accounts_plan(&env.db).await;
    let on = |plan: &Plan| {
        plan.steps
            .iter()
            .filter(|s| plan.name(s.table).name == "env_invites")
            .count()
    };
    assert_eq!(on(&leaves_first), 2);
    let absorbing = leaves_first.clone().absorb(1000.0);
    assert_eq!(on(&absorbing), 1, "{:?}", absorbing.steps);
    assert_eq!(absorbing.covered.len(), 1, "{:?}", absorbing.covered);
    // A NO ACTION key out of the join table keeps both paths: rows left to the invites' batches
    // would still reference environments deleted before them.
    let env = env_with_schema(
        &config_hard("", "id", ""),
        &join_schema(",\n             origin_id int REFERENCES app.envs"),
    )
    .await;
    let blocked = crate::harness::accounts_plan(&env.db).await.absorb(1000.0);
    assert_eq!(on(&blocked), 2, "{:?}", blocked.steps);

    let progress = delete_tenant_1(
        &schema,
        &config_hard(
            "batch_rows = 5\nmax_batch_duration = \"800ms\"\nlock_timeout = \"100ms\"",
            "id",
            "",
        ),
    )
    .await;
    let t = progress
        .table(r#""app"."env_invites""#)
        .expect("env_invites in the progress");
    // Tenant 1's 60 links within its own tables and the 20 under its invites alone.
    assert_eq!(t.rows_deleted, 80, "{progress:?}");
}
