//! Start-up work of `deprov serve` and `deprov worker` besides HTTP: loading the configuration and
//! building the pools ([`prepare`], no database touched, so the listener binds at once), then
//! migrating (now or, with the state database down, in the background) and checking the target
//! (`[tenant] root_table` and the configured SQL, [`crate::sqlcheck`]) while HTTP already answers
//! ([`check_databases`]), and the tasks that wait for those before the worker runs.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{AppError, Settings};
use crate::config::Config;
use crate::db::{self, Pools};
use crate::http;
use crate::readiness::{Readiness, Stage};
use crate::telemetry;
use crate::worker::Worker;

/// What a process needs besides HTTP (see [`prepare`]).
pub(super) struct Prepared {
    pub(super) config: Arc<Config>,
    pub(super) pools: Pools,
    /// The process's start-up stage and configured-SQL check: [`crate::readiness::Stage::Starting`]
    /// and pending until [`check_databases`] ran.
    pub(super) readiness: Readiness,
    /// `settings.migrate`: whether deprov applies the migrations itself, or only checks that none is
    /// pending (`--migrate false` / `DEPROV_MIGRATE=false`).
    pub(super) apply_migrations: bool,
}

/// Loads the configuration, checks the settings and builds the pools (which connect lazily): no
/// database is touched, so a database that is down delays nothing here. The migrations count as not
/// applied and the SQL check as pending until [`check_databases`] ran.
pub(super) fn prepare(settings: &Settings) -> Result<Prepared, AppError> {
    // Before any connection opens, so every one is counted.
    telemetry::install();
    let config = Arc::new(Config::load(&settings.config.to_string_lossy())?);
    let target = target_url(settings);
    for (name, url) in [
        ("DEPROV_DATABASE_URL", &settings.database_url[..]),
        ("DEPROV_TARGET_URL", target),
    ] {
        let options = db::connect_options(url).map_err(AppError::Url)?;
        settings
            .pooler_mode
            .check_url(&options)
            .map_err(|reason| AppError::Setting { name, reason })?;
    }
    if settings.migrate && !settings.pooler_mode.allows_migrations() {
        return Err(AppError::Setting {
            name: "DEPROV_MIGRATE",
            reason: "migrations cannot run through a transaction pooler (DEPROV_POOLER_MODE=transaction): \
                     run `deprov migrate` with a direct DEPROV_DATABASE_URL, then start with migrations \
                     off (--migrate false or DEPROV_MIGRATE=false)"
                .into(),
        });
    }
    settings.pooler_mode.apply();
    let pools = Pools::new(&settings.database_url, target, &config.pools).map_err(AppError::Url)?;
    Ok(Prepared {
        config,
        pools,
        readiness: Readiness::starting(),
        apply_migrations: settings.migrate,
    })
}

/// `DEPROV_TARGET_URL`, else the state database's URL.
fn target_url(settings: &Settings) -> &str {
    settings
        .target_url
        .as_deref()
        .unwrap_or(&settings.database_url)
}

