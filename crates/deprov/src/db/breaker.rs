//! Fail fast while a database is down: a per-pool circuit breaker in front of [`super::acquire`].
//!
//! While a database refuses connections, sqlx's `Pool::acquire` keeps retrying the connect until the
//! pool's `acquire_timeout`, so every caller would wait that long before its 503. Once an acquire
//! has timed out on a pool with no open connection at all (nothing to reuse: the database, not the
//! pool's size, is the problem), the pool is *down*: further acquires fail at once with
//! `PoolTimedOut`, except one caller per [`PROBE_EVERY`] that tries for real (the probe). The first
//! acquire that succeeds closes the breaker. A pool that still holds connections is never failed
//! fast (its connections are tested before use, `test_before_acquire`; through a transaction pooler,
//! where they are not, a broken one fails its `BEGIN` instead).
//!
//! Pools are told apart by their connect options' allocation (one per pool, alive as long as it), so
//! pools of different services in one process (tests) do not share a breaker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool};

/// How often a down pool lets one acquire try to connect.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

struct Down {
    /// The pool's connect options, to tell a reused address from the pool that went down.
    options: Weak<PgConnectOptions>,
    /// When the last probe started.
    probed: Instant,
}

fn breakers() -> &'static Mutex<HashMap<usize, Down>> {
    static BREAKERS: std::sync::OnceLock<Mutex<HashMap<usize, Down>>> = std::sync::OnceLock::new();
    BREAKERS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn key(options: &Arc<PgConnectOptions>) -> usize {
    Arc::as_ptr(options) as usize
}

/// Whether an acquire on `pool` may go ahead now: `false` = fail fast (the pool is down and another
/// caller probed less than [`PROBE_EVERY`] ago). A `true` on a down pool makes this caller the probe.
pub fn admit(pool: &PgPool) -> bool {
    if pool.size() > 0 {
        return true;
    }
    let options = pool.connect_options();
    let mut map = breakers()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(down) = map.get_mut(&key(&options)) else {
        return true;
    };
    if !down
        .options
        .upgrade()
        .is_some_and(|o| Arc::ptr_eq(&o, &options))
    {
        map.remove(&key(&options));
        return true;
    }
    if down.probed.elapsed() < PROBE_EVERY {
        return false;
    }
    down.probed = Instant::now();
    true
}

/// Records an acquire's outcome: a timeout on a pool without connections opens the breaker, a
/// success closes it.
pub fn record(pool: &PgPool, timed_out: bool) {
    let options = pool.connect_options();
    let mut map = breakers()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !timed_out {
        map.remove(&key(&options));
    } else if pool.size() == 0 {
        map.entry(key(&options)).or_insert_with(|| Down {
            options: Arc::downgrade(&options),
            probed: Instant::now(),
        });
    }
}
