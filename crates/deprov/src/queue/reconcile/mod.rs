//! Reconcile after an incident: what queued up, what is stuck, and a paced release.
//!
//! [`report`] lists, for the jobs a [`Filter`] selects:
//! - requests received while a kill switch held their job (`received_while_held`);
//! - jobs `held`, `failed`, and waiting in the grace period (`queued` / `held` with
//!   `progress.grace_until` in the future and no hard delete started);
//! - jobs `running` whose lease expired (`stalled`): their worker stopped and no worker has looked
//!   for work since (the next one takes each over from its checkpoint);
//! - collapsed duplicates: requests attached to a job another (earlier) request created;
//! - orphans: tenants the target shows soft-deleted (`[soft_delete] orphans`) with no job
//!   `queued`, `held`, `running`, `completed` or `failed` (a failed job is listed as failed and
//!   retried, keeping its checkpoint). Without the statement: [`Orphans::NotConfigured`].
//!
//! [`apply`] acts on the same selection, in the caller's transaction: resume `held` jobs no engaged
//! kill switch blocks, retry `failed` jobs from their checkpoint ([`super::operator::retry`]),
//! cancel active jobs ([`super::operator::cancel`]), create jobs for orphans (a deletion request
//! from source `reconcile`, external ID `orphan:<tenant>:<jobs the tenant had>`, so concurrent or
//! repeated reconciles record one request). Released jobs are paced: the n-th (0-based, oldest
//! first) becomes claimable `n / rate` seconds after the transaction's start (`run_after`), so
//! workers do not all claim at once. A dry run is the same call rolled back: it shows exactly what
//! `--apply` would do. Applying twice changes nothing the second time (nothing is held, failed or
//! orphaned any more). Every action writes the audit log in the same transaction.

use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{JobState, intake};
use crate::engine::{BatchLimits, EngineError};

/// The source name of requests reconcile records for orphans.
pub const ORPHAN_SOURCE: &str = "reconcile";

/// Which jobs a reconcile looks at; every given part must match (empty = everything).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Filter {
    /// Only jobs in these states.
    #[serde(default)]
    pub states: Vec<JobState>,
    /// Only jobs with a request from this source.
    pub source: Option<String>,
    /// Only jobs of this tenant (resolved tenant key or subject); also narrows orphans.
    pub tenant: Option<String>,
    /// Only these jobs.
    #[serde(default)]
    pub ids: Vec<Uuid>,
    /// Only jobs with a request received at or after this time (RFC 3339; `""` = no bound).
    #[serde(
        default,
        deserialize_with = "rfc3339_or_empty",
        serialize_with = "time::serde::rfc3339::option::serialize"
    )]
    pub received_after: Option<OffsetDateTime>,
    /// Only jobs with a request received before this time (RFC 3339; `""` = no bound).
    #[serde(
        default,
        deserialize_with = "rfc3339_or_empty",
        serialize_with = "time::serde::rfc3339::option::serialize"
    )]
    pub received_before: Option<OffsetDateTime>,
}

/// An optional RFC 3339 time where an empty string means none (as an empty query parameter does).
fn rfc3339_or_empty<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<OffsetDateTime>, D::Error> {
    use serde::Deserialize as _;
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) if s.trim().is_empty() => Ok(None),
        Some(s) => OffsetDateTime::parse(&s, &time::format_description::well_known::Rfc3339)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

impl Filter {
    /// Whether the filter selects anything narrower than every job.
    pub fn is_narrow(&self) -> bool {
        !self.states.is_empty()
            || self.source.is_some()
            || self.tenant.is_some()
            || !self.ids.is_empty()
            || self.received_after.is_some()
            || self.received_before.is_some()
    }

    fn states(&self) -> Option<Vec<String>> {
        (!self.states.is_empty()).then(|| self.states.iter().map(|s| s.as_str().into()).collect())
    }

    fn ids(&self) -> Option<Vec<Uuid>> {
        (!self.ids.is_empty()).then(|| self.ids.clone())
    }
}

/// The job filter as SQL over `deprov.jobs j`, parameters `$1..=$6` (see [`bind_filter`]).
macro_rules! job_filter {
    () => {
        "($1::text[] IS NULL OR j.state = ANY($1)) \
         AND ($2::text IS NULL OR EXISTS (SELECT 1 FROM deprov.deletion_requests f \
              WHERE f.job_id = j.id AND f.source = $2)) \
         AND ($3::text IS NULL OR j.tenant_id = $3 OR j.subject = $3) \
         AND ($4::uuid[] IS NULL OR j.id = ANY($4)) \
         AND (($5::timestamptz IS NULL AND $6::timestamptz IS NULL) OR EXISTS ( \
              SELECT 1 FROM deprov.deletion_requests f WHERE f.job_id = j.id \
              AND ($5::timestamptz IS NULL OR f.received_at >= $5) \
              AND ($6::timestamptz IS NULL OR f.received_at < $6)))"
    };
}

