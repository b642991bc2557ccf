//! `deprov-lab bench cascade-incident`, `deadline-incident` and `intake`: the two incidents of
//! `shared/notes/incidents.md` replayed on loopback through a real PgBouncer (Debian's 1.18, transaction
//! pooling), the naive path beside deprov, and intake's throughput beside pgbench.
//!
//! Shared parts: [`stage`] starts the throwaway PostgreSQL (durable settings), its databases and the
//! PgBouncer, and deprov in-process (`DEPROV_POOLER_MODE=transaction` when through PgBouncer);
//! [`load`] is a fixed-rate open-loop scheduler (latency counted from each operation's scheduled time,
//! so a stalled system cannot hide its queue); [`sampler`] reads PgBouncer's `SHOW POOLS` and
//! PostgreSQL's `pg_locks` / `pg_stat_activity` every 50 ms. Each bench returns a report whose
//! `to_text()` is the printed table and whose [`Goal`]s print as `PASS` or `MISSED`.

pub mod cascade;
pub mod deadline;
pub mod foreground;
pub mod intake;
pub mod load;
pub mod pgbench;
pub mod sampler;
pub mod stage;

use serde::Serialize;

/// Why a replay could not run (a missed goal is not an error: it is a figure to read).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// PostgreSQL or PgBouncer could not be started.
    #[error(transparent)]
    Server(#[from] deprov_testkit::ThrowawayError),
    /// A database step failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// deprov did not start.
    #[error("starting deprov: {0}")]
    App(#[from] deprov::app::AppError),
    /// Migrating deprov's state database failed.
    #[error("migrating: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A file step failed (configuration, pgbench script).
    #[error("file: {0}")]
    Io(#[from] std::io::Error),
    /// The run itself went wrong (an HTTP setup call failed, a job did not complete, pgbench failed).
    #[error("{0}")]
    Run(String),
}

/// One goal of a bench and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    /// What is asked, with the figure measured.
    pub goal: String,
    /// Met in this run.
    pub passed: bool,
}

impl Goal {
    /// A goal line.
    pub fn new(goal: String, passed: bool) -> Self {
        Self { goal, passed }
    }
}

/// The goals as `PASS`/`MISSED` lines.
pub fn goal_lines(goals: &[Goal]) -> String {
    goals
        .iter()
        .map(|g| {
            format!(
                "{}: {}\n",
                if g.passed { "PASS  " } else { "MISSED" },
                g.goal
            )
        })
        .collect()
}

/// Two-column table rows: `name`, the naive side's figure, deprov's.
pub(crate) fn row(
    out: &mut String,
    name: &str,
    a: impl std::fmt::Display,
    b: impl std::fmt::Display,
) {
    out.push_str(&format!("{name:<52} {a:>14} {b:>14}\n"));
}

/// `x / y`, or 0 when `y` is 0.
pub(crate) fn ratio(x: f64, y: f64) -> f64 {
    if y > 0.0 { x / y } else { 0.0 }
}
