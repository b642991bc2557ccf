//! `deprov reconcile` (list what queued up, then resume / retry / cancel / create orphan jobs at a
//! paced rate; dry run unless `--apply`) and `deprov jobs undo` (undo a soft delete in its grace
//! period). Both need the configuration and the target database as well as the state database.

use std::path::PathBuf;

use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::acting::Acting;
use super::{StateDb, cli_pool};
use crate::config::{Config, PoolConfig, Secrets};
use crate::db::{self, Bounds, PoolRole};
use crate::engine::BatchLimits;
use crate::queue::JobState;
use crate::queue::grace::{self, UndoTarget};
use crate::queue::reconcile::{self, Actions, Filter, Orphans, Report};

/// The configuration file and the target database, for commands that read or write the target.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetDb {
    /// The TOML configuration file (undo statements, orphans statement, release rate).
    #[arg(long, env = "DEPROV_CONFIG")]
    pub config: PathBuf,
    /// The application database (default: the state database URL).
    #[arg(long, env = "DEPROV_TARGET_URL", hide_env_values = true)]
    pub target_url: Option<String>,
}

/// `deprov reconcile`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReconcileArgs {
    /// The state database.
    #[command(flatten)]
    pub db: StateDb,
    /// Configuration and target.
    #[command(flatten)]
    pub target: TargetDb,
    /// Act; without it nothing changes (a dry run prints what would be done).
    #[arg(long)]
    pub apply: bool,
    /// Resume held jobs no engaged kill switch blocks.
    #[arg(long)]
    pub resume: bool,
    /// Retry failed jobs from their checkpoint.
    #[arg(long)]
    pub retry: bool,
    /// Cancel the selected queued, held and running jobs (needs a filter).
    #[arg(long)]
    pub cancel: bool,
    /// Create jobs for orphans (soft-deleted tenants without a job).
    #[arg(long)]
    pub create_orphan_jobs: bool,
    /// Only jobs in this state (repeatable).
    #[arg(long = "state")]
    pub states: Vec<String>,
    /// Only jobs with a request from this source.
    #[arg(long)]
    pub source: Option<String>,
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only these jobs (repeatable).
    #[arg(long = "id")]
    pub ids: Vec<Uuid>,
    /// Only jobs with a request received at or after this RFC 3339 time.
    #[arg(long)]
    pub received_after: Option<String>,
    /// Only jobs with a request received before this RFC 3339 time.
    #[arg(long)]
    pub received_before: Option<String>,
    /// Release rate, jobs per second: `5/s` or `5` (default `[reconcile] release_rate`).
    #[arg(long)]
    pub rate: Option<String>,
    /// Why (required with an action; written to the audit log).
    #[arg(long)]
    pub reason: Option<String>,
    /// Who is acting, recorded as `cli:<actor>` (default: `cli`).
    #[arg(long, env = "DEPROV_ACTOR")]
    pub actor: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Parses a release rate: `5/s`, `0.5/s` or `5` (jobs per second, above 0).
///
/// # Errors
/// A message naming `--rate`.
pub fn parse_rate(s: &str) -> anyhow::Result<f64> {
    let n = s.trim().strip_suffix("/s").unwrap_or(s.trim());
    let rate: f64 = n.trim().parse().map_err(|_| {
        anyhow::anyhow!("--rate: {s:?} is not a number of jobs per second (e.g. 5/s)")
    })?;
    anyhow::ensure!(
        rate.is_finite() && rate > 0.0 && rate <= 1000.0,
        "--rate: must be above 0 and at most 1000/s"
    );
    Ok(rate)
}

fn time_arg(name: &str, v: Option<&str>) -> anyhow::Result<Option<time::OffsetDateTime>> {
    v.map(|s| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .map_err(|e| anyhow::anyhow!("--{name}: {s:?} is not an RFC 3339 time: {e}"))
    })
    .transpose()
}

