//! `[tenant]`, `[soft_delete]` and `[reconcile]`: which rows are a tenant's, how it is hidden at
//! once, and how fast a reconcile releases jobs.

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::sql::QualifiedName;

/// `[tenant]`: the root of the foreign-key graph.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Schema-qualified root table, e.g. `app.accounts` (see [`QualifiedName::parse`]).
    pub root_table: String,
    /// The root's key column; `tenant_id` strings are cast to its type.
    pub key_column: String,
}

/// `[soft_delete]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoftDeleteConfig {
    /// Run in one transaction on the target, `$1` = the tenant key (bound with the type PostgreSQL
    /// infers for `$1`: text, an integer type or uuid). Must be idempotent: a retried job runs them again.
    #[serde(default)]
    pub statements: Vec<String>,
    /// Undo of the soft delete (`deprov jobs undo`, a reinstall during the grace period): run in
    /// one transaction on the target, `$1` = the tenant key, like `statements`. Must be idempotent.
    /// Empty = a soft delete cannot be undone (a reinstall then only cancels the pending job).
    #[serde(default)]
    pub undo_statements: Vec<String>,
    /// A statement without parameters returning, in its first column (text, an integer or uuid),
    /// the key of every tenant currently soft-deleted on the target. `deprov reconcile` reports
    /// such tenants without a job as orphans; without it orphans are "not configured".
    pub orphans: Option<String>,
}

impl TenantConfig {
    /// # Errors
    /// [`ConfigError::Invalid`]: `root_table` is not a schema-qualified name, `key_column` empty.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        QualifiedName::parse(&self.root_table).map_err(|r| invalid("tenant.root_table", r))?;
        if self.key_column.is_empty() {
            return Err(invalid("tenant.key_column", "must not be empty"));
        }
        Ok(())
    }
}

impl SoftDeleteConfig {
    /// # Errors
    /// [`ConfigError::Invalid`]: an empty statement (naming its index) or an empty `orphans`.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (key, list) in [
            ("statements", &self.statements),
            ("undo_statements", &self.undo_statements),
        ] {
            if let Some(i) = list.iter().position(|s| s.trim().is_empty()) {
                return Err(invalid(
                    format!("soft_delete.{key}[{i}]"),
                    "must not be empty",
                ));
            }
        }
        if self.orphans.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(invalid("soft_delete.orphans", "must not be empty"));
        }
        Ok(())
    }
}

/// `[reconcile]`: see [`crate::queue::reconcile`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileConfig {
    /// Jobs per second a reconcile releases (resumed, retried, created for orphans) when no
    /// `--rate` is given: the n-th released job becomes claimable n / rate seconds after the
    /// reconcile (default 2; 0.001..=1000).
    pub release_rate: f64,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        Self { release_rate: 2.0 }
    }
}

impl ReconcileConfig {
    /// # Errors
    /// [`ConfigError::Invalid`]: `release_rate` outside 0.001..=1000.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(0.001..=1000.0).contains(&self.release_rate) {
            return Err(invalid(
                "reconcile.release_rate",
                "must be between 0.001 and 1000 (jobs per second)",
            ));
        }
        Ok(())
    }
}
