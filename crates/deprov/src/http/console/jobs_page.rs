//! The jobs page: counts by state, the queue's age, jobs by state / source / tenant / request or
//! delivery ID with their live progress, and the bulk actions on the listed jobs ([`super::actions`]).

use axum::extract::State;
use axum::response::Html;
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{self, Section};
use super::page_error::{ConsoleError, PageQuery};
use super::session::Viewer;
use crate::db::{self, Bounds};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::job_routes::ProgressView;
use crate::queue::search::{self, JobFilter};
use crate::queue::{Job, JobState, jobs};

/// The page's path.
pub const PATH: &str = super::paths::JOBS;

/// Most jobs a page lists (and a bulk action takes).
pub const LIMIT: i64 = 200;

/// The filter, from the query string; blank fields are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct JobsQuery {
    /// A job state.
    pub state: Option<String>,
    /// A source name.
    pub source: Option<String>,
    /// A tenant key.
    pub tenant: Option<String>,
    /// A request ID, external ID or delivery ID.
    pub request: Option<String>,
}

fn given(v: Option<&String>) -> Option<String> {
    v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

impl JobsQuery {
    /// The filter it names.
    ///
    /// # Errors
    /// 422 for an unknown state or a field with U+0000.
    pub fn filter(&self) -> Result<JobFilter, ApiError> {
        for (name, v) in [
            ("source", &self.source),
            ("tenant", &self.tenant),
            ("request", &self.request),
        ] {
            if let Some(v) = v {
                crate::http::intake_routes::no_nul(name, v)?;
            }
        }
        let state = match given(self.state.as_ref()) {
            None => None,
            Some(s) => Some(JobState::parse(&s).ok_or_else(|| {
                ApiError::Unprocessable(format!(
                    "state: {s:?} is not one of queued, held, running, completed, failed, cancelled"
                ))
            })?),
        };
        Ok(JobFilter {
            state,
            source: given(self.source.as_ref()),
            tenant: given(self.tenant.as_ref()),
            request: given(self.request.as_ref()),
        })
    }

    /// The query string of the filter (for the live fragment's URL).
    pub fn query_string(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("state", &self.state),
            ("source", &self.source),
            ("tenant", &self.tenant),
            ("request", &self.request),
        ] {
            if let Some(v) = given(v.as_ref()) {
                q.append_pair(k, &v);
            }
        }
        q.finish()
    }
}

struct Snapshot {
    counts: Vec<(String, i64)>,
    age: search::QueueAge,
    jobs: Vec<Job>,
}

async fn snapshot(state: &AppState, filter: &JobFilter) -> Result<Snapshot, ConsoleError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let counts = jobs::counts(&mut *tx).await?;
    let age = search::queue_age(&mut *tx).await?;
    let jobs = search::jobs(&mut *tx, filter, LIMIT).await?;
    tx.commit().await?;
    Ok(Snapshot { counts, age, jobs })
}

const STATES: [&str; 6] = [
    "queued",
    "held",
    "running",
    "completed",
    "failed",
    "cancelled",
];

fn fragment(s: &Snapshot) -> Markup {
    let now = s.age.now;
    html! {
        div.tiles #counts {
            @for st in STATES {
                @let n = s.counts.iter().find(|(k, _)| k == st).map_or(0, |(_, n)| *n);
                div.tile data-state=(st) { span.muted { (st) } b { (n) } }
            }
            // deprov keeps no time a job became held: the tiles give the jobs' age since creation.
            div.tile #oldest-queued { span.muted { "oldest queued job, created" } b { (s.age.oldest_queued.map_or_else(|| "–".to_owned(), |t| format!("{} ago", layout::age(now, t)))) } }
            div.tile #oldest-held { span.muted { "oldest held job, created" } b { (s.age.oldest_held.map_or_else(|| "–".to_owned(), |t| format!("{} ago", layout::age(now, t)))) } }
        }
        table #jobs {
            thead { tr {
                th { "Job" } th { "Tenant / subject" } th { "State" } th { "Step" } th { "Rows deleted" }
                th { "Current table" } th { "Batches" } th { "Longest txn" } th { "Attempts" } th { "Last error" } th { "Created" }
            } }
            tbody {
                @if s.jobs.is_empty() { tr { td.muted colspan="11" { "No job matches." } } }
                @for job in &s.jobs {
                    @let p = ProgressView::from_document(&job.progress);
                    tr data-job=(job.id) data-state=(job.state) {
                        td.mono { a href={ "/ui/jobs/" (job.id) } { (job.id.to_string()[..8]) "…" } }
                        td.mono { (job.tenant_id.as_deref().unwrap_or(&job.subject)) }
                        td { span class={ "pill " (state_class(&job.state)) } { (job.state) } }
                        td { (job.step) }
                        td.num.rows { (p.rows_deleted) }
                        td.mono { (p.current_table.as_deref().unwrap_or("–")) }
                        td.num { (p.extra.get("batches").and_then(serde_json::Value::as_i64).unwrap_or(0)) }
                        td.num { (layout::millis(p.extra.get("longest_batch_ms").and_then(serde_json::Value::as_f64).unwrap_or(0.0))) }
                        td.num { (job.attempts) }
                        td { (job.last_error.as_deref().unwrap_or("")) }
                        td { (layout::age(now, job.created_at)) " ago" }
                    }
                }
            }
        }
        (layout::updated(now))
    }
}

