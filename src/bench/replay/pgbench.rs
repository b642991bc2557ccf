//! PostgreSQL's own `pgbench` with a one-statement custom script: the single-row `INSERT` rate the
//! server sustains, the yardstick for intake's throughput. It runs from the server's binary
//! directory (`DEPROV_PG_BIN` or Debian's `/usr/lib/postgresql/<version>/bin`), as `postgres` when we
//! are root, against database `deprov`, table `public.bench_pgbench_insert` (made here).

use std::process::Stdio;

use serde::Serialize;
use sqlx::PgPool;

use super::ReplayError;
use deprov_testkit::{chown_to_postgres, find_bin_dir, is_root};

/// The custom script: one autocommitted single-row `INSERT` per transaction.
const SCRIPT: &str = "\\set t random(1, 2000000000)\n\
                      INSERT INTO public.bench_pgbench_insert (tenant) VALUES (:t);\n";

/// What one pgbench run measured.
#[derive(Debug, Clone, Serialize)]
pub struct PgbenchResult {
    /// Transactions per second, without connection time (pgbench's `tps =` line).
    pub tps: f64,
    /// Transactions processed (pgbench's count).
    pub transactions: i64,
    /// Rows the run added to the table (counted afterwards; equals `transactions`).
    pub rows: i64,
}

/// Creates the table pgbench inserts into (in the database `pool` is on).
///
/// # Errors
/// Query errors.
pub async fn prepare(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS public.bench_pgbench_insert (
           id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
           tenant text NOT NULL,
           received_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Runs `pgbench -n -c clients -j 2 -T secs -M mode -f script` against `127.0.0.1:port`, database
/// `deprov`; `pool` (on `deprov`, direct) counts the rows. `mode` is `prepared` directly and
/// `extended` (unnamed statements) through a transaction pooler.
///
/// # Errors
/// [`ReplayError::Run`] when pgbench is missing, fails or prints no `tps`.
pub async fn run(
    pool: &PgPool,
    port: u16,
    clients: u32,
    secs: u64,
    mode: &str,
) -> Result<PgbenchResult, ReplayError> {
    let bin = find_bin_dir()?.join("pgbench");
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("insert.sql");
    std::fs::write(&script, SCRIPT)?;
    chown_to_postgres(dir.path())?;
    let mut cmd = if is_root() {
        let mut c = tokio::process::Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&bin);
        c
    } else {
        tokio::process::Command::new(&bin)
    };
    cmd.args([
        "-h",
        "127.0.0.1",
        "-U",
        "postgres",
        "-n",
        "-j",
        "2",
        "-M",
        mode,
    ])
    .arg("-p")
    .arg(port.to_string())
    .arg("-c")
    .arg(clients.to_string())
    .arg("-T")
    .arg(secs.to_string())
    .arg("-f")
    .arg(&script)
    .arg("deprov")
    .stdin(Stdio::null());
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM public.bench_pgbench_insert")
        .fetch_one(pool)
        .await?;
    let out = cmd
        .output()
        .await
        .map_err(|e| ReplayError::Run(format!("{}: {e}", bin.display())))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(ReplayError::Run(format!(
            "pgbench failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM public.bench_pgbench_insert")
        .fetch_one(pool)
        .await?;
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
    };
    let tps = field("tps = ")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ReplayError::Run(format!("pgbench printed no tps: {text}")))?;
    let transactions = field("number of transactions actually processed:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok(PgbenchResult {
        tps,
        transactions,
        rows: after - before,
    })
}
