//! `deprov config check`: the configuration file checked as `deprov serve` checks it at start — parsed
//! and validated, `[tenant] root_table` found in the target's catalog, and every configured statement
//! accepted by the target database ([`crate::sqlcheck`]) — without starting anything, and without
//! the senders' secrets, which only `serve` and `worker` read.

use std::path::PathBuf;

use crate::config::{Config, Secrets};
use crate::db::{self, PoolRole, PoolerMode};

/// `deprov config`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: ConfigAction,
}

/// `deprov config check`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConfigAction {
    /// Check the configuration file against the target database as `deprov serve` does at start:
    /// the file parses and validates, `[tenant] root_table` exists, and the target accepts every
    /// configured statement (`[soft_delete] statements`, `undo_statements`, `orphans`, each
    /// `tenant_lookup`), parsed and analysed by PostgreSQL without being run. The secrets the file
    /// names (`token_env`, `secret_env`, `secret_file`) are not read: each is listed as such.
    ///
    /// Exit status: 0 all good; 1 the file is invalid, the target refuses something (each refused
    /// setting is named with the server's error), or the target cannot be reached.
    Check(CheckArgs),
}

/// The configuration file and the target database (`deprov config check`, `deprov plan`), read from
/// the same flags and environment variables as `serve` and `worker` read them.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The TOML configuration file.
    #[arg(long, env = "DEPROV_CONFIG")]
    pub config: PathBuf,
    /// The application database (default: `DEPROV_DATABASE_URL`).
    #[arg(long, env = "DEPROV_TARGET_URL", hide_env_values = true)]
    pub target_url: Option<String>,
    /// deprov's state database: the target when no target URL is given (else nothing is read from
    /// it).
    #[arg(long, env = "DEPROV_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// `transaction` when the URL points at a transaction pooler (see `deprov serve --help`).
    #[arg(long, env = "DEPROV_POOLER_MODE", value_enum, default_value_t = PoolerMode::Session)]
    pub pooler_mode: PoolerMode,
}

impl CheckArgs {
    /// The target database's URL as `serve` and `worker` pick it: `DEPROV_TARGET_URL`
    /// (`--target-url`), else `DEPROV_DATABASE_URL` (`--database-url`).
    ///
    /// # Errors
    /// Neither is given.
    pub fn target(&self) -> anyhow::Result<&str> {
        self.target_url
            .as_deref()
            .or(self.database_url.as_deref())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "give the target database: DEPROV_TARGET_URL (or DEPROV_DATABASE_URL)"
                )
            })
    }
}

/// Runs `deprov config`.
///
/// # Errors
/// An invalid file, a refused statement or a missing root table (each named), an unreachable target.
pub async fn run(args: ConfigArgs) -> anyhow::Result<()> {
    let ConfigAction::Check(args) = args.action;
    // As `plan`: no sender's secret is needed to check the file against the target; `serve` and
    // `worker` read them at start.
    let config = Config::load_with(&args.config.to_string_lossy(), Secrets::Skip)?;
    println!(
        "{}: the file is valid; checking it against the target",
        args.config.display()
    );
    for setting in config.secret_settings() {
        println!("{setting}: not read here (serve and worker read it at start)");
    }
    let url = args.target()?;
    let options = db::connect_options(url)?;
    args.pooler_mode
        .check_url(&options)
        .map_err(|reason| anyhow::anyhow!("the target URL: {reason}"))?;
    args.pooler_mode.apply();
    let pool = db::pool(&options, PoolRole::Cli, &config.pools.target);
    let result = check(&pool, &config).await;
    // Closed before exiting (see `plan_command`).
    pool.close().await;
    result
}

async fn check(pool: &sqlx::PgPool, config: &Config) -> anyhow::Result<()> {
    let root = config.root_table();
    match crate::engine::load_plan(pool, &root, &config.tenant.key_column).await {
        Ok(_) => println!(
            "tenant.root_table {} (key column {}): found on the target",
            config.tenant.root_table, config.tenant.key_column
        ),
        Err(crate::engine::EngineError::Plan(e)) => {
            let setting = match e {
                crate::engine::PlanError::NoRoot(_) => "tenant.root_table",
                crate::engine::PlanError::NoKeyColumn { .. } => "tenant.key_column",
            };
            println!("{setting}: REFUSED: {e}");
            anyhow::bail!(
                "{setting} does not fit the target database: {e}; the configured statements, \
                 which read the tenant's tables, were not checked"
            )
        }
        Err(crate::engine::EngineError::Db(e)) => anyhow::bail!(
            "cannot reach the target database to check the configuration: {}",
            db::errors::unreachable_text(pool, &e).await
        ),
        Err(e) => anyhow::bail!("cannot reach the target database to check the configuration: {e}"),
    }
    let findings = match crate::sqlcheck::check(pool, config).await {
        Ok(findings) => findings,
        Err(e) => anyhow::bail!(
            "cannot check the configured statements on the target database: {}",
            db::errors::unreachable_text(pool, &e).await
        ),
    };
    for c in crate::sqlcheck::configured(config) {
        match findings.iter().find(|f| f.setting == c.setting) {
            Some(f) => println!("{}: REFUSED: {}", c.setting, f.refusal),
            None => println!("{}: accepted", c.setting),
        }
    }
    if findings.is_empty() {
        Ok(())
    } else {
        Err(crate::sqlcheck::Refused(findings).into())
    }
}
