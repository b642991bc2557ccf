//! Running a block-range batch ([`queries::block_batch`]) for a step whose foreign key to its
//! parent has no index ([`Plan::block_step`]).

use std::time::Instant;

use sqlx::PgPool;

use super::{
    BatchLimits, BatchResult, BatchStart, Cursor, EngineError, Plan, before_batch, cascaded_since,
    queries,
};

/// Deletes the tenant rows of step `at.step` in the blocks from `at.cursor` (`Cursor::Block`, else
/// the first block) on, `limits.rows` blocks, in one transaction under `limits`, after
/// [`super::before_batch`] with `at.unchanged`; `at.began` is set at its `BEGIN`. The result's `selected`
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
    let before = before_batch(&mut tx, unchanged, &below).await?;
    let deleted = crate::db::query(stmt.as_query())
        .persistent(false)
        .bind(tenant)
        .bind(lo)
        .bind(hi)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let deleted = i64::try_from(deleted).unwrap_or(i64::MAX);
    let blocks: i64 = crate::db::query_scalar(queries::TABLE_BLOCKS)
        .bind(i64::from(plan.steps[step].table))
        .fetch_one(&mut *tx)
        .await?;
    let cascaded = cascaded_since(&mut tx, &before).await?;
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
