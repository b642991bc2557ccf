//! Pacing of the hard delete (`[pacing]`, see [`crate::config::PacingConfig`]): a duty cycle, a
//! rows/s limit, and pauses while the target shows distress.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use sqlx::PgPool;

use crate::config::PacingConfig;

/// What the target showed at the last distress check.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TargetLoad {
    /// Sessions waiting on a heavyweight lock.
    pub lock_waiters: i64,
    /// The largest standby `replay_lag`, in s (0 without standbys).
    pub replication_lag_s: f64,
}

/// Reads [`TargetLoad`] from the target, in one bounded statement (statement_timeout 1 s).
///
/// # Errors
/// Database errors.
pub async fn target_load(target: &PgPool) -> Result<TargetLoad, sqlx::Error> {
    let bounds = crate::db::Bounds::new(Duration::from_millis(500), Duration::from_secs(1));
    let mut tx = crate::db::begin(target, bounds).await?;
    let load = read_target_load(&mut tx).await?;
    tx.commit().await?;
    Ok(load)
}

/// Reads [`TargetLoad`] on `conn` (the caller bounds it, e.g. inside a [`crate::db::begin`]
/// transaction) and sets the gauges `deprov_target_lock_waiters` and
/// `deprov_target_replication_lag_seconds` from it.
///
/// # Errors
/// Database errors.
pub async fn read_target_load(conn: &mut sqlx::PgConnection) -> Result<TargetLoad, sqlx::Error> {
    let (lock_waiters, replication_lag_s): (i64, f64) = crate::db::query_as(
        "SELECT (SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'), \
         coalesce((SELECT extract(epoch FROM max(replay_lag))::float8 FROM pg_stat_replication), 0)",
    )
    .fetch_one(conn)
    .await?;
    #[allow(clippy::cast_precision_loss)] // session counts are small
    metrics::gauge!(crate::telemetry::TARGET_LOCK_WAITERS).set(lock_waiters as f64);
    metrics::gauge!(crate::telemetry::TARGET_REPLICATION_LAG).set(replication_lag_s);
    Ok(TargetLoad {
        lock_waiters,
        replication_lag_s,
    })
}

/// The rest a duty cycle of `d` (`[pacing] duty_cycle`) asks for after `worked` of work:
/// `worked × (1 − d) / d`, so that work is at most `d` of the wall time; zero at `d = 1` (and for a
/// `d` outside 0..1, which the configuration refuses).
pub fn duty_rest(d: f64, worked: Duration) -> Duration {
    if d >= 1.0 || d <= 0.0 {
        return Duration::ZERO;
    }
    worked.mul_f64((1.0 - d) / d)
}

/// What [`Pacer::admit`] waited for, each in turn.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Waited {
    /// The `[pacing] duty_cycle`'s rest after the work since the last wait.
    pub duty_cycle: Duration,
    /// The `[pacing] rate_limit`.
    pub rate_limit: Duration,
}

/// The pacer of one job run.
#[derive(Debug)]
pub struct Pacer {
    config: PacingConfig,
    limiter: Option<DefaultDirectRateLimiter>,
    /// When the work since the last rest began (the run's start, or the end of the last wait or
    /// pause).
    working_since: tokio::time::Instant,
    burst: u32,
    max_pause: Duration,
    max_batch: Duration,
    last_check: Option<Instant>,
    distressed_for: u32,
}

impl Pacer {
    /// A pacer for `config`; pauses are capped at `lease / 3`; a batch longer than `max_batch` is
    /// distress.
    pub fn new(config: &PacingConfig, lease: Duration, max_batch: Duration) -> Self {
        let limiter = NonZeroU32::new(config.rate_limit)
            .map(|rate| RateLimiter::direct(Quota::per_second(rate).allow_burst(rate)));
        Self {
            config: config.clone(),
            limiter,
            working_since: tokio::time::Instant::now(),
            burst: config.rate_limit.max(1),
            max_pause: (lease / 3).min(config.backoff_max),
            max_batch,
            last_check: None,
            distressed_for: 0,
        }
    }

    /// Counts the work since `since` (the job run's start: its claim, plan and checks before the
    /// hard delete), not since the pacer was made, so the first rest answers for them too.
    #[must_use]
    pub fn working_since(mut self, since: tokio::time::Instant) -> Self {
        self.working_since = since;
        self
    }

