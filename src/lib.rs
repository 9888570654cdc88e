//! gpu-guard keeps AI/ML batch work on Kubernetes alive through GPU and other device failures.
//!
//! The crate map, lowest layer first. A module imports only modules above it in this list
//! (`tests/architecture.rs` checks it):
//!
//! | layer | modules | what they own |
//! |---|---|---|
//! | vocabulary | [`wellknown`], [`field`], [`decode`] | every `gpu-guard.io/*` name, port and path; `FieldPath` and `Violation`; decoding errors in words (field, no Rust types) |
//! | the API's rules | [`rules`] | PURE: the API server's validation of what gpu-guard writes |
//! | policy | [`policy`] | the policy file: types, defaults, loading, validation, the device rule |
//! | engines | [`mutate`], [`guard`] | PURE: the mutation engine (and its JSON Patch), the GPU-node guard |
//! | manifests | [`manifest`] | YAML and JSON manifests read and written the way kubectl does |
//! | admission | [`admission`] | AdmissionReview bytes in, AdmissionReview bytes out; no transport |
//! | cluster | [`cluster`] | the Kubernetes client, the reflector helper, the webhook's caches |
//! | processes | [`process`], [`server`], [`controller`] | logging, signals, admin port; the webhook server; the node health controller |
//! | installation | [`install`] | `webhook-config/` as typed objects |
//! | command line | [`cli`] | clap: one file per command, flags resolved into each module's settings |
//!
//! The pure core (`rules`, `policy`, `mutate`, `guard`) knows nothing of HTTP, TLS or the API
//! server. The webhook and the CLI run the same engine ([`mutate::mutate_job`]) and the same
//! guard ([`guard::judge`]); the webhook reaches the engine through a decoder that reads only
//! what the engine needs from the JSON text ([`mutate::object::mutate_job_json`]), the CLI
//! through a whole JSON value ([`mutate::object::mutate_object`]), and a property test proves
//! the two give the same patch.

pub mod wellknown;

pub mod decode;
pub mod field;

pub mod rules;

pub mod policy;

pub mod guard;
pub mod mutate;

pub mod manifest;

pub mod admission;

pub mod cluster;

pub mod controller;
pub mod process;
pub mod server;

pub mod install;

pub mod cli;
