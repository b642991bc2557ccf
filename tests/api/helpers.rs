//! `spawn_app()`: a throwaway PostgreSQL, a config file and the `Application` on port 0, per test.

use std::time::Duration;

use deprov::app::{Application, Settings};
use deprov::throwaway::{Throwaway, ThrowawayOptions};
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Token of `[sources.billing]`.
pub const SOURCE_TOKEN: &str = "billing-token-0123456789";
/// Token of `[sources.vercel]`, the `[vercel] source`.
pub const VERCEL_TOKEN: &str = "vercel-token-0123456789abc";
/// `DEPROV_OPERATOR_TOKEN` (unless disabled).
pub const OPERATOR_TOKEN: &str = "operator-token-0123456789";
/// `[intake] max_body_bytes` of the test configuration.
pub const MAX_BODY: usize = 4096;

/// The `[vercel]` section of the test configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VercelMode {
    /// No `[vercel]` section: the route answers 404.
    Off,
    /// `[vercel] source` only: the installation ID is the tenant key.
    InstallationIsTenant,
    /// With `tenant_lookup`: requests are recorded for the installation, resolved by the worker.
    Lookup,
}

/// How to start a test server.
#[derive(Debug, Clone)]
pub struct TestOptions {
    /// Configure `DEPROV_OPERATOR_TOKEN`.
    pub operator: bool,
    /// The `[vercel]` section.
    pub vercel: VercelMode,
    /// Override `DEPROV_TARGET_URL`.
    pub target_url: Option<String>,
    /// Point `DEPROV_DATABASE_URL` at a closed port (and skip migrations).
    pub state_unreachable: bool,
    /// Run the worker in the server process.
    pub worker: bool,
}

impl Default for TestOptions {
    fn default() -> Self {
        Self {
            operator: true,
            vercel: VercelMode::InstallationIsTenant,
            target_url: None,
            state_unreachable: false,
            worker: false,
        }
    }
}

/// A running server with its own PostgreSQL; everything stops when dropped.
pub struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    /// The bound port.
    pub port: u16,
    /// A client without TLS, redirects or cookies.
    pub client: reqwest::Client,
    /// A pool on the state database for assertions.
    pub db: PgPool,
    /// The state database's URL.
    pub db_url: String,
    cancel: CancellationToken,
    server: Option<JoinHandle<Result<(), deprov::app::AppError>>>,
    _config_dir: tempfile::TempDir,
    _pg: Throwaway,
}

/// A loopback port nothing listens on.
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn config_text(options: &TestOptions) -> String {
    let acquire = if options.state_unreachable {
        "300ms"
    } else {
        "5s"
    };
    let mut text = format!(
        "[sources.billing]\ntoken = \"{SOURCE_TOKEN}\"\n[sources.vercel]\ntoken = \"{VERCEL_TOKEN}\"\n\
         [tenant]\nroot_table = \"app.accounts\"\nkey_column = \"id\"\n\
         [intake]\nmax_body_bytes = {MAX_BODY}\n\
         [pools.intake]\nmax_connections = 8\nacquire_timeout = \"{acquire}\"\n"
    );
    match options.vercel {
        VercelMode::Off => {}
        VercelMode::InstallationIsTenant => text.push_str("[vercel]\nsource = \"vercel\"\n"),
        VercelMode::Lookup => text.push_str(
            "[vercel]\nsource = \"vercel\"\ntenant_lookup = \"SELECT id FROM app.accounts WHERE installation_id = $1\"\n",
        ),
    }
    text
}

/// Starts a server with the default options.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(TestOptions::default()).await
}

