//! What `deprov-lab bench corpus` prints: [`CorpusReport`], one line per (schema, tenant) and the
//! worst and median figures.

use serde::Serialize;

use super::data::LoadTimes;
use crate::bench::target::TargetReport;
use crate::bench::target_report::one_line;

/// One generated schema as loaded.
#[derive(Debug, Clone, Serialize)]
pub struct CorpusSchema {
    /// Its seed.
    pub seed: u64,
    /// The scratch database it was loaded into (dropped after its runs).
    pub database: String,
    /// Tables, partitions not counted.
    pub tables: usize,
    /// Tables in the tenant's closure as deprov's plan finds them (`plan.closure.len()`).
    pub closure_tables: usize,
    /// Foreign keys (a partitioned table's counted once).
    pub foreign_keys: usize,
    /// Foreign keys without an index leading with their column.
    pub unindexed_foreign_keys: usize,
    /// Rows over every table.
    pub rows: i64,
    /// Rows of the large tenant over the closure.
    pub large_rows: i64,
    /// Rows of the small tenant behind the large one, over the closure.
    pub small_rows: i64,
    /// The load's phases, in s.
    pub load: LoadTimes,
}

/// One benchmarked (schema, tenant), run one or more times (`--repeat`).
#[derive(Debug, Clone, Serialize)]
pub struct CorpusRun {
    /// The schema's seed.
    pub seed: u64,
    /// `large` or `small` (the small tenant behind the skew).
    pub tenant_size: String,
    /// The tenant key as a deletion request gives it.
    pub tenant: String,
    /// Tables in the closure.
    pub closure_tables: usize,
    /// `deprov-lab bench delete --target-url`'s report of the run with the median ratio (the lower
    /// of the two middle ones for an even count); `None` when a run failed.
    pub report: Option<TargetReport>,
    /// Every run's ratio (cascade ÷ deprov), in run order.
    pub ratios: Vec<f64>,
    /// The longest transaction sampled on deprov's copy over every run, in ms.
    pub longest_ms: Option<f64>,
    /// That transaction's statement as sampled.
    pub longest_query: Option<String>,
    /// Whether every run ended with deprov's copy equal to the cascade's.
    pub all_equal: bool,
    /// Why a run failed, when one did (the runs stop there).
    pub error: Option<String>,
}

impl CorpusRun {
    /// The (schema, tenant) `(seed, size, tenant, closure tables)` from its runs' reports, in run
    /// order, and the error that stopped them, if any.
    pub fn new(
        (seed, size, tenant, closure_tables): (u64, &str, String, usize),
        reports: Vec<TargetReport>,
        error: Option<String>,
    ) -> Self {
        let ratios: Vec<f64> = reports.iter().map(|r| r.ratio).collect();
        let longest = reports
            .iter()
            .filter_map(|r| r.sampled.longest.as_ref())
            .max_by(|a, b| a.ms.total_cmp(&b.ms));
        let (longest_ms, longest_query) = (longest.map(|t| t.ms), longest.map(|t| t.query.clone()));
        let all_equal = !reports.is_empty() && reports.iter().all(|r| r.equals_cascade);
        let mut by_ratio = reports;
        by_ratio.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
        let median = by_ratio.len().saturating_sub(1) / 2;
        let report = if error.is_none() {
            by_ratio.into_iter().nth(median)
        } else {
            None
        };
        Self {
            seed,
            tenant_size: size.to_owned(),
            tenant,
            closure_tables,
            report,
            ratios,
            longest_ms,
            longest_query,
            all_equal: all_equal && error.is_none(),
            error,
        }
    }

    /// The lowest and highest ratio of its runs.
    pub fn ratio_range(&self) -> Option<(f64, f64)> {
        let low = self.ratios.iter().copied().reduce(f64::min)?;
        let high = self.ratios.iter().copied().reduce(f64::max)?;
        Some((low, high))
    }
}

/// The worst and the median of one figure over the runs that produced it.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    /// Runs that produced the figure.
    pub runs: usize,
    /// The worst value (lowest ratio, longest transaction).
    pub worst: f64,
    /// The median (mean of the two middle values for an even count).
    pub median: f64,
}

impl Spread {
    /// Worst and median of `values`; `lower_is_worse` for a ratio, else the highest is worst.
    pub fn of(mut values: Vec<f64>, lower_is_worse: bool) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Self {
            runs: n,
            worst: if lower_is_worse {
                values[0]
            } else {
                values[n - 1]
            },
            median,
        }
    }
}

/// Everything `deprov-lab bench corpus` prints.
#[derive(Debug, Clone, Serialize)]
pub struct CorpusReport {
    /// Row scale (1.0: the large tenant owns at least 320k rows).
    pub scale: f64,
    /// The schemas, by seed.
    pub schemas: Vec<CorpusSchema>,
    /// The tenants' runs, two tenants per schema (large, then small).
    pub runs: Vec<CorpusRun>,
    /// Cascade wall time ÷ deprov request to completion, over the tenants (each its median run's).
    pub ratio: Spread,
    /// The longest transaction sampled on deprov's copy, in ms, over the tenants (each its longest
    /// over every run).
    pub longest_transaction_ms: Spread,
    /// Whether every run completed with deprov's copy equal to the cascade's.
    pub all_equal: bool,
}

