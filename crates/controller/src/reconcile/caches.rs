//! The controller's caches: Nodes, opted-in Namespaces and DRA ResourceSlices, each a reflector
//! started with the shared `gpu_guard_runtime::cluster::reflector` helper and slimmed to what the node and
//! pod decisions read; and the device pods' facts ([`PodCache`]).

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Namespace, Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::api::resource::v1::{
    Device, DeviceCounterConsumption, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;

use super::pods::{ClaimDrivers, PodCache};
use gpu_guard_core::health::pod::PodFacts;
use gpu_guard_core::policy::Policy;

use gpu_guard_core::wellknown::DEVICE_DEGRADED_NODE_CONDITION;
use gpu_guard_core::wellknown::{
    DEGRADED_OWNER_ANNOTATION, ENABLED_LABEL as NAMESPACE_OPT_IN_LABEL, IGNORE_VANISHED_ANNOTATION,
    SUSPECT_ANNOTATION,
};
use gpu_guard_runtime::cluster::reflector::{Reflected, Watch};

/// The Node, device Pod, opted-in Namespace and ResourceSlice caches.
pub struct Caches {
    pub nodes: Store<Node>,
    /// The device pods' facts: their changes are followed on their own
    /// ([`PodCache::take_dirty`]), not through [`Caches::changed`].
    pub pods: PodCache,
    pub namespaces: OptedIn,
    /// DRA ResourceSlices bound to a node (`resource.k8s.io/v1`; empty where not served).
    pub slices: Store<ResourceSlice>,
    /// The drivers of the allocated ResourceClaims, for the pods that hold them (`resource.k8s.io/v1`;
    /// empty where not served). Its changes start no pass: a pod is bound, and its watch event
    /// comes, after its claims are allocated.
    pub claims: ClaimDrivers,
    /// Notified on every Node, Namespace and ResourceSlice watch event, so a pass can follow a
    /// change at once.
    pub changed: Arc<Notify>,
    /// The reflectors behind the stores, for their readiness.
    reflected: (
        Reflected<Node>,
        Reflected<Namespace>,
        Reflected<ResourceSlice>,
    ),
    tasks: Vec<AbortHandle>,
    claims_reflected: Reflected<k8s_openapi::api::resource::v1::ResourceClaim>,
}

/// The opted-in namespaces (label `gpu-guard.io/enabled: "true"`), from their cache.
#[derive(Clone)]
pub struct OptedIn(Store<Namespace>);

impl OptedIn {
    /// Whether `namespace` opted in.
    pub fn contains(&self, namespace: &str) -> bool {
        self.0
            .get(&kube::runtime::reflector::ObjectRef::new(namespace))
            .is_some_and(|ns| opted_in(&ns))
    }

    /// Every opted-in namespace.
    pub fn names(&self) -> HashSet<String> {
        self.0
            .state()
            .iter()
            .filter(|ns| opted_in(ns))
            .filter_map(|ns| ns.metadata.name.clone())
            .collect()
    }
}

fn opted_in(namespace: &Namespace) -> bool {
    namespace
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(NAMESPACE_OPT_IN_LABEL))
        .is_some_and(|value| value == "true")
}

impl Caches {
    /// Starts the caches on the current Tokio runtime. The pod cache keeps the facts of the
    /// pods that use one of `policy`'s devices, and sends those to mark at once to `urgent`.
    pub fn start(
        client: &Client,
        policy: &Policy,
        urgent: Option<mpsc::UnboundedSender<Arc<PodFacts>>>,
    ) -> Caches {
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
        let pods = PodCache::start(client, policy.clone(), urgent, &mut tasks);
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
        let claims = Reflected::start(
            Watch {
                cache: "controller cache",
                resource: "resourceclaims",
                api: Api::all(client.clone()),
                config: watcher::Config::default(),
                slim: super::pods::slim_claim,
                changed: None,
                optional: true,
            },
            &mut tasks,
        );
        Caches {
            claims: ClaimDrivers(claims.store().clone()),
            claims_reflected: claims,
            nodes: nodes.store().clone(),
            pods,
            namespaces: OptedIn(namespaces.store().clone()),
            slices: slices.store().clone(),
            changed,
            reflected: (nodes, namespaces, slices),
            tasks,
        }
    }

