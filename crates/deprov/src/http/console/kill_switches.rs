//! The kill switch page: every switch, whether each change took effect, and engage / release.
//!
//! "Did it take effect?" per switch: which live workers acknowledged its version and when (each
//! `listening` or heartbeat-only), the running jobs it blocks that have not stopped yet with the
//! worker holding each one's lease (named when it is not live: a worker that stopped heartbeating
//! drops out of the live workers, yet its lease keeps the job running until it expires), and
//! whether a hard delete checkpointed after the change (of the tenant's jobs for a tenant switch,
//! of any job otherwise), and when the live workers' last destructive statement ended
//! (`last_destroyed_at`, of any job) against the change — read as `GET /v1/kill-switch` reads them
//! ([`crate::http::kill_switch_routes::read_status`]). Changes go through
//! [`crate::http::kill_switch_routes::change`], as `PUT /v1/kill-switch` does.

use axum::extract::State;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use time::OffsetDateTime;

use super::layout::{self, Section};
use super::page_error::{ConsoleError, PageQuery};
use super::session::{ActionForm, Viewer};
use crate::db::{self, Bounds};
use crate::http::AppState;
use crate::http::kill_switch_routes::{self, KillSwitchStatusView, SetKillSwitch};
use crate::queue::kill_switch::ScopeKind;
use crate::queue::search;

/// The page's path.
pub const PATH: &str = super::paths::KILL_SWITCHES;

/// What the page shows after a change (from the redirect's query): the switch is looked up by its
/// version, so a crafted link cannot make the page state a change that did not happen.
#[derive(Debug, Default, Deserialize)]
pub struct Changed {
    /// The changed switch's new version.
    pub version: Option<i64>,
    /// Jobs moved by the change (queued → held by an engage, held → queued by a release).
    pub moved: Option<u64>,
}

/// Everything the live part shows, read in two short transactions.
struct Snapshot {
    status: KillSwitchStatusView,
    running_blocked: Vec<(String, i64)>,
    blocked_jobs: Vec<search::BlockedRunning>,
    tenant_checkpoints: Vec<(String, Option<OffsetDateTime>)>,
    age: search::QueueAge,
}

impl Snapshot {
    /// Running jobs switch `name` blocks.
    fn running(&self, name: &str) -> i64 {
        self.running_blocked
            .iter()
            .find(|(b, _)| b == name)
            .map_or(0, |(_, n)| *n)
    }
}

async fn snapshot(state: &AppState) -> Result<Snapshot, ConsoleError> {
    let status = KillSwitchStatusView::new(kill_switch_routes::read_status(state).await?);
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let running_blocked = search::running_blocked(&mut *tx).await?;
    let blocked_jobs = search::running_blocked_jobs(&mut *tx).await?;
    let tenant_checkpoints = search::tenant_checkpoints(&mut *tx).await?;
    let age = search::queue_age(&mut *tx).await?;
    tx.commit().await?;
    Ok(Snapshot {
        status,
        running_blocked,
        blocked_jobs,
        tenant_checkpoints,
        age,
    })
}

fn label(scope: ScopeKind, key: Option<&str>) -> String {
    match (scope, key) {
        (ScopeKind::Global, _) | (_, None) => "global".to_owned(),
        (ScopeKind::Source, Some(k)) => format!("source:{k}"),
        (ScopeKind::Tenant, Some(k)) => format!("tenant:{k}"),
    }
}

