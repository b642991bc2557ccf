//! The `deprov` command line: parses nothing itself beyond clap, dispatches to the library.
//!
//! Subcommands: `serve` (HTTP + worker), `worker` (worker only), `migrate`, `kill-switch on|off|status`,
//! `jobs list|show|retry|cancel|undo`, `audit list`, `reconcile`, `tokens create|list|revoke`,
//! `notifications list|redrive`,
//! `plan --tenant ID`, `config check`. (The demo and the benchmarks are the `deprov-lab` binary of the
//! workspace's root package.) Every flag is also an environment variable (`DEPROV_*`).

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::app::{self, Application, Settings};
use crate::config::PoolConfig;
use crate::db::{self, PoolRole};

mod acting;
mod config_check;
mod job_commands;
mod kill_switch_commands;
mod notifications;
mod reconcile_commands;
mod token_commands;

pub use acting::Acting;
pub use config_check::{CheckArgs, ConfigAction, ConfigArgs};
pub use job_commands::{AuditAction, AuditArgs, JobsAction, JobsArgs, jobs_table};
pub use kill_switch_commands::{ChangeArgs, KillSwitchAction, KillSwitchArgs, describe};
pub use notifications::{NotificationsAction, NotificationsArgs, events_table};
pub use reconcile_commands::{ReconcileArgs, TargetDb, parse_rate};
pub use token_commands::{
    TokenActing, TokensAction, TokensArgs, execute as tokens_execute, tokens_table,
};

/// `deprov`: deletes a SaaS tenant's data safely.
#[derive(Debug, Parser)]
#[command(name = "deprov", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Log line format on stderr: `text` or `json` (JSON lines).
    #[arg(long, global = true, env = "DEPROV_LOG_FORMAT", value_enum, ignore_case = true, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `--log-format` / `DEPROV_LOG_FORMAT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    Text,
    /// One JSON object per line.
    Json,
}

/// For the commands that print a listing or report and end (everything but `serve` and `worker`,
/// which run servers that must be stopped), a closed stdout (`deprov jobs list | head`) ends the process quietly, as for other
/// Unix tools, instead of a panic in `println!`: `SIGPIPE` gets its default action back (Rust
/// ignores it at start). Long-running commands keep ignoring it — a peer that goes away must not end
/// a server — and see `EPIPE` as an error instead.
pub fn init_signals(cli: &Cli) {
    if !matches!(cli.command, Command::Serve(_) | Command::Worker(_)) {
        default_sigpipe();
    }
}

/// Gives `SIGPIPE` its default action back ([`init_signals`]).
#[allow(unsafe_code)] // restores SIGPIPE's default disposition; see the SAFETY note inside
fn default_sigpipe() {
    // SAFETY: called once at start, before any thread that could race on the signal
    // disposition does anything with SIGPIPE; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API and run the worker (unless --no-worker).
    Serve(Settings),
    /// Run the worker only (no HTTP).
    Worker(Settings),
    /// Apply deprov's migrations to the state database.
    Migrate(StateDb),
    /// Engage, release or show kill switches (global, per source, per tenant) and which workers
    /// acknowledged them (talks to the state database directly).
    KillSwitch(KillSwitchArgs),
    /// List, show, retry or cancel jobs (talks to the state database directly).
    Jobs(JobsArgs),
    /// The audit log of operator actions.
    Audit(AuditArgs),
    /// Job completion and failure events sent to `[notifications] url`: list them (e.g. the dead
    /// ones) or send dead ones again (talks to the state database directly).
    Notifications(NotificationsArgs),
    /// Create, list or revoke operator tokens (roles `read-only`, `operator`) for the HTTP API.
    Tokens(TokensArgs),
    /// What queued up during an incident (held, failed, in grace, collapsed, orphans), and its
    /// paced release: resume, retry, cancel, create orphan jobs. Dry run unless --apply.
    Reconcile(ReconcileArgs),
    /// Print the deletion plan of a tenant without deleting anything.
    ///
    /// Exit status: 0 the plan was printed; 1 deprov would refuse the tenant (the cascading DELETE
    /// would fail), or another failure; 3 no such tenant, or a key that is not a valid value of the
    /// key column.
    Plan {
        /// The tenant key.
        #[arg(long)]
        tenant: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Also run the trial cascade the worker runs before its soft delete: the tenant's
        /// cascading DELETE in a transaction that is rolled back, bounded like a batch. Not
        /// read-only: it takes row locks for at most ⅘ of `max_batch_duration` and fires delete
        /// triggers. Exit status 1 when PostgreSQL says the cascade fails or deletes nothing.
        #[arg(long)]
        trial: bool,
        /// Configuration and the target database: `DEPROV_TARGET_URL`, else `DEPROV_DATABASE_URL`,
        /// as for `serve` (only the target is read).
        #[command(flatten)]
        target: CheckArgs,
    },
    /// Check the configuration file against the target database as `serve` does at start (the
    /// configured SQL parsed and analysed by PostgreSQL, nothing run).
    Config(ConfigArgs),
}

