//! Running a block-range batch ([`queries::block_batch`]) for a step whose foreign key to its
//! parent has no index ([`Plan::block_step`]).

use std::time::Instant;

use sqlx::{PgPool, Row};

use super::probe::Probe;
use super::{
    BatchLimits, BatchResult, BatchStart, Cursor, EngineError, Plan, deleted_so_far, difference,
    queries,
};

/// Deletes the tenant rows of step `at.step` in the blocks from `at.cursor` (`Cursor::Block`, else
/// the first block) on, `limits.rows` blocks, in one transaction under `limits` that also checks
/// `at.unchanged` as [`super::before_batch`] does (read after the delete, see `probe`); `at.began`
/// is set at its `BEGIN`. The result's `selected`
/// and `deleted` are the rows deleted, `next` the block after the range while the table has more
/// blocks, `cascaded` what PostgreSQL's cascade deleted in absorbed tables below.
///
/// # Errors
/// Database errors (timeouts are retryable: the batch rolled back and can run again).
pub(super) async fn run_blocks(
    target: &PgPool,
    plan: &Plan,
    at: BatchStart<'_>,
    tenant: &str,
    limits: &BatchLimits,
) -> Result<BatchResult, EngineError> {
    let BatchStart {
        step,
        cursor,
        unchanged,
        began,
        ..
    } = at;
    let lo = match cursor {
        Cursor::Block(b) => *b,
        _ => 0,
    };
    let hi = lo.saturating_add(limits.rows.max(1));
    let stmt = queries::block_batch(plan, &plan.steps[step]);
    let conn = crate::db::acquire(target).await?;
    let started = *began.get_or_init(Instant::now);
    let mut tx = crate::db::begin_acquired(conn, limits.bounds()).await?;
    let below = plan.absorbed_below(plan.steps[step].table);
    // The counters before the delete; the incarnation is read after it, with the table's size and
    // the counters after (one statement; see `probe`).
    let before = deleted_so_far(&mut tx, &below).await?;
    let deleted = match crate::db::query(stmt.as_query())
        .persistent(false)
        .bind(tenant)
        .bind(lo)
        .bind(hi)
        .execute(&mut *tx)
        .await
    {
        Ok(done) => done.rows_affected(),
        Err(e) => {
            drop(tx.rollback().await);
            return Err(Probe::new(unchanged, &[]).failed(target, limits, e).await);
        }
    };
    let deleted = i64::try_from(deleted).unwrap_or(i64::MAX);
    let after = Probe::new(unchanged, &below);
    let blocks_stmt = after.append(&queries::table_blocks(), 2);
    let query = crate::db::query(blocks_stmt.as_query()).bind(i64::from(plan.steps[step].table));
    let (tx, row) = after.fetch_one(tx, query, target, limits).await?;
    let blocks: i64 = row.try_get(0)?;
    let cascaded = difference(after.read(&row, 1)?, &before);
    tx.commit().await?;
    Ok(BatchResult {
        selected: deleted,
        deleted,
        parents: 0,
        parents_used: 0,
        next: (hi < blocks).then_some(Cursor::Block(hi)),
        cascaded,
        elapsed: started.elapsed(),
    })
}
