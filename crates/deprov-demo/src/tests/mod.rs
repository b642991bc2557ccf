//! Tests against a throwaway PostgreSQL (each test starts its own server).

mod roles;
mod size;

use std::collections::BTreeMap;

use sqlx::PgPool;

use super::ownership::{ForeignKey, foreign_keys, ownership_hops, table_columns};
use super::*;
use deprov::sql::QualifiedName;
use deprov_testkit::{Throwaway, ThrowawayOptions};

struct Setup {
    pg: Throwaway,
    admin: PgPool,
    demo: PgPool,
    tenants: DemoTenants,
}

async fn setup(size: &DemoSize, unsafe_fast: bool) -> Setup {
    let pg = Throwaway::start(&ThrowawayOptions {
        unsafe_fast,
        ..Default::default()
    })
    .expect("throwaway PostgreSQL");
    let admin = PgPool::connect(&pg.url("postgres")).await.unwrap();
    sqlx::query("CREATE DATABASE demo")
        .execute(&admin)
        .await
        .unwrap();
    let demo = PgPool::connect(&pg.url("demo")).await.unwrap();
    let tenants = load(&demo, size).await.unwrap();
    Setup {
        pg,
        admin,
        demo,
        tenants,
    }
}

fn t(name: &str) -> QualifiedName {
    QualifiedName::new("app", name)
}

fn accounts() -> QualifiedName {
    t("accounts")
}

/// Longest chain of ON DELETE CASCADE references below `table` (self-references skipped).
fn cascade_depth(fks: &[ForeignKey], table: &QualifiedName) -> usize {
    fks.iter()
        .filter(|fk| fk.on_delete == 'c' && fk.parent == *table && fk.child != *table)
        .map(|fk| 1 + cascade_depth(fks, &fk.child))
        .max()
        .unwrap_or(0)
}

