//! What the integration tests of the caches and the controller share: one fake API server
//! ([`fake_api`]), the controller's test world ([`controller`]) and [`eventually`].
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