fn fragment(s: &Snapshot) -> Markup {
    let status = &s.status;
    let now = s.age.now;
    let global = &status.scopes[0];
    let running_total: i64 = s.running_blocked.iter().map(|(_, n)| *n).sum();
    let last_destroyed = status
        .live_workers
        .iter()
        .filter_map(|w| w.last_destroyed_at)
        .max();
    // Lease holders of blocked running jobs that are not live workers, each once.
    let mut silent: Vec<(&str, Option<OffsetDateTime>)> = Vec::new();
    for j in s.blocked_jobs.iter().filter(|j| !j.owner_live) {
        let owner = j.lease_owner.as_deref().unwrap_or("?");
        if !silent.iter().any(|(w, _)| *w == owner) {
            silent.push((owner, j.owner_heartbeat_at));
        }
    }
    html! {
        @if status.engaged {
            p.banner.bad #global-state data-engaged="true" {
                "GLOBAL KILL SWITCH ENGAGED — version " (status.version) " by "
                (status.changed_by.as_deref().unwrap_or("?")) ": " (status.reason.as_deref().unwrap_or(""))
            }
        } @else {
            p.banner.ok #global-state data-engaged="false" { "Global kill switch released — deletions may run." }
        }
        @if status.acknowledged && running_total == 0 {
            p.banner.ok #ack-state data-acknowledged="true" data-running-blocked="0" {
                "Every live worker (" (status.live_workers.len()) ") has acknowledged version "
                (status.latest_version) " (the latest change of any switch)."
            }
        } @else if status.acknowledged {
            p.banner.warn #ack-state data-acknowledged="true" data-running-blocked=(running_total) {
                "Every live worker (" (status.live_workers.len()) ") has acknowledged version "
                (status.latest_version) ", but " (running_total) " running job(s) an engaged switch "
                "blocks have not stopped yet (see below)."
            }
        } @else {
            p.banner.warn #ack-state data-acknowledged="false" data-running-blocked=(running_total) {
                "Waiting for " (status.pending_workers.len()) " live worker(s) to acknowledge version "
                (status.latest_version) ": " (status.pending_workers.join(", "))
            }
        }
        @if !silent.is_empty() {
            ul.banner.bad #silent-workers {
                @for (worker, heard) in &silent {
                    li data-worker=(worker) {
                        "worker " span.mono { (worker) } " holds a running job's lease but has not been heard from "
                        @match heard {
                            Some(t) => { "for " ((now - *t).whole_seconds().max(0)) " s" }
                            None => { "at all (no heartbeat recorded)" }
                        }
                        "; its job turns held once that lease expires (a live worker hands it back before its next claim)."
                    }
                }
            }
        }
        h2 { "Switches" }
        table #switches {
            thead { tr {
                th { "Scope" } th { "State" } th { "Version" } th { "Changed" } th { "Reason" }
                th { "Acknowledged by the live workers" } th { "Did it take effect?" }
            } }
            tbody {
                @for sw in &status.scopes {
                    @let name = label(sw.switch.scope, sw.switch.key.as_deref());
                    @let running = s.running(&name);
                    @let jobs: Vec<&search::BlockedRunning> = s.blocked_jobs.iter().filter(|j| j.blocked_by == name).collect();
                    @let checkpoint = match sw.switch.scope {
                        ScopeKind::Tenant => Checkpoint::Tenant(s.tenant_checkpoints.iter().find(|(n, _)| *n == name).and_then(|(_, t)| *t)),
                        _ => Checkpoint::AnyJob(s.age.last_checkpoint),
                    };
                    tr data-scope=(name) data-engaged=(sw.switch.engaged) data-acknowledged=(sw.acknowledged) {
                        td.mono { (name) }
                        td { @if sw.switch.engaged { span.pill.bad { "engaged" } } @else { span.pill.ok { "released" } } }
                        td.num { (sw.switch.version) }
                        td { (layout::time(sw.switch.changed_at)) br; span.muted { "by " (sw.switch.changed_by.as_deref().unwrap_or("–")) } }
                        td { (sw.switch.reason.as_deref().unwrap_or("–")) }
                        td { (acks(status, sw.switch.version)) }
                        td { (effect(&Verdict { engaged: sw.switch.engaged, acknowledged: sw.acknowledged, running, jobs: &jobs, changed_at: sw.switch.changed_at, checkpoint, last_destroyed, version: sw.switch.version, now })) }
                    }
                }
            }
        }
        h2 { "Live workers" }
        @if status.live_workers.is_empty() {
            p.muted { "No live worker: nothing is deleting." }
        } @else {
            table #workers {
                thead { tr { th { "Worker" } th { "Hears changes by" } th { "Acknowledged version" } th { "Acknowledged at" } th { "Last destructive statement ended" } th { "Last heartbeat" } } }
                tbody {
                    @for w in &status.live_workers {
                        tr data-worker=(w.id) data-observed=(w.observed_version) {
                            td.mono { (w.id) }
                            td { @if w.listening { "listening (NOTIFY)" } @else { "heartbeat only" } }
                            td.num { (w.observed_version) }
                            td { (layout::maybe_time(w.observed_at)) }
                            td.last-destroyed { (layout::maybe_time(w.last_destroyed_at)) }
                            td { (layout::time(w.heartbeat_at)) " (" (layout::age(now, w.heartbeat_at)) " ago)" }
                        }
                    }
                }
            }
        }
        p.muted {
            "Last checkpoint of a hard delete (of any job): " (layout::maybe_time(s.age.last_checkpoint))
            ". Each worker writes when its last destructive statement ended with its heartbeat and "
            "with each acknowledgement; global switch changed "
            (layout::time(global.switch.changed_at)) "."
        }
        (layout::updated(now))
    }
}

