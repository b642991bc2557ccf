//! The HTTP API (axum), its OpenAPI 3.1 description (utoipa), and its middleware.
//!
//! Routes (see `openapi.yaml`, generated from this module by [`openapi`]):
//! - `POST /v1/deletion-requests` — intake, source bearer token ([`intake_routes`]);
//! - `DELETE /v1/installations/{installationId}` — Vercel Marketplace partner API
//!   ([`vercel_installations`]);
//! - `POST /v1/webhooks/{source}` — signed deliveries from `[sources.NAME]` ([`webhooks`]);
//! - `GET /v1/jobs/{job_id}`, `GET /v1/jobs`, `GET|PUT /v1/kill-switch` — operator token
//!   ([`job_routes`], [`kill_switch_routes`]);
//! - `GET /v1/audit` — operator actions, operator token ([`audit_routes`]);
//! - `GET|POST /v1/reconcile`, `POST /v1/jobs/{job_id}/undo` — operator token; `POST
//!   /v1/reinstallations` — source token ([`reconcile_routes`]);
//! - `DELETE /v2/service_instances/{instance_id}`, `GET
//!   /v2/service_instances/{instance_id}/last_operation` — Open Service Broker deprovisioning, HTTP
//!   Basic ([`osb`]);
//! - `GET /healthz`, `GET /readyz` ([`health`]); `GET /metrics` ([`metrics`]); `GET /openapi.json`
//!   (the spec itself);
//! - `/ui/…` — the operator console, HTML for people, not part of the spec ([`console`]).
//!
//! The intake routes (deletion requests and the Vercel call) are rate limited per source
//! ([`rate_limit`], `[intake.rate_limit]`): 429 problem+json with `Retry-After`.
//!
//! Every error is RFC 9457 problem+json ([`error::ApiError`]). Middleware, outermost first: request ID
//! (`x-request-id`, generated when absent, echoed back), tracing span per request, panic → 500 problem,
//! request timeout ([`REQUEST_TIMEOUT`]) → 503 problem, body limit (`[intake] max_body_bytes`) → 413,
//! header limit (`[intake] max_header_bytes`) → 431. [`serve`] adds the connection-level limits
//! (header read time, idle keep-alive, header buffer).
//! Handlers run in their own task: the request timeout and a client hanging up end only the wait,
//! never a statement mid-flight (statements are bounded on the server instead, see [`crate::db`]).

pub mod audit_routes;
pub mod auth;
pub mod console;
pub mod error;
pub mod extract;
pub mod health;
pub mod intake_routes;
pub mod job_routes;
pub mod kill_switch_routes;
pub mod metrics;
pub mod operator_responses;
pub mod osb;
pub mod rate_limit;
pub mod reconcile_routes;
pub mod serve;
mod sns_delivery;
pub mod token_sources;
pub mod vercel_installations;
mod webhook_answer;
mod webhook_body;
pub mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef, MatchedPath, Request};
use axum::http::HeaderName;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower::ServiceBuilder;
use tower_governor::GovernorLayer;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, OnResponse, TraceLayer};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::config::Config;
use crate::db::Pools;
use crate::queue::group_commit::GroupCommit;
use crate::queue::intake::{Accepted, IntakeError, NewRequest};
use crate::readiness::{NotReady, Readiness, Stage};
use crate::telemetry::collect::Collector;
use auth::{OperatorAuth, PartnerVerifier, SourceTokens};
use error::ApiError;

