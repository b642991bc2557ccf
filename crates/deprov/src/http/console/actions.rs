//! Actions on jobs — cancel, retry, resume, undo — one job or every job a filter lists, each in two
//! steps: a confirmation page stating how many jobs and what happens to them (cancel, retry and
//! resume are first run as a dry run, rolled back, so the count is exact at that moment), then the
//! action on exactly the jobs confirmed.
//!
//! The action answers with a redirect (303) to [`DONE`], a page that only reads what was done from
//! the audit log: reloading it repeats nothing, and it states no change the log does not hold.
//!
//! Cancel, retry and resume go through [`crate::http::reconcile_routes::run`] (as `POST /v1/reconcile`,
//! narrowed to the confirmed job IDs); undo through [`crate::http::reconcile_routes::undo`] (as `POST
//! /v1/jobs/{job_id}/undo`). Both write the same audit entries as the JSON API.

use std::collections::HashMap;

use axum::extract::State;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::jobs_page::{JobsQuery, LIMIT};
use super::layout::{self, Section};
use super::page_error::{ConsoleError, PageQuery};
use super::session::{ActionForm, Viewer};
use crate::db::{self, Bounds};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::reconcile_routes::{self, ReconcileBody};
use crate::queue::reconcile::{Actions, Applied, Filter};
use crate::queue::search;

/// The confirmation step.
pub const CONFIRM: &str = super::paths::JOBS_CONFIRM;
/// The action step.
pub const ACT: &str = super::paths::JOBS_ACT;
/// What an action did, read from the audit log (where [`ACT`] redirects).
pub const DONE: &str = super::paths::JOBS_DONE;

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

