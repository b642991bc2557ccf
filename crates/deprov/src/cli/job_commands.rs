//! `deprov jobs list|show|retry|cancel|undo` and `deprov audit list`: operator commands on the state
//! database directly, readable tables by default, `--json` for scripts. Retry and cancel write the
//! audit log ([`crate::queue::audit`]).

use serde_json::json;
use uuid::Uuid;

use super::acting::{Acting, actor};
use super::{StateDb, cli_pool};
use crate::db::{self, Bounds};
use crate::http::job_routes::JobView;
use crate::queue::operator::{self, Cancelled};
use crate::queue::{JobState, audit, jobs};

/// `deprov jobs`.
#[derive(Debug, Clone, clap::Args)]
pub struct JobsArgs {
    /// The state database.
    #[command(flatten)]
    pub db: StateDb,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub action: JobsAction,
}

/// `list`, `show`, `retry` or `cancel`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum JobsAction {
    /// Jobs newest first.
    List {
        /// Only jobs in this state (queued, held, running, completed, failed, cancelled).
        #[arg(long)]
        state: Option<String>,
        /// At most this many (1..=1000).
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// One job with its progress.
    Show {
        /// The job ID.
        id: Uuid,
    },
    /// Re-drive a failed job from its checkpoint (attempts reset).
    Retry {
        /// The job ID.
        id: Uuid,
        /// Who and why.
        #[command(flatten)]
        acting: Acting,
    },
    /// Cancel a queued or held job now, a running one at its next batch boundary.
    Cancel {
        /// The job ID.
        id: Uuid,
        /// Who and why.
        #[command(flatten)]
        acting: Acting,
    },
    /// Undo the soft delete of a job whose hard delete has not started (in its grace period):
    /// run `[soft_delete] undo_statements` on the target and cancel the job.
    Undo {
        /// The job ID.
        id: Uuid,
        /// Who and why.
        #[command(flatten)]
        acting: Acting,
        /// Configuration and target.
        #[command(flatten)]
        target: super::reconcile_commands::TargetDb,
    },
}

/// `deprov audit`.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// The state database.
    #[command(flatten)]
    pub db: StateDb,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub action: AuditAction,
}

/// `list`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum AuditAction {
    /// Operator actions, newest first.
    List {
        /// At most this many (1..=1000).
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Only actions starting with this (`job.`, `kill_switch.engage` …).
        #[arg(long)]
        action: Option<String>,
    },
}

