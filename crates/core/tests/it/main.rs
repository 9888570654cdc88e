//! The core's integration tests, as one test binary: the API rules against what a real
//! kube-apiserver v1.36 answered, and snapshots of the engine's patched objects.

mod api_rules_fixtures;
mod snapshots;
