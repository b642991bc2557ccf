//! Held requests and reconcile: what arrived while held, held, failed, stalled and in-grace jobs,
//! orphans; then a reconcile as a dry run shown as the actions it would take, and its apply at a
//! chosen release rate; the apply redirects (303) to [`APPLIED`], which reads what it did from the
//! audit log, so reloading repeats nothing. Both steps go through [`crate::http::reconcile_routes::run`], as `POST
//! /v1/reconcile` does (the dry run is the same call rolled back).

use std::collections::HashMap;

use axum::extract::State;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::actions::{self, change};
use super::jobs_page::state_class;
use super::layout::{self, Section};
use super::page_error::{ConsoleError, PageQuery};
use super::session::{ActionForm, Viewer};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::reconcile_routes::{self, ReconcileAnswer, ReconcileBody, ReconcileQuery};
use crate::queue::reconcile::{Actions, JobRow, Orphans, Report, RequestRow};

/// The page's path.
pub const PATH: &str = super::paths::RECONCILE;
/// The dry run.
pub const DRY_RUN: &str = super::paths::RECONCILE_DRY_RUN;
/// The apply.
pub const APPLY: &str = super::paths::RECONCILE_APPLY;
/// What an apply did (where [`APPLY`] redirects).
pub const APPLIED: &str = super::paths::RECONCILE_APPLIED;

/// The filter of the listing and of a reconcile; blank fields are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReconcileFilter {
    /// Job states, comma-separated.
    pub state: Option<String>,
    /// A source name.
    pub source: Option<String>,
    /// A tenant key.
    pub tenant: Option<String>,
}

