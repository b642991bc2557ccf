//! Kill switches: global (`deprov.kill_switch`, one row), per source and per tenant
//! (`deprov.kill_switch_scopes`), every change versioned in `deprov.kill_switch_history`.
//!
//! Engaged: intake keeps recording requests (a new job of a blocked subject starts `held`), blocked
//! queued jobs become `held`, no blocked job is claimed, and a running blocked job stops at its next
//! batch boundary and becomes `held`. A job is blocked by the global switch, by the switch of its
//! tenant (`jobs.tenant_id`), or by the switch of a source any of its requests came from
//! (`deprov.job_blocked_by`, SQL). Released: held jobs that nothing else blocks become `queued` and
//! resume from their checkpoints; the claim also takes `held` jobs nothing blocks, so a job handed back
//! `held` while its switch was being released is not stranded.
//!
//! ## Versions
//! One counter over all scopes (`deprov.kill_switch.latest_version`). Every change increments it
//! under the row's lock, so changes are serialized and a worker that has read version N has read
//! every scope as of change N; the changed row stores N as its `version`. With only global changes,
//! the global row's `version` counts 1, 2, 3 …. Each change sends
//! `NOTIFY deprov_kill_switch, '<N>'` (delivered at commit) for workers listening
//! ([`crate::worker`]); workers also read it at every batch.

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgExecutor};
use time::OffsetDateTime;
use uuid::Uuid;

use super::workers::LiveWorker;
use crate::ids::KeyForm;

/// The channel of `NOTIFY` on every change; the payload is the new version.
pub const CHANNEL: &str = "deprov_kill_switch";

/// What a switch covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every job.
    Global,
    /// Jobs any of whose requests came from this source (a `[sources.NAME]`).
    Source(String),
    /// Jobs of this tenant key.
    Tenant(String),
}

/// The kind of a [`Scope`], as stored and as given in the API and CLI.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum ScopeKind {
    /// Every job.
    #[default]
    Global,
    /// One source's jobs.
    Source,
    /// One tenant's jobs.
    Tenant,
}

impl Scope {
    /// Builds a scope from its kind and key: `global` takes no key, `source` and `tenant` need one
    /// (1..=200 characters after trimming, without U+0000).
    ///
    /// # Errors
    /// What is wrong, for the caller to show (422 in the API).
    pub fn new(kind: ScopeKind, key: Option<&str>) -> Result<Self, String> {
        let key = key.map(str::trim).filter(|k| !k.is_empty());
        match (kind, key) {
            (ScopeKind::Global, None) => Ok(Self::Global),
            (ScopeKind::Global, Some(_)) => Err("key: not allowed with scope global".into()),
            (_, None) => Err("key: required with scope source or tenant".into()),
            (_, Some(k)) if k.chars().count() > 200 => Err("key: at most 200 characters".into()),
            // PostgreSQL `text` cannot store U+0000.
            (_, Some(k)) if k.contains('\0') => Err("key: must not contain U+0000".into()),
            (ScopeKind::Source, Some(k)) => Ok(Self::Source(k.to_owned())),
            (ScopeKind::Tenant, Some(k)) => Ok(Self::Tenant(k.to_owned())),
        }
    }

    /// `global`, `source` or `tenant`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Global => "global",
            Self::Source(_) => "source",
            Self::Tenant(_) => "tenant",
        }
    }

    /// The source name or tenant key; `None` for global.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Global => None,
            Self::Source(k) | Self::Tenant(k) => Some(k),
        }
    }

    /// `global`, `source:<name>` or `tenant:<key>` (the form `deprov.job_blocked_by` returns and the
    /// audit log's `target`).
    pub fn label(&self) -> String {
        match self.key() {
            None => self.kind().to_owned(),
            Some(k) => format!("{}:{k}", self.kind()),
        }
    }

    /// This scope keyed as deprov keys jobs, for a change that engages it (`engage`) or releases
    /// it: a tenant's key as `form` (how `[tenant] key_column` reads keys, once known from the
    /// target's catalog) prints it (`"07"` is tenant `"7"` of an integer column), else as given.
    /// Other scopes are returned unchanged. The check behind `PUT /v1/kill-switch`, the console's
    /// form and `deprov kill-switch on|off`.
    ///
    /// # Errors
    /// Engaging a tenant's switch under a key `form` cannot read (a sender's ID where a lookup maps
    /// it to the tenant): such a switch would block nothing while looking in effect. Releasing takes
    /// any key, so that such a switch can be removed.
    pub fn keyed(self, form: Option<KeyForm>, engage: bool) -> Result<Self, String> {
        let (Self::Tenant(key), Some(form)) = (&self, form) else {
            return Ok(self);
        };
        if engage
            && let Err(why) = crate::ids::TenantId::parse(key).and_then(|k| form.canonical(&k))
        {
            return Err(format!(
                "key: {why}; a tenant's switch takes the tenant's key as the root table holds it, \
                 not a sender's ID"
            ));
        }
        Ok(Self::Tenant(form.canonical_or_as_sent(key)))
    }
}

