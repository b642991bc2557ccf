//! `deprov`: parses the command line and dispatches to [`deprov::cli::run`].

use clap::Parser;

/// mimalloc instead of glibc's malloc: `deprov-lab bench intake` spent about a fifth of the process's
/// CPU in glibc's malloc and free (measured with perf), and the HTTP path allocates per request.
///
/// Built with the `no_thp` feature (the workspace's `Cargo.toml`): mimalloc does not ask the kernel
/// for transparent huge pages (`madvise(MADV_HUGEPAGE)`). It returns freed memory to the kernel in
/// small ranges, and a huge page faulted in again after that is zeroed whole (2 MiB) by the
/// kernel; under the cascade pre-check's reads that zeroing took most of the process's CPU. On
/// hosts with `transparent_hugepage/enabled = always`, `MIMALLOC_ALLOW_THP=0` (set in the
/// container image) turns them off for the process.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = deprov::cli::Cli::parse();
    deprov::cli::init_signals(&cli);
    deprov::cli::init_tracing(&cli);
    deprov::cli::exit(deprov::cli::run(cli).await)
}
