//! Batch sizing: rows per batch chosen by measured time, parents per batch by measured fan-out.
//!
//! The controller aims each batch transaction at half of `[hard_delete] max_batch_duration`, so that
//! normal variation stays below the maximum: after every batch the next size is
//! `rows · (target / elapsed)`, changed by at most ×16 up or ÷4 down per batch, within
//! `1..=max_batch_rows`. A statement timeout (57014) shrinks the size ÷4 at once.
//!
//! Growth may be steep because a batch far below the target is mostly fixed cost (its round trips,
//! `BEGIN` and `COMMIT`), not cost per row: `target / elapsed` then underestimates the rows that fit,
//! so a small batch that took a sixteenth of the target grows into one that takes less than the
//! target. A row that costs far more than the ones before it (a parent with a large subtree) is
//! met by the batch bound, which cuts the batch and shrinks the next; that step's next batches
//! are no larger than fits the target at the cost the cut implies ([`Costliest`]), so growing
//! back does not run into the same costly rows at the same size, and that limit comes down as
//! cheaper rows commit. Growth also follows the slower of a step's last two measured batches
//! ([`Measured`]): one batch that ran fast does not grow the next past what the batch before it
//! says fits the target.

use std::time::Duration;

use crate::engine::BatchResult;

/// Largest growth factor per batch.
const MAX_GROWTH: f64 = 16.0;
/// Largest shrink factor per batch.
const MAX_SHRINK: f64 = 0.25;

/// The adaptive controller's settings.
#[derive(Debug, Clone, Copy)]
pub struct Sizing {
    /// Aim: half the configured maximum transaction duration.
    pub target: Duration,
    /// Upper bound on rows per batch.
    pub max_rows: i64,
}

impl Sizing {
    /// From `[hard_delete] max_batch_duration` and `max_batch_rows`.
    pub fn new(max_batch_duration: Duration, max_rows: u32) -> Self {
        Self {
            target: max_batch_duration / 2,
            max_rows: i64::from(max_rows).max(1),
        }
    }

    /// Rows for the next batch after a batch of `rows` rows (of which `selected` were found) took
    /// `elapsed`. A batch that found fewer rows than asked says little about cost per row; its size is
    /// kept unless it was already too slow.
    pub fn next_rows(&self, rows: i64, selected: i64, elapsed: Duration) -> i64 {
        let factor = self.time_factor(elapsed);
        if selected < rows && factor > 1.0 {
            return rows.clamp(1, self.max_rows);
        }
        ((rows as f64 * factor).round() as i64).clamp(1, self.max_rows)
    }

    /// Rows after a statement timeout: a quarter.
    pub fn after_timeout(&self, rows: i64) -> i64 {
        (rows / 4).clamp(1, self.max_rows)
    }

    /// The ms per row of a batch of `rows` rows that took `took`: at least, for one that the
    /// bound cut short after `took`.
    pub fn cost_per_row(&self, rows: i64, took: Duration) -> f64 {
        took.as_secs_f64() * 1000.0 / rows.max(1) as f64
    }

    /// Rows that fit the target at `ms_per_row`, within `1..=max_rows`.
    pub fn rows_at(&self, ms_per_row: f64) -> i64 {
        if ms_per_row <= 0.0 {
            return self.max_rows;
        }
        ((self.target.as_secs_f64() * 1000.0 / ms_per_row).floor() as i64).clamp(1, self.max_rows)
    }

    /// The growth factor a batch that took `elapsed` earns: target ÷ elapsed, within
    /// `MAX_SHRINK..=MAX_GROWTH`.
    fn time_factor(&self, elapsed: Duration) -> f64 {
        let secs = elapsed.as_secs_f64().max(1e-4);
        (self.target.as_secs_f64() / secs).clamp(MAX_SHRINK, MAX_GROWTH)
    }

    /// Parents for the next batch of `next_rows` rows, from the last batch's fan-out. A full batch
    /// came from `parents_used` parents: the next takes as many per row, at most `next_rows`. A
    /// batch that read all its `parents` and still held fewer rows than asked scales them to the
    /// rows wanted — up to `next_rows` parents, or up to the batch's time factor (×16 when fast, ÷4
    /// when slow) times `parents` where that is more: a step whose parents are mostly childless
    /// walks them in growing strides, not a few per batch. Within `1..=max_rows`.
    pub fn next_parents(
        &self,
        parents: i64,
        rows: i64,
        batch: &BatchResult,
        next_rows: i64,
    ) -> i64 {
        let scale =
            |p: i64, per: i64| (p as f64 * next_rows as f64 / per.max(1) as f64).ceil() as i64;
        if batch.selected >= rows {
            return scale(batch.parents_used.max(1), rows).clamp(1, next_rows.max(1));
        }
        if batch.parents < parents {
            return parents; // the step's parents ran out: it ends with this batch
        }
        let by_time = (parents as f64 * self.time_factor(batch.elapsed)).ceil() as i64;
        let by_fan_out = if batch.selected == 0 {
            self.max_rows
        } else {
            scale(parents, batch.selected)
        };
        by_fan_out
            .min(by_time.max(next_rows))
            .clamp(1, self.max_rows)
    }
}

