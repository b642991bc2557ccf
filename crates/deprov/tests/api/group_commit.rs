//! Intake's group commit records a group of requests with a fixed number of statements
//! (`deprov::queue::record::record_many`). Differential test: for seeded random groups — duplicates
//! of stored requests and of earlier ones in the group, Idempotency-Key / external_id reused with
//! another body, tenant-keyed retries with another reason, several subjects, a tenant kill switch —
//! the answers and the rows it leaves equal those of recording the same requests one by one
//! (`deprov::queue::intake::record`) in the same order. Both sides run in a transaction that is
//! rolled back, on the same stored state.

use std::collections::{BTreeMap, BTreeSet};

use deprov::ids::DedupBasis;
use deprov::queue::intake::{self, IntakeError, NewRequest, SubjectKind};
use deprov::queue::record::record_many;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::helpers::spawn_app;

const SUBJECTS: [&str; 4] = ["t1", "t2", "t3", "t4"];

/// A request for one of `SUBJECTS` under one of five keys per basis: duplicates and mismatches
/// are frequent.
fn random_request(rng: &mut StdRng) -> NewRequest {
    request_among(rng, 5, &SUBJECTS)
}

/// A request for one of `subjects` under one of `keys` keys per basis.
fn request_among(rng: &mut StdRng, keys: u32, subjects: &[&str]) -> NewRequest {
    let subject = subjects[rng.random_range(0..subjects.len())].to_owned();
    let (basis, key, external_id) = match rng.random_range(0..3) {
        0 => {
            let key = format!("ext-{}", rng.random_range(0..keys));
            (DedupBasis::ExternalId, key.clone(), Some(key))
        }
        1 => (
            DedupBasis::IdempotencyKey,
            format!("idem-{}", rng.random_range(0..keys)),
            None,
        ),
        _ => (DedupBasis::TenantId, subject.clone(), None),
    };
    NewRequest {
        source: ["billing", "vercel"][rng.random_range(0..2)].to_owned(),
        basis,
        dedup_key: key,
        subject_kind: SubjectKind::Tenant,
        subject,
        external_id,
        // Another reason is another body: a mismatch under a key, a duplicate under a tenant ID.
        reason: Some(format!("r{}", rng.random_range(0..2))),
    }
}

/// An answer with new jobs named by their subject (their IDs are random on each side).
fn answer(
    r: Result<intake::Accepted, IntakeError>,
    stored: &BTreeSet<Uuid>,
    subject: &str,
) -> String {
    match r {
        Ok(a) => format!(
            "{} job={} state={} duplicate={}",
            a.request_id,
            job_name(a.job_id, stored, subject),
            a.state,
            a.duplicate
        ),
        Err(e) => format!("error: {e}"),
    }
}

fn job_name(id: Uuid, stored: &BTreeSet<Uuid>, subject: &str) -> String {
    if stored.contains(&id) {
        id.to_string()
    } else {
        format!("new:{subject}")
    }
}

