//! What `deprov-lab bench delete --target-url` prints: [`TargetReport`] and its text.

use std::time::Duration;

use serde::Serialize;

use super::delete_report::{met, tables_text};
use super::side::TimeSplit;
use deprov_testkit::transactions::{Sampled, SeenTransaction};

/// Figures of one deletion on a copy of the user's database.
#[derive(Debug, Clone, Serialize)]
pub struct TargetSide {
    /// Rows deleted.
    pub rows: i64,
    /// Wall time, in s: the cascade's transaction; deprov's request to its job's end.
    pub elapsed_s: f64,
    /// Rows deleted per second of wall time.
    pub rows_per_s: f64,
    /// The longest committed transaction, in ms (deprov: from its progress, its read-only index
    /// passes included).
    pub longest_transaction_ms: f64,
    /// Transactions it committed (deprov: batches).
    pub transactions: i64,
    /// The longest transaction rolled back on a timeout (and deprov's trial cascade), in ms.
    pub longest_rolled_back_ms: f64,
}

impl TargetSide {
    pub(super) fn new(
        rows: i64,
        elapsed: Duration,
        longest_ms: f64,
        transactions: i64,
        longest_rolled_back_ms: f64,
    ) -> Self {
        let secs = elapsed.as_secs_f64();
        Self {
            rows,
            elapsed_s: secs,
            rows_per_s: if secs > 0.0 { rows as f64 / secs } else { 0.0 },
            longest_transaction_ms: longest_ms,
            transactions,
            longest_rolled_back_ms,
        }
    }
}

/// Everything `deprov-lab bench delete --target-url` prints.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    /// The user's database (only copied).
    pub source_database: String,
    /// The copy the cascade ran on.
    pub cascade_copy: String,
    /// The copy deprov ran on.
    pub deprov_copy: String,
    /// deprov's state database for the run.
    pub state_database: String,
    /// Whether the three were kept (`--keep-copies`); else they were dropped.
    pub copies_kept: bool,
    /// The tenant key.
    pub tenant: String,
    /// Tables compared (every schema but PostgreSQL's own).
    pub tables: usize,
    /// The naive cascading `DELETE`.
    pub cascade: TargetSide,
    /// deprov's job.
    pub deprov: TargetSide,
    /// The cascade's wall time ÷ deprov's request-to-completion time (deprov rows/s ÷ cascade
    /// rows/s when both deleted the same rows).
    pub ratio: f64,
    /// deprov's job.
    pub job_id: uuid::Uuid,
    /// From the request's acceptance (its intake transaction committed) to the start of the soft
    /// delete's transaction, the first statement that changes the tenant's data, in ms (lookups,
    /// plan, pre-checks, trial cascade and simulation).
    pub before_soft_delete_ms: Option<f64>,
    /// From the request (its intake transaction's start, `created_at`) to the start of the hard
    /// delete, in ms.
    pub before_hard_delete_ms: Option<f64>,
    /// The soft delete's transaction, in ms.
    pub soft_delete_ms: f64,
    /// Rows the soft delete statements affected.
    pub soft_deleted_rows: u64,
    /// The trial cascade's verdict, when it ran.
    pub trial: Option<String>,
    /// The trial cascade's transaction (rolled back), in ms.
    pub trial_ms: f64,
    /// Time on the state database between batches (kill-switch checks, checkpoints), in ms.
    pub bookkeeping_ms: f64,
    /// Time of batches rolled back on a timeout, in ms.
    pub rolled_back_ms: f64,
    /// Batches committed.
    pub batches: i64,
    /// Batches that hit the statement or lock timeout (each retried smaller).
    pub timeouts: i64,
    /// Re-plans with a lower `cascade_rows`.
    pub replans: i64,
    /// Read-only passes over a large parent's index range.
    pub index_passes: i64,
    /// Where deprov's elapsed time went, in ms.
    pub deprov_time: TimeSplit,
    /// deprov's transactions on its copy as `pg_stat_activity` showed them every 5 ms.
    pub sampled: Sampled,
    /// The cascade's transactions on its copy, sampled the same way (the observer's load on the
    /// server is then the same on both sides).
    pub cascade_sampled: Sampled,
    /// Whether the two copies are equal, table by table, after both deletions.
    pub equals_cascade: bool,
    /// The tables that differ (quoted, qualified), if any.
    pub differing_tables: Vec<String>,
    /// deprov's per-table figures (the job's `progress.tables`).
    pub deprov_tables: serde_json::Value,
    /// What in the run differs from production (e.g. a grace period not waited).
    pub notes: Vec<String>,
}