/// Starts a server with `options`.
pub async fn spawn_app_with(options: TestOptions) -> TestApp {
    let pg = tokio::task::spawn_blocking(|| {
        Throwaway::start(&ThrowawayOptions {
            unsafe_fast: true,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .expect("start throwaway PostgreSQL");
    let config_dir = tempfile::tempdir().unwrap();
    let config_path = config_dir.path().join("deprov.toml");
    std::fs::write(&config_path, config_text(&options)).unwrap();
    let state_url = if options.state_unreachable {
        format!("postgres://postgres@127.0.0.1:{}/postgres", closed_port())
    } else {
        pg.url("postgres")
    };
    let settings = Settings {
        database_url: state_url,
        target_url: options.target_url.clone(),
        config: config_path,
        listen: "127.0.0.1:0".parse().unwrap(),
        operator_token: options.operator.then(|| OPERATOR_TOKEN.to_owned()),
        migrate: !options.state_unreachable,
        no_worker: !options.worker,
    };
    let app = Application::build(settings)
        .await
        .expect("build application");
    let port = app.port();
    let cancel = CancellationToken::new();
    let server = tokio::spawn(app.run_until_stopped(cancel.clone()));
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&pg.url("postgres"))
        .await
        .unwrap();
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        port,
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
        db,
        db_url: pg.url("postgres"),
        cancel,
        server: Some(server),
        _config_dir: config_dir,
        _pg: pg,
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl TestApp {
    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// Stops the server (graceful shutdown) and waits until `run_until_stopped` returned.
    pub async fn shutdown(&mut self) {
        self.cancel.cancel();
        let server = self.server.take().expect("not yet shut down");
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
    }

    /// `POST /v1/deletion-requests` with the billing source's token.
    pub async fn post_deletion(&self, body: &Value) -> Response {
        self.post_deletion_with(Some(SOURCE_TOKEN), None, body)
            .await
    }

    /// `POST /v1/deletion-requests` with an optional token and `Idempotency-Key`.
    pub async fn post_deletion_with(
        &self,
        token: Option<&str>,
        key: Option<&str>,
        body: &Value,
    ) -> Response {
        let mut req = self
            .client
            .post(self.url("/v1/deletion-requests"))
            .json(body);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        req.send().await.unwrap()
    }

    /// `POST /v1/deletion-requests` with a raw body and content type, with the billing token.
    pub async fn post_raw(&self, content_type: &str, body: impl Into<reqwest::Body>) -> Response {
        let req = self
            .client
            .post(self.url("/v1/deletion-requests"))
            .bearer_auth(SOURCE_TOKEN);
        req.header("Content-Type", content_type)
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// `DELETE /v1/installations/{id}` with `token`, optional JSON body and `Idempotency-Key`.
    pub async fn delete_installation(
        &self,
        id: &str,
        token: &str,
        body: Option<&Value>,
        key: Option<&str>,
    ) -> Response {
        let mut req = self
            .client
            .delete(self.url(&format!("/v1/installations/{id}")))
            .bearer_auth(token);
        req = req.header("X-Vercel-Auth", "system");
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        req.send().await.unwrap()
    }

    /// `GET path` with the operator token.
    pub async fn operator_get(&self, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(OPERATOR_TOKEN)
            .send()
            .await
            .unwrap()
    }

    /// `GET /v1/jobs/{id}` with the operator token.
    pub async fn get_job(&self, id: &str) -> Response {
        self.operator_get(&format!("/v1/jobs/{id}")).await
    }

    /// `PUT /v1/kill-switch` with the operator token.
    pub async fn put_kill_switch(&self, engaged: bool, reason: &str) -> Response {
        let req = self
            .client
            .put(self.url("/v1/kill-switch"))
            .bearer_auth(OPERATOR_TOKEN);
        req.json(&json!({"engaged": engaged, "reason": reason}))
            .send()
            .await
            .unwrap()
    }

    /// Unauthenticated `GET path`.
    pub async fn get(&self, path: &str) -> Response {
        self.client.get(self.url(path)).send().await.unwrap()
    }

    /// Rows in `deprov.jobs`.
    pub async fn count_jobs(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM deprov.jobs")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    /// Rows in `deprov.deletion_requests`.
    pub async fn count_requests(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM deprov.deletion_requests")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    /// Asserts that no request and no job was stored.
    pub async fn assert_nothing_stored(&self) {
        assert_eq!(
            (self.count_jobs().await, self.count_requests().await),
            (0, 0),
            "nothing may be stored"
        );
    }

    /// A job's state straight from `deprov.jobs`.
    pub async fn job_state(&self, id: &str) -> String {
        let id: uuid::Uuid = id.parse().unwrap();
        sqlx::query_scalar("SELECT state FROM deprov.jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&self.db)
            .await
            .unwrap()
    }
}

/// A tenant deletion body.
pub fn deletion(tenant: &str) -> Value {
    json!({"tenant_id": tenant})
}

/// Asserts `status` and an RFC 9457 body with content type `application/problem+json`; returns the body.
pub async fn assert_problem(response: Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status, "unexpected status");
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], status.as_u16(), "{body}");
    for field in ["type", "title", "detail"] {
        assert!(
            body[field].as_str().is_some_and(|s| !s.is_empty()),
            "problem lacks {field}: {body}"
        );
    }
    body
}

/// Asserts 202 and returns the JSON body.
pub async fn accepted(response: Response) -> Value {
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body
}
