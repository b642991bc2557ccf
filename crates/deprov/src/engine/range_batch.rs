//! The batch that continues inside one large parent as a key range ([`queries::range_bound`],
//! [`queries::range_delete`]), and the read-only pass that follows when the parent is exhausted.
//!
//! Deleting a parent row makes PostgreSQL look for its children through the foreign key's index
//! (the RI trigger's `DELETE … WHERE fk = $1` or `SELECT … FOR KEY SHARE`). After a million children
//! were deleted, that index range still holds a million entries pointing at dead heap tuples until
//! VACUUM removes them, and the parent's delete walks them all, checking each heap tuple: measured
//! 203 ms for the root row of a 10M-row tenant, one statement that cannot be split. An index scan
//! that finds a tuple dead to every transaction marks its index entry dead (`LP_DEAD`, nbtree's
//! "simple deletion", `src/backend/access/nbtree/README` in PostgreSQL's source), and later scans
//! skip such entries without visiting the heap. So when a large parent's children are all gone, a
//! read-only pass scans that index range once ([`kill_dead_entries`]), bounded like a batch but
//! holding no row lock, and the parent's delete then finds it clean.

use std::time::Instant;

use sqlx::{PgPool, Row};

use super::probe::Probe;
use super::{BatchLimits, BatchResult, Cursor, EngineError, Plan, cascaded_since, queries};

/// How [`run_range`] runs: as [`super::BatchStart`]'s fields of the same names say.
pub(super) struct Shape<'c> {
    pub(super) unchanged: Option<&'c super::Incarnation>,
    pub(super) began: &'c std::sync::OnceLock<Instant>,
    pub(super) jump: bool,
}

/// A batch continuing inside `parent` after child key `last`, as a key range (see [`Shape`];
/// [`queries::range_bound`], which also reads what [`super::before_batch`] would, then
/// [`queries::range_delete`]), in one transaction like
/// [`run_batch`]. The next cursor stays inside the parent while a full batch was found, else moves
/// after it.
pub(super) async fn run_range(
    target: &PgPool,
    plan: &Plan,
    step: usize,
    (parent, last): (&[String], &[String]),
    shape: Shape<'_>,
    limits: &BatchLimits,
) -> Result<BatchResult, EngineError> {
    let Shape {
        unchanged,
        began,
        jump,
    } = shape;
    let s = &plan.steps[step];
    let position: Vec<String> = parent.iter().chain(last).cloned().collect();
    // Timed from BEGIN: the wait for a connection holds no lock.
    let conn = crate::db::acquire(target).await?;
    let started = *began.get_or_init(Instant::now);
    let tx = crate::db::begin_acquired(conn, limits.bounds()).await?;
    // The range's read-only first statement reads what comes before the delete too (see `probe`).
    let below = plan.absorbed_below(s.table);
    let probe = Probe::new(unchanged, &below);
    let bound = probe.append(&queries::range_bound(plan, s, jump), 3);
    let query = crate::db::query(bound.as_query())
        .persistent(false)
        .bind(&position)
        .bind(limits.rows);
    let (mut tx, row) = probe.fetch_one(tx, query, target, limits).await?;
    let selected: i64 = row.try_get(0)?;
    let end: Option<Vec<String>> = row.try_get(1)?;
    let before = probe.read(&row, 2)?;
    let deleted = match &end {
        Some(end) => {
            let done = crate::db::query(queries::range_delete(plan, s).as_query())
                .persistent(false)
                .bind(&position)
                .bind(end)
                .execute(&mut *tx)
                .await?;
            i64::try_from(done.rows_affected()).unwrap_or(i64::MAX)
        }
        None => 0,
    };
    let cascaded = cascaded_since(&mut tx, &before).await?;
    tx.commit().await?;
    let next = match end {
        Some(end) if selected >= limits.rows => Cursor::Within(parent.to_vec(), end),
        _ => Cursor::AfterParent(parent.to_vec()),
    };
    Ok(BatchResult {
        // A row inserted into the range between the two statements is deleted too: never report
        // fewer selected than deleted (the difference counts as kept back).
        selected: selected.max(deleted),
        deleted,
        parents: 1,
        parents_used: i64::from(selected > 0),
        next: Some(next),
        cascaded,
        elapsed: started.elapsed(),
    })
}

/// What [`kill_dead_entries`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexPass {
    /// Read-only statements run (a statement cut by its timeout still marks what it passed).
    pub statements: u32,
    /// Whether the last one finished, so the whole range was scanned.
    pub finished: bool,
    /// The longest statement's transaction, BEGIN to COMMIT, in ms.
    pub longest_ms: f64,
}

/// Most statements one [`kill_dead_entries`] runs.
const MAX_INDEX_PASSES: u32 = 8;

/// Scans the index range of `parent`'s children in step `step`'s first foreign key once, read-only,
/// so the dead index entries of the children deleted before are marked (see the module docs) and
/// the parent's own delete does not walk them. Only for a foreign key with an index on its columns
/// ([`crate::engine::catalog::ForeignKey::indexed`]); otherwise it does nothing (returns 0
/// statements). Each statement is a transaction with `statement_timeout` = `timeout`, holding only
/// `ACCESS SHARE` (no row locks), planned as a plain index scan ([`crate::db::Bounds::plain_index_scans`]: a bitmap or index-only scan marks nothing); a
/// statement cut by the timeout is followed by another, at most `MAX_INDEX_PASSES`.
///
/// # Errors
/// [`EngineError::Db`] for errors other than the statement timeout (57014).
pub async fn kill_dead_entries(
    target: &PgPool,
    plan: &Plan,
    step: usize,
    parent: &[String],
    timeout: std::time::Duration,
) -> Result<IndexPass, EngineError> {
    let s = &plan.steps[step];
    let mut pass = IndexPass {
        statements: 0,
        finished: false,
        longest_ms: 0.0,
    };
    let Some(&fk) = s.path.first() else {
        return Ok(pass);
    };
    if !plan.catalog.foreign_keys[fk].indexed {
        return Ok(pass);
    }
    let stmt = queries::children_count(plan, s);
    while pass.statements < MAX_INDEX_PASSES && !pass.finished {
        pass.statements += 1;
        let started = Instant::now();
        let bounds = crate::db::Bounds::new(timeout, timeout).plain_index_scans();
        let mut tx = crate::db::begin(target, bounds).await?;
        let counted = crate::db::query_scalar::<i64>(stmt.as_query())
            .persistent(false)
            .bind(parent)
            .fetch_one(&mut *tx)
            .await;
        match counted {
            Ok(_) => {
                tx.commit().await?;
                pass.finished = true;
            }
            Err(e) => {
                let e = EngineError::from(e);
                if e.sqlstate().as_deref() != Some(crate::sqlstate::QUERY_CANCELED) {
                    return Err(e);
                }
                tx.rollback().await?;
            }
        }
        pass.longest_ms = pass
            .longest_ms
            .max(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(pass)
}
