//! Liveness, readiness, isolation from the target database, and graceful shutdown.

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{
    TestOptions, VERCEL_TOKEN, VercelMode, accepted, assert_problem, closed_port, deletion,
    spawn_app, spawn_app_with,
};

#[tokio::test]
async fn healthz_and_readyz_are_200_when_the_state_database_is_up() {
    let app = spawn_app().await;
    let health = app.get("/healthz").await;
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(health.json::<Value>().await.unwrap()["status"], "ok");
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), StatusCode::OK);
    assert_eq!(ready.json::<Value>().await.unwrap()["status"], "ready");
}

#[tokio::test]
async fn with_the_state_database_unreachable_the_app_starts_and_answers_503() {
    let app = spawn_app_with(TestOptions {
        state_unreachable: true,
        ..Default::default()
    })
    .await;
    assert_eq!(app.get("/healthz").await.status(), StatusCode::OK);
    let ready = app.get("/readyz").await;
    assert_eq!(ready.headers().get("retry-after").unwrap(), "1");
    assert_problem(ready, StatusCode::SERVICE_UNAVAILABLE).await;
    let intake = app.post_deletion(&deletion("acct_1")).await;
    assert!(intake.headers().get("retry-after").is_some());
    assert_problem(intake, StatusCode::SERVICE_UNAVAILABLE).await;
}

#[tokio::test]
async fn intake_never_touches_the_target_database() {
    let target = format!("postgres://postgres@127.0.0.1:{}/postgres", closed_port());
    let app = spawn_app_with(TestOptions {
        target_url: Some(target),
        vercel: VercelMode::Lookup,
        ..Default::default()
    })
    .await;
    accepted(app.post_deletion(&deletion("acct_1")).await).await;
    let vercel = app
        .delete_installation("icfg_1", VERCEL_TOKEN, None, None)
        .await;
    assert_eq!(vercel.status(), StatusCode::OK);
    assert_eq!(app.operator_get("/v1/jobs").await.status(), StatusCode::OK);
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
    assert_eq!((app.count_jobs().await, app.count_requests().await), (2, 2));
}

#[tokio::test]
async fn intake_uses_only_intake_connections() {
    let app = spawn_app().await;
    accepted(app.post_deletion(&deletion("acct_1")).await).await;
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name LIKE 'deprov-%' ORDER BY 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert!(names.iter().all(|n| n != "deprov-target"), "{names:?}");
    assert!(names.iter().any(|n| n == "deprov-intake"), "{names:?}");
}

#[tokio::test]
async fn the_server_and_its_worker_stop_gracefully_when_cancelled() {
    let mut app = spawn_app_with(TestOptions {
        worker: true,
        ..Default::default()
    })
    .await;
    accepted(app.post_deletion(&deletion("acct_1")).await).await;
    app.shutdown().await;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", app.port)).is_err(),
        "nothing listens after shutdown"
    );
}

