//! Open Service Broker deprovisioning (`[osb]`, `scheme = "basic"`): the refusals before anything is
//! stored (version header, credentials, `accepts_incomplete`, `service_id` / `plan_id`), the OSB
//! error body, and a `basic` source on the webhook route. The flows a worker completes are in
//! `osb_worker`.

use deprov::sources::basic::header_value;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{SOURCE_TOKEN, TestApp, TestOptions, spawn_app_with};

pub const USER: &str = "cf-platform";
pub const PASSWORD: &str = "broker-password-0123456789";
pub const OLD_PASSWORD: &str = "broker-password-previous-0123";
pub const QUERY: &str = "service_id=svc-1&plan_id=plan-1&accepts_incomplete=true";

/// A server with `[sources.platform]` (basic, two passwords in files) as `[osb] source`; with
/// `lookup`, `[osb] tenant_lookup` reads `app.accounts.installation_id`.
pub struct Broker {
    pub app: TestApp,
    _secrets: tempfile::TempDir,
}

pub async fn spawn_broker(lookup: bool) -> Broker {
    let secrets = tempfile::tempdir().unwrap();
    let file = |name: &str, secret: &str| {
        let path = secrets.path().join(name);
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        format!("{:?}", path.display().to_string())
    };
    let (current, old) = (file("current", PASSWORD), file("old", OLD_PASSWORD));
    let lookup = if lookup {
        "tenant_lookup = \"SELECT id FROM app.accounts WHERE installation_id = $1\"\n"
    } else {
        ""
    };
    let app = spawn_app_with(TestOptions {
        extra_config: format!(
            "[sources.platform]\nscheme = \"basic\"\nusername = \"{USER}\"\n\
             secret_file = [{old}, {current}]\n\
             [sources.addon]\nscheme = \"basic\"\nusername = \"heroku\"\nsecret_file = [{current}]\n\
             tenant = {{ pointer = \"/tenant\" }}\n\
             [osb]\nsource = \"platform\"\n{lookup}"
        ),
        ..Default::default()
    })
    .await;
    Broker {
        app,
        _secrets: secrets,
    }
}

impl Broker {
    /// `DELETE /v2/service_instances/{instance}?{query}` with `auth` (an Authorization value) and
    /// `version` (`X-Broker-API-Version`), each left out when `None`.
    pub async fn delete(
        &self,
        instance: &str,
        query: &str,
        auth: Option<&str>,
        version: Option<&str>,
    ) -> reqwest::Response {
        let url = self
            .app
            .url(&format!("/v2/service_instances/{instance}?{query}"));
        send(self.app.client.delete(url), auth, version).await
    }

    /// [`Self::delete`] as a platform sends it: valid credentials, version 2.17, the usual query.
    pub async fn deprovision(&self, instance: &str) -> reqwest::Response {
        self.delete(instance, QUERY, Some(&auth()), Some("2.17"))
            .await
    }

    /// `GET /v2/service_instances/{instance}/last_operation?{query}`.
    pub async fn poll(
        &self,
        instance: &str,
        query: &str,
        auth: Option<&str>,
        version: Option<&str>,
    ) -> reqwest::Response {
        let url = self.app.url(&format!(
            "/v2/service_instances/{instance}/last_operation?{query}"
        ));
        send(self.app.client.get(url), auth, version).await
    }

    /// [`Self::poll`] as a platform sends it.
    pub async fn last_operation(&self, instance: &str) -> reqwest::Response {
        self.poll(
            instance,
            "service_id=svc-1&plan_id=plan-1",
            Some(&auth()),
            Some("2.17"),
        )
        .await
    }

    /// Runs a worker on the server's configuration until no job is left to claim.
    pub async fn drain(&self) {
        self.app.drain_worker().await;
    }
}

async fn send(
    req: reqwest::RequestBuilder,
    auth: Option<&str>,
    version: Option<&str>,
) -> reqwest::Response {
    let req = match auth {
        Some(a) => req.header("Authorization", a),
        None => req,
    };
    let req = match version {
        Some(v) => req.header("X-Broker-API-Version", v),
        None => req,
    };
    req.send().await.unwrap()
}

