//! The operator's SQL, checked against the target database when deprov starts rather than when the
//! first job runs it.
//!
//! The configuration file holds SQL the engine runs on the target: `[soft_delete] statements`,
//! `undo_statements` and `orphans`, and each `tenant_lookup` ([`configured`]). [`check`] has
//! PostgreSQL parse and analyse every one of them as the engine would run it, without running it
//! ([`crate::engine::statements::check`]: an extended-protocol Describe inside a transaction that is
//! always rolled back, bounded by `[hard_delete] lock_timeout` and `statement_timeout`), and lists
//! what the server (or the engine's way of calling the statement) refuses, each [`Finding`] naming
//! its setting (`soft_delete.statements[1]`) and the server's error with its SQLSTATE.
//!
//! At start ([`crate::app`]) a refusal stops `deprov serve` and `deprov worker` with that list. A
//! target that cannot be reached at start leaves the check [`Status::Pending`]: deprov starts anyway
//! and [`check_until_passed`] runs it once the target answers. Until it has passed, the worker
//! claims no job ([`Gate::wait_until_passed`]); while it finds a refusal, `/readyz` answers 503
//! naming it and the check is repeated every [`RECHECK_REFUSED`] (a schema fixed meanwhile is found;
//! a fixed configuration file needs a restart). `deprov config check` runs the same check once.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db::{self, Bounds};
use crate::engine::statements::{self, Refusal, Shape, Verdict};
use crate::ids::KeyForm;

/// How often a check that found a refusal is repeated (the target's schema may be fixed meanwhile).
pub const RECHECK_REFUSED: Duration = Duration::from_secs(5);

/// Longest wait between attempts while the target cannot be reached (1 s, doubling, capped here).
pub const RETRY_UNREACHABLE_MAX: Duration = Duration::from_secs(5);

/// One configured statement: its setting, its text, and how the engine uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured {
    /// The setting as written in the file, e.g. `soft_delete.statements[1]`,
    /// `sources.stripe.tenant_lookup`, `vercel.tenant_lookup`.
    pub setting: String,
    /// The statement.
    pub sql: String,
    /// What the engine binds and reads.
    pub shape: Shape,
}

/// Every statement of `config` the engine runs on the target, in file order: `soft_delete.statements`,
/// `soft_delete.undo_statements`, `soft_delete.orphans`, `sources.NAME.tenant_lookup` (by name),
/// `vercel.tenant_lookup`, `osb.tenant_lookup`.
pub fn configured(config: &Config) -> Vec<Configured> {
    let item = |setting: String, sql: &str, shape| Configured {
        setting,
        sql: sql.to_owned(),
        shape,
    };
    let sd = &config.soft_delete;
    let mut out = Vec::new();
    for (i, sql) in sd.statements.iter().enumerate() {
        out.push(item(
            format!("soft_delete.statements[{i}]"),
            sql,
            Shape::Action,
        ));
    }
    for (i, sql) in sd.undo_statements.iter().enumerate() {
        out.push(item(
            format!("soft_delete.undo_statements[{i}]"),
            sql,
            Shape::Action,
        ));
    }
    if let Some(sql) = &sd.orphans {
        out.push(item("soft_delete.orphans".into(), sql, Shape::Listing));
    }
    for (name, source) in &config.sources {
        if let Some(sql) = &source.tenant_lookup {
            out.push(item(
                format!("sources.{name}.tenant_lookup"),
                sql,
                Shape::Lookup,
            ));
        }
    }
    if let Some(sql) = config
        .vercel
        .as_ref()
        .and_then(|v| v.tenant_lookup.as_ref())
    {
        out.push(item("vercel.tenant_lookup".into(), sql, Shape::Lookup));
    }
    if let Some(sql) = config.osb.as_ref().and_then(|o| o.tenant_lookup.as_ref()) {
        out.push(item("osb.tenant_lookup".into(), sql, Shape::Lookup));
    }
    out
}

/// A configured statement the target refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Its setting ([`Configured::setting`]).
    pub setting: String,
    /// The server's error (or the engine's reason).
    pub refusal: Refusal,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.setting, self.refusal)
    }
}

/// Every refused statement of a configuration (at least one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refused(pub Vec<Finding>);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the target database refuses {} configured statement{} (fix the configuration file or \
             the target's schema): ",
            self.0.len(),
            if self.0.len() == 1 { "" } else { "s" }
        )?;
        for (i, finding) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{finding}")?;
        }
        Ok(())
    }
}

/// Checks every [`configured`] statement on one connection of `target`, each in its own
/// transaction (bounded by `[hard_delete] lock_timeout` and `statement_timeout`, always rolled
/// back; [`statements::check`] executes nothing anyway). Returns the refused ones, in file order;
/// empty = all accepted. Touches no database when nothing is configured.
///
/// # Errors
/// When the check could not run to its end: the pool's acquire timeout (a target that is down),
/// connection errors, and the server's timeouts and lock waits (a table locked by a migration).
pub async fn check(target: &PgPool, config: &Config) -> Result<Vec<Finding>, sqlx::Error> {
    let all = configured(config);
    if all.is_empty() {
        return Ok(Vec::new());
    }
    let bounds = Bounds::new(
        config.hard_delete.lock_timeout,
        config.hard_delete.statement_timeout,
    );
    let mut conn = db::acquire(target).await?;
    let mut findings = Vec::new();
    for c in all {
        let mut tx = db::begin_on(&mut conn, bounds).await?;
        let verdict = statements::check(&mut tx, &c.sql, c.shape).await;
        let rolled_back = tx.rollback().await;
        if let Verdict::Refused(refusal) = verdict? {
            findings.push(Finding {
                setting: c.setting,
                refusal,
            });
        }
        rolled_back?;
    }
    Ok(findings)
}

