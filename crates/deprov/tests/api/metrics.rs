//! `GET /metrics` of real `deprov serve` / `deprov worker` processes: the figures equal what the
//! database shows.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::OPERATOR_TOKEN;
use crate::process::{Metrics, Process, connect, spawn, start_pg};

const SCHEMA: &str = "
    CREATE TABLE app.projects (id bigserial PRIMARY KEY,
        account_id bigint NOT NULL REFERENCES app.accounts (id) ON DELETE CASCADE);
    CREATE INDEX ON app.projects (account_id);
    INSERT INTO app.accounts VALUES (7), (8);
    INSERT INTO app.projects (account_id) SELECT 7 FROM generate_series(1, 300);
    INSERT INTO app.projects (account_id) SELECT 8 FROM generate_series(1, 5);
    CREATE TABLE app.locked (id int);
";

fn operator(process: &Process, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
    process
        .client
        .request(method, process.url(path))
        .bearer_auth(OPERATOR_TOKEN)
}

async fn wait_completed(process: &Process, job_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let job: Value = operator(process, reqwest::Method::GET, &format!("/v1/jobs/{job_id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        match job["state"].as_str() {
            Some("completed") => return job,
            Some("failed") => panic!("job failed: {job}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "job never completed: {job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Connections per `application_name` in pg_stat_activity.
async fn sessions(db: &sqlx::PgPool, name: &str) -> f64 {
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(name)
            .fetch_one(db)
            .await
            .unwrap();
    n as f64
}

#[tokio::test]
async fn after_a_job_the_metrics_equal_the_rows_deleted_and_the_sessions_in_pg_stat_activity() {
    let process = spawn(
        start_pg(Some(SCHEMA)).await,
        "serve",
        "[hard_delete]\nbatch_rows = 50\n",
    )
    .await;
    let db = connect(&process.pg).await;
    let before: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM app.projects) + (SELECT count(*) FROM app.accounts)",
    )
    .fetch_one(&db)
    .await
    .unwrap();

    let accepted = process.post_deletion("7").await;
    assert_eq!(accepted.status(), StatusCode::ACCEPTED);
    let accepted: Value = accepted.json().await.unwrap();
    let job = wait_completed(&process, accepted["job_id"].as_str().unwrap()).await;

    let after: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM app.projects) + (SELECT count(*) FROM app.accounts)",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    let m = process.scrape().await;
    let progress = &job["progress"];
    assert_eq!(
        before - after,
        301,
        "tenant 7: 300 projects and its account"
    );
    assert_eq!(progress["rows_deleted"], 301);
    assert_eq!(m.value("deprov_rows_deleted_total", &[]), 301.0);
    assert_eq!(
        m.value("deprov_batch_duration_seconds_count", &[]),
        progress["batches"].as_f64().unwrap(),
        "one histogram sample per committed batch"
    );
    assert_eq!(m.value("deprov_jobs", &[("state", "completed")]), 1.0);
    assert_eq!(m.value("deprov_jobs", &[("state", "queued")]), 0.0);
    assert_eq!(m.value("deprov_jobs", &[("state", "cancelled")]), 0.0);
    assert_eq!(m.value("deprov_queue_oldest_age_seconds", &[]), 0.0);
    assert_eq!(m.value("deprov_kill_switch_engaged", &[]), 0.0);
    for scope in ["source", "tenant"] {
        assert_eq!(
            m.value("deprov_kill_switches_engaged", &[("scope", scope)]),
            0.0
        );
    }
    assert_eq!(m.value("deprov_db_up", &[("database", "state")]), 1.0);
    assert_eq!(m.value("deprov_db_up", &[("database", "target")]), 1.0);
    assert_eq!(m.value("deprov_target_lock_waiters", &[]), 0.0);
    assert_eq!(m.get("deprov_lock_timeouts_total", &[]).unwrap_or(0.0), 0.0);
    assert_eq!(
        m.value("deprov_db_pool_max_connections", &[("pool", "intake")]),
        8.0
    );
    assert!(
        m.value(
            "deprov_db_pool_acquire_seconds_count",
            &[("pool", "target")]
        ) >= 1.0
    );

    // Connections opened per pool = the pool's sessions in pg_stat_activity (none was closed), and =
    // the pool's own idle + in-use gauges. Polled: the worker's idle polling may open one meanwhile.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = process.scrape().await;
        let mut mismatches = Vec::new();
        for (pool, app) in [
            ("intake", "deprov-intake"),
            ("queue", "deprov-worker"),
            ("target", "deprov-target"),
        ] {
            let opened = m.value("deprov_db_connections_opened_total", &[("pool", pool)]);
            let open = m.value(
                "deprov_db_pool_connections",
                &[("pool", pool), ("state", "idle")],
            ) + m.value(
                "deprov_db_pool_connections",
                &[("pool", pool), ("state", "in_use")],
            );
            let seen = sessions(&db, app).await;
            if !(opened == seen && open == seen && seen >= 1.0) {
                mismatches.push(format!(
                    "{pool}: opened {opened}, open {open}, pg_stat_activity {seen}"
                ));
            }
        }
        if mismatches.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{mismatches:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The kill switch's effect is visible.
    let engaged = operator(&process, reqwest::Method::PUT, "/v1/kill-switch")
        .json(&serde_json::json!({"engaged": true, "reason": "metrics test"}))
        .send()
        .await
        .unwrap();
    assert_eq!(engaged.status(), StatusCode::OK);
    assert_eq!(
        process
            .scrape()
            .await
            .value("deprov_kill_switch_engaged", &[]),
        1.0
    );
    // Scoped switches are counted per scope; a released one no longer counts.
    for (key, engaged) in [("billing", true), ("8", true), ("9", true), ("9", false)] {
        let scope = if key == "billing" { "source" } else { "tenant" };
        let response = operator(&process, reqwest::Method::PUT, "/v1/kill-switch")
            .json(
                &serde_json::json!({"engaged": engaged, "reason": "metrics test",
                                      "scope": scope, "key": key}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let m = process.scrape().await;
    assert_eq!(
        m.value("deprov_kill_switches_engaged", &[("scope", "source")]),
        1.0
    );
    assert_eq!(
        m.value("deprov_kill_switches_engaged", &[("scope", "tenant")]),
        1.0
    );
    // A cancelled job is counted in its own series.
    let job_id: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO deprov.jobs (id, subject_kind, subject, tenant_id, state, max_attempts) \
         VALUES (gen_random_uuid(), 'tenant', '8', '8', 'cancelled', 1) RETURNING id",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert!(!job_id.is_nil());
    assert_eq!(
        process
            .scrape()
            .await
            .value("deprov_jobs", &[("state", "cancelled")]),
        1.0
    );
}

#[tokio::test]
async fn an_intake_acquire_timeout_is_counted_once_and_answered_503() {
    let process = spawn(
        start_pg(None).await,
        "serve",
        "[pools.intake]\nmax_connections = 1\nacquire_timeout = \"300ms\"\n",
    )
    .await;
    let db = connect(&process.pg).await;
    // Request A takes intake's only connection and waits on a lock (intake's lock_timeout, 1 s).
    let mut blocker = db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO deprov.jobs (id, subject_kind, subject, tenant_id, state, max_attempts) \
         VALUES (gen_random_uuid(), 'tenant', '9', '9', 'queued', 1)",
    )
    .execute(&mut *blocker)
    .await
    .unwrap();
    let a = {
        let client = process.client.clone();
        let url = process.url("/v1/deletion-requests");
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(crate::helpers::SOURCE_TOKEN)
                .json(&serde_json::json!({"tenant_id": "9"}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'deprov-intake' AND wait_event_type = 'Lock'",
        )
        .fetch_one(&db)
        .await
        .unwrap();
        if waiting == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "request A never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Request B finds the pool exhausted: 503 + Retry-After after the acquire timeout, not later.
    let started = Instant::now();
    let b = process.post_deletion("10").await;
    let waited = started.elapsed();
    assert_eq!(b.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(b.headers()["retry-after"], "1");
    assert_eq!(b.headers()["content-type"], "application/problem+json");
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(1),
        "B waited {waited:?}"
    );
    assert_eq!(
        a.await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "A hit lock_timeout"
    );
    blocker.rollback().await.unwrap();

    let m = process.scrape().await;
    assert_eq!(
        m.value(
            "deprov_db_pool_acquire_timeouts_total",
            &[("pool", "intake")]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "deprov_db_pool_acquire_seconds_count",
            &[("pool", "intake")]
        ),
        2.0
    );
    // B's wait is in the histogram: one sample above 0.25 s.
    assert_eq!(
        m.value(
            "deprov_db_pool_acquire_seconds_bucket",
            &[("pool", "intake"), ("le", "0.25")]
        ),
        1.0
    );
    assert!(
        m.get(
            "deprov_db_pool_acquire_timeouts_total",
            &[("pool", "queue")]
        )
        .is_none()
    );
    // The pool recovers: the next request goes through.
    assert_eq!(
        process.post_deletion("10").await.status(),
        StatusCode::ACCEPTED
    );
}

#[tokio::test]
async fn a_worker_process_serves_metrics_with_the_targets_lock_waiters() {
    let mut process = spawn(start_pg(Some(SCHEMA)).await, "worker", "").await;
    let db = connect(&process.pg).await;
    let mut holder = db.begin().await.unwrap();
    sqlx::query("LOCK TABLE app.locked IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let waiter = {
        let db = db.clone();
        tokio::spawn(async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM app.locked")
                .fetch_one(&db)
                .await
                .unwrap()
        })
    };
    let seen = poll_metric(&process, "deprov_target_lock_waiters", 1.0).await;
    assert_eq!(seen.value("deprov_db_up", &[("database", "target")]), 1.0);
    assert_eq!(seen.value("deprov_db_up", &[("database", "state")]), 1.0);
    assert_eq!(seen.value("deprov_jobs", &[("state", "queued")]), 0.0);
    assert!(
        seen.get(
            "deprov_db_pool_connections",
            &[("pool", "queue"), ("state", "idle")]
        )
        .is_some()
    );
    holder.commit().await.unwrap();
    assert_eq!(waiter.await.unwrap(), 0);
    poll_metric(&process, "deprov_target_lock_waiters", 0.0).await;
    assert!(process.is_running());
}

async fn poll_metric(process: &Process, name: &str, want: f64) -> Metrics {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = process.scrape().await;
        if m.get(name, &[]) == Some(want) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached {want}:\n{}",
            m.text
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_batch_blocked_by_a_lock_counts_its_lock_timeouts() {
    let process = spawn(start_pg(Some(SCHEMA)).await, "serve", "").await;
    let db = connect(&process.pg).await;
    // Another session holds a lock on the tenant's table: the first batch hits lock_timeout (50 ms).
    let mut holder = db.begin().await.unwrap();
    sqlx::query("LOCK TABLE app.projects IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let accepted: Value = process.post_deletion("7").await.json().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = process.scrape().await;
        if m.get("deprov_lock_timeouts_total", &[]).is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no lock timeout counted:\n{}",
            m.text
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.rollback().await.unwrap();
    let job = wait_completed(&process, accepted["job_id"].as_str().unwrap()).await;
    let m = process.scrape().await;
    let timeouts = job["progress"]["timeouts"].as_f64().unwrap();
    assert!(timeouts >= 1.0, "{job}");
    assert_eq!(m.value("deprov_lock_timeouts_total", &[]), timeouts);
    assert_eq!(m.value("deprov_rows_deleted_total", &[]), 301.0);
}
