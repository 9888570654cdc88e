//! The controller's test world: a reconciler with synced caches on the fake API server, the
//! objects the controller tests start from, and the Lease lock they elect with.

use std::sync::Arc;
use std::time::Duration;

use gpu_guard_controller::lease::LeaseLock;
use gpu_guard_controller::metrics::ControllerMetrics;
use gpu_guard_controller::reconcile::{Caches, PassReport, Reconciler};
use gpu_guard_core::health::pod::PodFacts;
use gpu_guard_core::policy::Policy;
use gpu_guard_core::wellknown::{DEGRADED_TAINT_KEY, DEVICE_DEGRADED_NODE_CONDITION};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::reflector::Store;
use serde::Serialize;
use serde_json::{Value, json};

use super::fake_api::{Fake, NAMESPACES, NODES, PODS};
use super::{DEADLINE, eventually};

/// When gpu-guard taints a node degraded since `at(0)` for the default 120 s.
pub const TAINT_TIME: &str = "2027-01-15T08:02:00Z";

/// `seconds` after the tests' epoch (2027-01-15T08:00:00Z).
pub fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("time")
}

/// A GPU node with `capacity` GPUs of which `allocatable` can be handed out, carrying the
/// GPU-node taint the cluster operator put there.
pub fn gpu_node(name: &str, capacity: u32, allocatable: u32) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"),
                     "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "64", "nvidia.com/gpu": capacity.to_string()},
            "allocatable": {"cpu": "63", "nvidia.com/gpu": allocatable.to_string()},
        },
    })
}

/// A node whose GPUs come only from a DRA driver: no device resource in its status.
pub fn dra_node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
           "status": {"capacity": {"cpu": "96"}, "allocatable": {"cpu": "95"}}})
}

/// The ResourceSlice of NVIDIA's DRA driver (`gpu.nvidia.com`) on `node`: 8 GPUs, those at
/// `tainted` carrying the taint the driver puts on a device it finds unhealthy.
pub fn nvidia_dra_slice(node: &str, tainted: &[usize]) -> Value {
    let devices: Vec<Value> = (0..8)
        .map(|index| {
            let mut device = json!({"name": format!("gpu-{index}")});
            if tainted.contains(&index) {
                device["taints"] = json!([{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79",
                                           "effect": "NoExecute"}]);
            }
            device
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
           "metadata": {"name": format!("{node}-gpu.nvidia.com-x7k2p")},
           "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices}})
}

pub fn namespace(name: &str, opted_in: bool) -> Value {
    let labels = if opted_in {
        json!({"gpu-guard.io/enabled": "true", "kubernetes.io/metadata.name": name})
    } else {
        json!({"kubernetes.io/metadata.name": name})
    };
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

/// A running pod on `node`; `gpu`: it limits one nvidia.com/gpu; `unhealthy`: its GPU is
/// reported Unhealthy.
pub fn pod(namespace: &str, name: &str, node: &str, gpu: bool, unhealthy: bool) -> Value {
    let resources = if gpu {
        json!({"limits": {"nvidia.com/gpu": "1"}})
    } else {
        json!({"requests": {"cpu": "1"}})
    };
    let health = if unhealthy { "Unhealthy" } else { "Healthy" };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}"),
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                          "uid": "uid-train", "controller": true}]},
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "containers": [{"name": "trainer", "image": "cuda", "resources": resources}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{
                "name": "trainer", "image": "cuda", "imageID": "", "ready": true,
                "restartCount": 0,
                "allocatedResourcesStatus": if gpu {
                    json!([{"name": "nvidia.com/gpu",
                            "resources": [{"resourceID": "GPU-1234", "health": health}]}])
                } else {
                    json!([])
                },
            }],
        },
    })
}

/// Two GPU nodes (gpu-1 degraded), an opted-in namespace `ml` and one that is not, and pods
/// in every situation a pass tells apart.
pub fn pod_world() -> Vec<(&'static str, Value)> {
    vec![
        (NODES, gpu_node("gpu-1", 8, 7)),
        (NODES, gpu_node("gpu-2", 8, 8)),
        (NAMESPACES, namespace("ml", true)),
        (NAMESPACES, namespace("other", false)),
        // Its GPU is reported Unhealthy.
        (PODS, pod("ml", "sick", "gpu-2", true, true)),
        // On the degraded node, with a healthy GPU.
        (PODS, pod("ml", "on-degraded", "gpu-1", true, false)),
        // Healthy, on a healthy node.
        (PODS, pod("ml", "fine", "gpu-2", true, false)),
        // On the degraded node without a GPU.
        (PODS, pod("ml", "cpu-only", "gpu-1", false, false)),
        // Its namespace did not opt in.
        (PODS, pod("other", "sick-elsewhere", "gpu-2", true, true)),
    ]
}