/// Longest time a request may take before it is answered 503 (problem+json, `Retry-After`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The header carrying the request ID.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Shared, cheaply cloneable state of every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The service's pools; handlers use `intake`, and only the reconcile, undo and reinstall
    /// routes ([`reconcile_routes`]) also `target` (orphans and undo statements).
    pub pools: Pools,
    /// The validated configuration.
    pub config: Arc<Config>,
    /// Digests of the `[sources.NAME]` tokens.
    pub sources: Arc<SourceTokens>,
    /// Checks operator tokens: `DEPROV_OPERATOR_TOKEN` and the `deprov tokens` table, with its cache.
    pub operators: Arc<OperatorAuth>,
    /// How Vercel partner-API calls are verified; `None` when there is no `[vercel]` section (404).
    pub vercel: Option<Arc<PartnerVerifier>>,
    /// The verifiers (and key caches) of the `jwt` and `atlassian-connect` sources.
    pub token_sources: Arc<token_sources::TokenSources>,
    /// What `GET /metrics` renders. [`AppState::new`] makes one that does not read the target
    /// database; a process running a worker replaces it (see [`crate::app`]).
    pub metrics: Arc<Collector>,
    /// The intake rate limit (`[intake.rate_limit]`); `None` when off.
    pub rate_limit: Option<rate_limit::Limit>,
    /// The console's limit on failed logins (`[console.login_rate_limit]`); `None` when off.
    pub login_limit: Option<Arc<console::login_limit::LoginLimit>>,
    /// The process's start-up stage and configured-SQL check ([`crate::readiness`]): while it is
    /// starting, `/readyz` and every `/v1/` route answer 503 with `Retry-After` without touching a
    /// database; `/readyz` answers 503 until it is migrated, and while the configured SQL is refused.
    /// [`AppState::new`] makes a ready one.
    pub readiness: Readiness,
    /// Intake's group commit ([`crate::queue::group_commit`]), started on first use (inside the
    /// runtime that serves requests).
    group_commit: Arc<std::sync::OnceLock<GroupCommit>>,
}

impl FromRef<AppState> for Arc<Collector> {
    fn from_ref(state: &AppState) -> Self {
        state.metrics.clone()
    }
}

impl AppState {
    /// Builds the state; tokens are kept only as SHA-256 digests. `operator_token` is the bootstrap
    /// `DEPROV_OPERATOR_TOKEN` (role `operator`, audit actor `env:operator`).
    pub fn new(pools: Pools, config: Arc<Config>, operator_token: Option<&str>) -> Self {
        let sources = SourceTokens::from_config(&config);
        let vercel = config
            .vercel
            .as_ref()
            .and_then(|v| PartnerVerifier::for_source(&config, &sources, &v.source))
            .map(Arc::new);
        let sources = Arc::new(sources);
        let metrics = Arc::new(Collector::new(
            pools.clone(),
            false,
            config.metrics.read_timeout,
        ));
        Self {
            rate_limit: rate_limit::limit(
                &config.intake.rate_limit,
                sources.clone(),
                rate_limit::Routes::of(&config),
            ),
            login_limit: console::login_limit::LoginLimit::new(&config.console.login_rate_limit),
            pools,
            operators: Arc::new(OperatorAuth::new(
                operator_token,
                config.operator_tokens.cache_ttl,
            )),
            token_sources: Arc::new(token_sources::TokenSources::from_config(&config)),
            sources,
            vercel,
            metrics,
            readiness: Readiness::ready(),
            group_commit: Arc::new(std::sync::OnceLock::new()),
            config,
        }
    }

    /// The same state with `readiness` (a process's own, shared with its start-up checks).
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// Records a deletion request through intake's group commit, started on first use with
    /// `[intake] group_writers` writers and `[intake] group_commit` requests per transaction.
    ///
    /// # Errors
    /// See [`GroupCommit::record`].
    pub async fn record(&self, req: NewRequest) -> Result<Accepted, IntakeError> {
        let group_commit = self.group_commit.get_or_init(|| {
            GroupCommit::start(
                self.pools.intake.clone(),
                self.config
                    .intake
                    .group_writers
                    .min(self.config.pools.intake.max_connections as usize),
                self.config.intake.group_commit,
                4 * self.config.intake.group_commit
                    * self.config.pools.intake.max_connections as usize,
                self.config.pools.intake.acquire_timeout,
            )
        });
        group_commit.record(req, self.max_attempts()).await
    }

    /// `[worker] max_attempts` as stored on new jobs.
    pub fn max_attempts(&self) -> i32 {
        i32::try_from(self.config.worker.max_attempts).unwrap_or(i32::MAX)
    }
}