    /// The rest the duty cycle asks for after `worked` of work: `worked × (1 − d) / d` for
    /// `[pacing] duty_cycle = d`, so that work is at most `d` of the wall time; zero at `d = 1`.
    pub fn rest_after(&self, worked: Duration) -> Duration {
        duty_rest(self.config.duty_cycle, worked)
    }

    /// The rest [`Self::admit`] would take now ([`Self::rest_after`] the work since the last rest).
    pub fn rest_due(&self) -> Duration {
        self.rest_after(self.working_since.elapsed())
    }

    /// Between two batches: first rests as the duty cycle asks for the work since the last wait
    /// or pause ([`Self::rest_after`]: the batches, the checkpoints, everything the run did on the
    /// target and the state database meanwhile), then waits until `rows` more rows are within
    /// the rate limit (at once when unlimited). `stop` ends either wait at once. Returns what it
    /// waited for.
    pub async fn admit(&mut self, rows: i64, stop: &tokio_util::sync::CancellationToken) -> Waited {
        let mut waited = Waited::default();
        let rest = self.rest_due();
        if !rest.is_zero() {
            let started = tokio::time::Instant::now();
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(rest) => {}
            }
            waited.duty_cycle = started.elapsed();
        }
        if let Some(limiter) = &self.limiter {
            let started = Instant::now();
            let mut left = u32::try_from(rows.max(0)).unwrap_or(u32::MAX);
            while left > 0 && !stop.is_cancelled() {
                let n = left.min(self.burst);
                if let Some(n) = NonZeroU32::new(n) {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        // Cannot fail: n ≤ burst.
                        _ = limiter.until_n_ready(n) => {}
                    }
                }
                left -= n;
            }
            waited.rate_limit = started.elapsed();
        }
        self.rested();
        waited
    }

    /// The run rested until now (a pause for distress or after a lock timeout): the duty cycle's
    /// next rest counts only the work after it.
    pub fn rested(&mut self) {
        self.working_since = tokio::time::Instant::now();
    }

    /// How long to pause before the next batch, given the last batch's duration: zero unless the
    /// target is in distress (read at most once per `check_interval`; a failed read counts as no
    /// distress — the batch's own timeouts still bound it). Returns the reason with the pause.
    ///
    /// A batch longer than `max_batch` is distress only when it ran `bounded`, under the batch
    /// bound: a batch of a step whose single row cannot be deleted within the bound runs under the
    /// full `statement_timeout` (`progress.unbounded_steps`), and its length says how long that
    /// row takes, not that the target struggles — else every batch of such a step would double
    /// the pause before the next.
    pub async fn pause(
        &mut self,
        target: &PgPool,
        last_batch: Duration,
        bounded: bool,
    ) -> Option<(Duration, String)> {
        let mut reason = slow_batch(last_batch, self.max_batch, bounded);
        let due = self
            .last_check
            .is_none_or(|t| t.elapsed() >= self.config.check_interval);
        if reason.is_none() && due {
            self.last_check = Some(Instant::now());
            if let Ok(load) = target_load(target).await {
                reason = self.distress(load);
            }
        }
        match reason {
            None => {
                self.distressed_for = 0;
                None
            }
            Some(reason) => {
                let pause = self
                    .config
                    .backoff
                    .saturating_mul(1 << self.distressed_for.min(16))
                    .min(self.max_pause);
                self.distressed_for += 1;
                // Re-read the target after the pause, not a check_interval later.
                self.last_check = None;
                Some((pause, reason))
            }
        }
    }

    /// Whether the target's load shows distress, and why.
    fn distress(&self, load: TargetLoad) -> Option<String> {
        let c = &self.config;
        if c.max_lock_waiters > 0 && load.lock_waiters > i64::from(c.max_lock_waiters) {
            return Some(format!(
                "{} sessions wait on locks (max_lock_waiters {})",
                load.lock_waiters, c.max_lock_waiters
            ));
        }
        let lag = c.max_replication_lag.as_secs_f64();
        if lag > 0.0 && load.replication_lag_s > lag {
            return Some(format!(
                "replication lag {:.1} s (max_replication_lag {lag:.1} s)",
                load.replication_lag_s
            ));
        }
        None
    }
}

