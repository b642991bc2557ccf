//! `deprov-lab`: parses the command line and dispatches to [`deprov_lab::cli::run`].

use clap::Parser;

/// mimalloc, as the `deprov` binary uses and built alike (`no_thp`, see its `main.rs`): the
/// benchmarks measure the service as it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = deprov_lab::cli::Cli::parse();
    deprov::cli::init_tracing_with(cli.log_format, "warn,sqlx=error");
    deprov::cli::exit(deprov_lab::cli::run(cli).await)
}