/// The platform's valid `Authorization` value.
pub fn auth() -> String {
    header_value(USER, PASSWORD)
}

/// Asserts `status` and the OSB error body (`application/json`, non-empty `error` and
/// `description`); returns the body.
pub async fn assert_osb_error(response: reqwest::Response, status: StatusCode) -> Value {
    let got = response.status();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    assert_eq!(content_type, "application/json");
    for field in ["error", "description"] {
        assert!(
            body[field].as_str().is_some_and(|s| !s.is_empty()),
            "OSB error lacks {field}: {body}"
        );
    }
    body
}

#[tokio::test]
async fn a_missing_or_unsupported_api_version_is_412_and_nothing_is_stored() {
    let broker = spawn_broker(false).await;
    let body = assert_osb_error(
        broker.delete("acct_1", QUERY, Some(&auth()), None).await,
        StatusCode::PRECONDITION_FAILED,
    )
    .await;
    assert_eq!(body["error"], "MissingApiVersion");
    assert!(
        body["description"].as_str().unwrap().contains("2.12"),
        "{body}"
    );
    for version in ["2.11", "3.0", "2", "2.x", "1.17", ""] {
        let body = assert_osb_error(
            broker
                .delete("acct_1", QUERY, Some(&auth()), Some(version))
                .await,
            StatusCode::PRECONDITION_FAILED,
        )
        .await;
        assert_eq!(body["error"], "UnsupportedApiVersion", "{version}");
    }
    assert_osb_error(
        broker.poll("acct_1", "", Some(&auth()), Some("2.11")).await,
        StatusCode::PRECONDITION_FAILED,
    )
    .await;
    broker.app.assert_nothing_stored().await;
}

#[tokio::test]
async fn wrong_or_missing_credentials_are_401_with_a_basic_challenge_and_nothing_is_stored() {
    let broker = spawn_broker(false).await;
    let wrong = [
        None,
        Some(header_value(USER, "broker-password-0123456788")),
        Some(header_value("someone-else", PASSWORD)),
        Some(format!("Bearer {SOURCE_TOKEN}")),
        Some("Basic !!!".to_owned()),
    ];
    for auth in &wrong {
        let response = broker
            .delete("acct_1", QUERY, auth.as_deref(), Some("2.17"))
            .await;
        assert_eq!(
            response.headers()["www-authenticate"],
            "Basic realm=\"deprov\"",
            "{auth:?}"
        );
        let body = assert_osb_error(response, StatusCode::UNAUTHORIZED).await;
        assert!(
            !body.to_string().contains(PASSWORD),
            "no password echoed: {body}"
        );
        assert_osb_error(
            broker
                .poll("acct_1", "", auth.as_deref(), Some("2.17"))
                .await,
            StatusCode::UNAUTHORIZED,
        )
        .await;
    }
    broker.app.assert_nothing_stored().await;
}

