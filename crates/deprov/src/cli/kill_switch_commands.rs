//! `deprov kill-switch on|off|status`: talks to the state database directly; a tenant's switch also
//! reads the type of `[tenant] key_column` from the target's catalog.

use std::time::Duration;

use serde_json::json;

use super::job_commands::cell;
use super::{StateDb, cli_pool};
use crate::db;
use crate::ids::KeyForm;
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
    /// The source name or tenant key (with `--scope source|tenant`). A tenant key is checked and
    /// written as `PUT /v1/kill-switch` does it, in the form the type of `[tenant] key_column`
    /// gives it (`7` for `07` of a bigint), read from the target database with the configuration
    /// (`--config`): engaging under a key the column cannot hold (`abc` for a bigint) is refused,
    /// exit status 1, nothing changed. Without the configuration, or while the target cannot be
    /// read, the key is written as typed, unchecked, and a warning says so. A source name is not
    /// checked (`PUT /v1/kill-switch` refuses engaging an unknown one).
    #[arg(long)]
    pub key: Option<String>,
    /// The configuration file, read with `--scope tenant` for `[tenant] root_table` and
    /// `key_column`.
    #[arg(long, env = "DEPROV_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// The application database, read with `--scope tenant` for the key column's type (default:
    /// the state database's URL, as for `serve`).
    #[arg(long, env = "DEPROV_TARGET_URL", hide_env_values = true)]
    pub target_url: Option<String>,
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
        // The global switch's fields at the top level too, for scripts that read only the global
        // switch (as `GET /v1/kill-switch` has them).
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
    print!("{}", status_tables(status));
}

/// The text of `kill-switch status`: a table of switches (global first) with each one's
/// acknowledgement, then a table of live workers (or `no live workers`).
pub fn status_tables(status: &Status) -> String {
    let mut out = format!(
        "{} {} {} {} {} {} {} REASON\n",
        cell("SCOPE", 7),
        cell("KEY", 16),
        cell("STATE", 8),
        cell("VERSION", 7),
        cell("CHANGED", 20),
        cell("BY", 16),
        cell("ACKNOWLEDGED", 24),
    );
    for s in &status.switches {
        let pending = status.pending(s.version);
        let ack = if pending.is_empty() {
            format!("yes ({} live)", status.workers.len())
        } else {
            format!("NO: {}", pending.join(", "))
        };
        out.push_str(&format!(
            "{} {} {} {} {} {} {} {}\n",
            cell(&s.scope, 7),
            cell(s.key.as_deref().unwrap_or("-"), 16),
            cell(if s.engaged { "ENGAGED" } else { "released" }, 8),
            cell(&s.version.to_string(), 7),
            cell(&rfc3339(s.changed_at), 20),
            cell(s.changed_by.as_deref().unwrap_or("-"), 16),
            cell(&ack, 24),
            s.reason.as_deref().unwrap_or("-"),
        ));
    }
    if status.workers.is_empty() {
        out.push_str("\nno live workers\n");
        return out;
    }
    out.push_str(&format!(
        "\n{} {} {} {} MODE\n",
        cell("WORKER", 32),
        cell("OBSERVED", 8),
        cell("HEARTBEAT", 20),
        cell("LAST DESTRUCTIVE", 27)
    ));
    for w in &status.workers {
        out.push_str(&format!(
            "{} {} {} {} {}\n",
            cell(&w.id, 32),
            cell(&w.observed_version.to_string(), 8),
            cell(&rfc3339(w.heartbeat_at), 20),
            cell(&w.last_destroyed_at.map_or("-".into(), rfc3339), 27),
            if w.listening { "listening" } else { "polling" }
        ));
    }
    out
}