macro_rules! bind_filter {
    ($q:expr, $f:expr) => {
        $q.bind($f.states())
            .bind($f.source.as_deref())
            .bind($f.tenant.as_deref())
            .bind($f.ids())
            .bind($f.received_after)
            .bind($f.received_before)
    };
}

/// A job in a reconcile listing.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct JobRow {
    /// The job.
    pub job_id: Uuid,
    /// Its resolved tenant key.
    pub tenant_id: Option<String>,
    /// Its subject (tenant key, installation ID, `{source}:{value}`).
    pub subject: String,
    /// Its state.
    pub state: String,
    /// Its step (`resolve`, `soft_delete`, `hard_delete`, `done`).
    pub step: String,
    /// Claims so far, not counting a run handed back `held` by a kill switch or to wait (a rest,
    /// the grace period).
    pub attempts: i32,
    /// The latest error.
    pub last_error: Option<String>,
    /// The engaged kill switch that blocks it (`global`, `tenant:<key>`, `source:<name>`), if any.
    pub blocked_by: Option<String>,
    /// End of its grace period (RFC 3339), when it is waiting in one.
    pub grace_until: Option<String>,
    /// When it was created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// A request in a reconcile listing.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct RequestRow {
    /// The deterministic request ID.
    pub request_id: Uuid,
    /// Its source.
    pub source: String,
    /// Its subject.
    pub subject: String,
    /// When it was first received.
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    /// Identical deliveries of it received later.
    pub duplicates: i32,
    /// The job it is attached to.
    pub job_id: Uuid,
    /// That job's state.
    pub job_state: String,
    /// The job's first request (the one that created it); equal to `request_id` when this is it.
    pub first_request_id: Uuid,
}

/// Orphans, or why they are not known.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Orphans {
    /// No `[soft_delete] orphans` statement: orphans cannot be detected.
    NotConfigured,
    /// Tenant keys soft-deleted on the target with no job (see the module docs), sorted.
    Found {
        /// The tenant keys.
        tenants: Vec<String>,
    },
}

/// What [`report`] found.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Report {
    /// Requests recorded while a kill switch held their job, oldest first.
    pub received_while_held: Vec<RequestRow>,
    /// Jobs `held`, oldest first.
    pub held: Vec<JobRow>,
    /// Jobs `failed`, oldest first.
    pub failed: Vec<JobRow>,
    /// Jobs `running` whose lease has expired, oldest first: their worker stopped (crashed, killed,
    /// cut off) and no worker has looked for work since. The next worker that does takes each over
    /// from its checkpoint (an attempt); until one runs, nothing happens to them. `--cancel`
    /// cancels them at once.
    pub stalled: Vec<JobRow>,
    /// Jobs waiting in their grace period, oldest first.
    pub in_grace: Vec<JobRow>,
    /// Requests attached to a job another request created, oldest first.
    pub collapsed: Vec<RequestRow>,
    /// Soft-deleted tenants without a job.
    pub orphans: Orphans,
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The request is not allowed as given (e.g. cancel without a filter).
    #[error("{0}")]
    Invalid(String),
    /// The orphans statement failed on the target.
    #[error("[soft_delete] orphans: {0}")]
    Orphans(EngineError),
    /// State database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl From<intake::IntakeError> for ReconcileError {
    fn from(e: intake::IntakeError) -> Self {
        match e {
            intake::IntakeError::Db(e) => Self::Db(e),
            other => Self::Invalid(other.to_string()),
        }
    }
}

/// The [`JobRow`] query for jobs matching `$cond` (a string literal) and the filter
/// (`job_filter!`), oldest first.
macro_rules! job_rows {
    ($cond:literal) => {
        concat!(
            "SELECT j.id AS job_id, j.tenant_id, j.subject, j.state, j.step, j.attempts, j.last_error, \
               deprov.job_blocked_by(j.id) AS blocked_by, j.progress->>'grace_until' AS grace_until, j.created_at \
             FROM deprov.jobs j WHERE ",
            $cond,
            " AND ",
            job_filter!(),
            " ORDER BY j.created_at, j.id"
        )
    };
}

