//! The configuration file (`DEPROV_CONFIG`, TOML).
//!
//! Every table refuses unknown keys (`deny_unknown_fields`), durations are humantime strings
//! (`"50ms"`, `"5s"`, `"2h"`), and [`Config::from_toml`] validates values after parsing; every error
//! names the offending key. A full, commented example is `deploy/example.toml`; `docs/configuration.md` documents
//! each key.

mod access;
mod broker;
mod callback;
mod console_bounds;
mod deletion;
mod edge;
mod leases_pools;
mod requests;
mod tenant;

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::sql::QualifiedName;
pub use access::OperatorTokensConfig;
pub use broker::{DEFAULT_MIN_API_VERSION, OsbConfig, minor_of as osb_minor_of};
pub use callback::{EVENT_TYPES, NotificationsConfig, SigningKey};
pub use console_bounds::{ConsoleConfig, LoginRateLimitConfig};
pub use deletion::{HardDeleteConfig, PacingConfig, UserTriggers};
pub use edge::{MetricsConfig, RateLimitConfig};
pub use leases_pools::{PoolConfig, PoolsConfig, WorkerConfig};
pub use requests::{IntakeConfig, VercelConfig};
pub use tenant::{ReconcileConfig, SoftDeleteConfig, TenantConfig};

/// Why the configuration was refused. Every message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// The path given in `DEPROV_CONFIG`.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown key, or a value of the wrong type (serde names the key and line).
    #[error("configuration: {0}")]
    Parse(#[from] toml::de::Error),
    /// A value parsed but is not allowed.
    #[error("configuration key `{key}`: {reason}")]
    Invalid {
        /// Dotted path of the key, e.g. `hard_delete.lock_timeout`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl From<crate::sources::InvalidSource> for ConfigError {
    fn from(e: crate::sources::InvalidSource) -> Self {
        Self::Invalid {
            key: e.key,
            reason: e.reason,
        }
    }
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// The whole file, validated.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Who may request deletions, by source name (`[sources.NAME]`).
    #[serde(default)]
    pub sources: BTreeMap<String, SourceConfig>,
    /// Where a tenant's data starts.
    pub tenant: TenantConfig,
    /// Step 1: statements that hide the tenant at once.
    #[serde(default)]
    pub soft_delete: SoftDeleteConfig,
    /// Step 2: the batched hard delete.
    #[serde(default)]
    pub hard_delete: HardDeleteConfig,
    /// How fast the hard delete may go, and when it pauses for the target's sake.
    #[serde(default)]
    pub pacing: PacingConfig,
    /// The worker's leases, retries and polling.
    #[serde(default)]
    pub worker: WorkerConfig,
    /// Connection pools, one per role.
    #[serde(default)]
    pub pools: PoolsConfig,
    /// Request limits at the HTTP edge.
    #[serde(default)]
    pub intake: IntakeConfig,
    /// Vercel Marketplace partner API (`DELETE /v1/installations/{id}`); absent = route answers 404.
    pub vercel: Option<VercelConfig>,
    /// How `GET /metrics` reads gauges from the databases.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Signed HTTP callbacks when jobs finish (`[notifications]`); absent = events recorded, not sent.
    pub notifications: Option<NotificationsConfig>,
    /// How servers check operator tokens (`deprov tokens`).
    #[serde(default)]
    pub operator_tokens: OperatorTokensConfig,
    /// The operator console's bounds (`[console]`).
    #[serde(default)]
    pub console: ConsoleConfig,
    /// `deprov reconcile`: how fast released jobs become claimable.
    #[serde(default)]
    pub reconcile: ReconcileConfig,
    /// Open Service Broker deprovisioning (`DELETE /v2/service_instances/{id}`); absent = the
    /// `/v2/` routes answer 404.
    pub osb: Option<OsbConfig>,
    /// How the file was loaded: whether the secrets it names were read.
    #[serde(skip, default = "unread")]
    pub secrets: Secrets,
}

fn unread() -> Secrets {
    Secrets::Skip
}

pub use crate::sources::{Secrets, SourceConfig};

impl Config {
    /// Reads and validates the file at `path`, reading the secrets it names (`serve`, `worker`).
    ///
    /// # Errors
    /// [`ConfigError`] naming the key at fault.
    pub fn load(path: &str) -> Result<Self, ConfigError> {
        Self::load_with(path, Secrets::Read)
    }

    /// Reads and validates the file at `path`; with [`Secrets::Skip`] the secrets it names are left
    /// unread (for commands that only use the databases).
    ///
    /// # Errors
    /// [`ConfigError`] naming the key at fault.
    pub fn load_with(path: &str, secrets: Secrets) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::from_toml_with(&text, secrets)
    }

    /// Parses and validates TOML text, reading the secrets it names.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key at fault.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_toml_with(text, Secrets::Read)
    }

    /// Parses and validates TOML text; reads the secrets it names only with [`Secrets::Read`].
    ///
    /// # Errors
    /// [`ConfigError`] naming the key at fault.
    pub fn from_toml_with(text: &str, secrets: Secrets) -> Result<Self, ConfigError> {
        let mut config: Config = toml::from_str(text)?;
        // The keys written in each `[sources.NAME]` (a key its scheme does not use is refused).
        let raw: toml::Table = toml::from_str(text)?;
        let tables = raw.get("sources").and_then(toml::Value::as_table);
        for (name, source) in &mut config.sources {
            let given = tables
                .and_then(|t| t.get(name))
                .and_then(toml::Value::as_table)
                .map(|t| t.keys().map(String::as_str).collect::<Vec<_>>())
                .unwrap_or_default();
            source.prepare(name, given, secrets)?;
        }
        if let Some(n) = &mut config.notifications {
            n.prepare(secrets)?;
        }
        config.validate(secrets)?;
        config.secrets = secrets;
        Ok(config)
    }

    /// The settings naming a secret (`sources.NAME.token_env`, `…secret_env`, `…secret_file`,
    /// `notifications.secret_env` / `secret_file`): what [`Secrets::Skip`] leaves unread.
    pub fn secret_settings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, s) in &self.sources {
            for (key, given) in [
                ("token_env", s.token_env.is_some()),
                ("secret_env", !s.secret_env.is_empty()),
                ("secret_file", !s.secret_file.is_empty()),
            ] {
                if given {
                    out.push(format!("sources.{name}.{key}"));
                }
            }
        }
        if let Some(n) = &self.notifications {
            for (key, given) in [
                ("secret_env", n.secret_env.is_some()),
                ("secret_file", n.secret_file.is_some()),
            ] {
                if given {
                    out.push(format!("notifications.{key}"));
                }
            }
        }
        out
    }

    /// Validates each section in turn (each next to its section's keys), then what spans
    /// sections.
    fn validate(&self, secrets: Secrets) -> Result<(), ConfigError> {
        self.tenant.validate()?;
        requests::validate_sources(&self.sources, secrets)?;
        self.soft_delete.validate()?;
        self.reconcile.validate()?;
        self.hard_delete.validate()?;
        self.pacing.validate()?;
        self.worker.validate(self.hard_delete.statement_timeout)?;
        self.pools.validate()?;
        self.intake.validate()?;
        self.metrics.validate()?;
        self.operator_tokens.validate()?;
        self.console.validate()?;
        if let Some(v) = &self.vercel {
            v.validate(&self.sources)?;
        }
        if let Some(o) = &self.osb {
            o.validate(&self.sources)?;
        }
        Ok(())
    }

    /// The root table, parsed (validated at load).
    pub fn root_table(&self) -> QualifiedName {
        QualifiedName::parse(&self.tenant.root_table).expect("validated at load")
    }

    /// `(token, source name)` pairs for authenticating intake (a token left unread, [`Secrets::Skip`],
    /// is not among them).
    pub fn source_tokens(&self) -> Vec<(String, String)> {
        self.sources
            .iter()
            .filter(|(_, s)| s.scheme == crate::sources::Scheme::Bearer)
            .filter_map(|(name, s)| {
                let token = s.resolve_token(self.secrets).expect("validated at load");
                token.map(|t| (t, name.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MINIMAL: &str = r#"
        [sources.billing]
        token = "billing-token-0123456789"
        [tenant]
        root_table = "app.accounts"
        key_column = "id"
    "#;

    #[test]
    fn minimal_file_gets_defaults() {
        let c = Config::from_toml(MINIMAL).unwrap();
        assert_eq!(c.hard_delete.batch_rows, 50);
        assert_eq!(c.hard_delete.cascade_rows, 2_000);
        assert_eq!(c.pacing.rate_limit, 0);
        assert_eq!(c.pacing.backoff, Duration::from_millis(200));
        assert_eq!(c.hard_delete.lock_timeout, Duration::from_millis(50));
        assert_eq!(c.pools.target.max_connections, 2);
        assert_eq!(c.root_table(), QualifiedName::new("app", "accounts"));
    }

    #[test]
    fn a_pool_key_left_out_keeps_its_pools_default() {
        let c = Config::from_toml(&format!(
            "{MINIMAL}\n[pools.target]\nmax_connections = 3\n[pools.intake]\nacquire_timeout = \"750ms\"\n"
        ))
        .unwrap();
        let p = &c.pools;
        assert_eq!(
            (p.target.max_connections, p.target.acquire_timeout),
            (3, Duration::from_secs(5))
        );
        assert_eq!(
            (p.intake.max_connections, p.intake.acquire_timeout),
            (8, Duration::from_millis(750))
        );
        assert_eq!(p.queue.max_connections, 4);
        let unknown = Config::from_toml(&format!("{MINIMAL}\n[pools.target]\nmax_conns = 3\n"));
        assert!(unknown.is_err(), "an unknown key is refused");
        let out_of_range =
            Config::from_toml(&format!("{MINIMAL}\n[pools.target]\nmax_connections = 0\n"));
        assert!(out_of_range.is_err(), "0 connections is refused");
    }

    #[test]
    fn reconcile_and_undo_keys_are_checked_and_named() {
        let c = Config::from_toml(MINIMAL).unwrap();
        assert_eq!(c.reconcile.release_rate, 2.0);
        assert!(c.soft_delete.undo_statements.is_empty() && c.soft_delete.orphans.is_none());
        for (extra, key) in [
            ("[reconcile]\nrelease_rate = 0.0", "reconcile.release_rate"),
            (
                "[reconcile]\nrelease_rate = 5000.0",
                "reconcile.release_rate",
            ),
            (
                "[soft_delete]\nundo_statements = [\" \"]",
                "soft_delete.undo_statements[0]",
            ),
            ("[soft_delete]\norphans = \"\"", "soft_delete.orphans"),
            (
                "[sources.shop]\ntoken = \"shop-token-0123456789ab\"\ndelete_events = [\"a\"]\nrestore_events = [\"a\"]",
                "sources.shop.restore_events",
            ),
        ] {
            let err = Config::from_toml(&format!("{MINIMAL}\n{extra}")).expect_err(extra);
            assert!(err.to_string().contains(key), "{extra}: {err}");
        }
    }

    #[test]
    fn the_deploy_example_is_valid() {
        let text = include_str!("../../../../deploy/example.toml")
            .replace(
                "token_env = \"DEPROV_BILLING_TOKEN\"",
                "token = \"billing-token-0123456789\"",
            )
            .replace(
                "token_env = \"DEPROV_VERCEL_TOKEN\"",
                "token = \"vercel-token-0123456789\"",
            );
        let c = Config::from_toml(&text).unwrap();
        assert_eq!(c.root_table(), QualifiedName::new("app", "accounts"));
        assert_eq!(c.vercel.unwrap().source, "vercel");
        assert_eq!(c.soft_delete.statements.len(), 1);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = Config::from_toml(&format!("{MINIMAL}\n[hard_delete]\nbatch_rowz = 5\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("batch_rowz"), "{err}");
    }

    #[test]
    fn invalid_values_are_named() {
        let cases = [
            (
                "[hard_delete]\nlock_timeout = \"10s\"\nstatement_timeout = \"5s\"",
                "hard_delete.lock_timeout",
            ),
            ("[hard_delete]\nbatch_rows = 0", "hard_delete.batch_rows"),
            // Named as itself, not as the max_batch_duration it must exceed.
            (
                "[hard_delete]\nstatement_timeout = \"0s\"",
                "hard_delete.statement_timeout",
            ),
            (
                "[hard_delete]\nmax_simulated_rows = 0",
                "hard_delete.max_simulated_rows",
            ),
            ("[pacing]\nbackoff = \"0s\"", "pacing.backoff"),
            ("[pacing]\nduty_cycle = 0", "pacing.duty_cycle"),
            ("[pacing]\nduty_cycle = 1.5", "pacing.duty_cycle"),
            ("[pacing]\nduty_cycle = nan", "pacing.duty_cycle"),
            (
                "[pacing]\nbackoff = \"1s\"\nbackoff_max = \"100ms\"",
                "pacing.backoff_max",
            ),
            ("[pacing]\ncheck_interval = \"0s\"", "pacing.check_interval"),
            ("[hard_delete]\nlock_timeout = \"fast\"", "lock_timeout"),
            (
                "[pools.target]\nmax_connections = 0\nacquire_timeout = \"1s\"",
                "pools.target.max_connections",
            ),
            ("[vercel]\nsource = \"nobody\"", "vercel.source"),
            (
                "[intake.rate_limit]\nper_second = -1.0",
                "intake.rate_limit.per_second",
            ),
            ("[intake.rate_limit]\nburst = 0", "intake.rate_limit.burst"),
            (
                "[console.login_rate_limit]\nper_second = 0.0001",
                "console.login_rate_limit.per_second",
            ),
            (
                "[console.login_rate_limit]\nburst = 0",
                "console.login_rate_limit.burst",
            ),
            ("[metrics]\nread_timeout = \"0s\"", "metrics.read_timeout"),
        ];
        for (extra, key) in cases {
            let err = Config::from_toml(&format!("{MINIMAL}\n{extra}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{extra:?} -> {err}");
        }
        let bad_root = MINIMAL.replace("app.accounts", "accounts");
        assert!(
            Config::from_toml(&bad_root)
                .unwrap_err()
                .to_string()
                .contains("tenant.root_table")
        );
        let short = MINIMAL.replace("billing-token-0123456789", "short");
        assert!(
            Config::from_toml(&short)
                .unwrap_err()
                .to_string()
                .contains("sources.billing.token")
        );
    }
}
