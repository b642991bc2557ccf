//! Who acts on the command line and why: the audit log's actor and reason of an operator command.

/// Who acts and why (recorded in the audit log).
#[derive(Debug, Clone, clap::Args)]
pub struct Acting {
    /// Why (1..=1000 characters; written to the audit log).
    #[arg(long)]
    pub reason: String,
    /// Who is acting, recorded as `cli:<actor>` (default: `cli`).
    #[arg(long, env = "DEPROV_ACTOR")]
    pub actor: Option<String>,
}

/// The audit actor and reason of `acting` ([`cli_actor`], [`cli_reason`] with no default).
///
/// # Errors
/// When the reason is blank or longer than 1000 characters.
pub(super) fn actor(acting: &Acting) -> anyhow::Result<(String, String)> {
    let reason = cli_reason(Some(&acting.reason), "")?;
    Ok((cli_actor(acting.actor.as_deref()), reason.to_owned()))
}

/// The audit actor of a CLI operator action: `cli`, or `cli:<actor>` for `--actor` / `DEPROV_ACTOR`.
pub(super) fn cli_actor(actor: Option<&str>) -> String {
    match actor.map(str::trim) {
        None | Some("") => "cli".to_owned(),
        Some(a) => format!("cli:{a}"),
    }
}

/// `--reason` trimmed, or `default` when not given; 1..=1000 characters.
///
/// # Errors
/// When the reason is blank or longer than 1000 characters.
pub(super) fn cli_reason<'a>(reason: Option<&'a str>, default: &'a str) -> anyhow::Result<&'a str> {
    let reason = reason.map_or(default, str::trim);
    anyhow::ensure!(
        !reason.is_empty() && reason.chars().count() <= 1000,
        "--reason: must be 1..=1000 characters"
    );
    Ok(reason)
}
