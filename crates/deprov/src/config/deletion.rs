//! `[hard_delete]` and `[pacing]`: the batches' sizes and bounds, and how fast they may go.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// `[hard_delete]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HardDeleteConfig {
    /// Time between the soft delete and the start of the hard delete (default `0s`).
    #[serde(with = "humantime_serde")]
    pub grace_period: Duration,
    /// Rows of the first batch of every step, 1..=100000 (default 50: small, because a table's cost
    /// per row is unknown until measured; eight times as many for a table no foreign key
    /// references, see `engine::absorb::LEAF_FIRST_BATCH`); later batches are sized by time.
    pub batch_rows: u32,
    /// Upper bound on rows per batch, at least `batch_rows` (default 100000).
    pub max_batch_rows: u32,
    /// The longest a batch transaction should take (default 100ms): the size controller aims each
    /// batch at half of it. Must be below `statement_timeout`.
    #[serde(with = "humantime_serde")]
    pub max_batch_duration: Duration,
    /// `SET LOCAL lock_timeout` of every batch (default 50ms); must be below `statement_timeout`.
    #[serde(with = "humantime_serde")]
    pub lock_timeout: Duration,
    /// `SET LOCAL statement_timeout` of every batch (default 5s).
    #[serde(with = "humantime_serde")]
    pub statement_timeout: Duration,
    /// Estimated rows PostgreSQL's own cascade may delete per row a batch deletes (default 2000;
    /// 0 = always delete leaves first). Tables whose rows have few descendants are then deleted by
    /// their parents' batches through the cascade, visiting each row once (see `engine::absorb`).
    pub cascade_rows: u32,
    /// Most rows the cascade pre-check ([`crate::engine::simulate`]) may hold in memory, 1..=100000000
    /// (default 5000000): the rows the cascade would delete or update, plus those it looks up. Above
    /// it the job fails rather than guess whether the cascade would succeed.
    pub max_simulated_rows: u64,
    /// How often, at most, the job's checkpoint is written (default 1s; 0s = after every batch,
    /// each batch committing with `synchronous_commit = on`). Above 0s, batches commit with `SET
    /// LOCAL synchronous_commit = off` (PostgreSQL docs §30.4 "Asynchronous Commit"), and before
    /// each checkpoint deprov flushes them ([`crate::engine::flush`]), so every checkpoint names
    /// deletions already durable. A target that restarts or recovers from a crash between two
    /// checkpoints may lose the batches in between; the next batch or flush sees it
    /// ([`crate::engine::Incarnation`]) and the job resumes from the last checkpoint. The lease is
    /// renewed with the checkpoint, so a `worker.lease` under three times this shortens it to a
    /// third of the lease ([`Self::checkpoint_every`]).
    #[serde(with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// Before anything is deleted, run the tenant's cascading `DELETE` in a transaction that is
    /// always rolled back, bounded like a cascading batch, and refuse the job when PostgreSQL says
    /// it fails or deletes nothing ([`crate::engine::trial`]; default true). `false` for schemas
    /// whose delete triggers do something outside the database that must not happen twice.
    pub trial_cascade: bool,
    /// With `trial_cascade`: the trial commits when it succeeds, the soft-delete statements in
    /// the same transaction ([`crate::engine::whole`]; default true). A tenant whose whole
    /// cascade fits the trial's bound is then deleted by one transaction, as PostgreSQL's
    /// cascade deletes it, with no batches; a larger one rolls back and is deleted in batches.
    /// With a grace period it runs when the grace period ends, without the soft delete.
    pub whole_cascade: bool,
    /// What to do when the tenant's tables have user triggers on `DELETE`
    /// ([`crate::engine::trial::delete_triggers`]): `refuse` the job before anything is deleted
    /// (default), or `allow` them when they do not depend on the order rows go in.
    pub user_triggers: UserTriggers,
}