/// The rows of `deprov.jobs` and `deprov.deletion_requests`, new jobs named by subject.
async fn rows(conn: &mut PgConnection, stored: &BTreeSet<Uuid>) -> BTreeMap<String, String> {
    type JobRow = (Uuid, String, String, Option<String>, String, String, i32);
    let jobs: Vec<JobRow> = sqlx::query_as(
        "SELECT id, subject_kind, subject, tenant_id, state, step, max_attempts FROM deprov.jobs",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let names: BTreeMap<Uuid, String> = jobs
        .iter()
        .map(|j| (j.0, job_name(j.0, stored, &j.2)))
        .collect();
    let mut out = BTreeMap::new();
    for j in &jobs {
        out.insert(
            format!("job {}", names[&j.0]),
            format!("{:?}", (&j.1, &j.2, &j.3, &j.4, &j.5, j.6)),
        );
    }
    type Row = (
        Uuid,
        String,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        String,
        Uuid,
        bool,
        i32,
    );
    let requests: Vec<Row> = sqlx::query_as(
        "SELECT id, source, dedup_basis, dedup_key, subject, external_id, reason, fingerprint, job_id, \
         received_while_held, duplicates FROM deprov.deletion_requests",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    for r in requests {
        let job = names[&r.8].clone();
        out.insert(
            format!("request {}", r.0),
            format!(
                "{:?}",
                (&r.1, &r.2, &r.3, &r.4, &r.5, &r.6, &r.7, job, r.9, r.10)
            ),
        );
    }
    out
}

#[tokio::test]
async fn a_group_answers_and_stores_exactly_what_one_by_one_recording_does() {
    let (duplicates, mismatches, held, _) = compare(20261130, &|rng| random_request(rng)).await;
    // The groups exercised every path.
    assert!(
        duplicates > 20 && mismatches > 5 && held > 5,
        "{duplicates} {mismatches} {held}"
    );
}

/// Groups of mostly new requests, many for subjects without a job: the one-statement path
/// (`record/first.rs`) records them, and falls back for the subjects that already have an active
/// job and for groups holding a stored request.
#[tokio::test]
async fn a_group_of_new_requests_answers_and_stores_what_one_by_one_recording_does() {
    const WIDE: [&str; 10] = ["t1", "t2", "t3", "t4", "n1", "n2", "n3", "n4", "n5", "n6"];
    let (duplicates, _, held, new) = compare(20261201, &|rng| request_among(rng, 400, &WIDE)).await;
    assert!(
        new > 300 && duplicates > 0 && held > 5,
        "{new} new, {duplicates} duplicates, {held} held"
    );
}

/// Stores six requests and a kill switch on tenant t3, then records 40 random groups of 1–24
/// requests made by `make` both ways (each in a transaction rolled back) and asserts equal answers
/// and rows. Returns the group answers' counts: duplicates, mismatches, held, new.
async fn compare(
    seed: u64,
    make: &dyn Fn(&mut StdRng) -> NewRequest,
) -> (usize, usize, usize, usize) {
    let app = spawn_app().await;
    let mut rng = StdRng::seed_from_u64(seed);
    // Stored before the groups: a few committed requests (duplicates and mismatches to be), and a
    // tenant kill switch on t3 (its new jobs start held, its requests are received while held).
    for _ in 0..6 {
        let req = random_request(&mut rng);
        intake::record_tx(&app.db, &req, 5).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO deprov.kill_switch_scopes (scope, key, engaged, reason, changed_by, version) \
         VALUES ('tenant', 't3', true, 'test', 'test', 1)",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let stored: BTreeSet<Uuid> = sqlx::query_scalar("SELECT id FROM deprov.jobs")
        .fetch_all(&app.db)
        .await
        .unwrap()
        .into_iter()
        .collect();

    let (mut duplicates, mut mismatches, mut held, mut new) = (0, 0, 0, 0);
    for group in 0..40 {
        let size = rng.random_range(1..=24);
        let reqs: Vec<NewRequest> = (0..size).map(|_| make(&mut rng)).collect();

        let mut tx = app.db.begin().await.unwrap();
        let grouped: Vec<String> = record_many(&mut tx, &reqs, 5)
            .await
            .unwrap()
            .into_iter()
            .zip(&reqs)
            .map(|(r, req)| answer(r, &stored, &req.subject))
            .collect();
        let grouped_rows = rows(&mut tx, &stored).await;
        tx.rollback().await.unwrap();

        let mut tx = app.db.begin().await.unwrap();
        let mut one_by_one = Vec::new();
        for req in &reqs {
            let r = intake::record(&mut tx, req, 5).await;
            one_by_one.push(answer(r, &stored, &req.subject));
        }
        let one_by_one_rows = rows(&mut tx, &stored).await;
        tx.rollback().await.unwrap();

        assert_eq!(grouped, one_by_one, "answers of group {group}: {reqs:#?}");
        assert_eq!(
            grouped_rows, one_by_one_rows,
            "rows after group {group}: {reqs:#?}"
        );
        duplicates += grouped
            .iter()
            .filter(|a| a.ends_with("duplicate=true"))
            .count();
        mismatches += grouped.iter().filter(|a| a.starts_with("error")).count();
        held += grouped.iter().filter(|a| a.contains("state=held")).count();
        new += grouped
            .iter()
            .filter(|a| a.ends_with("duplicate=false"))
            .count();
    }
    println!(
        "40 groups: {new} new, {duplicates} duplicates, {mismatches} mismatches, {held} answers held"
    );
    (duplicates, mismatches, held, new)
}