/// `query` on one line, at most `max` characters.
pub(super) fn one_line(query: &str, max: usize) -> String {
    let flat = query.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}

fn seen(t: Option<&SeenTransaction>) -> String {
    t.map_or_else(
        || "none seen".to_owned(),
        |t| {
            format!(
                "{:.1} ms ({}, {}{}): {}",
                t.ms,
                t.application_name,
                t.state,
                if t.wrote {
                    ", writing"
                } else {
                    ", read-only so far"
                },
                one_line(&t.query, 160)
            )
        },
    )
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0} ms"))
}

impl TargetReport {
    /// The report as `deprov-lab bench delete --target-url` prints it.
    pub fn to_text(&self) -> String {
        let (c, d) = (&self.cascade, &self.deprov);
        let mut out = format!(
            "database {:?}, tenant {:?}: cascade on copy {:?}, deprov on copy {:?} ({} tables)\n\n",
            self.source_database, self.tenant, self.cascade_copy, self.deprov_copy, self.tables
        );
        out.push_str(&format!("{:<44} {:>14} {:>14}\n", "", "cascade", "deprov"));
        let mut row = |name: &str, f: &dyn Fn(&TargetSide) -> String| {
            out.push_str(&format!("{name:<44} {:>14} {:>14}\n", f(c), f(d)));
        };
        row("rows deleted", &|s| s.rows.to_string());
        row("elapsed (s)", &|s| format!("{:.2}", s.elapsed_s));
        row("rows/s", &|s| format!("{:.0}", s.rows_per_s));
        row("transactions", &|s| s.transactions.to_string());
        row("longest transaction (ms)", &|s| {
            format!("{:.1}", s.longest_transaction_ms)
        });
        row("longest rolled-back transaction (ms)", &|s| {
            if s.transactions == 1 {
                "-".into()
            } else {
                format!("{:.1}", s.longest_rolled_back_ms)
            }
        });
        out.push_str(&tables_text(&self.deprov_tables));
        out.push('\n');
        out.push_str(&self.deprov_time.line());
        out.push_str(&format!(
            "before the first destructive statement: {} to the soft delete ({} {}, {:.1} ms), {} to \
             the hard delete; trial cascade {:.1} ms ({})\n",
            opt_ms(self.before_soft_delete_ms),
            self.soft_deleted_rows,
            deprov::engine::report::rows_word(self.soft_deleted_rows),
            self.soft_delete_ms,
            opt_ms(self.before_hard_delete_ms),
            self.trial_ms,
            self.trial.as_deref().unwrap_or("not run"),
        ));
        out.push_str(&format!(
            "batches {}, timeouts {}, re-plans {}, index passes {}; bookkeeping_ms {:.0}, \
             rolled_back_ms {:.0}\n",
            self.batches,
            self.timeouts,
            self.replans,
            self.index_passes,
            self.bookkeeping_ms,
            self.rolled_back_ms
        ));
        let s = &self.sampled;
        out.push_str(&format!(
            "longest transaction on deprov's copy (pg_stat_activity every {:.0} ms, {} samples, one \
             every {:.1} ms; {} transactions seen): {}\n",
            s.period_ms,
            s.samples,
            s.mean_period_ms,
            s.transactions,
            seen(s.longest.as_ref())
        ));
        out.push_str(&format!(
            "  longest that had written: {}\n",
            seen(s.longest_writing.as_ref())
        ));
        let cs = &self.cascade_sampled;
        out.push_str(&format!(
            "longest transaction on the cascade's copy (sampled the same way, {} samples): {}\n",
            cs.samples,
            seen(cs.longest.as_ref())
        ));
        out.push_str(&format!(
            "ratio cascade wall time ÷ deprov request to completion: {:.2} (target ≥ 0.6: {})\n",
            self.ratio,
            met(self.ratio >= 0.6)
        ));
        let longest = d.longest_transaction_ms.max(d.longest_rolled_back_ms);
        out.push_str(&format!(
            "deprov's longest batch: {longest:.1} ms, rolled back included (target ≤ 100 ms: {})\n",
            met(longest <= 100.0)
        ));
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        out.push_str(&format!(
            "copies {}\n",
            if self.copies_kept {
                format!(
                    "kept: {}, {}, {}",
                    self.cascade_copy, self.deprov_copy, self.state_database
                )
            } else {
                "dropped".to_owned()
            }
        ));
        out.push_str(&format!(
            "database equals the cascade's copy ({} tables): {}\n",
            self.tables,
            if self.equals_cascade {
                "PASS".to_owned()
            } else {
                format!("FAIL, differing: {}", self.differing_tables.join(", "))
            }
        ));
        out
    }
}
