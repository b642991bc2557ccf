//! Actions on jobs — cancel, retry, resume, undo — one job or every job a filter lists, each in two
//! steps: a confirmation page stating how many jobs and what happens to them (cancel, retry and
//! resume are first run as a dry run, rolled back, so the count is exact at that moment), then the
//! action on exactly the jobs confirmed.
//!
//! Cancel, retry and resume go through [`crate::http::reconcile::run`] (as `POST /v1/reconcile`,
//! narrowed to the confirmed job IDs); undo through [`crate::http::reconcile::undo`] (as `POST
//! /v1/jobs/{job_id}/undo`). Both write the same audit entries as the JSON API.

use axum::extract::State;
use axum::response::Html;
use maud::{Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::error::ConsoleError;
use super::jobs::{JobsQuery, LIMIT};
use super::layout::{self, Section};
use super::session::{ActionForm, Viewer};
use crate::db::{self, Bounds};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::reconcile::{self, ReconcileBody};
use crate::queue::reconcile::{Actions, Applied, Filter};
use crate::queue::search;

/// The confirmation step.
pub const CONFIRM: &str = "/ui/jobs/confirm";
/// The action step.
pub const ACT: &str = "/ui/jobs/act";

/// What can be done to jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobAction {
    /// Cancel queued, held and running jobs.
    Cancel,
    /// Retry failed jobs from their checkpoint.
    Retry,
    /// Resume held jobs no engaged kill switch blocks.
    Resume,
    /// Undo a job's soft delete and cancel it (one job, before its hard delete).
    Undo,
}

impl JobAction {
    fn verb(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Retry => "retry",
            Self::Resume => "resume",
            Self::Undo => "undo",
        }
    }

    fn actions(self) -> Actions {
        Actions {
            cancel: self == Self::Cancel,
            retry: self == Self::Retry,
            resume: self == Self::Resume,
            create_orphan_jobs: false,
        }
    }

    fn consequence(self, rate: f64) -> String {
        match self {
            Self::Cancel => "Queued and held jobs become cancelled at once. A running job stops before its next destructive statement and ends cancelled; what it already deleted stays deleted (nothing is restored). A cancelled job is never resumed.".to_owned(),
            Self::Retry => format!("Failed jobs are queued again (held while a kill switch blocks them) with their attempts reset; each redoes its checks and resumes the hard delete from its checkpoint. Released at {rate} job(s) per second."),
            Self::Resume => format!("Held jobs that no engaged kill switch blocks are queued again and resume from their checkpoints, released at {rate} job(s) per second. Jobs a switch still blocks are left held."),
            Self::Undo => "The configured undo statements run on the target (the tenant is restored from its soft delete) and the job is cancelled. Refused once the hard delete has started: nothing deleted can be undone.".to_owned(),
        }
    }
}

/// The bulk form under the job list: the action on every listed job, after confirmation.
pub fn bulk_form(viewer: &Viewer, q: &JobsQuery) -> Markup {
    let v = |x: &Option<String>| x.clone().unwrap_or_default();
    html! {
        form.panel #bulk method="post" action=(CONFIRM) {
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

/// The buttons of one job's page.
pub fn job_buttons(viewer: &Viewer, id: Uuid, state: &str, hard_delete_started: bool) -> Markup {
    let mut offered = Vec::new();
    if matches!(state, "queued" | "held" | "running") {
        offered.push(("cancel", "Cancel…"));
    }
    if state == "failed" {
        offered.push(("retry", "Retry…"));
    }
    if state == "held" {
        offered.push(("resume", "Resume…"));
    }
    if !hard_delete_started && matches!(state, "queued" | "held" | "failed" | "cancelled") {
        offered.push(("undo", "Undo soft delete…"));
    }
    html! {
        @if !offered.is_empty() {
            form.panel #job-actions method="post" action=(CONFIRM) {
                (layout::csrf_field(viewer))
                input type="hidden" name="ids" value=(id);
                @for (value, label) in offered { button type="submit" name="action" value=(value) { (label) } }
            }
        }
    }
}

/// The confirmation form: the action, and either job IDs or a job filter.
#[derive(Debug, Deserialize)]
pub struct ConfirmForm {
    /// What to do.
    pub action: JobAction,
    /// Comma-separated job IDs; when absent, the jobs the filter fields list.
    #[serde(default)]
    pub ids: Option<String>,
    /// The job filter (as on the jobs page).
    #[serde(flatten)]
    pub filter: JobsQuery,
}

fn parse_ids(ids: &str) -> Result<Vec<Uuid>, ApiError> {
    ids.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            Uuid::parse_str(s)
                .map_err(|_| ApiError::Unprocessable(format!("ids: {s:?} is not a job ID")))
        })
        .collect()
}

fn applied_table(applied: &Applied) -> Markup {
    html! {
        table #actions {
            thead { tr { th { "Action" } th { "Job" } th { "Tenant" } th { "Change" } th { "Claimable at" } } }
            tbody {
                @for a in &applied.actions {
                    tr data-job=(a.job_id) data-action=(a.action) {
                        td { (a.action) }
                        td.mono { a href={ "/ui/jobs/" (a.job_id) } { (a.job_id) } }
                        td.mono { (a.tenant_id.as_deref().unwrap_or("–")) }
                        td { (before(&a.action)) " → " strong { (a.state) } }
                        td { (a.run_after.as_deref().unwrap_or("–")) }
                    }
                }
            }
        }
        @if !applied.skipped.is_empty() {
            h2 { "Left alone (" (applied.skipped.len()) ")" }
            table #skipped {
                thead { tr { th { "Action" } th { "Job" } th { "Why" } } }
                tbody { @for s in &applied.skipped { tr { td { (s.action) } td.mono { (s.job_id) } td { (s.why) } } } }
            }
        }
    }
}