/// The costliest rows one step of the hard delete has met: the ms per row (per block of a
/// block-range step) at least of the batches the bound cut short in it ([`Sizing::cost_per_row`]).
/// The step's next batches are no larger than fits the target at that cost ([`Sizing::rows_at`]):
/// after a cut, the ×16 growth back from a quarter of the rows would otherwise meet the same
/// costly rows (a denser block range, parents with larger subtrees) at the same size and be cut
/// again. A batch cut short wastes its whole bound; one more batch costs its round trips.
///
/// The cap follows the rows met since: cheaper rows committed bring it down by half
/// ([`Self::relax`]), so batches past the costly rows grow back (×2 at most per relaxation)
/// instead of keeping, for the rest of the step, the size a cut left them at — on a large step
/// that is thousands of batches, and how small they stay would depend on where the cuts fell. The
/// more cuts a step has had, the more cheap batches in a row each halving takes (as many as its
/// cuts): a step whose costly rows are spread through it (a tree's large subtrees) grows back
/// slowly instead of being cut again at every regrowth.
#[derive(Debug, Clone, Copy, Default)]
pub struct Costliest {
    /// The step the cost was met in, and the cost (ms per row); `None` before any cut.
    seen: Option<(usize, f64)>,
    /// Cuts in that step.
    cuts: u32,
    /// Batches of that step in a row whose rows cost less than half the cap, since its last
    /// halving or cut.
    cheap: u32,
}

impl Costliest {
    /// A batch of `step` was cut short at `ms_per_row` at least (a new step forgets the previous
    /// step's cost and cuts).
    pub fn cut(&mut self, step: usize, ms_per_row: f64) {
        let (worst, cuts) = match self.cap(step) {
            Some(ms) => (ms.max(ms_per_row), self.cuts + 1),
            None => (ms_per_row, 1),
        };
        *self = Self {
            seen: Some((step, worst)),
            cuts,
            cheap: 0,
        };
    }

    /// A batch of `step` committed at `ms_per_row` (its time per row or block, round trips
    /// included, so never below the rows' own cost). Below half the cap, it counts as cheap; as
    /// many cheap batches in a row as the step's cuts bring the cap down to that cost, by half at
    /// most. A batch as costly as half the cap or more ends the row; another step's batch leaves
    /// the cap as it is.
    pub fn relax(&mut self, step: usize, ms_per_row: f64) {
        let Some(cap) = self.cap(step) else {
            return;
        };
        if ms_per_row >= cap / 2.0 {
            self.cheap = 0;
            return;
        }
        self.cheap += 1;
        if self.cheap >= self.cuts {
            self.seen = Some((step, ms_per_row.max(cap / 2.0)));
            self.cheap = 0;
        }
    }

    /// The costliest rows `step` has met, if a batch of it was cut short.
    pub fn cap(&self, step: usize) -> Option<f64> {
        self.seen.filter(|&(s, _)| s == step).map(|(_, ms)| ms)
    }
}

/// The cost per row (per block of a block-range step) of a step's last batch whose time was
/// mostly its rows: one that took at least a quarter of the target ([`Self::note`]; below that,
/// round trips are most of a batch), or of a later, shorter batch that cost less per row even
/// with its round trips. The next batch grows to no more than fits the target at that
/// cost ([`Self::grown`]), so growth follows the slower of a step's last two measured batches: one
/// batch that ran fast (its rows cheaper than the rows after them, its pages already in memory)
/// does not grow the next ×4 into rows that take as long as the batch before it did, to be cut at
/// the bound and lose it. Growth lags one batch where rows grow cheaper for good.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    /// The step and its last measured cost (ms per row).
    seen: Option<(usize, f64)>,
}

impl Measured {
    /// The batch of `step` that committed `rows` rows in `elapsed`: its cost is kept when it took
    /// at least a quarter of the target, or is below the one kept (a new step forgets the
    /// previous step's).
    pub fn note(&mut self, sizing: &Sizing, step: usize, rows: i64, elapsed: Duration) {
        if self.seen.is_some_and(|(s, _)| s != step) {
            self.seen = None;
        }
        if rows <= 0 {
            return;
        }
        let ms = sizing.cost_per_row(rows, elapsed);
        let lower = self.seen.is_some_and(|(_, kept)| ms < kept);
        if elapsed >= sizing.target / 4 || lower {
            self.seen = Some((step, ms));
        }
    }