fn applied_table(applied: &Applied, before: &HashMap<Uuid, String>) -> Markup {
    html! {
        table #actions {
            thead { tr { th { "Action" } th { "Job" } th { "Tenant" } th { "Change" } th { "Claimable at" } } }
            tbody {
                @for a in &applied.actions {
                    tr data-job=(a.job_id) data-action=(a.action) {
                        td { (a.action) }
                        td.mono { a href={ "/ui/jobs/" (a.job_id) } { (a.job_id) } }
                        td.mono { (a.tenant_id.as_deref().unwrap_or("–")) }
                        td { (change(before.get(&a.job_id).map(String::as_str), &a.action, &a.state)) }
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

/// The state a job had before an action of this name, when it was not read.
fn usual_before(action: &str) -> &'static str {
    match action {
        "resume" => "held",
        "retry" => "failed",
        "create_orphan_job" => "(no job)",
        _ => "?",
    }
}

/// A job's change: its state `before` (when known) → its state `after` an `action`; a running job
/// whose cancel was requested (it is still `running`) ends cancelled at its next batch boundary.
pub fn change(before: Option<&str>, action: &str, after: &str) -> Markup {
    let before = before.unwrap_or_else(|| usual_before(action));
    html! {
        @if action == "cancel" && after == "running" {
            (before) " → " strong { "cancelled at its next batch boundary" }
        } @else {
            (before) " → " strong { (after) }
        }
    }
}

/// The current state of each of `ids` that exists.
///
/// # Errors
/// 503 when the state database is unavailable.
pub async fn states(state: &AppState, ids: &[Uuid]) -> Result<HashMap<Uuid, String>, ConsoleError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let rows: Vec<(Uuid, String)> =
        crate::db::query_as("SELECT id, state FROM deprov.jobs WHERE id = ANY($1)")
            .bind(ids)
            .fetch_all(&mut *tx)
            .await?;
    tx.commit().await?;
    Ok(rows.into_iter().collect())
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
            let before = states(&state, &ids).await?;
            let dry = reconcile_routes::run(
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
                applied_table(&dry.applied, &before),
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
        p { a href=(super::paths::JOBS) { "Back to jobs (nothing changed)" } }
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

/// `POST /ui/jobs/act`: the action on the confirmed jobs, then a redirect (303) to [`DONE`], which
/// shows what was done.
///
/// # Errors
/// 403 for a read-only token or a missing CSRF token; 404 when none of the jobs exists; 404 / 409
/// / 422 as the JSON API; 503.
pub async fn act(
    State(state): State<AppState>,
    ActionForm { viewer, form }: ActionForm<ActForm>,
) -> Result<Response, ConsoleError> {
    let ids = parse_ids(&form.ids)?;
    if ids.is_empty() {
        return Err(ApiError::Unprocessable("ids: no job given".into()).into());
    }
    if states(&state, &ids).await?.is_empty() {
        return Err(ApiError::NotFound(format!(
            "none of the {} confirmed job(s) exists: nothing was done and nothing was recorded",
            ids.len()
        ))
        .into());
    }
    let after = audit_mark(&state).await?;
    match form.action {
        JobAction::Undo => {
            let [id] = ids.as_slice() else {
                return Err(
                    ApiError::Unprocessable("undo: exactly one job at a time".into()).into(),
                );
            };
            reconcile_routes::undo(&state, &viewer.actor, *id, &form.reason).await?;
        }
        action => {
            reconcile_routes::run(
                &state,
                &viewer.actor,
                &ReconcileBody {
                    apply: true,
                    actions: action.actions(),
                    filter: Filter {
                        ids: ids.clone(),
                        ..Filter::default()
                    },
                    rate: None,
                    reason: form.reason.clone(),
                },
            )
            .await?;
        }
    }
    let upto = audit_upto(&state, after, &viewer.actor).await?;
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("action", form.action.verb())
        .append_pair("after", &after.to_string())
        .append_pair("upto", &upto.to_string())
        .append_pair("confirmed", &ids.len().to_string())
        .finish();
    Ok(Redirect::to(&format!("{DONE}?{query}")).into_response())
}

/// The last audit entry's ID (0 for none): entries an action writes next come after it.
///
/// # Errors
/// 503 when the state database is unavailable.
pub async fn audit_mark(state: &AppState) -> Result<i64, ConsoleError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let id: i64 = crate::db::query_scalar("SELECT coalesce(max(id), 0) FROM deprov.audit_log")
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(id)
}

/// The last audit entry `actor` wrote after entry `after` (`after` when none).
///
/// # Errors
/// 503 when the state database is unavailable.
pub async fn audit_upto(state: &AppState, after: i64, actor: &str) -> Result<i64, ConsoleError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let id: i64 = crate::db::query_scalar(
        "SELECT coalesce(max(id), $1) FROM deprov.audit_log WHERE id > $1 AND actor = $2",
    )
    .bind(after)
    .bind(actor)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// A job action as the audit log records it.
pub struct DoneEntry {
    /// The entry's ID.
    pub id: i64,
    /// `cancel`, `retry`, `resume`, `undo` or `create_orphan_job`.
    pub action: String,
    /// The job.
    pub job_id: Uuid,
    /// The job's tenant, when known.
    pub tenant_id: Option<String>,
    /// The job's state before the action.
    pub before: Option<String>,
    /// Its state after (`running` for a cancel a running job carries out at its next batch
    /// boundary).
    pub after: String,
    /// When a released job becomes claimable (RFC 3339): as recorded, else while it is queued.
    pub run_after: Option<String>,
}

/// An audit entry of a job action (ID, action, target, details) with its job's ID, tenant, and when
/// it becomes claimable if it is queued.
type AuditRow = (
    i64,
    String,
    Option<String>,
    serde_json::Value,
    Option<Uuid>,
    Option<String>,
    Option<time::OffsetDateTime>,
);

/// The job actions `actor` recorded in the audit log in entries `after < id <= upto`, oldest first.
///
/// # Errors
/// 503 when the state database is unavailable.
pub async fn done_entries(
    state: &AppState,
    actor: &str,
    after: i64,
    upto: i64,
) -> Result<Vec<DoneEntry>, ConsoleError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let rows: Vec<AuditRow> = crate::db::query_as(
        "SELECT a.id, a.action, a.target, a.details, j.id, j.tenant_id, \
               CASE WHEN j.state = 'queued' THEN j.run_after END \
             FROM deprov.audit_log a \
             LEFT JOIN deprov.jobs j ON j.id = CASE WHEN a.target ~ '^job:[0-9a-f-]{36}$' \
               THEN substr(a.target, 5)::uuid END \
             WHERE a.id > $1 AND a.id <= $2 AND a.actor = $3 AND a.action IN \
               ('job.cancel', 'job.retry', 'job.resume', 'job.undo', 'job.create_orphan') \
             ORDER BY a.id LIMIT 1000",
    )
    .bind(after)
    .bind(upto)
    .bind(actor)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, action, target, details, job, tenant, claimable)| {
            let job_id = job.or_else(|| target?.strip_prefix("job:")?.parse().ok())?;
            let text = |k: &str| details.get(k).and_then(|v| v.as_str()).map(str::to_owned);
            let (action, after) = match action.as_str() {
                "job.cancel" => (
                    "cancel",
                    if text("outcome").as_deref() == Some("cancel_requested") {
                        "running".to_owned()
                    } else {
                        "cancelled".to_owned()
                    },
                ),
                "job.undo" => ("undo", "cancelled (soft delete undone)".to_owned()),
                "job.create_orphan" => (
                    "create_orphan_job",
                    text("state").unwrap_or_else(|| "?".into()),
                ),
                "job.retry" => ("retry", text("new_state").unwrap_or_else(|| "?".into())),
                _ => ("resume", text("new_state").unwrap_or_else(|| "?".into())),
            };
            Some(DoneEntry {
                id,
                action: action.to_owned(),
                job_id,
                tenant_id: tenant.or_else(|| text("tenant_id")),
                before: text("previous_state"),
                after,
                run_after: text("run_after").or_else(|| {
                    claimable.and_then(|t| {
                        t.format(&time::format_description::well_known::Rfc3339)
                            .ok()
                    })
                }),
            })
        })
        .collect())
}

