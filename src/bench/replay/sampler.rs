//! Samples, every `period` (50 ms in the replays), PgBouncer's `SHOW POOLS` row of one database and
//! that database's locks in PostgreSQL, on connections opened before the load starts (so a full
//! `max_client_conn` cannot refuse the sampler). The series are readable while it runs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{Connection as _, PgConnection};
use tokio_util::sync::CancellationToken;

use deprov_testkit::{Bouncer, Show};

/// One `SHOW POOLS` row (summed over the database's users).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PoolSample {
    /// When, from the sampler's start.
    #[serde(skip)]
    pub t: Duration,
    /// Clients with a server (running a transaction).
    pub cl_active: i64,
    /// Clients queued for a server.
    pub cl_waiting: i64,
    /// Servers running a client's transaction.
    pub sv_active: i64,
    /// Servers idle and ready.
    pub sv_idle: i64,
    /// Servers idle, to be checked before reuse.
    pub sv_used: i64,
    /// Servers logging in.
    pub sv_login: i64,
    /// The oldest queued client's wait, in s (`maxwait` + `maxwait_us`).
    pub maxwait_s: f64,
}

impl PoolSample {
    /// Server connections that can run a transaction now or at once: active, idle or used (not
    /// those still logging in).
    pub fn usable(&self) -> i64 {
        self.sv_active + self.sv_idle + self.sv_used
    }
}

/// The database's locks at one moment (sessions of the sampler excluded).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LockSample {
    /// When, from the sampler's start.
    #[serde(skip)]
    pub t: Duration,
    /// Granted entries in `pg_locks` of sessions connected to the database.
    pub granted: i64,
    /// Entries in `pg_locks` not granted (waiting) of those sessions.
    pub waiting: i64,
    /// Sessions of the database waiting on a lock (`pg_stat_activity.wait_event_type = 'Lock'`).
    pub waiters: i64,
}

/// Everything sampled so far.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// PgBouncer's pool of the database.
    pub pools: Vec<PoolSample>,
    /// PostgreSQL's locks in the database.
    pub locks: Vec<LockSample>,
}

/// A running sampler.
#[derive(Debug)]
pub struct Sampler {
    /// When it started (offsets of the samples are from here).
    pub started: Instant,
    /// The series so far.
    pub series: Arc<Mutex<Series>>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn number(row: &std::collections::BTreeMap<String, String>, key: &str) -> i64 {
    row.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

impl Sampler {
    /// Connects to PgBouncer's admin console and directly to PostgreSQL (`direct_url`, any database)
    /// and starts sampling database `db` every `period`.
    ///
    /// # Errors
    /// When either connection fails.
    pub async fn start(
        bouncer: &Bouncer,
        direct_url: &str,
        db: &str,
        period: Duration,
    ) -> Result<Self, sqlx::Error> {
        let mut admin = PgConnection::connect(&bouncer.admin_url()).await?;
        let mut pg = PgConnection::connect(direct_url).await?;
        let series = Arc::new(Mutex::new(Series::default()));
        let cancel = CancellationToken::new();
        let started = Instant::now();
        let db = db.to_owned();
        let task = tokio::spawn({
            let (series, cancel) = (series.clone(), cancel.clone());
            async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    let t = started.elapsed();
                    if let Ok(rows) = Bouncer::show_on(&mut admin, Show::Pools).await {
                        let mut s = PoolSample {
                            t,
                            ..PoolSample::default()
                        };
                        for row in rows.iter().filter(|r| r.get("database") == Some(&db)) {
                            s.cl_active += number(row, "cl_active");
                            s.cl_waiting += number(row, "cl_waiting");
                            s.sv_active += number(row, "sv_active");
                            s.sv_idle += number(row, "sv_idle");
                            s.sv_used += number(row, "sv_used");
                            s.sv_login += number(row, "sv_login");
                            let wait = number(row, "maxwait") as f64
                                + number(row, "maxwait_us") as f64 / 1e6;
                            s.maxwait_s = s.maxwait_s.max(wait);
                        }
                        series.lock().expect("not poisoned").pools.push(s);
                    }
                    let locks: Result<(i64, i64, i64), _> = sqlx::query_as(
                        "SELECT \
                           (SELECT count(*) FILTER (WHERE l.granted) FROM pg_locks l \
                              JOIN pg_stat_activity a ON a.pid = l.pid \
                              WHERE a.datname = $1 AND l.pid <> pg_backend_pid()), \
                           (SELECT count(*) FILTER (WHERE NOT l.granted) FROM pg_locks l \
                              JOIN pg_stat_activity a ON a.pid = l.pid \
                              WHERE a.datname = $1 AND l.pid <> pg_backend_pid()), \
                           (SELECT count(*) FROM pg_stat_activity \
                              WHERE datname = $1 AND wait_event_type = 'Lock')",
                    )
                    .bind(&db)
                    .fetch_one(&mut pg)
                    .await;
                    if let Ok((granted, waiting, waiters)) = locks {
                        series.lock().expect("not poisoned").locks.push(LockSample {
                            t,
                            granted,
                            waiting,
                            waiters,
                        });
                    }
                }
                let _ = admin.close().await;
                let _ = pg.close().await;
            }
        });
        Ok(Self {
            started,
            series,
            cancel,
            task,
        })
    }

    /// A copy of the series so far.
    pub fn snapshot(&self) -> Series {
        self.series.lock().expect("not poisoned").clone()
    }

    /// Stops sampling and returns the series.
    pub async fn stop(self) -> Series {
        self.cancel.cancel();
        let series = self.series.clone();
        let _ = self.task.await;
        series.lock().expect("not poisoned").clone()
    }
}

/// Peaks of the samples taken in `[from, to]` (offsets from the sampler's start).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Peaks {
    /// Highest `cl_active + cl_waiting` (client connections busy or queued).
    pub clients: i64,
    /// Highest `cl_waiting`.
    pub cl_waiting: i64,
    /// Highest `maxwait`, in s.
    pub maxwait_s: f64,
    /// Lowest usable server connections ([`PoolSample::usable`]).
    pub min_usable: i64,
    /// Highest granted locks.
    pub locks_granted: i64,
    /// Highest waiting lock entries.
    pub locks_waiting: i64,
    /// Highest sessions waiting on a lock.
    pub lock_waiters: i64,
    /// Pool samples taken in the window.
    pub samples: usize,
}

impl Series {
    /// The peaks within `[from, to]`.
    pub fn peaks(&self, from: Duration, to: Duration) -> Peaks {
        let inside = |t: Duration| t >= from && t <= to;
        let mut p = Peaks {
            min_usable: i64::MAX,
            ..Peaks::default()
        };
        for s in self.pools.iter().filter(|s| inside(s.t)) {
            p.clients = p.clients.max(s.cl_active + s.cl_waiting);
            p.cl_waiting = p.cl_waiting.max(s.cl_waiting);
            p.maxwait_s = p.maxwait_s.max(s.maxwait_s);
            p.min_usable = p.min_usable.min(s.usable());
            p.samples += 1;
        }
        if p.samples == 0 {
            p.min_usable = 0;
        }
        for s in self.locks.iter().filter(|s| inside(s.t)) {
            p.locks_granted = p.locks_granted.max(s.granted);
            p.locks_waiting = p.locks_waiting.max(s.waiting);
            p.lock_waiters = p.lock_waiters.max(s.waiters);
        }
        p
    }

    /// The last pool sample at or before `t`.
    pub fn pool_at(&self, t: Duration) -> Option<PoolSample> {
        self.pools.iter().rev().find(|s| s.t <= t).copied()
    }
}
