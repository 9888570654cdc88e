//! The `gpu-guard` binary: parse the command line, run the command, exit with its status.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc malloc: the request path allocates many small objects, and glibc's
/// malloc and free cost about a fifth of the server's CPU under load (measured with perf).
/// Transparent huge pages are off (`no_thp`): with them, resident memory under load doubled.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use gpu_guard::cli::{Cli, run_with, usage_error_json};

/// 256 MiB of address space (only the pages used are backed by memory).
const COMMAND_STACK_BYTES: usize = 256 << 20;

fn main() -> ExitCode {
    // One TLS crypto provider for the whole dependency tree, chosen here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => {
            // `-o json` promises one JSON document on stdout, even for a refused command line.
            if error.use_stderr()
                && let Some(json) = usage_error_json(&args, &error.to_string())
            {
                let _ = std::io::stdout().lock().write_all(json.as_bytes());
            }
            error.exit();
        }
    };
    // stdout is buffered (documents are written as they are done); stderr is not, so each
    // note appears as it happens. A closed pipe (`gpu-guard mutate ... | head`) ends the
    // output quietly.
    // The command runs on a thread with a large stack: documents may nest 1000 levels deep
    // (manifest::Limits), and every walk over a document recurses once per level. Neither
    // stream is locked for the run: the servers' threads log to stderr.
    let code = std::thread::Builder::new()
        .name("main-command".to_owned())
        .stack_size(COMMAND_STACK_BYTES)
        .spawn(move || {
            let mut stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout());
            let code = run_with(&cli, &mut stdout, &mut std::io::stderr());
            let _ = stdout.flush();
            code
        })
        .expect("the command thread starts")
        .join()
        .unwrap_or(101);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
