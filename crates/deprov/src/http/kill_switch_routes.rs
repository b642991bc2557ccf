//! Operator routes for the kill switches: `GET` and `PUT /v1/kill-switch`.
//!
//! `GET` answers whether each switch's current version has been acknowledged by every live worker
//! and names the workers that have not (see [`crate::queue::workers`] and [`crate::worker::presence`]).

use axum::extract::State;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type,
};

use super::AppState;
use super::auth::Operator;
use super::error::{ApiError, Problem};
use super::extract::ApiJson;
use super::intake_routes::{MAX_REASON_CHARS, no_nul};
use crate::db::{self, Bounds};
use crate::http::operator_responses::{NoOperatorToken, ReadOnly, Unauthorized, Unavailable};
use crate::queue::kill_switch::{self, Scope, ScopeKind, ScopeSwitch, Status};
use crate::queue::workers::LiveWorker;

/// A switch as `PUT` answers it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KillSwitchView {
    /// `global`, `source` or `tenant`.
    pub scope: ScopeKind,
    /// The source name or tenant key; absent for `global`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `true`: no destructive statement of the jobs this switch covers starts; their new and queued
    /// jobs wait as `held`.
    pub engaged: bool,
    /// Why it was last changed.
    pub reason: Option<String>,
    /// Who last changed it: the operator token's name (HTTP API; `env:operator` for
    /// `DEPROV_OPERATOR_TOKEN`), `cli` / `cli:<user>` (command line).
    pub changed_by: Option<String>,
    /// The change counter's value at this switch's last change (one counter over all scopes).
    pub version: i64,
    /// When it was last changed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub changed_at: OffsetDateTime,
    /// Only on `PUT`: how many jobs the change moved (`queued` → `held` on engage, `held` → `queued`
    /// on release). A running job stops at its next batch boundary and is not counted here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs_moved: Option<u64>,
}

fn scope_kind(s: &str) -> ScopeKind {
    match s {
        "source" => ScopeKind::Source,
        "tenant" => ScopeKind::Tenant,
        _ => ScopeKind::Global,
    }
}

impl KillSwitchView {
    fn new(switch: ScopeSwitch, jobs_moved: Option<u64>) -> Self {
        Self {
            scope: scope_kind(&switch.scope),
            key: switch.key,
            engaged: switch.engaged,
            reason: switch.reason,
            changed_by: switch.changed_by,
            version: switch.version,
            changed_at: switch.changed_at,
            jobs_moved,
        }
    }
}

/// One switch with its acknowledgement by the live workers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScopeStatusView {
    /// The switch.
    #[serde(flatten)]
    pub switch: KillSwitchView,
    /// Every live worker has observed this switch's `version` (vacuously true with no live worker:
    /// then nothing deletes).
    pub acknowledged: bool,
    /// Live workers that have not yet observed it.
    pub pending_workers: Vec<String>,
}

/// A live worker (heartbeat current, not stopped).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkerView {
    /// Its name (`hostname-pid-random`).
    pub id: String,
    /// The highest switch version it acknowledged: none of its destructive statements started on an
    /// older reading is still running.
    pub observed_version: i64,
    /// When it acknowledged it.
    #[serde(with = "time::serde::rfc3339::option")]
    pub observed_at: Option<OffsetDateTime>,
    /// Its latest heartbeat.
    #[serde(with = "time::serde::rfc3339")]
    pub heartbeat_at: OffsetDateTime,
    /// Whether it holds a `LISTEN` connection (else it learns of changes by heartbeat).
    pub listening: bool,
    /// When its last destructive statement (a batch, soft delete, whole cascade, sweep) ended, on
    /// the state database's clock, as of its latest heartbeat or acknowledgement; null when it has
    /// run none since it started. Written with an acknowledgement, it is the end of the last
    /// statement before it.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_destroyed_at: Option<OffsetDateTime>,
}

impl From<LiveWorker> for WorkerView {
    fn from(w: LiveWorker) -> Self {
        Self {
            id: w.id,
            observed_version: w.observed_version,
            observed_at: w.observed_at,
            heartbeat_at: w.heartbeat_at,
            listening: w.listening,
            last_destroyed_at: w.last_destroyed_at,
        }
    }
}

/// `GET /v1/kill-switch`: the global switch at the top level (for clients that read only the
/// global switch), every switch under `scopes`, and the live workers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KillSwitchStatusView {
    /// The global switch is engaged.
    pub engaged: bool,
    /// Why the global switch was last changed.
    pub reason: Option<String>,
    /// Who last changed the global switch.
    pub changed_by: Option<String>,
    /// The global switch's version.
    pub version: i64,
    /// When the global switch last changed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub changed_at: OffsetDateTime,
    /// The latest change of any scope.
    pub latest_version: i64,
    /// Every live worker has observed `latest_version` (every switch's current setting).
    pub acknowledged: bool,
    /// Live workers that have not observed `latest_version`.
    pub pending_workers: Vec<String>,
    /// Every switch: global first, then source and tenant switches (engaged first, newest first;
    /// released ones stay listed), each with its own acknowledgement.
    pub scopes: Vec<ScopeStatusView>,
    /// Workers whose heartbeat is current.
    pub live_workers: Vec<WorkerView>,
}

