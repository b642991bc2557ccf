//! Every path of the console, in one place that imports nothing: the pages link to each other
//! through these, so no page module imports another for its address.

/// The kill switch page.
pub const KILL_SWITCHES: &str = "/ui/kill-switches";
/// The jobs page.
pub const JOBS: &str = "/ui/jobs";
/// A job action's confirmation.
pub const JOBS_CONFIRM: &str = "/ui/jobs/confirm";
/// A confirmed job action.
pub const JOBS_ACT: &str = "/ui/jobs/act";
/// A job action's result.
pub const JOBS_DONE: &str = "/ui/jobs/done";
/// The held requests and reconcile page.
pub const RECONCILE: &str = "/ui/reconcile";
/// A reconcile dry run.
pub const RECONCILE_DRY_RUN: &str = "/ui/reconcile/dry-run";
/// A reconcile apply.
pub const RECONCILE_APPLY: &str = "/ui/reconcile/apply";
/// A reconcile apply's result.
pub const RECONCILE_APPLIED: &str = "/ui/reconcile/applied";
/// The audit log.
pub const AUDIT: &str = "/ui/audit";
/// The login page.
pub const LOGIN: &str = "/ui/login";
/// The logout action.
pub const LOGOUT: &str = "/ui/logout";
/// The script.
pub const SCRIPT: &str = "/ui/static/console.js";
/// The stylesheet.
pub const STYLE: &str = "/ui/static/console.css";