/// The global switch's row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct KillSwitch {
    /// Whether destruction is stopped.
    pub engaged: bool,
    /// Why it was last changed.
    pub reason: Option<String>,
    /// Who last changed it.
    pub changed_by: Option<String>,
    /// The change counter's value at its last change (see the module docs).
    pub version: i64,
    /// When it was last changed.
    pub changed_at: OffsetDateTime,
}

/// One switch of any scope.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ScopeSwitch {
    /// `global`, `source` or `tenant`.
    pub scope: String,
    /// The source name or tenant key; `None` for global.
    pub key: Option<String>,
    /// Whether it stops destruction now.
    pub engaged: bool,
    /// Why it was last changed.
    pub reason: Option<String>,
    /// Who last changed it.
    pub changed_by: Option<String>,
    /// The change counter's value at its last change.
    pub version: i64,
    /// When it was last changed.
    pub changed_at: OffsetDateTime,
}

/// Reads the global switch.
///
/// # Errors
/// Database errors.
pub async fn get(db: impl PgExecutor<'_>) -> Result<KillSwitch, sqlx::Error> {
    crate::db::query_as(
        "SELECT engaged, reason, changed_by, version, changed_at FROM deprov.kill_switch",
    )
    .fetch_one(db)
    .await
}

/// Whether the global switch is engaged.
///
/// # Errors
/// Database errors.
pub async fn is_engaged(db: impl PgExecutor<'_>) -> Result<bool, sqlx::Error> {
    crate::db::query_scalar("SELECT engaged FROM deprov.kill_switch")
        .fetch_one(db)
        .await
}

/// The latest change's version (0 before any change).
///
/// # Errors
/// Database errors.
pub async fn latest_version(db: impl PgExecutor<'_>) -> Result<i64, sqlx::Error> {
    crate::db::query_scalar("SELECT latest_version FROM deprov.kill_switch")
        .fetch_one(db)
        .await
}

/// What the worker reads before every destructive statement ([`check_job`]), in one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct JobCheck {
    /// The latest kill-switch version.
    pub version: i64,
    /// The engaged switch that blocks the job (`global`, `source:…`, `tenant:…`), matched as stored.
    pub blocked_by: Option<String>,
    /// Whether an operator asked to cancel the job.
    pub cancel: bool,
    /// The keys of every engaged tenant switch, as stored (possibly as typed, see
    /// [`Scope::keyed`]), for the worker to match in the key column's form
    /// ([`crate::ids::KeyForm`]).
    pub tenant_keys: Vec<String>,
}

/// What the worker reads before every destructive statement, in one statement (one snapshot): the
/// latest version, which engaged switch blocks job `id`, whether an operator asked to cancel it,
/// and the engaged tenant switches' keys.
///
/// # Errors
/// Database errors.
pub async fn check_job(db: impl PgExecutor<'_>, id: Uuid) -> Result<JobCheck, sqlx::Error> {
    crate::db::query_as(
        "SELECT (SELECT latest_version FROM deprov.kill_switch) AS version, \
           deprov.job_blocked_by($1) AS blocked_by, \
           coalesce((SELECT cancel_requested_at IS NOT NULL FROM deprov.jobs WHERE id = $1), false) AS cancel, \
           ARRAY(SELECT key FROM deprov.kill_switch_scopes WHERE scope = 'tenant' AND engaged) AS tenant_keys",
    )
    .bind(id)
    .fetch_one(db)
    .await
}

