//! Recording a group of deletion requests with a fixed number of statements, whatever its size.
//!
//! [`record_many`] gives each request of a group the answer [`super::intake::record`] would give it
//! if the group's requests were recorded one after another, in order, in one transaction: a request
//! whose ID is already stored, or appeared earlier in the group, is a duplicate (or an
//! [`IntakeError::Mismatch`] when an Idempotency-Key / external ID comes with another body); the
//! others attach to their subject's active job or create it (`held` when a kill switch blocks the
//! first request that creates it).
//!
//! A group of new requests for subjects without an active job — the common case — is recorded by
//! one statement (`record::first`). Otherwise at most four more follow: the jobs inserted, the active
//! jobs found instead, the requests inserted (for the requests the first statement could not
//! record), and the duplicate counts. PostgreSQL's per-statement work and the round trips, not the
//! commit, bound intake's rate (`docs/known-limits.md`).
//!
//! Every statement binds arrays (`unnest`), so the SQL text is fixed.

use std::collections::HashMap;

use sqlx::PgConnection;
use uuid::Uuid;

use crate::ids::{DedupBasis, JobId};

mod first;
mod request;

pub use request::{Accepted, IntakeError, NewRequest, SubjectKind};

/// What a request of the group turned out to be before anything is written.
enum Seen {
    /// Already stored: its job and that job's state.
    Stored(Uuid, String),
    /// The same ID as the group's request at this index, which is new.
    Earlier(usize),
    /// New: recorded by this group.
    New,
    /// Refused: same key, another body.
    Mismatch(&'static str),
}

/// Records `reqs` in the caller's transaction (see the module docs). The outer `Err` means the
/// transaction must be rolled back: [`IntakeError::Race`] (a concurrent transaction recorded one of
/// the requests or ended a job in between: record again) or a database error. The inner results
/// are per request, in `reqs`' order; the only inner error is [`IntakeError::Mismatch`].
///
/// # Errors
/// See above.
pub async fn record_many(
    conn: &mut PgConnection,
    reqs: &[NewRequest],
    max_attempts: i32,
) -> Result<Vec<Result<Accepted, IntakeError>>, IntakeError> {
    let ids: Vec<Uuid> = reqs.iter().map(NewRequest::id).collect();
    let fingerprints: Vec<String> = reqs.iter().map(NewRequest::fingerprint).collect();
    let group = Firsts::of(reqs, &ids);
    let firsts = first::run(
        &mut *conn,
        &group
            .uniq
            .iter()
            .map(|&i| reqs[i].clone())
            .collect::<Vec<_>>(),
        &group.uniq.iter().map(|&i| ids[i]).collect::<Vec<_>>(),
        &group
            .uniq
            .iter()
            .map(|&i| fingerprints[i].clone())
            .collect::<Vec<_>>(),
        &group.job_ids,
        &group.first_of_subject,
        max_attempts,
    )
    .await?;
    let mut stored: HashMap<Uuid, (String, Uuid, String)> = HashMap::new();
    let mut blocked = vec![false; reqs.len()];
    for (&i, f) in group.uniq.iter().zip(&firsts) {
        blocked[i] = f.blocked;
        if let Some(s) = &f.stored {
            stored.insert(ids[i], s.clone());
        }
    }
    let (seen, duplicates) = classify(reqs, &ids, &fingerprints, &stored);

    let mut jobs: HashMap<(&'static str, String), (Uuid, String)> = HashMap::new();
    let mut held = vec![false; reqs.len()];
    // The new requests the first statement did not record: its subject has an active job, or a
    // request of the group was stored (then the first statement wrote nothing).
    let mut rest = Vec::new();
    for ((&i, f), &job_id) in group.uniq.iter().zip(&firsts).zip(&group.job_ids) {
        if !matches!(seen[i], Seen::New) {
            continue;
        }
        held[i] = blocked[i];
        match (&f.created, f.inserted) {
            (Some(state), true) => {
                jobs.insert(subject_key(&reqs[i]), (job_id, state.clone()));
            }
            // Its job was created, but a concurrent transaction inserted the request first.
            (Some(_), false) => return Err(IntakeError::Race),
            (None, _) => rest.push(i),
        }
    }
    if !rest.is_empty() {
        insert_jobs(&mut *conn, reqs, &rest, &held, max_attempts, &mut jobs).await?;
        insert_requests(&mut *conn, reqs, &ids, &fingerprints, &rest, &held, &jobs).await?;
    }
    count_duplicates(&mut *conn, duplicates).await?;
    Ok(answers(reqs, &ids, &seen, &jobs))
}

/// What the first statement ([`first::run`]) is given of a group: each request ID once, at its
/// first occurrence, and one new job per subject, the one its first request names.
struct Firsts {
    /// Indexes into the group of each request ID's first occurrence.
    uniq: Vec<usize>,
    /// The job each of them would create (shared by the requests of one subject).
    job_ids: Vec<Uuid>,
    /// Whether each is its subject's first request in the group.
    first_of_subject: Vec<bool>,
}

impl Firsts {
    fn of(reqs: &[NewRequest], ids: &[Uuid]) -> Self {
        let mut out = Self {
            uniq: Vec::with_capacity(reqs.len()),
            job_ids: Vec::new(),
            first_of_subject: Vec::new(),
        };
        let mut seen_ids = std::collections::HashSet::new();
        let mut subject_jobs: HashMap<(&'static str, String), Uuid> = HashMap::new();
        for (i, req) in reqs.iter().enumerate() {
            if !seen_ids.insert(ids[i]) {
                continue;
            }
            out.uniq.push(i);
            let mut first = false;
            let job = *subject_jobs.entry(subject_key(req)).or_insert_with(|| {
                first = true;
                JobId::new().0
            });
            out.job_ids.push(job);
            out.first_of_subject.push(first);
        }
        out
    }
}

/// What each request of the group is, in order, as one-by-one recording would see the group:
/// stored before (`stored`: fingerprint, job, state by request ID), an earlier request of the
/// group, new, or a mismatch (same key, another body). Also how many duplicates each request ID
/// got.
fn classify(
    reqs: &[NewRequest],
    ids: &[Uuid],
    fingerprints: &[String],
    stored: &HashMap<Uuid, (String, Uuid, String)>,
) -> (Vec<Seen>, HashMap<Uuid, i32>) {
    let mut first_new: HashMap<Uuid, usize> = HashMap::new();
    let mut duplicates: HashMap<Uuid, i32> = HashMap::new();
    let mut seen = Vec::with_capacity(reqs.len());
    for (i, req) in reqs.iter().enumerate() {
        let earlier = match (stored.get(&ids[i]), first_new.get(&ids[i])) {
            (Some((fp, job, state)), _) => Some((fp.as_str(), Seen::Stored(*job, state.clone()))),
            (None, Some(&j)) => Some((fingerprints[j].as_str(), Seen::Earlier(j))),
            (None, None) => None,
        };
        seen.push(match earlier {
            Some((fp, _)) if fp != fingerprints[i] && mismatch_basis(req.basis).is_some() => {
                Seen::Mismatch(mismatch_basis(req.basis).unwrap_or("external_id"))
            }
            Some((_, dup)) => {
                *duplicates.entry(ids[i]).or_insert(0) += 1;
                dup
            }
            None => {
                first_new.insert(ids[i], i);
                Seen::New
            }
        });
    }
    (seen, duplicates)
}

/// Adds `duplicates` (count by request ID) to the stored requests' `duplicates`, with
/// `last_duplicate_at = now()`; one statement, none when empty.
async fn count_duplicates(
    conn: &mut PgConnection,
    duplicates: HashMap<Uuid, i32>,
) -> Result<(), sqlx::Error> {
    if duplicates.is_empty() {
        return Ok(());
    }
    let (dup_ids, counts): (Vec<Uuid>, Vec<i32>) = duplicates.into_iter().unzip();
    crate::db::query(
        "UPDATE deprov.deletion_requests r SET duplicates = r.duplicates + d.n, \
         last_duplicate_at = now() FROM unnest($1::uuid[], $2::int4[]) AS d(id, n) WHERE r.id = d.id",
    )
    .bind(&dup_ids)
    .bind(&counts)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Each request's answer, in order: its job and state (a new or earlier request's from `jobs`,
/// by subject), and whether it was a duplicate; a mismatch's error.
fn answers(
    reqs: &[NewRequest],
    ids: &[Uuid],
    seen: &[Seen],
    jobs: &HashMap<(&'static str, String), (Uuid, String)>,
) -> Vec<Result<Accepted, IntakeError>> {
    let new_answer = |i: usize| jobs[&subject_key(&reqs[i])].clone();
    seen.iter()
        .enumerate()
        .map(|(i, s)| {
            let (job_id, state, duplicate) = match s {
                Seen::Mismatch(basis) => return Err(IntakeError::Mismatch { basis }),
                Seen::Stored(job, state) => (*job, state.clone(), true),
                Seen::Earlier(j) => {
                    let (job, state) = new_answer(*j);
                    (job, state, true)
                }
                Seen::New => {
                    let (job, state) = new_answer(i);
                    (job, state, false)
                }
            };
            Ok(Accepted {
                request_id: ids[i],
                job_id,
                state,
                duplicate,
            })
        })
        .collect()
}

/// The basis named in a [`IntakeError::Mismatch`], or `None` when another body under the same key
/// is still the same request (a tenant or installation ID names what is deleted, not a delivery).
fn mismatch_basis(basis: DedupBasis) -> Option<&'static str> {
    match basis {
        DedupBasis::IdempotencyKey => Some("Idempotency-Key"),
        DedupBasis::ExternalId => Some("external_id"),
        DedupBasis::TenantId | DedupBasis::InstallationId => None,
    }
}

fn subject_key(req: &NewRequest) -> (&'static str, String) {
    (req.subject_kind.as_str(), req.subject.clone())
}

fn tenant_of(req: &NewRequest) -> Option<String> {
    (req.subject_kind == SubjectKind::Tenant).then(|| req.subject.clone())
}

/// Creates a job for each subject of the new requests that has no active one (`held` when its first
/// new request is held), and fills `jobs` with every such subject's active job and state.
async fn insert_jobs(
    conn: &mut PgConnection,
    reqs: &[NewRequest],
    new: &[usize],
    held: &[bool],
    max_attempts: i32,
    jobs: &mut HashMap<(&'static str, String), (Uuid, String)>,
) -> Result<(), IntakeError> {
    let mut firsts: Vec<usize> = Vec::new();
    let mut subjects = std::collections::HashSet::new();
    for &i in new {
        if subjects.insert(subject_key(&reqs[i])) {
            firsts.push(i);
        }
    }
    let job_ids: Vec<Uuid> = firsts.iter().map(|_| JobId::new().0).collect();
    let kinds: Vec<&str> = firsts
        .iter()
        .map(|&i| reqs[i].subject_kind.as_str())
        .collect();
    let subjects: Vec<String> = firsts.iter().map(|&i| reqs[i].subject.clone()).collect();
    let tenants: Vec<Option<String>> = firsts.iter().map(|&i| tenant_of(&reqs[i])).collect();
    let holds: Vec<bool> = firsts.iter().map(|&i| held[i]).collect();
    let created: Vec<(String, String, Uuid, String)> = crate::db::query_as(
        "INSERT INTO deprov.jobs (id, subject_kind, subject, tenant_id, state, step, max_attempts) \
         SELECT j.id, j.kind, j.subject, j.tenant, CASE WHEN j.held THEN 'held' ELSE 'queued' END, \
                CASE WHEN j.kind = 'tenant' THEN 'soft_delete' ELSE 'resolve' END, $6 \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bool[]) \
              WITH ORDINALITY AS j(id, kind, subject, tenant, held, n) ORDER BY j.n \
         ON CONFLICT (subject_kind, subject) WHERE state IN ('queued', 'held', 'running') DO NOTHING \
         RETURNING subject_kind, subject, id, state",
    )
    .bind(&job_ids)
    .bind(&kinds)
    .bind(&subjects)
    .bind(&tenants)
    .bind(&holds)
    .bind(max_attempts)
    .fetch_all(&mut *conn)
    .await?;
    let absorb = |jobs: &mut HashMap<(&'static str, String), (Uuid, String)>,
                  rows: Vec<(String, String, Uuid, String)>| {
        for (kind, subject, id, state) in rows {
            if let Some(&i) = firsts
                .iter()
                .find(|&&i| reqs[i].subject_kind.as_str() == kind && reqs[i].subject == subject)
            {
                jobs.insert(subject_key(&reqs[i]), (id, state));
            }
        }
    };
    absorb(jobs, created);
    let missing: Vec<usize> = firsts
        .iter()
        .copied()
        .filter(|&i| !jobs.contains_key(&subject_key(&reqs[i])))
        .collect();
    if !missing.is_empty() {
        let kinds: Vec<&str> = missing
            .iter()
            .map(|&i| reqs[i].subject_kind.as_str())
            .collect();
        let subjects: Vec<String> = missing.iter().map(|&i| reqs[i].subject.clone()).collect();
        let active: Vec<(String, String, Uuid, String)> = crate::db::query_as(
            "SELECT j.subject_kind, j.subject, j.id, j.state FROM deprov.jobs j \
             JOIN unnest($1::text[], $2::text[]) AS s(kind, subject) \
               ON j.subject_kind = s.kind AND j.subject = s.subject \
             WHERE j.state IN ('queued', 'held', 'running')",
        )
        .bind(&kinds)
        .bind(&subjects)
        .fetch_all(&mut *conn)
        .await?;
        absorb(jobs, active);
        // An active job ended between the two statements: start over.
        if missing
            .iter()
            .any(|&i| !jobs.contains_key(&subject_key(&reqs[i])))
        {
            return Err(IntakeError::Race);
        }
    }
    Ok(())
}

/// Inserts the new requests, attached to their subjects' jobs; [`IntakeError::Race`] when a
/// concurrent transaction inserted one of them first.
async fn insert_requests(
    conn: &mut PgConnection,
    reqs: &[NewRequest],
    ids: &[Uuid],
    fingerprints: &[String],
    new: &[usize],
    held: &[bool],
    jobs: &HashMap<(&'static str, String), (Uuid, String)>,
) -> Result<(), IntakeError> {
    let pick = |f: &dyn Fn(usize) -> String| new.iter().map(|&i| f(i)).collect::<Vec<String>>();
    let opt = |f: &dyn Fn(usize) -> Option<String>| {
        new.iter().map(|&i| f(i)).collect::<Vec<Option<String>>>()
    };
    let request_ids: Vec<Uuid> = new.iter().map(|&i| ids[i]).collect();
    let job_ids: Vec<Uuid> = new
        .iter()
        .map(|&i| jobs[&subject_key(&reqs[i])].0)
        .collect();
    let holds: Vec<bool> = new.iter().map(|&i| held[i]).collect();
    let inserted = crate::db::query(
        "INSERT INTO deprov.deletion_requests (id, source, dedup_basis, dedup_key, subject_kind, subject, \
           external_id, reason, fingerprint, job_id, received_while_held) \
         SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
           $7::text[], $8::text[], $9::text[], $10::uuid[], $11::bool[]) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&request_ids)
    .bind(pick(&|i| reqs[i].source.clone()))
    .bind(pick(&|i| reqs[i].basis.as_str().to_owned()))
    .bind(pick(&|i| reqs[i].dedup_key.clone()))
    .bind(pick(&|i| reqs[i].subject_kind.as_str().to_owned()))
    .bind(pick(&|i| reqs[i].subject.clone()))
    .bind(opt(&|i| reqs[i].external_id.clone()))
    .bind(opt(&|i| reqs[i].reason.clone()))
    .bind(pick(&|i| fingerprints[i].clone()))
    .bind(&job_ids)
    .bind(&holds)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted != new.len() as u64 {
        return Err(IntakeError::Race);
    }
    Ok(())
}