impl ReconcileArgs {
    /// The filter the flags describe.
    ///
    /// # Errors
    /// An unknown state or a malformed time.
    pub fn filter(&self) -> anyhow::Result<Filter> {
        let states = self
            .states
            .iter()
            .map(|s| {
                JobState::parse(s).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--state: {s:?} is not one of queued, held, running, completed, failed, cancelled"
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Filter {
            states,
            source: self.source.clone(),
            tenant: self.tenant.clone(),
            ids: self.ids.clone(),
            received_after: time_arg("received-after", self.received_after.as_deref())?,
            received_before: time_arg("received-before", self.received_before.as_deref())?,
        })
    }

    fn actions(&self) -> Actions {
        Actions {
            resume: self.resume,
            retry: self.retry,
            cancel: self.cancel,
            create_orphan_jobs: self.create_orphan_jobs,
        }
    }
}

fn target_pool(
    state_url: &str,
    target: &TargetDb,
    config: &Config,
) -> anyhow::Result<sqlx::PgPool> {
    let url = target.target_url.as_deref().unwrap_or(state_url);
    Ok(db::pool(
        &db::connect_options(url)?,
        PoolRole::Cli,
        &PoolConfig {
            max_connections: 1,
            acquire_timeout: config.pools.target.acquire_timeout,
        },
    ))
}

fn who(actor: Option<&str>) -> String {
    super::acting::cli_actor(actor)
}

/// One job's line in [`report_text`]: ID, tenant, state, step, tries, then the switch that blocks
/// it (for a failed job, the switch that would hold a retry), its grace period and the first line
/// of its error.
fn job_line(j: &reconcile::JobRow) -> String {
    format!(
        "{} tenant {} {} step {} tries {}{}{}{}",
        j.job_id,
        j.tenant_id.as_deref().unwrap_or(&j.subject),
        j.state,
        j.step,
        j.attempts,
        // A failed job runs nothing: a switch matters to it only once it is retried.
        j.blocked_by
            .as_ref()
            .map(|b| match j.state.as_str() {
                "failed" => format!(" (a retry would be held by {b})"),
                _ => format!(" blocked by {b}"),
            })
            .unwrap_or_default(),
        j.grace_until
            .as_ref()
            .map(|g| format!(" grace until {g}"))
            .unwrap_or_default(),
        j.last_error
            .as_ref()
            .map(|e| format!(" error: {}", e.lines().next().unwrap_or("")))
            .unwrap_or_default(),
    )
}

/// The text `deprov reconcile` prints for a report.
pub fn report_text(r: &Report) -> String {
    let mut out = String::new();
    let mut section = |title: &str, lines: Vec<String>| {
        out.push_str(&format!("{title} ({}):\n", lines.len()));
        for l in lines {
            out.push_str(&format!("  {l}\n"));
        }
    };
    let request = |r: &reconcile::RequestRow| {
        format!(
            "{} from {} for {} → job {} ({}), {} duplicates",
            r.request_id, r.source, r.subject, r.job_id, r.job_state, r.duplicates
        )
    };
    section(
        "requests received while held",
        r.received_while_held.iter().map(request).collect(),
    );
    section("held jobs", r.held.iter().map(job_line).collect());
    section("failed jobs", r.failed.iter().map(job_line).collect());
    section(
        "running jobs whose worker stopped (lease expired; the next worker to look for work takes each over from its checkpoint)",
        r.stalled.iter().map(job_line).collect(),
    );
    section(
        "jobs waiting in grace",
        r.in_grace.iter().map(job_line).collect(),
    );
    section(
        "collapsed duplicates (attached to another request's job)",
        r.collapsed.iter().map(request).collect(),
    );
    match &r.orphans {
        Orphans::NotConfigured => out.push_str(
            "orphans: not configured (set [soft_delete] orphans to detect soft-deleted tenants without a job)\n",
        ),
        Orphans::Found { tenants } => section(
            "orphans (soft-deleted, no job)",
            tenants.iter().map(|t| format!("tenant {t}")).collect(),
        ),
    }
    out
}

async fn reconcile_with(
    conn: &mut PgConnection,
    target: &sqlx::PgPool,
    config: &Config,
    args: &ReconcileArgs,
) -> anyhow::Result<(serde_json::Value, String, bool)> {
    let filter = args.filter()?;
    let limits = BatchLimits::from(&config.hard_delete);
    let orphans_sql = config.soft_delete.orphans.as_deref();
    let actions = args.actions();
    let acting_any =
        actions.resume || actions.retry || actions.cancel || actions.create_orphan_jobs;
    let mut tx = db::begin_on(conn, Bounds::STATE).await?;
    let report = reconcile::report(&mut tx, target, orphans_sql, &limits, &filter).await?;
    let mut value = json!({ "report": report, "dry_run": !args.apply });
    let mut text = report_text(&report);
    if acting_any {
        let reason = args.reason.as_deref().map(str::trim).unwrap_or("");
        anyhow::ensure!(
            !reason.is_empty() && reason.chars().count() <= 1000,
            "--reason: required with an action, 1..=1000 characters"
        );
        let rate = match &args.rate {
            Some(r) => parse_rate(r)?,
            None => config.reconcile.release_rate,
        };
        let actor = who(args.actor.as_deref());
        let acting = reconcile::Acting {
            actor: &actor,
            reason,
            rate,
            max_attempts: i32::try_from(config.worker.max_attempts).unwrap_or(i32::MAX),
        };
        let applied = reconcile::apply(
            &mut tx,
            target,
            orphans_sql,
            &limits,
            &filter,
            actions,
            &acting,
        )
        .await?;
        text.push_str(&format!(
            "\n{} at {rate}/s:\n",
            if args.apply {
                "applied"
            } else {
                "dry run (nothing changed; --apply to act)"
            }
        ));
        for a in &applied.actions {
            text.push_str(&format!(
                "  {} job {} tenant {} → {}{}\n",
                a.action,
                a.job_id,
                a.tenant_id.as_deref().unwrap_or("-"),
                a.state,
                a.run_after
                    .as_ref()
                    .map(|t| format!(", claimable from {t}"))
                    .unwrap_or_default()
            ));
        }
        for s in &applied.skipped {
            text.push_str(&format!(
                "  skipped {} job {}: {}\n",
                s.action, s.job_id, s.why
            ));
        }
        value["applied"] = serde_json::to_value(&applied)?;
    }
    if args.apply {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok((value, text, acting_any))
}

/// Runs `deprov reconcile`.
///
/// # Errors
/// Configuration, database and refused-request errors.
pub async fn run_reconcile(args: ReconcileArgs) -> anyhow::Result<()> {
    args.db.pooler_mode.apply();
    let config = Config::load_with(&args.target.config.to_string_lossy(), Secrets::Skip)?;
    let state = cli_pool(&args.db.database_url).await?;
    let target = target_pool(&args.db.database_url, &args.target, &config)?;
    let result = async {
        let mut conn = db::acquire(&state).await?;
        reconcile_with(&mut conn, &target, &config, &args).await
    }
    .await;
    state.close().await; // see plan_command
    target.close().await;
    let (value, text, _) = result?;
    if args.json {
        println!("{value}");
    } else {
        print!("{text}");
    }
    Ok(())
}

/// `deprov jobs undo`: runs the undo statements and cancels the job, in `tx` (committed here).
///
/// # Errors
/// Refusals ([`grace::GraceError`]) and database errors.
pub(super) async fn undo(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    state_url: &str,
    id: Uuid,
    acting: &Acting,
    target: &TargetDb,
    json_out: bool,
) -> anyhow::Result<()> {
    let reason = acting.reason.trim();
    anyhow::ensure!(
        !reason.is_empty() && reason.chars().count() <= 1000,
        "--reason: must be 1..=1000 characters"
    );
    let config = Config::load_with(&target.config.to_string_lossy(), Secrets::Skip)?;
    let pool = target_pool(state_url, target, &config)?;
    let actor = who(acting.actor.as_deref());
    let result = grace::undo(&mut tx, UndoTarget::new(&pool, &config), id, &actor, reason).await;
    pool.close().await;
    let undone = result?;
    tx.commit().await?;
    if json_out {
        println!("{}", serde_json::to_value(&undone)?);
    } else {
        println!(
            "job {id} cancelled; soft delete of tenant {} undone ({} rows restored)",
            undone.tenant_id.as_deref().unwrap_or("-"),
            undone.restored_rows
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_job_shows_the_switch_that_would_hold_its_retry_not_a_block() {
        let row = |state: &str| reconcile::JobRow {
            job_id: uuid::Uuid::nil(),
            tenant_id: Some("42".into()),
            subject: "42".into(),
            state: state.into(),
            step: "hard_delete".into(),
            attempts: 3,
            last_error: Some("lock timeout\nmore".into()),
            blocked_by: Some("global".into()),
            grace_until: None,
            created_at: time::OffsetDateTime::UNIX_EPOCH,
        };
        let nil = uuid::Uuid::nil();
        assert_eq!(
            job_line(&row("held")),
            format!(
                "{nil} tenant 42 held step hard_delete tries 3 blocked by global error: lock timeout"
            )
        );
        assert_eq!(
            job_line(&row("failed")),
            format!(
                "{nil} tenant 42 failed step hard_delete tries 3 (a retry would be held by global) error: lock timeout"
            )
        );
    }

    #[test]
    fn rates_parse_as_jobs_per_second_and_refuse_nonsense() {
        assert_eq!(parse_rate("5/s").unwrap(), 5.0);
        assert_eq!(parse_rate(" 0.5/s ").unwrap(), 0.5);
        assert_eq!(parse_rate("12").unwrap(), 12.0);
        for bad in ["0", "-1/s", "fast", "5/m", "NaN", "inf", "1001"] {
            let err = parse_rate(bad).expect_err(bad).to_string();
            assert!(err.starts_with("--rate"), "{bad}: {err}");
        }
    }
}