/// The document-level parts of the spec: info, tags, security schemes.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "deprov",
        description = "Deletes a SaaS tenant's data safely. Errors are RFC 9457 problem details (application/problem+json).",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "intake", description = "Deletion requests from configured sources"),
        (name = "vercel", description = "Vercel Marketplace partner API"),
        (name = "webhooks", description = "Signed deliveries from configured senders"),
        (name = "osb", description = "Open Service Broker API 2.17, deprovisioning only (`[osb]`); errors are OSB error bodies"),
        (name = "operator", description = "Jobs, the kill switch and the audit log (operator tokens)"),
        (name = "health", description = "Liveness, readiness and metrics"),
    ),
    modifiers(&SecuritySchemes),
)]
struct ApiDoc;

struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = |desc: &str| {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(desc.to_owned());
            SecurityScheme::Http(http)
        };
        components.add_security_scheme(
            "source_token",
            bearer("The token of a configured `[sources.NAME]`; it names the source."),
        );
        components.add_security_scheme(
            "operator_token",
            bearer(
                "An operator token: one made by `deprov tokens create` (`dpv_…`, stored hashed), or the \
                 bootstrap DEPROV_OPERATOR_TOKEN. Role `read-only` may call GET operator routes; every \
                 other method needs role `operator` (else 403). The token's name is the audit actor \
                 (`env:operator` for DEPROV_OPERATOR_TOKEN). A revoked token is refused (401) within \
                 `[operator_tokens] cache_ttl`. With no operator token at all, operator routes answer 403.",
            ),
        );
        let mut basic = Http::new(HttpAuthScheme::Basic);
        basic.description = Some(
            "HTTP Basic: the `username` and a password (`secret_env` / `secret_file`) of the \
             `[sources.NAME]` named by `[osb] source`."
                .to_owned(),
        );
        components.add_security_scheme("osb_basic", SecurityScheme::Http(basic));
        components.add_security_scheme(
            "vercel_token",
            bearer("The source named by `[vercel] source`: its bearer token, or with `scheme = \"vercel-oidc\"` Vercel's OIDC JWT (RS256, checked against the JWKS, issuer and audience)."),
        );
    }
}

/// Every route; the intake routes behind `limit` when there is one.
fn api_routes(limit: Option<rate_limit::Limit>) -> OpenApiRouter<AppState> {
    use utoipa::OpenApi as _;
    let intake = OpenApiRouter::new()
        .routes(routes!(intake_routes::create_deletion_request))
        .routes(routes!(vercel_installations::delete_installation))
        .routes(routes!(webhooks::receive))
        .routes(routes!(reconcile_routes::reinstall))
        .routes(routes!(osb::deprovision))
        .routes(routes!(osb::last_operation));
    let intake = match limit {
        Some(limit) => {
            intake.route_layer(GovernorLayer::new(limit).error_handler(rate_limit::refusal))
        }
        None => intake,
    };
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(intake)
        .routes(routes!(job_routes::list_jobs))
        .routes(routes!(job_routes::get_job))
        .routes(routes!(
            kill_switch_routes::get_kill_switch,
            kill_switch_routes::put_kill_switch
        ))
        .routes(routes!(audit_routes::list_audit))
        .routes(routes!(
            reconcile_routes::get_reconcile,
            reconcile_routes::post_reconcile
        ))
        .routes(routes!(reconcile_routes::undo_job))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::metrics))
}

/// The OpenAPI 3.1 description of the API, generated from the route annotations.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut spec) = api_routes(None).split_for_parts();
    spec.info.version = env!("CARGO_PKG_VERSION").to_owned();
    spec
}

