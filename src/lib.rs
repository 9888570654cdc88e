//! The `gpu-guard` command: its command line ([`cli`], the only module that knows clap) and the
//! rendering of `webhook-config/` as typed objects ([`install`]). The work is done by the
//! workspace's crates:
//!
//! | crate | what it owns |
//! |---|---|
//! | `gpu-guard-core` | PURE: policy, device rule, mutation engine, guard, API rules, health verdicts |
//! | `gpu-guard-manifest` | YAML and JSON manifests read and written the way kubectl does |
//! | `gpu-guard-runtime` | logging, signals, admin port; the Kubernetes client and caches |
//! | `gpu-guard-webhook` | AdmissionReview in, response out; the TLS webhook server |
//! | `gpu-guard-controller` | the node health controller and device-failure pod watcher |

pub mod cli;
pub mod install;
