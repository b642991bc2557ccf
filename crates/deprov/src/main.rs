//! `deprov`: parses the command line and dispatches to [`deprov::cli::run`].

use clap::Parser;

/// mimalloc instead of glibc's malloc: `deprov-lab bench intake` spent about a fifth of the process's
/// CPU in glibc's malloc and free (measured with perf), and the HTTP path allocates per request.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = deprov::cli::Cli::parse();
    deprov::cli::init_signals(&cli);
    deprov::cli::init_tracing(&cli);
    deprov::cli::exit(deprov::cli::run(cli).await)
}