/// The table of what was done (`id` `actions` for jobs, `diff` for a reconcile).
pub fn done_table(id: &str, entries: &[DoneEntry]) -> Markup {
    html! {
        table id=(id) {
            thead { tr { th { "Audit entry" } th { "Action" } th { "Job" } th { "Tenant" } th { "Change" } th { "Claimable at" } } }
            tbody {
                @if entries.is_empty() { tr { td.muted colspan="6" { "No action." } } }
                @for e in entries {
                    tr data-job=(e.job_id) data-action=(e.action) {
                        td.num { "#" (e.id) }
                        td { (e.action) }
                        td.mono { a href={ "/ui/jobs/" (e.job_id) } { (e.job_id) } }
                        td.mono { (e.tenant_id.as_deref().unwrap_or("–")) }
                        td { (change(e.before.as_deref(), &e.action, &e.after)) }
                        td { (e.run_after.as_deref().unwrap_or("–")) }
                    }
                }
            }
        }
    }
}

/// The query [`act`] redirects with: which audit entries to read, and how many jobs were confirmed.
#[derive(Debug, Default, Deserialize)]
pub struct DoneQuery {
    /// The action (`cancel`, `retry`, `resume`, `undo`).
    pub action: Option<JobAction>,
    /// Entries after this ID …
    pub after: Option<i64>,
    /// … up to this one.
    pub upto: Option<i64>,
    /// How many jobs were confirmed.
    pub confirmed: Option<usize>,
}

/// `GET /ui/jobs/done`: what an action did, as the viewer's audit entries record it (reading it
/// again changes nothing).
///
/// # Errors
/// 303 to the login page without a session; 503.
pub async fn done(
    viewer: Viewer,
    State(state): State<AppState>,
    PageQuery(q): PageQuery<DoneQuery>,
) -> Result<Html<String>, ConsoleError> {
    let after = q.after.unwrap_or(0);
    let entries = done_entries(&state, &viewer.actor, after, q.upto.unwrap_or(after)).await?;
    let verb = q.action.map_or("act on", JobAction::verb);
    let confirmed = q.confirmed.unwrap_or(entries.len()).max(entries.len());
    let skipped = confirmed - entries.len();
    let body = html! {
        h1 { "Done" }
        @if entries.is_empty() {
            p.banner.warn #done {
                "Nothing was done: none of the " (confirmed) " confirmed job(s) could be acted on "
                "(their state changed since the confirmation). No audit entry was written."
            }
        } @else {
            p.banner.ok #done {
                "Done: " (verb) " — " (entries.len()) " of the " (confirmed) " confirmed job(s)."
                @if skipped > 0 {
                    " " (skipped) " skipped: their state changed since the confirmation."
                }
                " Recorded in the audit log (" (entries.len()) " entr" (if entries.len() == 1 { "y" } else { "ies" }) ")."
            }
        }
        (done_table("actions", &entries))
        p { a href=(super::paths::JOBS) { "Back to jobs" } " · " a href=(super::paths::AUDIT) { "Audit log" } }
    };
    Ok(Html(
        layout::page("Done", &viewer, Section::Jobs, body).into_string(),
    ))
}
