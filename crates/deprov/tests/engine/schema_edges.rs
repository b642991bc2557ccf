//! Schemas built to break the claim "equal to the cascade on any schema", each a fixed test.

use deprov::queue::JobState;

use crate::harness::{config_for, config_hard, delete_tenant_1, digest, env_with_schema, plan_cli};

/// Tables that `INHERITS` from a table in the tenant: a foreign key covers only its own table, so
/// the cascade (whose referential triggers query `ONLY`) never deletes an inheriting child's rows,
/// even those whose columns name the tenant. deprov's statements deleted them too.
fn inheritance_schema(analyze: bool) -> String {
    format!(
        "CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, name text);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.projects_archive (archived_at date) INHERITS (app.projects);
CREATE TABLE app.tasks (id bigint PRIMARY KEY,
    project_id bigint REFERENCES app.projects ON DELETE CASCADE,
    account_id bigint REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.tasks (project_id);
CREATE INDEX ON app.tasks (account_id);
CREATE TABLE app.tasks_child () INHERITS (app.tasks);
INSERT INTO app.accounts SELECT g, NULL FROM generate_series(1, 3) g;
INSERT INTO app.projects SELECT g, 1 + g % 3, 'p' FROM generate_series(1, 12) g;
INSERT INTO app.projects_archive SELECT g, 1 + g % 3, 'arch', '2020-01-01' FROM generate_series(100, 111) g;
INSERT INTO app.tasks SELECT g, 1 + g % 12, 1 + (1 + g % 12) % 3 FROM generate_series(1, 40) g;
INSERT INTO app.tasks_child SELECT g, 1 + g % 12, 1 + (1 + g % 12) % 3 FROM generate_series(1000, 1020) g;
{}",
        if analyze { "ANALYZE;" } else { "" }
    )
}

#[tokio::test]
async fn rows_of_a_table_that_inherits_from_a_tenant_table_are_left_as_the_cascade_leaves_them() {
    // Leaves first: every table gets its own batches.
    let progress = delete_tenant_1(&inheritance_schema(false), &config_for(2, "id", "")).await;
    assert_eq!(progress.rows_deleted, 1 + 4 + 13, "{progress:?}");
    // Analyzed, with an allowance: the projects' batches let PostgreSQL cascade to the tasks.
    let absorbed = config_hard(
        "batch_rows = 50\nmax_batch_rows = 100000\ncascade_rows = 2000",
        "id",
        "",
    );
    let progress = delete_tenant_1(&inheritance_schema(true), &absorbed).await;
    assert_eq!(progress.rows_deleted, 1 + 4 + 13, "{progress:?}");
}

/// Requests tenant 1's deletion in `env` and asserts the job failed with a message holding every
/// one of `says` and "nothing was deleted", and that the data is unchanged; returns the message.
async fn refused(env: &crate::harness::Env, says: &[&str]) -> String {
    let before = digest(&env.db).await;
    let job_id = env.request("1").await;
    env.drain(&env.worker("w1")).await;
    let job = env.job(job_id).await;
    let message = job.last_error.clone().unwrap_or_default();
    assert_eq!(job.state(), JobState::Failed, "{job:?}");
    for s in says.iter().chain(&["nothing was deleted"]) {
        assert!(message.contains(s), "{s:?} not in {message}");
    }
    assert_eq!(
        digest(&env.db).await,
        before,
        "a refused job changes nothing"
    );
    message
}

/// Tenant 1 (account 1) owns project 1; account 2's share row 1 points at project 1 by a SET NULL
/// key, which `constraint` (SQL inside `app.shares`' definition) refuses to see NULL in.
fn set_null_schema(proj_column: &str, constraint: &str, prelude: &str) -> String {
    format!(
        "CREATE SCHEMA app;
{prelude}
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.shares (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    project_id {proj_column} REFERENCES app.projects ON DELETE SET NULL{constraint});
CREATE INDEX ON app.projects (account_id);
CREATE INDEX ON app.shares (account_id);
CREATE INDEX ON app.shares (project_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects VALUES (1, 1), (2, 2), (3, 1);
INSERT INTO app.shares VALUES (1, 2, 1), (2, 1, 1), (3, 2, 2), (4, 2, 3);"
    )
}

#[tokio::test]
async fn a_set_null_that_a_check_a_domain_or_a_unique_constraint_refuses_is_refused_before_anything_is_deleted()
 {
    let cases = [
        (
            set_null_schema(
                "bigint",
                ",\n    CHECK (project_id IS NOT NULL OR account_id = 1)",
                "",
            ),
            "23514",
        ),
        (
            set_null_schema(
                "app.project_ref",
                "",
                "CREATE DOMAIN app.project_ref AS bigint NOT NULL;",
            ),
            "23502",
        ),
        (
            set_null_schema(
                "bigint",
                ",\n    UNIQUE NULLS NOT DISTINCT (account_id, project_id)",
                "",
            ),
            "23505",
        ),
    ];
    for (schema, sqlstate) in cases {
        let env = env_with_schema(&config_for(2, "id", ""), &schema).await;
        let error = env
            .try_cascade_copy(1)
            .await
            .expect_err("the cascade fails");
        assert!(error.to_string().contains(sqlstate) || format!("{error:?}").contains(sqlstate));
        let (ok, text) = plan_cli(&env, "1", &["--trial"], &config_for(2, "id", ""));
        assert!(
            !ok && text.contains("trial cascade") && text.contains(sqlstate),
            "{text}"
        );
        let message = refused(&env, &[sqlstate, "trial"]).await;
        assert!(
            message.contains("the cascading DELETE of the tenant fails"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn a_delete_trigger_that_raises_or_writes_a_row_the_cascade_then_refuses_is_refused() {
    // A BEFORE DELETE trigger refusing one of the tenant's rows.
    let raises = "CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.items (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, locked boolean DEFAULT false);
CREATE INDEX ON app.items (account_id);
CREATE FUNCTION app.no_locked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF old.locked THEN RAISE EXCEPTION 'item % is locked', old.id; END IF; RETURN old; END $$;
CREATE TRIGGER item_guard BEFORE DELETE ON app.items FOR EACH ROW EXECUTE FUNCTION app.no_locked();
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.items SELECT g, 1 + g % 2, g = 8 FROM generate_series(1, 20) g;";
    let env = env_with_schema(&config_for(2, "id", ""), raises).await;
    env.try_cascade_copy(1)
        .await
        .expect_err("the cascade fails");
    refused(&env, &["item 8 is locked", "P0001"]).await;

    // An AFTER DELETE trigger writing a tombstone that references the root being deleted.
    let tombstone = "CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.tombs (id serial PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, what text);
CREATE TABLE app.items (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE FUNCTION app.tomb() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO app.tombs (account_id, what) VALUES (old.account_id, 'item ' || old.id); RETURN NULL; END $$;
CREATE TRIGGER item_tomb AFTER DELETE ON app.items FOR EACH ROW EXECUTE FUNCTION app.tomb();
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.items SELECT g, 1 + g % 2 FROM generate_series(1, 10) g;";
    let env = env_with_schema(&config_for(2, "id", ""), tombstone).await;
    env.try_cascade_copy(1)
        .await
        .expect_err("the cascade fails");
    refused(&env, &["tombs_account_id_fkey", "23503"]).await;
}

/// A BEFORE DELETE trigger on the root that keeps protected tenants: the cascade deletes nothing.
/// deprov deleted every child and then reported the job completed with the root row still there.
#[tokio::test]
async fn a_root_row_its_trigger_keeps_is_refused_and_its_children_are_kept() {
    let schema = "CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz, protected boolean DEFAULT false);
CREATE TABLE app.items (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.items (account_id);
CREATE FUNCTION app.guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF old.protected THEN RETURN NULL; END IF; RETURN old; END $$;
CREATE TRIGGER root_guard BEFORE DELETE ON app.accounts FOR EACH ROW EXECUTE FUNCTION app.guard();
INSERT INTO app.accounts VALUES (1, NULL, true), (2, NULL, false);
INSERT INTO app.items SELECT g, 1 + g % 2 FROM generate_series(1, 10) g;";
    let env = env_with_schema(&config_for(2, "id", ""), schema).await;
    let expected = env.cascade_copy(1).await;
    assert_eq!(
        digest(&expected).await,
        digest(&env.db).await,
        "the cascade deletes nothing"
    );
    // `deprov plan` says so only when asked to run the trial, and changes nothing either way.
    let (ok, text) = plan_cli(&env, "1", &[], &config_for(2, "id", ""));
    assert!(ok && !text.contains("trial cascade"), "{text}");
    let (ok, text) = plan_cli(&env, "1", &["--trial"], &config_for(2, "id", ""));
    assert!(!ok, "{text}");
    assert!(
        text.contains("trial cascade (the cascading DELETE run and rolled back): deletes nothing; deprov will refuse")
            && text.contains("deletes nothing (a BEFORE DELETE trigger"),
        "{text}"
    );
    assert_eq!(digest(&expected).await, digest(&env.db).await);
    refused(&env, &["deletes nothing"]).await;
}

/// Forced row-level security hides a row that references the tenant (RESTRICT) from deprov's role,
/// the tables' owner; PostgreSQL's referential triggers bypass it and the cascade fails on it.
/// deprov, seeing no blocker, deleted 25 rows and then failed.
#[tokio::test]
async fn a_blocker_that_row_level_security_hides_from_deprov_is_still_found() {
    let schema = "CREATE ROLE app_owner LOGIN;
CREATE SCHEMA app AUTHORIZATION app_owner;
SET ROLE app_owner;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.items (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, archived boolean DEFAULT false);
CREATE TABLE app.pins (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    item_id bigint REFERENCES app.items ON DELETE RESTRICT, archived boolean DEFAULT false);
CREATE INDEX ON app.items (account_id);
CREATE INDEX ON app.pins (account_id);
CREATE INDEX ON app.pins (item_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.items SELECT g, 1 + g % 2, g % 5 = 0 FROM generate_series(1, 20) g;
INSERT INTO app.pins VALUES (1, 2, 10, true), (2, 1, 4, false);
ALTER TABLE app.items ENABLE ROW LEVEL SECURITY;
ALTER TABLE app.items FORCE ROW LEVEL SECURITY;
CREATE POLICY live ON app.items USING (NOT archived);
ALTER TABLE app.pins ENABLE ROW LEVEL SECURITY;
ALTER TABLE app.pins FORCE ROW LEVEL SECURITY;
CREATE POLICY live ON app.pins USING (NOT archived);
RESET ROLE;";
    let mut env = env_with_schema(&config_for(2, "id", ""), schema).await;
    env.try_cascade_copy(1)
        .await
        .expect_err("the cascade fails");
    // deprov's target connection is the owner's, to whom the policies apply.
    let state = env.server.url("target");
    let owner = state.replacen("postgres@", "app_owner@", 1);
    env.pools = deprov::db::Pools::new(&state, &owner, &env.config.pools).unwrap();
    refused(&env, &["pins_item_id_fkey", "23503"]).await;
}

/// `numeric` keys equal in value but written differently (5.0 and 5.00): the simulation compares
/// keys by their text and missed that a RESTRICT check finds the row before the cascade removes
/// it (the same schema with integer keys was refused). The trial asks PostgreSQL instead.
#[tokio::test]
async fn numeric_keys_equal_but_written_differently_do_not_hide_a_failing_cascade() {
    let schema = "CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.codes (code numeric PRIMARY KEY,
    account_id bigint REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.carts (id bigint PRIMARY KEY,
    account_id bigint REFERENCES app.accounts ON DELETE CASCADE);
CREATE TABLE app.lines (id bigint PRIMARY KEY,
    code numeric REFERENCES app.codes ON DELETE RESTRICT,
    cart_id bigint REFERENCES app.carts ON DELETE CASCADE);
CREATE INDEX ON app.codes (account_id);
CREATE INDEX ON app.carts (account_id);
CREATE INDEX ON app.lines (code);
CREATE INDEX ON app.lines (cart_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.codes VALUES (5.0, 1), (6, 2);
INSERT INTO app.carts VALUES (7, 1), (8, 2);
INSERT INTO app.lines VALUES (1, 5.00, 7), (2, 6, 8);";
    let env = env_with_schema(&config_for(2, "id", ""), schema).await;
    env.try_cascade_copy(1)
        .await
        .expect_err("the cascade fails");
    refused(&env, &["lines_code_fkey", "23503"]).await;
}

/// `char(n)` and `varchar` keys: `'ab'` in a `char(5)` key is `'ab   '`, and rows of a `char(8)` and
/// a `varchar` key reference it. The simulation compares keys by their text and said a RESTRICT
/// check would fail, so deprov refused a tenant whose cascade succeeds. PostgreSQL's trial of the
/// cascade succeeded, and it now decides.
#[tokio::test]
async fn char_keys_the_simulation_misreads_do_not_refuse_a_cascade_postgresql_completes() {
    let schema = "CREATE SCHEMA app;
CREATE TABLE app.accounts (id char(5) PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.child (id int PRIMARY KEY, code char(8) REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.child (code);
CREATE TABLE app.grand (id int PRIMARY KEY, child_id int REFERENCES app.child ON DELETE CASCADE,
    code char(3) REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.grand (child_id);
CREATE INDEX ON app.grand (code);
CREATE TABLE app.pin (id int PRIMARY KEY, code varchar(10) REFERENCES app.accounts ON DELETE CASCADE,
    child_id int REFERENCES app.child ON DELETE RESTRICT);
CREATE INDEX ON app.pin (code);
CREATE INDEX ON app.pin (child_id);
INSERT INTO app.accounts VALUES ('ab', NULL), ('ab  x', NULL), ('cd', NULL);
INSERT INTO app.child VALUES (1, 'ab'), (2, 'ab   '), (3, 'cd'), (4, 'ab  x');
INSERT INTO app.grand VALUES (1, 1, 'ab'), (2, 3, 'ab'), (3, 4, 'cd');
INSERT INTO app.pin VALUES (1, 'ab', 2), (2, 'ab ', 1), (3, 'cd', 3);";
    let run = |trial: bool| async move {
        let config = config_hard(
            &format!(
                "batch_rows = 2\nmax_batch_rows = 2\ncascade_rows = 0\ntrial_cascade = {trial}"
            ),
            "id",
            "",
        );
        let env = env_with_schema(&config, schema).await;
        let admin = crate::harness::admin(&env.server).await;
        sqlx::query("CREATE DATABASE expected TEMPLATE pristine")
            .execute(&admin)
            .await
            .unwrap();
        let expected = crate::harness::connect(&env.server, "expected", 2).await;
        sqlx::query("DELETE FROM app.accounts WHERE id = 'ab'")
            .execute(&expected)
            .await
            .expect("the cascade succeeds");
        let id = env.request("ab").await;
        env.drain(&env.worker("w1")).await;
        (
            env.job(id).await,
            digest(&env.db).await,
            digest(&expected).await,
        )
    };
    // Without the trial the simulation alone decides, and refuses (the limit this test records).
    let (job, _, _) = run(false).await;
    assert_eq!(job.state(), JobState::Failed, "{job:?}");
    let (job, actual, expected) = run(true).await;
    assert_eq!(job.state(), JobState::Completed, "{job:?}");
    assert_eq!(actual, expected);
    assert_eq!(
        deprov::worker::Progress::from_json(&job.progress)
            .trial
            .as_deref(),
        Some("succeeds")
    );
}

/// A delete trigger that looks at the parent row: the cascade (root first) deletes members while
/// their account is gone, so the trigger lets the owner go; leaves first, deprov would delete the
/// notes, then meet the owner with its account still there, and fail part-way. The trial runs in
/// the cascade's order and cannot see it. By default (`user_triggers = "refuse"`) such a
/// tenant is refused before anything is deleted, naming the trigger.
#[tokio::test]
async fn user_delete_triggers_are_refused_by_default_naming_them() {
    let schema = "CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.members (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE, role text);
CREATE INDEX ON app.members (account_id);
CREATE TABLE app.notes (id bigint PRIMARY KEY,
    member_id bigint NOT NULL REFERENCES app.members ON DELETE CASCADE);
CREATE INDEX ON app.notes (member_id);
CREATE FUNCTION app.keep_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.role = 'owner' AND EXISTS (SELECT 1 FROM app.accounts WHERE id = OLD.account_id)
     AND NOT EXISTS (SELECT 1 FROM app.members WHERE account_id = OLD.account_id AND role = 'owner' AND id <> OLD.id) THEN
    RAISE EXCEPTION 'account % must keep an owner', OLD.account_id;
  END IF;
  RETURN OLD;
END $$;
CREATE TRIGGER keep_owner BEFORE DELETE ON app.members FOR EACH ROW EXECUTE FUNCTION app.keep_owner();
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.members SELECT g, 1 + g % 2, CASE WHEN g <= 2 THEN 'owner' ELSE 'member' END
    FROM generate_series(1, 20) g;
INSERT INTO app.notes SELECT g, 1 + g % 20 FROM generate_series(1, 60) g;";
    let default = config_for(2, "id", "").replace("user_triggers = \"allow\"\n", "");
    assert!(!default.contains("user_triggers"));
    let env = env_with_schema(&default, schema).await;
    env.cascade_copy(1).await;
    let (ok, text) = plan_cli(&env, "1", &[], &default);
    assert!(
        !ok && text.contains("app\".\"members\": keep_owner"),
        "{text}"
    );
    refused(
        &env,
        &["user triggers on DELETE", "\"app\".\"members\": keep_owner"],
    )
    .await;
}

/// A blocker written during the grace period, after a trial that succeeded before the soft
/// delete: the trial is run again when the hard delete starts (and an earlier run's trial no
/// longer overrules the simulation), so the tenant is refused with nothing hard-deleted, rather
/// than deleting some rows and then failing.
#[tokio::test]
async fn a_blocker_written_during_the_grace_period_is_found_before_the_hard_delete() {
    let schema = "CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.tasks (id bigint PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE);
CREATE INDEX ON app.tasks (project_id);
CREATE TABLE app.links (id bigint PRIMARY KEY,
    project_id bigint REFERENCES app.projects ON DELETE RESTRICT);
CREATE INDEX ON app.links (project_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects SELECT g, 1 + g % 2 FROM generate_series(1, 10) g;
INSERT INTO app.tasks SELECT g, 1 + g % 10 FROM generate_series(1, 100) g;
INSERT INTO app.links VALUES (1, 1);";
    let config = config_for(2, "id", "").replace(
        "[hard_delete]\n",
        "[hard_delete]\ngrace_period = \"200ms\"\n",
    );
    let env = env_with_schema(&config, schema).await;
    let id = env.request("1").await;
    let worker = env.worker("w1");
    worker.step().await.unwrap();
    let job = env.job(id).await;
    let progress = deprov::worker::Progress::from_json(&job.progress);
    assert!(progress.soft_deleted_at.is_some() && progress.trial.as_deref() == Some("succeeds"));
    // Project 4 is tenant 1's.
    sqlx::query("INSERT INTO app.links VALUES (2, 4)")
        .execute(&env.db)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !matches!(
        env.job(id).await.state(),
        JobState::Completed | JobState::Failed | JobState::Cancelled
    ) {
        assert!(std::time::Instant::now() < deadline, "the job never ended");
        worker.step().await.unwrap();
    }
    let job = env.job(id).await;
    let message = job.last_error.clone().unwrap_or_default();
    assert_eq!(job.state(), JobState::Failed, "{job:?}");
    assert!(message.contains("links_project_id_fkey"), "{message}");
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM app.tasks")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(tasks, 100, "nothing hard-deleted: {message}");
}
