//! How `deprov-lab bench delete` prints its [`BenchReport`]: a table, then one `PASS`/`MISSED` line per
//! target (ratio, longest transaction, foreground p99).

use serde::Serialize;

use super::paced::Paced;
use super::side::{Side, TimeSplit};

/// Everything the benchmark prints.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Tables of the schema.
    pub tables: usize,
    /// The naive cascade.
    pub cascade: Side,
    /// deprov's job.
    pub deprov: Side,
    /// The paced window (absent with `--paced-secs 0`).
    pub paced: Option<Paced>,
    /// Foreground p99 latency with no deletion running (both halves of the baseline pooled), in ms.
    pub foreground_baseline_p99_ms: f64,
    /// Foreground median latency with no deletion running, in ms.
    pub foreground_baseline_p50_ms: f64,
    /// Foreground writes' p99 latency with no deletion running, in ms.
    pub foreground_baseline_write_p99_ms: f64,
    /// Foreground reads' p99 latency with no deletion running, in ms.
    pub foreground_baseline_read_p99_ms: f64,
    /// Foreground operations timed for the baseline.
    pub foreground_baseline_ops: usize,
    /// Foreground p99 of the baseline's first half (before the deletions), in ms.
    pub foreground_baseline_before_p99_ms: f64,
    /// Foreground p99 of the baseline's second half (after deprov's job), in ms.
    pub foreground_baseline_after_p99_ms: f64,
    /// deprov rows/s ÷ cascade rows/s (target: ≥ 0.6).
    pub ratio: f64,
    /// Whether the database deprov worked on equals the cascade's copy, table by table.
    pub equals_cascade: bool,
    /// Batches that hit the statement or lock timeout (each retried smaller).
    pub deprov_timeouts: i64,
    /// deprov's read-only passes over a large parent's index range (`engine::range_batch`).
    pub deprov_index_passes: i64,
    /// deprov's per-table figures, in deletion order (the job's `progress.tables`).
    pub deprov_tables: serde_json::Value,
    /// Where deprov's elapsed time went, in ms.
    pub deprov_time: TimeSplit,
}

impl BenchReport {
    /// The report as the table `deprov-lab bench delete` prints.
    pub fn to_text(&self) -> String {
        let mut out = self.sides_text();
        out.push_str(&tables_text(&self.deprov_tables));
        out.push_str(&self.baseline_line());
        out.push_str(&self.deprov_time.line());
        out.push_str(&self.targets_text());
        if let Some(p) = &self.paced {
            out.push_str(&self.paced_text(p));
        }
        out.push_str(&format!(
            "database equals the cascade's copy ({} tables): {}\n",
            self.tables,
            if self.equals_cascade { "PASS" } else { "FAIL" }
        ));
        out
    }

    /// A foreground p99 (ms) as a multiple of the baseline's p99 (0 without a baseline).
    fn rel(&self, p: f64) -> f64 {
        let base = self.foreground_baseline_p99_ms;
        if base > 0.0 { p / base } else { 0.0 }
    }

    /// The table of the sides, one column each (cascade, deprov, paced), one figure a line.
    fn sides_text(&self) -> String {
        let mut out = String::new();
        let mut sides = vec![&self.cascade, &self.deprov];
        let mut names = vec!["cascade".to_owned(), "deprov".to_owned()];
        if let Some(p) = &self.paced {
            sides.push(&p.side);
            names.push(format!("paced {}", p.duty_cycle));
        }
        let mut row = |name: &str, cells: Vec<String>| {
            out.push_str(&format!("{name:<44}"));
            for cell in cells {
                out.push_str(&format!(" {cell:>14}"));
            }
            out.push('\n');
        };
        row("", names);
        let mut each = |name: &str, f: &dyn Fn(&Side) -> String| {
            row(name, sides.iter().map(|s| f(s)).collect());
        };
        each("rows deleted", &|s| s.rows.to_string());
        each("elapsed (s)", &|s| format!("{:.2}", s.elapsed_s));
        each("rows/s", &|s| format!("{:.0}", s.rows_per_s));
        each("transactions", &|s| s.transactions.to_string());
        each("longest transaction (ms)", &|s| {
            format!("{:.1}", s.longest_transaction_ms)
        });
        each("longest rolled-back transaction (ms)", &|s| {
            // The cascade is one transaction that commits.
            if s.transactions == 1 {
                "-".into()
            } else {
                format!("{:.1}", s.longest_rolled_back_ms)
            }
        });
        each("tenant writer: longest wait (ms)", &|s| {
            format!("{:.1}", s.tenant_writer_longest_wait_ms)
        });
        each("foreground p99 (ms)", &|s| {
            format!("{:.2}", s.foreground_p99_ms)
        });
        each("foreground p99 ÷ baseline p99", &|s| {
            format!("{:.2}", self.rel(s.foreground_p99_ms))
        });
        each("foreground p50 (ms)", &|s| {
            format!("{:.2}", s.foreground_p50_ms)
        });
        each("foreground writes p99 (ms)", &|s| {
            format!("{:.2}", s.foreground_write_p99_ms)
        });
        each("foreground reads p99 (ms)", &|s| {
            format!("{:.2}", s.foreground_read_p99_ms)
        });
        each("foreground ops (errors)", &|s| {
            format!("{} ({})", s.foreground_ops, s.foreground_errors)
        });
        out
    }

