//! `deprov-lab bench delete --target-url` on a small user schema of its own (not the demo's): five
//! tables under `shop.orgs`, a CASCADE chain three deep, SET NULL references (some across tenants),
//! two tenants, about 4,400 rows.

use std::collections::BTreeMap;

use deprov_lab::bench::target::{self, TargetError, TargetRun};
use deprov_testkit::{Throwaway, ThrowawayOptions};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const SCHEMA: &str = r#"
CREATE SCHEMA shop;
CREATE TABLE shop.orgs (id bigint PRIMARY KEY, name text NOT NULL, deleted_at timestamptz);
CREATE TABLE shop.members (
  id bigint PRIMARY KEY,
  org_id bigint NOT NULL REFERENCES shop.orgs ON DELETE CASCADE,
  email text NOT NULL);
CREATE TABLE shop.projects (
  id bigint PRIMARY KEY,
  org_id bigint NOT NULL REFERENCES shop.orgs ON DELETE CASCADE,
  lead_id bigint REFERENCES shop.members ON DELETE SET NULL,
  title text NOT NULL);
CREATE TABLE shop.tasks (
  id bigint PRIMARY KEY,
  project_id bigint NOT NULL REFERENCES shop.projects ON DELETE CASCADE,
  assignee_id bigint REFERENCES shop.members ON DELETE SET NULL,
  body text NOT NULL);
CREATE TABLE shop.comments (
  id bigint PRIMARY KEY,
  task_id bigint NOT NULL REFERENCES shop.tasks ON DELETE CASCADE,
  body text NOT NULL);
CREATE INDEX ON shop.members (org_id);
CREATE INDEX ON shop.projects (org_id);
CREATE INDEX ON shop.projects (lead_id);
CREATE INDEX ON shop.tasks (project_id);
CREATE INDEX ON shop.tasks (assignee_id);
CREATE INDEX ON shop.comments (task_id);
-- Tenant 1: 150 members, 60 projects, 900 tasks, 1,800 comments; tenant 2: a third of that.
INSERT INTO shop.orgs VALUES (1, 'one', NULL), (2, 'two', NULL);
INSERT INTO shop.members SELECT i, CASE WHEN i <= 150 THEN 1 ELSE 2 END, 'm' || i || '@example.com'
  FROM generate_series(1, 200) i;
INSERT INTO shop.projects SELECT i, CASE WHEN i <= 60 THEN 1 ELSE 2 END,
  CASE WHEN i <= 60 THEN 1 + i % 150 ELSE 151 + i % 50 END, 'project ' || i
  FROM generate_series(1, 80) i;
-- Every seventh task of tenant 2 is assigned to a member of tenant 1: the cascade sets it NULL.
INSERT INTO shop.tasks SELECT i, CASE WHEN i <= 900 THEN 1 + i % 60 ELSE 61 + i % 20 END,
  CASE WHEN i <= 900 OR i % 7 = 0 THEN 1 + i % 150 ELSE 151 + i % 50 END, repeat('t', 40) || i
  FROM generate_series(1, 1200) i;
INSERT INTO shop.comments SELECT i, 1 + (i - 1) / 2, 'c' || i FROM generate_series(1, 2400) i;
"#;

/// deprov's configuration as an operator has it: a source whose token variable is not set here
/// (the bench must not need it), a soft delete, a grace period (the bench does not wait it out).
const CONFIG: &str = r#"
[sources.billing]
token_env = "DEPROV_BENCH_TARGET_TEST_UNSET_TOKEN"

[tenant]
root_table = "shop.orgs"
key_column = "id"

[soft_delete]
statements = ["UPDATE shop.orgs SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL"]

[hard_delete]
grace_period = "1h"
batch_rows = 20
max_batch_duration = "100ms"
whole_cascade = false

[worker]
poll_interval = "10ms"
"#;

const TABLES: [&str; 5] = ["orgs", "members", "projects", "tasks", "comments"];

struct UserDb {
    server: Throwaway,
    config: tempfile::NamedTempFile,
}

impl UserDb {
    async fn start() -> Self {
        let server = Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
        .unwrap();
        let admin = pool(&server, "postgres").await;
        sqlx::query("CREATE DATABASE shopdb")
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        let db = pool(&server, "shopdb").await;
        sqlx::raw_sql(SCHEMA).execute(&db).await.unwrap();
        db.close().await;
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(config.path(), CONFIG).unwrap();
        Self { server, config }
    }

    fn run(&self, tenant: &str, keep_copies: bool) -> TargetRun {
        TargetRun {
            url: self.server.url("shopdb"),
            tenant: tenant.into(),
            config: self.config.path().to_owned(),
            keep_copies,
            quiet: true,
        }
    }

