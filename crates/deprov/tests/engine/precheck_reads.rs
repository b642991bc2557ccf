//! The cascade pre-check's reads on a table without an index on the looked-up column (as ORMs make
//! them): each read is its own short transaction, a range of the table's blocks against the keys,
//! sized to half of its bound, rather than one scan of the whole table per chunk of keys.

use std::time::Duration;

use deprov::engine::load_plan;
use deprov::engine::simulate::{self, Verdict};
use deprov::sql::QualifiedName;
use deprov_testkit::transactions::TransactionSampler;

use crate::harness::{cascade_error, config_hard, env_with_schema, simulated};

/// 1,200,000 events on 2,000 projects, with no index on `project_id`; tenant 1 owns the even
/// projects and the odd events. An audit table's NO ACTION key makes the pre-check simulate the
/// cascade of tenant 1: [`AUDIT_ON_EVENTS`] or [`AUDIT_ON_PROJECTS`], from tenant 2's rows.
const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.projects (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.projects (account_id);
CREATE TABLE app.events (id bigint PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES app.projects ON DELETE CASCADE, body text);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.projects SELECT g, 1 + g % 2 FROM generate_series(1, 2000) g;
INSERT INTO app.events SELECT g, 1 + g % 2000, 'e' FROM generate_series(1, 1200000) g;
";

/// Audit rows referencing tenant 2's (even) events: the verdict needs every event of tenant 1.
const AUDIT_ON_EVENTS: &str = "
CREATE TABLE app.audit (id bigint PRIMARY KEY, ref bigint REFERENCES app.events);
INSERT INTO app.audit SELECT g, 2 + 2 * (g % 1000) FROM generate_series(1, 1000) g;
ANALYZE;
";

/// Audit rows referencing tenant 2's (odd) projects: the verdict needs no event.
const AUDIT_ON_PROJECTS: &str = "
CREATE TABLE app.audit (id bigint PRIMARY KEY, ref bigint REFERENCES app.projects);
INSERT INTO app.audit SELECT g, 1 + 2 * (g % 1000) FROM generate_series(1, 1000) g;
ANALYZE;
";

#[tokio::test]
async fn the_pre_checks_reads_of_an_unindexed_table_stay_within_their_bound() {
    let env = env_with_schema(
        &config_hard("", "id", ""),
        &[SCHEMA, AUDIT_ON_EVENTS].concat(),
    )
    .await;
    let plan = load_plan(&env.db, &QualifiedName::new("app", "accounts"), "id")
        .await
        .unwrap();
    assert!(simulate::needs_simulation(&plan));
    let sampler = TransactionSampler::start(
        &env.server.url("postgres").parse().unwrap(),
        "target",
        Duration::from_millis(2),
    )
    .await
    .unwrap();
    let verdict = simulated(&env, &plan, "1").await;
    let seen = sampler.stop().await.unwrap();
    // Tenant 1's 1,000 projects and their 600,000 events.
    assert!(
        matches!(verdict, Verdict::Succeeds { rows_read, .. } if rows_read >= 601_001),
        "{verdict:?}"
    );
    let longest = seen.longest.clone().expect("the reads were seen");
    println!(
        "{} transactions seen, longest {:.1} ms: {}",
        seen.transactions, longest.ms, longest.query
    );
    // Each read aims at 20 ms and is cut at 40 ms; 100 ms leaves room for a loaded machine. One read
    // of the whole table per chunk of keys took several times that.
    assert!(longest.ms < 100.0, "{longest:?}");
    assert!(seen.transactions >= 10, "{seen:?}");
}

/// The events hang below the projects and nothing conditional references them: the pre-check reads
/// the account and its projects, not the 600,000 events.
#[tokio::test]
async fn the_pre_check_reads_only_the_tables_its_verdict_depends_on() {
    let env = env_with_schema(
        &config_hard("", "id", ""),
        &[SCHEMA, AUDIT_ON_PROJECTS].concat(),
    )
    .await;
    let plan = load_plan(&env.db, &QualifiedName::new("app", "accounts"), "id")
        .await
        .unwrap();
    assert!(simulate::needs_simulation(&plan));
    let verdict = simulated(&env, &plan, "1").await;
    // The account, its 1,000 projects, and no audit row (none references them).
    assert!(
        matches!(
            verdict,
            Verdict::Succeeds {
                rows_read: 1_001,
                ..
            }
        ),
        "{verdict:?}"
    );
    // Tenant 2 is referenced: the same reads find it.
    let refused = simulated(&env, &plan, "2").await;
    assert!(
        matches!(refused, Verdict::Fails(ref f) if f.constraint == "audit_ref_fkey"),
        "{refused:?}"
    );
}

/// Tenant 1's 100,000 activities (no index on `account_id`) hang straight under the account, and
/// their NO ACTION key to its folders is what the pre-check must decide on. With `cross`, tenant
/// 2 has an activity in one of tenant 1's folders.
fn folders(cross: bool) -> String {
    let mut s = "
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, deleted_at timestamptz);
CREATE TABLE app.folders (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE);
CREATE INDEX ON app.folders (account_id);
CREATE TABLE app.activity (id bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES app.accounts ON DELETE CASCADE,
    folder_id bigint NOT NULL REFERENCES app.folders, body text);
CREATE INDEX ON app.activity (folder_id);
INSERT INTO app.accounts VALUES (1, NULL), (2, NULL);
INSERT INTO app.folders SELECT g, 1 + g % 2 FROM generate_series(1, 80) g;
INSERT INTO app.activity SELECT g, 1 + g % 2, 2 + (g % 40) * 2 - g % 2, 'a'
    FROM generate_series(1, 200000) g;
"
    .to_owned();
    if cross {
        // Tenant 2's activity in tenant 1's folder 2.
        s.push_str("INSERT INTO app.activity VALUES (200001, 2, 2, 'x');\n");
    }
    s.push_str("ANALYZE;\n");
    s
}

/// The account's cascade deletes its activities in its first generation of triggers, before any
/// folder's NO ACTION check fires: the pre-check decides from the folders and the activities of
/// other tenants in them, without reading the tenant's own 100,000 activities — and agrees with
/// PostgreSQL either way.
#[tokio::test]
async fn rows_the_roots_own_cascade_deletes_first_are_not_read() {
    for cross in [false, true] {
        let env = env_with_schema(&config_hard("", "id", ""), &folders(cross)).await;
        let plan = load_plan(&env.db, &QualifiedName::new("app", "accounts"), "id")
            .await
            .unwrap();
        assert!(simulate::needs_simulation(&plan));
        let verdict = simulated(&env, &plan, "1").await;
        let truth = cascade_error(&env, 1)
            .await
            .map(|(_, constraint)| constraint);
        if cross {
            assert_eq!(truth, Some(Some("activity_folder_id_fkey".to_owned())));
            assert!(
                matches!(verdict, Verdict::Fails(ref f) if f.constraint == "activity_folder_id_fkey"),
                "{verdict:?}"
            );
        } else {
            assert_eq!(truth, None);
            // The account and its 40 folders; no activity.
            assert!(
                matches!(verdict, Verdict::Succeeds { rows_read: 41, .. }),
                "{verdict:?}"
            );
        }
    }
}