/// While the process is starting ([`crate::readiness::Stage::Starting`]), answers every `/v1/` and
/// `/v2/` route 503 + `Retry-After: 1` at once: the state database may not be migrated yet, or be down (the
/// checks then wait up to a pool's acquire timeout). `/healthz`, `/readyz`, `/metrics` and
/// `/openapi.json` pass.
async fn while_starting(readiness: Readiness, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if readiness.stage() == Stage::Starting
        && (path.starts_with("/v1/") || path.starts_with("/v2/"))
    {
        return ApiError::db_unavailable(NotReady::Starting.to_string()).into_response();
    }
    next.run(request).await
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Answers 503 after [`REQUEST_TIMEOUT`]. A `Content-Length` over `max_body` is 413 at once. The
/// body (at most `max_body` bytes, else 413) is read
/// first, in the caller's future: a client sending it too slowly is answered 503 at the deadline and
/// its connection closed with the dropped body. Then the handler runs in its own task, so neither
/// the deadline nor a client hanging up drops it mid-statement: it finishes (its transaction bounded
/// on the server, see [`crate::db`]) and its answer is discarded. A handler's panic is passed on to
/// `CatchPanicLayer`.
async fn request_timeout(max_body: usize, request: Request, next: Next) -> Response {
    use tracing::Instrument as _;
    let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    let unavailable = || {
        ApiError::Unavailable {
            detail: format!("request not answered within {REQUEST_TIMEOUT:?}"),
            retry_after: 1,
        }
        .into_response()
    };
    let too_large = || {
        ApiError::PayloadTooLarge(format!(
            "the body was larger than {max_body} bytes, or was cut off"
        ))
        .into_response()
    };
    // A declared length over the limit is refused at once, not after waiting for a body that
    // never comes (the deadline's 503).
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout_at(deadline, axum::body::to_bytes(body, max_body)).await
    {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => return too_large(),
        Err(_) => return unavailable(),
    };
    let request = Request::from_parts(parts, axum::body::Body::from(bytes));
    let handler = tokio::spawn(next.run(request).in_current_span());
    match tokio::time::timeout_at(deadline, handler).await {
        Ok(Ok(response)) => response,
        Ok(Err(join)) => match join.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => ApiError::Internal("handler task cancelled".into()).into_response(),
        },
        Err(_) => unavailable(),
    }
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::Internal("handler panicked".into()).into_response()
}

fn request_span(request: &Request) -> tracing::Span {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str);
    let id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    tracing::info_span!("http", method = %request.method(), route, request_id = id)
}

/// The complete application: routes, fallbacks, `/openapi.json` and middleware, with `state` applied.
pub fn router(state: AppState) -> Router {
    let max_body = state.config.intake.max_body_bytes;
    let max_headers = state.config.intake.max_header_bytes;
    let readiness = state.readiness.clone();
    let (api, spec) = api_routes(state.rate_limit.clone()).split_for_parts();
    let spec_json = Arc::new(spec.to_json().unwrap_or_default());
    let api = api
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let body = spec_json.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        body.as_ref().clone(),
                    )
                }
            }),
        )
        .merge(console::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(middleware::from_fn(move |req, next| {
            while_starting(readiness.clone(), req, next)
        }))
        .layer(middleware::from_fn(move |req, next| {
            serve::limit_headers(max_headers, req, next)
        }));
    with_middleware(api, max_body)
}

/// A response extension marking `/readyz`'s 503: the probe's answer while the service starts, is
/// not migrated or cannot reach its database, not a failure of the request.
#[derive(Debug, Clone, Copy)]
struct ProbeAnswer;

/// Marks a 503 of `GET /readyz` as [`ProbeAnswer`].
async fn mark_probe_answer(request: Request, next: Next) -> Response {
    let probe = request.uri().path() == "/readyz";
    let mut response = next.run(request).await;
    if probe && response.status() == axum::http::StatusCode::SERVICE_UNAVAILABLE {
        response.extensions_mut().insert(ProbeAnswer);
    }
    response
}

/// The trace layer's log of each response: tower_http's (DEBUG), then a 5xx at ERROR — except a
/// [`ProbeAnswer`], at DEBUG: an orchestrator probing a starting service every few seconds would
/// otherwise log an error each time.
#[derive(Debug, Clone, Copy)]
struct LogResponse;

impl<B> OnResponse<B> for LogResponse {
    fn on_response(self, response: &Response<B>, latency: Duration, span: &tracing::Span) {
        DefaultOnResponse::new().on_response(response, latency, span);
        let status = response.status();
        if !status.is_server_error() {
            return;
        }
        let latency_ms = latency.as_millis();
        if response.extensions().get::<ProbeAnswer>().is_some() {
            tracing::debug!(parent: span, status = status.as_u16(), latency_ms, "not ready: readiness probe answered 503");
        } else {
            tracing::error!(parent: span, status = status.as_u16(), latency_ms, "response failed");
        }
    }
}