/// The start-up checks that need the databases: migrates (or, with migrations off, checks that none
/// is pending) and checks the target ([`check_target`]), then moves `prepared.readiness` past
/// [`Stage::Starting`] (the SQL check's status set first). Waits for a database that is down up to its pool's acquire timeout (sqlx
/// retries a refused connection until then), which is why HTTP is served before this runs. A state
/// database that cannot be reached is not an error: the migrations stay `false` and are applied later
/// by [`migrate_in_background`]; any other migration failure is. Nor is a target that cannot be
/// reached: the SQL check then stays pending.
///
/// # Errors
/// [`AppError::Migrate`], [`AppError::PendingMigrations`], and [`check_target`]'s refusals.
pub(super) async fn check_databases(
    settings: &Settings,
    prepared: &Prepared,
) -> Result<(), AppError> {
    let queue = &prepared.pools.queue;
    let migrated = if settings.migrate {
        match db::migrate(queue).await {
            Ok(()) => true,
            Err(sqlx::migrate::MigrateError::Execute(e)) if http::error::is_unavailable(&e) => {
                let error = db::errors::unreachable_text(queue, &e).await;
                tracing::warn!(%error, "state database unreachable at start; migrating once it answers");
                false
            }
            // A deadlock or lock timeout against another process starting at the same time (its
            // first reads of deprov's tables): retried in the background like an outage.
            Err(
                sqlx::migrate::MigrateError::Execute(e)
                | sqlx::migrate::MigrateError::ExecuteMigration(e, _),
            ) if crate::engine::is_retryable(&e) => {
                let error = db::errors::error_text(&e);
                tracing::warn!(%error, "migrating the state database failed on a transient error; retrying in the background");
                false
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        refuse_pending_migrations(queue).await?
    };
    let gate = prepared.readiness.sql_check();
    let status = check_target(&prepared.config, target_url(settings), gate).await?;
    gate.set(status);
    prepared.readiness.advance(if migrated {
        Stage::Migrated
    } else {
        Stage::Unmigrated
    });
    Ok(())
}

/// Applies the migrations (`apply`; else waits until none is pending: migrations off) until
/// that succeeds or `cancel` fires, retrying with backoff (1 s doubling to 5 s, plus the pool's
/// acquire wait) and moving `readiness` to [`Stage::Migrated`] on success. Returns whether it succeeded. Errors other than an
/// unreachable database, and pending migrations deprov may not apply, are logged and retried alike:
/// the process stays up and `/readyz` stays 503 until they are fixed (`deprov migrate`).
async fn migrate_in_background(
    pool: sqlx::PgPool,
    readiness: Readiness,
    apply: bool,
    cancel: CancellationToken,
) -> bool {
    let mut attempt = 0u32;
    while !readiness.is_migrated() {
        let wait = Duration::from_secs(1 << attempt.min(2)).min(Duration::from_secs(5));
        tokio::select! {
            () = cancel.cancelled() => return false,
            () = tokio::time::sleep(wait) => {}
        }
        attempt += 1;
        let result = tokio::select! {
            () = cancel.cancelled() => return false,
            r = migrate_or_check(&pool, apply) => r,
        };
        match result {
            Ok(()) => {
                tracing::info!(
                    attempt,
                    apply,
                    "state database reachable; migrations applied"
                );
                readiness.advance(Stage::Migrated);
            }
            Err(e) => {
                tracing::warn!(attempt, error = %e, "the state database's migrations are not applied; retrying")
            }
        }
    }
    true
}

/// Applies the migrations (`apply`), or checks that none is pending; the error as text.
async fn migrate_or_check(pool: &sqlx::PgPool, apply: bool) -> Result<(), String> {
    if apply {
        return db::migrate(pool).await.map_err(|e| e.to_string());
    }
    match db::pending_migrations(pool).await {
        Ok(pending) if pending.is_empty() => Ok(()),
        Ok(pending) => Err(lacking(&pending)),
        Err(e) => Err(db::errors::error_text(&e)),
    }
}

/// Runs `worker` once the migrations are applied (at once when they are).
pub(super) fn spawn_worker(
    worker: Option<Worker>,
    pool: sqlx::PgPool,
    readiness: Readiness,
    apply_migrations: bool,
    cancel: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    if worker.is_none() && readiness.is_migrated() {
        return None;
    }
    Some(tokio::spawn(async move {
        if migrate_in_background(pool, readiness, apply_migrations, cancel.clone()).await
            && let Some(w) = worker
        {
            w.run(cancel).await;
        }
    }))
}

/// Refuses to start when `[tenant] root_table` / `key_column` do not exist in the target database,
/// or when the target refuses a configured statement ([`crate::sqlcheck::check_at_start`]); records
/// the key column's type in `gate` ([`crate::sqlcheck::Gate::key_form`]).
/// A target that cannot be reached is not an error (deprov must start while the database is down):
/// the plan is checked again when a job runs, and the statements by
/// [`crate::sqlcheck::check_until_passed`] (the returned status is then pending). The wait is bounded
/// by the pool's 5 s acquire timeout and, on the server, by [`db::Bounds::STATE`] (catalog) and
/// `[hard_delete]`'s timeouts (statements); no client deadline abandons a query. It uses a
/// connection of its own (`deprov-cli`), closed afterwards, so the target pool starts empty.
async fn check_target(
    config: &Config,
    target_url: &str,
    gate: &crate::sqlcheck::Gate,
) -> Result<crate::sqlcheck::Status, AppError> {
    let root = config.root_table();
    let options = db::connect_options(target_url).map_err(AppError::Url)?;
    let pool = db::single(&options, db::PoolRole::Cli);
    let result = match crate::engine::load_plan(&pool, &root, &config.tenant.key_column).await {
        Ok(plan) => {
            gate.set_key_type(plan.key_type.as_str());
            crate::sqlcheck::check_at_start(&pool, config)
                .await
                .map_err(AppError::from)
        }
        Err(crate::engine::EngineError::Plan(e)) => Err(AppError::Tenant(e)),
        Err(e) => {
            let error = match &e {
                crate::engine::EngineError::Db(e) => db::errors::unreachable_text(&pool, e).await,
                e => e.to_string(),
            };
            tracing::warn!(%error, "target database not reachable at start; [tenant] is checked when a job runs, \
                the configured SQL once the target answers (no job is claimed until then)");
            Ok(crate::sqlcheck::Status::Pending)
        }
    };
    pool.close().await;
    result
}

/// Runs [`crate::sqlcheck::check_until_passed`] on the target pool while `gate` is pending (none
/// when it passed at start).
pub(super) fn spawn_sql_check(
    pools: &Pools,
    config: &Arc<Config>,
    gate: &crate::sqlcheck::Gate,
    cancel: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    if gate.status() == crate::sqlcheck::Status::Passed {
        return None;
    }
    Some(tokio::spawn(crate::sqlcheck::check_until_passed(
        pools.target.clone(),
        config.clone(),
        gate.clone(),
        cancel,
    )))
}

/// With migrations off (`--migrate false` / `DEPROV_MIGRATE=false`), refuses to start on a state
/// database that lacks migrations this build needs: its statements would fail on every request
/// (intake calls `deprov.record_first`, made by migration 7). Returns whether the check ran: `false` when the state database could not be
/// read, and then [`migrate_in_background`] repeats it and `/readyz` answers 503 until it passes.
///
/// # Errors
/// [`AppError::PendingMigrations`] naming the missing versions and `deprov migrate`.
async fn refuse_pending_migrations(pool: &sqlx::PgPool) -> Result<bool, AppError> {
    match db::pending_migrations(pool).await {
        Ok(pending) if pending.is_empty() => Ok(true),
        Ok(pending) => Err(AppError::PendingMigrations(lacking(&pending))),
        Err(e) => {
            tracing::warn!(error = %db::errors::error_text(&e), "could not read the state database's migrations at start; checking again in the background");
            Ok(false)
        }
    }
}

/// What an operator reads when the state database lacks the migrations `pending` and deprov may
/// not apply them: that migrations are off, however they were turned off (the flag or the
/// environment variable), the versions, and the command that applies them.
fn lacking(pending: &[i64]) -> String {
    format!(
        "with migrations off (--migrate false or DEPROV_MIGRATE=false), the state database lacks \
         migration(s) {pending:?} of this deprov: run `deprov migrate` with a direct \
         DEPROV_DATABASE_URL first"
    )
}