/// Why a batch that took `took` is distress: longer than `max_batch` while it ran `bounded` (see
/// [`Pacer::pause`]); `None` otherwise.
fn slow_batch(took: Duration, max_batch: Duration, bounded: bool) -> Option<String> {
    (bounded && took > max_batch).then(|| {
        format!(
            "last batch took {} ms (max_batch_duration {} ms)",
            took.as_millis(),
            max_batch.as_millis()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_batch_is_distress_only_under_the_batch_bound() {
        let ms = Duration::from_millis;
        assert!(
            slow_batch(ms(150), ms(100), true)
                .unwrap()
                .contains("150 ms")
        );
        assert_eq!(slow_batch(ms(100), ms(100), true), None);
        assert_eq!(
            slow_batch(ms(400), ms(100), false),
            None,
            "an unbounded step's batch takes as long as its row does"
        );
    }

    fn pacer() -> Pacer {
        Pacer::new(
            &PacingConfig {
                max_lock_waiters: 3,
                ..PacingConfig::default()
            },
            Duration::from_secs(30),
            Duration::from_millis(100),
        )
    }

    #[test]
    fn distress_thresholds() {
        let p = pacer();
        assert_eq!(p.distress(TargetLoad::default()), None);
        let waiters = TargetLoad {
            lock_waiters: 4,
            ..TargetLoad::default()
        };
        assert!(p.distress(waiters).unwrap().contains("4 sessions"));
        let lag = TargetLoad {
            replication_lag_s: 11.0,
            ..TargetLoad::default()
        };
        assert!(p.distress(lag).unwrap().contains("replication lag"));
    }

    #[tokio::test]
    async fn limiter_admits_one_second_of_burst_then_holds() {
        let mut p = Pacer::new(
            &PacingConfig {
                rate_limit: 1000,
                ..PacingConfig::default()
            },
            Duration::from_secs(30),
            Duration::from_millis(100),
        );
        let stop = tokio_util::sync::CancellationToken::new();
        p.admit(1000, &stop).await;
        let limiter = p.limiter.as_ref().unwrap();
        // The burst is spent: 500 more rows are half a second away, not available now.
        let n = NonZeroU32::new(500).unwrap();
        assert!(matches!(limiter.check_n(n), Ok(Err(_))));
        // Unlimited admits anything at once; a stop ends a wait at once.
        assert_eq!(pacer().admit(i64::MAX, &stop).await, Waited::default());
        stop.cancel();
        let waited = p.admit(1_000_000, &stop).await.rate_limit;
        assert!(waited < Duration::from_millis(100), "{waited:?}");
    }

    fn duty(d: f64) -> Pacer {
        Pacer::new(
            &PacingConfig {
                duty_cycle: d,
                ..PacingConfig::default()
            },
            Duration::from_secs(30),
            Duration::from_millis(100),
        )
    }

    #[test]
    fn duty_cycle_rest_keeps_work_to_its_share_of_the_wall_time() {
        let ms = Duration::from_millis;
        assert_eq!(duty(1.0).rest_after(ms(80)), Duration::ZERO);
        assert_eq!(duty(0.5).rest_after(ms(80)), ms(80));
        assert_eq!(duty(0.2).rest_after(ms(80)), ms(320));
        // 0.5 %: 80 ms of work, then 15.92 s of rest.
        let rest = duty(0.005).rest_after(ms(80));
        assert!((rest.as_secs_f64() - 15.92).abs() < 1e-6, "{rest:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn admit_rests_for_the_work_since_the_last_rest_only() {
        let stop = tokio_util::sync::CancellationToken::new();
        let mut p = duty(0.25);
        // 100 ms of work (the clock is tokio's, paused: it moves only when everything waits).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let waited = p.admit(1_000, &stop).await;
        assert_eq!(waited.rate_limit, Duration::ZERO);
        assert!(
            (waited.duty_cycle.as_secs_f64() - 0.3).abs() < 0.002,
            "{waited:?}"
        );
        // A pause for distress is rest too: only the 40 ms after it count.
        tokio::time::sleep(Duration::from_secs(5)).await;
        p.rested();
        tokio::time::sleep(Duration::from_millis(40)).await;
        let waited = p.admit(1_000, &stop).await;
        assert!(
            (waited.duty_cycle.as_secs_f64() - 0.12).abs() < 0.002,
            "{waited:?}"
        );
        // A stop ends the rest at once.
        tokio::time::sleep(Duration::from_secs(10)).await;
        stop.cancel();
        assert_eq!(p.admit(1_000, &stop).await.duty_cycle, Duration::ZERO);
    }
}
