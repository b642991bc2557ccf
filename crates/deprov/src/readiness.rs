//! Whether a process is ready: one value on a `tokio::sync::watch` channel, shared by `/readyz`,
//! the `/v1/` routes' start-up guard, the background migrations and the worker's start.
//!
//! A process serves HTTP before it checked its databases (see [`crate::app`]), so it goes through
//! [`Stage::Starting`] (the checks run: migrations, the target's catalog and configured SQL), then
//! [`Stage::Unmigrated`] (the state database was unreachable, or lacks migrations deprov may not
//! apply: retried in the background) or [`Stage::Migrated`]. Never back. The configured SQL's
//! check ([`crate::sqlcheck::Gate`]) travels with it: the worker waits on that gate alone.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::sqlcheck::{self, Gate, Status};

/// Where a process stands in its start-up (see the module docs). Ordered: a stage only moves up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// The start-up checks of the databases are running: `/readyz` and every `/v1/` route answer
    /// 503 with `Retry-After` without touching a database.
    Starting,
    /// The checks ran, but deprov's migrations are not applied yet: `/readyz` answers 503 until the
    /// background migration succeeds.
    Unmigrated,
    /// The migrations are applied (or none was pending with migrations off).
    Migrated,
}

/// Why a process is not ready, as `/readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// [`Stage::Starting`].
    Starting,
    /// [`Stage::Unmigrated`].
    Unmigrated,
    /// The target database refuses a configured statement (the text names each setting).
    Refused(String),
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Starting => f.write_str(
                "deprov is starting: it is checking its databases (migrations, the configured SQL)",
            ),
            Self::Unmigrated => f.write_str(
                "the state database's migrations are not applied yet (it was unreachable at start-up, or \
                 lacks migrations deprov may not apply)",
            ),
            Self::Refused(text) => f.write_str(text),
        }
    }
}

/// A process's readiness: its [`Stage`] on a watch channel and the configured SQL's check. Cheap to
/// clone; every clone sees the same values.
#[derive(Debug, Clone)]
pub struct Readiness {
    stage: Arc<watch::Sender<Stage>>,
    sql_check: Gate,
}

impl Readiness {
    /// A process about to check its databases: [`Stage::Starting`], the SQL check pending.
    pub fn starting() -> Self {
        Self {
            stage: Arc::new(watch::Sender::new(Stage::Starting)),
            sql_check: Gate::new(Status::Pending),
        }
    }

    /// A ready process: [`Stage::Migrated`], the SQL check passed (for tools and tests that skip
    /// the start-up checks).
    pub fn ready() -> Self {
        Self {
            stage: Arc::new(watch::Sender::new(Stage::Migrated)),
            sql_check: Gate::default(),
        }
    }

    /// The current stage.
    pub fn stage(&self) -> Stage {
        *self.stage.borrow()
    }

    /// Moves the stage up to `stage`; a lower one is ignored (a stage never goes back).
    pub fn advance(&self, stage: Stage) {
        self.stage.send_if_modified(|now| {
            let higher = stage > *now;
            if higher {
                *now = stage;
            }
            higher
        });
    }

    /// Whether the migrations are applied ([`Stage::Migrated`]).
    pub fn is_migrated(&self) -> bool {
        self.stage() == Stage::Migrated
    }

    /// Waits until [`Stage::Migrated`] (at once when it is) or `cancel` fires; returns whether the
    /// migrations are applied.
    pub async fn wait_migrated(&self, cancel: &CancellationToken) -> bool {
        let mut rx = self.stage.subscribe();
        tokio::select! {
            done = rx.wait_for(|s| *s == Stage::Migrated) => done.is_ok(),
            () = cancel.cancelled() => false,
        }
    }

    /// The configured SQL's check, with the key column's form ([`Gate::key_form`]).
    pub fn sql_check(&self) -> &Gate {
        &self.sql_check
    }

    /// What `/readyz` answers before it reads the state database: `Ok` once migrated and the
    /// configured SQL is not refused (a check still pending does not count: intake does not need
    /// the target).
    ///
    /// # Errors
    /// [`NotReady`]: starting, not migrated, or the configured SQL refused.
    pub fn check(&self) -> Result<(), NotReady> {
        match self.stage() {
            Stage::Starting => return Err(NotReady::Starting),
            Stage::Unmigrated => return Err(NotReady::Unmigrated),
            Stage::Migrated => {}
        }
        match self.sql_check.status() {
            sqlcheck::Status::Refused(refused) => Err(NotReady::Refused(refused.to_string())),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stage_only_moves_up() {
        let r = Readiness::starting();
        assert_eq!(r.check(), Err(NotReady::Starting));
        r.advance(Stage::Unmigrated);
        assert_eq!(r.check(), Err(NotReady::Unmigrated));
        r.advance(Stage::Starting);
        assert_eq!(r.stage(), Stage::Unmigrated);
        r.advance(Stage::Migrated);
        r.advance(Stage::Unmigrated);
        assert!(r.is_migrated());
        assert_eq!(
            r.check(),
            Ok(()),
            "a pending SQL check does not hold readiness"
        );
    }

    #[tokio::test]
    async fn waiting_ends_when_migrated_or_cancelled() {
        let r = Readiness::starting();
        let cancel = CancellationToken::new();
        let waiter = tokio::spawn({
            let r = r.clone();
            let cancel = cancel.clone();
            async move { r.wait_migrated(&cancel).await }
        });
        r.advance(Stage::Unmigrated);
        r.advance(Stage::Migrated);
        assert!(waiter.await.expect("the waiter"));
        let r = Readiness::starting();
        cancel.cancel();
        assert!(!r.wait_migrated(&cancel).await);
    }
}
