//! What the integration tests of the caches and the controller share: one fake API server
//! ([`fake_api`]), the controller's test world ([`controller`]), [`eventually`], and
//! [`run_in_process`] for a command that must reach the fake from this process.
//!
//! Each test binary uses a subset, hence `dead_code` allowed here.
#![allow(dead_code)]

pub mod controller;
pub mod fake_api;

use std::time::{Duration, Instant};

/// How long a test waits for a cache (or the fake) to reach an expected state.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Polls `check` until it holds, failing the test after [`DEADLINE`].
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What a command run by [`run_in_process`] wrote, and its exit status.
#[derive(Debug)]
pub struct Ran {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

/// Runs `args` (the program name first) in this process through the binary's own entry point,
/// `gpu_guard::cli::run_with`, with in-memory writers. Call it off a Tokio runtime's threads:
/// the long-running and `--kubeconfig` commands start a runtime of their own.
pub fn run_in_process<I, T>(args: I) -> Ran
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::Parser as _;
    let cli = gpu_guard::cli::Cli::parse_from(args);
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let exit_code = gpu_guard::cli::run_with(&cli, &mut stdout, &mut stderr);
    Ran {
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        exit_code,
    }
}