/// The keys of the engaged tenant switches, as stored.
///
/// # Errors
/// Database errors.
pub async fn engaged_tenant_keys(db: impl PgExecutor<'_>) -> Result<Vec<String>, sqlx::Error> {
    crate::db::query_scalar(
        "SELECT key FROM deprov.kill_switch_scopes WHERE scope = 'tenant' AND engaged ORDER BY key",
    )
    .fetch_all(db)
    .await
}

/// Every switch: the global one first, then the scoped ones (engaged first, newest change first),
/// at most 1000 scoped rows.
///
/// # Errors
/// Database errors.
pub async fn all(db: impl PgExecutor<'_>) -> Result<Vec<ScopeSwitch>, sqlx::Error> {
    crate::db::query_as(
        "(SELECT 'global' AS scope, NULL::text AS key, engaged, reason, changed_by, version, changed_at, 0 AS ord \
           FROM deprov.kill_switch) \
         UNION ALL \
         (SELECT scope, key, engaged, reason, changed_by, version, changed_at, 1 \
            FROM deprov.kill_switch_scopes ORDER BY engaged DESC, version DESC LIMIT 1000) \
         ORDER BY ord, engaged DESC, version DESC",
    )
    .fetch_all(db)
    .await
}

/// Engages or releases the global switch (see [`set_scope`]); returns the global row.
///
/// # Errors
/// Database errors.
pub async fn set(
    conn: &mut PgConnection,
    engaged: bool,
    reason: &str,
    actor: &str,
) -> Result<(KillSwitch, u64), sqlx::Error> {
    let (_, moved) = set_scope(conn, &Scope::Global, engaged, reason, actor).await?;
    Ok((get(&mut *conn).await?, moved))
}

/// An operator's change of the switch of `scope` ([`Scope::keyed`] by `form`): [`set_scope`], and,
/// releasing a tenant's switch while `form` is known, also releasing that tenant's switches engaged
/// under other spellings of its key (a key stored as typed; the worker holds the tenant by any of
/// them). Run it inside the caller's transaction. Returns the switch as changed and how many jobs
/// moved in all.
///
/// # Errors
/// Database errors.
pub async fn change(
    conn: &mut PgConnection,
    scope: &Scope,
    engaged: bool,
    reason: &str,
    actor: &str,
    form: Option<KeyForm>,
) -> Result<(ScopeSwitch, u64), sqlx::Error> {
    let mut also = 0;
    if let (Scope::Tenant(key), Some(form), false) = (scope, form, engaged) {
        for other in engaged_tenant_keys(&mut *conn).await? {
            if other != *key && form.canonical_or_as_sent(&other) == *key {
                let (_, moved) =
                    set_scope(conn, &Scope::Tenant(other), false, reason, actor).await?;
                also += moved;
            }
        }
    }
    let (switch, moved) = set_scope(conn, scope, engaged, reason, actor).await?;
    Ok((switch, moved + also))
}

