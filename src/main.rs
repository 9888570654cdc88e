//! The `gpu-guard` binary: parse the command line, run the command, exit with its status.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc malloc: the request path allocates many small objects, and glibc's
/// malloc and free cost about a fifth of the server's CPU under load (measured with perf).
/// Transparent huge pages are off (`no_thp`): with them, resident memory under load doubled.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use gpu_guard::cli::{Cli, run};

fn main() -> ExitCode {
    // One TLS crypto provider for the whole dependency tree, chosen here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let report = run(&cli);
    // A closed pipe (`gpu-guard mutate ... | head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(report.stdout.as_bytes());
    let _ = std::io::stderr().lock().write_all(report.stderr.as_bytes());
    ExitCode::from(u8::try_from(report.exit_code).unwrap_or(1))
}
