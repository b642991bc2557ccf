//! Refused and ignored deliveries are counted in `GET /metrics`: refusals per configured source
//! (`unknown` for a name that is not one) and status, ignored deliveries per source and reason.

use deprov::sources::basic::header_value;
use deprov::sources::unix_now;
use reqwest::StatusCode;

use crate::helpers::{TestApp, TestOptions, assert_problem, spawn_app_with};
use crate::process::Metrics;
use crate::signed::*;

const REFUSED: &str = "deprov_webhook_deliveries_refused_total";
const IGNORED: &str = "deprov_webhook_deliveries_ignored_total";

async fn scrape(app: &crate::helpers::TestApp) -> Metrics {
    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    Metrics::parse(&response.text().await.unwrap())
}

/// A server whose standard-webhooks source is `sw` and whose broker's `basic` source is `broker`:
/// names no other test uses, since the counters are the test process's (`cargo test` runs many
/// tests in one process).
async fn spawn_counted(dir: &tempfile::TempDir, sw: &str, broker: &str) -> TestApp {
    let file = |name: &str, secret: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        format!("{:?}", path.display().to_string())
    };
    let extra = format!(
        "[sources.{sw}]\nscheme = \"standard-webhooks\"\nsecret_file = [{sw_secret}]\n\
         tenant = {{ pointer = \"/data/id\" }}\ndelete_events = [\"account.deleted\"]\n\
         [sources.{broker}]\nscheme = \"basic\"\nusername = \"{OSB_USER}\"\nsecret_file = [{osb}]\n\
         [osb]\nsource = \"{broker}\"\n",
        sw_secret = file("sw", SW_SECRET),
        osb = file("osb", OSB_PASSWORD),
    );
    spawn_app_with(TestOptions {
        key_type: "bigint",
        extra_config: extra,
        ..Default::default()
    })
    .await
}

#[tokio::test]
async fn refusals_are_counted_per_configured_source_and_status_and_other_names_as_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_counted(&dir, "refused-sw", "refused-broker").await;
    // A wrong signature: the body changed after signing.
    let body = br#"{"type":"account.deleted","data":{"id":"acct_1"}}"#;
    let mut forged = Delivery {
        source: "refused-sw",
        ..sw_delivery(SW_SECRET, "msg_forged", unix_now(), body)
    };
    forged.body = br#"{"type":"account.deleted","data":{"id":"acct_2"}}"#.to_vec();
    for _ in 0..2 {
        assert_problem(app.deliver(&forged).await, StatusCode::UNAUTHORIZED).await;
    }
    // A verified delivery whose body is not JSON.
    let not_json = Delivery {
        source: "refused-sw",
        ..sw_delivery(SW_SECRET, "msg_text", unix_now(), b"not json")
    };
    assert_problem(app.deliver(&not_json).await, StatusCode::BAD_REQUEST).await;
    // Names that are not configured: one label, not one per path segment.
    for name in ["no-such-source", "another-one"] {
        let unknown = Delivery {
            source: name,
            ..forged.clone()
        };
        assert_problem(app.deliver(&unknown).await, StatusCode::UNAUTHORIZED).await;
    }
    // The broker's HTTP Basic password, wrong.
    let wrong = header_value(OSB_USER, "not-the-password");
    let response = app
        .client
        .delete(
            app.url("/v2/service_instances/inst-1?service_id=s&plan_id=p&accepts_incomplete=true"),
        )
        .header("Authorization", wrong)
        .header("X-Broker-API-Version", "2.17")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    app.assert_nothing_stored_at_all().await;

    let m = scrape(&app).await;
    assert_eq!(
        m.value(REFUSED, &[("source", "refused-sw"), ("status", "401")]),
        2.0
    );
    assert_eq!(
        m.value(REFUSED, &[("source", "refused-sw"), ("status", "400")]),
        1.0
    );
    // Other tests of this process may send to names nobody configured too: at least these two.
    assert!(m.value(REFUSED, &[("source", "unknown"), ("status", "401")]) >= 2.0);
    assert_eq!(
        m.value(REFUSED, &[("source", "refused-broker"), ("status", "401")]),
        1.0
    );
    assert!(
        !m.text.contains("no-such-source") && !m.text.contains("another-one"),
        "{}",
        m.text
    );
    assert_eq!(
        m.get(IGNORED, &[("source", "refused-sw")]),
        None,
        "nothing was ignored"
    );
}

