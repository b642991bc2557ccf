//! The audit log: every operator action, newest first, with actor, target and reason (as `GET
//! /v1/audit` reads it, [`crate::queue::audit::list`]).

use axum::extract::State;
use axum::response::Html;
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{self, Section};
use super::page_error::{ConsoleError, PageQuery};
use super::session::Viewer;
use crate::db::{self, Bounds};
use crate::http::AppState;
use crate::queue::audit::{self, Entry};
use crate::queue::search;

/// The page's path.
pub const PATH: &str = super::paths::AUDIT;

/// Entries per page.
const PAGE: i64 = 100;

/// The page's query.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuditQuery {
    /// Only actions starting with this (`job.`, `kill_switch.engage`).
    pub action: Option<String>,
    /// Only entries older than this ID (the next page).
    pub before: Option<i64>,
}

impl AuditQuery {
    fn action(&self) -> Result<Option<&str>, ConsoleError> {
        let action = self
            .action
            .as_deref()
            .map(str::trim)
            .filter(|a| !a.is_empty());
        if let Some(a) = action {
            crate::http::intake_routes::no_nul("action", a)?;
        }
        Ok(action)
    }
}

async fn read(
    state: &AppState,
    q: &AuditQuery,
) -> Result<(Vec<Entry>, time::OffsetDateTime), ConsoleError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let entries = audit::list(&mut *tx, PAGE, q.before, q.action()?).await?;
    let now = search::queue_age(&mut *tx).await?.now;
    tx.commit().await?;
    Ok((entries, now))
}

fn fragment(entries: &[Entry], now: time::OffsetDateTime) -> Markup {
    html! {
        table #audit {
            thead { tr { th { "#" } th { "When" } th { "Actor" } th { "Action" } th { "Target" } th { "Reason" } th { "Details" } } }
            tbody {
                @if entries.is_empty() { tr { td.muted colspan="7" { "No entry." } } }
                @for e in entries {
                    tr data-action=(e.action) data-actor=(e.actor) {
                        td.num { (e.id) } td { (layout::time(e.at)) } td.mono { (e.actor) }
                        td.mono { (e.action) } td.mono { (e.target.as_deref().unwrap_or("–")) }
                        td { (e.reason) } td.mono { (e.details.to_string()) }
                    }
                }
            }
        }
        (layout::updated(now))
    }
}

/// `GET /ui/audit`.
///
/// # Errors
/// 303 to the login page without a session; 422 for U+0000 in `action`; 503.
pub async fn page(
    viewer: Viewer,
    State(state): State<AppState>,
    PageQuery(q): PageQuery<AuditQuery>,
) -> Result<Html<String>, ConsoleError> {
    let (entries, now) = read(&state, &q).await?;
    let action = q.action.clone().unwrap_or_default();
    let mut live = form_urlencoded::Serializer::new(String::new());
    live.append_pair("action", &action);
    if let Some(b) = q.before {
        live.append_pair("before", &b.to_string());
    }
    let older = entries
        .last()
        .filter(|_| entries.len() as i64 == PAGE)
        .map(|e| {
            form_urlencoded::Serializer::new(String::new())
                .append_pair("action", &action)
                .append_pair("before", &e.id.to_string())
                .finish()
        });
    let body = html! {
        h1 { "Audit log" }
        form.panel #filter method="get" action=(PATH) {
            label for="f-action" { "Action starts with" }
            input #f-action type="text" name="action" value=(action) placeholder="job. or kill_switch.engage";
            button type="submit" { "Filter" }
            a href=(PATH) { "clear" }
        }
        div #live data-live={ "/ui/audit/live?" (live.finish()) } { (fragment(&entries, now)) }
        @if let Some(older) = older { p { a href={ (PATH) "?" (older) } { "Older entries →" } } }
    };
    Ok(Html(
        layout::page("Audit log", &viewer, Section::Audit, body).into_string(),
    ))
}

/// `GET /ui/audit/live`: the page's live part.
///
/// # Errors
/// As [`page`].
pub async fn live(
    _: Viewer,
    State(state): State<AppState>,
    PageQuery(q): PageQuery<AuditQuery>,
) -> Result<Html<String>, ConsoleError> {
    let (entries, now) = read(&state, &q).await?;
    Ok(Html(fragment(&entries, now).into_string()))
}
