//! `deprov-lab bench corpus` at a tiny scale: the generated schemas carry what the corpus promises (read
//! back from `pg_catalog`, not from the generator), deprov's plan finds 20–80 tables in the closure,
//! a seed always gives the same DDL, and every run ends equal to the cascade with its figures.

use deprov::sql::{QualifiedName, SqlBuilder};
use deprov_lab::bench::corpus::{self, CorpusArgs, data, ddl};
use deprov_testkit::{Throwaway, ThrowawayOptions};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const SCALE: f64 = 0.01;
const SEEDS: [u64; 2] = [1, 2];

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap()
}

fn ddl_text(seed: u64, scale: f64) -> Vec<String> {
    let schema = corpus::generate(seed, scale);
    ddl::tables(&schema)
        .into_iter()
        .chain(ddl::constraints(&schema))
        .map(|s| s.text().to_owned())
        .collect()
}

#[test]
fn corpus_a_seed_gives_the_same_ddl_and_seeds_differ() {
    for seed in 1..=20 {
        assert_eq!(ddl_text(seed, 1.0), ddl_text(seed, 1.0), "seed {seed}");
        // The scale changes row counts, never the DDL.
        assert_eq!(ddl_text(seed, 1.0), ddl_text(seed, SCALE), "seed {seed}");
        let inserts = |s| {
            data::inserts(&corpus::generate(seed, s))
                .into_iter()
                .map(|i| (i.sql.text().to_owned(), i.arrays))
                .collect::<Vec<_>>()
        };
        assert_eq!(inserts(1.0), inserts(1.0), "seed {seed}");
        let schema = corpus::generate(seed, 1.0);
        assert!(
            schema.tenant_rows(schema.large) >= 300_000,
            "seed {seed}: {}",
            schema.tenant_rows(schema.large)
        );
        assert!(
            (20..=80).contains(&schema.closure_len()),
            "seed {seed}: {}",
            schema.closure_len()
        );
    }
    assert_ne!(ddl_text(1, 1.0), ddl_text(2, 1.0));
}

/// RESTRICT / NO ACTION foreign keys into the closure (`$1`, table OIDs): those from a table of
/// the closure, and those from a table outside it.
const BLOCKING: &str = "SELECT count(*) FILTER (WHERE c.conrelid::bigint = ANY($1::bigint[])), \
      count(*) FILTER (WHERE NOT c.conrelid::bigint = ANY($1::bigint[])) \
    FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid \
    WHERE c.contype = 'f' AND c.confdeltype IN ('r', 'a') AND c.conparentid = 0 \
      AND NOT r.relispartition AND c.confrelid::bigint = ANY($1::bigint[])";

