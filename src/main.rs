//! `deprov`: parses the command line and dispatches to [`deprov::cli::run`].

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = deprov::cli::Cli::parse();
    deprov::cli::init_signals(&cli);
    deprov::cli::init_tracing(&cli);
    deprov::cli::exit(deprov::cli::run(cli).await)
}