impl KillSwitchStatusView {
    /// Builds the view from a [`Status`] read.
    pub fn new(status: Status) -> Self {
        let scopes: Vec<ScopeStatusView> = status
            .switches
            .iter()
            .map(|s| {
                let pending = status.pending(s.version);
                ScopeStatusView {
                    switch: KillSwitchView::new(s.clone(), None),
                    acknowledged: pending.is_empty(),
                    pending_workers: pending,
                }
            })
            .collect();
        let global = scopes[0].switch.clone();
        let pending = status.pending(status.latest_version);
        Self {
            engaged: global.engaged,
            reason: global.reason,
            changed_by: global.changed_by,
            version: global.version,
            changed_at: global.changed_at,
            latest_version: status.latest_version,
            acknowledged: pending.is_empty(),
            pending_workers: pending,
            scopes,
            live_workers: status.workers.into_iter().map(WorkerView::from).collect(),
        }
    }
}

/// The body of `PUT /v1/kill-switch`. Unknown fields are refused (422). Its OpenAPI schema is
/// written by hand ([`set_kill_switch_schema`]): `key` depends on `scope`, which derived schemas
/// cannot say.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetKillSwitch {
    /// `true` engages (stops deletion in the scope), `false` releases.
    pub engaged: bool,
    /// Why (1..=1000 characters); stored, shown by `GET` and written to the audit log.
    pub reason: String,
    /// `global` (default), `source` or `tenant`.
    #[serde(default)]
    pub scope: ScopeKind,
    /// The source name (`scope = source`; engaging needs a configured source, releasing does not, so
    /// a switch left on a source since removed can be released) or tenant key (`scope = tenant`);
    /// not with `global`. The actor is not part of the body: it is the operator token's name.
    pub key: Option<String>,
}

/// Characters Rust's `str::trim` removes (Unicode `White_Space`), as a regex class body: the schema
/// says "not blank" with exactly the characters the handler trims.
const WHITE_SPACE: &str =
    r"\u0009-\u000D\u0020\u0085\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000";

/// The schema of [`SetKillSwitch`]: one of a global switch (`scope` absent or `global`, no `key`
/// but blanks) or a scoped one (`scope` `source`/`tenant` with a non-blank `key` of at most 200
/// characters). `reason` is 1..=1000 characters, not blank. The actor is the operator token's name.
pub fn set_kill_switch_schema() -> RefOr<Schema> {
    // Not blank, and no U+0000 (PostgreSQL `text` cannot store it).
    let not_blank = format!("^[^\\u0000]*[^\\u0000{WHITE_SPACE}][^\\u0000]*$");
    let text = |max: usize, nullable: bool| {
        let ty = if nullable {
            SchemaType::Array(vec![Type::String, Type::Null])
        } else {
            SchemaType::Type(Type::String)
        };
        ObjectBuilder::new()
            .schema_type(ty)
            .max_length(Some(max))
            .pattern(Some(not_blank.clone()))
    };
    let variant = |title: &str, scope: &[&str], key: ObjectBuilder, required_key: bool| {
        let mut object = ObjectBuilder::new()
            .title(Some(title))
            .property(
                "engaged",
                ObjectBuilder::new()
                    .schema_type(Type::Boolean)
                    .description(Some("`true` engages (stops deletion in the scope), `false` releases.")),
            )
            .required("engaged")
            .property(
                "reason",
                text(MAX_REASON_CHARS, false).description(Some(
                    "Why (1..=1000 characters, not blank, no U+0000); stored, shown by `GET` and written to the audit log.",
                )),
            )
            .required("reason")
            .property(
                "scope",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(scope.iter().copied())),
            )
            .property("key", key)
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        if required_key {
            object = object.required("scope").required("key");
        }
        object
    };
    let global_key = ObjectBuilder::new()
        .schema_type(SchemaType::Array(vec![Type::String, Type::Null]))
        .pattern(Some(format!("^[{WHITE_SPACE}]*$")))
        .description(Some("None (blanks count as none)."));
    let scoped_key = text(200, false).description(Some(
        "The source name (`scope = source`) or tenant key (`scope = tenant`): 1..=200 characters, not blank, no U+0000.",
    ));
    OneOfBuilder::new()
        .description(Some(
            "The body of `PUT /v1/kill-switch`: a global switch, or one source's or tenant's. Unknown fields are refused (422).",
        ))
        .item(variant("global", &["global"], global_key, false))
        .item(variant("scoped", &["source", "tenant"], scoped_key, true))
        .into()
}

