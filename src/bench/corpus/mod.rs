//! `deprov-lab bench corpus`: `deprov-lab bench delete --target-url` over generated, realistic SaaS schemas.
//!
//! For each seed: a database on the server (a throwaway PostgreSQL, or `--url`'s), the seed's
//! schema ([`schema::generate`]) and rows loaded set-based ([`data::load`]), a configuration file
//! naming its root table and soft delete, then [`crate::bench::target::run`] for the large tenant
//! and for the small tenant behind the skew (`--repeat` times each), and the database dropped.
//! [`CorpusReport`] holds each tenant's report and the worst and median ratio and longest
//! transaction.

pub mod data;
pub mod ddl;
pub mod report;
pub mod schema;

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

pub use report::{CorpusReport, CorpusRun, CorpusSchema};
pub use schema::{Schema, generate};

use crate::bench::target::{self, TargetRun};
use deprov::sql::SqlBuilder;
use deprov_demo::drop_database;
use deprov_testkit::{Throwaway, ThrowawayOptions};

/// `deprov-lab bench corpus` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct CorpusArgs {
    /// Schemas to generate and run (seeds `--first-seed` on), at least 1.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    pub first_seed: u64,
    /// Row counts relative to scale 1, where the large tenant owns at least 320k rows; positive.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub scale: f64,
    /// A server to use (a `postgres://` URL; databases are created and dropped on it, named
    /// `deprov_corpus_<seed>` and as `bench delete --target-url` names its copies) instead of a
    /// throwaway PostgreSQL with durable settings.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Print the whole report as JSON.
    #[arg(long)]
    pub json: bool,
    /// With `--url`: keep each generated database (`deprov_corpus_<seed>`, as loaded, before any
    /// delete) to inspect or to run `deprov plan` and `bench delete --target-url` on.
    #[arg(long, requires = "url")]
    pub keep: bool,
    /// Runs of each tenant, 1..=20: each tenant's figure is then the run with the median ratio
    /// (the lower of the two middle ones for an even count), beside the lowest and highest ratio
    /// and the longest transaction of every run. Two runs alike can differ by more than 2× on a
    /// small machine; three show the spread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
}

/// Why the corpus could not run (a failed run is recorded in its [`CorpusRun`] instead).
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// The throwaway server did not start.
    #[error(transparent)]
    Server(#[from] deprov_testkit::ThrowawayError),
    /// A database step of the setup failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// `--url` is not a valid URL, or the scale is not positive.
    #[error("{0}")]
    Invalid(String),
    /// The configuration file could not be written.
    #[error("configuration file: {0}")]
    Io(#[from] std::io::Error),
}

/// Where the corpus's databases live.
enum Server {
    Throwaway(Throwaway),
    Url(reqwest::Url),
}

impl Server {
    /// The URL of database `db` on the server.
    fn url(&self, db: &str) -> String {
        match self {
            Self::Throwaway(t) => t.url(db),
            Self::Url(u) => {
                let mut u = u.clone();
                u.set_path(&format!("/{db}"));
                u.to_string()
            }
        }
    }
}

/// The configuration of `schema`'s tenant: `[tenant]`, a soft delete that stamps the root row's
/// `deleted_at`, and a 10 ms worker poll (the benchmark times the job, not the poll).
pub fn config_toml(schema: &Schema) -> String {
    let root = schema.root().qualified();
    let mut soft = SqlBuilder::new();
    soft.sql("UPDATE ")
        .table(&root)
        .sql(" SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL");
    let mut tenant = toml::Table::new();
    tenant.insert(
        "root_table".into(),
        format!("{}.{}", root.schema, root.name).into(),
    );
    tenant.insert("key_column".into(), "id".into());
    let mut soft_delete = toml::Table::new();
    soft_delete.insert(
        "statements".into(),
        toml::Value::Array(vec![soft.build().text().into()]),
    );
    let mut worker = toml::Table::new();
    worker.insert("poll_interval".into(), "10ms".into());
    let mut file = toml::Table::new();
    file.insert("tenant".into(), tenant.into());
    file.insert("soft_delete".into(), soft_delete.into());
    file.insert("worker".into(), worker.into());
    toml::to_string(&file).expect("a table of strings serializes")
}

/// The key of tenant `ordinal` as text, as a deletion request gives it.
///
/// # Errors
/// The query's error.
pub async fn tenant_key(
    pool: &PgPool,
    schema: &Schema,
    ordinal: i64,
) -> Result<String, sqlx::Error> {
    let mut b = SqlBuilder::new();
    b.sql("SELECT id::text FROM ")
        .table(&schema.root().qualified())
        .sql(" ORDER BY created_at OFFSET ")
        .int(ordinal - 1)
        .sql(" LIMIT 1");
    sqlx::query_scalar(b.build().as_query())
        .fetch_one(pool)
        .await
}

/// A database of the corpus on the server: created (dropped first if left by an earlier run),
/// the schema of `seed` loaded, and described.
///
/// # Errors
/// A database step's error.
pub async fn create_and_load(
    admin: &PgPool,
    options: &PgConnectOptions,
    database: &str,
    schema: &Schema,
) -> Result<(CorpusSchema, String, String), CorpusError> {
    drop_database(admin, database).await?;
    let mut create = SqlBuilder::new();
    create.sql("CREATE DATABASE ").ident(database);
    deprov::db::query(create.build().as_query())
        .execute(admin)
        .await?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.clone().database(database))
        .await?;
    let loaded = async {
        let load = data::load(&pool, schema).await?;
        let root = schema.root().qualified();
        let plan = deprov::engine::load_plan(&pool, &root, "id")
            .await
            .map_err(|e| {
                CorpusError::Invalid(format!("deprov's plan of seed {}: {e}", schema.seed))
            })?;
        let (foreign_keys, unindexed): (i64, i64) =
            sqlx::query_as(UNINDEXED).fetch_one(&pool).await?;
        let large = tenant_key(&pool, schema, schema.large).await?;
        let small = tenant_key(&pool, schema, schema.small).await?;
        Ok::<_, CorpusError>((
            CorpusSchema {
                seed: schema.seed,
                database: database.to_owned(),
                tables: schema.tables.len(),
                closure_tables: plan.closure.len(),
                foreign_keys: foreign_keys as usize,
                unindexed_foreign_keys: unindexed as usize,
                rows: schema.total_rows(),
                large_rows: schema.tenant_rows(schema.large),
                small_rows: schema.tenant_rows(schema.small),
                load,
            },
            large,
            small,
        ))
    }
    .await;
    pool.close().await;
    loaded
}