    /// `next` rows for the batch after one of `rows` rows of `step`, no more than fit the target
    /// at the step's last measured cost (of the batches before this one, [`Self::note`] being
    /// called after), and never fewer than `rows`: it limits growth, it does not shrink.
    pub fn grown(&self, sizing: &Sizing, step: usize, rows: i64, next: i64) -> i64 {
        match self.seen {
            Some((s, ms)) if s == step && next > rows => next.min(sizing.rows_at(ms).max(rows)),
            _ => next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(selected: i64, parents: i64, parents_used: i64) -> BatchResult {
        BatchResult {
            selected,
            deleted: selected,
            parents,
            parents_used,
            next: None,
            cascaded: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn grows_at_most_sixteenfold_and_shrinks_toward_the_target() {
        let s = Sizing::new(Duration::from_millis(100), 50_000);
        assert_eq!(s.next_rows(1000, 1000, Duration::from_millis(5)), 10_000);
        assert_eq!(
            s.next_rows(100, 100, Duration::from_micros(500)),
            1600,
            "at most ×16"
        );
        assert_eq!(s.next_rows(1000, 1000, Duration::from_millis(100)), 500);
        assert_eq!(s.next_rows(1000, 1000, Duration::from_secs(2)), 250);
        assert_eq!(
            s.next_rows(40_000, 40_000, Duration::from_millis(1)),
            50_000
        );
        assert_eq!(
            s.next_rows(1000, 10, Duration::from_millis(1)),
            1000,
            "a short batch is no evidence"
        );
        assert_eq!(s.after_timeout(1000), 250);
        assert_eq!(s.after_timeout(2), 1);
    }

    #[test]
    fn parents_follow_the_fan_out() {
        let s = Sizing::new(Duration::from_millis(100), 50_000);
        // One parent and no child: as many parents as rows at once.
        assert_eq!(s.next_parents(1, 1000, &batch(0, 1, 0), 1000), 1000);
        // 1000 rows came from 10 parents (100 children each): 2000 rows need 20.
        assert_eq!(s.next_parents(50, 1000, &batch(1000, 50, 10), 2000), 20);
        // 8 parents gave only 400 rows: 1000 rows need 20.
        assert_eq!(s.next_parents(8, 1000, &batch(400, 8, 8), 1000), 20);
        // The parents ran out before the limit: keep it.
        assert_eq!(s.next_parents(8, 1000, &batch(400, 3, 3), 1000), 8);
    }

    #[test]
    fn childless_parents_are_walked_in_growing_strides() {
        let s = Sizing::new(Duration::from_millis(100), 50_000);
        // One parent, no child, a fast batch: sixteen times as many, though the batch is one row.
        assert_eq!(s.next_parents(1, 1, &batch(0, 1, 0), 1), 16);
        let mut parents = 1;
        let mut batches = 0;
        while parents < 50_000 {
            parents = s.next_parents(parents, 1, &batch(0, parents, 0), 1);
            batches += 1;
        }
        assert_eq!(batches, 4, "1 → 50,000 parents in ×16 strides");
        // A slow empty batch walks fewer parents next time.
        let mut slow = batch(0, 1000, 0);
        slow.elapsed = Duration::from_millis(200);
        assert_eq!(s.next_parents(1000, 10, &slow, 10), 250);
        // A sparse fan-out (one child per 100 parents) asks for as many parents as the rows need.
        assert_eq!(s.next_parents(100, 10, &batch(1, 100, 1), 10), 1000);
        assert_eq!(s.next_parents(400, 10, &batch(4, 400, 4), 10), 1000);
    }

    #[test]
    fn a_step_cut_short_is_sized_for_the_rows_that_cut_it() {
        let s = Sizing::new(Duration::from_millis(100), 50_000);
        let ms = s.cost_per_row(400, Duration::from_millis(80));
        assert!((ms - 0.2).abs() < 1e-9, "80 ms for 400 rows");
        assert_eq!(s.rows_at(ms), 250, "50 ms at 0.2 ms per row");
        assert_eq!(s.rows_at(0.0), 50_000);
        assert_eq!(s.rows_at(1000.0), 1);

        let mut c = Costliest::default();
        assert_eq!(c.cap(3), None);
        c.cut(3, 0.5);
        assert_eq!(c.cap(3), Some(0.5));
        c.cut(3, 0.1);
        assert_eq!(c.cap(3), Some(0.5), "a cheaper cut does not lift the cap");
        c.cut(3, 0.9);
        assert_eq!(c.cap(3), Some(0.9));
        assert_eq!(c.cap(4), None, "another step has no cap");
        c.cut(4, 0.2);
        assert_eq!(c.cap(4), Some(0.2), "a new step forgets the last one's");
        assert_eq!(c.cap(3), None);
    }

    #[test]
    fn a_cap_comes_down_as_cheaper_rows_commit() {
        let s = Sizing::new(Duration::from_millis(100), 50_000);
        let mut c = Costliest::default();
        // Cut at 16 rows: 5 ms per row, 10 rows a batch.
        c.cut(2, s.cost_per_row(16, Duration::from_millis(80)));
        assert_eq!(s.rows_at(c.cap(2).unwrap()), 10);
        c.relax(2, 3.0);
        assert_eq!(
            c.cap(2),
            Some(5.0),
            "rows at 3 ms: as costly as half the cap or more"
        );
        c.relax(2, 2.0);
        assert_eq!(c.cap(2), Some(2.5), "halved at most");
        c.relax(3, 0.01);
        assert_eq!(c.cap(2), Some(2.5), "another step's batch leaves it");
        // 10 rows in 1 ms each time: halved per batch after one cut, the batches double.
        let mut sizes = Vec::new();
        for _ in 0..4 {
            c.relax(2, 0.1);
            sizes.push(s.rows_at(c.cap(2).unwrap()));
        }
        assert_eq!(sizes, [40, 80, 160, 320]);
        c.relax(2, 0.1);
        assert_eq!(
            c.cap(2),
            Some(0.15625),
            "rows at half the cap or more leave it"
        );

        // After a second cut, two cheap batches in a row per halving; a costly one restarts the count.
        c.cut(2, 4.0);
        assert_eq!(
            c.cap(2),
            Some(4.0),
            "a cut caps the step again at what it met"
        );
        c.relax(2, 0.1);
        assert_eq!(c.cap(2), Some(4.0));
        c.relax(2, 3.0);
        c.relax(2, 0.1);
        assert_eq!(c.cap(2), Some(4.0), "the costly batch ended the row");
        c.relax(2, 0.1);
        assert_eq!(c.cap(2), Some(2.0));
        // A new step starts with no cap and no cuts.
        c.cut(5, 1.0);
        c.relax(5, 0.1);
        assert_eq!(c.cap(5), Some(0.5));
    }

    #[test]
    fn growth_follows_the_slower_of_the_last_two_measured_batches() {
        let s = Sizing::new(Duration::from_millis(100), 50_000);
        let mut m = Measured::default();
        // A first batch of 10 rows in 3 ms is mostly round trips: not measured.
        m.note(&s, 0, 10, Duration::from_millis(3));
        assert_eq!(m.grown(&s, 0, 10, 160), 160);
        // 33 rows in 33 ms (1 ms a row), then 50 in 13 ms: this batch alone would grow ×3.8,
        // but the one before says 50 rows fill the target.
        m.note(&s, 0, 33, Duration::from_millis(33));
        let next = s.next_rows(50, 50, Duration::from_millis(13));
        assert_eq!(next, 192);
        assert_eq!(m.grown(&s, 0, 50, next), 50);
        m.note(&s, 0, 50, Duration::from_millis(13));
        // Cheap again: the growth follows one batch late.
        assert_eq!(m.grown(&s, 0, 50, 192), 192);
        // It never shrinks a batch, and another step starts unlimited.
        m.note(&s, 0, 50, Duration::from_millis(50));
        assert_eq!(m.grown(&s, 0, 80, 120), 80);
        assert_eq!(m.grown(&s, 0, 80, 60), 60, "a slow batch still shrinks");
        assert_eq!(m.grown(&s, 1, 10, 160), 160);
        m.note(&s, 1, 10, Duration::from_millis(1));
        assert_eq!(
            m.grown(&s, 0, 50, 192),
            192,
            "the new step forgot the old one's cost"
        );
        // A short batch cheaper per row, round trips and all, than the kept cost replaces it:
        // 400 rows in 13 ms cap the next at 1538; 1538 rows then in 6 ms do not hold it there.
        let mut m = Measured::default();
        m.note(&s, 2, 400, Duration::from_millis(13));
        assert_eq!(m.grown(&s, 2, 400, 6400), 1538);
        m.note(&s, 2, 1538, Duration::from_millis(6));
        assert_eq!(m.grown(&s, 2, 1538, 12_816), 12_816);
        // A short batch dearer per row than the kept cost says nothing: it keeps it.
        m.note(&s, 2, 10, Duration::from_millis(5));
        assert_eq!(m.grown(&s, 2, 1538, 20_000), 12_816);
    }
}
