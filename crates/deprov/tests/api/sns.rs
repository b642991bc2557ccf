//! `aws-sns`: AWS Marketplace SaaS notifications over SNS, signed with the test key, the signing
//! certificate served over HTTPS from loopback ([`crate::sns_server`]).

use deprov::sources::sns::{Kind, Message, sign};
use reqwest::StatusCode;
use rsa::pkcs8::DecodePrivateKey as _;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::helpers::{TestApp, TestOptions, assert_problem, spawn_app_with};
use crate::sns_server::{SnsServer, sns_fixture, sns_fixture_path};

const TOPIC: &str = "arn:aws:sns:us-east-1:287250355862:aws-mp-subscription-notification-test";
const CERT: &str = "/SimpleNotificationService-test.pem";

/// A server with `[sources.sns]` (confirms subscriptions) and `[sources.sns-quiet]` (does not),
/// both trusting the loopback SNS server.
async fn spawn_sns() -> TestApp {
    let entry = |name: &str, confirm: bool| {
        format!(
            r#"
[sources.{name}]
scheme = "aws-sns"
topic_arns = ["{TOPIC}"]
cert_hosts = ["127.0.0.1"]
cert_roots_file = {roots:?}
confirm_subscriptions = {confirm}
decode = [{{ pointer = "/Message", as = "json" }}]
event = {{ pointer = "/Message/action" }}
delete_events = ["unsubscribe-success"]
tenant = {{ pointer = "/Message/customer-identifier" }}
"#,
            roots = sns_fixture_path("ca.pem"),
        )
    };
    spawn_app_with(TestOptions {
        extra_config: format!("{}{}", entry("sns", true), entry("sns-quiet", false)),
        ..Default::default()
    })
    .await
}

fn now_iso(offset_secs: i64) -> String {
    (OffsetDateTime::now_utc() + time::Duration::seconds(offset_secs))
        .format(&Rfc3339)
        .unwrap()
}

/// An AWS Marketplace notification of `action` for customer `X01EXAMPLEX`, unsigned.
fn marketplace(server: &SnsServer, action: &str, id: &str, sha256: bool) -> Message {
    Message {
        kind: Kind::Notification,
        message: json!({
            "action": action, "customer-identifier": "X01EXAMPLEX",
            "product-code": "n0123EXAMPLEXXXXXXXXXXXX", "offer-identifier": "offer-abcexample123",
            "isFreeTrialTermPresent": "false"
        })
        .to_string(),
        message_id: id.into(),
        subject: None,
        timestamp: now_iso(0),
        topic_arn: TOPIC.into(),
        sha256,
        signature: Vec::new(),
        signing_cert_url: server.url(CERT),
        subscribe_url: None,
        token: None,
    }
}

/// The delivery SNS would POST for `m`, signed with the test key.
fn envelope(m: &Message) -> Vec<u8> {
    let key = rsa::PrivateKey::from_pkcs8_der(&sns_fixture("signing.key.der")).unwrap();
    let mut body = json!({
        "Type": m.kind.as_str(), "MessageId": m.message_id, "TopicArn": m.topic_arn,
        "Message": m.message, "Timestamp": m.timestamp,
        "SignatureVersion": if m.sha256 { "2" } else { "1" },
        "Signature": sign(&key, m), "SigningCertURL": m.signing_cert_url,
    });
    if let Some(s) = &m.subject {
        body["Subject"] = json!(s);
    }
    if let (Some(url), Some(token)) = (&m.subscribe_url, &m.token) {
        body["SubscribeURL"] = json!(url);
        body["Token"] = json!(token);
    }
    body.to_string().into_bytes()
}

async fn post(app: &TestApp, source: &str, m: &Message, body: Vec<u8>) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/v1/webhooks/{source}")))
        .header("Content-Type", "text/plain; charset=UTF-8")
        .header("x-amz-sns-message-type", m.kind.as_str())
        .header("x-amz-sns-message-id", m.message_id.as_str())
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn answer(response: reqwest::Response, status: StatusCode) -> Value {
    let got = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    body
}

