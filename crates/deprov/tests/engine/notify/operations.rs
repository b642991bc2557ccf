//! Operations: two dispatchers at once, and the CLI's list and redrive.

use std::collections::HashSet;
use std::time::Duration;

use super::*;
use crate::harness::Env;

#[tokio::test]
async fn two_dispatchers_never_deliver_the_same_event_twice() {
    let (receiver, url) = Receiver::start(&[], Duration::from_millis(15)).await;
    let (env, _secret) = env_notifying(&url, "max_in_flight = 4").await;
    let mut jobs = Vec::new();
    for n in 0..40 {
        let job = env.request(&format!("{}", 1000 + n)).await;
        cancel_queued(&env, job).await;
        jobs.push(job);
    }
    assert_eq!(events(&env.db).await.len(), 40);

    let (stop_a, a) = spawn(dispatcher(&env, "a"));
    let (stop_b, b) = spawn(dispatcher(&env, "b"));
    wait_events(&env.db, "40 delivered events", |all| {
        all.len() == 40 && all.iter().all(|e| e.state == "delivered")
    })
    .await;
    stop_a.cancel();
    stop_b.cancel();
    a.await.unwrap();
    b.await.unwrap();

    let hits = receiver.hits();
    let ids: HashSet<String> = hits.iter().map(Hit::id).collect();
    assert_eq!(hits.len(), 40, "one request per event");
    assert_eq!(ids.len(), 40);
    assert!(receiver.overlapping.lock().unwrap().is_empty());
    let per: Vec<(String, i64, i32)> = sqlx::query_as(
        "SELECT claimed_by, count(*), max(attempts) FROM deprov.outbox GROUP BY claimed_by ORDER BY 1",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert!(per.iter().all(|(_, _, max)| *max == 1), "{per:?}");
    assert_eq!(per.len(), 2, "both dispatchers delivered: {per:?}");
}

/// Runs the `deprov` binary with `args` on the env's state database; returns stdout.
fn deprov_cli(env: &Env, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deprov"))
        .args(args)
        .env("DEPROV_DATABASE_URL", env.server.url("target"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deprov {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn dead_events_are_listed_by_the_cli_and_a_redrive_delivers_them_once_the_receiver_is_back() {
    // The receiver's port, closed for now.
    let addr = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (env, _secret) = env_notifying(&format!("http://{addr}/hook"), "max_attempts = 1").await;
    let job = env.request("3").await;
    env.drain(&env.worker("w1")).await;
    let d = dispatcher(&env, "d1");
    assert_eq!(d.round().await.unwrap().dead, 1);

    let listed: serde_json::Value = serde_json::from_str(&deprov_cli(
        &env,
        &["notifications", "list", "--state", "dead", "--json"],
    ))
    .unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["job_id"], job.to_string());
    assert_eq!(listed[0]["event_type"], "job.completed");
    assert_eq!(listed[0]["attempts"], 1);
    let table = deprov_cli(&env, &["notifications", "list"]);
    assert!(
        table.starts_with("EVENT") && table.contains(" dead "),
        "{table}"
    );
    let none: serde_json::Value = serde_json::from_str(&deprov_cli(
        &env,
        &["notifications", "list", "--state", "pending", "--json"],
    ))
    .unwrap();
    assert_eq!(none.as_array().unwrap().len(), 0);

    // The receiver is fixed; an operator sends the dead events again.
    let (receiver, _) = Receiver::start_on(&addr, &[], Duration::ZERO).await;
    deprov_cli(
        &env,
        &[
            "notifications",
            "redrive",
            "--all-dead",
            "--reason",
            "receiver fixed",
            "--actor",
            "ops",
        ],
    );
    let (actor, action, reason): (String, String, String) = sqlx::query_as(
        "SELECT actor, action, reason FROM deprov.audit_log WHERE action = 'notification.redrive'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(
        (actor.as_str(), action.as_str(), reason.as_str()),
        ("cli:ops", "notification.redrive", "receiver fixed")
    );
    let round = d.round().await.unwrap();
    assert_eq!((round.claimed, round.delivered), (1, 1));
    let hits = receiver.hits();
    assert_eq!(hits.len(), 1);
    hits[0].assert_signed();
    assert_eq!(hits[0].id(), listed[0]["id"].as_str().unwrap());
}
