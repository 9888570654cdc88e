//! The generated references in `docs/reference/` are what the code says: the CLI reference from
//! the clap definitions, the policy reference from the policy types. A stale file fails here;
//! `GPU_GUARD_BLESS=1 cargo test --test reference_docs` rewrites both. The code layout list
//! (`benches/layout/code-order.txt`) is generated from a run under callgrind, which a test cannot
//! do; its form is checked here.

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
        "{relative} is stale: run `GPU_GUARD_BLESS=1 cargo test --test reference_docs` and \
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
        &gpu_guard::policy::reference::markdown(),
    );
}

/// The release binary's code layout (build.rs, docs/DEVELOPMENT.md#code-layout): lld reads one
/// symbol a line, and skips the names it does not know, so a damaged list would not fail the
/// build; it would only put the request path back among the rest. Each line is one symbol, once,
/// and the list names the request path and the controller's pod cache.
#[test]
fn the_code_layout_list_is_one_symbol_a_line_and_names_the_hot_paths() {
    let relative = "benches/layout/code-order.txt";
    let text = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative))
        .expect("the code layout list (benches/layout/record.sh writes it)");
    let names: Vec<&str> = text.lines().collect();
    let mut seen = std::collections::HashSet::new();
    for (at, name) in names.iter().enumerate() {
        let line = at + 1;
        assert!(
            !name.is_empty() && !name.contains(char::is_whitespace),
            "{relative}:{line}: {name:?} is not a symbol name; rerun benches/layout/record.sh"
        );
        assert!(
            seen.insert(name),
            "{relative}:{line}: {name} is named twice"
        );
    }
    assert!(
        names.len() > 1000,
        "{relative}: {} names; a run of serve and controller runs about 3,000 functions",
        names.len()
    );
    // The handler, ahead of what runs only at start-up (the CLI parser).
    let position = |part: &str| names.iter().position(|name| name.contains(part));
    let review = position("9gpu_guard9admission6review").expect("the request path is listed");
    assert!(
        position("gpu_guard10controller9reconcile4pods").is_some(),
        "{relative}: the controller's pod cache is not listed"
    );
    let clap = position("12clap_builder").expect("start-up code (the CLI parser) is listed");
    assert!(
        review < clap,
        "{relative}: start-up code is ahead of the request path"
    );
}