/// The state a job had before an action of this name.
pub fn before(action: &str) -> &'static str {
    match action {
        "resume" => "held",
        "retry" => "failed",
        "cancel" => "queued / held / running",
        "create_orphan_job" => "(no job)",
        _ => "?",
    }
}

/// `POST /ui/jobs/confirm`: the confirmation page (a dry run of cancel / retry / resume).
///
/// # Errors
/// 403 for a read-only token or a missing CSRF token; 422 for bad IDs or filter; 503.
pub async fn confirm(
    State(state): State<AppState>,
    ActionForm { viewer, form }: ActionForm<ConfirmForm>,
) -> Result<Html<String>, ConsoleError> {
    let ids = match form.ids.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(ids) => parse_ids(ids)?,
        None => {
            let filter = form.filter.filter()?;
            let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
            let jobs = search::jobs(&mut *tx, &filter, LIMIT).await?;
            tx.commit().await?;
            jobs.into_iter().map(|j| j.id).collect()
        }
    };
    let action = form.action;
    let rate = state.config.reconcile.release_rate;
    let (count, detail, confirmed): (usize, Markup, Vec<Uuid>) = match action {
        JobAction::Undo => {
            let [id] = ids.as_slice() else {
                return Err(
                    ApiError::Unprocessable("undo: exactly one job at a time".into()).into(),
                );
            };
            (
                1,
                html! { p { "Job " a.mono href={ "/ui/jobs/" (id) } { (id) } } },
                vec![*id],
            )
        }
        _ if ids.is_empty() => (0, html! {}, Vec::new()),
        _ => {
            let dry = reconcile::run(
                &state,
                &viewer.actor,
                &ReconcileBody {
                    apply: false,
                    actions: action.actions(),
                    filter: Filter {
                        ids,
                        ..Filter::default()
                    },
                    rate: None,
                    reason: "confirmation (dry run)".into(),
                },
            )
            .await?;
            let confirmed = dry.applied.actions.iter().map(|a| a.job_id).collect();
            (
                dry.applied.actions.len(),
                applied_table(&dry.applied),
                confirmed,
            )
        }
    };
    let joined = confirmed
        .iter()
        .map(Uuid::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let body = html! {
        h1 { "Confirm: " (action.verb()) " " (count) " job(s)" }
        p.banner.warn #consequence { (action.consequence(rate)) }
        (detail)
        @if count == 0 {
            p #nothing { "Nothing to " (action.verb()) ": no listed job is in a state this action applies to." }
        } @else {
            form.panel #confirm method="post" action=(ACT) {
                (layout::csrf_field(&viewer))
                input type="hidden" name="action" value=(action.verb());
                input type="hidden" name="ids" value=(joined);
                label for="reason" { "Reason" }
                input #reason type="text" name="reason" required maxlength="1000" placeholder="recorded in the audit log";
                button.danger type="submit" { "Yes, " (action.verb()) " " (count) " job(s)" }
            }
        }
        p { a href=(super::jobs::PATH) { "Back to jobs (nothing changed)" } }
    };
    Ok(Html(
        layout::page("Confirm", &viewer, Section::Jobs, body).into_string(),
    ))
}

/// The action form, as the confirmation page sends it.
#[derive(Debug, Deserialize)]
pub struct ActForm {
    /// What to do.
    pub action: JobAction,
    /// The confirmed job IDs, comma-separated.
    pub ids: String,
    /// Why.
    pub reason: String,
}

/// `POST /ui/jobs/act`: the action on the confirmed jobs; shows what was done.
///
/// # Errors
/// 403 for a read-only token or a missing CSRF token; 404 / 409 / 422 as the JSON API; 503.
pub async fn act(
    State(state): State<AppState>,
    ActionForm { viewer, form }: ActionForm<ActForm>,
) -> Result<Html<String>, ConsoleError> {
    let ids = parse_ids(&form.ids)?;
    if ids.is_empty() {
        return Err(ApiError::Unprocessable("ids: no job given".into()).into());
    }
    let result = match form.action {
        JobAction::Undo => {
            let [id] = ids.as_slice() else {
                return Err(
                    ApiError::Unprocessable("undo: exactly one job at a time".into()).into(),
                );
            };
            let undone = reconcile::undo(&state, &viewer.actor, *id, &form.reason).await?;
            html! {
                p.banner.ok #done { "Undone: job " (id) " is cancelled and its soft delete was undone." }
                pre.mono { (serde_json::to_string_pretty(&undone).unwrap_or_default()) }
            }
        }
        action => {
            let done = reconcile::run(
                &state,
                &viewer.actor,
                &ReconcileBody {
                    apply: true,
                    actions: action.actions(),
                    filter: Filter {
                        ids,
                        ..Filter::default()
                    },
                    rate: None,
                    reason: form.reason.clone(),
                },
            )
            .await?;
            html! {
                p.banner.ok #done { "Done: " (action.verb()) " — " (done.applied.actions.len()) " job(s). Recorded in the audit log." }
                (applied_table(&done.applied))
            }
        }
    };
    let body = html! {
        h1 { "Done" }
        (result)
        p { a href=(super::jobs::PATH) { "Back to jobs" } " · " a href=(super::audit::PATH) { "Audit log" } }
    };
    Ok(Html(
        layout::page("Done", &viewer, Section::Jobs, body).into_string(),
    ))
}