#[tokio::test]
async fn unsubscribe_success_records_one_job_for_the_customer_and_a_replay_is_a_duplicate() {
    let server = SnsServer::start().await;
    let app = spawn_sns().await;
    sqlx::query("INSERT INTO app.accounts (id) VALUES ('X01EXAMPLEX'), ('X01OTHER')")
        .execute(&app.db)
        .await
        .unwrap();
    let m = marketplace(&server, "unsubscribe-success", "6c1b0b0e-0001", true);
    let first = answer(
        post(&app, "sns", &m, envelope(&m)).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(
        (&first["outcome"], &first["event_type"], &first["duplicate"]),
        (
            &json!("recorded"),
            &json!("unsubscribe-success"),
            &json!(false)
        ),
        "{first}"
    );
    let again = answer(
        post(&app, "sns", &m, envelope(&m)).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["job_id"], first["job_id"]);
    let (subject, source, dups, external): (String, String, i32, Option<String>) = sqlx::query_as(
        "SELECT j.subject, r.source, r.duplicates, r.external_id FROM deprov.deletion_requests r \
         JOIN deprov.jobs j ON j.id = r.job_id",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        (subject.as_str(), source.as_str(), dups, external.as_deref()),
        ("X01EXAMPLEX", "sns", 1, Some("6c1b0b0e-0001"))
    );
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
    // Signature version 1 (SHA1withRSA) verifies too; the certificate was fetched once.
    let v1 = marketplace(&server, "unsubscribe-success", "6c1b0b0e-0002", false);
    let third = answer(
        post(&app, "sns", &v1, envelope(&v1)).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(
        (&third["duplicate"], &third["outcome"]),
        (&json!(false), &json!("recorded"))
    );
    assert_eq!(server.requests(CERT), 1, "cached by URL");
    // The worker deletes the customer's tenant, and only it.
    app.drain_worker().await;
    assert_eq!(
        app.job_state(first["job_id"].as_str().unwrap()).await,
        "completed"
    );
    assert_eq!(
        (
            app.account_exists("X01EXAMPLEX").await,
            app.account_exists("X01OTHER").await
        ),
        (false, true)
    );
}

#[tokio::test]
async fn unsubscribe_pending_is_recorded_as_ignored_and_starts_nothing() {
    let server = SnsServer::start().await;
    let app = spawn_sns().await;
    let m = marketplace(&server, "unsubscribe-pending", "6c1b0b0e-0003", false);
    let body = answer(post(&app, "sns", &m, envelope(&m)).await, StatusCode::OK).await;
    assert_eq!(
        (&body["outcome"], &body["event_type"]),
        (&json!("ignored"), &json!("unsubscribe-pending"))
    );
    app.assert_nothing_stored().await;
    let (event, key): (String, String) =
        sqlx::query_as("SELECT event_type, dedup_key FROM deprov.ignored_deliveries")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (event.as_str(), key.as_str()),
        ("unsubscribe-pending", "6c1b0b0e-0003")
    );
}

#[tokio::test]
async fn messages_failing_a_check_are_refused_401_and_store_nothing() {
    let server = SnsServer::start().await;
    let app = spawn_sns().await;
    let base = marketplace(&server, "unsubscribe-success", "6c1b0b0e-0004", true);
    let mut cases: Vec<(&str, Message, &str)> = Vec::new();
    let with = |f: &dyn Fn(&mut Message)| {
        let mut m = base.clone();
        f(&mut m);
        m
    };
    let port = server.port;
    cases.push((
        "wrong host",
        with(&|m| m.signing_cert_url = format!("https://localhost:{port}{CERT}")),
        "host not in cert_hosts",
    ));
    cases.push((
        "http",
        with(&|m| m.signing_cert_url = format!("http://127.0.0.1:{port}{CERT}")),
        "not https",
    ));
    cases.push((
        "not .pem",
        with(&|m| m.signing_cert_url = format!("https://127.0.0.1:{port}/cert.txt")),
        ".pem",
    ));
    cases.push((
        "topic not allowed",
        with(&|m| m.topic_arn = "arn:aws:sns:us-east-1:1:other".into()),
        "not in topic_arns",
    ));
    cases.push((
        "stale",
        with(&|m| m.timestamp = now_iso(-3601)),
        "older than the tolerance",
    ));
    cases.push((
        "certificate 404",
        with(&|m| m.signing_cert_url = server.url("/missing.pem")),
        "404",
    ));
    for (what, m, says) in &cases {
        let problem = assert_problem(
            post(&app, "sns", m, envelope(m)).await,
            StatusCode::UNAUTHORIZED,
        )
        .await;
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{what}: {problem}"
        );
    }
    // Signed, then one signed field changed in transit.
    let mut body: Value = serde_json::from_slice(&envelope(&base)).unwrap();
    body["Message"] = json!(base.message.replace("X01EXAMPLEX", "X01OTHERXXX"));
    let problem = assert_problem(
        post(&app, "sns", &base, body.to_string().into_bytes()).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("signature does not match"),
        "{problem}"
    );
    // A certificate host failing (5xx) is 503: SNS retries.
    let m = with(&|m| m.signing_cert_url = server.url("/broken.pem"));
    assert_problem(
        post(&app, "sns", &m, envelope(&m)).await,
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    app.assert_nothing_stored_at_all().await;
    assert_eq!(
        server.requests("/cert.txt"),
        0,
        "a refused URL is never fetched"
    );
}

#[tokio::test]
async fn a_subscription_confirmation_is_confirmed_when_asked_and_else_recorded_as_ignored() {
    let server = SnsServer::start().await;
    let app = spawn_sns().await;
    let confirmation = |id: &str, token: &str| Message {
        kind: Kind::SubscriptionConfirmation,
        message: format!(
            "You have chosen to subscribe to the topic {TOPIC}.\nTo confirm the subscription, visit the SubscribeURL included in this message."
        ),
        subscribe_url: Some(server.url(&format!(
            "/confirm?Action=ConfirmSubscription&Token={token}"
        ))),
        token: Some(token.into()),
        ..marketplace(&server, "", id, true)
    };
    let m = confirmation("6c1b0b0e-0005", "tok-on");
    let body = answer(post(&app, "sns", &m, envelope(&m)).await, StatusCode::OK).await;
    assert_eq!(
        (&body["outcome"], &body["event_type"]),
        (&json!("confirmed"), &json!("SubscriptionConfirmation")),
        "{body}"
    );
    assert_eq!(
        server.requests("/confirm?Action=ConfirmSubscription&Token=tok-on"),
        1
    );
    let m = confirmation("6c1b0b0e-0006", "tok-off");
    let body = answer(
        post(&app, "sns-quiet", &m, envelope(&m)).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (&body["outcome"], &body["event_type"]),
        (&json!("ignored"), &json!("SubscriptionConfirmation"))
    );
    assert_eq!(
        server.requests("/confirm?Action=ConfirmSubscription&Token=tok-off"),
        0
    );
    let metrics = deprov::telemetry::render();
    assert!(
        metrics.contains("deprov_sns_unconfirmed_subscriptions_total{source=\"sns-quiet\"} 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("deprov_sns_unconfirmed_subscriptions_total{source=\"sns\"}"));
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT source, event_type FROM deprov.ignored_deliveries ORDER BY source")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(
        rows,
        [
            ("sns".to_owned(), "SubscriptionConfirmation".to_owned()),
            (
                "sns-quiet".to_owned(),
                "SubscriptionConfirmation".to_owned()
            )
        ]
    );
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn a_notification_whose_message_is_not_json_is_refused_400() {
    let server = SnsServer::start().await;
    let app = spawn_sns().await;
    let mut m = marketplace(&server, "unsubscribe-success", "6c1b0b0e-0007", true);
    m.message = "unsubscribe-success for X01EXAMPLEX".into();
    let problem = assert_problem(
        post(&app, "sns", &m, envelope(&m)).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("decode \"/Message\" (as json): not a JSON document"),
        "{problem}"
    );
    app.assert_nothing_stored_at_all().await;
}
