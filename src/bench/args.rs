//! `deprov-lab bench delete`'s arguments (with `--target-url`, a run on the user's database), and the
//! parsers of its flags.

use std::path::PathBuf;

use super::error::TargetError;

/// `deprov-lab bench delete` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Rows of the deleted tenant, over all its tables (the load makes a little more).
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Other tenants (about 2,000 rows each); the foreground works on them.
    #[arg(long, default_value_t = 60)]
    pub small_tenants: u32,
    /// `[hard_delete] batch_rows`: the first batch's rows (later batches are sized by time).
    #[arg(long, default_value_t = 50)]
    pub batch_rows: u32,
    /// `[hard_delete] max_batch_duration` in ms: the longest transaction the sizing aims under.
    #[arg(long, default_value_t = 100)]
    pub max_batch_ms: u64,
    /// `[hard_delete] checkpoint_interval` in ms: batches between durable checkpoints commit with
    /// `synchronous_commit = off` (0 = every batch durable and checkpointed).
    #[arg(long, default_value_t = 1000)]
    pub checkpoint_interval_ms: u64,
    /// `[hard_delete] whole_cascade = false`: the tenant goes in batches even when its whole
    /// cascade fits one transaction of the batch bound.
    #[arg(long)]
    pub no_whole_cascade: bool,
    /// `[pacing] rate_limit` in rows/s (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub rate_limit: u32,
    /// `[pacing] duty_cycle` of deprov's job, 0.0001..=1 (1 = no rest).
    #[arg(long, default_value_t = 1.0, value_parser = parse_duty_cycle)]
    pub duty_cycle: f64,
    /// Seconds deprov's worker runs in the paced window: deprov on a third copy of the database
    /// with `[pacing] duty_cycle` = `--paced-duty-cycle`, under the same foreground and tenant
    /// writer, in segments of `--paced-segment-secs` each after one with no worker (the
    /// interleaved baseline), until this long or the job completed (a 1M-row tenant takes minutes
    /// at the default duty cycle); 0 = no paced window. The window's wall time is about twice it.
    #[arg(long, default_value_t = 60)]
    pub paced_secs: u64,
    /// Seconds of each segment of the paced window (at least 1).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub paced_segment_secs: u64,
    /// `[pacing] duty_cycle` of the paced window, 0.0001..=1.
    #[arg(long, default_value_t = 0.0025, value_parser = parse_duty_cycle)]
    pub paced_duty_cycle: f64,
    /// Foreground clients (each its own connection).
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Operations per second of each foreground client and of the tenant writer. With the defaults
    /// the foreground makes 800 operations/s, so a phase of 1.5 s rests its p99 on ~1,200 samples.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// Seconds of foreground (and tenant writer) with no deletion, before the deletions and again
    /// after them; the foreground's baseline p99 pools both. A short baseline's p99 varies more
    /// between its halves than the 1.25× the paced window is held to.
    #[arg(long, default_value_t = 15)]
    pub baseline_secs: u64,
    /// The server's `shared_buffers`.
    #[arg(long, default_value = "1GB")]
    pub shared_buffers: String,
    /// The server's `max_wal_size`.
    #[arg(long, default_value = "4GB")]
    pub max_wal_size: String,
    /// More server settings, `name=value` (repeatable; passed as `postgres -c name=value`), for
    /// measuring what a setting does: `--server-setting autovacuum=off`,
    /// `--server-setting wal_compression=lz4`.
    #[arg(long = "server-setting", value_name = "NAME=VALUE", value_parser = parse_setting)]
    pub server_settings: Vec<(String, String)>,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// On the user's own database instead of the demo's (`--target-url`, `--tenant`, `--config`).
    #[command(flatten)]
    pub target: TargetArgs,
}