/// `[hard_delete] user_triggers`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserTriggers {
    /// Refuse a tenant whose tables have user `DELETE` triggers: deprov's leaves-first order is not
    /// the cascade's, and a trigger may see the difference.
    #[default]
    Refuse,
    /// Delete anyway: the operator vouches that the triggers do not depend on that order.
    Allow,
}

impl HardDeleteConfig {
    /// The checkpoint interval in force under a `lease`: `checkpoint_interval`, at most a third of
    /// the lease (so a worker renews its lease at least three times within it).
    pub fn checkpoint_every(&self, lease: Duration) -> Duration {
        self.checkpoint_interval.min(lease / 3)
    }

    /// The `statement_timeout` bound of a batch transaction and of the trial cascade: ⅘ of
    /// `max_batch_duration`, at least `lock_timeout` + 1 ms, so that a batch slower than the
    /// sizing controller expected (a cascade larger than estimated, a stall) is cut short and
    /// retried smaller within the batch's time instead of holding its locks for longer. A step
    /// whose single row cannot be deleted within it gets the full `statement_timeout`
    /// (`worker::run::hard_delete`).
    pub fn batch_timeout(&self) -> Duration {
        (self.max_batch_duration * 4 / 5).max(self.lock_timeout + Duration::from_millis(1))
    }

    /// The time the whole cascade's transaction and the trial cascade share among their
    /// statements (`crate::engine::whole`, `crate::engine::trial`): 19/20 of `max_batch_duration`,
    /// at least `lock_timeout` + 1 ms. Each statement of that transaction runs with what is left
    /// of it as its `statement_timeout`, and the twentieth left over is for its short statements
    /// (`BEGIN` with its `SET LOCAL`s, a savepoint, one statistics read, `COMMIT`), so the
    /// transaction stays within `max_batch_duration`. It is longer than [`Self::batch_timeout`]
    /// because nothing is retried within the same time after it: a try cut short sends the tenant
    /// to batches, so a tenant whose cascade takes between the two fits one transaction instead of
    /// paying a rolled-back try and then its batches.
    pub fn whole_timeout(&self) -> Duration {
        (self.max_batch_duration * 19 / 20).max(self.lock_timeout + Duration::from_millis(1))
    }
}

impl Default for HardDeleteConfig {
    fn default() -> Self {
        Self {
            grace_period: Duration::ZERO,
            batch_rows: 50,
            max_batch_rows: 100_000,
            max_batch_duration: Duration::from_millis(100),
            lock_timeout: Duration::from_millis(50),
            statement_timeout: Duration::from_secs(5),
            cascade_rows: 2_000,
            max_simulated_rows: 5_000_000,
            checkpoint_interval: Duration::from_secs(1),
            trial_cascade: true,
            whole_cascade: true,
            user_triggers: UserTriggers::Refuse,
        }
    }
}

/// `[pacing]`: a rate limit on the hard delete and back-off when the target shows distress.
///
/// Distress is read from the target between batches, at most once per `check_interval`:
/// sessions waiting on a lock (`pg_stat_activity.wait_event_type = 'Lock'`, PostgreSQL docs §28.2.3)
/// and the largest `replay_lag` in `pg_stat_replication` (§28.2.4; none without standbys). A batch
/// that took longer than `hard_delete.max_batch_duration` is distress too. Under distress the worker
/// pauses between batches, `backoff` first and doubling while it lasts, up to `backoff_max`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PacingConfig {
    /// The largest share of wall time the hard delete may work (default 1 = no rest; 0.0001..=1):
    /// after each batch the worker rests `work × (1 − duty_cycle) / duty_cycle`, the work being
    /// everything since its last rest (batches, checkpoints). The same idea as gh-ost's
    /// `--nice-ratio` (`duty_cycle = 1 / (1 + nice_ratio)`). Unlike `rate_limit` it bounds the
    /// target's time spent on the deletion whatever a row costs.
    pub duty_cycle: f64,
    /// Most rows deleted per second, over all batches of a job (default 0 = unlimited). Enforced
    /// by a GCRA limiter (governor) with one second of burst.
    pub rate_limit: u32,
    /// Pause while more than this many target sessions wait on a lock (default 10; 0 = never).
    pub max_lock_waiters: u32,
    /// Pause while a standby's `replay_lag` exceeds this (default 10s; 0s = never).
    #[serde(with = "humantime_serde")]
    pub max_replication_lag: Duration,
    /// How often distress is read from the target (default 1s).
    #[serde(with = "humantime_serde")]
    pub check_interval: Duration,
    /// The first pause under distress (default 200ms).
    #[serde(with = "humantime_serde")]
    pub backoff: Duration,
    /// The longest pause (default 10s); a pause is also capped at a third of `worker.lease`, so a
    /// paused job keeps its lease.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
}

