//! gpu-guard keeps AI/ML batch work on Kubernetes alive through GPU and other device failures.
//!
//! The pure core knows nothing of HTTP, TLS or the API server:
//! - [`policy`]: the policy file, typed, with defaults and its own validation;
//! - [`mutate`]: typed Job in, mutated Job, changes and warnings out, checked against the
//!   API server's rules ([`mutate::api_rules`]).
//!
//! Around it, [`patch`] turns the engine's changes into JSON Patch operations on the raw object
//! (so unknown fields survive), [`manifest`] reads and writes Kubernetes manifests, and [`cli`]
//! is the command line. The webhook and the CLI call the same engine.

pub mod admission;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod controller;
pub mod deploy;
pub mod field;
pub mod guard;
pub mod job_view;
pub mod manifest;
pub mod mutate;
pub mod names;
pub mod object;
pub mod patch;
pub mod policy;
pub mod server;
pub mod yaml;
pub mod yaml_in;