impl utoipa::PartialSchema for SetKillSwitch {
    fn schema() -> RefOr<Schema> {
        set_kill_switch_schema()
    }
}

impl ToSchema for SetKillSwitch {}

/// Every switch, with whether each change has been acknowledged by every live worker.
#[utoipa::path(
    get,
    path = "/v1/kill-switch",
    tag = "operator",
    security(("operator_token" = [])),
    responses(
        (status = 200, description = "Every switch and the live workers' acknowledgements", body = KillSwitchStatusView),
        Unauthorized,
        NoOperatorToken,
        Unavailable,
    ),
)]
pub async fn get_kill_switch(
    _: Operator,
    State(state): State<AppState>,
) -> Result<axum::Json<KillSwitchStatusView>, ApiError> {
    Ok(axum::Json(KillSwitchStatusView::new(
        read_status(&state).await?,
    )))
}

/// Reads every switch and the live workers in one transaction: what `GET /v1/kill-switch` and the
/// console's kill switch page show.
///
/// # Errors
/// 503 when the state database cannot be read.
pub async fn read_status(state: &AppState) -> Result<Status, ApiError> {
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let status = Status::read(&mut tx).await?;
    tx.commit().await?;
    Ok(status)
}

/// Checks an operator's reason: 1..=1000 characters after trimming.
///
/// # Errors
/// 422 otherwise.
pub fn operator_reason(reason: &str) -> Result<&str, ApiError> {
    let reason = reason.trim();
    no_nul("reason", reason)?;
    if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
        return Err(ApiError::Unprocessable(format!(
            "reason: must be 1..={MAX_REASON_CHARS} characters"
        )));
    }
    Ok(reason)
}

/// Whether `name` is a configured `[sources.NAME]` (`[vercel] source` names one too). Only these
/// record jobs, so a switch engaged for any other name would stop nothing.
fn is_known_source(config: &crate::config::Config, name: &str) -> bool {
    config.sources.contains_key(name)
}

/// Engages or releases a kill switch (global, one source's, or one tenant's). Intake keeps recording
/// requests while it is engaged. The change is versioned, kept in the history, written to the audit
/// log and announced to listening workers; `GET` shows when every live worker has acknowledged it.
#[utoipa::path(
    put,
    path = "/v1/kill-switch",
    tag = "operator",
    security(("operator_token" = [])),
    request_body(content = SetKillSwitch, content_type = "application/json"),
    responses(
        (status = 200, description = "The switch as changed, with the number of jobs moved", body = KillSwitchView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body not declared as application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Missing, invalid or unknown field, or engaging a source that is not configured", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        ReadOnly,
        Unavailable,
    ),
)]
pub async fn put_kill_switch(
    operator: Operator,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SetKillSwitch>,
) -> Result<axum::Json<KillSwitchView>, ApiError> {
    Ok(axum::Json(change(&state, &operator.actor, &body).await?))
}

/// Engages or releases the switch `body` names, as `actor` (the operator token's name): the one
/// implementation behind `PUT /v1/kill-switch` and the console's kill switch form. Returns the
/// switch as changed, with the number of jobs moved.
///
/// # Errors
/// 422 for an invalid reason or scope, or engaging a source that is not configured; 503 when the
/// state database cannot be written.
pub async fn change(
    state: &AppState,
    actor: &str,
    body: &SetKillSwitch,
) -> Result<KillSwitchView, ApiError> {
    let reason = operator_reason(&body.reason)?;
    // A tenant's switch is keyed like its jobs; engaging one under a key the key column cannot
    // hold is refused (`Scope::keyed`).
    let form = state.readiness.sql_check().key_form();
    let scope = Scope::new(body.scope, body.key.as_deref())
        .and_then(|scope| scope.keyed(form, body.engaged))
        .map_err(ApiError::Unprocessable)?;
    if let Scope::Source(name) = &scope
        && body.engaged
        && !is_known_source(&state.config, name)
    {
        return Err(ApiError::Unprocessable(format!(
            "key: no source {name:?} is configured (`[sources.NAME]`)"
        )));
    }
    let mut tx = db::begin(&state.pools.intake, Bounds::STATE).await?;
    let (switch, moved) =
        kill_switch::change(&mut tx, &scope, body.engaged, reason, actor, form).await?;
    tx.commit().await?;
    tracing::warn!(scope = %scope.label(), engaged = switch.engaged, version = switch.version, jobs_moved = moved, %actor, %reason, "kill switch changed");
    Ok(KillSwitchView::new(switch, Some(moved)))
}
