//! The operator console: server-rendered HTML pages under `/ui`, served by `deprov serve` beside
//! the JSON API, for incident night (see `docs/console.md`).
//!
//! - [`kill_switches`]: every switch, engage / release with a reason, and whether each change took
//!   effect (which live worker acknowledged which version, running jobs still blocked);
//! - [`jobs_page`] and [`job`]: counts, queue age, jobs by filter with their live progress, one job
//!   with its requests; cancel / retry / resume / undo with a confirmation ([`actions`]);
//! - [`reconcile_page`]: what is held, failed, in grace or orphaned; a dry run shown as its actions,
//!   then apply at a chosen release rate;
//! - [`audit_page`]: the audit log.
//!
//! Every action calls the function the JSON API calls ([`super::kill_switch_routes::change`],
//! [`super::reconcile_routes::run`], [`super::reconcile_routes::undo`]), so it writes the same audit entries.
//! Access ([`session`]): log in with an operator token; a session cookie (`HttpOnly; Secure;
//! SameSite=Strict`, 8 hours); a `read-only` token sees every page without action forms, and its
//! POSTs are refused 403; a POST from another site or origin is refused 403 (the login too), and
//! every other carries a CSRF token checked before anything is read. Pages
//! take no inline script or style: [`security_headers`] sends a strict Content-Security-Policy.
//! Live parts of a page are fragments (`…/live`) that [`assets`]' small script polls.

pub mod actions;
pub mod assets;
pub mod audit_page;
pub mod job;
pub mod jobs_page;
pub mod kill_switches;
pub mod layout;
pub mod login_limit;
pub mod page_error;
pub mod paths;
pub mod reconcile_page;
pub mod session;
pub mod shell;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::{Redirect, Response};
use axum::routing::{get, post};

use super::AppState;

/// The Content-Security-Policy of every console response: scripts, styles and fetches from the
/// console itself only (no inline script or style), forms posted only to it, never framed.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's routes, each behind [`security_headers`].
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::to(kill_switches::PATH) }))
        .route("/ui/", get(|| async { Redirect::to(kill_switches::PATH) }))
        .route(
            session::LOGIN,
            get(session::login_page).post(session::login),
        )
        .route(session::LOGOUT, post(session::logout))
        .route(
            kill_switches::PATH,
            get(kill_switches::page).post(kill_switches::change),
        )
        .route("/ui/kill-switches/live", get(kill_switches::live))
        .route(jobs_page::PATH, get(jobs_page::page))
        .route("/ui/jobs/live", get(jobs_page::live))
        .route(actions::CONFIRM, post(actions::confirm))
        .route(actions::ACT, post(actions::act))
        .route(actions::DONE, get(actions::done))
        .route("/ui/jobs/{job_id}", get(job::page))
        .route("/ui/jobs/{job_id}/live", get(job::live))
        .route(reconcile_page::PATH, get(reconcile_page::page))
        .route(reconcile_page::DRY_RUN, post(reconcile_page::dry_run))
        .route(reconcile_page::APPLY, post(reconcile_page::apply))
        .route(reconcile_page::APPLIED, get(reconcile_page::applied))
        .route(audit_page::PATH, get(audit_page::page))
        .route("/ui/audit/live", get(audit_page::live))
        .route(assets::SCRIPT, get(assets::script))
        .route(assets::STYLE, get(assets::style))
        .route("/ui/{*rest}", get(not_found).post(not_found))
        .layer(middleware::from_fn(security_headers))
}

/// Any other path under `/ui`: a 404 page (with the console's headers, unlike the API's 404).
async fn not_found() -> page_error::ConsoleError {
    crate::http::error::ApiError::NotFound("no such page".into()).into()
}

/// Adds the console's security headers to every response: [`CONTENT_SECURITY_POLICY`],
/// `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff`, `Referrer-Policy: same-origin` and
/// `Cache-Control: no-store` (pages show live state and must not be kept). `same-origin` sends no
/// referrer to any other site, and lets a browser send the console's own origin as `Origin` on the
/// console's form POSTs, which [`session::same_origin`] checks: under `no-referrer` a browser sends
/// `Origin: null` on every POST (the Fetch standard, "append a request `Origin` header").
pub async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