/// Foreign keys of the database (partitions' inherited copies not counted) and of them those no
/// index of their table leads with (an index whose first columns are the key's, in any order).
pub const UNINDEXED: &str = "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS ( \
       SELECT 1 FROM pg_index i WHERE i.indrelid = c.conrelid \
       AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] @> c.conkey \
       AND cardinality(c.conkey) <= i.indnatts)) \
     FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid \
     WHERE c.contype = 'f' AND c.conparentid = 0 AND NOT r.relispartition";

/// Runs the corpus (see the module docs).
///
/// # Errors
/// [`CorpusError`] when the server or a schema's setup fails; a failed benchmark run is recorded
/// in its [`CorpusRun`] and the corpus goes on.
pub async fn run(args: &CorpusArgs) -> Result<CorpusReport, CorpusError> {
    if !(args.scale > 0.0 && args.scale.is_finite()) {
        return Err(CorpusError::Invalid(format!(
            "--scale must be positive, got {}",
            args.scale
        )));
    }
    let server = match &args.url {
        Some(url) => Server::Url(
            reqwest::Url::parse(url).map_err(|e| CorpusError::Invalid(format!("--url: {e}")))?,
        ),
        None => Server::Throwaway(Throwaway::start(&ThrowawayOptions {
            unsafe_fast: false,
            settings: vec![
                ("shared_buffers".into(), "1GB".into()),
                ("max_wal_size".into(), "4GB".into()),
            ],
        })?),
    };
    let admin_url = match &server {
        Server::Url(u) => u.to_string(),
        Server::Throwaway(t) => t.url("postgres"),
    };
    let options = deprov::db::connect_options(&admin_url)
        .map_err(|e| CorpusError::Invalid(format!("--url: {e}")))?;
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options.clone())
        .await?;
    let quiet = args.json;
    let mut schemas = Vec::new();
    let mut runs = Vec::new();
    for seed in args.first_seed..args.first_seed + args.seeds {
        let schema = generate(seed, args.scale);
        let database = format!("deprov_corpus_{seed}");
        let (described, large, small) =
            create_and_load(&admin, &options, &database, &schema).await?;
        if !quiet {
            eprintln!(
                "seed {seed}: {} tables ({} in the closure), {} rows loaded in {:.1} s",
                described.tables,
                described.closure_tables,
                described.rows,
                described.load.total_s()
            );
        }
        let config = tempfile::NamedTempFile::new()?;
        std::fs::write(config.path(), config_toml(&schema))?;
        for (size, key) in [("large", large), ("small", small)] {
            let run = TargetRun {
                url: server.url(&database),
                tenant: key.clone(),
                config: config.path().to_owned(),
                keep_copies: false,
                quiet: true,
            };
            let mut reports = Vec::new();
            let mut error = None;
            for _ in 0..args.repeat {
                let outcome = target::run(&run).await;
                if !quiet {
                    match &outcome {
                        Ok(r) => eprintln!(
                            "  {size} tenant {key}: {} rows, cascade {:.2} s, deprov {:.2} s, equal: {}",
                            r.cascade.rows,
                            r.cascade.elapsed_s,
                            r.deprov.elapsed_s,
                            r.equals_cascade
                        ),
                        Err(e) => eprintln!("  {size} tenant {key}: FAILED: {e}"),
                    }
                }
                match outcome {
                    Ok(r) => reports.push(r),
                    Err(e) => {
                        error = Some(e.to_string());
                        break;
                    }
                }
            }
            runs.push(CorpusRun::new(
                (seed, size, key, described.closure_tables),
                reports,
                error,
            ));
        }
        if !args.keep {
            drop_database(&admin, &database).await?;
        }
        schemas.push(described);
    }
    admin.close().await;
    drop(server);
    Ok(CorpusReport::new(args.scale, schemas, runs))
}
