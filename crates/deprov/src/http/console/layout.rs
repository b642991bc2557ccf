//! The page shell shared by every console page, and the small formatting helpers.

use maud::{DOCTYPE, Markup, html};
use time::OffsetDateTime;

use super::paths;
use super::session::Viewer;
use super::shell::head;

/// The console's sections, in the navigation's order (the incident-night order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Kill switches.
    KillSwitches,
    /// Jobs.
    Jobs,
    /// Held requests and reconcile.
    Reconcile,
    /// The audit log.
    Audit,
}

/// A console page: navigation, who is logged in (with their role) and the logout button, `body`.
pub fn page(title: &str, viewer: &Viewer, section: Section, body: Markup) -> Markup {
    let links = [
        (Section::KillSwitches, paths::KILL_SWITCHES, "Kill switches"),
        (Section::Jobs, paths::JOBS, "Jobs"),
        (Section::Reconcile, paths::RECONCILE, "Held & reconcile"),
        (Section::Audit, paths::AUDIT, "Audit log"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header.top {
                    span.brand { "deprov" }
                    nav {
                        @for (s, href, label) in links {
                            a href=(href) aria-current=[(s == section).then_some("page")] { (label) }
                        }
                    }
                    span.who {
                        span #actor { (viewer.actor) }
                        " · "
                        span #role class=(format!("role-{}", viewer.role.as_str())) { (viewer.role.as_str()) }
                        form.inline method="post" action=(paths::LOGOUT) {
                            (csrf_field(viewer))
                            button.link type="submit" { "Log out" }
                        }
                    }
                }
                @if !viewer.can_act() {
                    p.banner.readonly { "Read-only: you can look at everything and change nothing." }
                }
                main { (body) }
            }
        }
    }
}

/// The hidden CSRF field every form of the console carries.
pub fn csrf_field(viewer: &Viewer) -> Markup {
    html! { input type="hidden" name="csrf" value=(viewer.csrf()); }
}

/// `t` as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// An optional time, `–` when none.
pub fn maybe_time(t: Option<OffsetDateTime>) -> String {
    t.map_or_else(|| "–".to_owned(), time)
}

/// How long before `now` `t` was, as `3 s`, `4 min 2 s`, `2 h 5 min`.
pub fn age(now: OffsetDateTime, t: OffsetDateTime) -> String {
    let secs = (now - t).whole_seconds().max(0);
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min {} s", secs / 60, secs % 60),
        _ => format!("{} h {} min", secs / 3600, (secs % 3600) / 60),
    }
}

/// Milliseconds as `12.3 ms` or `4.2 s`.
pub fn millis(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

/// The line under a live fragment: when the server rendered it.
pub fn updated(now: OffsetDateTime) -> Markup {
    html! { p.updated { "Updated " time datetime=(time(now)) { (time(now)) } " · refreshes every 2 s" } }
}