fn given(v: Option<&String>) -> Option<String> {
    v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

impl ReconcileFilter {
    fn query(&self) -> ReconcileQuery {
        ReconcileQuery {
            state: given(self.state.as_ref()),
            source: given(self.source.as_ref()),
            tenant: given(self.tenant.as_ref()),
            id: None,
            received_after: None,
            received_before: None,
        }
    }

    fn hidden(&self) -> Markup {
        let v = |x: &Option<String>| x.clone().unwrap_or_default();
        html! {
            input type="hidden" name="state" value=(v(&self.state));
            input type="hidden" name="source" value=(v(&self.source));
            input type="hidden" name="tenant" value=(v(&self.tenant));
        }
    }
}

fn jobs_table(id: &str, rows: &[JobRow]) -> Markup {
    html! {
        @if rows.is_empty() { p.muted { "None." } } @else {
            table id=(id) {
                thead { tr { th { "Job" } th { "Tenant" } th { "State" } th { "Step" } th { "Blocked by" } th { "Attempts" } th { "Last error" } th { "Grace until" } } }
                tbody { @for j in rows { tr data-job=(j.job_id) {
                    td.mono { a href={ "/ui/jobs/" (j.job_id) } { (j.job_id) } }
                    td.mono { (j.tenant_id.as_deref().unwrap_or(&j.subject)) }
                    td { span class={ "pill " (state_class(&j.state)) } { (j.state) } }
                    td { (j.step) }
                    td.mono { (j.blocked_by.as_deref().unwrap_or("–")) }
                    td.num { (j.attempts) }
                    td { (j.last_error.as_deref().unwrap_or("")) }
                    td { (j.grace_until.as_deref().unwrap_or("–")) }
                } } }
            }
        }
    }
}

fn requests_table(id: &str, rows: &[RequestRow]) -> Markup {
    html! {
        @if rows.is_empty() { p.muted { "None." } } @else {
            table id=(id) {
                thead { tr { th { "Request" } th { "Source" } th { "Subject" } th { "Received" } th { "Job" } th { "Job state" } } }
                tbody { @for r in rows { tr {
                    td.mono { (r.request_id) } td { (r.source) } td.mono { (r.subject) }
                    td { (layout::time(r.received_at)) }
                    td.mono { a href={ "/ui/jobs/" (r.job_id) } { (r.job_id.to_string()[..8]) "…" } }
                    td { (r.job_state) }
                } } }
            }
        }
    }
}

fn report_markup(report: &Report) -> Markup {
    html! {
        h2 { "Received while held (" (report.received_while_held.len()) ")" }
        (requests_table("received-while-held", &report.received_while_held))
        h2 { "Held (" (report.held.len()) ")" }
        (jobs_table("held", &report.held))
        h2 { "Failed (" (report.failed.len()) ")" }
        (jobs_table("failed", &report.failed))
        h2 { "Stalled: running, lease expired (" (report.stalled.len()) ")" }
        (jobs_table("stalled", &report.stalled))
        h2 { "Waiting in the grace period (" (report.in_grace.len()) ")" }
        (jobs_table("in-grace", &report.in_grace))
        h2 { "Orphans" }
        @match &report.orphans {
            Orphans::NotConfigured => p.muted { "Not detected: no " code { "[soft_delete] orphans" } " statement is configured." },
            Orphans::Found { tenants } => {
                @if tenants.is_empty() { p.muted { "None." } } @else {
                    ul #orphans { @for t in tenants { li.mono { (t) } } }
                }
            }
        }
        h2 { "Collapsed duplicates (" (report.collapsed.len()) ")" }
        p.muted { "Requests attached to a job another request created: nothing to do." }
    }
}

fn reconcile_form(viewer: &Viewer, f: &ReconcileFilter, rate: f64) -> Markup {
    html! {
        form.panel #dry-run method="post" action=(DRY_RUN) {
            (layout::csrf_field(viewer))
            (f.hidden())
            strong { "Reconcile what this page lists: " }
            label { input type="checkbox" name="resume" value="true" checked; " resume held" }
            label { input type="checkbox" name="retry" value="true" checked; " retry failed" }
            label { input type="checkbox" name="create_orphan_jobs" value="true"; " create jobs for orphans" }
            label { input type="checkbox" name="cancel" value="true"; " cancel (alone, with a filter)" }
            br;
            label for="rate" { "Release rate (jobs/s)" }
            input #rate type="text" name="rate" value=(rate) size="6";
            label for="reason" { "Reason" }
            input #reason type="text" name="reason" required maxlength="1000";
            button.primary type="submit" { "Dry run" }
            span.muted { " Nothing changes until you apply the dry run's actions." }
        }
    }
}

fn filter_form(f: &ReconcileFilter) -> Markup {
    let v = |x: &Option<String>| x.clone().unwrap_or_default();
    html! {
        form.panel #filter method="get" action=(PATH) {
            label for="f-state" { "States (comma-separated)" }
            input #f-state type="text" name="state" value=(v(&f.state));
            label for="f-source" { "Source" }
            input #f-source type="text" name="source" value=(v(&f.source));
            label for="f-tenant" { "Tenant" }
            input #f-tenant type="text" name="tenant" value=(v(&f.tenant));
            button type="submit" { "Filter" }
            a href=(PATH) { "clear" }
        }
    }
}

/// `GET /ui/reconcile`.
///
/// # Errors
/// 303 to the login page without a session; 422 for a bad filter; 503.
pub async fn page(
    viewer: Viewer,
    State(state): State<AppState>,
    PageQuery(f): PageQuery<ReconcileFilter>,
) -> Result<Html<String>, ConsoleError> {
    let report = reconcile_routes::report(&state, &f.query().filter()?).await?;
    let body = html! {
        h1 { "Held requests & reconcile" }
        (filter_form(&f))
        @if viewer.can_act() { (reconcile_form(&viewer, &f, state.config.reconcile.release_rate)) }
        (report_markup(&report))
    };
    Ok(Html(
        layout::page("Reconcile", &viewer, Section::Reconcile, body).into_string(),
    ))
}

