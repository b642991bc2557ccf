//! One differential case: the generated database, a clone where PostgreSQL's own cascade deleted the
//! tenant, and the original where deprov's worker deleted it in tiny batches; then the comparison.

use std::sync::Arc;
use std::time::Duration;

use deprov::config::Config;
use deprov::db::Pools;
use deprov::ids::DedupBasis;
use deprov::queue::intake::{self, NewRequest, SubjectKind};
use deprov::queue::{Job, JobState, jobs};
use deprov::sql::{SqlBuilder, quote_ident};
use deprov::worker::{StepOutcome, Worker};
use deprov_testkit::Throwaway;
use rand::SeedableRng;
use rand::rngs::StdRng;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::digest::{differing, digest, row_diff};
use crate::model::Case;
use crate::{data_gen, ddl, schema_gen};

/// How a case failed: the summary groups failing seeds by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Both finished but the databases differ: deprov deleted or changed other rows than the cascade.
    Differs,
    /// The cascade failed; deprov's job failed too, but only after changing the database.
    ChangedWhileRefusing,
    /// The cascade failed; deprov's job completed.
    CompletedWhereCascadeFails,
    /// The cascade succeeded; deprov's job did not complete.
    FailedWhereCascadeSucceeds,
    /// The generator made a schema PostgreSQL refuses (a bug in this test).
    InvalidCase,
    /// The case panicked.
    Panicked,
}

/// A failed case: its kind and the report (seed, DDL, outcomes, differing rows).
pub struct Failure {
    pub kind: Kind,
    pub report: String,
}

/// What a passing case did, for the run's summary.
pub struct Passed {
    /// The cascade failed and deprov refused.
    pub refused: bool,
    /// PostgreSQL's cascade deleted some table's rows under deprov's batches (`engine::absorb`).
    pub cascaded: bool,
    pub rows: usize,
}

/// The case of `seed`: schema, then rows.
pub fn generate(seed: u64) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut case = schema_gen::schema(seed, &mut rng);
    data_gen::fill(&mut case, &mut rng);
    case
}

async fn connect(server: &Throwaway, db: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url(db))
        .await
        .unwrap()
}

