//! The controller's pure verdicts: [`node::node_verdict`] (is a GPU node degraded, should
//! gpu-guard's taint be added or removed) and [`pod::verdict`] (was a pod hit by a device
//! failure: mark it, evict it). The controller crate only applies them.

pub mod node;
pub mod pod;