#[tokio::test]
async fn a_verified_delivery_without_its_event_type_is_acknowledged_and_counted_apart() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_counted(&dir, "ignoring-sw", "ignoring-broker").await;
    let to_source = |d: Delivery| Delivery {
        source: "ignoring-sw",
        ..d
    };
    // The sender renamed `type`: acknowledged 200 as ignored, with no event type.
    let renamed = br#"{"Type":"account.deleted","data":{"id":"acct_1"}}"#;
    let d = to_source(sw_delivery(SW_SECRET, "msg_renamed", unix_now(), renamed));
    let a = answer(app.deliver(&d).await, StatusCode::OK).await;
    assert_eq!(
        (a["outcome"].as_str(), a["event_type"].is_null()),
        (Some("ignored"), true),
        "{a}"
    );
    // An object where `type` should be: the same.
    let number = br#"{"type":{"name":"account.deleted"},"data":{"id":"acct_1"}}"#;
    let d = to_source(sw_delivery(SW_SECRET, "msg_number", unix_now(), number));
    let a = answer(app.deliver(&d).await, StatusCode::OK).await;
    assert_eq!(a["event_type"], serde_json::Value::Null, "{a}");
    // An event type that does not delete.
    let updated = br#"{"type":"account.updated","data":{"id":"acct_1"}}"#;
    let d = to_source(sw_delivery(SW_SECRET, "msg_updated", unix_now(), updated));
    let a = answer(app.deliver(&d).await, StatusCode::OK).await;
    assert_eq!(a["event_type"], "account.updated", "{a}");
    assert_eq!((app.count_ignored().await, app.count_jobs().await), (3, 0));

    let m = scrape(&app).await;
    assert_eq!(
        m.value(
            IGNORED,
            &[("source", "ignoring-sw"), ("reason", "no_event_type")]
        ),
        2.0
    );
    assert_eq!(
        m.value(
            IGNORED,
            &[("source", "ignoring-sw"), ("reason", "not_a_delete_event")]
        ),
        1.0
    );
    assert_eq!(
        m.get(REFUSED, &[("source", "ignoring-sw")]),
        None,
        "nothing was refused"
    );
}

/// The real `deprov serve` logs each refusal and each delivery without an event type at WARN (the
/// default level shown), naming the source and the reason and never the credential sent.
#[tokio::test]
async fn refusals_and_deliveries_without_an_event_type_are_logged_at_warn() {
    let logs = tempfile::NamedTempFile::new().unwrap();
    let pg = crate::process::start_pg(None).await;
    let extra = "[sources.hooks]\ntoken = \"hooks-token-0123456789abcdef\"\n\
                 event = { pointer = \"/action\" }\ntenant = { pointer = \"/tenant\" }\n\
                 delete_events = [\"deleted\"]\n";
    let mut process = crate::process::spawn_with(
        pg,
        "serve",
        extra,
        "warn",
        std::process::Stdio::null(),
        std::process::Stdio::from(logs.reopen().unwrap()),
    )
    .await;
    let post = |source: &str, token: &str, body: &'static str| {
        process
            .client
            .post(process.url(&format!("/v1/webhooks/{source}")))
            .bearer_auth(token)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let wrong = post("hooks", "wrong-token-secret-value", "{}")
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let unknown = post("no-such-source", "x", "{}").await.unwrap();
    assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);
    let renamed = post(
        "hooks",
        "hooks-token-0123456789abcdef",
        r#"{"Action":"deleted","tenant":"7"}"#,
    )
    .await
    .unwrap();
    assert_eq!(renamed.status(), StatusCode::OK);
    let m = process.scrape().await;
    assert_eq!(
        m.value(REFUSED, &[("source", "hooks"), ("status", "401")]),
        1.0
    );
    assert_eq!(
        m.value(REFUSED, &[("source", "unknown"), ("status", "401")]),
        1.0
    );
    assert_eq!(
        m.value(IGNORED, &[("source", "hooks"), ("reason", "no_event_type")]),
        1.0
    );
    process
        .terminate(std::time::Duration::from_secs(15))
        .await
        .expect("deprov stops on SIGTERM");
    let text = std::fs::read_to_string(logs.path()).unwrap();
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
            .to_owned()
    };
    let refused = line("webhook delivery refused");
    assert!(
        refused.contains("WARN") && refused.contains("hooks") && refused.contains("wrong token"),
        "{refused}"
    );
    let unknown = text
        .lines()
        .filter(|l| l.contains("webhook delivery refused"))
        .find(|l| l.contains("unknown"))
        .unwrap_or_else(|| panic!("no refusal of an unknown source in:\n{text}"));
    assert!(unknown.contains("WARN"), "{unknown}");
    let ignored = line("webhook ignored");
    assert!(
        ignored.contains("WARN") && ignored.contains("hooks"),
        "{ignored}"
    );
    assert!(!text.contains("wrong-token-secret-value"), "{text}");
    assert!(!text.contains("hooks-token-0123456789abcdef"), "{text}");
}
