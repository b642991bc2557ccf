//! A tenant's few rows in a table straight under the root go with the root row's delete
//! (`Plan::absorb_tenant`): that delete makes PostgreSQL scan the table anyway when its key to the
//! root has no index, and batches of the table's own would scan it once more.

use std::collections::BTreeMap;

use deprov::engine::{self, BatchLimits};

use crate::harness::{Env, accounts_plan, analyzed_env, config_hard};

/// Tenant 1 owns 40 of 200,040 events (no index on `account_id`), tenant 2 the rest. Tenant 1's
/// 20 projects each have 2 tasks.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.events (id bigserial PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
CREATE TABLE app.projects (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.tasks (id bigint PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE);
CREATE INDEX ON app.tasks (project_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.events (account_id, body) SELECT 2, 'e' || g FROM generate_series(1, 200000) g;
INSERT INTO app.events (account_id, body) SELECT 1, 'e' || g FROM generate_series(1, 40) g;
INSERT INTO app.projects SELECT g, CASE WHEN g <= 20 THEN 1 ELSE 2 END FROM generate_series(1, 2000) g;
INSERT INTO app.tasks SELECT g, (g + 1) / 2 FROM generate_series(1, 4000) g;
";

/// [`analyzed_env`] under [`config`].
async fn analyzed(schema: &str, table: &str, rows: i64) -> Env {
    analyzed_env(&config(), schema, table, rows).await
}

/// The configuration of these tests: absorption on (`cascade_rows` 2,000), batches sized by time.
fn config() -> String {
    config_hard(
        "batch_rows = 50\nmax_batch_duration = \"800ms\"\nlock_timeout = \"100ms\"\ncascade_rows = 2000",
        "id",
        "",
    )
}

/// The most rows `tenant` holds per table straight under the root, as the worker weighs them.
async fn at_most(
    db: &sqlx::PgPool,
    plan: &engine::Plan,
    tenant: &str,
    limits: &BatchLimits,
) -> BTreeMap<u32, i64> {
    engine::estimate::absorbable_rows(db, plan, tenant, limits, 2000)
        .await
        .unwrap()
}

/// The tables of `plan` that have no steps of their own (absorbed), by name.
fn absorbed(plan: &engine::Plan) -> Vec<String> {
    plan.absorbed
        .iter()
        .map(|&t| plan.name(t).name.clone())
        .collect()
}

#[tokio::test]
async fn only_a_tenant_with_few_rows_under_the_root_has_them_go_with_the_root_row() {
    let env = analyzed(SCHEMA, "events", 200_040).await;
    let plan = accounts_plan(&env.db).await;
    let limits = BatchLimits::from(&env.config.hard_delete);
    let small = at_most(&env.db, &plan, "1", &limits).await;
    let large = at_most(&env.db, &plan, "2", &limits).await;
    let events = *plan
        .closure
        .iter()
        .find(|&&t| plan.name(t).name == "events")
        .unwrap();
    assert!(small[&events] <= 100, "{small:?}");
    assert!(large[&events] >= 150_000, "{large:?}");

    // Without a tenant's figures, no table straight under the root is absorbed.
    let generic = plan.clone().absorb(2000.0);
    assert_eq!(absorbed(&generic), ["tasks"], "{generic:#?}");
    // Tenant 1: events and projects (with their tasks) go with the root row's delete.
    let mut one = absorbed(&plan.clone().absorb_tenant(2000.0, &small));
    one.sort();
    assert_eq!(one, ["events", "projects", "tasks"]);
    // Tenant 2: its 200,000 events keep their steps; its 1,980 projects, with two tasks each,
    // are more than the allowance.
    assert_eq!(
        absorbed(&plan.clone().absorb_tenant(2000.0, &large)),
        ["tasks"]
    );
    assert_eq!(
        absorbed(&plan.clone().absorb_tenant(0.0, &small)),
        Vec::<String>::new(),
        "no allowance, no absorption"
    );

    // Rows written since ANALYZE count as the tenant's, whoever's they are: the statistics no
    // longer say how many the tenant has.
    sqlx::raw_sql(
        "SELECT pg_stat_force_next_flush(); \
         INSERT INTO app.events (account_id, body) SELECT 2, 'late' FROM generate_series(1, 3000)",
    )
    .execute(&env.db)
    .await
    .unwrap();
    let late = at_most(&env.db, &plan, "1", &limits).await;
    assert!(late[&events] >= 3000, "{late:?}");
    let mut one = absorbed(&plan.clone().absorb_tenant(2000.0, &late));
    one.sort();
    assert_eq!(one, ["projects", "tasks"]);
}

#[tokio::test]
async fn a_small_tenants_rows_in_a_large_table_go_with_the_root_row_and_equal_the_cascade() {
    let env = analyzed(SCHEMA, "events", 200_040).await;
    let progress = env.delete_tenant_1().await;
    let events = progress.table("\"app\".\"events\"").unwrap();
    assert_eq!(events.batches, 0, "{progress:?}");
    assert_eq!(events.rows_deleted, 40, "{progress:?}");
    let root = progress.table("\"app\".\"accounts\"").unwrap();
    assert_eq!(root.batches, 1, "{progress:?}");
    // One batch in all: the root row's, with PostgreSQL's cascade under it.
    assert_eq!(progress.batches, 1, "{progress:?}");
    assert_eq!(progress.rows_deleted, 1 + 40 + 20 + 40, "{progress:?}");
}

/// `tasks` has a NO ACTION key to `teams`, whose step comes before the root's: PostgreSQL would
/// refuse to delete a team while a task references it, so `tasks` keeps steps of its own (leaves
/// first, before `teams`) rather than waiting for the root row's delete. (The cascade itself
/// succeeds: the root row's trigger for `projects`, created first, fires first, and its cascade to
/// `tasks` runs before the checks the teams' deletes queue.)
const NO_ACTION: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.teams (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.tasks (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE,
    team_id bigint NOT NULL REFERENCES app.teams);
CREATE INDEX ON app.teams (account_id);
CREATE INDEX ON app.projects (account_id);
CREATE INDEX ON app.tasks (account_id);
CREATE INDEX ON app.tasks (project_id);
CREATE INDEX ON app.tasks (team_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects SELECT g, 1 + g % 2 FROM generate_series(1, 100) g;
INSERT INTO app.teams SELECT g, 1 + g % 2 FROM generate_series(1, 100) g;
INSERT INTO app.tasks SELECT g, 1 + g % 2, 1 + (g % 50) * 2 - g % 2, 1 + (g % 50) * 2 - g % 2
    FROM generate_series(1, 1000) g;
";

#[tokio::test]
async fn a_table_with_a_no_action_key_into_the_tenants_tables_keeps_its_steps() {
    let env = analyzed(NO_ACTION, "tasks", 1000).await;
    let plan = accounts_plan(&env.db).await;
    let limits = BatchLimits::from(&env.config.hard_delete);
    let rows = at_most(&env.db, &plan, "1", &limits).await;
    for absorbing in [
        plan.clone().absorb(2000.0),
        plan.clone().absorb_tenant(2000.0, &rows),
    ] {
        assert!(
            !absorbed(&absorbing).contains(&"tasks".to_string()),
            "{:?}",
            absorbed(&absorbing)
        );
    }
    let everything: BTreeMap<u32, i64> = rows.keys().map(|&t| (t, 1)).collect();
    let generous = absorbed(&plan.clone().absorb_tenant(1e9, &everything));
    assert!(!generous.contains(&"tasks".to_string()), "{generous:?}");
    // `projects` neither: the cascade of its rows reaches `tasks`.
    assert!(!generous.contains(&"projects".to_string()), "{generous:?}");
    let progress = env.delete_tenant_1().await;
    assert!(
        progress.table("\"app\".\"tasks\"").unwrap().batches > 0,
        "{progress:?}"
    );
}

/// `events` is under the root and under `members`, with no index on either key; tenant 2's one
/// member owns 200,000 events, so a member row averages 100,000 of them. Tenant 1 has one member
/// and 40 events.
const TWO_PARENTS: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.members (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.members (account_id);
CREATE TABLE app.events (id bigserial PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    member_id bigint NOT NULL REFERENCES app.members ON DELETE CASCADE, body text);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.members VALUES (1, 1), (2, 2);
INSERT INTO app.events (account_id, member_id, body) SELECT 2, 2, 'e' || g FROM generate_series(1, 200000) g;
INSERT INTO app.events (account_id, member_id, body) SELECT 1, 1, 'e' || g FROM generate_series(1, 40) g;
";

#[tokio::test]
async fn a_small_tenants_rows_under_a_scanning_parent_with_a_large_average_go_with_the_root_row() {
    let env = analyzed(TWO_PARENTS, "events", 200_040).await;
    let plan = accounts_plan(&env.db).await;
    let limits = BatchLimits::from(&env.config.hard_delete);
    // Tenant 1's 40 events, not a member row's average of 100,000, weigh on `members`; deleting
    // a member scans `events` (no index on `member_id`) whether or not they go with it.
    let small = at_most(&env.db, &plan, "1", &limits).await;
    assert_eq!(
        absorbed(&plan.clone().absorb_tenant(2000.0, &small)),
        ["events"]
    );
    let large = at_most(&env.db, &plan, "2", &limits).await;
    assert_eq!(
        absorbed(&plan.clone().absorb_tenant(2000.0, &large)),
        Vec::<String>::new()
    );

    // The job: no pass of batches over `events`; the member's delete and the root row's take the
    // tenant's events, and the result is the cascade's (`delete_tenant_1`).
    let progress = env.delete_tenant_1().await;
    let events = progress.table("\"app\".\"events\"").unwrap();
    assert_eq!(events.batches, 0, "{progress:?}");
    assert_eq!(events.rows_deleted, 40, "{progress:?}");
    assert_eq!(progress.rows_deleted, 1 + 1 + 40, "{progress:?}");
    assert_eq!(progress.replans, 0, "{progress:?}");
}

#[tokio::test]
async fn the_root_rows_allowance_grows_with_the_pages_its_delete_scans_anyway() {
    let env = analyzed(SCHEMA, "events", 200_040).await;
    let plan = accounts_plan(&env.db).await;
    let limits = BatchLimits::from(&env.config.hard_delete);
    let small = at_most(&env.db, &plan, "1", &limits).await;
    let pages: f64 = sqlx::query_scalar(
        "SELECT relpages::float8 FROM pg_class WHERE oid = 'app.events'::regclass",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    // The root row's delete scans `events` (no index on `account_id`): a quarter of its pages is
    // more than tenant 1's 40 events and 20 projects with their 40 tasks, so they go with it even
    // under an allowance of 10 rows, which alone takes only `tasks` under `projects`.
    assert!(
        pages * engine::absorb::ROWS_PER_SCANNED_PAGE > 1.0 + 40.0 + 20.0 * 3.0,
        "{pages} pages"
    );
    let tight_plan = plan.clone().absorb_tenant(10.0, &small);
    let mut tight = absorbed(&tight_plan);
    tight.sort();
    assert_eq!(tight, ["events", "projects", "tasks"]);
    // The root row's delete takes the tenant's rows: it is held to a bound within which its scan
    // of `events` fits, and not to one too short for it.
    let ms = |ms: u64| std::time::Duration::from_millis(ms);
    let fits = pages / engine::absorb::SCANNED_PAGES_PER_MS;
    assert!(tight_plan.root_delete_bounded(ms(fits.ceil() as u64)));
    assert!(!tight_plan.root_delete_bounded(ms(fits.floor() as u64 - 1)));
    // Absorbing nothing straight below it, it is held to none.
    let generic = plan.clone().absorb(10.0);
    assert!(!generic.root_delete_bounded(ms(10_000)));
    assert_eq!(absorbed(&plan.clone().absorb(10.0)), ["tasks"]);
    // No allowance is still none.
    assert_eq!(
        absorbed(&plan.clone().absorb_tenant(0.0, &small)),
        Vec::<String>::new()
    );
}

/// `notes` is straight under the root (no index on `account_id`) and has a SET NULL key to
/// `invoices` (`owner_invoice_id`, nullable): the invoices' step, before the root row's delete,
/// sets it on tenant 1's notes that the root row's cascade then deletes. Tenant 2 fills `notes`,
/// and `invoice_lines`, whose key to `invoices` has no index: an invoice's delete scans it, so
/// `invoices` keeps its step. `%EXTRA%` is replaced by a statement that gives `notes` something
/// the update could meet.
const SET_NULL: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.invoices (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.invoices (account_id);
CREATE TABLE app.invoice_lines (invoice_id bigint NOT NULL REFERENCES app.invoices ON DELETE CASCADE);
CREATE TABLE app.notes (id bigserial PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    owner_invoice_id bigint REFERENCES app.invoices ON DELETE SET NULL, body text);
CREATE INDEX ON app.notes (owner_invoice_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.invoices SELECT g, 1 + g % 2 FROM generate_series(1, 20) g;
INSERT INTO app.invoice_lines SELECT 1 FROM generate_series(1, 10000);
INSERT INTO app.notes (account_id, owner_invoice_id, body)
    SELECT 2, NULL, 'n' || g FROM generate_series(1, 100000) g;
INSERT INTO app.notes (account_id, owner_invoice_id, body)
    SELECT 1, 1 + (g % 10) * 2, 'n' || g FROM generate_series(1, 30) g;
%EXTRA%
";

#[tokio::test]
async fn a_table_whose_set_null_key_rewrites_plainly_goes_with_the_root_row_and_equals_the_cascade()
{
    let schema = SET_NULL.replace("%EXTRA%", "");
    let env = analyzed(&schema, "notes", 100_030).await;
    let plan = accounts_plan(&env.db).await;
    let limits = BatchLimits::from(&env.config.hard_delete);
    let small = at_most(&env.db, &plan, "1", &limits).await;
    let mut one = absorbed(&plan.clone().absorb_tenant(2000.0, &small));
    one.sort();
    assert_eq!(one, ["invoice_lines", "notes"]);
    // The job: the invoices' batches set the key of tenant 1's notes, which then go with the
    // root row's delete; the result is the cascade's (`delete_tenant_1`).
    let progress = env.delete_tenant_1().await;
    let invoices = progress.table("\"app\".\"invoices\"").unwrap();
    assert!(invoices.batches > 0, "{progress:?}");
    let notes = progress.table("\"app\".\"notes\"").unwrap();
    assert_eq!((notes.batches, notes.rows_deleted), (0, 30), "{progress:?}");
    assert_eq!(progress.rows_deleted, 1 + 10 + 30, "{progress:?}");
}

#[tokio::test]
async fn a_set_null_key_whose_update_could_meet_more_than_the_key_keeps_its_tables_steps() {
    for extra in [
        "ALTER TABLE app.notes ADD CHECK (body IS NOT NULL);",
        "CREATE UNIQUE INDEX ON app.notes (owner_invoice_id, body);",
        "ALTER TABLE app.notes ADD COLUMN owned boolean \
             GENERATED ALWAYS AS (owner_invoice_id IS NOT NULL) STORED;",
        "CREATE FUNCTION app.touch() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RETURN NEW; END $$; \
         CREATE TRIGGER touch BEFORE UPDATE ON app.notes FOR EACH ROW EXECUTE FUNCTION app.touch();",
        "CREATE RULE keep AS ON UPDATE TO app.notes WHERE false DO ALSO NOTHING;",
        // Another key into the tenant's tables over the same column: setting it would detach the
        // row from that key's parent too.
        "CREATE TABLE app.tags (id bigint PRIMARY KEY, \
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE); \
         INSERT INTO app.tags SELECT g, 2 FROM generate_series(1, 20) g; \
         ALTER TABLE app.notes ADD FOREIGN KEY (owner_invoice_id) REFERENCES app.tags \
             ON DELETE CASCADE;",
    ] {
        let env = analyzed(&SET_NULL.replace("%EXTRA%", extra), "notes", 100_030).await;
        let plan = accounts_plan(&env.db).await;
        let limits = BatchLimits::from(&env.config.hard_delete);
        let small = at_most(&env.db, &plan, "1", &limits).await;
        let kept = absorbed(&plan.clone().absorb_tenant(2000.0, &small));
        assert!(!kept.contains(&"notes".to_string()), "{extra}: {kept:?}");
    }
}

/// Tenant 1 owns 10,000 projects, each with three tasks, as many as tenant 2: within an allowance
/// of 50,000 rows they go with the root row's delete, which takes far longer than the 16 ms bound
/// of `max_batch_duration = "20ms"`.
const MANY_PROJECTS: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.tasks (id bigint PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE);
CREATE INDEX ON app.tasks (project_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects SELECT g, 1 + g % 2 FROM generate_series(1, 20000) g;
INSERT INTO app.tasks SELECT g, 1 + g % 20000 FROM generate_series(1, 60000) g;
";

/// Tenant 1 owns 80,000 projects, as many as tenant 2, with no index on `account_id`: the root
/// row's delete scans the table (a few hundred pages, within the 16 ms bound at 100 pages per ms),
/// and within an allowance of 100,000 rows the tenant's projects go with it, which takes far
/// longer than the bound.
const SCANNED_PROJECTS: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects SELECT g, 1 + g % 2 FROM generate_series(1, 160000) g;
";

/// Deletes tenant 1 of `schema` (analyzed once `table` has `written` rows) under a 16 ms batch
/// bound and an allowance of `cascade_rows`, asserting that the plan for it first has the root
/// row's delete take `taken` (sorted) under the bound, and that the job's root row was cut there
/// and re-planned once, giving `projects` (`projects` rows of tenant 1) steps of its own; the
/// result is the cascade's (`delete_tenant_1`). Returns the job's progress.
async fn root_cut_and_re_planned(
    schema: &str,
    (table, written): (&str, i64),
    cascade_rows: u32,
    taken: &[&str],
    projects: i64,
) -> deprov::worker::Progress {
    let config = config_hard(
        &format!(
            "batch_rows = 50\nmax_batch_duration = \"20ms\"\nlock_timeout = \"5ms\"\ncascade_rows = {cascade_rows}"
        ),
        "id",
        "",
    );
    let env = analyzed_env(&config, schema, table, written).await;
    let plan = accounts_plan(&env.db).await;
    let limits = BatchLimits::from(&env.config.hard_delete);
    let small = engine::estimate::absorbable_rows(&env.db, &plan, "1", &limits, cascade_rows)
        .await
        .unwrap();
    let first = plan.clone().absorb_tenant(f64::from(cascade_rows), &small);
    let mut absorbed_first = absorbed(&first);
    absorbed_first.sort();
    assert_eq!(absorbed_first, taken, "{small:?}");
    assert!(first.root_delete_bounded(env.config.hard_delete.batch_timeout()));

    let progress = env.delete_tenant_1().await;
    assert_eq!(progress.replans, 1, "{progress:?}");
    assert!(progress.longest_rolled_back_ms > 0.0, "{progress:?}");
    let steps = progress.table("\"app\".\"projects\"").unwrap();
    assert!(steps.batches >= 1, "{progress:?}");
    assert_eq!(steps.rows_deleted, projects, "{progress:?}");
    progress
}

#[tokio::test]
async fn a_root_row_whose_absorbed_rows_outlast_the_bound_is_cut_and_re_planned_not_run_unbounded()
{
    // The root row's delete scans nothing; with 40,000 rows under it, it is cut at the bound and
    // rolled back, and after the re-plan `projects` has steps of its own (its tasks go with its
    // batches) and the root row goes last, alone.
    let progress = root_cut_and_re_planned(
        MANY_PROJECTS,
        ("tasks", 60_000),
        50_000,
        &["projects", "tasks"],
        10_000,
    )
    .await;
    assert_eq!(progress.rows_deleted, 1 + 10_000 + 30_000, "{progress:?}");
}

#[tokio::test]
async fn a_root_row_whose_absorbed_rows_in_a_table_it_scans_outlast_the_bound_is_re_planned_too() {
    // Its scan of `projects` fits the bound: what the bound cut is the 80,000 rows that went
    // with the delete, which a re-plan gives a step of their own.
    let progress = root_cut_and_re_planned(
        SCANNED_PROJECTS,
        ("projects", 160_000),
        100_000,
        &["projects"],
        80_000,
    )
    .await;
    assert_eq!(progress.rows_deleted, 1 + 80_000, "{progress:?}");
}

/// The root row's delete scans `events` (1.1M rows of tenant 2, no index on `account_id`: about
/// 7,000 pages, within the 80 ms bound at 100 pages per ms), so its allowance is at least a
/// quarter of those pages. Tenant 1's 1,700 `items`, each referenced by 32 empty tables (each
/// row's delete runs 32 referential triggers), and its 200 `notes` fit an allowance of 2,000 rows;
/// an eighth of it leaves the items to the root row by the pages alone.
fn floored_schema() -> String {
    let children: String = (1..=32)
        .map(|i| {
            format!(
                "CREATE TABLE app.c{i} (item_id bigint REFERENCES app.items ON DELETE CASCADE);
                 CREATE INDEX ON app.c{i} (item_id);\n"
            )
        })
        .collect();
    format!(
        "CREATE SCHEMA app;
         CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
         CREATE TABLE app.events (id bigserial PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, body text);
         CREATE TABLE app.items (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, pad text);
         CREATE INDEX ON app.items (account_id);
         CREATE TABLE app.notes (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
         CREATE INDEX ON app.notes (account_id);
         {children}
         INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
         INSERT INTO app.events (account_id, body) SELECT 2, 'e' || g FROM generate_series(1, 1100000) g;
         INSERT INTO app.events (account_id, body) SELECT 1, 'e' || g FROM generate_series(1, 10) g;
         INSERT INTO app.items SELECT g, 1 + g % 2, repeat('x', 200) FROM generate_series(1, 3400) g;
         INSERT INTO app.notes SELECT g, 1 + g % 2 FROM generate_series(1, 400) g;"
    )
}

#[tokio::test]
async fn a_root_row_cut_under_the_bound_re_plans_until_its_delete_takes_no_absorbed_rows() {
    let config = config_hard(
        "batch_rows = 50\nmax_batch_duration = \"100ms\"\nlock_timeout = \"5ms\"\ncascade_rows = 2000",
        "id",
        "",
    );
    let env = analyzed_env(&config, &floored_schema(), "events", 1_100_010).await;
    let plan = accounts_plan(&env.db).await;
    let limits = BatchLimits::from(&env.config.hard_delete);
    let small = at_most(&env.db, &plan, "1", &limits).await;
    let straight = |p: &engine::Plan| {
        let mut t: Vec<String> = absorbed(p)
            .into_iter()
            .filter(|t| !t.starts_with('c'))
            .collect();
        t.sort();
        t
    };
    let full = plan.clone().absorb_tenant(2000.0, &small);
    assert_eq!(straight(&full), ["events", "items", "notes"], "{small:?}");
    assert!(full.root_delete_bounded(env.config.hard_delete.batch_timeout()));
    // An eighth of the allowance still leaves the items to the root row: the pages it scans
    // set its allowance.
    let eighth = plan.clone().absorb_tenant(250.0, &small);
    assert_eq!(straight(&eighth), ["events", "items"], "{small:?}");

    // The job: the root row's delete is cut once, and the re-plan leaves it no absorbed rows,
    // rather than an allowance under which the items' delete would be cut again.
    let progress = env.delete_tenant_1().await;
    assert_eq!(progress.replans, 1, "{progress:?}");
    assert_eq!(progress.cascade_rows, Some(0), "{progress:?}");
    let items = progress.table("\"app\".\"items\"").unwrap();
    assert!(items.batches >= 1, "{progress:?}");
    assert_eq!(items.rows_deleted, 1_700, "{progress:?}");
    assert_eq!(progress.rows_deleted, 1 + 10 + 1_700 + 200, "{progress:?}");
}
