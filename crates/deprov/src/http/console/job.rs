//! One job: its live progress (current table, rows deleted, batches, longest transaction, rests,
//! pauses, attempts, last error, checkpoint age), its requests, and its actions
//! ([`super::actions`]).

use axum::extract::{Path, State};
use axum::response::Html;
use maud::{Markup, html};
use time::OffsetDateTime;
use uuid::Uuid;

use super::actions;
use super::jobs_page::state_class;
use super::layout::{self, Section};
use super::page_error::ConsoleError;
use super::session::Viewer;
use crate::db::{self, Bounds};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::queue::search::{self, JobRequest};
use crate::queue::{Job, jobs};
use crate::worker::Progress;

struct Snapshot {
    job: Job,
    checkpointed_at: Option<OffsetDateTime>,
    requests: Vec<JobRequest>,
    now: OffsetDateTime,
}

fn parse(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id).map_err(|_| ApiError::BadRequest(format!("{id:?} is not a job ID")))
}

async fn snapshot(state: &AppState, id: Uuid) -> Result<Snapshot, ConsoleError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let job = jobs::get(&mut *tx, id).await?;
    let checkpointed_at = search::checkpointed_at(&mut *tx, id).await?;
    let requests = search::requests(&mut *tx, id).await?;
    let now = search::queue_age(&mut *tx).await?.now;
    tx.commit().await?;
    let job = job.ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    Ok(Snapshot {
        job,
        checkpointed_at,
        requests,
        now,
    })
}

fn fragment(s: &Snapshot) -> Markup {
    let job = &s.job;
    let p = Progress::from_json(&job.progress);
    html! {
        dl.facts #progress data-state=(job.state) data-rows=(p.rows_deleted) {
            dt { "State" } dd { span #state class={ "pill " (state_class(&job.state)) } { (job.state) } " · step " (job.step) }
            dt { "Current table" } dd.mono { (p.current_table.as_deref().unwrap_or("–")) }
            dt { "Rows deleted" } dd #rows { (p.rows_deleted) }
            dt { "Batches" } dd { (p.batches) " (" (p.timeouts) " cut short and retried smaller)" }
            dt { "Longest transaction" } dd { (layout::millis(p.longest_batch_ms)) }
            dt { "Rests (duty cycle)" } dd { (layout::millis(p.duty_cycle_ms)) @if let Some(until) = &p.resting_until { " · resting until " (until) } }
            dt { "Pauses" } dd { (p.pauses) " (" (layout::millis(p.paused_ms)) ")" @if let Some(why) = &p.last_pause_reason { " · last: " (why) } }
            dt { "Rate-limit waits" } dd { (layout::millis(p.rate_limited_ms)) }
            dt { "Attempts" } dd { (job.attempts) " (" (job.stalled_attempts) " without progress, of " (job.max_attempts) ")" }
            dt { "Last error" } dd { (job.last_error.as_deref().unwrap_or("–")) }
            dt { "Checkpoint age" } dd { (s.checkpointed_at.map_or_else(|| "no checkpoint yet".to_owned(), |t| format!("{} ago ({})", layout::age(s.now, t), layout::time(t)))) }
            dt { "Soft-deleted at" } dd { (p.soft_deleted_at.as_deref().unwrap_or("–")) }
            dt { "Grace until" } dd { (p.grace_until.as_deref().unwrap_or("–")) }
            dt { "Hard delete started" } dd { (p.hard_delete_started_at.as_deref().unwrap_or("–")) }
            dt { "Lease" } dd.mono { (job.lease_owner.as_deref().unwrap_or("–")) " until " (layout::maybe_time(job.lease_expires_at)) }
        }
        @if !p.tables.is_empty() {
            h2 { "Tables" }
            table #tables {
                thead { tr { th { "Table" } th { "Rows deleted" } th { "Batches" } th { "Longest batch" } th { "Done" } } }
                tbody { @for t in &p.tables { tr {
                    td.mono { (t.table) } td.num { (t.rows_deleted) } td.num { (t.batches) }
                    td.num { (layout::millis(t.longest_batch_ms)) } td { @if t.done { "✔" } }
                } } }
            }
        }
        (layout::updated(s.now))
    }
}

fn requests(s: &Snapshot) -> Markup {
    html! {
        h2 { "Requests (" (s.requests.len()) ")" }
        table #requests {
            thead { tr { th { "Request ID" } th { "Source" } th { "External / delivery ID" } th { "Received" } th { "While held" } th { "Duplicates" } th { "Reason" } } }
            tbody { @for r in &s.requests { tr {
                td.mono { (r.id) } td { (r.source) }
                td.mono { (r.external_id.as_deref().unwrap_or("–")) " " span.muted { "(" (r.dedup_basis) ")" } }
                td { (layout::time(r.received_at)) } td { @if r.received_while_held { "yes" } @else { "no" } }
                td.num { (r.duplicates) } td { (r.reason.as_deref().unwrap_or("–")) }
            } } }
        }
    }
}

/// `GET /ui/jobs/{job_id}`.
///
/// # Errors
/// 303 to the login page without a session; 400 malformed ID; 404 no such job; 503.
pub async fn page(
    viewer: Viewer,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Html<String>, ConsoleError> {
    let id = parse(&id)?;
    let s = snapshot(&state, id).await?;
    let started = Progress::from_json(&s.job.progress)
        .hard_delete_started_at
        .is_some();
    let body = html! {
        h1 { "Job " span.mono { (id) } }
        p { "Tenant " span.mono { (s.job.tenant_id.as_deref().unwrap_or("(unresolved)")) } " · subject "
            span.mono { (s.job.subject_kind) ":" (s.job.subject) } " · created " (layout::time(s.job.created_at)) }
        div #live data-live={ "/ui/jobs/" (id) "/live" } { (fragment(&s)) }
        @if viewer.can_act() { (actions::job_buttons(&viewer, id, &s.job.state, started)) }
        (requests(&s))
    };
    Ok(Html(
        layout::page("Job", &viewer, Section::Jobs, body).into_string(),
    ))
}

/// `GET /ui/jobs/{job_id}/live`: the page's live part.
///
/// # Errors
/// As [`page`].
pub async fn live(
    _: Viewer,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Html<String>, ConsoleError> {
    let id = parse(&id)?;
    Ok(Html(fragment(&snapshot(&state, id).await?).into_string()))
}