#[tokio::test]
async fn without_accepts_incomplete_it_is_422_async_required_and_nothing_is_stored() {
    let broker = spawn_broker(false).await;
    for query in [
        "service_id=svc-1&plan_id=plan-1",
        "service_id=svc-1&plan_id=plan-1&accepts_incomplete=false",
    ] {
        let body = assert_osb_error(
            broker
                .delete("acct_1", query, Some(&auth()), Some("2.17"))
                .await,
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
        assert_eq!(body["error"], "AsyncRequired", "{query}");
    }
    broker.app.assert_nothing_stored().await;
}

#[tokio::test]
async fn a_missing_or_empty_service_id_or_plan_id_is_400_and_nothing_is_stored() {
    let broker = spawn_broker(false).await;
    for query in [
        "plan_id=plan-1&accepts_incomplete=true",
        "service_id=svc-1&accepts_incomplete=true",
        "service_id=&plan_id=plan-1&accepts_incomplete=true",
        "service_id=svc-1&plan_id=plan-1&accepts_incomplete=maybe",
        "service_id=svc%01&plan_id=plan-1&accepts_incomplete=true",
    ] {
        let body = assert_osb_error(
            broker
                .delete("acct_1", query, Some(&auth()), Some("2.17"))
                .await,
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert_eq!(body["error"], "BadRequest", "{query}");
    }
    assert_osb_error(
        broker
            .poll("acct_1", "operation=", Some(&auth()), Some("2.17"))
            .await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    broker.app.assert_nothing_stored().await;
}

/// Also: the platform's `X-Broker-API-Request-Identity` is echoed, on errors too.
#[tokio::test]
async fn last_operation_of_an_instance_never_deprovisioned_is_404() {
    let broker = spawn_broker(false).await;
    let response = broker
        .app
        .client
        .get(
            broker
                .app
                .url("/v2/service_instances/acct_never/last_operation"),
        )
        .header("Authorization", auth())
        .header("X-Broker-API-Version", "2.17")
        .header("X-Broker-API-Request-Identity", "req-7f3a")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["x-broker-api-request-identity"],
        "req-7f3a"
    );
    let body = assert_osb_error(response, StatusCode::NOT_FOUND).await;
    assert_eq!(body["error"], "NotFound");
}

#[tokio::test]
async fn without_an_osb_section_the_routes_are_404() {
    let app = spawn_app_with(TestOptions::default()).await;
    let response = app
        .client
        .delete(app.url(&format!("/v2/service_instances/acct_1?{QUERY}")))
        .header("X-Broker-API-Version", "2.17")
        .send()
        .await
        .unwrap();
    assert_osb_error(response, StatusCode::NOT_FOUND).await;
    app.assert_nothing_stored().await;
}

/// A `basic` source on `POST /v1/webhooks/{source}`, as a Heroku-style add-on caller uses it: a
/// right password records the deletion (every retry one request), a wrong one is 401 with the Basic
/// challenge.
#[tokio::test]
async fn a_basic_source_sends_webhooks_like_a_bearer_source() {
    let broker = spawn_broker(false).await;
    let app = &broker.app;
    let post = |auth: String| {
        app.client
            .post(app.url("/v1/webhooks/addon"))
            .header("Authorization", auth)
            .json(&json!({"tenant": "acct_7"}))
            .send()
    };
    let wrong = post(header_value("heroku", "nope")).await.unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        wrong.headers()["www-authenticate"],
        "Basic realm=\"deprov\""
    );
    app.assert_nothing_stored().await;
    for _ in 0..3 {
        let response = post(header_value("heroku", PASSWORD)).await.unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }
    let (source, subject): (String, String) =
        sqlx::query_as("SELECT source, subject FROM deprov.deletion_requests")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((source.as_str(), subject.as_str()), ("addon", "acct_7"));
    assert_eq!((app.count_jobs().await, app.count_requests().await), (1, 1));
}

/// Catalog, provision, update, fetch and bind are not served: 4xx (never a 5xx, which would make a
/// platform send an orphan-mitigation DELETE), nothing stored.
#[tokio::test]
async fn catalog_provision_update_and_bind_are_refused_with_a_4xx() {
    let broker = spawn_broker(false).await;
    let app = &broker.app;
    let send = |method: reqwest::Method, path: &str| {
        app.client
            .request(method, app.url(path))
            .header("Authorization", auth())
            .header("X-Broker-API-Version", "2.17")
            .json(&json!({"service_id": "svc-1", "plan_id": "plan-1"}))
            .send()
    };
    use reqwest::Method;
    for (method, path, status) in [
        (Method::GET, "/v2/catalog", StatusCode::NOT_FOUND),
        (
            Method::PUT,
            "/v2/service_instances/acct_1",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::PATCH,
            "/v2/service_instances/acct_1",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::GET,
            "/v2/service_instances/acct_1",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::PUT,
            "/v2/service_instances/acct_1/service_bindings/b1",
            StatusCode::NOT_FOUND,
        ),
        (
            Method::DELETE,
            "/v2/service_instances/acct_1/service_bindings/b1",
            StatusCode::NOT_FOUND,
        ),
    ] {
        let response = send(method.clone(), path).await.unwrap();
        assert_eq!(response.status(), status, "{method} {path}");
    }
    app.assert_nothing_stored().await;
}

#[tokio::test]
async fn a_repeated_api_version_is_412_saying_so_and_any_later_2x_is_accepted() {
    let broker = spawn_broker(false).await;
    let url = broker
        .app
        .url(&format!("/v2/service_instances/acct_1?{QUERY}"));
    let response = broker
        .app
        .client
        .delete(&url)
        .header("Authorization", auth())
        .header("X-Broker-API-Version", "2.17")
        .header("X-Broker-API-Version", "1.0")
        .send()
        .await
        .unwrap();
    let body = assert_osb_error(response, StatusCode::PRECONDITION_FAILED).await;
    assert_eq!(body["error"], "RepeatedApiVersion", "{body}");
    let description = body["description"].as_str().unwrap();
    assert!(
        description.starts_with("the X-Broker-API-Version header is repeated"),
        "{body}"
    );
    broker.app.assert_nothing_stored().await;
    for version in ["2.100", "2.12"] {
        let response = broker
            .delete("acct_1", QUERY, Some(&auth()), Some(version))
            .await;
        assert_eq!(response.status(), StatusCode::ACCEPTED, "{version}");
    }
}

#[tokio::test]
async fn a_repeated_authorization_or_a_wrong_password_is_401_saying_which() {
    let broker = spawn_broker(false).await;
    let app = &broker.app;
    let url = app.url(&format!("/v2/service_instances/acct_1?{QUERY}"));
    for (first, second) in [
        (auth(), "Bearer garbage".to_owned()),
        ("Bearer garbage".to_owned(), auth()),
    ] {
        let response = app
            .client
            .delete(&url)
            .header("Authorization", &first)
            .header("Authorization", &second)
            .header("X-Broker-API-Version", "2.17")
            .send()
            .await
            .unwrap();
        let body = assert_osb_error(response, StatusCode::UNAUTHORIZED).await;
        assert_eq!(
            body["description"],
            "send the broker's HTTP Basic credentials (Authorization: Basic …): repeated \
             Authorization header",
            "{body}"
        );
    }
    let body = assert_osb_error(
        broker
            .delete(
                "acct_1",
                QUERY,
                Some(&header_value(USER, "broker-password-0123456788")),
                Some("2.17"),
            )
            .await,
        StatusCode::UNAUTHORIZED,
    )
    .await;
    assert!(
        body["description"]
            .as_str()
            .unwrap()
            .ends_with("wrong user name or password"),
        "{body}"
    );
    let webhook = |first: String, second: String| {
        app.client
            .post(app.url("/v1/webhooks/addon"))
            .header("Authorization", first)
            .header("Authorization", second)
            .json(&json!({"tenant": "acct_7"}))
            .send()
    };
    let problem = crate::helpers::assert_problem(
        webhook(header_value("heroku", PASSWORD), "Bearer garbage".into())
            .await
            .unwrap(),
        StatusCode::UNAUTHORIZED,
    )
    .await;
    assert_eq!(
        problem["detail"], "source addon: repeated Authorization header",
        "{problem}"
    );
    let wrong = app
        .client
        .post(app.url("/v1/webhooks/addon"))
        .header("Authorization", header_value("heroku", "nope"))
        .json(&json!({"tenant": "acct_7"}))
        .send()
        .await
        .unwrap();
    let problem = crate::helpers::assert_problem(wrong, StatusCode::UNAUTHORIZED).await;
    assert_eq!(
        problem["detail"], "source addon: wrong user name or password",
        "{problem}"
    );
    app.assert_nothing_stored().await;
}
