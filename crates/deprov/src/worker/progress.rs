//! A job's progress (shown to operators) and checkpoint (where the hard delete resumes), both stored
//! as jsonb on the job row and written together at every batch boundary.

use serde::{Deserialize, Serialize};

/// Rows deleted from one table so far.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TableProgress {
    /// Quoted, qualified table name.
    pub table: String,
    /// Rows deleted by deprov's batches in this table.
    pub rows_deleted: i64,
    /// Whether all of the table's steps are finished.
    pub done: bool,
    /// Longest batch transaction on this table, in milliseconds.
    #[serde(default)]
    pub longest_batch_ms: f64,
    /// Batches on this table.
    #[serde(default)]
    pub batches: i64,
    /// Time in this table's batch transactions, in milliseconds (rows/s = rows_deleted / this).
    #[serde(default)]
    pub batch_ms: f64,
}

/// Operator-facing progress (`deprov.jobs.progress`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Progress {
    /// Rows deleted so far, all tables.
    pub rows_deleted: i64,
    /// The table the current or last batch worked on.
    pub current_table: Option<String>,
    /// Per table, in deletion order.
    pub tables: Vec<TableProgress>,
    /// Batches committed.
    pub batches: i64,
    /// Whether the tenant was deleted by its whole cascade in one transaction, counted as one
    /// batch (`engine::whole`).
    pub whole_cascade: bool,
    /// Longest batch transaction, BEGIN to COMMIT, in milliseconds (committed batches).
    pub longest_batch_ms: f64,
    /// Batches that hit `statement_timeout` or `lock_timeout`, rolled back and were retried smaller.
    pub timeouts: i64,
    /// Steps whose batches ran under the full `[hard_delete] statement_timeout` instead of the
    /// batch bound (⅘ of `max_batch_duration`), because a batch of one row, or the step's batches
    /// again and again, could not finish within the bound; and the root row's step, which always
    /// runs under the full `statement_timeout` (its one row cannot be split), when its delete took
    /// longer than `max_batch_duration` (`worker::run::hard_delete`).
    pub unbounded_steps: i64,
    /// Batches cut short by the batch bound and retried reading first where their rows begin,
    /// apart from their ordered scan (`engine::queries::batch`'s `jump`).
    pub jumps: i64,
    /// Times the job re-planned with a lower `cascade_rows` because one parent row's cascade
    /// outlasted its batch (see `engine::absorb`).
    pub replans: i64,
    /// The `cascade_rows` in use after the last re-plan.
    pub cascade_rows: Option<u32>,
    /// Extra passes over a table's steps for rows kept back while still referenced through a
    /// non-CASCADE self-reference, and one-statement sweeps of what no pass could delete.
    pub held_passes: i64,
    /// Sweeps (see `held_passes`).
    pub held_sweeps: i64,
    /// Rows updated before the first batch as the cascade's SET NULL / SET DEFAULT would leave them,
    /// because those updates keep them out of a later CASCADE (`engine::simulate::preset`).
    pub presets: u64,
    /// Read-only statements that marked a large parent's dead index entries after its children
    /// were deleted (`engine::range_batch`).
    pub index_passes: i64,
    /// The longest of their transactions, in milliseconds (they hold no row locks).
    pub longest_index_pass_ms: f64,
    /// All their time, in milliseconds.
    pub index_pass_ms: f64,
    /// Time of the hard delete spent on deprov's state database between batches (the kill-switch
    /// check before each batch, the checkpoint after it), in milliseconds.
    pub bookkeeping_ms: f64,
    /// Longest of those rolled-back batch transactions, in milliseconds (locks were held this long);
    /// the trial cascade's transaction counts too.
    pub longest_rolled_back_ms: f64,
    /// All the time of batch transactions that rolled back on a timeout (the trial's not
    /// included), in milliseconds: work the retries smaller redid.
    pub rolled_back_ms: f64,
    /// The trial cascade's verdict (`engine::trial`): `succeeds`, `no tenant`, `deletes nothing`,
    /// `fails: …` or `undecided: …` (the simulation decided); none when it did not run.
    pub trial: Option<String>,
    /// The trial cascade's transactions, BEGIN to ROLLBACK (or COMMIT, for a whole cascade that
    /// fitted), summed over every try of every run, in milliseconds.
    pub trial_ms: f64,
    /// Runs of the job that ran the pre-checks before the hard delete (user `DELETE` triggers,
    /// the trial cascade, the simulation: those that apply). Once the soft delete committed, runs
    /// keep their verdict (`prechecked_plan`), so this stays at one run per schema (plus the run
    /// after a grace period).
    pub prechecks: i64,
    /// The hash of the plan ([`crate::engine::Plan::hash`], leaves first as loaded) whose
    /// pre-checks passed for the hard delete: written with the soft delete (without a grace
    /// period) or by the first run after the grace period. A run at step `hard_delete` that loads
    /// a plan of this hash skips the pre-checks; another hash (the schema changed) runs them again.
    pub prechecked_plan: Option<String>,
    /// Pauses for the target's sake (see [`crate::config::PacingConfig`]).
    pub pauses: i64,
    /// Time spent in those pauses, in milliseconds.
    pub paused_ms: f64,
    /// Time spent waiting for the `[pacing] rate_limit`, in milliseconds (not counted in `pauses`).
    pub rate_limited_ms: f64,
    /// Time spent resting for the `[pacing] duty_cycle`, in milliseconds (not counted in `pauses`;
    /// added when a rest ends).
    pub duty_cycle_ms: f64,
    /// While the job rests for the `[pacing] duty_cycle` for a second or more: when the rest ends
    /// (RFC 3339, UTC, the worker's clock). Written before the rest begins; cleared by the first
    /// checkpoint after it ends (there is no rest after a job's last batch). A run stopped during the rest
    /// (SIGTERM, a kill switch, a worker that died) leaves it, and the job's next claim hands the
    /// job back `queued` until then (at most the rest a whole `[worker] lease` of work earns),
    /// before any statement on the target, so restarts do not undo the duty cycle. Such a wait is
    /// not added to `duty_cycle_ms`, which counts rests a worker waited.
    pub resting_until: Option<String>,
    /// Why the last pause was taken.
    pub last_pause_reason: Option<String>,
    /// Rows the soft-delete statements affected.
    pub soft_deleted_rows: Option<u64>,
    /// When the soft delete committed (RFC 3339).
    pub soft_deleted_at: Option<String>,
    /// The soft delete's transaction, from acquiring its connection to its commit, in
    /// milliseconds (0 before it ran): with `soft_deleted_at`, when the first statement that
    /// changes the tenant's data began.
    pub soft_delete_ms: f64,
    /// While the job waits out `[hard_delete] grace_period` after its soft delete: when the hard
    /// delete may start (RFC 3339). Until then the job can be cancelled and its soft delete undone.
    pub grace_until: Option<String>,
    /// When the hard delete started (RFC 3339): from then on nothing can be undone.
    pub hard_delete_started_at: Option<String>,
    /// The plan the checkpoint belongs to.
    pub plan_hash: Option<String>,
    /// A note for operators (e.g. why nothing was deleted).
    pub note: Option<String>,
    /// Times the job went back to its last checkpoint with batches after it that had committed
    /// deferred (`[hard_delete] checkpoint_interval`) and may have been lost: the target restarted
    /// ([`crate::engine::Incarnation`]) or the run ended before they were made durable. The row
    /// counts go back to the checkpoint's ([`Self::rewind_to`]) and the redone batches count what
    /// they find, so `rows_deleted` never counts a row twice; rows deleted by batches after the
    /// checkpoint that survived are not counted (`docs/known-limits.md`). A run rewinds at most once
    /// for a restart: its later batches are durable and each is checkpointed.
    pub rewinds: i64,
}

