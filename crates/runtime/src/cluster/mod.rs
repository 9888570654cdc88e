//! Everything that talks to the API server to *read* the cluster:
//! - [`client`]: the Kubernetes client from `--kubeconfig` or inferred (`KUBECONFIG`,
//!   `~/.kube/config`, in-cluster), with [`ClusterError`] messages that say how to fix what is
//!   wrong; [`config_source`] and [`config_available`] tell whether a cluster is configured at
//!   all;
//! - `reflector`: the one reflector helper (list, watch, slim, backoff, a `403` hint in the log)
//!   both components start their caches with;
//! - [`RbacRule`]: RBAC rules in the one shape the installation renders;
//! - [`ClusterCache`]: the webhook's PriorityClass, Node, DRA (ResourceClaimTemplate, ResourceClaim,
//!   DeviceClass) and device-failure memory (labelled Jobs and JobSets) caches behind the read-only
//!   [`gpu_guard_core::guard::ClusterView`] (its docs say what is cached, how it keeps up, and the RBAC
//!   it needs). The controller's caches are `gpu_guard_controller::reconcile::Caches`.

mod cache;
mod client;
mod rbac;
pub mod reflector;

pub use cache::{ClusterCache, JOBS, JOBSETS, MEMORY_LABEL, NODES, PRIORITY_CLASSES, RBAC_RULES};
pub use client::{ClusterError, ConfigSource, client, config, config_available, config_source};
pub use rbac::{READ, RbacRule};
pub use reflector::CacheStatus;