/// A failure other than a 5xx status (those are logged by [`LogResponse`]): an error of the
/// response body, at ERROR.
fn log_failure(class: ServerErrorsFailureClass, latency: Duration, span: &tracing::Span) {
    if let ServerErrorsFailureClass::Error(error) = class {
        let latency_ms = latency.as_millis();
        tracing::error!(parent: span, error, latency_ms, "response failed");
    }
}

/// Wraps `router` in the service's middleware, outermost first: request ID, trace span (5xx logged
/// at ERROR, `/readyz`'s 503 at DEBUG), catch-panic (500 problem), request timeout (503 problem),
/// body limit of `max_body` bytes.
fn with_middleware(router: Router, max_body: usize) -> Router {
    let request_id = HeaderName::from_static(REQUEST_ID_HEADER);
    router.layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(request_id.clone(), MakeRequestUuid))
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(request_span)
                    .on_response(LogResponse)
                    .on_failure(log_failure),
            )
            .layer(middleware::from_fn(mark_probe_answer))
            .layer(PropagateRequestIdLayer::new(request_id))
            .layer(CatchPanicLayer::custom(panic_response))
            .layer(middleware::from_fn(move |req, next| {
                request_timeout(max_body, req, next)
            }))
            .layer(DefaultBodyLimit::max(max_body)),
    )
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    /// Every event's level and message, recorded by a `tracing` layer.
    #[derive(Clone, Default)]
    struct Recorder(Arc<std::sync::Mutex<Vec<(tracing::Level, String)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            let mut message = Message(String::new());
            event.record(&mut message);
            let level = *event.metadata().level();
            self.0.lock().unwrap().push((level, message.0));
        }
    }

    /// `/readyz` answering 503 is the probe's answer, logged below ERROR; any other 5xx (a 503 of
    /// another route, a 500) is logged at ERROR.
    #[tokio::test]
    async fn a_readiness_probes_503_is_not_logged_as_an_error_and_other_5xx_are() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let recorder = Recorder::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
        let unavailable = || async { StatusCode::SERVICE_UNAVAILABLE };
        let router: Router = Router::new()
            .route("/readyz", axum::routing::get(unavailable))
            .route("/v1/jobs", axum::routing::get(unavailable))
            .route(
                "/boom",
                axum::routing::get(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
            );
        let app = with_middleware(router, 1024);
        let mut logged = Vec::new();
        for (path, status) in [
            ("/readyz", StatusCode::SERVICE_UNAVAILABLE),
            ("/v1/jobs", StatusCode::SERVICE_UNAVAILABLE),
            ("/boom", StatusCode::INTERNAL_SERVER_ERROR),
        ] {
            let response = app
                .clone()
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(response.status(), status, "{path}");
            let events = std::mem::take(&mut *recorder.0.lock().unwrap());
            let errors: Vec<&String> = events
                .iter()
                .filter(|(level, _)| *level == tracing::Level::ERROR)
                .map(|(_, message)| message)
                .collect();
            logged.push((path, errors.len()));
            if path == "/readyz" {
                assert!(
                    events.contains(&(
                        tracing::Level::DEBUG,
                        "not ready: readiness probe answered 503".to_owned()
                    )),
                    "{events:?}"
                );
            } else {
                assert_eq!(errors, ["response failed"], "{path}: {events:?}");
            }
        }
        assert_eq!(logged, [("/readyz", 0), ("/v1/jobs", 1), ("/boom", 1)]);
    }

    #[tokio::test]
    async fn a_panicking_handler_becomes_a_500_problem() {
        async fn boom() -> &'static str {
            panic!("bug")
        }
        let router: Router = Router::new().route("/boom", axum::routing::get(boom));
        let response = with_middleware(router, 1024)
            .oneshot(Request::get("/boom").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers()["content-type"], error::PROBLEM_JSON);
        assert!(response.headers().contains_key(REQUEST_ID_HEADER));
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        let problem: error::Problem = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem.status, 500);
        assert!(
            !problem.detail.contains("bug"),
            "panic messages are not sent to clients"
        );
    }
}
