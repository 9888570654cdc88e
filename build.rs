//! The link layout of the release binary (docs/DEVELOPMENT.md#code-layout).
//!
//! The functions a serving or controlling gpu-guard runs are placed together, hottest first, in
//! the order of `benches/layout/code-order.txt` (lld's `--symbol-ordering-file`), instead of
//! wherever their crates put them. The kernel maps a binary's code 64 KiB at a time around each
//! page that runs, so scattered functions keep most of the 15 MB of code resident; packed, they
//! keep a few MiB, and the request path shares fewer cache lines and TLB entries with code that
//! never runs. `benches/layout/record.sh` regenerates the list from a run of the release binary.
//!
//! Only for release builds of the `gpu-guard` binary on x86_64 Linux with Rust's own lld (the
//! default linker there since Rust 1.90): another linker may not know the flag, so a configured
//! linker (`RUSTC_LINKER`, `-C linker`, `-C link-arg`s of its own) turns it off, as does
//! `GPU_GUARD_CODE_ORDER=off`. A name the binary no longer has is skipped by the linker: a stale
//! list costs memory, never correctness.

use std::env;
use std::path::Path;

const ORDER_FILE: &str = "benches/layout/code-order.txt";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={ORDER_FILE}");
    println!("cargo:rerun-if-env-changed=GPU_GUARD_CODE_ORDER");
    println!("cargo:rerun-if-env-changed=GPU_GUARD_LINK_MAP");

    let var = |name: &str| env::var(name).unwrap_or_default();
    let release = var("PROFILE") == "release";
    let rust_lld = var("TARGET") == "x86_64-unknown-linux-gnu"
        && env::var_os("RUSTC_LINKER").is_none()
        && !var("CARGO_ENCODED_RUSTFLAGS")
            .split('\x1f')
            .any(|flag| flag.contains("linker") || flag.contains("link-arg"));
    let wanted = var("GPU_GUARD_CODE_ORDER") != "off";
    let order = Path::new(&var("CARGO_MANIFEST_DIR")).join(ORDER_FILE);
    // `-Wl,` splits at commas: a checkout path with one goes without the ordering.
    let passable = !order.to_string_lossy().contains(',');
    if release && rust_lld && wanted && passable && order.is_file() {
        println!(
            "cargo:rustc-link-arg-bin=gpu-guard=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        // Names of other builds (another dependency version, another profile) are expected.
        println!("cargo:rustc-link-arg-bin=gpu-guard=-Wl,--no-warn-symbol-ordering");
    }
    // The link map that `benches/layout/record.sh` reads names and addresses from.
    let map = var("GPU_GUARD_LINK_MAP");
    if rust_lld && !map.is_empty() {
        println!("cargo:rustc-link-arg-bin=gpu-guard=-Wl,-Map={map}");
    }
}