/// Engages or releases the switch of `scope` and moves waiting jobs accordingly (`queued` → `held`
/// for the jobs it blocks on engage; `held` → `queued` for the held jobs nothing blocks any more on
/// release), records the change in `deprov.kill_switch_history` and the audit log (action
/// `kill_switch.engage` / `kill_switch.release`), and notifies listening workers at commit. Run it
/// inside the caller's transaction so all of it happens together. Returns the switch as changed and
/// how many jobs moved.
///
/// # Errors
/// Database errors.
pub async fn set_scope(
    conn: &mut PgConnection,
    scope: &Scope,
    engaged: bool,
    reason: &str,
    actor: &str,
) -> Result<(ScopeSwitch, u64), sqlx::Error> {
    // Serializes every change and allocates its version.
    let version: i64 = crate::db::query_scalar(
        "UPDATE deprov.kill_switch SET latest_version = latest_version + 1 RETURNING latest_version",
    )
    .fetch_one(&mut *conn)
    .await?;
    let switch: ScopeSwitch = match scope {
        Scope::Global => crate::db::query_as(
            "UPDATE deprov.kill_switch SET engaged = $1, reason = $2, changed_by = $3, version = $4, \
             changed_at = now() \
             RETURNING 'global' AS scope, NULL::text AS key, engaged, reason, changed_by, version, changed_at",
        ),
        Scope::Source(_) | Scope::Tenant(_) => crate::db::query_as(
            "INSERT INTO deprov.kill_switch_scopes (scope, key, engaged, reason, changed_by, version) \
             VALUES ($5, $6, $1, $2, $3, $4) \
             ON CONFLICT (scope, key) DO UPDATE SET engaged = $1, reason = $2, changed_by = $3, \
               version = $4, changed_at = now() \
             RETURNING scope, key, engaged, reason, changed_by, version, changed_at",
        ),
    }
    .bind(engaged)
    .bind(reason)
    .bind(actor)
    .bind(version)
    .bind(scope.kind())
    .bind(scope.key())
    .fetch_one(&mut *conn)
    .await?;
    let moved = match (engaged, scope) {
        (true, Scope::Global) => crate::db::query(
            "UPDATE deprov.jobs SET state = 'held', updated_at = now() WHERE state = 'queued'",
        ),
        (true, Scope::Tenant(key)) => crate::db::query(
            "UPDATE deprov.jobs SET state = 'held', updated_at = now() \
             WHERE state = 'queued' AND tenant_id = $1",
        )
        .bind(key),
        (true, Scope::Source(key)) => crate::db::query(
            "UPDATE deprov.jobs SET state = 'held', updated_at = now() WHERE state = 'queued' \
             AND id IN (SELECT job_id FROM deprov.deletion_requests WHERE source = $1)",
        )
        .bind(key),
        (false, _) => crate::db::query(
            "UPDATE deprov.jobs SET state = 'queued', run_after = now(), updated_at = now() \
             WHERE state = 'held' AND deprov.job_blocked_by(id) IS NULL",
        ),
    }
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if !engaged && moved > 0 {
        super::jobs::wake_on_commit(&mut *conn).await?;
    }
    crate::db::query(
        "INSERT INTO deprov.kill_switch_history (version, scope, key, engaged, reason, actor, jobs_moved) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(version)
    .bind(scope.kind())
    .bind(scope.key())
    .bind(engaged)
    .bind(reason)
    .bind(actor)
    .bind(i64::try_from(moved).unwrap_or(i64::MAX))
    .execute(&mut *conn)
    .await?;
    let action = if engaged {
        "kill_switch.engage"
    } else {
        "kill_switch.release"
    };
    let details = serde_json::json!({"version": version, "jobs_moved": moved});
    super::audit::record(
        &mut *conn,
        actor,
        action,
        Some(&scope.label()),
        reason,
        &details,
    )
    .await?;
    crate::db::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(version.to_string())
        .execute(&mut *conn)
        .await?;
    Ok((switch, moved))
}

/// Every switch with the live workers, read in one transaction: what `GET /v1/kill-switch` and
/// `deprov kill-switch status` show.
#[derive(Debug, Clone)]
pub struct Status {
    /// The latest change's version.
    pub latest_version: i64,
    /// The global switch first, then the scoped ones (see [`all`]).
    pub switches: Vec<ScopeSwitch>,
    /// Workers whose heartbeat is current (see [`super::workers::live`]).
    pub workers: Vec<LiveWorker>,
}

impl Status {
    /// Reads it.
    ///
    /// # Errors
    /// Database errors.
    pub async fn read(conn: &mut PgConnection) -> Result<Self, sqlx::Error> {
        Ok(Self {
            latest_version: latest_version(&mut *conn).await?,
            switches: all(&mut *conn).await?,
            workers: super::workers::live(&mut *conn).await?,
        })
    }

    /// The live workers that have not yet observed `version` (sorted by ID); empty = acknowledged by
    /// every live worker (also when no worker is live: then nothing destroys).
    pub fn pending(&self, version: i64) -> Vec<String> {
        self.workers
            .iter()
            .filter(|w| w.observed_version < version)
            .map(|w| w.id.clone())
            .collect()
    }

    /// The switch of `scope`, if it was ever set (the global one always exists).
    pub fn switch(&self, scope: &Scope) -> Option<&ScopeSwitch> {
        self.switches
            .iter()
            .find(|s| s.scope == scope.kind() && s.key.as_deref() == scope.key())
    }
}
