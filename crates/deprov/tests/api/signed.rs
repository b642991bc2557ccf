//! Signed deliveries for the webhook tests: a server with one source per scheme, and builders that
//! sign the fixtures' documented payloads.

use deprov::sources::{github, shopify, slack, standard_webhooks, stripe, unix_now, vercel};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, TestOptions, spawn_app_with};

pub const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const SW_OLD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
pub const STRIPE_SECRET: &str = "whsec_test_secret";
pub const GITHUB_SECRET: &str = "It's a Secret to Everybody";
pub const SHOPIFY_SECRET: &str = "hush";
pub const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
pub const VERCEL_SECRET: &str = "AiK52QASLJXmCXX3X9gO2Zyh";
/// `[sources.osb-platform]` (basic, the `[osb] source`): its user-id and password.
pub const OSB_USER: &str = "cf-platform";
pub const OSB_PASSWORD: &str = "osb-broker-password-0123456789";

pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/webhooks/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A server with one source per signed scheme and an `[osb]` broker (basic); secrets in files of
/// `dir`.
pub async fn spawn_signed(dir: &tempfile::TempDir, worker: bool) -> TestApp {
    let file = |name: &str, secret: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        format!("{:?}", path.display().to_string())
    };
    let extra = format!(
        r#"
[sources.acme]
scheme = "standard-webhooks"
secret_file = [{old}, {sw}]
tenant = {{ pointer = "/data/id" }}
delete_events = ["account.deleted"]
[sources.stripe]
scheme = "stripe"
secret_file = [{stripe}]
tenant = {{ pointer = "/data/object/id" }}
delete_events = ["customer.deleted"]
[sources.github]
scheme = "github"
secret_file = [{github}]
tenant = {{ pointer = "/installation/id" }}
delete_events = ["installation.deleted"]
[sources.shopify]
scheme = "shopify"
secret_file = [{shopify}]
tenant = {{ header = "X-Shopify-Shop-Domain" }}
delete_events = ["shop/redact"]
[sources.slack]
scheme = "slack"
secret_file = [{slack}]
tenant = {{ pointer = "/team_id" }}
delete_events = ["app_uninstalled"]
[sources.vercel-hooks]
scheme = "vercel-webhook"
secret_file = [{vercel}]
tenant = {{ pointer = "/payload/configuration/id" }}
delete_events = ["integration-configuration.removed"]
dedup = "tenant"
tenant_lookup = "SELECT id FROM app.accounts WHERE installation_id = $1"
[sources.osb-platform]
scheme = "basic"
username = "{osb_user}"
secret_file = [{osb}]
[osb]
source = "osb-platform"
tenant_lookup = "SELECT id FROM app.accounts WHERE installation_id = $1"
"#,
        old = file("sw-old", SW_OLD_SECRET),
        sw = file("sw", SW_SECRET),
        stripe = file("stripe", STRIPE_SECRET),
        github = file("github", GITHUB_SECRET),
        shopify = file("shopify", SHOPIFY_SECRET),
        slack = file("slack", SLACK_SECRET),
        vercel = file("vercel", VERCEL_SECRET),
        osb = file("osb", OSB_PASSWORD),
        osb_user = OSB_USER,
    );
    spawn_app_with(TestOptions {
        key_type: "bigint",
        extra_config: extra,
        worker,
        ..Default::default()
    })
    .await
}

