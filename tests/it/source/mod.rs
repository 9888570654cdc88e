//! The workspace's source as `hints.rs` reads it: its Rust files, and the code of a file
//! without its tests.

use std::path::{Path, PathBuf};

/// `src/` and every `crates/*/src/`.
pub fn sources() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("src")];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        dirs.push(entry.unwrap().path().join("src"));
    }
    dirs.sort();
    dirs
}

/// Every `.rs` file below `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files.sort();
    files
}

/// Whether a whole file is test code (`guard/tests.rs`, `x_tests.rs`).
pub fn is_test_file(path: &Path) -> bool {
    path.file_stem()
        .is_some_and(|s| s == "tests" || s.to_string_lossy().ends_with("_tests"))
}

/// A file without its inline test module (`#[cfg(test)] mod tests { ... }`, last in a file);
/// a `#[cfg(test)] mod tests;` that names another file (near the top of `guard/mod.rs`) is not
/// the end of the code.
pub fn non_test_code(text: &str) -> &str {
    for (at, marker) in text.match_indices("#[cfg(test)]") {
        let rest = text[at + marker.len()..].trim_start();
        let item = rest.lines().next().unwrap_or_default().trim_end();
        if item.starts_with("mod ") && item.ends_with('{') {
            return &text[..at];
        }
    }
    text
}
