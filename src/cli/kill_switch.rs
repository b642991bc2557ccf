//! `deprov kill-switch on|off|status`: talks to the state database directly.

use std::time::Duration;

use serde_json::json;

use super::{StateDb, cli_pool};
use crate::db;
use crate::queue::kill_switch::{self, Scope, ScopeKind, ScopeSwitch, Status};

/// `deprov kill-switch`.
#[derive(Debug, Clone, clap::Args)]
pub struct KillSwitchArgs {
    /// The state database.
    #[command(flatten)]
    pub db: StateDb,
    /// Print JSON instead of sentences.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub action: KillSwitchAction,
}

/// Which switch, who, and whether to wait for the workers.
#[derive(Debug, Clone, clap::Args)]
pub struct ChangeArgs {
    /// Why (stored, shown by `status`, written to the audit log).
    #[arg(long)]
    pub reason: Option<String>,
    /// `global`, `source` (one source's jobs) or `tenant` (one tenant's jobs).
    #[arg(long, value_enum, default_value_t = ScopeKind::Global)]
    pub scope: ScopeKind,
    /// The source name or tenant key (with `--scope source|tenant`).
    #[arg(long)]
    pub key: Option<String>,
    /// Who is acting, recorded as `cli:<actor>` (default: `cli`).
    #[arg(long, env = "DEPROV_ACTOR")]
    pub actor: Option<String>,
    /// Return only when every live worker has acknowledged the change (exit status 1 on timeout,
    /// naming the workers that have not).
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits, e.g. `30s`.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `on`, `off` or `status`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum KillSwitchAction {
    /// Engage: stop deletion in the scope at the next batch boundary; intake keeps recording.
    On(ChangeArgs),
    /// Release: held jobs nothing else blocks resume from their checkpoints.
    Off(ChangeArgs),
    /// Show every switch and which live workers have acknowledged it.
    Status,
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// A readable line for one switch.
pub fn describe(switch: &ScopeSwitch, moved: Option<u64>) -> String {
    let name = match &switch.key {
        None => "kill switch".to_owned(),
        Some(k) => format!("kill switch for {} {k:?}", switch.scope),
    };
    let mut line = format!(
        "{name} {} (version {}, changed {} by {}): {}",
        if switch.engaged {
            "ENGAGED"
        } else {
            "released"
        },
        switch.version,
        rfc3339(switch.changed_at),
        switch.changed_by.as_deref().unwrap_or("nobody"),
        switch.reason.as_deref().unwrap_or("no reason given"),
    );
    if let Some(n) = moved {
        line.push_str(&format!(
            "; {n} job(s) moved to {}",
            if switch.engaged { "held" } else { "queued" }
        ));
    }
    line
}

fn switch_json(s: &ScopeSwitch, status: Option<&Status>) -> serde_json::Value {
    let mut v = json!({"scope": s.scope, "key": s.key, "engaged": s.engaged, "reason": s.reason,
        "changed_by": s.changed_by, "version": s.version, "changed_at": rfc3339(s.changed_at)});
    if let Some(status) = status {
        let pending = status.pending(s.version);
        v["acknowledged"] = json!(pending.is_empty());
        v["pending_workers"] = json!(pending);
    }
    v
}

async fn read_status(pool: &sqlx::PgPool) -> Result<Status, sqlx::Error> {
    let mut tx = db::begin(pool, db::Bounds::STATE).await?;
    let status = Status::read(&mut tx).await?;
    tx.commit().await?;
    Ok(status)
}

fn print_status(status: &Status, json: bool) {
    if json {
        let switches: Vec<_> = status
            .switches
            .iter()
            .map(|s| switch_json(s, Some(status)))
            .collect();
        let workers: Vec<_> = status
            .workers
            .iter()
            .map(|w| {
                json!({"id": w.id, "observed_version": w.observed_version,
                "heartbeat_at": rfc3339(w.heartbeat_at), "listening": w.listening})
            })
            .collect();
        // The global switch's fields at the top level, as before scopes existed.
        let mut v = status
            .switches
            .first()
            .map_or_else(|| json!({}), |g| switch_json(g, None));
        if let Some(o) = v.as_object_mut() {
            o.remove("scope");
            o.remove("key");
        }
        let pending = status.pending(status.latest_version);
        v["latest_version"] = json!(status.latest_version);
        v["acknowledged"] = json!(pending.is_empty());
        v["pending_workers"] = json!(pending);
        v["switches"] = json!(switches);
        v["live_workers"] = json!(workers);
        println!("{v}");
        return;
    }
    for s in &status.switches {
        let pending = status.pending(s.version);
        let ack = if pending.is_empty() {
            format!(
                "acknowledged by all {} live worker(s)",
                status.workers.len()
            )
        } else {
            format!("NOT acknowledged by {}", pending.join(", "))
        };
        println!("{} — {ack}", describe(s, None));
    }
    if status.workers.is_empty() {
        println!("no live workers");
    }
    for w in &status.workers {
        println!(
            "worker {} observed version {} (heartbeat {}, {})",
            w.id,
            w.observed_version,
            rfc3339(w.heartbeat_at),
            if w.listening { "listening" } else { "polling" }
        );
    }
}

/// Polls until every live worker has observed `version` or `timeout` passes; a spinner on a
/// terminal. Returns the workers still pending (empty = acknowledged).
async fn wait_for_ack(
    pool: &sqlx::PgPool,
    version: i64,
    timeout: Duration,
) -> Result<(Vec<String>, usize), sqlx::Error> {
    let bar = indicatif::ProgressBar::new_spinner();
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let status = read_status(pool).await?;
        let pending = status.pending(version);
        if pending.is_empty() || tokio::time::Instant::now() >= deadline {
            bar.finish_and_clear();
            return Ok((pending, status.workers.len()));
        }
        bar.set_message(format!(
            "waiting for {} of {} live worker(s) to acknowledge version {version}: {}",
            pending.len(),
            status.workers.len(),
            pending.join(", ")
        ));
        bar.tick();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn change(
    pool: &sqlx::PgPool,
    engage: bool,
    args: &ChangeArgs,
) -> anyhow::Result<(ScopeSwitch, u64)> {
    let scope = Scope::new(args.scope, args.key.as_deref()).map_err(anyhow::Error::msg)?;
    let default = if engage {
        "engaged from the command line"
    } else {
        "released from the command line"
    };
    let reason = args.reason.as_deref().map_or(default, str::trim);
    anyhow::ensure!(
        !reason.is_empty() && reason.chars().count() <= 1000,
        "--reason: must be 1..=1000 characters"
    );
    let actor = match args.actor.as_deref().map(str::trim) {
        None | Some("") => "cli".to_owned(),
        Some(a) => format!("cli:{a}"),
    };
    let mut tx = db::begin(pool, db::Bounds::STATE).await?;
    let result = kill_switch::set_scope(&mut tx, &scope, engage, reason, &actor).await?;
    tx.commit().await?;
    Ok(result)
}

async fn run_with(pool: &sqlx::PgPool, args: &KillSwitchArgs) -> anyhow::Result<()> {
    let (engage, change_args) = match &args.action {
        KillSwitchAction::Status => {
            print_status(&read_status(pool).await?, args.json);
            return Ok(());
        }
        KillSwitchAction::On(c) => (true, c),
        KillSwitchAction::Off(c) => (false, c),
    };
    let (switch, moved) = change(pool, engage, change_args).await?;
    let waited = if change_args.wait {
        Some(wait_for_ack(pool, switch.version, change_args.timeout).await?)
    } else {
        None
    };
    if args.json {
        let mut v = switch_json(&switch, None);
        v["jobs_moved"] = json!(moved);
        if let Some((pending, live)) = &waited {
            v["acknowledged"] = json!(pending.is_empty());
            v["pending_workers"] = json!(pending);
            v["live_workers"] = json!(live);
        }
        println!("{v}");
    } else {
        println!("{}", describe(&switch, Some(moved)));
        if let Some((pending, live)) = &waited
            && pending.is_empty()
        {
            println!(
                "acknowledged by all {live} live worker(s): no destructive statement started before version {} is still running",
                switch.version
            );
        }
    }
    if let Some((pending, _)) = waited
        && !pending.is_empty()
    {
        anyhow::bail!(
            "not acknowledged within {:?} by {} live worker(s): {}",
            change_args.timeout,
            pending.len(),
            pending.join(", ")
        );
    }
    Ok(())
}

/// Runs `deprov kill-switch`.
///
/// # Errors
/// Database errors, invalid arguments, or `--wait` timing out (naming the workers).
pub async fn run(args: KillSwitchArgs) -> anyhow::Result<()> {
    args.db.pooler_mode.apply();
    let pool = cli_pool(&args.db.database_url)?;
    let result = run_with(&pool, &args).await;
    pool.close().await; // see plan_command
    result
}
