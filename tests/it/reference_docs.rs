//! The generated references in `docs/reference/` are what the code says: the CLI reference from
//! the clap definitions, the policy reference from the policy types. A stale file fails here;
//! `GPU_GUARD_BLESS=1 cargo test --test it reference_docs` rewrites both.

use std::path::PathBuf;

fn check_fresh(relative: &str, generated: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative);
    if std::env::var_os("GPU_GUARD_BLESS").is_some() {
        std::fs::write(&path, generated).expect("write the reference");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{relative} is stale: run `GPU_GUARD_BLESS=1 cargo test --test it reference_docs` and \
         commit the result"
    );
}

#[test]
fn the_cli_reference_is_generated_from_the_command_line() {
    check_fresh(
        "docs/reference/cli.md",
        &gpu_guard::cli::reference::markdown(),
    );
}

#[test]
fn the_policy_reference_is_generated_from_the_policy_types() {
    check_fresh(
        "docs/reference/policy.md",
        &gpu_guard_core::policy::reference::markdown(),
    );
}
