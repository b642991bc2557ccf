//! Operator tokens with roles (`deprov tokens`, `deprov.operator_tokens`): created by the real
//! command line, checked by the server with their role, stored only as digests, revoked within the
//! cache TTL; the bootstrap `DEPROV_OPERATOR_TOKEN` keeps working.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Digest as _;

use crate::helpers::{
    OPERATOR_TOKEN, TestApp, TestOptions, accepted, assert_problem, deletion, spawn_app_with,
};

/// Runs `deprov tokens ARGS` (the command line's own code, in process: the shared build directory's
/// binary may belong to another checkout) against the app's state database as actor `admin`;
/// returns its stdout.
async fn try_deprov(app: &TestApp, args: &[&str]) -> anyhow::Result<String> {
    use clap::Parser as _;
    let mut argv = vec!["deprov", "tokens", "--database-url", &app.db_url];
    argv.extend_from_slice(args);
    let with_actor = matches!(args.first(), Some(&"create" | &"revoke"));
    if with_actor {
        argv.extend_from_slice(&["--actor", "admin"]);
    }
    let deprov::cli::Command::Tokens(tokens) = deprov::cli::Cli::try_parse_from(argv)?.command
    else {
        unreachable!("parsed as tokens")
    };
    deprov::cli::tokens_execute(&tokens).await
}

async fn deprov(app: &TestApp, args: &[&str]) -> String {
    try_deprov(app, args)
        .await
        .unwrap_or_else(|e| panic!("deprov tokens {args:?} failed: {e:#}"))
}

/// `deprov tokens create --name NAME --role ROLE`; returns the token it printed.
pub(crate) async fn create(app: &TestApp, name: &str, role: &str) -> String {
    let out = deprov(app, &["create", "--name", name, "--role", role]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "only the token on stdout: {out:?}");
    lines[0].to_owned()
}

