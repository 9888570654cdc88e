//! gpu-guard's pure core: every decision, as plain functions over typed objects.
//!
//! Nothing here talks to the network, spawns a task or reads a clock it is not given; Cargo
//! keeps it so (this crate depends on no Kubernetes client, async runtime, HTTP or TLS crate).
//! The webhook, the controller and the command line all call these functions, so they cannot
//! disagree.
//!
//! | module | what it owns |
//! |---|---|
//! | [`wellknown`], [`field`], [`decode`] | every `gpu-guard.io/*` name; `FieldPath` and `Violation`; decoding errors in words |
//! | [`kinds`] | every workload kind gpu-guard knows: API group, version, resource, mutated or judged, where its pod templates are |
//! | [`jobset`] | the JobSet API types (a JobSet's spec, a Trainer runtime's JobSet template) |
//! | [`api_rules`] | the API server's (and JobSet's webhook's) validation of what gpu-guard writes |
//! | [`policy`] | the policy file: types, defaults, loading, validation |
//! | [`devices`] | the one rule of "this container uses a device", and the DRA facts it reads |
//! | [`mutate`] | the mutation engine and the JSON Patch derived from its result |
//! | [`guard`] | the GPU-node guard: workload + cluster view -> allow, warn or deny |
//! | [`health`] | the controller's verdicts on nodes and pods |
//! | [`memory`] | a workload's device failures: what counts, where they are kept, the nodes its next pods avoid |
//! | [`simulate`] | what a Job or JobSet does when one of its pods fails, by their controllers' rules |

pub mod wellknown;

pub mod decode;
pub mod field;
pub mod kinds;

pub mod jobset;

pub mod api_rules;

pub mod policy;

pub mod devices;

pub mod guard;
pub mod mutate;

pub mod health;
pub mod memory;
pub mod simulate;