async fn jobs_where(
    conn: &mut PgConnection,
    filter: &Filter,
    which: Which,
) -> Result<Vec<JobRow>, sqlx::Error> {
    let q = match which {
        Which::Held => crate::db::query_as(job_rows!("j.state = 'held'")),
        Which::Failed => crate::db::query_as(job_rows!("j.state = 'failed'")),
        Which::Stalled => crate::db::query_as(job_rows!(
            "j.state = 'running' AND j.lease_expires_at < now()"
        )),
        Which::InGrace => crate::db::query_as(job_rows!(
            "j.state IN ('queued', 'held') AND j.hard_delete_started_at IS NULL \
             AND (j.progress->>'grace_until')::timestamptz > now()"
        )),
    };
    bind_filter!(q, filter).fetch_all(&mut *conn).await
}

#[derive(Debug, Clone, Copy)]
enum Which {
    Held,
    Failed,
    Stalled,
    InGrace,
}

async fn requests_where(
    conn: &mut PgConnection,
    filter: &Filter,
    collapsed: bool,
) -> Result<Vec<RequestRow>, sqlx::Error> {
    let q = crate::db::query_as(concat!(
        "WITH r AS (SELECT r.*, first_value(r.id) OVER (PARTITION BY r.job_id ORDER BY r.received_at, r.id) \
           AS first_request_id FROM deprov.deletion_requests r) \
         SELECT r.id AS request_id, r.source, r.subject, r.received_at, r.duplicates, r.job_id, \
           j.state AS job_state, r.first_request_id \
         FROM r JOIN deprov.jobs j ON j.id = r.job_id \
         WHERE CASE WHEN $7 THEN r.id <> r.first_request_id ELSE r.received_while_held END AND ",
        job_filter!(),
        " ORDER BY r.received_at, r.id"
    ));
    bind_filter!(q, filter)
        .bind(collapsed)
        .fetch_all(&mut *conn)
        .await
}

/// Reads the orphans statement's tenant keys on the target (bounded like a batch), each first column
/// read by [`crate::engine::statements::key_text`]; a NULL key names no tenant and is skipped.
async fn soft_deleted(
    target: &PgPool,
    sql: &str,
    limits: &BatchLimits,
) -> Result<Vec<String>, EngineError> {
    let mut tx = crate::db::begin(target, limits.bounds()).await?;
    let rows = crate::db::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let mut keys = Vec::with_capacity(rows.len());
    for row in &rows {
        match crate::engine::statements::key_text(row) {
            Ok(Some(key)) => keys.push(key),
            Ok(None) => {}
            Err(()) => {
                return Err(EngineError::Statement(
                    "its first column must be text, an integer or uuid (cast it with ::text)"
                        .into(),
                ));
            }
        }
    }
    Ok(keys)
}

/// Orphans: tenants soft-deleted on the target (per `orphans_sql`) without a job in a state other
/// than `cancelled`, narrowed to `filter.tenant`; `NotConfigured` without a statement.
///
/// # Errors
/// [`ReconcileError::Orphans`] when the statement fails; database errors.
pub async fn orphans(
    conn: &mut PgConnection,
    target: &PgPool,
    orphans_sql: Option<&str>,
    limits: &BatchLimits,
    filter: &Filter,
) -> Result<Orphans, ReconcileError> {
    let Some(sql) = orphans_sql else {
        return Ok(Orphans::NotConfigured);
    };
    let mut keys = soft_deleted(target, sql, limits)
        .await
        .map_err(ReconcileError::Orphans)?;
    if let Some(t) = &filter.tenant {
        keys.retain(|k| k == t);
    }
    let tenants: Vec<String> = crate::db::query_scalar(
        "SELECT k FROM unnest($1::text[]) k WHERE NOT EXISTS ( \
           SELECT 1 FROM deprov.jobs j WHERE (j.tenant_id = k OR (j.subject_kind = 'tenant' AND j.subject = k)) \
           AND j.state <> 'cancelled') ORDER BY k",
    )
    .bind(&keys)
    .fetch_all(&mut *conn)
    .await?;
    Ok(Orphans::Found { tenants })
}

/// Lists what the filter selects (see the module docs). Read-only.
///
/// # Errors
/// [`ReconcileError`].
pub async fn report(
    conn: &mut PgConnection,
    target: &PgPool,
    orphans_sql: Option<&str>,
    limits: &BatchLimits,
    filter: &Filter,
) -> Result<Report, ReconcileError> {
    Ok(Report {
        received_while_held: requests_where(conn, filter, false).await?,
        held: jobs_where(conn, filter, Which::Held).await?,
        failed: jobs_where(conn, filter, Which::Failed).await?,
        stalled: jobs_where(conn, filter, Which::Stalled).await?,
        in_grace: jobs_where(conn, filter, Which::InGrace).await?,
        collapsed: requests_where(conn, filter, true).await?,
        orphans: orphans(conn, target, orphans_sql, limits, filter).await?,
    })
}

mod apply;

pub use apply::{Acting, Action, Actions, Applied, Skipped, apply};
