//! The `deprov-lab` command line: `demo` (the end-to-end demo on a throwaway PostgreSQL) and
//! `bench …` (the benchmarks). Both run servers of their own and stop them before they return. Logs
//! go to stderr at `warn` unless `RUST_LOG` says otherwise: the report on stdout is the output.

use clap::{Parser, Subcommand};

use crate::bench;

/// `deprov-lab`: deprov's demo and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "deprov-lab", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
    /// Log line format on stderr: `text` or `json` (JSON lines).
    #[arg(long, global = true, env = "DEPROV_LOG_FORMAT", value_enum, ignore_case = true, default_value_t = deprov::cli::LogFormat::Text)]
    pub log_format: deprov::cli::LogFormat,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the end-to-end demo on a throwaway PostgreSQL.
    Demo(deprov_demo::run::DemoArgs),
    /// Benchmarks on a throwaway PostgreSQL, or on a copy of your own database
    /// (`bench delete --target-url`).
    #[command(subcommand)]
    Bench(Box<BenchCommand>),
}

/// `deprov-lab bench …`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// deprov's hard delete against the naive cascading DELETE, same data, same run, same load.
    Delete(bench::BenchArgs),
    /// Incident 1 replayed through PgBouncer: a cascading DELETE and 20 retries versus deprov, under
    /// other tenants' traffic.
    CascadeIncident(bench::replay::cascade::CascadeArgs),
    /// Incident 2 replayed through PgBouncer: a 3x burst with short caller deadlines, deprov's intake
    /// versus a client that closes its connection when the deadline fires.
    DeadlineIncident(bench::replay::deadline::DeadlineArgs),
    /// Intake's accepted-and-durable requests/s beside pgbench's single-row INSERT rate, and its p99
    /// with the target database saturated with lock waits.
    Intake(bench::replay::intake::IntakeArgs),
    /// `bench delete --target-url` over generated SaaS schemas (20–80 tables in the tenant's
    /// cascade, unindexed foreign keys, skew, trees, cycles, partitions): a large and a small tenant
    /// per seed, the worst and median ratio and longest transaction.
    Corpus(bench::corpus::CorpusArgs),
}

/// Prints a report: as JSON, or its text.
fn print_report(json: bool, report: &impl serde::Serialize, text: &str) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{text}");
    }
    Ok(())
}

/// Runs one parsed command line.
///
/// # Errors
/// Whatever the subcommand fails with; a demo whose checks fail, and a benchmark whose copy
/// differs from the cascade's, are errors too.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let bench = match cli.command {
        Command::Demo(args) => {
            let outcome = deprov_demo::run::run(&args).await?;
            anyhow::ensure!(outcome.passed(), "demo checks failed: {outcome:?}");
            println!("\ndemo passed");
            return Ok(());
        }
        Command::Bench(bench) => *bench,
    };
    match bench {
        BenchCommand::Delete(args) => {
            if let Some(mut target) = args.target.resolve()? {
                target.quiet = args.json;
                let report = bench::target::run(&target).await?;
                print_report(args.json, &report, &report.to_text())?;
                anyhow::ensure!(
                    report.equals_cascade,
                    "deprov's result differs from the cascade's in {}",
                    report.differing_tables.join(", ")
                );
                return Ok(());
            }
            let report = bench::run(&args).await?;
            print_report(args.json, &report, &report.to_text())?;
            anyhow::ensure!(
                report.equals_cascade,
                "deprov's result differs from the cascade's"
            );
        }
        BenchCommand::CascadeIncident(args) => {
            let report = bench::replay::cascade::run(&args).await?;
            print_report(args.json, &report, &report.to_text())?;
        }
        BenchCommand::DeadlineIncident(args) => {
            let report = bench::replay::deadline::run(&args).await?;
            print_report(args.json, &report, &report.to_text())?;
        }
        BenchCommand::Corpus(args) => {
            let report = bench::corpus::run(&args).await?;
            print_report(args.json, &report, &report.to_text())?;
            anyhow::ensure!(
                report.all_equal,
                "a run failed or deprov's result differs from the cascade's (see the table)"
            );
        }
        BenchCommand::Intake(args) => {
            let report = bench::replay::intake::run(&args).await?;
            print_report(args.json, &report, &report.to_text())?;
        }
    }
    Ok(())
}