pub(crate) async fn get(app: &TestApp, token: &str, path: &str) -> reqwest::Response {
    app.client
        .get(app.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

async fn put_switch(app: &TestApp, token: &str, engaged: bool) -> reqwest::Response {
    app.client
        .put(app.url("/v1/kill-switch"))
        .bearer_auth(token)
        .json(&json!({"engaged": engaged, "reason": "token test"}))
        .send()
        .await
        .unwrap()
}

/// An MD5 of every row of every table in schema `deprov` except the token table (whose
/// `last_used_at` a server writes), by table name. The server formats each table's query (`%I`).
async fn snapshot(app: &TestApp) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT table_name::text, (xpath('/row/d/text()', query_to_xml(format( \
           'SELECT md5(coalesce(string_agg(t::text, %L ORDER BY t::text), %L)) AS d FROM %I.%I t', \
           E'\\n', '', table_schema, table_name), false, true, '')))[1]::text \
         FROM information_schema.tables \
         WHERE table_schema = 'deprov' AND table_type = 'BASE TABLE' AND table_name <> 'operator_tokens' \
         ORDER BY 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn created_tokens_work_with_their_role_are_stored_only_as_digests_and_name_the_actor() {
    let app = spawn_app_with(TestOptions::default()).await;
    let alice = create(&app, "alice", "operator").await;
    let bob = create(&app, "bob", "read-only").await;
    assert!(alice.starts_with("dpv_") && alice.len() == 47, "{alice}");
    assert_ne!(alice, bob);

    // Not in clear: no column of any token row contains either token; the digest is SHA-256.
    let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(
        "SELECT row_to_json(t)::text, token_sha256 FROM deprov.operator_tokens t ORDER BY name",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    for (row, _) in &rows {
        for token in [&alice, &bob] {
            assert!(
                !row.contains(token.as_str()),
                "token stored in clear: {row}"
            );
            assert!(
                !row.contains(&token[4..]),
                "token body stored in clear: {row}"
            );
        }
    }
    assert_eq!(rows[0].1, sha2::Sha256::digest(alice.as_bytes()).to_vec());
    assert_eq!(rows[1].1, sha2::Sha256::digest(bob.as_bytes()).to_vec());

    // read-only reads every operator GET route.
    for path in ["/v1/jobs", "/v1/kill-switch", "/v1/audit"] {
        assert_eq!(
            get(&app, &bob, path).await.status(),
            StatusCode::OK,
            "{path}"
        );
    }
    // operator changes state; the audit actor and the switch's changed_by are the token's name.
    let response = put_switch(&app, &alice, true).await;
    assert_eq!(response.status(), StatusCode::OK);
    let set: Value = response.json().await.unwrap();
    assert_eq!(set["changed_by"], "alice");
    let (actor, action, changed_by): (String, String, String) = sqlx::query_as(
        "SELECT a.actor, a.action, k.changed_by FROM deprov.audit_log a, deprov.kill_switch k \
         ORDER BY a.id DESC LIMIT 1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        (actor.as_str(), action.as_str(), changed_by.as_str()),
        ("alice", "kill_switch.engage", "alice")
    );
    // Token creation is an operator action too, by the command line's actor.
    let created: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT actor, action, target FROM deprov.audit_log WHERE action LIKE 'token.%' ORDER BY id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    let expected = |name: &str| {
        (
            "cli:admin".into(),
            "token.create".into(),
            format!("token:{name}"),
        )
    };
    assert_eq!(created, vec![expected("alice"), expected("bob")]);

    // `tokens list`: a table with a header, and JSON without any token or digest.
    let table = deprov(&app, &["list"]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("ID ") && lines[0].contains("LAST USED"),
        "{table}"
    );
    assert!(
        lines[1].contains(" bob ") && lines[1].contains(" read-only "),
        "{table}"
    );
    assert!(
        lines[2].contains(" alice ") && lines[2].contains(" operator "),
        "{table}"
    );
    let listed: Value = serde_json::from_str(&deprov(&app, &["list", "--json"]).await).unwrap();
    let names: Vec<&str> = listed["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bob", "alice"]);
    let text = listed.to_string();
    assert!(
        !text.contains(&alice[4..]) && !text.contains("sha256"),
        "{text}"
    );

    // A second active token of the same name is refused, and changes nothing.
    let refused = try_deprov(&app, &["create", "--name", "alice", "--role", "read-only"])
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("exists and is not revoked"),
        "{refused:#}"
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM deprov.operator_tokens")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(count, 2);
}

#[tokio::test]
async fn a_read_only_token_is_refused_on_every_mutating_operator_route_and_changes_nothing() {
    let app = spawn_app_with(TestOptions::default()).await;
    let job_id = accepted(app.post_deletion(&deletion("acct_1")).await).await["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let reader = create(&app, "reader", "read-only").await;
    let before = snapshot(&app).await;
    assert!(before.iter().any(|(t, _)| t == "audit_log"), "{before:?}");

    // Every operation of the generated spec that needs the operator token and is not a GET.
    let spec = serde_json::to_value(deprov::http::openapi()).unwrap();
    let mut refused = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let operator = op["security"]
                .as_array()
                .is_some_and(|s| s.iter().any(|r| r.get("operator_token").is_some()));
            if !operator || method == "get" {
                continue;
            }
            let mut url = path.replace("{job_id}", &job_id);
            while let (Some(a), Some(b)) = (url.find('{'), url.find('}')) {
                url.replace_range(a..=b, "x");
            }
            let response = app
                .client
                .request(method.to_uppercase().parse().unwrap(), app.url(&url))
                .bearer_auth(&reader)
                .json(&json!({"engaged": true, "reason": "read-only test"}))
                .send()
                .await
                .unwrap();
            let problem = assert_problem(response, StatusCode::FORBIDDEN).await;
            assert!(
                problem["detail"].as_str().unwrap().contains("read-only"),
                "{method} {path}: {problem}"
            );
            refused.push(format!("{} {path}", method.to_uppercase()));
        }
    }
    assert!(
        refused.contains(&"PUT /v1/kill-switch".to_owned()),
        "{refused:?}"
    );
    assert_eq!(
        snapshot(&app).await,
        before,
        "refused requests change nothing"
    );
    let (engaged, latest): (bool, i64) =
        sqlx::query_as("SELECT engaged, latest_version FROM deprov.kill_switch")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((engaged, latest), (false, 0));
    // The same token reads.
    assert_eq!(
        get(&app, &reader, "/v1/kill-switch").await.status(),
        StatusCode::OK
    );
    eprintln!("refused for read-only: {refused:?}");
}

#[tokio::test]
async fn a_revoked_token_is_refused_within_the_cache_ttl() {
    let ttl = Duration::from_millis(300);
    let app = spawn_app_with(TestOptions {
        extra_config: format!("[operator_tokens]\ncache_ttl = \"{}ms\"\n", ttl.as_millis()),
        ..Default::default()
    })
    .await;
    let carol = create(&app, "carol", "operator").await;
    assert_eq!(get(&app, &carol, "/v1/jobs").await.status(), StatusCode::OK);
    deprov(&app, &["revoke", "carol", "--reason", "laptop lost"]).await;
    let revoked = Instant::now();
    let deadline = revoked + Duration::from_secs(10);
    let mut accepted_after = 0;
    loop {
        let response = get(&app, &carol, "/v1/jobs").await;
        if response.status() == StatusCode::UNAUTHORIZED {
            assert_problem(response, StatusCode::UNAUTHORIZED).await;
            break;
        }
        assert_eq!(response.status(), StatusCode::OK);
        accepted_after += 1;
        assert!(Instant::now() < deadline, "revoked token still accepted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = revoked.elapsed();
    eprintln!(
        "revoked token refused after {took:?} ({accepted_after} requests accepted meanwhile)"
    );
    // Within the TTL, plus a margin for one table read and scheduling on a loaded machine.
    assert!(took <= ttl + Duration::from_millis(700), "{took:?}");
    // Refused on a mutating route too, and nothing changed.
    assert_problem(
        put_switch(&app, &carol, true).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;
    let (revoked_by, last_used, latest): (Option<String>, Option<time::OffsetDateTime>, i64) =
        sqlx::query_as(
            "SELECT t.revoked_by, t.last_used_at, k.latest_version \
             FROM deprov.operator_tokens t, deprov.kill_switch k WHERE t.name = 'carol'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(revoked_by.as_deref(), Some("cli:admin"));
    assert!(
        last_used.is_some(),
        "the use was recorded at the next table read"
    );
    assert_eq!(latest, 0);
    let audit: (String, String, String) = sqlx::query_as(
        "SELECT actor, target, reason FROM deprov.audit_log WHERE action = 'token.revoke'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        audit,
        (
            "cli:admin".into(),
            "token:carol".into(),
            "laptop lost".into()
        )
    );
    // The name is free again: a new carol works, the old token stays refused.
    let carol2 = create(&app, "carol", "read-only").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&app, &carol2, "/v1/jobs").await.status() != StatusCode::OK {
        assert!(Instant::now() < deadline, "new token never accepted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        get(&app, &carol, "/v1/jobs").await.status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn the_bootstrap_env_token_keeps_working_beside_table_tokens() {
    // With DEPROV_OPERATOR_TOKEN: it is an operator, actor env:operator, whatever the table holds.
    let app = spawn_app_with(TestOptions::default()).await;
    create(&app, "dave", "read-only").await;
    let response = put_switch(&app, OPERATOR_TOKEN, true).await;
    assert_eq!(response.status(), StatusCode::OK);
    let actor: String = sqlx::query_scalar(
        "SELECT actor FROM deprov.audit_log WHERE action = 'kill_switch.engage'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(actor, "env:operator");

    // Without it, the operator API is disabled (403) until a token exists; then tokens work and
    // a missing or wrong token is 401.
    let app = spawn_app_with(TestOptions {
        operator: false,
        extra_config: "[operator_tokens]\ncache_ttl = \"0s\"\n".into(),
        ..Default::default()
    })
    .await;
    assert_problem(
        get(&app, OPERATOR_TOKEN, "/v1/jobs").await,
        StatusCode::FORBIDDEN,
    )
    .await;
    let erin = create(&app, "erin", "operator").await;
    assert_eq!(get(&app, &erin, "/v1/audit").await.status(), StatusCode::OK);
    assert_problem(
        get(&app, OPERATOR_TOKEN, "/v1/jobs").await,
        StatusCode::UNAUTHORIZED,
    )
    .await;
    assert_problem(app.get("/v1/jobs").await, StatusCode::UNAUTHORIZED).await;
    assert_eq!(put_switch(&app, &erin, true).await.status(), StatusCode::OK);
    let actor: String = sqlx::query_scalar("SELECT changed_by FROM deprov.kill_switch")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(actor, "erin");
}