impl Progress {
    /// Counts a read-only index pass ([`crate::engine::kill_dead_entries`]).
    pub fn record_index_pass(&mut self, pass: &crate::engine::IndexPass, elapsed_ms: f64) {
        self.index_passes += i64::from(pass.statements);
        self.index_pass_ms += elapsed_ms;
        self.longest_index_pass_ms = self.longest_index_pass_ms.max(pass.longest_ms);
    }

    /// Parses stored progress; unknown or missing fields fall back to defaults.
    pub fn from_json(v: &serde_json::Value) -> Self {
        serde_json::from_value(v.clone()).unwrap_or_default()
    }

    /// The stored form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Goes back to the row counts of `durable`, the progress written with the last checkpoint:
    /// `rows_deleted`, each table's `rows_deleted` and `done`, and `current_table` (a table
    /// `durable` does not list is back at 0 rows). Counts of work done (batches, timeouts, time)
    /// stay: the redone batches are counted as the transactions they are. Adds one to `rewinds`.
    pub fn rewind_to(&mut self, durable: &Self) {
        self.rows_deleted = durable.rows_deleted;
        self.current_table.clone_from(&durable.current_table);
        for t in &mut self.tables {
            let was = durable.tables.iter().find(|d| d.table == t.table);
            t.rows_deleted = was.map_or(0, |d| d.rows_deleted);
            t.done = was.is_some_and(|d| d.done);
        }
        self.rewinds += 1;
    }

