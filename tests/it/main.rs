//! The integration tests of the `gpu-guard` binary and of the crates working together, as one
//! test binary (one link instead of one per file).

mod reviews;
mod source;
mod support;

mod avoid;
mod cli;
mod cluster;
mod controller;
mod controller_conditions;
mod controller_lease;
mod controller_memory;
mod controller_nodes;
mod controller_pods;
mod controller_stuck;
mod controller_suspect;
mod corpus;
mod dra;
mod fuzz;
mod gang;
mod hints;
mod install;
mod properties;
mod reapply;
mod reference_docs;
mod retry_loop;
mod server;
mod simulate;
mod validate;