    /// Becomes true when the opted-in namespaces have been listed.
    pub fn namespaces_synced(&self) -> tokio::sync::watch::Receiver<bool> {
        self.reflected.1.ready()
    }

    /// Waits until the caches have listed (the ResourceSlices and ResourceClaims: or are not
    /// served), at most `timeout`.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        // Not `Store::wait_until_ready`: kube's store wakes only the last of several tasks
        // waiting on it, and the reflector's own readiness task waits on it already (a second
        // waiter here slept until its timeout).
        let (nodes, namespaces, slices) = &self.reflected;
        let pods = &self.pods;
        let all = async {
            nodes.wait_synced().await
                && pods.wait_synced().await
                && namespaces.wait_synced().await
                && slices.wait_synced().await
                && self.claims_reflected.wait_synced().await
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
/// and each device's name, taints and the counter sets it consumes.
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
                        // Which counter sets it consumes (they tie a partition to its GPU),
                        // not how much.
                        consumes_counters: device.consumes_counters.map(|consumed| {
                            consumed
                                .into_iter()
                                .map(|consumption| DeviceCounterConsumption {
                                    counter_set: consumption.counter_set,
                                    counters: Default::default(),
                                })
                                .collect()
                        }),
                        ..Device::default()
                    })
                    .collect()
            }),
            ..ResourceSliceSpec::default()
        },
    };
}

/// Keeps what node decisions read and node patches need: name, uid, resourceVersion (the
/// patches' precondition), gpu-guard's owner annotation and its opt-out
/// `gpu-guard.io/ignore-vanished-resources` (no other: nodes carry kilobytes of them), taints,
/// capacity and allocatable (the device counts), and two conditions ([`keep_conditions`]).
pub(super) fn keep_node_taints_devices_and_owner(node: &mut Node) {
    let full = std::mem::take(node);
    *node = Node {
        metadata: ObjectMeta {
            name: full.metadata.name,
            uid: full.metadata.uid,
            resource_version: full.metadata.resource_version,
            annotations: full.metadata.annotations.and_then(|mut annotations| {
                let kept: std::collections::BTreeMap<String, String> = [
                    DEGRADED_OWNER_ANNOTATION,
                    IGNORE_VANISHED_ANNOTATION,
                    SUSPECT_ANNOTATION,
                ]
                .into_iter()
                .filter_map(|key| annotations.remove_entry(key))
                .collect();
                (!kept.is_empty()).then_some(kept)
            }),
            ..ObjectMeta::default()
        },
        spec: full.spec.map(|spec| NodeSpec {
            taints: spec.taints,
            ..Default::default()
        }),
        status: full.status.map(|status| NodeStatus {
            capacity: status.capacity,
            allocatable: status.allocatable,
            conditions: keep_conditions(status.conditions),
            ..Default::default()
        }),
    };
}

/// Of a node's conditions, gpu-guard's own (whole: it is compared with what it should say)
/// and `Ready` without its heartbeat, reason and message (whether the node is ready, since
/// when: what stuck pods are judged by). The kubelet's heartbeats do not change what is kept.
fn keep_conditions(conditions: Option<Vec<NodeCondition>>) -> Option<Vec<NodeCondition>> {
    let kept: Vec<NodeCondition> = conditions
        .into_iter()
        .flatten()
        .filter_map(|condition| match condition.type_.as_str() {
            DEVICE_DEGRADED_NODE_CONDITION => Some(condition),
            "Ready" => Some(NodeCondition {
                type_: condition.type_,
                status: condition.status,
                last_transition_time: condition.last_transition_time,
                ..NodeCondition::default()
            }),
            _ => None,
        })
        .collect();
    (!kept.is_empty()).then_some(kept)
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