/// The CSS class of a state's pill.
pub fn state_class(state: &str) -> &'static str {
    match state {
        "completed" => "ok",
        "failed" => "bad",
        "held" | "cancelled" => "warn",
        _ => "muted",
    }
}

fn filter_form(q: &JobsQuery) -> Markup {
    let v = |x: &Option<String>| x.clone().unwrap_or_default();
    html! {
        form.panel #filter method="get" action=(PATH) {
            label for="f-state" { "State" }
            select #f-state name="state" {
                option value="" { "any" }
                @for st in STATES { option value=(st) selected[q.state.as_deref() == Some(st)] { (st) } }
            }
            label for="f-source" { "Source" }
            input #f-source type="text" name="source" value=(v(&q.source));
            label for="f-tenant" { "Tenant" }
            input #f-tenant type="text" name="tenant" value=(v(&q.tenant));
            label for="f-request" { "Request or delivery ID" }
            input #f-request type="text" name="request" value=(v(&q.request));
            button type="submit" { "Filter" }
            a href=(PATH) { "clear" }
        }
    }
}

/// `GET /ui/jobs`.
///
/// # Errors
/// 303 to the login page without a session; 422 for an unknown state; 503.
pub async fn page(
    viewer: Viewer,
    State(state): State<AppState>,
    PageQuery(q): PageQuery<JobsQuery>,
) -> Result<Html<String>, ConsoleError> {
    let filter = q.filter()?;
    let s = snapshot(&state, &filter).await?;
    let live = format!("/ui/jobs/live?{}", q.query_string());
    let body = html! {
        h1 { "Jobs" }
        (filter_form(&q))
        div #live data-live=(live) { (fragment(&s)) }
        @if viewer.can_act() && !s.jobs.is_empty() { (bulk_form(&viewer, &q)) }
    };
    Ok(Html(
        layout::page("Jobs", &viewer, Section::Jobs, body).into_string(),
    ))
}

/// `GET /ui/jobs/live`: the page's live part for the same filter.
///
/// # Errors
/// As [`page`].
pub async fn live(
    _: Viewer,
    State(state): State<AppState>,
    PageQuery(q): PageQuery<JobsQuery>,
) -> Result<Html<String>, ConsoleError> {
    let filter = q.filter()?;
    Ok(Html(
        fragment(&snapshot(&state, &filter).await?).into_string(),
    ))
}

/// The bulk form under the job list: the action on every listed job, after confirmation.
pub fn bulk_form(viewer: &Viewer, q: &JobsQuery) -> Markup {
    let v = |x: &Option<String>| x.clone().unwrap_or_default();
    html! {
        form.panel #bulk method="post" action=(super::paths::JOBS_CONFIRM) {
            (layout::csrf_field(viewer))
            input type="hidden" name="state" value=(v(&q.state));
            input type="hidden" name="source" value=(v(&q.source));
            input type="hidden" name="tenant" value=(v(&q.tenant));
            input type="hidden" name="request" value=(v(&q.request));
            strong { "Every job this filter lists (at most " (LIMIT) "): " }
            button type="submit" name="action" value="cancel" { "Cancel…" }
            button type="submit" name="action" value="retry" { "Retry failed…" }
            button type="submit" name="action" value="resume" { "Resume held…" }
            span.muted { " Each asks for confirmation first." }
        }
    }
}
