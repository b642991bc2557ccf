//! `deprov notifications list|redrive`: the outbox of job events ([`crate::notify`]) on the state
//! database directly; a table by default, `--json` for scripts. Redrive writes the audit log.

use serde_json::json;
use uuid::Uuid;

use super::acting::actor;
use super::job_commands::{cell, rfc3339};
use super::{Acting, StateDb, cli_pool};
use crate::db::{self, Bounds};
use crate::notify::outbox::{self, Event, STATES};
use crate::queue::audit;

/// `deprov notifications`.
#[derive(Debug, Clone, clap::Args)]
pub struct NotificationsArgs {
    /// The state database.
    #[command(flatten)]
    pub db: StateDb,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub action: NotificationsAction,
}

/// `list` or `redrive`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum NotificationsAction {
    /// Events newest first.
    List {
        /// Only events in this state (pending, delivered, dead, skipped).
        #[arg(long)]
        state: Option<String>,
        /// At most this many (1..=1000).
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Send dead events again (attempts reset): one by ID, or every dead one with `--all-dead`.
    Redrive {
        /// The event ID (`webhook-id`).
        #[arg(required_unless_present = "all_dead", conflicts_with = "all_dead")]
        id: Option<Uuid>,
        /// Every dead event.
        #[arg(long)]
        all_dead: bool,
        /// Who and why.
        #[command(flatten)]
        acting: Acting,
    },
}

/// The table `deprov notifications list` prints: one line per event under a header.
pub fn events_table(events: &[Event]) -> String {
    let mut out = format!(
        "{} {} {} {} {} {} {}\n",
        cell("EVENT", 36),
        cell("TYPE", 13),
        cell("STATE", 9),
        cell("JOB", 36),
        cell("TRIES", 5),
        cell("CREATED", 20),
        "LAST ERROR"
    );
    for e in events {
        out.push_str(&format!(
            "{} {} {} {} {} {} {}\n",
            cell(&e.id.to_string(), 36),
            cell(&e.event_type, 13),
            cell(&e.state, 9),
            cell(&e.job_id.to_string(), 36),
            cell(&e.attempts.to_string(), 5),
            cell(&rfc3339(e.created_at), 20),
            e.last_error.as_deref().unwrap_or("-"),
        ));
    }
    out
}

/// Runs `deprov notifications …`.
///
/// # Errors
/// An unknown state, an unreachable database, or no such dead event.
pub async fn run(args: NotificationsArgs) -> anyhow::Result<()> {
    let pool = cli_pool(&args.db.database_url).await?;
    let result = run_with(&pool, &args).await;
    pool.close().await; // see plan_command
    result
}

async fn run_with(pool: &sqlx::PgPool, args: &NotificationsArgs) -> anyhow::Result<()> {
    let mut tx = db::begin(pool, Bounds::STATE).await?;
    match &args.action {
        NotificationsAction::List { state, limit } => {
            if let Some(s) = state {
                anyhow::ensure!(
                    STATES.contains(&s.as_str()),
                    "--state: one of {}",
                    STATES.join(", ")
                );
            }
            let events = outbox::list(&mut *tx, state.as_deref(), *limit).await?;
            tx.commit().await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&events)?);
            } else {
                print!("{}", events_table(&events));
            }
        }
        NotificationsAction::Redrive {
            id,
            all_dead: _,
            acting,
        } => {
            let (who, reason) = actor(acting)?;
            let ids = outbox::redrive(&mut *tx, *id).await?;
            anyhow::ensure!(
                !ids.is_empty() || id.is_none(),
                "no dead notification event {}",
                id.map(|i| i.to_string()).unwrap_or_default()
            );
            let target = id.map(|i| i.to_string());
            audit::record(
                &mut *tx,
                &who,
                "notification.redrive",
                target.as_deref(),
                &reason,
                &json!({ "events": ids }),
            )
            .await?;
            tx.commit().await?;
            if args.json {
                println!("{}", json!({ "redriven": ids }));
            } else {
                println!("{} event(s) pending again", ids.len());
            }
        }
    }
    Ok(())
}
