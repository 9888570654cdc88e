//! The node health controller and device-failure pod watcher (`gpu-guard controller`).
//!
//! The decisions are pure functions, table-tested: [`gpu_guard_core::health::node::node_verdict`] (is a GPU node
//! degraded, should gpu-guard's taint be added or removed) and [`gpu_guard_core::health::pod::verdict`] (was a pod hit
//! by a device failure: mark it, evict it). The [`reconcile::Reconciler`] only applies them,
//! from caches of Nodes, device pods' facts and opted-in Namespaces, on a timer and after watch
//! events; a pod to mark is marked from its own watch event ([`reconcile::marker`]).
//!
//! Only one replica acts at a time: the holder of a `coordination.k8s.io/v1` Lease
//! ([`lease`]). The others keep their caches warm and are ready, but change nothing.

use gpu_guard_runtime::cluster::{READ, RbacRule};

pub mod lease;
pub mod metrics;

pub mod reconcile;
pub mod run;

/// The read and write timeout of the clients that write (Lease, taints, pod conditions,
/// evictions, Events): a request the API server does not answer fails instead of hanging.
pub const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The configuration of the clients that write: [`WRITE_TIMEOUT`] for reading the answer and
/// for sending, the read timeout counted from when the request is sent, and no retries of
/// kube's own (429/503/504 would be retried up to 15 times with growing delays, past the
/// leader's deadline; the controller retries on its next pass). The watches keep a client
/// without read timeout (a watch is a long-lived response).
pub fn write_config(mut config: kube::Config) -> kube::Config {
    config.read_timeout = Some(WRITE_TIMEOUT);
    config.write_timeout = Some(WRITE_TIMEOUT);
    config.reset_reader_on_write = true;
    config.default_retry = false;
    config
}

/// What the controller reads and writes, as RBAC rules of its ClusterRole:
/// the same [`RbacRule`] shape as [`gpu_guard_runtime::cluster::RBAC_RULES`]. Why each:
/// - nodes get/list/watch/patch: judge nodes; add and remove the taint (a merge patch);
/// - pods get/list/watch: find pods hit by a device failure;
/// - pods/status patch: add the `gpu-guard.io/DeviceFailure` condition;
/// - pods/eviction create: evict hit pods (`controller.pods.evictPods`);
/// - namespaces get/list/watch: which namespaces opted in (label `gpu-guard.io/enabled`);
/// - resourceslices (`resource.k8s.io`) get/list/watch: the DRA devices of each node;
/// - resourceclaims (`resource.k8s.io`) get/list/watch: which driver allocated a pod's claims,
///   so a DRA pod on a node degraded for that driver is marked and evicted;
/// - daemonsets (`apps`) list: once at start, to warn of GPU DaemonSets that do not tolerate
///   gpu-guard's taint ([`gpu_guard_core::health::node::daemonsets`]);
/// - events (`events.k8s.io`) create/patch: kube's event recorder creates `events.k8s.io/v1`
///   Events, and patches one that repeats within minutes (an event series);
/// - nodes/status patch: add and remove the `gpu-guard.io/DeviceDegraded` Node condition
///   (a strategic merge patch of that condition alone);
/// - pods delete: force-delete pods stuck Terminating on an unreachable node, used only when
///   `controller.stuckPods.forceDelete` is on (RBAC is static: the right is granted either
///   way);
/// - jobs (`batch`) and jobsets (`jobset.x-k8s.io`) get/patch: the read-modify-write of a
///   workload's device-failure memory (its annotation and label; no list, no watch: only the
///   workload of a failed pod is read, by name);
///
/// Nothing on leases: those rights are [`LEASE_RULES`], in a Role of the controller's
/// namespace. `tests/it/controller.rs` checks that every call the controller makes is allowed by
/// these two.
pub const RBAC_RULES: [RbacRule; 13] = [
    RbacRule::new("", "nodes", &["get", "list", "watch", "patch"]),
    RbacRule::new("", "pods", READ),
    RbacRule::new("", "pods/status", &["patch"]),
    RbacRule::new("", "pods/eviction", &["create"]),
    RbacRule::new("", "namespaces", READ),
    RbacRule::new("resource.k8s.io", "resourceslices", READ),
    RbacRule::new("resource.k8s.io", "resourceclaims", READ),
    RbacRule::new("apps", "daemonsets", &["list"]),
    RbacRule::new("events.k8s.io", "events", &["create", "patch"]),
    RbacRule::new("", "nodes/status", &["patch"]),
    RbacRule::new("", "pods", &["delete"]),
    RbacRule::new("batch", "jobs", &["get", "patch"]),
    RbacRule::new("jobset.x-k8s.io", "jobsets", &["get", "patch"]),
];

/// The leader-election rights, in a Role of the controller's namespace (not the ClusterRole:
/// `update` on every Lease of the cluster would reach the kube-controller-manager's and
/// kube-scheduler's leader Leases and every node heartbeat in `kube-node-lease`): `get` and
/// `update` of the controller's own Lease only (`resourceNames`), and `create`, which RBAC
/// cannot restrict by name (the name of a new object is not known when the request is
/// authorized; Kubernetes RBAC documentation, "Referring to resources"), so the first replica
/// can create the Lease. The Lease name is the default one ([`gpu_guard_core::wellknown::LEASE_NAME`]):
/// a controller run with another `--lease-name` needs its Role changed to match.
pub const LEASE_RULES: [RbacRule; 2] = [
    RbacRule::new("coordination.k8s.io", "leases", &["get", "update"])
        .named(&[gpu_guard_core::wellknown::LEASE_NAME]),
    RbacRule::new("coordination.k8s.io", "leases", &["create"]),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writing_clients_time_out_and_do_not_retry() {
        let config = write_config(kube::Config::new("http://127.0.0.1:1".parse().unwrap()));
        assert_eq!(config.read_timeout, Some(WRITE_TIMEOUT));
        assert_eq!(config.write_timeout, Some(WRITE_TIMEOUT));
        assert!(config.reset_reader_on_write);
        assert!(!config.default_retry);
    }
}