/// One delivery: source, headers, body.
#[derive(Clone)]
pub struct Delivery {
    pub source: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl TestApp {
    pub async fn deliver(&self, d: &Delivery) -> reqwest::Response {
        let mut req = self
            .client
            .post(self.url(&format!("/v1/webhooks/{}", d.source)))
            .header("Content-Type", "application/json")
            .body(d.body.clone());
        for (k, v) in &d.headers {
            req = req.header(*k, v);
        }
        req.send().await.unwrap()
    }

    pub async fn count_ignored(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM deprov.ignored_deliveries")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    pub async fn assert_nothing_stored_at_all(&self) {
        self.assert_nothing_stored().await;
        assert_eq!(self.count_ignored().await, 0, "no ignored delivery stored");
    }
}

pub fn sw_delivery(secret: &str, id: &str, ts: i64, body: &[u8]) -> Delivery {
    let key = deprov::sources::Scheme::StandardWebhooks
        .derive_key(secret)
        .unwrap();
    Delivery {
        source: "acme",
        headers: vec![
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", ts.to_string()),
            (
                "webhook-signature",
                standard_webhooks::sign(&key, id, ts, body),
            ),
        ],
        body: body.to_vec(),
    }
}

pub fn stripe_delivery(ts: i64, body: &[u8]) -> Delivery {
    Delivery {
        source: "stripe",
        headers: vec![(
            "Stripe-Signature",
            stripe::sign(STRIPE_SECRET.as_bytes(), ts, body),
        )],
        body: body.to_vec(),
    }
}

pub fn github_delivery(event: &str, delivery: &str, body: &[u8]) -> Delivery {
    Delivery {
        source: "github",
        headers: vec![
            ("X-GitHub-Event", event.to_owned()),
            ("X-GitHub-Delivery", delivery.to_owned()),
            (
                "X-Hub-Signature-256",
                github::sign(GITHUB_SECRET.as_bytes(), body),
            ),
        ],
        body: body.to_vec(),
    }
}

pub fn shopify_delivery(topic: &str, event_id: &str, body: &[u8]) -> Delivery {
    Delivery {
        source: "shopify",
        headers: vec![
            ("X-Shopify-Topic", topic.to_owned()),
            ("X-Shopify-Shop-Domain", "{shop}.myshopify.com".to_owned()),
            ("X-Shopify-Event-Id", event_id.to_owned()),
            (
                "X-Shopify-Hmac-Sha256",
                shopify::sign(SHOPIFY_SECRET.as_bytes(), body),
            ),
        ],
        body: body.to_vec(),
    }
}

pub fn slack_delivery(ts: i64, body: &[u8]) -> Delivery {
    Delivery {
        source: "slack",
        headers: vec![
            ("X-Slack-Request-Timestamp", ts.to_string()),
            (
                "X-Slack-Signature",
                slack::sign(SLACK_SECRET.as_bytes(), ts, body),
            ),
        ],
        body: body.to_vec(),
    }
}

pub fn vercel_delivery(body: &[u8]) -> Delivery {
    Delivery {
        source: "vercel-hooks",
        headers: vec![(
            "x-vercel-signature",
            vercel::sign(VERCEL_SECRET.as_bytes(), body),
        )],
        body: body.to_vec(),
    }
}

pub fn slack_uninstall() -> Vec<u8> {
    json!({"token": "x", "team_id": "T1DC2JH3J", "api_app_id": "A1", "type": "event_callback",
           "event_id": "Ev0PV52K21", "event_time": 1_700_000_000, "event": {"type": "app_uninstalled"}})
    .to_string()
    .into_bytes()
}

/// One deleting delivery per scheme, built from the fixtures' documented payloads.
pub fn deleting_deliveries() -> Vec<(Delivery, &'static str, &'static str)> {
    let now = unix_now();
    let acme =
        br#"{"type":"account.deleted","timestamp":"2026-11-29T20:26:10Z","data":{"id":"acct_42"}}"#;
    vec![
        // Signed with the older of the two configured secrets: rotation.
        (
            sw_delivery(SW_OLD_SECRET, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", now, acme),
            "tenant",
            "acct_42",
        ),
        (
            stripe_delivery(now, &fixture("stripe_customer.deleted.json")),
            "tenant",
            "cus_QjC48SZoGC5HV5",
        ),
        (
            github_delivery(
                "installation",
                "72d3162e-cc78-11e3-81ab-4c9367dc0958",
                &fixture("github_installation.deleted.json"),
            ),
            "tenant",
            "2",
        ),
        (
            shopify_delivery(
                "shop/redact",
                "evt-shop-1",
                &fixture("shopify_shop.redact.json"),
            ),
            "tenant",
            "{shop}.myshopify.com",
        ),
        (
            slack_delivery(now, &slack_uninstall()),
            "tenant",
            "T1DC2JH3J",
        ),
        (
            vercel_delivery(&fixture("vercel_integration-configuration.removed.json")),
            "lookup",
            "vercel-hooks:my_config_id",
        ),
    ]
}

pub async fn answer(response: reqwest::Response, status: StatusCode) -> Value {
    let got = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    body
}