pub(super) fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Pads or cuts `s` to `width` characters.
pub(super) fn cell(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n > width {
        let cut: String = s.chars().take(width.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        format!("{s}{}", " ".repeat(width - n))
    }
}

/// The table `deprov jobs list` prints: one line per job under a header.
pub fn jobs_table(views: &[JobView]) -> String {
    let mut out = format!(
        "{} {} {} {} {} {} {} {}\n",
        cell("JOB", 36),
        cell("STATE", 9),
        cell("TENANT", 16),
        cell("STEP", 11),
        cell("TRIES", 5),
        cell("ROWS", 9),
        cell("CREATED", 20),
        "LAST ERROR / NOTE"
    );
    for v in views {
        let state = serde_json::to_value(v.state).unwrap_or_default();
        out.push_str(&format!(
            "{} {} {} {} {} {} {} {}\n",
            cell(&v.job_id.to_string(), 36),
            cell(state.as_str().unwrap_or("?"), 9),
            cell(v.tenant_id.as_deref().unwrap_or(&v.subject), 16),
            cell(&v.step, 11),
            cell(&v.attempts.to_string(), 5),
            cell(&v.progress.rows_deleted.to_string(), 9),
            cell(&rfc3339(v.created_at), 20),
            last_column(v),
        ));
    }
    out
}

/// The job's `progress.note` (why a completed job deleted nothing, what it was merged into, …).
fn note(v: &JobView) -> Option<&str> {
    v.progress.extra.get("note")?.as_str()
}

/// The list's last column: the last error's first line, else `note: ` and the note's, else `-`.
fn last_column(v: &JobView) -> String {
    let first = |s: &str| s.lines().next().unwrap_or("-").to_owned();
    match (v.last_error.as_deref(), note(v)) {
        (Some(e), _) => first(e),
        (None, Some(n)) => format!("note: {}", first(n)),
        (None, None) => "-".into(),
    }
}

fn show_text(v: &JobView) -> String {
    let state = serde_json::to_value(v.state).unwrap_or_default();
    let mut out = String::new();
    let mut line = |k: &str, val: String| out.push_str(&format!("{:<12} {val}\n", format!("{k}:")));
    line("job", v.job_id.to_string());
    line("state", state.as_str().unwrap_or("?").to_owned());
    line("subject", format!("{} {}", v.subject_kind, v.subject));
    line("tenant", v.tenant_id.clone().unwrap_or_else(|| "-".into()));
    line("step", v.step.clone());
    line(
        "attempts",
        format!(
            "{} ({} since the job last advanced)",
            v.attempts, v.stalled_attempts
        ),
    );
    line("rows", v.progress.rows_deleted.to_string());
    if let Some(n) = note(v) {
        line("note", n.to_owned());
    }
    line("created", rfc3339(v.created_at));
    line("started", v.started_at.map_or("-".into(), rfc3339));
    line("finished", v.finished_at.map_or("-".into(), rfc3339));
    line(
        "last error",
        v.last_error.clone().unwrap_or_else(|| "-".into()),
    );
    for t in &v.progress.tables {
        let name = t["table"].as_str().unwrap_or("?");
        let rows = t["rows_deleted"].as_i64().unwrap_or(0);
        let done = if t["done"].as_bool() == Some(true) {
            " (done)"
        } else {
            ""
        };
        out.push_str(&format!("  {name}: {rows} rows{done}\n"));
    }
    out
}

async fn jobs_with(pool: &sqlx::PgPool, args: &JobsArgs) -> anyhow::Result<()> {
    let mut tx = db::begin(pool, Bounds::STATE).await?;
    match &args.action {
        JobsAction::List { state, limit } => {
            let filter = match state.as_deref() {
                None => None,
                Some(s) => Some(JobState::parse(s).ok_or_else(|| {
                    anyhow::anyhow!("--state: {s:?} is not one of queued, held, running, completed, failed, cancelled")
                })?),
            };
            let rows = jobs::list(&mut *tx, filter, *limit).await?;
            tx.commit().await?;
            let views: Vec<JobView> = rows.into_iter().map(JobView::from).collect();
            if args.json {
                println!("{}", json!({ "jobs": views }));
            } else {
                print!("{}", jobs_table(&views));
            }
        }
        JobsAction::Show { id } => {
            let job = jobs::get(&mut *tx, *id).await?;
            tx.commit().await?;
            let view = JobView::from(job.ok_or_else(|| anyhow::anyhow!("no job {id}"))?);
            if args.json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print!("{}", show_text(&view));
            }
        }
        JobsAction::Retry { id, acting } => {
            let (who, reason) = actor(acting)?;
            let state = operator::retry(&mut tx, *id, &who, &reason).await?;
            tx.commit().await?;
            if args.json {
                println!("{}", json!({"job_id": id, "state": state}));
            } else {
                println!("job {id} is {state}: it resumes from its checkpoint");
            }
        }
        JobsAction::Undo { id, acting, target } => {
            return super::reconcile_commands::undo(
                tx,
                &args.db.database_url,
                *id,
                acting,
                target,
                args.json,
            )
            .await;
        }
        JobsAction::Cancel { id, acting } => {
            let (who, reason) = actor(acting)?;
            let outcome = operator::cancel(&mut tx, *id, &who, &reason).await?;
            tx.commit().await?;
            let (state, text) = match outcome {
                Cancelled::Now => ("cancelled", "cancelled"),
                Cancelled::AtNextBatch => (
                    "running",
                    "running: it stops at its next batch boundary and ends cancelled",
                ),
            };
            if args.json {
                println!(
                    "{}",
                    json!({"job_id": id, "state": state, "cancel_requested": true})
                );
            } else {
                println!("job {id} {text}");
            }
        }
    }
    Ok(())
}

/// Runs `deprov jobs`.
///
/// # Errors
/// Database errors, unknown jobs, refused actions.
pub async fn run_jobs(args: JobsArgs) -> anyhow::Result<()> {
    args.db.pooler_mode.apply();
    let pool = cli_pool(&args.db.database_url).await?;
    let result = jobs_with(&pool, &args).await;
    pool.close().await; // see plan_command
    result
}