async fn admin_sql(admin: &PgPool, parts: &[&'static str], names: &[&str]) {
    let mut b = SqlBuilder::new();
    for (i, p) in parts.iter().enumerate() {
        b.sql(p);
        if let Some(n) = names.get(i) {
            b.ident(n);
        }
    }
    sqlx::query(b.build().as_query())
        .execute(admin)
        .await
        .unwrap();
}

async fn drop_db(admin: &PgPool, db: &str) {
    admin_sql(admin, &["DROP DATABASE IF EXISTS ", " WITH (FORCE)"], &[db]).await;
}

/// Odd seeds are analyzed and let PostgreSQL cascade small subtrees under deprov's batches
/// (`engine::absorb`, the default); even seeds delete leaves first (`cascade_rows = 0`). Both paths
/// must equal the cascade.
fn cascade_rows(seed: u64) -> u32 {
    if seed % 2 == 1 { 10_000 } else { 0 }
}

/// Half the seeds (0 and 1 mod 4, so both `cascade_rows` paths) run the trial cascade
/// (`engine::trial`), which on cases this small always decides and so refuses every failing cascade
/// itself; the other half turn it off, so that the simulation, which alone decides for tenants too
/// large for the trial, is still checked on every kind of refusal.
fn trial_cascade(seed: u64) -> bool {
    seed % 4 < 2
}

/// One seed in eight (a quarter of those with the trial) lets the trial commit when the whole
/// cascade fits (`engine::whole`); the others keep their tenants to the batches this test checks.
fn whole_cascade(seed: u64) -> bool {
    seed.is_multiple_of(8)
}

/// deprov's configuration for the case (built as TOML data: every name is quoted by `quote_ident`).
fn config(case: &Case) -> Config {
    let root = ddl::name(case, case.root());
    let key = &case.root().columns[case.root_key].name;
    let mut soft = SqlBuilder::new();
    soft.sql("UPDATE ")
        .table(&root)
        .sql(" SET deleted_at = now() WHERE ")
        .ident(key)
        .sql(" = $1 AND deleted_at IS NULL");
    let text = toml::to_string(&serde_json::json!({
        "sources": { "billing": { "token": "billing-token-0123456789" } },
        "tenant": {
            "root_table": format!("{}.{}", quote_ident(&root.schema), quote_ident(&root.name)),
            "key_column": key,
        },
        "soft_delete": { "statements": [soft.build().text()] },
        "hard_delete": {
            "batch_rows": case.batch_rows, "max_batch_rows": case.batch_rows,
            "max_batch_duration": "800ms", "statement_timeout": "900ms", "lock_timeout": "100ms",
            "cascade_rows": cascade_rows(case.seed),
            "trial_cascade": trial_cascade(case.seed),
            "whole_cascade": whole_cascade(case.seed),
        },
        "worker": { "lease": "1s", "backoff_base": "1ms", "backoff_max": "2ms", "max_attempts": 3 },
    }))
    .unwrap();
    Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Steps workers until the job is completed or failed, waiting out retry back-offs (never a fixed
/// sleep: only until the job's own `run_after`).
async fn drain(db: &PgPool, worker: &Worker, job_id: Uuid) -> Job {
    for _ in 0..200 {
        let outcome = worker.step().await.unwrap();
        let job = jobs::get(db, job_id).await.unwrap().unwrap();
        match job.state() {
            JobState::Completed | JobState::Failed => return job,
            _ if outcome == StepOutcome::Idle => {
                let now = time::OffsetDateTime::now_utc();
                let until = job
                    .lease_expires_at
                    .unwrap_or(job.run_after)
                    .max(job.run_after);
                let wait = Duration::try_from(until - now).unwrap_or_default();
                tokio::time::sleep(wait + Duration::from_millis(1)).await;
            }
            _ => {}
        }
    }
    panic!("job {job_id} never finished");
}

/// Runs case `seed`; `Err` is the failure report (seed, DDL, outcomes, differing rows).
pub async fn run(server: &Throwaway, admin: &PgPool, seed: u64) -> Result<Passed, Failure> {
    let case = generate(seed);
    let (orig, exp) = (format!("diff_{seed}_orig"), format!("diff_{seed}_exp"));
    drop_db(admin, &orig).await;
    drop_db(admin, &exp).await;
    admin_sql(admin, &["CREATE DATABASE "], &[&orig]).await;
    let db = connect(server, &orig).await;
    let mut loaded = ddl::load(&db, &case).await;
    if loaded.is_ok() && cascade_rows(case.seed) > 0 {
        loaded = sqlx::query("ANALYZE")
            .execute(&db)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
    }
    db.close().await;
    let header = || {
        format!(
            "seed {s} (replay: DEPROV_DIFF_SEED={s}): tenant {:?} of {:?}, batch_rows {}, {} rows\n{}\n",
            case.tenants[case.victim],
            case.tenants,
            case.batch_rows,
            case.total_rows(),
            ddl::script(&case),
            s = case.seed,
        )
    };
    if let Err(e) = loaded {
        drop_db(admin, &orig).await;
        return Err(Failure {
            kind: Kind::InvalidCase,
            report: format!("{}generator produced an invalid case: {e}", header()),
        });
    }
    admin_sql(admin, &["CREATE DATABASE ", " TEMPLATE "], &[&exp, &orig]).await;

    // The reference: PostgreSQL's own cascade on the clone.
    let expected = connect(server, &exp).await;
    let root = ddl::name(&case, case.root());
    let mut del = SqlBuilder::new();
    del.sql("DELETE FROM ")
        .table(&root)
        .sql(" WHERE ")
        .ident(&case.root().columns[case.root_key].name)
        .sql(" = $1::")
        .sql(case.root().columns[case.root_key].ty.sql());
    let tenant = case.tenants[case.victim].clone();
    let cascade = sqlx::query(del.build().as_query())
        .bind(&tenant)
        .execute(&expected)
        .await;

    // deprov on the original.
    let db = connect(server, &orig).await;
    let before = digest(&db, &case.schema).await;
    deprov::db::migrate(&db).await.unwrap();
    let config = Arc::new(config(&case));
    let url = server.url(&orig);
    let pools = Pools::new(&url, &url, &config.pools).unwrap();
    let req = NewRequest {
        source: "billing".into(),
        basis: DedupBasis::TenantId,
        dedup_key: tenant.clone(),
        subject_kind: SubjectKind::Tenant,
        subject: tenant.clone(),
        external_id: None,
        reason: None,
    };
    let job_id = intake::record_tx(&pools.intake, &req, 3)
        .await
        .unwrap()
        .job_id;
    let worker = Worker::new(pools.clone(), config.clone(), format!("diff-{seed}"));
    let job = drain(&db, &worker, job_id).await;
    let after = digest(&db, &case.schema).await;

    let verdict = match &cascade {
        Ok(_) => {
            let want = digest(&expected, &case.schema).await;
            let diff = differing(&want, &after);
            if job.state() != JobState::Completed {
                Err((
                    Kind::FailedWhereCascadeSucceeds,
                    format!(
                        "the cascade succeeded but deprov's job ended {} ({:?}) at table {:?}\n",
                        job.state,
                        job.last_error,
                        job.progress
                            .get("current_table")
                            .and_then(|t| t.as_str())
                            .unwrap_or("-")
                    ),
                ))
            } else if !diff.is_empty() {
                Err((
                    Kind::Differs,
                    format!(
                        "deprov's result differs from the cascade's:\n{}",
                        row_diff(&expected, &db, &diff).await
                    ),
                ))
            } else {
                Ok(false)
            }
        }
        Err(e) => {
            let diff = differing(&before, &after);
            if job.state() != JobState::Failed {
                Err((
                    Kind::CompletedWhereCascadeFails,
                    format!(
                        "the cascade failed ({e}) but deprov's job ended {}\n",
                        job.state
                    ),
                ))
            } else if !diff.is_empty() {
                Err((
                    Kind::ChangedWhileRefusing,
                    format!(
                        "the cascade failed ({e}); deprov's job failed ({:?}) but changed the database:\n{}",
                        job.last_error,
                        // The clone is the untouched database: its cascade rolled back.
                        row_diff(&expected, &db, &diff).await
                    ),
                ))
            } else {
                Ok(true)
            }
        }
    };
    for p in [&pools.intake, &pools.queue, &pools.target, &db, &expected] {
        p.close().await;
    }
    drop_db(admin, &orig).await;
    drop_db(admin, &exp).await;
    let progress = deprov::worker::Progress::from_json(&job.progress);
    let cascaded = progress
        .tables
        .iter()
        .any(|t| t.batches == 0 && t.rows_deleted > 0);
    verdict
        .map(|refused| Passed {
            refused,
            cascaded,
            rows: case.total_rows(),
        })
        .map_err(|(kind, e)| Failure {
            kind,
            report: format!("{}{e}", header()),
        })
}