/// Polls (every 100 ms) until every live worker has observed `version` or `timeout` passes. On a
/// terminal (stderr) a progress bar counts the live workers that acknowledged, names the others and
/// shows the time waited; elsewhere nothing is drawn. Returns the workers still pending (empty =
/// acknowledged) and how many were live.
async fn wait_for_ack(
    pool: &sqlx::PgPool,
    version: i64,
    timeout: Duration,
) -> Result<(Vec<String>, usize), sqlx::Error> {
    let bar = indicatif::ProgressBar::new(0);
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let style = indicatif::ProgressStyle::with_template(
            "{spinner} [{bar:20}] {pos}/{len} live workers acknowledged version {prefix} ({elapsed}) {wide_msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(version.to_string());
    } else {
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
        let live = status.workers.len();
        bar.set_length(live as u64);
        bar.set_position(live.saturating_sub(pending.len()) as u64);
        bar.set_message(format!("waiting for {}", pending.join(", ")));
        bar.tick();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How `[tenant] key_column` reads tenant keys, from the configuration `config` and the target
/// database `target_url` (a pool of one connection of its own, closed afterwards; the catalog read
/// is bounded like `serve`'s at start). `None`, with a warning on stderr saying the key is written
/// unchecked, when either cannot be read.
async fn key_form(config: Option<&std::path::Path>, target_url: &str) -> Option<KeyForm> {
    let unchecked = |why: &str| {
        eprintln!(
            "warning: {why}: the tenant key is written as typed, not checked against \
             [tenant] key_column"
        );
    };
    let Some(path) = config else {
        unchecked("no configuration (--config or DEPROV_CONFIG)");
        return None;
    };
    let config = match crate::config::Config::load_with(
        &path.to_string_lossy(),
        crate::config::Secrets::Skip,
    ) {
        Ok(config) => config,
        Err(e) => {
            unchecked(&e.to_string());
            return None;
        }
    };
    let options = match db::connect_options(target_url) {
        Ok(options) => options,
        Err(e) => {
            unchecked(&format!("the target database's URL: {e}"));
            return None;
        }
    };
    let target = db::single(&options, db::PoolRole::Cli);
    let plan =
        crate::engine::load_plan(&target, &config.root_table(), &config.tenant.key_column).await;
    target.close().await;
    match plan {
        Ok(plan) => Some(KeyForm::of(plan.key_type.as_str())),
        Err(e) => {
            unchecked(&format!(
                "cannot read [tenant] key_column's type from the target database: {e}"
            ));
            None
        }
    }
}

async fn change(
    pool: &sqlx::PgPool,
    state_url: &str,
    engage: bool,
    args: &ChangeArgs,
) -> anyhow::Result<(ScopeSwitch, u64)> {
    let scope = Scope::new(args.scope, args.key.as_deref()).map_err(anyhow::Error::msg)?;
    let form = match scope {
        Scope::Tenant(_) => {
            let target = args.target_url.as_deref().unwrap_or(state_url);
            key_form(args.config.as_deref(), target).await
        }
        Scope::Global | Scope::Source(_) => None,
    };
    let scope = scope
        .keyed(form, engage)
        .map_err(|why| anyhow::anyhow!("refused, nothing changed: {why}"))?;
    let default = if engage {
        "engaged from the command line"
    } else {
        "released from the command line"
    };
    let reason = super::acting::cli_reason(args.reason.as_deref(), default)?;
    let actor = super::acting::cli_actor(args.actor.as_deref());
    let mut tx = db::begin(pool, db::Bounds::STATE).await?;
    let result = kill_switch::change(&mut tx, &scope, engage, reason, &actor, form).await?;
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
    let (switch, moved) = change(pool, &args.db.database_url, engage, change_args).await?;
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
    let pool = cli_pool(&args.db.database_url).await?;
    let result = run_with(&pool, &args).await;
    pool.close().await; // see plan_command
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::workers::LiveWorker;

    #[test]
    fn the_status_tables_align_and_name_the_workers_that_have_not_acknowledged() {
        let at = time::OffsetDateTime::UNIX_EPOCH;
        let switch = |scope: &str, key: Option<&str>, engaged, version| ScopeSwitch {
            scope: scope.into(),
            key: key.map(Into::into),
            engaged,
            reason: Some("incident 42".into()),
            changed_by: Some("alice".into()),
            version,
            changed_at: at,
        };
        let worker = |id: &str, observed| LiveWorker {
            id: id.into(),
            started_at: at,
            heartbeat_at: at,
            observed_version: observed,
            observed_at: None,
            listening: observed == 2,
            last_destroyed_at: (observed == 1).then_some(at),
        };
        let status = Status {
            latest_version: 2,
            switches: vec![
                switch("global", None, false, 1),
                switch("tenant", Some("acct_1"), true, 2),
            ],
            workers: vec![worker("w-fast", 2), worker("w-slow", 1)],
        };
        let text = status_tables(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7, "{text}");
        let col = |line: &str, s: &str| line.find(s).unwrap_or_else(|| panic!("{s} in {line}"));
        assert_eq!(col(lines[0], "STATE"), col(lines[2], "ENGAGED"));
        assert_eq!(col(lines[0], "ACKNOWLEDGED"), col(lines[1], "yes (2 live)"));
        assert_eq!(col(lines[0], "ACKNOWLEDGED"), col(lines[2], "NO: w-slow"));
        assert!(lines[2].ends_with("incident 42"), "{}", lines[2]);
        assert_eq!(lines[3], "");
        assert_eq!(col(lines[4], "MODE"), col(lines[5], "listening"));
        assert_eq!(col(lines[4], "LAST DESTRUCTIVE"), col(lines[5], "- "));
        // The second timestamp of the row (the first is the heartbeat).
        assert_eq!(
            Some(col(lines[4], "LAST DESTRUCTIVE")),
            lines[6].rfind(&rfc3339(at))
        );
        assert!(lines[6].starts_with("w-slow ") && lines[6].ends_with("polling"));
        let none = Status {
            workers: vec![],
            ..status
        };
        assert!(status_tables(&none).ends_with("\nno live workers\n"));
    }
}