/// Per live worker, whether it acknowledged `version`, which version it holds and since when.
fn acks(status: &KillSwitchStatusView, version: i64) -> Markup {
    html! {
        @if status.live_workers.is_empty() { span.muted { "no live worker" } }
        ul {
            @for w in &status.live_workers {
                li {
                    @if w.observed_version >= version { "✔ " } @else { "✗ " }
                    span.mono { (w.id) } " — v" (w.observed_version) " at " (layout::maybe_time(w.observed_at))
                    @if w.listening { " · listening" } @else { " · heartbeat only" }
                }
            }
        }
    }
}

/// The latest hard-delete checkpoint a verdict compares with the switch's change.
#[derive(Clone, Copy)]
enum Checkpoint {
    /// Of any job (global and source switches).
    AnyJob(Option<OffsetDateTime>),
    /// Of the switch's tenant's jobs.
    Tenant(Option<OffsetDateTime>),
}

/// What one switch's verdict is made of.
struct Verdict<'a> {
    engaged: bool,
    acknowledged: bool,
    /// Running jobs it blocks.
    running: i64,
    /// The first of them, with their lease holders.
    jobs: &'a [&'a search::BlockedRunning],
    changed_at: OffsetDateTime,
    checkpoint: Checkpoint,
    /// The latest end of a live worker's destructive statement (of any job).
    last_destroyed: Option<OffsetDateTime>,
    version: i64,
    now: OffsetDateTime,
}

/// The verdict for one switch.
fn effect(v: &Verdict<'_>) -> Markup {
    let (whose, last) = match v.checkpoint {
        Checkpoint::AnyJob(t) => ("of any job", t),
        Checkpoint::Tenant(t) => ("of this tenant's jobs", t),
    };
    let after = last.filter(|t| *t > v.changed_at);
    html! {
        @if !v.engaged {
            @if v.version == 0 { span.muted { "never engaged" } } @else if v.acknowledged { span.pill.ok { "released everywhere" } } @else { span.pill.warn { "release not yet acknowledged" } }
        } @else if v.acknowledged && v.running == 0 {
            span.pill.ok data-effect="in-effect" { "in effect" }
            br; span.muted { "every live worker acknowledged; no job it blocks is running" }
        } @else {
            span.pill.warn data-effect="pending" { "not yet" }
            @if !v.acknowledged { br; "waiting for acknowledgements" }
            @if v.running > 0 { br; (v.running) " running job(s) it blocks stop at their next batch boundary" }
            @if !v.jobs.is_empty() {
                ul.blocked-jobs {
                    @for j in v.jobs.iter().take(10) {
                        li data-job=(j.job_id) {
                            "job " a.mono href={ "/ui/jobs/" (j.job_id) } { (j.job_id) }
                            ", lease held by " span.mono { (j.lease_owner.as_deref().unwrap_or("?")) }
                            @if !j.owner_live {
                                " — not a live worker"
                                @if let Some(t) = j.owner_heartbeat_at { " (not heard from for " ((v.now - t).whole_seconds().max(0)) " s)" }
                                @if let Some(t) = j.lease_expires_at { "; lease expires " (layout::time(t)) }
                            }
                        }
                    }
                }
            }
        }
        @if v.engaged {
            br;
            @match after {
                Some(t) => { span.muted { "last hard-delete checkpoint " (whose) " " (layout::millis((t - v.changed_at).as_seconds_f64() * 1000.0)) " after the engage (a job stopping for the switch writes one too)" } }
                None => { span.muted { "no hard-delete checkpoint " (whose) " since the engage" } }
            }
            br;
            @match v.last_destroyed {
                Some(t) if t > v.changed_at => {
                    span.muted data-last-destructive="after" { "last destructive statement of a live worker (of any job) ended " (layout::millis((t - v.changed_at).as_seconds_f64() * 1000.0)) " after the engage" }
                }
                Some(t) => {
                    span.muted data-last-destructive="before" { "last destructive statement of a live worker (of any job) ended " (layout::millis((v.changed_at - t).as_seconds_f64() * 1000.0)) " before the engage" }
                }
                None => { span.muted data-last-destructive="none" { "no live worker has run a destructive statement since it started" } }
            }
        }
    }
}