/// Where the check stands in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Not run to its end yet: the target has not been reached since start.
    Pending,
    /// Every configured statement was accepted (or none is configured).
    Passed,
    /// The last check found these refusals.
    Refused(Refused),
}

/// The check's [`Status`], shared by the HTTP handlers (`/readyz`), the worker (which claims no
/// job before it passed) and [`check_until_passed`]. Cheap to clone.
/// It also carries the [`KeyForm`] of `[tenant] key_column`, read from the target's catalog
/// with the check, by which intake stores tenant keys.
#[derive(Debug, Clone)]
pub struct Gate(Arc<watch::Sender<Status>>, Arc<OnceLock<KeyForm>>);

impl Default for Gate {
    /// A gate that has passed (what tests and tools that skip the check use).
    fn default() -> Self {
        Self::new(Status::Passed)
    }
}

impl Gate {
    /// A gate in `status`, its key form not known yet.
    pub fn new(status: Status) -> Self {
        Self(Arc::new(watch::Sender::new(status)), Arc::default())
    }

    /// How `[tenant] key_column` reads tenant keys; `None` until the target's catalog was read (a
    /// target that was down since start): intake then stores keys as sent, and the worker keys each
    /// job by its cast ([`crate::engine::canonical_tenant_key`]).
    pub fn key_form(&self) -> Option<KeyForm> {
        self.1.get().copied()
    }

    /// Records the key column's type, as `format_type` prints it (the first record stays).
    pub fn set_key_type(&self, sql_type: &str) {
        let _ = self.1.set(KeyForm::of(sql_type));
    }

    /// The current status.
    pub fn status(&self) -> Status {
        self.0.borrow().clone()
    }

    /// Sets the status (waking [`Self::wait_until_passed`] when it is [`Status::Passed`]).
    pub fn set(&self, status: Status) {
        self.0.send_replace(status);
    }

    /// Waits until the status is [`Status::Passed`] (at once when it is) or `cancel` fires; returns
    /// whether it passed.
    pub async fn wait_until_passed(&self, cancel: &CancellationToken) -> bool {
        let mut rx = self.0.subscribe();
        tokio::select! {
            passed = rx.wait_for(|s| *s == Status::Passed) => passed.is_ok(),
            () = cancel.cancelled() => false,
        }
    }
}

/// The check at start: [`Status::Passed`], or [`Status::Pending`] (logged) when it could not run
/// (the target is not reachable).
///
/// # Errors
/// [`Refused`] when the target refuses a statement: deprov does not start.
pub async fn check_at_start(target: &PgPool, config: &Config) -> Result<Status, Refused> {
    match check(target, config).await {
        Ok(findings) if findings.is_empty() => Ok(Status::Passed),
        Ok(findings) => Err(Refused(findings)),
        Err(e) => {
            let error = db::errors::unreachable_text(target, &e).await;
            tracing::warn!(%error, "target database not reachable at start: the configured SQL \
                is checked once it is, and the worker claims no job until then");
            Ok(Status::Pending)
        }
    }
}

/// Runs [`check`] on `target` until it passes or `cancel` fires, setting `gate` after each run:
/// while the target cannot be reached every 1 s doubling to [`RETRY_UNREACHABLE_MAX`] (the status
/// stays what it was), while it refuses a statement every [`RECHECK_REFUSED`] (logged at `error`
/// when the findings change). Returns at once when `gate` has passed.
pub async fn check_until_passed(
    target: PgPool,
    config: Arc<Config>,
    gate: Gate,
    cancel: CancellationToken,
) {
    let mut attempt = 0u32;
    loop {
        let status = gate.status();
        let wait = match status {
            Status::Passed => return,
            Status::Refused(_) => RECHECK_REFUSED,
            Status::Pending => Duration::from_secs(1 << attempt.min(3)).min(RETRY_UNREACHABLE_MAX),
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        attempt = attempt.saturating_add(1);
        // Bounded by the pool's acquire timeout and the server-side bounds; not cut short by
        // `cancel` (see crate::db: no client deadline abandons a statement).
        if gate.key_form().is_none()
            && let Ok(plan) =
                crate::engine::load_plan(&target, &config.root_table(), &config.tenant.key_column)
                    .await
        {
            gate.set_key_type(plan.key_type.as_str());
        }
        match check(&target, &config).await {
            Ok(findings) if findings.is_empty() => {
                tracing::info!(
                    attempt,
                    "configured SQL accepted by the target database; the worker may claim jobs"
                );
                gate.set(Status::Passed);
            }
            Ok(findings) => {
                let refused = Refused(findings);
                if status != Status::Refused(refused.clone()) {
                    tracing::error!(error = %refused, "configured SQL refused: /readyz answers 503 \
                        and the worker claims no job until the check passes (repeated every 5 s)");
                }
                gate.set(Status::Refused(refused));
            }
            Err(e) if attempt == 1 || attempt.is_multiple_of(12) => {
                let error = db::errors::unreachable_text(&target, &e).await;
                tracing::warn!(attempt, %error, "target database not reachable: configured SQL not checked yet");
            }
            Err(e) => {
                let error = db::errors::error_text(&e);
                tracing::debug!(attempt, %error, "target database not reachable: configured SQL not checked yet");
            }
        }
    }
}