/// `name=value` of `--server-setting`: a name of letters, digits, `_` and `.`, then `=` and a value
/// of letters, digits and `_ . , : / + - % @` (the server's options are one `pg_ctl -o` string,
/// which a shell splits: a `|` or `;` would be the shell's).
pub(crate) fn parse_setting(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        return Err(format!("not a setting name: {name:?}"));
    }
    // `pg_ctl -o` hands the options to a shell: only characters no shell gives a meaning to.
    if value.is_empty()
        || !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.,:/+-%@".contains(c))
    {
        return Err(format!(
            "a value of letters, digits and _ . , : / + - % @ is needed (it goes to `pg_ctl -o` \
             through a shell), got {value:?}"
        ));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// A `--duty-cycle` / `--paced-duty-cycle` value: a number from 0.0001 to 1, as `[pacing]
/// duty_cycle` takes it — refused when the command line is read, not after the phases before it ran.
pub(crate) fn parse_duty_cycle(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(d) if (0.0001..=1.0).contains(&d) => Ok(d),
        _ => Err(format!(
            "a share of wall time from 0.0001 to 1 is needed (as [pacing] duty_cycle), got {s:?}"
        )),
    }
}

/// The flags of `deprov-lab bench delete` that run it on the user's database.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TargetArgs {
    /// Run on this database (a `postgres://` URL) instead of the demo's: two copies of it are made
    /// on its server with `CREATE DATABASE … TEMPLATE`, which needs no other session connected to
    /// it. The demo's flags (`--rows`, `--clients`, `--batch-rows`, …) are then not used.
    #[arg(long, value_name = "URL", requires = "tenant")]
    pub target_url: Option<String>,
    /// The tenant key to delete, as a deletion request gives it (with `--target-url`).
    #[arg(long, value_name = "KEY", requires = "target_url")]
    pub tenant: Option<String>,
    /// deprov's configuration file (with `--target-url`); its `[tenant]`, `[soft_delete]`,
    /// `[hard_delete]`, `[pacing]`, `[worker]` and `[pools]` are used, its sources are not read.
    #[arg(long, value_name = "FILE", env = "DEPROV_CONFIG")]
    pub config: Option<PathBuf>,
    /// Keep the two copies and the state database instead of dropping them at the end.
    #[arg(long)]
    pub keep_copies: bool,
}

impl TargetArgs {
    /// The run these flags ask for; `None` without `--target-url` (the demo's benchmark).
    ///
    /// # Errors
    /// [`TargetError::NoConfig`] with `--target-url` but no configuration file.
    pub fn resolve(&self) -> Result<Option<TargetRun>, TargetError> {
        let (Some(url), Some(tenant)) = (&self.target_url, &self.tenant) else {
            return Ok(None);
        };
        Ok(Some(TargetRun {
            url: url.clone(),
            tenant: tenant.clone(),
            config: self.config.clone().ok_or(TargetError::NoConfig)?,
            keep_copies: self.keep_copies,
            quiet: false,
        }))
    }
}

/// One run on the user's database.
#[derive(Debug, Clone)]
pub struct TargetRun {
    /// The user's database.
    pub url: String,
    /// The tenant key.
    pub tenant: String,
    /// deprov's configuration file.
    pub config: PathBuf,
    /// Keep the copies and the state database.
    pub keep_copies: bool,
    /// Print no progress lines on stderr (as with `--json`).
    pub quiet: bool,
}

#[cfg(test)]
mod tests {
    use super::{parse_duty_cycle, parse_setting};

    #[test]
    fn duty_cycles_are_refused_when_the_command_line_is_read() {
        assert_eq!(parse_duty_cycle("0.0025"), Ok(0.0025));
        assert_eq!(parse_duty_cycle("1"), Ok(1.0));
        assert_eq!(parse_duty_cycle("1e-4"), Ok(0.0001));
        for bad in ["0", "1.5", "-1", "nan", "inf", "0.00001", "half", ""] {
            assert!(parse_duty_cycle(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn server_settings_are_name_equals_a_value_pg_ctl_keeps_whole() {
        assert_eq!(
            parse_setting("autovacuum=off"),
            Ok(("autovacuum".into(), "off".into()))
        );
        assert_eq!(
            parse_setting("auto_explain.log_min_duration=10ms"),
            Ok(("auto_explain.log_min_duration".into(), "10ms".into()))
        );
        for bad in [
            "autovacuum",
            "=off",
            "a b=1",
            "x=",
            "x=1 -c fsync=off",
            "x='1'",
            "log_line_prefix=%m|%a",
            "x=1;touch",
            "x=$(id)",
        ] {
            assert!(parse_setting(bad).is_err(), "{bad:?} was taken");
        }
    }
}