/// Adds `taint` to the node's `spec.taints`.
pub fn push_taint(node: &mut Value, taint: Value) {
    node["spec"]["taints"]
        .as_array_mut()
        .expect("taints")
        .push(taint);
}

pub fn has_our_taint(node: &Value) -> bool {
    node["spec"]["taints"].as_array().is_some_and(|taints| {
        taints
            .iter()
            .any(|taint| taint["key"] == DEGRADED_TAINT_KEY)
    })
}

/// gpu-guard's Node condition (`gpu-guard.io/DeviceDegraded`) on `node`, if it has one.
pub fn our_condition(node: &Value) -> Option<Value> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|condition| condition["type"] == DEVICE_DEGRADED_NODE_CONDITION)
        .cloned()
}

/// The default policy with the thresholds the tests count on, edited by `edit`.
pub fn policy(edit: impl FnOnce(&mut Policy)) -> Policy {
    let mut policy = Policy::default();
    policy.controller.node_health.degraded_for_seconds = 120;
    policy.controller.node_health.healthy_for_seconds = 600;
    edit(&mut policy);
    policy
}

/// A Lease lock on the fake's `gpu-guard/gpu-guard-controller` Lease, for 15 s.
pub fn lock(fake: &Fake, identity: &str) -> LeaseLock {
    LeaseLock::new(
        fake.client(),
        "gpu-guard",
        "gpu-guard-controller",
        identity,
        Duration::from_secs(15),
    )
}

pub fn lease_spec(fake: &Fake) -> Value {
    fake.lock().leases["gpu-guard-controller"]["spec"].clone()
}

pub struct World {
    pub fake: Fake,
    pub caches: Caches,
    pub reconciler: Reconciler,
    pub metrics: Arc<ControllerMetrics>,
}

impl World {
    /// The fake with `objects`, and a reconciler with synced caches on it.
    pub async fn start(policy: Policy, objects: Vec<(&'static str, Value)>) -> World {
        let fake = Fake::start().await;
        for (path, object) in objects {
            fake.put(path, object);
        }
        let client = fake.client();
        let caches = Caches::start(&client, &policy, None);
        // Readiness must wake its waiter when the lists are in: one that is not woken (kube's
        // Store::wait_until_ready with a second waiter) sleeps until a timer polls it again,
        // and the lists of a few objects on loopback take milliseconds, not seconds.
        let waiting = std::time::Instant::now();
        assert!(caches.wait_synced(DEADLINE).await, "caches did not sync");
        assert!(
            waiting.elapsed() < DEADLINE / 4,
            "the caches reported synced {:?} after they started",
            waiting.elapsed()
        );
        // Nodes, pods, namespaces, ResourceSlices, ResourceClaims.
        eventually("five watches open", || fake.open_watches_total() >= 5).await;
        let metrics = Arc::new(ControllerMetrics::default());
        let reconciler = Reconciler::new(
            fake.config(),
            policy,
            Some("test-1".to_owned()),
            metrics.clone(),
        )
        .expect("reconciler");
        World {
            fake,
            caches,
            reconciler,
            metrics,
        }
    }

    pub async fn pass(&mut self, seconds: i64) -> PassReport {
        self.reconciler.pass(&self.caches, at(seconds)).await
    }

    /// The node's 8 GPUs are all allocatable again (a watch event), and the cache shows it.
    pub async fn heal(&self, name: &str) {
        let mut healed = self.fake.object(NODES, name);
        healed["status"]["allocatable"]["nvidia.com/gpu"] = json!("8");
        self.fake.put(NODES, healed);
        self.node_cached(name, |node| {
            node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        })
        .await;
    }

    /// Waits until the node cache shows `check` true of the node.
    pub async fn node_cached(&self, name: &str, check: impl Fn(&Value) -> bool) {
        eventually(&format!("node {name} updated in the cache"), || {
            cached(&self.caches.nodes, name).is_some_and(|node| check(&node))
        })
        .await;
    }

    /// Waits until the device pod cache shows `check` true of the pod's facts.
    pub async fn pod_cached(&self, name: &str, check: impl Fn(&PodFacts) -> bool) {
        eventually(&format!("pod {name} updated in the cache"), || {
            self.caches
                .pods
                .snapshot()
                .iter()
                .find(|pod| pod.name == name)
                .is_some_and(|pod| check(pod))
        })
        .await;
    }
}

/// The cached object named `name`, as JSON.
fn cached<K>(store: &Store<K>, name: &str) -> Option<Value>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + 'static,
{
    store
        .state()
        .iter()
        .find(|object| object.meta().name.as_deref() == Some(name))
        .map(|object| serde_json::to_value(&**object).expect("JSON"))
}