    /// Rows per table of `db`, and of them those of tenant `org` (through each table's path).
    async fn counts(&self, db: &str, org: i64) -> BTreeMap<&'static str, (i64, i64)> {
        let pool = pool(&self.server, db).await;
        let mut out = BTreeMap::new();
        for (table, all, of_org) in [
            (
                "orgs",
                "SELECT count(*) FROM shop.orgs",
                "SELECT count(*) FROM shop.orgs WHERE id = $1",
            ),
            (
                "members",
                "SELECT count(*) FROM shop.members",
                "SELECT count(*) FROM shop.members WHERE org_id = $1",
            ),
            (
                "projects",
                "SELECT count(*) FROM shop.projects",
                "SELECT count(*) FROM shop.projects WHERE org_id = $1",
            ),
            (
                "tasks",
                "SELECT count(*) FROM shop.tasks",
                "SELECT count(*) FROM shop.tasks t JOIN shop.projects p ON p.id = t.project_id \
                 WHERE p.org_id = $1",
            ),
            (
                "comments",
                "SELECT count(*) FROM shop.comments",
                "SELECT count(*) FROM shop.comments c JOIN shop.tasks t ON t.id = c.task_id \
                 JOIN shop.projects p ON p.id = t.project_id WHERE p.org_id = $1",
            ),
        ] {
            let all: i64 = sqlx::query_scalar(all).fetch_one(&pool).await.unwrap();
            let org_rows: i64 = sqlx::query_scalar(of_org)
                .bind(org)
                .fetch_one(&pool)
                .await
                .unwrap();
            out.insert(table, (all, org_rows));
        }
        pool.close().await;
        out
    }

    /// Databases of the server whose names the bench generates.
    async fn scratch_databases(&self) -> Vec<String> {
        let admin = pool(&self.server, "postgres").await;
        let names = sqlx::query_scalar(
            "SELECT datname::text FROM pg_database WHERE datname LIKE '%\\_dpv\\_%' ORDER BY 1",
        )
        .fetch_all(&admin)
        .await
        .unwrap();
        admin.close().await;
        names
    }
}