fn forms(viewer: &Viewer) -> Markup {
    html! {
        h2 { "Change a switch" }
        form.panel #global-form method="post" action=(PATH) {
            (layout::csrf_field(viewer))
            input type="hidden" name="scope" value="global";
            strong { "Global" } " "
            label for="global-reason" { "Reason" }
            input #global-reason type="text" name="reason" required maxlength="1000" placeholder="why (recorded in the audit log)";
            button.danger type="submit" name="engaged" value="true" { "Engage global" }
            button type="submit" name="engaged" value="false" { "Release global" }
        }
        form.panel #scoped-form method="post" action=(PATH) {
            (layout::csrf_field(viewer))
            label for="scope" { "Scope" }
            select #scope name="scope" {
                option value="source" { "source" }
                option value="tenant" { "tenant" }
            }
            label for="key" { "Source name or tenant key" }
            input #key type="text" name="key" required maxlength="200";
            label for="scoped-reason" { "Reason" }
            input #scoped-reason type="text" name="reason" required maxlength="1000";
            button.danger type="submit" name="engaged" value="true" { "Engage" }
            button type="submit" name="engaged" value="false" { "Release" }
        }
        p.muted { "Engaging stops every destructive statement of the jobs in scope at their next batch boundary (they turn held); intake keeps recording requests. Releasing queues held jobs nothing else blocks; they resume from their checkpoints." }
    }
}

/// `GET /ui/kill-switches`.
///
/// # Errors
/// 303 to the login page without a session; 503 when the state database is unavailable.
pub async fn page(
    viewer: Viewer,
    State(state): State<AppState>,
    PageQuery(changed): PageQuery<Changed>,
) -> Result<Html<String>, ConsoleError> {
    let s = snapshot(&state).await?;
    let body = html! {
        h1 { "Kill switches" }
        @if let Some(sw) = changed.version.and_then(|v| s.status.scopes.iter().find(|sw| sw.switch.version == v)) {
            p.banner.ok #changed role="status" {
                (label(sw.switch.scope, sw.switch.key.as_deref()))
                (if sw.switch.engaged { " engaged" } else { " released" }) " at version "
                (sw.switch.version) " by " (sw.switch.changed_by.as_deref().unwrap_or("?")) "; "
                @if sw.switch.engaged {
                    (changed.moved.unwrap_or(0)) " queued job(s) moved to held; "
                    (s.running(&label(sw.switch.scope, sw.switch.key.as_deref())))
                    " running job(s) it blocks still running now (each stops at its next batch boundary and turns held)."
                } @else {
                    (changed.moved.unwrap_or(0)) " held job(s) nothing else blocks queued again."
                }
                " Watch the acknowledgements below."
            }
        }
        div #live data-live="/ui/kill-switches/live" { (fragment(&s)) }
        @if viewer.can_act() { (forms(&viewer)) }
    };
    Ok(Html(
        layout::page("Kill switches", &viewer, Section::KillSwitches, body).into_string(),
    ))
}

/// `GET /ui/kill-switches/live`: the page's live part.
///
/// # Errors
/// As [`page`].
pub async fn live(_: Viewer, State(state): State<AppState>) -> Result<Html<String>, ConsoleError> {
    Ok(Html(fragment(&snapshot(&state).await?).into_string()))
}

/// The engage / release form.
#[derive(Debug, Deserialize)]
pub struct SwitchForm {
    /// `global`, `source` or `tenant`.
    pub scope: ScopeKind,
    /// The source name or tenant key.
    #[serde(default)]
    pub key: Option<String>,
    /// `true` engages, `false` releases.
    pub engaged: bool,
    /// Why.
    pub reason: String,
}

/// `POST /ui/kill-switches`: engages or releases a switch as `PUT /v1/kill-switch` does, then
/// shows the page with the change (303).
///
/// # Errors
/// 403 for a read-only token or a missing CSRF token; 422 for an invalid reason or key; 503.
pub async fn change(
    State(state): State<AppState>,
    ActionForm { viewer, form }: ActionForm<SwitchForm>,
) -> Result<Response, ConsoleError> {
    let body = SetKillSwitch {
        engaged: form.engaged,
        reason: form.reason,
        scope: form.scope,
        key: form.key.filter(|k| !k.trim().is_empty()),
    };
    let view = kill_switch_routes::change(&state, &viewer.actor, &body).await?;
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("version", &view.version.to_string())
        .append_pair("moved", &view.jobs_moved.unwrap_or(0).to_string())
        .finish();
    Ok(Redirect::to(&format!("{PATH}?{query}")).into_response())
}