impl Default for PacingConfig {
    fn default() -> Self {
        Self {
            duty_cycle: 1.0,
            rate_limit: 0,
            max_lock_waiters: 10,
            max_replication_lag: Duration::from_secs(10),
            check_interval: Duration::from_secs(1),
            backoff: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
        }
    }
}

impl HardDeleteConfig {
    /// # Errors
    /// [`ConfigError::Invalid`]: a row bound or timeout out of its range, or `max_batch_duration` /
    /// `lock_timeout` not below `statement_timeout`.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=100_000).contains(&self.batch_rows) {
            return Err(invalid(
                "hard_delete.batch_rows",
                "must be between 1 and 100000",
            ));
        }
        if self.max_batch_rows < self.batch_rows || self.max_batch_rows > 1_000_000 {
            return Err(invalid(
                "hard_delete.max_batch_rows",
                "must be between hard_delete.batch_rows and 1000000",
            ));
        }
        if !(1..=100_000_000).contains(&self.max_simulated_rows) {
            return Err(invalid(
                "hard_delete.max_simulated_rows",
                "must be between 1 and 100000000",
            ));
        }
        if self.statement_timeout.is_zero() || self.statement_timeout > Duration::from_secs(600) {
            return Err(invalid(
                "hard_delete.statement_timeout",
                "must be between 1ms and 10m",
            ));
        }
        if self.max_batch_duration < Duration::from_millis(1)
            || self.max_batch_duration >= self.statement_timeout
        {
            return Err(invalid(
                "hard_delete.max_batch_duration",
                "must be at least 1ms and below hard_delete.statement_timeout",
            ));
        }
        if self.lock_timeout.is_zero() || self.lock_timeout >= self.statement_timeout {
            return Err(invalid(
                "hard_delete.lock_timeout",
                "must be above 0 and below hard_delete.statement_timeout",
            ));
        }
        Ok(())
    }
}

impl PacingConfig {
    /// # Errors
    /// [`ConfigError::Invalid`]: `duty_cycle` outside 0.0001..=1, a zero interval or back-off, or
    /// `backoff_max` below `backoff`.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0001..=1.0).contains(&self.duty_cycle) {
            return Err(invalid(
                "pacing.duty_cycle",
                "must be from 0.0001 to 1 (the share of wall time the hard delete may work)",
            ));
        }
        if self.check_interval.is_zero() {
            return Err(invalid("pacing.check_interval", "must be above 0"));
        }
        if self.backoff.is_zero() {
            return Err(invalid("pacing.backoff", "must be above 0"));
        }
        if self.backoff_max < self.backoff {
            return Err(invalid(
                "pacing.backoff_max",
                "must be at least pacing.backoff",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_cascade_shares_more_of_max_batch_duration_than_a_batch_gets() {
        let hd = HardDeleteConfig::default();
        assert_eq!(hd.batch_timeout(), Duration::from_millis(80));
        assert_eq!(hd.whole_timeout(), Duration::from_millis(95));
        let tight = HardDeleteConfig {
            max_batch_duration: Duration::from_millis(40),
            lock_timeout: Duration::from_millis(50),
            ..HardDeleteConfig::default()
        };
        assert_eq!(tight.whole_timeout(), Duration::from_millis(51));
    }
}
