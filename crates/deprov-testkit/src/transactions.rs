//! Samples `pg_stat_activity` for the open transactions of one database, to find the longest
//! transaction any client opened there (read-only ones included) as PostgreSQL's clock measures it:
//! `clock_timestamp() - xact_start` at each sample, kept per transaction at its largest, with the
//! statement that was running then.
//!
//! The sampler runs on its own connection, which may be to any database of the server
//! (`pg_stat_activity` is server-wide): connected to another database than the watched one, it adds
//! no session there. Only client backends are read (autovacuum workers and other background
//! processes of the database are not), its own backend excluded. A transaction shorter than the
//! sampling period can be missed, and each is seen at most one period short of its length: the
//! figure is a lower bound, within about one period of the truth.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

/// The open transactions of the database's client backends, their age in ms by the server's clock.
const SAMPLE: &str = "SELECT pid, coalesce(application_name, '')::text, backend_xid IS NOT NULL, \
     xact_start, (extract(epoch FROM clock_timestamp() - xact_start) * 1000)::float8, \
     coalesce(state, '')::text, coalesce(query, '')::text FROM pg_stat_activity \
     WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend' \
     AND xact_start IS NOT NULL";

/// One transaction at the sample where it was oldest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeenTransaction {
    /// Its backend's process ID.
    pub pid: i32,
    /// Its session's `application_name` (e.g. `deprov-target`).
    pub application_name: String,
    /// Its age at that sample (`clock_timestamp() - xact_start`), in ms.
    pub ms: f64,
    /// Whether it had been assigned a transaction ID by then (it had written something).
    pub wrote: bool,
    /// Its session's `state` at that sample (`active`, `idle in transaction`, …).
    pub state: String,
    /// The session's current (or, when idle in the transaction, last) statement at that sample.
    pub query: String,
}

/// What the sampler saw over its run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sampled {
    /// Samples taken.
    pub samples: u64,
    /// The period asked for, in ms.
    pub period_ms: f64,
    /// Wall time of the run ÷ samples, in ms: the period achieved.
    pub mean_period_ms: f64,
    /// Distinct transactions seen (by backend and `xact_start`).
    pub transactions: usize,
    /// The longest transaction seen, of any kind; none when no transaction was open at any sample.
    pub longest: Option<SeenTransaction>,
    /// The longest that had written something (held a transaction ID) by the sample it was seen
    /// oldest at.
    pub longest_writing: Option<SeenTransaction>,
}

/// A running sampler; [`Self::stop`] ends it and returns what it saw.
#[derive(Debug)]
pub struct TransactionSampler {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<Sampled, sqlx::Error>>,
}

impl TransactionSampler {
    /// Connects with `options` (to any database of the server) and samples the transactions of
    /// database `datname` every `period` until stopped. Returns once connected and the sampling
    /// statement prepared, before the first sample.
    ///
    /// # Errors
    /// The connection's error.
    pub async fn start(
        options: &PgConnectOptions,
        datname: &str,
        period: Duration,
    ) -> Result<Self, sqlx::Error> {
        let mut conn = PgConnection::connect_with(options).await?;
        sqlx::query(SAMPLE).bind(datname).execute(&mut conn).await?;
        let cancel = CancellationToken::new();
        let datname = datname.to_owned();
        let task = tokio::spawn({
            let cancel = cancel.clone();
            async move {
                let seen = sample_until(&mut conn, &datname, period, &cancel).await;
                let _ = conn.close().await;
                seen
            }
        });
        Ok(Self { cancel, task })
    }

    /// Stops sampling (after the sample in flight) and returns what was seen.
    ///
    /// # Errors
    /// A sample's database error (the sampling stopped there).
    pub async fn stop(self) -> Result<Sampled, sqlx::Error> {
        self.cancel.cancel();
        self.task
            .await
            .unwrap_or_else(|e| Err(sqlx::Error::Protocol(format!("sampler task: {e}"))))
    }
}

async fn sample_until(
    conn: &mut PgConnection,
    datname: &str,
    period: Duration,
    cancel: &CancellationToken,
) -> Result<Sampled, sqlx::Error> {
    type Row = (i32, String, bool, OffsetDateTime, f64, String, String);
    let started = std::time::Instant::now();
    let mut seen: HashMap<(i32, OffsetDateTime), SeenTransaction> = HashMap::new();
    let mut samples = 0u64;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let rows: Vec<Row> = sqlx::query_as(SAMPLE)
            .bind(datname)
            .fetch_all(&mut *conn)
            .await?;
        samples += 1;
        for (pid, application_name, wrote, xact_start, ms, state, query) in rows {
            let now = SeenTransaction {
                pid,
                application_name,
                ms,
                wrote,
                state,
                query,
            };
            seen.entry((pid, xact_start))
                .and_modify(|t| {
                    if now.ms > t.ms {
                        *t = now.clone();
                    }
                })
                .or_insert(now);
        }
    }
    let longest_of = |writing: bool| {
        seen.values()
            .filter(|t| t.wrote || !writing)
            .max_by(|a, b| a.ms.total_cmp(&b.ms))
            .cloned()
    };
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(Sampled {
        samples,
        period_ms: period.as_secs_f64() * 1e3,
        mean_period_ms: if samples > 0 {
            elapsed_ms / samples as f64
        } else {
            0.0
        },
        transactions: seen.len(),
        longest: longest_of(false),
        longest_writing: longest_of(true),
    })
}