async fn count(pool: &PgPool, sql: &'static str, tenant: i64) -> i64 {
    sqlx::query_scalar(sql)
        .bind(tenant)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn schema_and_data_have_every_feature() {
    let s = setup(&DemoSize::test(), true).await;
    let tables = user_tables(&s.demo, "app").await.unwrap();
    assert!(tables.len() >= 15, "{tables:?}");
    let fks = foreign_keys(&s.demo, "app").await.unwrap();
    let hops = ownership_hops(&fks, &accounts());
    let owned = |q: &QualifiedName| *q == accounts() || hops.contains_key(q);
    assert!(cascade_depth(&fks, &accounts()) >= 4);
    assert!(
        fks.iter()
            .any(|fk| fk.child == fk.parent && fk.on_delete == 'c'),
        "self-reference"
    );
    assert!(
        fks.iter().any(|fk| fk.child_columns.len() > 1),
        "composite foreign key"
    );
    let two_parents = tables.iter().any(|tb| {
        let parents: Vec<_> = fks
            .iter()
            .filter(|fk| fk.child == *tb && fk.on_delete == 'c' && fk.parent != *tb)
            .collect();
        parents.len() >= 2
            && parents
                .iter()
                .all(|fk| owned(&fk.parent) && fk.parent != accounts())
    });
    assert!(two_parents, "a table with two parents inside the tenant");
    assert!(
        fks.iter()
            .any(|fk| fk.on_delete == 'n' && fk.child == t("shared_links") && owned(&fk.parent))
    );
    for fk in &fks {
        assert!(
            !(owned(&fk.parent) && matches!(fk.on_delete, 'a' | 'r')),
            "no RESTRICT/NO ACTION into the tenant: {fk:?}"
        );
    }
    assert!(
        tables.iter().any(|tb| tb.name != tb.name.to_lowercase()),
        "mixed-case table"
    );
    assert!(
        table_columns(&s.demo, &t("BillingInvoices"))
            .await
            .unwrap()
            .contains(&"AmountCents".to_string())
    );
    let unindexed: Vec<String> = sqlx::query_scalar(
        "SELECT c.conname::text FROM pg_constraint c WHERE c.contype = 'f' AND c.connamespace = 'app'::regnamespace \
         AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.conrelid \
           AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] @> c.conkey \
           AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] <@ c.conkey)",
    )
    .fetch_all(&s.demo)
    .await
    .unwrap();
    assert_eq!(unindexed, ["project_members_user_id_fkey"]);
    assert_eq!(ownership::orphaned_rows(&s.demo, "app").await.unwrap(), []);

    let large = s.tenants.large;
    let depth = count(
        &s.demo,
        "WITH RECURSIVE tree AS (SELECT id, 1 AS depth FROM app.folders WHERE account_id = $1 AND parent_id IS NULL \
         UNION ALL SELECT f.id, tree.depth + 1 FROM app.folders f JOIN tree ON f.parent_id = tree.id) \
         SELECT max(depth)::bigint FROM tree",
        large,
    )
    .await;
    assert!(depth >= 5, "folder tree depth {depth}");
    let incoming = count(
        &s.demo,
        "SELECT count(*) FROM app.shared_links l JOIN app.projects p ON p.id = l.target_project_id \
         WHERE p.account_id = $1 AND l.account_id <> $1",
        large,
    )
    .await;
    assert!(
        incoming >= s.tenants.small.len() as i64,
        "other tenants link to the large tenant: {incoming}"
    );
    let both_parents = count(
        &s.demo,
        "SELECT count(*) FROM app.deployment_artifacts a \
         JOIN app.deployments d ON d.id = a.deployment_id JOIN app.environments e ON e.id = d.environment_id \
         JOIN app.projects p ON p.id = e.project_id JOIN app.builds b ON b.id = a.build_id \
         JOIN app.projects bp ON bp.id = b.project_id WHERE p.account_id = $1 AND bp.account_id = $1",
        large,
    )
    .await;
    assert!(both_parents > 0);
    assert_eq!(
        both_parents as u64,
        s.tenants.large_rows[&t("deployment_artifacts")]
    );
    assert!(s.tenants.large_vercel_installation_id.starts_with("icfg_"));
    assert_eq!(s.tenants.small.len(), 5);
    assert!(!s.tenants.small.contains(&large));

    // The foreign-key check after a trigger-less load finds an orphan.
    let mut conn = s.demo.acquire().await.unwrap();
    sqlx::query("SET session_replication_role = replica")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO app.log_lines VALUES (-1, 1, 'stdout', 'orphan', now())")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("RESET session_replication_role")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    let orphans = ownership::orphaned_rows(&s.demo, "app").await.unwrap();
    assert_eq!(
        orphans,
        [(
            "log_lines_deployment_id_fkey".to_string(),
            t("log_lines"),
            1
        )]
    );
    drop(s.pg);
}

#[tokio::test]
async fn cascade_on_a_copy_matches_counts_and_digests() {
    let s = setup(&DemoSize::test(), true).await;
    let large = s.tenants.large;
    assert!(
        s.tenants.large_total_rows() >= 5_000,
        "{:?}",
        s.tenants.large_rows
    );
    assert!(
        s.tenants.large_rows.len() >= 20,
        "the large tenant has rows in every tenant table"
    );
    s.demo.close().await;
    verify::clone_database(&s.admin, "demo", "copy")
        .await
        .unwrap();
    let demo = PgPool::connect(&s.pg.url("demo")).await.unwrap();
    let copy = PgPool::connect(&s.pg.url("copy")).await.unwrap();
    let original = database_digest(&demo, "app").await.unwrap();
    assert_eq!(original, database_digest(&copy, "app").await.unwrap());
    let others_before = other_tenants_digest(&demo, "app", &accounts(), "id", large)
        .await
        .unwrap();
    let links_in = count(
        &demo,
        "SELECT count(*) FROM app.shared_links l JOIN app.projects p ON p.id = l.target_project_id \
         WHERE p.account_id = $1 AND l.account_id <> $1",
        large,
    )
    .await;

    let outcome = cascade_delete(&copy, &accounts(), "id", large)
        .await
        .unwrap();
    assert_eq!(outcome.root_rows, 1);
    let expected: BTreeMap<QualifiedName, i64> = s
        .tenants
        .large_rows
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| (k.clone(), *n as i64))
        .collect();
    assert_eq!(outcome.deleted, expected);
    assert!(
        outcome
            .updated
            .get(&t("shared_links"))
            .copied()
            .unwrap_or(0)
            >= links_in
    );

    let after = database_digest(&copy, "app").await.unwrap();
    let changed = differing_tables(&original, &after);
    assert_eq!(changed, expected.keys().cloned().collect::<Vec<_>>());
    assert!(!changed.contains(&t("plans")));
    for (table, n) in &expected {
        assert_eq!(original[table].rows - after[table].rows, *n, "{table}");
    }
    let others_after = other_tenants_digest(&copy, "app", &accounts(), "id", large)
        .await
        .unwrap();
    assert_eq!(
        differing_tables(&others_before, &others_after),
        Vec::<QualifiedName>::new()
    );

    verify::drop_database(&s.admin, "copy").await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = 'copy'")
        .fetch_one(&s.admin)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn other_tenants_check_detects_a_wrong_deletion() {
    let s = setup(&DemoSize::test(), true).await;
    let (large, victim) = (s.tenants.large, s.tenants.small[0]);
    let before = other_tenants_digest(&s.demo, "app", &accounts(), "id", large)
        .await
        .unwrap();
    cascade_delete(&s.demo, &accounts(), "id", large)
        .await
        .unwrap();
    let after = other_tenants_digest(&s.demo, "app", &accounts(), "id", large)
        .await
        .unwrap();
    assert_eq!(
        differing_tables(&before, &after),
        Vec::<QualifiedName>::new()
    );

    // One extra row of another tenant deleted: the check fails and names the table.
    sqlx::query(
        "DELETE FROM app.documents WHERE id = (SELECT min(d.id) FROM app.documents d \
         JOIN app.folders f ON f.id = d.folder_id WHERE f.account_id = $1)",
    )
    .bind(victim)
    .execute(&s.demo)
    .await
    .unwrap();
    let wrong = other_tenants_digest(&s.demo, "app", &accounts(), "id", large)
        .await
        .unwrap();
    assert_eq!(differing_tables(&before, &wrong), [t("documents")]);

    // A SET NULL applied to a link that pointed at a tenant NOT deleted is caught too.
    let unlinked = sqlx::query(
        "UPDATE app.shared_links SET target_project_id = NULL WHERE id = (SELECT min(id) FROM app.shared_links \
         WHERE account_id = $1 AND target_project_id IS NOT NULL)",
    )
    .bind(s.tenants.small[1])
    .execute(&s.demo)
    .await
    .unwrap();
    assert_eq!(unlinked.rows_affected(), 1);
    let wrong = other_tenants_digest(&s.demo, "app", &accounts(), "id", large)
        .await
        .unwrap();
    assert_eq!(
        differing_tables(&before, &wrong),
        [t("documents"), t("shared_links")]
    );
}
