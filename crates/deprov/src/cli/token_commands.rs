//! `deprov tokens create|list|revoke`: operator tokens with roles (see [`crate::queue::tokens`]),
//! on the state database directly. Creating and revoking are written to the audit log.

use serde_json::json;

use super::job_commands::{cell, rfc3339};
use super::{StateDb, cli_pool};
use crate::db::{self, Bounds};
use crate::queue::tokens::{self, Role, TokenInfo};

/// `deprov tokens`.
#[derive(Debug, Clone, clap::Args)]
pub struct TokensArgs {
    /// The state database.
    #[command(flatten)]
    pub db: StateDb,
    /// Print JSON instead of tables and sentences.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub action: TokensAction,
}

/// Who acts and why, for the audit log; the reason is optional here.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenActing {
    /// Why (1..=1000 characters; written to the audit log).
    #[arg(long)]
    pub reason: Option<String>,
    /// Who is acting, recorded as `cli:<actor>` (default: `cli`).
    #[arg(long, env = "DEPROV_ACTOR")]
    pub actor: Option<String>,
}

/// `create`, `list` or `revoke`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum TokensAction {
    /// Create a token and print it once (it is stored only as its SHA-256 digest).
    Create {
        /// The token's name: the audit actor of what is done with it (A-Z a-z 0-9 . _ @ -).
        #[arg(long)]
        name: String,
        /// `read-only` (GET routes) or `operator` (also changes state).
        #[arg(long, value_enum)]
        role: Role,
        /// Who and why.
        #[command(flatten)]
        acting: TokenActing,
    },
    /// Tokens newest first (never the tokens themselves).
    List {
        /// Also revoked tokens.
        #[arg(long)]
        all: bool,
    },
    /// Revoke a token by name or ID; servers refuse it within `[operator_tokens] cache_ttl`.
    Revoke {
        /// The token's name or ID.
        token: String,
        /// Who and why.
        #[command(flatten)]
        acting: TokenActing,
    },
}

fn acting(acting: &TokenActing, default_reason: &str) -> anyhow::Result<(String, String)> {
    let reason = super::acting::cli_reason(acting.reason.as_deref(), default_reason)?;
    Ok((
        super::acting::cli_actor(acting.actor.as_deref()),
        reason.to_owned(),
    ))
}

/// The table `deprov tokens list` prints: one line per token under a header.
pub fn tokens_table(rows: &[TokenInfo]) -> String {
    let mut out = format!(
        "{} {} {} {} {} {} {}\n",
        cell("ID", 36),
        cell("NAME", 20),
        cell("ROLE", 9),
        cell("CREATED", 20),
        cell("CREATED BY", 16),
        cell("LAST USED", 20),
        "REVOKED"
    );
    for t in rows {
        let revoked = t.revoked_at.map_or("-".to_owned(), |at| {
            format!(
                "{} by {}",
                rfc3339(at),
                t.revoked_by.as_deref().unwrap_or("?")
            )
        });
        out.push_str(&format!(
            "{} {} {} {} {} {} {revoked}\n",
            cell(&t.id.to_string(), 36),
            cell(&t.name, 20),
            cell(&t.role, 9),
            cell(&rfc3339(t.created_at), 20),
            cell(&t.created_by, 16),
            cell(&t.last_used_at.map_or("never".to_owned(), rfc3339), 20),
        ));
    }
    out
}

async fn run_with(pool: &sqlx::PgPool, args: &TokensArgs) -> anyhow::Result<String> {
    let out = match &args.action {
        TokensAction::Create {
            name,
            role,
            acting: a,
        } => {
            let (who, reason) = acting(a, "created from the command line")?;
            let mut tx = db::begin(pool, Bounds::STATE).await?;
            let (info, token) = tokens::create(&mut tx, name, *role, &who, &reason).await?;
            tx.commit().await?;
            if args.json {
                json!({"token": token, "id": info.id, "name": info.name, "role": info.role})
                    .to_string()
            } else {
                eprintln!(
                    "token {:?} ({}, id {}) created; it is printed below, and only now: \
                     send it as `Authorization: Bearer <token>`",
                    info.name, info.role, info.id
                );
                token
            }
        }
        TokensAction::List { all } => {
            let mut tx = db::begin(pool, Bounds::STATE).await?;
            let rows = tokens::list(&mut *tx, *all).await?;
            tx.commit().await?;
            if args.json {
                json!({ "tokens": rows }).to_string()
            } else {
                tokens_table(&rows).trim_end().to_owned()
            }
        }
        TokensAction::Revoke { token, acting: a } => {
            let (who, reason) = acting(a, "revoked from the command line")?;
            let mut tx = db::begin(pool, Bounds::STATE).await?;
            let info = tokens::revoke(&mut tx, token, &who, &reason).await?;
            tx.commit().await?;
            if args.json {
                serde_json::to_string(&info)?
            } else {
                format!(
                    "token {:?} ({}, id {}) revoked; servers refuse it within [operator_tokens] cache_ttl",
                    info.name, info.role, info.id
                )
            }
        }
    };
    Ok(out)
}

/// Runs `deprov tokens` and returns what it prints on stdout (without the final newline): for
/// `create`, the token alone (or JSON with it); for `list`, the table or JSON; for `revoke`, a
/// sentence or the revoked token's row as JSON. Notes go to stderr.
///
/// # Errors
/// Database errors, a bad name, a name in use, or no such token.
pub async fn execute(args: &TokensArgs) -> anyhow::Result<String> {
    args.db.pooler_mode.apply();
    let pool = cli_pool(&args.db.database_url).await?;
    let result = run_with(&pool, args).await;
    pool.close().await; // see plan_command
    result
}

/// Runs `deprov tokens`, printing [`execute`]'s output.
///
/// # Errors
/// As [`execute`].
pub async fn run(args: TokensArgs) -> anyhow::Result<()> {
    println!("{}", execute(&args).await?);
    Ok(())
}
