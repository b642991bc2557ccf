//! What a batch reads before its delete, read by the batch's own statement.
//!
//! Before a batch deletes, it needs the rows deleted so far in the tables PostgreSQL's cascade may
//! delete under it ([`super::deleted_so_far`]), and, while batches committed deferred are not yet
//! flushed, the target's [`Incarnation`] ([`super::before_batch`]). Read by a statement of their
//! own, they cost the batch one more round trip. A [`Probe`] adds them to the select list of the
//! batch's statement instead:
//!
//! - The counters of the tables *below* the step are still the ones before the batch while its
//!   statement runs: PostgreSQL fires the referential actions, which delete those rows, as
//!   `AFTER` triggers at the end of the statement (PostgreSQL docs, *Triggers*, "Overview of
//!   Trigger Behavior": row-level `AFTER` triggers fire at the end of the statement; *Queries*,
//!   "WITH Queries", data-modifying statements: the whole query's). The step's own
//!   table is not one of them: its counter moves while the statement deletes, in an order the
//!   plan decides, so a tree's step (whose cascade deletes in its own table) reads before its
//!   statement as before.
//! - The incarnation read after the delete, in the same transaction, tells the same as one read
//!   before it: a restart between the last checkpoint and the batch's `BEGIN` shows either way,
//!   and the batch's transaction rolls back instead of committing. When the statement fails, the
//!   failure may come from the restart itself (a `NO ACTION` key to rows that came back):
//!   [`Probe::failed`] then reads the incarnation on its own and reports the restart instead.

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgPool, Postgres, Row, Transaction};

use super::{BatchLimits, EngineError, Incarnation, durability};
use crate::sql::{SqlBuilder, Statement};

/// The reads a batch's statement carries for the batch: the counters of `counted` (table oids) and,
/// with `unchanged`, the incarnation to compare.
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe<'a> {
    unchanged: Option<&'a Incarnation>,
    counted: &'a [u32],
}

impl<'a> Probe<'a> {
    /// A probe of `counted` (none of them the step's own table) and, with `unchanged`, of the
    /// incarnation.
    pub(super) fn new(unchanged: Option<&'a Incarnation>, counted: &'a [u32]) -> Self {
        Self { unchanged, counted }
    }

    /// `stmt` (a statement ending in its select list) with the probe's columns appended: the
    /// incarnation's two text columns when there is one to compare, then the counters as one
    /// `int8[]` of `$param` (an `int8[]` of oids, bound by [`Self::bind`]) when there are tables to
    /// count. `stmt` unchanged when the probe reads nothing.
    pub(super) fn append(&self, stmt: &Statement, param: usize) -> Statement {
        let mut b = SqlBuilder::extend(stmt);
        if self.unchanged.is_some() {
            b.sql(", ").sql(durability::incarnation_columns!());
        }
        if !self.counted.is_empty() {
            b.sql(concat!(", ", super::deleted_counts_head!()))
                .param(param)
                .sql(super::deleted_counts_tail!());
        }
        b.build()
    }

    /// `query` with the counted oids bound, when [`Self::append`] added their parameter.
    fn bind<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        if self.counted.is_empty() {
            query
        } else {
            query.bind(
                self.counted
                    .iter()
                    .map(|&t| i64::from(t))
                    .collect::<Vec<_>>(),
            )
        }
    }

    /// The probe's columns of `row`, from column `first` on: the counters per counted table (oid,
    /// rows), after checking the incarnation.
    ///
    /// # Errors
    /// [`EngineError::TargetRestarted`] when the incarnation differs (the caller must not commit);
    /// a decoding error.
    pub(super) fn read(&self, row: &PgRow, first: usize) -> Result<Vec<(u32, i64)>, EngineError> {
        let mut at = first;
        if let Some(was) = self.unchanged {
            let now = Incarnation {
                started: row.try_get(at)?,
                stats_reset: row.try_get(at + 1)?,
            };
            durability::expect(was, now)?;
            at += 2;
        }
        if self.counted.is_empty() {
            return Ok(Vec::new());
        }
        let counts: Vec<i64> = row.try_get(at)?;
        Ok(self.counted.iter().copied().zip(counts).collect())
    }

    /// Runs `query` (a statement [`Self::append`] extended, its own parameters bound) in `tx` with
    /// the probe's parameter bound, and returns `tx` and the row. When the statement fails, rolls
    /// `tx` back and returns [`Self::failed`]'s error.
    ///
    /// # Errors
    /// As [`Self::failed`].
    pub(super) async fn fetch_one(
        &self,
        mut tx: Transaction<'static, Postgres>,
        query: Query<'_, Postgres, PgArguments>,
        target: &PgPool,
        limits: &BatchLimits,
    ) -> Result<(Transaction<'static, Postgres>, PgRow), EngineError> {
        match self.bind(query).fetch_one(&mut *tx).await {
            Ok(row) => Ok((tx, row)),
            Err(e) => {
                // Rolled back first: reading the incarnation may need a connection of the pool.
                drop(tx.rollback().await);
                Err(self.failed(target, limits, e).await)
            }
        }
    }

    /// After the probed statement failed with `error` (its transaction rolled back): when there is
    /// an incarnation to compare and the target's differs, the restart
    /// ([`EngineError::TargetRestarted`]) — what the batch would have met before its delete —
    /// else `error`. The incarnation is read in a transaction of its own under `limits`.
    pub(super) async fn failed(
        &self,
        target: &PgPool,
        limits: &BatchLimits,
        error: sqlx::Error,
    ) -> EngineError {
        if let Some(was) = self.unchanged
            && let Ok(now) = durability::incarnation(target, limits).await
            && *was != now
        {
            return EngineError::TargetRestarted {
                was: was.clone(),
                now,
            };
        }
        error.into()
    }
}