/// Just the state database.
#[derive(Debug, Clone, clap::Args)]
pub struct StateDb {
    /// deprov's own state database, a `postgres://` URL.
    #[arg(long, env = "DEPROV_DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// `transaction` when the URL points at a transaction pooler (see `deprov serve --help`);
    /// `migrate` then refuses to run.
    #[arg(long, env = "DEPROV_POOLER_MODE", value_enum, default_value_t = db::PoolerMode::Session)]
    pub pooler_mode: db::PoolerMode,
}

/// Exit status of `deprov plan` when the tenant does not exist or the key does not fit the key
/// column (distinct from 1, "deprov would refuse", and from clap's 2 for a usage error).
pub const EXIT_NO_SUCH_TENANT: u8 = 3;

/// An error that ends the process with a given exit status (other errors end it with 1).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ExitWith {
    /// The exit status.
    pub code: u8,
    /// What to print.
    pub message: String,
}

/// Ends the process for `result`: 0, or the error printed to stderr ([`error_report`]; a failed
/// write is ignored: no panic on a closed stderr) and its exit status ([`ExitWith`], else 1).
pub fn exit(result: anyhow::Result<()>) -> std::process::ExitCode {
    use std::io::Write as _;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{}", error_report(&e));
            let code = e.downcast_ref::<ExitWith>().map_or(1, |x| x.code);
            std::process::ExitCode::from(code)
        }
    }
}

/// What [`exit`] prints for `e`: `Error: ` and its message (a database error as the server's
/// message, detail, hint and SQLSTATE: [`db::errors::cause_text`]), then, as anyhow's `{:?}` does,
/// `Caused by:` and each cause in its chain, except a cause whose text the lines above already
/// hold. deprov's errors mostly write their cause into their own message (`configuration: TOML
/// parse error at line 3 …`), so anyhow's report showed such a cause, a TOML error with its
/// excerpt of the file for one, twice.
pub fn error_report(e: &anyhow::Error) -> String {
    // Down to the first error the server sent: sqlx's causes under it repeat it in other words.
    let mut chain = Vec::new();
    for cause in e.chain() {
        chain.push(cause);
        if db::errors::from_server(cause) {
            break;
        }
    }
    let first = chain
        .first()
        .map(|c| db::errors::cause_text(*c))
        .unwrap_or_default();
    let mut report = format!("Error: {first}");
    let mut seen = report.clone();
    let mut heading = false;
    for cause in chain.into_iter().skip(1) {
        let text = db::errors::cause_text(cause);
        if seen.contains(&text) {
            continue;
        }
        if !heading {
            report.push_str("\n\nCaused by:");
            heading = true;
        }
        report.push_str("\n    ");
        report.push_str(&text.replace('\n', "\n    "));
        seen.push_str(&text);
    }
    report
}

