//! `deprov`: parses the command line and dispatches to [`deprov::cli::run`].

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    deprov::cli::init_tracing();
    deprov::cli::run(deprov::cli::Cli::parse()).await
}