    /// Adds one batch's figures.
    pub fn record_batch(&mut self, table: &str, deleted: i64, elapsed_ms: f64) {
        self.rows_deleted += deleted;
        self.batches += 1;
        self.longest_batch_ms = self.longest_batch_ms.max(elapsed_ms);
        self.current_table = Some(table.to_owned());
        let t = self.table_mut(table);
        t.rows_deleted += deleted;
        t.longest_batch_ms = t.longest_batch_ms.max(elapsed_ms);
        t.batches += 1;
        t.batch_ms += elapsed_ms;
    }

    /// Adds rows PostgreSQL's cascade deleted in `table` under a batch of another table.
    pub fn record_cascaded(&mut self, table: &str, deleted: i64) {
        self.rows_deleted += deleted;
        self.table_mut(table).rows_deleted += deleted;
    }

    /// The entry of `table` (quoted, qualified), if it has one.
    pub fn table(&self, table: &str) -> Option<&TableProgress> {
        self.tables.iter().find(|t| t.table == table)
    }

    /// The entry of `table`, created (in order of first appearance) when missing.
    pub fn table_mut(&mut self, table: &str) -> &mut TableProgress {
        if let Some(i) = self.tables.iter().position(|t| t.table == table) {
            return &mut self.tables[i];
        }
        self.tables.push(TableProgress {
            table: table.to_owned(),
            ..TableProgress::default()
        });
        self.tables.last_mut().expect("just pushed")
    }
}

/// Where the hard delete resumes (`deprov.jobs.checkpoint`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Checkpoint {
    /// [`crate::engine::Plan::hash`] of the plan the step numbers refer to.
    pub plan: String,
    /// The next step to run (index into the plan's steps).
    pub step: usize,
    /// Keyset position within that step.
    pub cursor: crate::engine::Cursor,
    /// Parent rows per batch (adapted to the children's fan-out).
    pub parents: i64,
    /// The `cascade_rows` of the plan in use (see `engine::absorb`), when lowered from the
    /// configured value because one parent row's cascade outlasted its batch (0 = leaves first).
    #[serde(default)]
    pub cascade_rows: Option<u32>,
    /// The most rows the tenant holds per table with a key straight to the root (oid → rows: the
    /// planner's estimate and the rows written since, `engine::estimate::DirectRows::at_most`)
    /// that the plan in use was absorbed with (`engine::Plan::absorb_tenant`): a later run plans
    /// with the same figures, so the plan and its step numbers stay the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_rows: Option<std::collections::BTreeMap<u32, i64>>,
    /// Rows per batch (adapted to the measured batch time).
    pub rows: i64,
    /// Rows the current pass over the current table's steps kept back (see
    /// `Plan::held_self_refs`): still referenced through a non-CASCADE self-reference.
    #[serde(default)]
    pub kept_back: i64,
    /// Rows the current pass over the current table's steps deleted.
    #[serde(default)]
    pub pass_deleted: i64,
}

impl Checkpoint {
    /// Parses a stored checkpoint.
    pub fn from_json(v: Option<&serde_json::Value>) -> Option<Self> {
        v.and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// The stored form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}