/// A reconcile as the forms send it.
#[derive(Debug, Deserialize)]
pub struct ReconcileForm {
    /// Which jobs.
    #[serde(flatten)]
    pub filter: ReconcileFilter,
    /// Resume held jobs.
    #[serde(default)]
    pub resume: Option<String>,
    /// Retry failed jobs.
    #[serde(default)]
    pub retry: Option<String>,
    /// Cancel active jobs.
    #[serde(default)]
    pub cancel: Option<String>,
    /// Create jobs for orphans.
    #[serde(default)]
    pub create_orphan_jobs: Option<String>,
    /// Jobs per second.
    #[serde(default)]
    pub rate: Option<String>,
    /// Why.
    pub reason: String,
}

impl ReconcileForm {
    fn body(&self, apply: bool) -> Result<ReconcileBody, ApiError> {
        let on = |v: &Option<String>| v.as_deref().is_some_and(|v| v == "true");
        let rate = match given(self.rate.as_ref()) {
            None => None,
            Some(r) => Some(r.parse::<f64>().map_err(|_| {
                ApiError::Unprocessable(format!("rate: {r:?} is not a number of jobs per second"))
            })?),
        };
        Ok(ReconcileBody {
            apply,
            actions: Actions {
                resume: on(&self.resume),
                retry: on(&self.retry),
                cancel: on(&self.cancel),
                create_orphan_jobs: on(&self.create_orphan_jobs),
            },
            filter: self.filter.query().filter()?,
            rate,
            reason: self.reason.clone(),
        })
    }
}

fn answer_markup(answer: &ReconcileAnswer, before: &HashMap<uuid::Uuid, String>) -> Markup {
    let a = &answer.applied;
    html! {
        table #diff {
            thead { tr { th { "Action" } th { "Job" } th { "Tenant" } th { "Change" } th { "Claimable at" } } }
            tbody {
                @if a.actions.is_empty() { tr { td.muted colspan="5" { "No action." } } }
                @for x in &a.actions {
                    tr data-job=(x.job_id) data-action=(x.action) {
                        td { (x.action) }
                        td.mono { a href={ "/ui/jobs/" (x.job_id) } { (x.job_id) } }
                        td.mono { (x.tenant_id.as_deref().unwrap_or("–")) }
                        td { (change(before.get(&x.job_id).map(String::as_str), &x.action, &x.state)) }
                        td { (x.run_after.as_deref().unwrap_or("–")) }
                    }
                }
            }
        }
        @if !a.skipped.is_empty() {
            h2 { "Left alone (" (a.skipped.len()) ")" }
            table #skipped {
                thead { tr { th { "Action" } th { "Job" } th { "Why" } } }
                tbody { @for s in &a.skipped { tr { td { (s.action) } td.mono { (s.job_id) } td { (s.why) } } } }
            }
        }
    }
}

/// `POST /ui/reconcile/dry-run`: the actions a reconcile would take (rolled back), and the form to
/// apply them at a chosen rate.
///
/// # Errors
/// 403 for a read-only token or a missing CSRF token; 422 for an invalid reason, rate or actions; 503.
pub async fn dry_run(
    State(state): State<AppState>,
    ActionForm { viewer, form }: ActionForm<ReconcileForm>,
) -> Result<Html<String>, ConsoleError> {
    let body = form.body(false)?;
    let answer = reconcile_routes::run(&state, &viewer.actor, &body).await?;
    // Rolled back: the jobs are still in the states they were in before the dry run.
    let ids: Vec<uuid::Uuid> = answer.applied.actions.iter().map(|a| a.job_id).collect();
    let before = actions::states(&state, &ids).await?;
    let n = answer.applied.actions.len();
    let checked = |v: &Option<String>| v.as_deref() == Some("true");
    let page = html! {
        h1 { "Dry run: " (n) " action(s)" }
        p.banner.warn #dry-run-note { "Nothing has changed yet. This is what applying would do, at "
            (answer.applied.rate) " job(s) per second." }
        (answer_markup(&answer, &before))
        @if n > 0 {
            form.panel #apply method="post" action=(APPLY) {
                (layout::csrf_field(&viewer))
                (form.filter.hidden())
                @if checked(&form.resume) { input type="hidden" name="resume" value="true"; }
                @if checked(&form.retry) { input type="hidden" name="retry" value="true"; }
                @if checked(&form.cancel) { input type="hidden" name="cancel" value="true"; }
                @if checked(&form.create_orphan_jobs) { input type="hidden" name="create_orphan_jobs" value="true"; }
                label for="rate" { "Release rate (jobs/s)" }
                input #rate type="text" name="rate" value=(answer.applied.rate) size="6";
                label for="reason" { "Reason" }
                input #reason type="text" name="reason" required maxlength="1000" value=(form.reason);
                button.danger type="submit" { "Apply" }
            }
            p.muted { "Applying acts on what the filter selects at that moment, which may differ from this dry run if jobs changed meanwhile." }
        }
        p { a href=(PATH) { "Back (nothing changed)" } }
    };
    Ok(Html(
        layout::page("Dry run", &viewer, Section::Reconcile, page).into_string(),
    ))
}