#[tokio::test]
async fn started_with_its_database_down_deprov_stays_up_and_becomes_ready_when_it_returns() {
    let pg = crate::process::start_pg(None).await;
    pg.stop().unwrap();
    // The real process, migrations on (the default): it must neither exit nor crash-loop.
    let mut process = crate::process::spawn(
        pg,
        "serve",
        "[pools.intake]\nmax_connections = 4\nacquire_timeout = \"500ms\"\n\
         [pools.queue]\nmax_connections = 2\nacquire_timeout = \"1s\"\n",
    )
    .await;
    let client = process.client.clone();
    assert_eq!(
        client
            .get(process.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let ready = client.get(process.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.headers()["retry-after"], "1");
    assert_problem(ready, StatusCode::SERVICE_UNAVAILABLE).await;
    let started = std::time::Instant::now();
    let intake = process.post_deletion("1").await;
    let intake_wait = started.elapsed();
    assert_eq!(intake.headers()["retry-after"], "1");
    assert_problem(intake, StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(
        intake_wait < std::time::Duration::from_secs(2),
        "{intake_wait:?}"
    );
    // Known down now: the next requests fail fast instead of waiting acquire_timeout again (one
    // caller per second probes the database).
    let started = std::time::Instant::now();
    for _ in 0..3 {
        let again = process.post_deletion("1").await;
        assert_eq!(again.headers()["retry-after"], "1");
        assert_problem(again, StatusCode::SERVICE_UNAVAILABLE).await;
    }
    let fast = started.elapsed();
    assert!(
        fast < std::time::Duration::from_millis(500),
        "3 requests took {fast:?}: not failing fast"
    );
    // A scrape answers at once with what is known.
    let started = std::time::Instant::now();
    let m = process.scrape().await;
    let scrape_wait = started.elapsed();
    assert!(
        scrape_wait < std::time::Duration::from_secs(4),
        "{scrape_wait:?}"
    );
    assert_eq!(m.value("deprov_db_up", &[("database", "state")]), 0.0);
    assert!(m.value("deprov_db_read_errors_total", &[("database", "state")]) >= 1.0);
    assert!(process.is_running());
    println!(
        "database down: intake answered 503 in {intake_wait:?}, the next 3 in {fast:?}, /metrics in {scrape_wait:?}"
    );

    process.pg.restart().unwrap();
    let back = std::time::Instant::now();
    let deadline = back + std::time::Duration::from_secs(30);
    loop {
        let status = client
            .get(process.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status();
        if status == StatusCode::OK {
            break;
        }
        assert!(
            process.is_running(),
            "deprov exited while waiting for its database"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "not ready 30 s after the database returned"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    println!("ready {:?} after the database returned", back.elapsed());
    let accepted: Value = process.post_deletion("1").await.json().await.unwrap();
    assert_eq!(accepted["duplicate"], false, "{accepted}");
    let db = crate::process::connect(&process.pg).await;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM deprov.deletion_requests")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(stored, 1);
    let m = process.scrape().await;
    assert_eq!(m.value("deprov_db_up", &[("database", "state")]), 1.0);
    assert!(process.is_running());
}

/// Started while its database is down, `deprov serve` (and `deprov worker --metrics-listen`) answers
/// `/healthz` at once, `/readyz` and intake 503 + `Retry-After` at once. Its start-up checks wait for
/// the database (sqlx retries a refused connection until the pool's acquire timeout: 20 s for the
/// migrations here, then 5 s for the target's check), and the port must not wait for them: opened
/// after them, `deprov serve` would answer nothing for ~10 s with the default timeouts. (The test
/// above lets its helper wait up to 30 s for `/healthz`, so it cannot see that.)
#[tokio::test]
async fn started_with_its_database_down_deprov_answers_well_within_the_acquire_timeout() {
    use std::time::{Duration, Instant};
    let within = Duration::from_secs(5);
    let slow = "[pools.queue]\nmax_connections = 2\nacquire_timeout = \"20s\"\n";
    for command in ["serve", "worker"] {
        let pg = crate::process::start_pg(None).await;
        pg.stop().unwrap();
        let started = Instant::now();
        let mut process = crate::process::spawn_up_within(pg, command, slow, within).await;
        let up = started.elapsed();
        println!("deprov {command}: /healthz 200 {up:?} after start, database down");
        assert!(up < within, "deprov {command}: /healthz after {up:?}");
        assert!(process.is_running(), "{command}");
        if command == "worker" {
            continue;
        }
        let started = Instant::now();
        let ready = process
            .client
            .get(process.url("/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.headers()["retry-after"], "1");
        let problem = assert_problem(ready, StatusCode::SERVICE_UNAVAILABLE).await;
        // Answered while the start-up checks still wait for the database.
        assert!(
            problem["detail"].as_str().unwrap().contains("starting"),
            "{problem}"
        );
        let intake = process.post_deletion("1").await;
        assert_eq!(intake.headers()["retry-after"], "1");
        assert_problem(intake, StatusCode::SERVICE_UNAVAILABLE).await;
        let answered = started.elapsed();
        assert!(answered < within, "/readyz and intake took {answered:?}");
        assert!(process.is_running());
    }
}

/// `deprov serve 2>&1 | head -1` and `2>/dev/full`: once its log reader is gone (EPIPE) or its log
/// cannot be written (ENOSPC), the server keeps answering and still stops on SIGTERM (it used to
/// panic in the subscriber's `eprintln!` report of the failed write, or hang).
#[tokio::test]
async fn a_closed_or_full_stdout_and_stderr_neither_kill_nor_hang_the_server() {
    use std::process::Stdio;
    let full = || {
        Stdio::from(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
    };
    let closed_pipe = || {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        Stdio::from(writer)
    };
    for (what, stdout, stderr) in [
        ("closed pipe", closed_pipe(), closed_pipe()),
        ("/dev/full", full(), full()),
    ] {
        let pg = crate::process::start_pg(None).await;
        // `info`: start-up and every request write log lines, each one failing.
        let mut process =
            crate::process::spawn_with(pg, "serve", "", "info,tower_http=debug", stdout, stderr)
                .await;
        for _ in 0..20 {
            let response = process.post_deletion("7").await;
            assert!(
                response.status().is_success(),
                "{what}: {}",
                response.status()
            );
        }
        let health = process
            .client
            .get(process.url("/healthz"))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), StatusCode::OK, "{what}");
        assert!(process.is_running(), "{what}: deprov died");
        let status = process
            .terminate(std::time::Duration::from_secs(15))
            .await
            .unwrap_or_else(|| panic!("{what}: deprov ignored SIGTERM"));
        assert!(status.success(), "{what}: deprov exited with {status}");
    }
}