/// `deprov plan`: reads the target's catalog and prints the plan, row counts and blockers. Read-only,
/// except with `--trial` (the trial cascade, rolled back).
/// Fails (exit status 1) when deprov would refuse the tenant: the cascading DELETE would fail;
/// [`EXIT_NO_SUCH_TENANT`] (3) when no root row has the key, or the key does not fit the key column.
async fn plan_command(
    args: &CheckArgs,
    tenant: &str,
    json: bool,
    trial: bool,
) -> anyhow::Result<()> {
    args.pooler_mode.apply();
    let config = crate::config::Config::load_with(
        &args.config.to_string_lossy(),
        crate::config::Secrets::Skip,
    )?;
    let target = db::pool(
        &db::connect_options(args.target()?)?,
        PoolRole::Cli,
        &config.pools.target,
    );
    let mut report = crate::engine::report::PlanReport::build(&target, &config, tenant).await;
    if let (Ok(r), true) = (&mut report, trial)
        && r.root_rows > 0
        && let Err(e) = r.run_trial(&target, &config).await
    {
        report = Err(e);
    }
    // The pool retried a refused connection until its acquire timeout: one attempt of its own
    // finds the cause (down, a wrong port, a refused password, no such database).
    if let Err(crate::engine::EngineError::Db(e @ sqlx::Error::PoolTimedOut)) = &report {
        let text = db::errors::unreachable_text(&target, e).await;
        target.close().await;
        anyhow::bail!("cannot reach the target database: {text}");
    }
    // Closed before exiting: a connection dropped with sqlx's release ping in flight makes PgBouncer
    // close its server connection ("client disconnect while server was not ready").
    target.close().await;
    let key_column = &config.tenant.key_column;
    let root = &config.tenant.root_table;
    let report = match report {
        Err(crate::engine::EngineError::Db(sqlx::Error::Database(e)))
            if e.code().is_some_and(|c| c.starts_with("22")) =>
        {
            return Err(ExitWith {
                code: EXIT_NO_SUCH_TENANT,
                message: format!(
                    "tenant key {tenant:?} is not a valid value of {root}.{key_column}: {}",
                    e.message()
                ),
            }
            .into());
        }
        other => other?,
    };
    if report.root_rows == 0 {
        return Err(ExitWith {
            code: EXIT_NO_SUCH_TENANT,
            message: format!(
                "no tenant {tenant:?}: no row of {root} has {key_column} = {tenant:?}"
            ),
        }
        .into());
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    if report.refused_for_triggers {
        anyhow::bail!(
            "deprov would refuse to delete tenant {tenant}: its tables have user triggers on DELETE \
             ([hard_delete] user_triggers = \"refuse\")"
        );
    }
    if let Some(why) = &report.trial_refusal {
        anyhow::bail!(
            "deprov would refuse to delete tenant {tenant}: {why} (PostgreSQL's answer to the trial)"
        );
    }
    if report.cascade.would_fail {
        // The worker refuses such a tenant before its soft delete; scripts see it in the status.
        anyhow::bail!(
            "deprov would refuse to delete tenant {tenant}: the cascading DELETE would fail (see the cascade check)"
        );
    }
    Ok(())
}

/// Logs to stderr; `RUST_LOG` filters (default `info`), `--log-format json`
/// (`DEPROV_LOG_FORMAT=json`) for JSON lines ([`init_tracing_with`]).
pub fn init_tracing(cli: &Cli) {
    init_tracing_with(cli.log_format, "info");
}

/// Logs to stderr in `format`; `RUST_LOG` filters, else the filter directives `default` (e.g.
/// `info`). A line that cannot be written (stderr closed or full) is dropped, never a panic.
pub fn init_tracing_with(format: LogFormat, default: &str) {
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let filter = tracing_subscriber::EnvFilter::new(directives.as_deref().unwrap_or(default));
    let builder = tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A failed write (stderr's reader gone: EPIPE; a full disk: ENOSPC) drops the line. With
        // the default `true` the subscriber reports it with `eprintln!`, which panics on the same
        // broken stderr: a server must not die because its log reader went away.
        .log_internal_errors(false);
    let _ = if format == LogFormat::Json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// A one-connection `deprov-cli` pool on `database_url`, after one direct connection has shown the
/// database can be reached.
///
/// # Errors
/// A malformed URL; `cannot reach the state database at HOST:PORT/DB: …` with the connection's own
/// error (refused, authentication, unknown database) when it cannot be reached within 10 s. A pool
/// alone would only have said "pool timed out while waiting for an open connection": sqlx retries
/// an I/O error until the acquire timeout and then reports the timeout, not the cause.
async fn cli_pool(database_url: &str) -> anyhow::Result<sqlx::PgPool> {
    use sqlx::Connection as _;
    const CONNECT: std::time::Duration = std::time::Duration::from_secs(10);
    let options = db::connect_options(database_url)?;
    let place = format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("(default database)")
    );
    match tokio::time::timeout(CONNECT, sqlx::PgConnection::connect_with(&options)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
        }
        Ok(Err(e)) => anyhow::bail!(
            "cannot reach the state database at {place}: {}",
            db::errors::error_text(&e)
        ),
        Err(_) => anyhow::bail!(
            "cannot reach the state database at {place}: no answer within {} s",
            CONNECT.as_secs()
        ),
    }
    Ok(db::pool(
        &options,
        PoolRole::Cli,
        &PoolConfig {
            max_connections: 1,
            acquire_timeout: CONNECT,
        },
    ))
}

/// Runs one parsed command line.
///
/// # Errors
/// Whatever the subcommand fails with.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(settings) => {
            let app = Application::build(settings).await?;
            let cancel = CancellationToken::new();
            app::shutdown_on_signals(cancel.clone());
            app.run_until_stopped(cancel).await?;
        }
        Command::Worker(settings) => {
            let cancel = CancellationToken::new();
            app::shutdown_on_signals(cancel.clone());
            app::run_worker(settings, cancel).await?;
        }
        Command::Migrate(state) => {
            if !state.pooler_mode.allows_migrations() {
                anyhow::bail!(
                    "migrations cannot run through a transaction pooler (DEPROV_POOLER_MODE=transaction): \
                     give `deprov migrate` a direct DEPROV_DATABASE_URL"
                );
            }
            let pool = cli_pool(&state.database_url).await?;
            let migrated = db::migrate(&pool).await;
            pool.close().await; // see plan_command
            migrated?;
            println!("state database migrated");
        }
        Command::KillSwitch(args) => kill_switch_commands::run(args).await?,
        Command::Jobs(args) => job_commands::run_jobs(args).await?,
        Command::Audit(args) => job_commands::run_audit(args).await?,
        Command::Notifications(args) => notifications::run(args).await?,
        Command::Tokens(args) => token_commands::run(args).await?,
        Command::Reconcile(args) => reconcile_commands::run_reconcile(args).await?,
        Command::Plan {
            tenant,
            json,
            trial,
            target,
        } => plan_command(&target, &tenant, json, trial).await?,
        Command::Config(args) => config_check::run(args).await?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::error_report;

    #[test]
    fn the_report_shows_every_cause_once() {
        // A cause its message does not hold is shown under `Caused by:`, as anyhow shows it.
        let e = anyhow::Error::new(std::io::Error::other("disk on fire\nsecond line"))
            .context("reading the journal");
        assert_eq!(
            error_report(&e),
            "Error: reading the journal\n\nCaused by:\n    disk on fire\n    second line"
        );
        // One whose message holds its cause (thiserror's `"…: {source}"`): once.
        let e = anyhow::Error::new(crate::config::ConfigError::Read {
            path: "/etc/deprov.toml".into(),
            source: std::io::Error::other("permission denied"),
        });
        assert_eq!(
            error_report(&e),
            "Error: cannot read configuration file /etc/deprov.toml: permission denied"
        );
    }
}
