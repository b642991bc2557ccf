//! Helpers for the tests on the demo schema: a throwaway server, databases cloned from a loaded
//! demo, deprov's configuration for it, the pools/workers/requests of one database, and a child
//! `deprov worker` process.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deprov::config::Config;
use deprov::db::Pools;
use deprov::ids::DedupBasis;
use deprov::queue::intake::SubjectKind;
use deprov::queue::{Job, jobs};
use deprov::sql::QualifiedName;
use deprov::worker::Worker;
use deprov_demo::{self, DatabaseDigest, DemoSize, DemoTenants};
use deprov_testkit::{Throwaway, ThrowawayOptions};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

/// deprov's configuration for the demo schema: [`crate::harness::config_for`] with `batch_rows`-row
/// batches and the demo's Vercel lookup column.
pub fn demo_config(batch_rows: u32) -> String {
    crate::harness::config_for(batch_rows, "vercel_installation_id", "")
}

/// The demo's root table.
pub fn accounts() -> QualifiedName {
    QualifiedName::new("app", "accounts")
}

/// A throwaway server (unsafe_fast) and an admin pool on its `postgres` database.
pub struct DemoServer {
    pub server: Throwaway,
    pub admin: PgPool,
}

impl DemoServer {
    pub async fn start() -> Self {
        let server = Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
        .unwrap();
        let admin = crate::harness::admin(&server).await;
        Self { server, admin }
    }

    /// A pool on database `db`.
    pub async fn pool(&self, db: &str) -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .connect(&self.server.url(db))
            .await
            .unwrap()
    }

    /// Creates database `db` and loads the demo into it; the pool is closed afterwards so the
    /// database can serve as a template.
    pub async fn load(&self, db: &str, size: &DemoSize) -> DemoTenants {
        let mut b = deprov::sql::SqlBuilder::new();
        b.sql("CREATE DATABASE ").ident(db);
        sqlx::query(b.build().as_query())
            .execute(&self.admin)
            .await
            .unwrap();
        let pool = self.pool(db).await;
        let tenants = deprov_demo::load(&pool, size).await.unwrap();
        pool.close().await;
        tenants
    }

    /// `to`, a copy of `from` (connections to `from` are terminated).
    pub async fn clone_db(&self, from: &str, to: &str) {
        deprov_demo::clone_database(&self.admin, from, to)
            .await
            .unwrap();
    }

    /// Clones `from` into `to` and runs the naive cascade of `tenant` there; returns the digest of
    /// schema `app` afterwards and the rows the cascade removed.
    pub async fn cascade(&self, from: &str, to: &str, tenant: i64) -> (DatabaseDigest, i64) {
        self.clone_db(from, to).await;
        let pool = self.pool(to).await;
        let outcome = deprov_demo::cascade_delete(&pool, &accounts(), "id", tenant)
            .await
            .unwrap();
        assert_eq!(outcome.root_rows, 1, "tenant {tenant} not found");
        let digest = deprov_demo::database_digest(&pool, "app").await.unwrap();
        pool.close().await;
        (digest, outcome.total_deleted())
    }
}

/// One database deprov works on (state and target together), with its pools.
pub struct DemoDb {
    pub db: PgPool,
    pub config: Arc<Config>,
    pub pools: Pools,
}

impl DemoDb {
    /// Migrates database `name` of `server` and builds deprov's pools on it.
    pub async fn open(server: &DemoServer, name: &str, config_text: &str) -> Self {
        let db = server.pool(name).await;
        deprov::db::migrate(&db).await.unwrap();
        let config = Arc::new(Config::from_toml(config_text).unwrap());
        let url = server.server.url(name);
        let pools = Pools::new(&url, &url, &config.pools).unwrap();
        Self { db, config, pools }
    }

    pub fn worker(&self, name: &str) -> Worker {
        Worker::new(self.pools.clone(), self.config.clone(), name.into())
    }

    /// Records a deletion request for `tenant` (as intake does); returns its job.
    pub async fn request(&self, tenant: i64) -> Uuid {
        let key = tenant.to_string();
        crate::harness::record(
            &self.pools,
            &self.config,
            DedupBasis::TenantId,
            SubjectKind::Tenant,
            &key,
        )
        .await
    }

    pub async fn job(&self, id: Uuid) -> Job {
        jobs::get(&self.db, id).await.unwrap().unwrap()
    }

    pub async fn digest(&self) -> DatabaseDigest {
        deprov_demo::database_digest(&self.db, "app").await.unwrap()
    }

    pub async fn others(&self, tenant: i64) -> DatabaseDigest {
        deprov_demo::other_tenants_digest(&self.db, "app", &accounts(), "id", tenant)
            .await
            .unwrap()
    }

    /// Waits until no connection of a deprov worker is left on the server ([`wait_no_worker_backends`]).
    pub async fn wait_no_worker_backends(&self) {
        wait_no_worker_backends(&self.db).await;
    }
}

/// Waits until no connection of a deprov worker (queue or target pool) is left on `db`'s database:
/// after a SIGKILL, the killed process's backends finish whatever they were running first (at
/// most 15 s).
pub async fn wait_no_worker_backends(db: &PgPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() \
               AND application_name IN ('deprov-worker', 'deprov-target')",
        )
        .fetch_one(db)
        .await
        .unwrap();
        if n == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} worker backends still connected 15 s after the kill"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The tables whose digests differ, for assertion messages.
pub fn differing(a: &DatabaseDigest, b: &DatabaseDigest) -> Vec<String> {
    deprov_demo::differing_tables(a, b)
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// A child `deprov worker`; killed (SIGKILL) if still running when dropped.
pub struct WorkerProcess {
    pub child: Child,
    pub log: tempfile::NamedTempFile,
}

impl WorkerProcess {
    /// Starts `deprov worker` with its state database at `state_url`, its target at `target_url`
    /// (none: the same database) and the configuration file `config`; its log goes to a temp file.
    pub fn spawn(state_url: &str, target_url: Option<&str>, config: &Path) -> Self {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_deprov"));
        command
            .arg("worker")
            .env("DEPROV_DATABASE_URL", state_url)
            .env("DEPROV_CONFIG", config)
            .env_remove("DEPROV_TARGET_URL")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap());
        if let Some(target) = target_url {
            command.env("DEPROV_TARGET_URL", target);
        }
        Self {
            child: command.spawn().unwrap(),
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Polls the job until `pred` holds (at most 30 s); fails at once if the process exited.
    pub async fn wait_for(&mut self, db: &DemoDb, id: Uuid, pred: impl Fn(&Job) -> bool) -> Job {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let job = db.job(id).await;
            if pred(&job) {
                return job;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("worker exited ({status}) early: {job:?}\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "timed out: {job:?}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits (at most `limit`) for the process to exit by itself.
    pub async fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker still running {limit:?} after SIGTERM\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