/// Runs `deprov audit`.
///
/// # Errors
/// Database errors.
pub async fn run_audit(args: AuditArgs) -> anyhow::Result<()> {
    args.db.pooler_mode.apply();
    let pool = cli_pool(&args.db.database_url).await?;
    let result = async {
        let AuditAction::List { limit, action } = &args.action;
        let mut tx = db::begin(&pool, Bounds::STATE).await?;
        let rows = audit::list(&mut *tx, *limit, None, action.as_deref()).await?;
        tx.commit().await?;
        Ok::<_, anyhow::Error>(rows)
    }
    .await;
    pool.close().await; // see plan_command
    let rows = result?;
    if args.json {
        let entries: Vec<_> = rows
            .iter()
            .map(|e| {
                json!({"id": e.id, "at": rfc3339(e.at), "actor": e.actor, "action": e.action,
                "target": e.target, "reason": e.reason, "details": e.details})
            })
            .collect();
        println!("{}", json!({ "entries": entries }));
        return Ok(());
    }
    println!(
        "{} {} {} {} {} REASON",
        cell("ID", 6),
        cell("AT", 20),
        cell("ACTOR", 16),
        cell("ACTION", 19),
        cell("TARGET", 30)
    );
    for e in &rows {
        println!(
            "{} {} {} {} {} {}",
            cell(&e.id.to_string(), 6),
            cell(&rfc3339(e.at), 20),
            cell(&e.actor, 16),
            cell(&e.action, 19),
            cell(e.target.as_deref().unwrap_or("-"), 30),
            e.reason
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jobs_table_aligns_its_columns_and_cuts_long_cells() {
        let now = time::OffsetDateTime::UNIX_EPOCH;
        let job = crate::queue::Job {
            id: Uuid::nil(),
            subject_kind: "tenant".into(),
            subject: "a-tenant-key-longer-than-sixteen".into(),
            tenant_id: Some("a-tenant-key-longer-than-sixteen".into()),
            state: "failed".into(),
            step: "hard_delete".into(),
            attempts: 3,
            stalled_attempts: 1,
            max_attempts: 10,
            last_error: Some("lock timeout\nsecond line".into()),
            checkpoint: None,
            progress: json!({"rows_deleted": 1234}),
            created_at: now,
            started_at: None,
            finished_at: None,
            run_after: now,
            lease_owner: None,
            lease_expires_at: None,
        };
        let table = jobs_table(&[JobView::from(job)]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        // Column positions in characters (the cut tenant ends with a 3-byte "…").
        let col = |line: &str, text: &str| line[..line.find(text).unwrap()].chars().count();
        assert_eq!(col(lines[0], "STATE"), col(lines[1], "failed"));
        assert_eq!(col(lines[0], "ROWS"), col(lines[1], "1234"));
        assert_eq!(col(lines[0], "LAST ERROR"), col(lines[1], "lock timeout"));
        assert!(lines[1].contains("a-tenant-key-lo… "), "{}", lines[1]);
        assert!(lines[1].ends_with("lock timeout"), "{}", lines[1]);
    }

    #[test]
    fn without_an_error_the_list_and_show_print_the_jobs_note() {
        let now = time::OffsetDateTime::UNIX_EPOCH;
        let job = crate::queue::Job {
            id: Uuid::nil(),
            subject_kind: "lookup".into(),
            subject: "platform:inst-1".into(),
            tenant_id: None,
            state: "completed".into(),
            step: "done".into(),
            attempts: 1,
            stalled_attempts: 0,
            max_attempts: 10,
            last_error: None,
            checkpoint: None,
            progress: json!({"rows_deleted": 0, "note": "no tenant found; nothing to delete"}),
            created_at: now,
            started_at: None,
            finished_at: None,
            run_after: now,
            lease_owner: None,
            lease_expires_at: None,
        };
        let view = JobView::from(job);
        let table = jobs_table(std::slice::from_ref(&view));
        assert!(
            table
                .lines()
                .nth(1)
                .unwrap()
                .ends_with("note: no tenant found; nothing to delete"),
            "{table}"
        );
        assert!(
            show_text(&view).contains("note:        no tenant found; nothing to delete\n"),
            "{}",
            show_text(&view)
        );
    }
}