async fn pool(server: &Throwaway, db: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.url(db))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_copies_end_equal_and_the_source_is_untouched() {
    let user = UserDb::start().await;
    let before = user.counts("shopdb", 1).await;
    let tenant_rows: i64 = before.values().map(|(_, org)| org).sum();
    assert_eq!(tenant_rows, 1 + 150 + 60 + 900 + 1800, "{before:?}");

    let r = target::run(&user.run("1", true)).await.expect("bench runs");

    assert!(r.equals_cascade, "{}", r.to_text());
    assert!(r.differing_tables.is_empty());
    assert_eq!(r.tables, TABLES.len());
    assert_eq!(r.cascade.rows, tenant_rows, "{r:#?}");
    assert_eq!(r.deprov.rows, tenant_rows, "{r:#?}");
    assert_eq!(r.cascade.transactions, 1);
    assert!(
        r.deprov.transactions > 1 && r.batches == r.deprov.transactions,
        "{r:#?}"
    );
    assert!((r.ratio - r.cascade.elapsed_s / r.deprov.elapsed_s).abs() < 1e-9);
    assert_eq!(r.soft_deleted_rows, 1, "the configured soft delete ran");
    assert_eq!(r.trial.as_deref(), Some("succeeds"), "{r:#?}");
    assert!(
        r.notes.iter().any(|n| n.contains("grace_period")),
        "{:?}",
        r.notes
    );
    // Request → soft delete → hard delete → completion, in that order.
    let (soft, hard) = (
        r.before_soft_delete_ms.expect("timed"),
        r.before_hard_delete_ms.expect("timed"),
    );
    assert!(soft > 0.0 && soft <= hard, "{r:#?}");
    assert!(hard < r.deprov.elapsed_s * 1e3, "{r:#?}");
    // The sampler saw deprov's transactions on its copy, none longer than the job.
    let s = &r.sampled;
    assert!(s.samples > 10 && s.transactions > 1, "{s:#?}");
    let longest = s.longest.as_ref().expect("a transaction seen");
    assert_eq!(longest.application_name, "deprov-target", "{s:#?}");
    assert!(
        longest.ms > 0.0 && longest.ms < r.deprov.elapsed_s * 1e3,
        "{s:#?}"
    );
    assert!(!longest.query.is_empty(), "{s:#?}");
    let writing = s.longest_writing.as_ref().expect("batches write");
    assert!(writing.wrote && writing.ms <= longest.ms, "{s:#?}");
    // The same sampler watched the cascade's copy while it ran: what it saw there (if the
    // cascade outlasted a period) is no longer than the cascade, and nothing of deprov's.
    let c = &r.cascade_sampled;
    assert!(c.samples >= 1 && c.period_ms == s.period_ms, "{c:#?}");
    if let Some(seen) = &c.longest {
        assert!(seen.ms <= r.cascade.elapsed_s * 1e3, "{c:#?}");
        assert_ne!(seen.application_name, "deprov-target", "{c:#?}");
    }
    let text = r.to_text();
    assert!(
        text.contains("equals the cascade's copy (5 tables): PASS"),
        "{text}"
    );
    assert!(
        text.contains(&r.deprov_copy) && text.contains("kept"),
        "{text}"
    );

    // The copies were kept: tenant 1 is gone from deprov's, tenant 2 is whole, and its tasks
    // assigned to tenant 1's members were set NULL as the cascade sets them.
    let other_before = user.counts("shopdb", 2).await;
    let after = user.counts(&r.deprov_copy, 1).await;
    let other_after = user.counts(&r.deprov_copy, 2).await;
    for table in TABLES {
        assert_eq!(after[table].1, 0, "{table}: {after:?}");
        assert_eq!(other_after[table].1, other_before[table].1, "{table}");
    }
    let copy = pool(&user.server, &r.deprov_copy).await;
    let unassigned: i64 =
        sqlx::query_scalar("SELECT count(*) FROM shop.tasks WHERE assignee_id IS NULL")
            .fetch_one(&copy)
            .await
            .unwrap();
    copy.close().await;
    assert_eq!(unassigned, 1200 / 7 - 900 / 7, "tasks 903, 910, … 1197");

    // The worker served a request for a key no row has before the measured one, which is the
    // report's job.
    let state = pool(&user.server, &r.state_database).await;
    let jobs: Vec<(uuid::Uuid, String, String)> =
        sqlx::query_as("SELECT id, subject, state FROM deprov.jobs ORDER BY created_at")
            .fetch_all(&state)
            .await
            .unwrap();
    state.close().await;
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_eq!(jobs[1].0, r.job_id, "{jobs:?}");
    assert_eq!(jobs[1].1, "1", "{jobs:?}");
    assert!(jobs[0].1 != "1" && jobs[0].1 != "2", "{jobs:?}");
    assert!(
        matches!(jobs[0].2.as_str(), "completed" | "failed"),
        "{jobs:?}"
    );

    // The user's database is as it was.
    assert_eq!(user.counts("shopdb", 1).await, before);
    let mut kept = vec![r.cascade_copy, r.deprov_copy, r.state_database];
    kept.sort();
    assert_eq!(user.scratch_databases().await, kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_copies_are_dropped_after_the_run() {
    let user = UserDb::start().await;
    let before = user.counts("shopdb", 2).await;
    let r = target::run(&user.run("2", false))
        .await
        .expect("bench runs");
    assert!(r.equals_cascade, "{}", r.to_text());
    assert_eq!(
        r.deprov.rows,
        before.values().map(|(_, org)| org).sum::<i64>()
    );
    assert!(r.to_text().contains("copies dropped"));
    assert_eq!(user.scratch_databases().await, Vec::<String>::new());
    assert_eq!(user.counts("shopdb", 2).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_refuses_a_source_with_sessions_and_names_the_alternative() {
    let user = UserDb::start().await;
    // A session on the user's database: the template copy cannot be made.
    let session = pool(&user.server, "shopdb").await;
    sqlx::query("SELECT 1").execute(&session).await.unwrap();
    let e = target::run(&user.run("1", false))
        .await
        .expect_err("the copy is refused");
    assert!(
        matches!(e, TargetError::SourceBusy { sessions: 1, .. }),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("pg_dump") && text.contains("pg_restore"),
        "{text}"
    );
    // Nothing was left behind, and the session was not ended.
    assert_eq!(user.scratch_databases().await, Vec::<String>::new());
    sqlx::query("SELECT 1").execute(&session).await.unwrap();
    session.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_refuses_a_tenant_key_before_copying_the_database() {
    let user = UserDb::start().await;
    // A session on the user's database: a copy, had it been tried first, would be refused.
    let session = pool(&user.server, "shopdb").await;
    sqlx::query("SELECT 1").execute(&session).await.unwrap();
    let bad = target::run(&user.run("abc", false))
        .await
        .expect_err("not an integer key");
    assert!(
        matches!(&bad, TargetError::BadKey { tenant, .. } if tenant == "abc"),
        "{bad:?}"
    );
    let missing = target::run(&user.run("999999", false))
        .await
        .expect_err("no such tenant");
    assert!(
        matches!(missing, TargetError::NoTenant { .. }),
        "{missing:?}"
    );
    assert_eq!(user.scratch_databases().await, Vec::<String>::new());
    session.close().await;
}
