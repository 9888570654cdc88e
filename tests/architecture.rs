//! The layout is the architecture: a module imports only modules of lower layers (the order
//! of `LAYERS`, which is the crate map in `src/lib.rs`), so there are no import cycles, and
//! the map in `lib.rs` names every top-level module. Test code (a file's inline `#[cfg(test)]`
//! module, and files of tests) is not counted: a test may use anything.

use std::collections::BTreeMap;
use std::path::Path;

mod source;
use source::{is_test_file, non_test_code, rust_files, src};

/// Lowest first; modules in one layer do not import each other.
const LAYERS: &[&[&str]] = &[
    &["wellknown", "field", "decode"],
    &["rules"],
    &["policy"],
    &["mutate", "guard"],
    &["manifest"],
    &["admission"],
    &["cluster"],
    &["process"],
    &["controller", "server"],
    &["install"],
    &["cli"],
];

/// The top-level module a file belongs to (`None` for `lib.rs` and `main.rs`).
fn unit(path: &Path) -> Option<String> {
    let relative = path.strip_prefix(src()).unwrap();
    let first = relative.components().next()?.as_os_str().to_string_lossy();
    let name = first.trim_end_matches(".rs").to_owned();
    (!matches!(name.as_str(), "lib" | "main")).then_some(name)
}

fn layer(unit: &str) -> usize {
    LAYERS
        .iter()
        .position(|layer| layer.contains(&unit))
        .unwrap_or_else(|| panic!("src/{unit} is in no layer of tests/architecture.rs"))
}

/// Every `crate::x` a module's non-test code names, with the file and line.
fn imports() -> BTreeMap<(String, String), String> {
    let mut found = BTreeMap::new();
    for file in rust_files(&src()) {
        let Some(from) = unit(&file) else { continue };
        let text = std::fs::read_to_string(&file).unwrap();
        // A file whose only content is tests (e.g. `guard/tests.rs`) is test code too.
        if is_test_file(&file) {
            continue;
        }
        let code = non_test_code(&text);
        for (number, line) in code.lines().enumerate() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for (at, _) in line.match_indices("crate::") {
                let to: String = line[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if to != from && !to.is_empty() {
                    found
                        .entry((from.clone(), to))
                        .or_insert_with(|| format!("{}:{}", file.display(), number + 1));
                }
            }
        }
    }
    found
}

#[test]
fn modules_import_only_lower_layers() {
    let imports = imports();
    // The scan sees the imports it must (a scan that found nothing would pass anything).
    for edge in [
        ("mutate", "policy"),
        ("cli", "install"),
        ("server", "admission"),
    ] {
        let edge = (edge.0.to_owned(), edge.1.to_owned());
        assert!(imports.contains_key(&edge), "{edge:?} not found");
    }
    let upward: Vec<String> = imports
        .into_iter()
        .filter(|((from, to), _)| layer(to) >= layer(from))
        .map(|((from, to), at)| format!("{from} -> {to} ({at})"))
        .collect();
    assert!(
        upward.is_empty(),
        "imports of the same or a higher layer:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_crate_map_in_lib_rs_names_every_module_in_its_layer() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|name| name.trim_end_matches(';'))
        .collect();
    let layered: Vec<&str> = LAYERS
        .iter()
        .flat_map(|layer| layer.iter().copied())
        .collect();
    let mut sorted_declared = declared.clone();
    sorted_declared.sort_unstable();
    let mut sorted_layered = layered.clone();
    sorted_layered.sort_unstable();
    assert_eq!(
        sorted_declared, sorted_layered,
        "lib.rs and LAYERS disagree"
    );
    for module in declared {
        assert!(
            lib.contains(&format!("[`{module}`]")),
            "the crate map in lib.rs does not name {module}"
        );
    }
}