impl CorpusReport {
    /// Builds the summary figures from the schemas and runs.
    pub fn new(scale: f64, schemas: Vec<CorpusSchema>, runs: Vec<CorpusRun>) -> Self {
        let ratio = Spread::of(
            runs.iter()
                .filter_map(|r| r.report.as_ref().map(|r| r.ratio))
                .collect(),
            true,
        );
        let longest = Spread::of(runs.iter().filter_map(|r| r.longest_ms).collect(), false);
        let all_equal = !runs.is_empty() && runs.iter().all(|r| r.all_equal);
        Self {
            scale,
            schemas,
            runs,
            ratio,
            longest_transaction_ms: longest,
            all_equal,
        }
    }

    /// The report as `deprov-lab bench corpus` prints it.
    pub fn to_text(&self) -> String {
        let mut out = format!("corpus at scale {}\n\n", self.scale);
        out.push_str("schemas:\n");
        for s in &self.schemas {
            out.push_str(&format!(
                "  seed {:>3}: {} tables, {} in the closure, {} of {} foreign keys unindexed, {} rows \
                 (large tenant {}, small {}), loaded in {:.1} s (tables {:.1}, rows {:.1}, keys+indexes+ANALYZE {:.1})\n",
                s.seed,
                s.tables,
                s.closure_tables,
                s.unindexed_foreign_keys,
                s.foreign_keys,
                s.rows,
                s.large_rows,
                s.small_rows,
                s.load.total_s(),
                s.load.tables_s,
                s.load.rows_s,
                s.load.constraints_s
            ));
        }
        out.push('\n');
        out.push_str(&format!(
            "{:>4} {:<5} {:>7} {:>8} {:>9} {:>8} {:>6} {:>11} {:>9} {:>9} {:>7} {:>8} {:>8} {:>5}  {}\n",
            "seed",
            "tnt",
            "closure",
            "rows",
            "cascade s",
            "deprov s",
            "ratio",
            "ratios",
            "longest",
            "precheck",
            "batches",
            "rolledbk",
            "bookkeep",
            "equal",
            "longest transaction's query"
        ));
        for r in &self.runs {
            match &r.report {
                Some(t) => {
                    let range = r
                        .ratio_range()
                        .map_or_else(|| "-".into(), |(l, h)| format!("{l:.2}–{h:.2}"));
                    out.push_str(&format!(
                        "{:>4} {:<5} {:>7} {:>8} {:>9.2} {:>8.2} {:>6.2} {:>11} {:>9} {:>9} {:>7} {:>8.0} {:>8.0} {:>5}  {}\n",
                        r.seed,
                        r.tenant_size,
                        r.closure_tables,
                        t.cascade.rows,
                        t.cascade.elapsed_s,
                        t.deprov.elapsed_s,
                        t.ratio,
                        range,
                        r.longest_ms.map_or_else(|| "-".into(), |ms| format!("{ms:.1}")),
                        t.before_soft_delete_ms
                            .map_or_else(|| "-".into(), |m| format!("{m:.0}")),
                        t.batches,
                        t.rolled_back_ms,
                        t.bookkeeping_ms,
                        if r.all_equal { "yes" } else { "NO" },
                        r.longest_query
                            .as_deref()
                            .map_or_else(String::new, |q| one_line(q, 70)),
                    ));
                }
                None => out.push_str(&format!(
                    "{:>4} {:<5} {:>7}  FAILED: {}\n",
                    r.seed,
                    r.tenant_size,
                    r.closure_tables,
                    r.error.as_deref().unwrap_or("unknown")
                )),
            }
        }
        out.push_str(
            "\n(each tenant's figures are its median run's, by ratio; ratios: the lowest and highest \
             of its runs; longest: longest transaction on deprov's copy over its runs, ms, sampled \
             from pg_stat_activity every 5 ms; precheck: ms from the request to the soft delete; \
             rolledbk, bookkeep: ms; equal: every run)\n",
        );
        out.push_str(&format!(
            "ratio cascade ÷ deprov over {} tenants: worst {:.2}, median {:.2}\n",
            self.ratio.runs, self.ratio.worst, self.ratio.median
        ));
        out.push_str(&format!(
            "longest transaction over {} tenants: worst {:.1} ms, median {:.1} ms\n",
            self.longest_transaction_ms.runs,
            self.longest_transaction_ms.worst,
            self.longest_transaction_ms.median
        ));
        out.push_str(&format!(
            "every copy equals the cascade's: {}\n",
            if self.all_equal { "PASS" } else { "FAIL" }
        ));
        out
    }
}