/// One row per feature the corpus promises, counted in `pg_catalog`.
const FEATURES: &str = "SELECT \
    (SELECT count(*) FROM pg_class WHERE relkind = 'p'), \
    (SELECT count(*) FROM pg_class WHERE relrowsecurity AND relkind = 'r'), \
    (SELECT count(*) FROM pg_constraint WHERE contype = 'p' AND cardinality(conkey) = 2 \
      AND conrelid IN (SELECT oid FROM pg_class WHERE relkind = 'r')), \
    (SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid = confrelid \
      AND confdeltype = 'c'), \
    (SELECT count(*) FROM pg_constraint WHERE contype = 'c'), \
    (SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND confdeltype = 'n'), \
    (SELECT count(DISTINCT format_type(a.atttypid, a.atttypmod)) FROM pg_attribute a \
      JOIN pg_class r ON r.oid = a.attrelid JOIN pg_namespace n ON n.oid = r.relnamespace \
      WHERE n.nspname = 'app' AND a.attname = 'id' AND r.relkind IN ('r', 'p'))";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn corpus_schemas_have_the_features_and_runs_equal_the_cascade() {
    let server = Throwaway::start(&ThrowawayOptions {
        unsafe_fast: true,
        ..Default::default()
    })
    .unwrap();
    let admin = pool(&server.url("postgres")).await;
    let options = deprov::db::connect_options(&server.url("postgres")).unwrap();

    let mut key_types = 0;
    for seed in SEEDS {
        let schema = corpus::generate(seed, SCALE);
        let db = format!("features_{seed}");
        let (described, large, small) = corpus::create_and_load(&admin, &options, &db, &schema)
            .await
            .expect("the schema loads");
        assert_ne!(large, small);
        let p = pool(&server.url(&db)).await;
        let (partitioned, rls, composite, trees, checks, set_null, types): (
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
        ) = sqlx::query_as(FEATURES).fetch_one(&p).await.unwrap();
        assert_eq!(partitioned, 1, "seed {seed}");
        assert!(rls >= 1, "seed {seed}");
        assert!(composite >= 2, "seed {seed}: join tables {composite}");
        assert!(trees >= 1, "seed {seed}");
        assert!(checks >= 1, "seed {seed}");
        assert!(set_null >= 2, "seed {seed}");
        key_types = key_types.max(types);
        let (fks, unindexed): (i64, i64) = sqlx::query_as(corpus::UNINDEXED)
            .fetch_one(&p)
            .await
            .unwrap();
        assert!(
            unindexed * 2 > fks,
            "seed {seed}: {unindexed} of {fks} foreign keys unindexed"
        );
        assert_eq!(
            (fks as usize, unindexed as usize),
            (described.foreign_keys, described.unindexed_foreign_keys)
        );
        // deprov's own plan: 20–80 tables in the closure, as the generator meant.
        let root = QualifiedName::new("app", schema.root().name.clone());
        let plan = deprov::engine::load_plan(&p, &root, "id").await.unwrap();
        assert!(
            (20..=80).contains(&plan.closure.len()),
            "seed {seed}: {}",
            plan.closure.len()
        );
        assert_eq!(plan.closure.len(), schema.closure_len(), "seed {seed}");
        assert_eq!(plan.closure.len(), described.closure_tables);
        let closure: Vec<i64> = plan.closure.iter().map(|&o| i64::from(o)).collect();
        let (inside, outside): (i64, i64) = sqlx::query_as(BLOCKING)
            .bind(&closure)
            .fetch_one(&p)
            .await
            .unwrap();
        assert!(
            inside >= 1 && outside >= 2,
            "seed {seed}: RESTRICT/NO ACTION keys into the closure: {inside} from it, {outside} from outside"
        );
        // The row counts loaded are the generator's.
        for t in &schema.tables {
            let mut count = SqlBuilder::new();
            count.sql("SELECT count(*) FROM ").table(&t.qualified());
            let rows: i64 = sqlx::query_scalar(count.build().as_query())
                .fetch_one(&p)
                .await
                .unwrap();
            assert_eq!(rows, t.total_rows(), "seed {seed}: {}", t.name);
        }
        // The tenants' keys are their root rows'.
        let mut count = SqlBuilder::new();
        count
            .sql("SELECT count(*) FROM ")
            .table(&root)
            .sql(" WHERE id::text IN ($1, $2)");
        let found: i64 = sqlx::query_scalar(count.build().as_query())
            .bind(&large)
            .bind(&small)
            .fetch_one(&p)
            .await
            .unwrap();
        assert_eq!(found, 2);
        p.close().await;
        deprov_demo::drop_database(&admin, &db).await.unwrap();
    }
    assert!(key_types >= 2, "key types vary: {key_types}");
    admin.close().await;

    let report = corpus::run(&CorpusArgs {
        seeds: SEEDS.len() as u64,
        first_seed: SEEDS[0],
        scale: SCALE,
        url: Some(server.url("postgres")),
        json: true,
        keep: true,
        repeat: 2,
    })
    .await
    .expect("the corpus runs");
    assert_eq!(report.schemas.len(), 2);
    assert_eq!(report.runs.len(), 4);
    // `--keep`: the generated databases stay, as loaded.
    for schema in &report.schemas {
        let kept = PgPoolOptions::new()
            .max_connections(1)
            .connect(&server.url(&schema.database))
            .await
            .unwrap_or_else(|e| panic!("{} kept: {e}", schema.database));
        let rows: i64 = sqlx::query_scalar(
            "SELECT sum(greatest(reltuples, 0))::int8 FROM pg_class \
             WHERE relkind = 'r' AND relnamespace = 'app'::regnamespace",
        )
        .fetch_one(&kept)
        .await
        .unwrap();
        assert!(rows > 0, "{}: {rows}", schema.database);
        kept.close().await;
    }
    for r in &report.runs {
        let t = r.report.as_ref().unwrap_or_else(|| panic!("{r:#?}"));
        // Two runs each: the one kept is the lower of the two middle ratios, here the lower one.
        assert_eq!(r.ratios.len(), 2, "{r:#?}");
        let (low, high) = r.ratio_range().unwrap();
        assert_eq!(t.ratio, low, "{r:#?}");
        assert!(low <= high);
        assert!(r.all_equal, "{r:#?}");
        let each_longest = t.sampled.longest.as_ref().map_or(0.0, |l| l.ms);
        assert!(r.longest_ms.is_some_and(|ms| ms >= each_longest), "{r:#?}");
        assert!(
            r.longest_query.as_ref().is_some_and(|q| !q.is_empty()),
            "{r:#?}"
        );
        assert!(t.equals_cascade, "{}", t.to_text());
        assert!(t.ratio > 0.0, "{}", t.to_text());
        assert!(
            t.cascade.rows > 0 && t.cascade.rows == t.deprov.rows,
            "{}",
            t.to_text()
        );
        let longest = t.sampled.longest.as_ref().expect("a transaction sampled");
        assert!(
            longest.ms > 0.0 && !longest.query.is_empty(),
            "{longest:#?}"
        );
        assert!(t.before_soft_delete_ms.is_some_and(|ms| ms > 0.0));
        assert!(t.batches >= 1);
    }
    let large = report.runs.iter().filter(|r| r.tenant_size == "large");
    let small = report.runs.iter().filter(|r| r.tenant_size == "small");
    for (l, s) in large.zip(small) {
        let (l, s) = (l.report.as_ref().unwrap(), s.report.as_ref().unwrap());
        assert!(
            l.cascade.rows > 10 * s.cascade.rows,
            "{} {}",
            l.cascade.rows,
            s.cascade.rows
        );
    }
    assert!(report.all_equal);
    assert_eq!(report.ratio.runs, 4);
    assert!(report.ratio.worst <= report.ratio.median);
    assert!(report.longest_transaction_ms.worst >= report.longest_transaction_ms.median);
    let text = report.to_text();
    assert!(
        text.contains("every copy equals the cascade's: PASS"),
        "{text}"
    );
    // The copies were dropped; the generated databases were kept (`keep`).
    let admin = pool(&server.url("postgres")).await;
    let left: (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE datname LIKE 'deprov\\_corpus%'), \
                count(*) FILTER (WHERE datname LIKE '%\\_dpv\\_%') FROM pg_database",
    )
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(left, (2, 0));
    admin.close().await;
}