/// `POST /ui/reconcile/apply`: the reconcile, applied; then a redirect (303) to [`APPLIED`].
///
/// # Errors
/// As [`dry_run`].
pub async fn apply(
    State(state): State<AppState>,
    ActionForm { viewer, form }: ActionForm<ReconcileForm>,
) -> Result<Response, ConsoleError> {
    let body = form.body(true)?;
    let after = actions::audit_mark(&state).await?;
    let answer = reconcile_routes::run(&state, &viewer.actor, &body).await?;
    let upto = actions::audit_upto(&state, after, &viewer.actor).await?;
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("after", &after.to_string())
        .append_pair("upto", &upto.to_string())
        .append_pair("rate", &answer.applied.rate.to_string())
        .append_pair("skipped", &answer.applied.skipped.len().to_string())
        .finish();
    Ok(Redirect::to(&format!("{APPLIED}?{query}")).into_response())
}

/// The query [`apply`] redirects with.
#[derive(Debug, Default, Deserialize)]
pub struct AppliedQuery {
    /// Audit entries after this ID …
    pub after: Option<i64>,
    /// … up to this one.
    pub upto: Option<i64>,
    /// The release rate used, jobs per second.
    pub rate: Option<f64>,
    /// How many selected jobs were left alone.
    pub skipped: Option<usize>,
}

/// `GET /ui/reconcile/applied`: what an apply did, as the viewer's audit entries record it
/// (reading it again changes nothing).
///
/// # Errors
/// 303 to the login page without a session; 503.
pub async fn applied(
    viewer: Viewer,
    State(state): State<AppState>,
    PageQuery(q): PageQuery<AppliedQuery>,
) -> Result<Html<String>, ConsoleError> {
    let after = q.after.unwrap_or(0);
    let entries =
        actions::done_entries(&state, &viewer.actor, after, q.upto.unwrap_or(after)).await?;
    let page = html! {
        h1 { "Applied: " (entries.len()) " action(s)" }
        @if entries.is_empty() {
            p.banner.warn #applied { "Nothing was done; no audit entry was written." }
        } @else {
            p.banner.ok #applied {
                "Done at " (q.rate.map_or_else(|| "the configured".to_owned(), |r| r.to_string()))
                " job(s) per second; recorded in the audit log (" (entries.len()) " entr"
                (if entries.len() == 1 { "y" } else { "ies" }) ")."
            }
        }
        @if let Some(n) = q.skipped.filter(|n| *n > 0) {
            p.muted { (n) " selected job(s) were left alone (a kill switch still blocks them, or a refusal)." }
        }
        (actions::done_table("diff", &entries))
        p { a href=(PATH) { "Back to reconcile" } " · " a href=(super::paths::AUDIT) { "Audit log" } }
    };
    Ok(Html(
        layout::page("Applied", &viewer, Section::Reconcile, page).into_string(),
    ))
}
