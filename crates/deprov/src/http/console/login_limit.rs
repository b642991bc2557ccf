//! The console's limit on failed logins (`[console.login_rate_limit]`), per peer IP address.
//!
//! A governor GCRA limiter counts each failed login of an address; a login from an address whose
//! failures used up the quota is answered 429 with `Retry-After` before its token is checked
//! ([`super::session::login`]). Only failures count, so operators logging in together from one
//! address (behind a proxy, every browser has the proxy's) are not limited by their own logins.
//! Asking whether an address may try must not spend a cell, so the limiter keeps its state in a
//! store of its own that records a cell only for a check counting a failure and answers a check
//! that only asks from the same state without changing it. Addresses whose failures are all earned
//! back are dropped every [`crate::http::rate_limit::RETAIN_INTERVAL`]
//! ([`crate::http::rate_limit::spawn_retain`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use governor::clock::MonotonicClock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::StateStore;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::{Quota, RateLimiter};

use crate::config::LoginRateLimitConfig;

/// The peer IP address of a request (`None` when it was served without connect info, as in tests
/// that call the router directly: such requests share one quota).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip()),
        ))
    }
}

/// What a check of the limiter does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Check {
    /// Asks whether the address may try, spending nothing.
    Ask,
    /// Counts a failed login.
    Count,
}

/// A key of the limiter: the address, and what the check does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key(Option<IpAddr>, Check);

/// The limiter's state: governor's theoretical arrival time of each address's next failure.
#[derive(Debug, Default)]
struct Failures(Mutex<HashMap<Option<IpAddr>, Nanos>>);

impl Failures {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Option<IpAddr>, Nanos>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl StateStore for Failures {
    type Key = Key;

    fn measure_and_replace<T, F, E>(&self, key: &Key, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let mut map = self.map();
        let (outcome, next) = f(map.get(&key.0).copied())?;
        if key.1 == Check::Count {
            map.insert(key.0, next);
        }
        Ok(outcome)
    }
}

impl ShrinkableKeyedStateStore<Key> for Failures {
    fn retain_recent(&self, drop_below: Nanos) {
        self.map().retain(|_, next| *next > drop_below);
    }

    fn shrink_to_fit(&self) {
        self.map().shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.map().len()
    }

    fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
}

/// The failed-login limiter of one process.
pub struct LoginLimit {
    limiter: RateLimiter<Key, Failures, MonotonicClock, NoOpMiddleware<Instant>>,
}

impl std::fmt::Debug for LoginLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginLimit")
            .field("addresses", &self.limiter.len())
            .finish()
    }
}

impl LoginLimit {
    /// The limit `config` describes; `None` when it is off (`per_second = 0`).
    pub fn new(config: &LoginRateLimitConfig) -> Option<Arc<Self>> {
        let burst = NonZeroU32::new(config.burst)?;
        let quota = Quota::with_period(config.period()?)?.allow_burst(burst);
        Some(Arc::new(Self {
            limiter: RateLimiter::new(quota, Failures::default(), MonotonicClock),
        }))
    }

    /// Whether a login from `peer` may be tried, counting nothing.
    ///
    /// # Errors
    /// How long until it may, when its failed logins used up the quota.
    pub fn admit(&self, peer: Option<IpAddr>) -> Result<(), Duration> {
        self.limiter
            .check_key(&Key(peer, Check::Ask))
            .map_err(|not_until| not_until.wait_time_from(Instant::now()))
    }

    /// Counts a failed login from `peer`.
    pub fn failed(&self, peer: Option<IpAddr>) {
        // A failure past the quota (logins racing the check) has nothing left to spend.
        let _ = self.limiter.check_key(&Key(peer, Check::Count));
    }

    /// Forgets the addresses whose failures are all earned back.
    pub fn retain_recent(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(burst: u32) -> Arc<LoginLimit> {
        LoginLimit::new(&LoginRateLimitConfig {
            per_second: 0.01,
            burst,
        })
        .unwrap()
    }

    #[test]
    fn asking_spends_nothing_and_only_failures_count() {
        let limit = limit(3);
        let peer = Some(IpAddr::from([192, 0, 2, 1]));
        for _ in 0..100 {
            assert_eq!(limit.admit(peer), Ok(()));
        }
        for _ in 0..3 {
            assert_eq!(limit.admit(peer), Ok(()));
            limit.failed(peer);
        }
        let wait = limit.admit(peer).unwrap_err();
        assert!(
            wait > Duration::from_secs(90) && wait <= Duration::from_secs(100),
            "{wait:?}"
        );
        // Another address, and requests without one, keep their own quota.
        assert_eq!(limit.admit(Some(IpAddr::from([192, 0, 2, 2]))), Ok(()));
        assert_eq!(limit.admit(None), Ok(()));
        // Retaining keeps the limited address.
        limit.retain_recent();
        assert!(limit.admit(peer).is_err());
    }

    #[test]
    fn off_when_per_second_is_zero() {
        assert!(
            LoginLimit::new(&LoginRateLimitConfig {
                per_second: 0.0,
                burst: 10,
            })
            .is_none()
        );
    }
}