    /// The line of the foreground baseline's figures, deprov's timeouts and index passes.
    fn baseline_line(&self) -> String {
        format!(
            "\nforeground baseline ({} ops, before and after the deletions): p99 {:.2} ms (before \
             {:.2}, after {:.2}), p50 {:.2} ms, writes p99 {:.2} ms, reads p99 {:.2} ms; deprov batches \
             that hit a timeout: {}; deprov's read-only index passes: {}\n",
            self.foreground_baseline_ops,
            self.foreground_baseline_p99_ms,
            self.foreground_baseline_before_p99_ms,
            self.foreground_baseline_after_p99_ms,
            self.foreground_baseline_p50_ms,
            self.foreground_baseline_write_p99_ms,
            self.foreground_baseline_read_p99_ms,
            self.deprov_timeouts,
            self.deprov_index_passes
        )
    }

    /// The `met`/`MISSED` lines of the ratio, deprov's longest transaction and the foreground p99.
    fn targets_text(&self) -> String {
        let (c, d) = (&self.cascade, &self.deprov);
        let mut out = format!(
            "ratio deprov ÷ cascade rows/s: {:.2} (target ≥ 0.6: {})\n",
            self.ratio,
            met(self.ratio >= 0.6)
        );
        out.push_str(&format!(
            "deprov's longest transaction: {:.1} ms, rolled back included (target ≤ 100 ms: {})\n",
            d.longest_transaction_ms.max(d.longest_rolled_back_ms),
            met(d.longest_transaction_ms.max(d.longest_rolled_back_ms) <= 100.0)
        ));
        out.push_str(&format!(
            "foreground p99 under deprov: {:.2}× baseline (target ≤ 1.25×: {}); under the cascade: \
             {:.2}×\n",
            self.rel(d.foreground_p99_ms),
            met(self.rel(d.foreground_p99_ms) <= 1.25),
            self.rel(c.foreground_p99_ms)
        ));
        out
    }

    /// The paced window's lines: its run, its foreground p99 against the segments with no worker,
    /// and each segment's p99.
    fn paced_text(&self, p: &Paced) -> String {
        let window = if p.completed {
            format!("the tenant completed in {:.1} s", p.side.elapsed_s)
        } else {
            format!("{:.0} s of {:.1} s", p.worker_s, p.side.elapsed_s)
        };
        let mut out = format!(
            "deprov paced (duty_cycle {}): ran {} segments of {:.0} s, each after one with no \
             worker ({window}); in its statements {:.2}% of the time it ran (its trial cascade \
             included); {:.0} rows/s over the window\n",
            p.duty_cycle,
            p.segments,
            p.segment_s,
            p.worked_share * 100.0,
            p.side.rows_per_s,
        );
        out.push_str(&format!(
            "foreground p99 under deprov paced: {:.2} ms against {:.2} ms in the segments with \
             no worker ({} ops): {:.2}× (target ≤ 1.25×: {}); {:.2}× the baseline before and \
             after\n",
            p.side.foreground_p99_ms,
            p.baseline_p99_ms,
            p.baseline_ops,
            p.ratio(),
            met(p.ratio() <= 1.25),
            self.rel(p.side.foreground_p99_ms),
        ));
        let list = |v: &[f64]| {
            v.iter()
                .map(|ms| format!("{ms:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        out.push_str(&format!(
            "  each segment's p99 (ms), no worker: {}; worker: {}\n",
            list(&p.idle_segments_p99_ms),
            list(&p.worker_segments_p99_ms),
        ));
        out
    }
}

pub(super) fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// deprov's figures per table (the job's `progress.tables`), one line each under a heading.
pub(super) fn tables_text(tables: &serde_json::Value) -> String {
    let mut out = format!(
        "\n{:<44} {:>10} {:>8} {:>10} {:>10} {:>12}\n",
        "deprov per table", "rows", "batches", "total ms", "longest ms", "rows/s"
    );
    out.push_str(
        "(a table with rows and 0 batches was emptied by PostgreSQL's cascade under the batches of\n \
         its parents, whose time and rows/s include it, or, with 1 batch in all, by the whole\n \
         cascade in one transaction: the trial cascade that committed)\n",
    );
    for t in tables.as_array().into_iter().flatten() {
        let rows = t["rows_deleted"].as_i64().unwrap_or(0);
        let ms = t["batch_ms"].as_f64().unwrap_or(0.0);
        out.push_str(&format!(
            "{:<44} {:>10} {:>8} {:>10.0} {:>10.1} {:>12.0}\n",
            t["table"].as_str().unwrap_or("?"),
            rows,
            t["batches"].as_i64().unwrap_or(0),
            ms,
            t["longest_batch_ms"].as_f64().unwrap_or(0.0),
            if ms > 0.0 {
                rows as f64 * 1000.0 / ms
            } else {
                0.0
            }
        ));
    }
    out
}

impl TimeSplit {
    /// The line `deprov's time (ms): batches …, other …`.
    pub(super) fn line(&self) -> String {
        format!(
            "deprov's time (ms): batches {:.0}, index passes {:.0}, state database {:.0}, trial cascade \
             {:.0}, rolled-back batches {:.0}, pacing {:.0}, other {:.0}\n",
            self.batches,
            self.index_passes,
            self.bookkeeping,
            self.trial,
            self.rolled_back,
            self.pacing,
            self.other
        )
    }
}
