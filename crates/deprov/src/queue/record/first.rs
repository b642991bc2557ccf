//! The first statement of a group: look up, create jobs and insert requests in one round trip.
//!
//! A group of new requests for new subjects — what a burst of uninstalls is — is recorded by this
//! one statement, `deprov.record_first(…)` (`migrations/0007_record_first.sql`). It reads which of
//! the group's requests are already stored and whether a kill switch blocks each one; when none is
//! stored it also creates a job for each subject without an active one (`ON CONFLICT … DO NOTHING`
//! on `jobs_one_active_per_subject`) and inserts the requests of the subjects whose job it
//! created, in the same statement (data-modifying `WITH` queries, PostgreSQL docs §7.8.4). When a
//! request is already stored it writes nothing, and [`super::record_many`] goes on with what it read.
//!
//! Why one statement, and why a function:
//! - sqlx runs an unnamed statement in two round trips (Parse/Describe, then Bind/Execute), and
//!   through a transaction pooler every round trip also passes PgBouncer: one statement instead of
//!   three saves four round trips per group;
//! - PL/pgSQL keeps the statement's plan for the server connection's life (docs §43.11.2), where
//!   SQL text would be planned at every group: deprov keeps no prepared statements through a
//!   transaction pooler, and planning the statement cost about as much as running it.

use sqlx::PgConnection;
use uuid::Uuid;

use super::request::NewRequest;

/// What the first statement found and did for one request, in the order given.
#[derive(Debug, Clone)]
pub(super) struct First {
    /// The stored request's fingerprint, job and job state; `None` when it is not stored.
    pub stored: Option<(String, Uuid, String)>,
    /// An engaged kill switch (global, the request's source or its tenant) blocks it.
    pub blocked: bool,
    /// The state of the job this statement created for the request's subject (`queued` or
    /// `held`); `None` when it created none (a request was stored, or the subject has an active job).
    pub created: Option<String>,
    /// This statement inserted the request.
    pub inserted: bool,
}

/// One row of the statement: request ID, stored fingerprint, job and state, blocked, created job's
/// state, inserted.
type Row = (
    Uuid,
    Option<String>,
    Option<Uuid>,
    Option<String>,
    bool,
    Option<String>,
    bool,
);

/// Runs the first statement for `reqs` (distinct request IDs, in group order) in the caller's
/// transaction. `ids` and `fingerprints` are the requests'; `job_ids[i]` is the ID a job created
/// for `reqs[i]`'s subject gets (the same for every request of one subject); `first_of_subject[i]`
/// marks the request that creates its subject's job. Returns one [`First`] per request, in order.
///
/// # Errors
/// Database errors (the transaction must then be rolled back).
pub(super) async fn run(
    conn: &mut PgConnection,
    reqs: &[NewRequest],
    ids: &[Uuid],
    fingerprints: &[String],
    job_ids: &[Uuid],
    first_of_subject: &[bool],
    max_attempts: i32,
) -> Result<Vec<First>, sqlx::Error> {
    let text = |f: &dyn Fn(&NewRequest) -> String| reqs.iter().map(f).collect::<Vec<String>>();
    let opt = |f: &dyn Fn(&NewRequest) -> Option<String>| reqs.iter().map(f).collect::<Vec<_>>();
    let rows: Vec<Row> = crate::db::query_as(
        "SELECT request_id, stored_fingerprint, stored_job, stored_state, blocked, created_state, \
           inserted \
         FROM deprov.record_first($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(ids)
    .bind(text(&|r| r.source.clone()))
    .bind(text(&|r| r.basis.as_str().to_owned()))
    .bind(text(&|r| r.dedup_key.clone()))
    .bind(text(&|r| r.subject_kind.as_str().to_owned()))
    .bind(text(&|r| r.subject.clone()))
    .bind(opt(&|r| r.external_id.clone()))
    .bind(opt(&|r| r.reason.clone()))
    .bind(fingerprints)
    .bind(opt(&super::tenant_of))
    .bind(job_ids)
    .bind(first_of_subject)
    .bind(max_attempts)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(_, fp, job, state, blocked, created, inserted)| First {
            stored: match (fp, job, state) {
                (Some(fp), Some(job), Some(state)) => Some((fp, job, state)),
                _ => None,
            },
            blocked,
            created,
            inserted,
        })
        .collect())
}
