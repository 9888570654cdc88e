//! The controller's caches: Nodes, Pods bound to a node and not finished, opted-in
//! Namespaces, and DRA ResourceSlices, each a reflector started with the shared `crate::cluster::reflector` helper and
//! slimmed to what the node and pod decisions read.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Namespace, Node, NodeSpec, NodeStatus, Pod};
use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::cluster::reflector::{Reflected, Watch};
use crate::wellknown::ENABLED_LABEL as NAMESPACE_OPT_IN_LABEL;

/// The pods the controller caches.
pub const POD_FIELD_SELECTOR: &str = "spec.nodeName!=,status.phase!=Succeeded";

/// The Node, Pod and opted-in Namespace caches.
pub struct Caches {
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub namespaces: Store<Namespace>,
    /// DRA ResourceSlices bound to a node (`resource.k8s.io/v1`; empty where not served).
    pub slices: Store<ResourceSlice>,
    /// Notified on every watch event, so a pass can follow a change at once.
    pub changed: Arc<Notify>,
    /// The reflectors behind the stores, for their readiness.
    reflected: (
        Reflected<Node>,
        Reflected<Pod>,
        Reflected<Namespace>,
        Reflected<ResourceSlice>,
    ),
    tasks: Vec<AbortHandle>,
}

impl Caches {
    /// Starts the four reflectors on the current Tokio runtime.
    pub fn start(client: &Client) -> Caches {
        let changed = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        let nodes = reflect(
            "nodes",
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            keep_node_taints_devices_and_owner,
            &changed,
            &mut tasks,
        );
        // Pods bound to a node and not finished (as kube-scheduler selects assigned pods, but
        // keeping Failed pods: they may still need the condition).
        let pods = reflect(
            "pods",
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(POD_FIELD_SELECTOR),
            slim_pod,
            &changed,
            &mut tasks,
        );
        let namespaces = reflect(
            "namespaces",
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default().labels(&format!("{NAMESPACE_OPT_IN_LABEL}=true")),
            slim_namespace,
            &changed,
            &mut tasks,
        );
        // DRA devices, for node health. Optional: a cluster that does not serve
        // resource.k8s.io/v1 answers 404 and the cache counts as synced, empty.
        let slices = Reflected::start(
            Watch {
                cache: "controller cache",
                resource: "resourceslices",
                api: Api::<ResourceSlice>::all(client.clone()),
                config: watcher::Config::default(),
                slim: slim_slice,
                changed: Some(changed.clone()),
                optional: true,
            },
            &mut tasks,
        );
        Caches {
            nodes: nodes.store().clone(),
            pods: pods.store().clone(),
            namespaces: namespaces.store().clone(),
            slices: slices.store().clone(),
            changed,
            reflected: (nodes, pods, namespaces, slices),
            tasks,
        }
    }

    /// Waits until the four caches have listed (the ResourceSlices: or are not served), at most
    /// `timeout`.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        // Not `Store::wait_until_ready`: kube's store wakes only the last of several tasks
        // waiting on it, and the reflector's own readiness task waits on it already (a second
        // waiter here slept until its timeout).
        let (nodes, pods, namespaces, slices) = &self.reflected;
        let all = async {
            nodes.wait_synced().await
                && pods.wait_synced().await
                && namespaces.wait_synced().await
                && slices.wait_synced().await
        };
        tokio::time::timeout(timeout, all).await.unwrap_or(false)
    }

    /// Stops the watches.
    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for Caches {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts one reflector that wakes `changed` on every event; returns its store.
fn reflect<K>(
    resource: &'static str,
    api: Api<K>,
    config: watcher::Config,
    slim: fn(&mut K),
    changed: &Arc<Notify>,
    tasks: &mut Vec<AbortHandle>,
) -> Reflected<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync,
    K: 'static,
{
    let watch = Watch {
        cache: "controller cache",
        resource,
        api,
        config,
        slim,
        changed: Some(changed.clone()),
        optional: false,
    };
    Reflected::start(watch, tasks)
}

/// Keeps what node health reads of a ResourceSlice: driver, node, pool name and generation,
/// and each device's name and taints.
fn slim_slice(slice: &mut ResourceSlice) {
    let full = std::mem::take(slice);
    *slice = ResourceSlice {
        metadata: ObjectMeta {
            name: full.metadata.name,
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: full.spec.driver,
            node_name: full.spec.node_name,
            pool: ResourcePool {
                name: full.spec.pool.name,
                generation: full.spec.pool.generation,
                resource_slice_count: full.spec.pool.resource_slice_count,
            },
            devices: full.spec.devices.map(|devices| {
                devices
                    .into_iter()
                    .map(|device| Device {
                        name: device.name,
                        taints: device.taints,
                        ..Device::default()
                    })
                    .collect()
            }),
            ..ResourceSliceSpec::default()
        },
    };
}

/// Keeps what node decisions read and node patches need: name, uid, resourceVersion (the
/// patches' precondition), annotations (gpu-guard's owner record), taints, capacity and
/// allocatable (the device counts).
fn keep_node_taints_devices_and_owner(node: &mut Node) {
    let full = std::mem::take(node);
    *node = Node {
        metadata: ObjectMeta {
            name: full.metadata.name,
            uid: full.metadata.uid,
            resource_version: full.metadata.resource_version,
            annotations: full.metadata.annotations,
            ..ObjectMeta::default()
        },
        spec: full.spec.map(|spec| NodeSpec {
            taints: spec.taints,
            ..Default::default()
        }),
        status: full.status.map(|status| NodeStatus {
            capacity: status.capacity,
            allocatable: status.allocatable,
            ..Default::default()
        }),
    };
}

/// Keeps what pod decisions read: identity, deletion, owner references, the mirror-pod
/// annotation (no other), node, tolerations,
/// containers' resources, phase, conditions and container statuses (allocatedResourcesStatus).
fn slim_pod(pod: &mut Pod) {
    let full = std::mem::take(pod);
    let slim_containers = |containers: Vec<Container>| {
        containers
            .into_iter()
            .map(|c| Container {
                name: c.name,
                resources: c.resources,
                ..Default::default()
            })
            .collect::<Vec<_>>()
    };
    *pod = Pod {
        metadata: ObjectMeta {
            name: full.metadata.name,
            namespace: full.metadata.namespace,
            uid: full.metadata.uid,
            deletion_timestamp: full.metadata.deletion_timestamp,
            owner_references: full.metadata.owner_references,
            // Only the mirror-pod annotation: a mirror pod is never evicted.
            annotations: full.metadata.annotations.and_then(|mut annotations| {
                let mirror = annotations.remove_entry(crate::controller::pod::MIRROR_ANNOTATION)?;
                Some([mirror].into())
            }),
            ..ObjectMeta::default()
        },
        spec: full.spec.map(|spec| PodSpec {
            node_name: spec.node_name,
            tolerations: spec.tolerations,
            containers: slim_containers(spec.containers),
            init_containers: spec.init_containers.map(slim_containers),
            ..PodSpec::default()
        }),
        status: full.status.map(|status| PodStatus {
            phase: status.phase,
            conditions: status.conditions,
            container_statuses: status.container_statuses,
            init_container_statuses: status.init_container_statuses,
            ..PodStatus::default()
        }),
    };
}

/// Keeps a namespace's name and labels (the opt-in label).
fn slim_namespace(namespace: &mut Namespace) {
    let full = std::mem::take(namespace);
    *namespace = Namespace {
        metadata: ObjectMeta {
            name: full.metadata.name,
            labels: full.metadata.labels,
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
}
