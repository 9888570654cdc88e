//! The controller's pod cache: the [`PodFacts`] of every device pod, and nothing of the others.
//!
//! Pods are watched cluster-wide (bound to a node, not succeeded: [`POD_FIELD_SELECTOR`]);
//! each arriving Pod is reduced to its facts at once, and kept only when it is a device pod
//! ([`PodFacts::is_device_pod`]). So the cache costs what the device pods cost: in a cluster of
//! 150,000 pods of which 40,000 use GPUs, a few hundred bytes for each of the 40,000. Kube's
//! reflector store is not used: it keeps the whole object, and a second copy of every object
//! during a relist. Here a relist updates the live map in place and, when it is done, drops the
//! pods it did not list (deleted while the watch was down).
//!
//! Two things follow a change:
//! - a device pod whose facts changed becomes *dirty*: the reconciler judges the dirty pods
//!   alone ([`PodCache::take_dirty`]), instead of a full pass for every pod event;
//! - a pod that should be marked now (a device reported unhealthy, not marked yet:
//!   [`PodFacts::needs_mark_now`]), or a marked gang pod whose peers are now due
//!   ([`PodFacts::peers_due`]), is sent at once to the marker task ([`super::marker`]),
//!   before and independent of any node work.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;

use gpu_guard_core::health::pod::PodFacts;
use gpu_guard_core::memory::WorkloadRef;
use gpu_guard_core::policy::Policy;

/// The pods the controller watches: bound to a node and not succeeded (as kube-scheduler
/// selects assigned pods, but keeping Failed pods: they may still need the condition).
pub const POD_FIELD_SELECTOR: &str = "spec.nodeName!=,status.phase!=Succeeded";

/// A pod's key: `(namespace, name)`.
pub type PodKey = (String, String);

/// The device pods' facts, shared by the watch task that fills it and its readers.
#[derive(Clone)]
pub struct PodCache {
    shared: Arc<Shared>,
}

struct Shared {
    pods: RwLock<HashMap<PodKey, Arc<PodFacts>>>,
    /// Device pods whose facts changed since the reconciler last took them.
    dirty: Mutex<HashSet<PodKey>>,
    /// Woken when a pod becomes dirty.
    dirtied: Notify,
    /// True once the first list is complete.
    ready: tokio::sync::watch::Sender<bool>,
}

impl PodCache {
    /// Starts the pod watch on the current Tokio runtime (its task pushed onto `tasks`). Pods
    /// to mark at once go to `urgent`.
    pub fn start(
        client: &Client,
        policy: Policy,
        urgent: Option<mpsc::UnboundedSender<Arc<PodFacts>>>,
        tasks: &mut Vec<AbortHandle>,
    ) -> PodCache {
        let cache = PodCache {
            shared: Arc::new(Shared {
                pods: RwLock::new(HashMap::new()),
                dirty: Mutex::new(HashSet::new()),
                dirtied: Notify::new(),
                ready: tokio::sync::watch::Sender::new(false),
            }),
        };
        let mut filler = Filler {
            cache: cache.clone(),
            policy,
            urgent,
            relisted: None,
        };
        gpu_guard_runtime::cluster::reflector::follow(
            "controller cache",
            "pods",
            Api::<WatchedPod>::all(client.clone()),
            watcher::Config::default().fields(POD_FIELD_SELECTOR),
            move |event| filler.apply(event),
            tasks,
        );
        cache
    }

    /// The cached device pod `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<PodFacts>> {
        self.read()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every cached device pod, sorted by namespace and name.
    pub fn snapshot(&self) -> Vec<Arc<PodFacts>> {
        let mut pods: Vec<Arc<PodFacts>> = self.read().values().cloned().collect();
        sort(&mut pods);
        pods
    }

    /// The cached peers of `failed` still to mark ([`PodFacts::is_peer_of`]), sorted. One
    /// scan of the cache, under its read lock: it runs only when a gang pod is hit.
    pub fn peers(&self, failed: &PodFacts, since: Option<Timestamp>) -> Vec<Arc<PodFacts>> {
        if failed.gang.is_none() {
            return Vec::new();
        }
        let mut peers: Vec<Arc<PodFacts>> = self
            .read()
            .values()
            .filter(|pod| pod.is_peer_of(failed, since))
            .cloned()
            .collect();
        sort(&mut peers);
        peers
    }

    /// The cached pods of `workload` still to be given `gpu-guard.io/DeviceRetriesExhausted`
    /// ([`PodFacts::needs_retries_exhausted`]), sorted. One scan of the cache: it runs only
    /// when a workload is found past its budget.
    pub fn of_workload(&self, workload: &WorkloadRef) -> Vec<Arc<PodFacts>> {
        let mut pods: Vec<Arc<PodFacts>> = self
            .read()
            .values()
            .filter(|pod| pod.needs_retries_exhausted(workload))
            .cloned()
            .collect();
        sort(&mut pods);
        pods
    }

    /// How many device pods are cached.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether no device pod is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device pods that changed since the last call (those still cached), sorted; the
    /// dirty set is emptied.
    pub fn take_dirty(&self) -> Vec<Arc<PodFacts>> {
        let keys = std::mem::take(
            &mut *self
                .shared
                .dirty
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let pods = self.read();
        let mut dirty: Vec<Arc<PodFacts>> = keys
            .iter()
            .filter_map(|key| pods.get(key).cloned())
            .collect();
        drop(pods);
        sort(&mut dirty);
        dirty
    }

    /// Forgets the dirty set (a full pass judges every pod anyway).
    pub fn clear_dirty(&self) {
        self.shared
            .dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Waits until a pod becomes dirty (at once if one did since the last wait).
    pub async fn dirtied(&self) {
        self.shared.dirtied.notified().await;
    }

    /// Whether the first list is complete.
    pub fn synced(&self) -> bool {
        *self.shared.ready.borrow()
    }

    /// Waits for the first complete list.
    pub async fn wait_synced(&self) -> bool {
        let mut ready = self.shared.ready.subscribe();
        ready.wait_for(|ready| *ready).await.is_ok()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<PodKey, Arc<PodFacts>>> {
        self.shared
            .pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<PodKey, Arc<PodFacts>>> {
        self.shared
            .pods
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The allocated ResourceClaims (`resource.k8s.io/v1`), reduced to the drivers that allocated
/// their devices: what a pod's claims are judged by ([`PodFacts::with_claim_drivers`]). Empty
/// where the API is not served.
#[derive(Clone)]
pub struct ClaimDrivers(pub Store<ResourceClaim>);

impl ClaimDrivers {
    /// The drivers of the devices allocated for claim `namespace/name`
    /// (`status.allocation.devices.results[].driver`; none while it is not allocated, or not
    /// cached yet), without admin-access results: those let a monitoring pod watch devices
    /// others use, they are not its own.
    pub fn of(&self, namespace: &str, name: &str) -> Vec<String> {
        let Some(claim) = self.0.get(&ObjectRef::new(name).within(namespace)) else {
            return Vec::new();
        };
        allocation_results(&claim)
            .filter(|result| result.admin_access != Some(true))
            .map(|result| result.driver.clone())
            .collect()
    }

    /// The pod's facts with the drivers of its claims added ([`PodFacts::with_claim_drivers`]),
    /// or the facts as they are.
    pub fn resolve(&self, pod: Arc<PodFacts>, policy: &Policy) -> Arc<PodFacts> {
        if pod.claims.is_empty() {
            return pod;
        }
        let drivers: Vec<String> = pod
            .claims
            .iter()
            .flat_map(|claim| self.of(&pod.namespace, claim))
            .collect();
        pod.with_claim_drivers(drivers.iter().map(String::as_str), policy)
            .map_or(pod, Arc::new)
    }
}

fn allocation_results(
    claim: &ResourceClaim,
) -> impl Iterator<Item = &DeviceRequestAllocationResult> {
    claim
        .status
        .iter()
        .filter_map(|status| status.allocation.as_ref())
        .filter_map(|allocation| allocation.devices.as_ref())
        .flat_map(|devices| devices.results.iter().flatten())
}

/// Keeps what [`ClaimDrivers`] reads of a ResourceClaim: its name and namespace, and each
/// allocation result's driver and admin access (not the spec, the pool, the device, their
/// configuration or status).
pub fn slim_claim(claim: &mut ResourceClaim) {
    let full = std::mem::take(claim);
    let results: Vec<DeviceRequestAllocationResult> = allocation_results(&full)
        .map(|result| DeviceRequestAllocationResult {
            driver: result.driver.clone(),
            admin_access: result.admin_access,
            ..DeviceRequestAllocationResult::default()
        })
        .collect();
    *claim = ResourceClaim {
        metadata: ObjectMeta {
            name: full.metadata.name,
            namespace: full.metadata.namespace,
            ..ObjectMeta::default()
        },
        status: (!results.is_empty()).then(|| ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    ..DeviceAllocationResult::default()
                }),
                ..AllocationResult::default()
            }),
            ..ResourceClaimStatus::default()
        }),
        ..ResourceClaim::default()
    };
}

pub(crate) fn sort(pods: &mut [Arc<PodFacts>]) {
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
}

/// The watch task's side of the cache: applies each watch event.
struct Filler {
    cache: PodCache,
    policy: Policy,
    urgent: Option<mpsc::UnboundedSender<Arc<PodFacts>>>,
    /// During a relist: the pods it listed so far.
    relisted: Option<HashSet<PodKey>>,
}

impl Filler {
    fn apply(&mut self, event: watcher::Event<WatchedPod>) {
        match event {
            watcher::Event::Init => self.relisted = Some(HashSet::new()),
            watcher::Event::InitApply(WatchedPod(pod)) => {
                let key = self.upsert(&pod);
                if let (Some(relisted), Some(key)) = (&mut self.relisted, key) {
                    relisted.insert(key);
                }
            }
            watcher::Event::InitDone => {
                if let Some(relisted) = self.relisted.take() {
                    // Pods deleted while the watch was down were not listed again.
                    self.cache.write().retain(|key, _| relisted.contains(key));
                }
                self.cache.shared.ready.send_replace(true);
            }
            watcher::Event::Apply(WatchedPod(pod)) => {
                self.upsert(&pod);
            }
            watcher::Event::Delete(WatchedPod(pod)) => {
                if let Some(key) = key_of(&pod) {
                    let old = self.cache.write().remove(&key);
                    // A pod deleted as it fails (a JobSet's gang restart) may show its failure
                    // only here: recorded all the same.
                    let facts = PodFacts::of(&pod, &self.policy);
                    let known = old.is_some_and(|old| old.device_failure.is_some());
                    if facts.is_device_pod() && facts.device_failure.is_some() && !known {
                        self.send_urgent(Arc::new(facts));
                    }
                }
            }
        }
    }

    /// Keeps the facts of a device pod (replacing what was cached), drops any other; marks it
    /// dirty when its facts changed, and sends it to the marker when it must be marked now.
    /// Returns its key.
    fn upsert(&mut self, pod: &Pod) -> Option<PodKey> {
        let key = key_of(pod)?;
        let facts = PodFacts::of(pod, &self.policy);
        if !facts.is_device_pod() {
            // Most pods: a read lock only (a device pod that stopped being one is removed).
            if self.cache.read().contains_key(&key) {
                self.cache.write().remove(&key);
            }
            return Some(key);
        }
        let facts = Arc::new(facts);
        let old = self.cache.write().insert(key.clone(), facts.clone());
        if old.as_deref() == Some(&*facts) {
            return Some(key);
        }
        // A pod to mark, a marked gang pod whose device failure just became real (its device
        // reported unhealthy, or the pod failed): its peers are marked at once; a pod that
        // failed of a device: its failure is recorded at once (before a JobSet's gang restart
        // deletes it).
        let urgent = |facts: &PodFacts| {
            facts.needs_mark_now(&self.policy)
                || (self.policy.controller.pods.mark_pods && facts.peers_due(false))
        };
        let failed = |facts: &PodFacts| facts.device_failure.is_some();
        let newly = |check: &dyn Fn(&PodFacts) -> bool| {
            check(&facts) && old.as_deref().is_none_or(|old| !check(old))
        };
        if newly(&urgent) || newly(&failed) {
            self.send_urgent(facts.clone());
        }
        self.cache
            .shared
            .dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone());
        self.cache.shared.dirtied.notify_one();
        Some(key)
    }
}

impl Filler {
    fn send_urgent(&self, facts: Arc<PodFacts>) {
        if let Some(sender) = &self.urgent {
            // The receiver is gone only when the controller stops.
            let _ = sender.send(facts);
        }
    }
}

fn key_of(pod: &Pod) -> Option<PodKey> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// A Pod as the pod watch reads it: only the fields [`PodFacts::of`] reads are parsed, the rest
/// of each object (managedFields, env, volumes, probes, images, ...) is skipped by serde without
/// being allocated. Every pod of the cluster passes through here, on each list and each
/// change, so this is most of the controller's CPU at start and under churn.
#[derive(Clone, Debug)]
pub struct WatchedPod(pub Pod);

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }

    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }

    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }

    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.0.metadata
    }
}

impl<'de> serde::Deserialize<'de> for WatchedPod {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        watched::Pod::deserialize(deserializer).map(|pod| WatchedPod(pod.into()))
    }
}

/// The parts of a Pod the controller reads, with the API's field names; everything else is
/// ignored at parse.
mod watched {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Pod {
        #[serde(default)]
        metadata: Metadata,
        spec: Option<Spec>,
        status: Option<Status>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Metadata {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        /// The watch resumes from the last object's resourceVersion.
        resource_version: Option<String>,
        deletion_timestamp: Option<Time>,
        creation_timestamp: Option<Time>,
        owner_references: Option<Vec<OwnerReference>>,
        annotations: Option<BTreeMap<String, String>>,
        labels: Option<Labels>,
    }

    /// The labels read (the Job's uid, what makes pods peers; the Job's and JobSet's names,
    /// whose memory a failure goes to): serde skips the others without allocating them.
    #[derive(Default, Deserialize)]
    struct Labels {
        #[serde(rename = "batch.kubernetes.io/controller-uid")]
        job_uid: Option<String>,
        #[serde(rename = "batch.kubernetes.io/job-name")]
        job_name: Option<String>,
        #[serde(rename = "job-name")]
        legacy_job_name: Option<String>,
        #[serde(rename = "jobset.sigs.k8s.io/jobset-name")]
        jobset_name: Option<String>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        node_name: Option<String>,
        tolerations: Option<Vec<core::Toleration>>,
        #[serde(default)]
        containers: Vec<Container>,
        init_containers: Option<Vec<Container>>,
        resource_claims: Option<Vec<core::PodResourceClaim>>,
    }

    #[derive(Deserialize)]
    struct Container {
        #[serde(default)]
        name: String,
        resources: Option<core::ResourceRequirements>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        phase: Option<String>,
        conditions: Option<Vec<core::PodCondition>>,
        container_statuses: Option<Vec<ContainerStatus>>,
        init_container_statuses: Option<Vec<ContainerStatus>>,
        resource_claim_statuses: Option<Vec<core::PodResourceClaimStatus>>,
        extended_resource_claim_status: Option<core::PodExtendedResourceClaimStatus>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ContainerStatus {
        #[serde(default)]
        name: String,
        allocated_resources_status: Option<Vec<core::ResourceStatus>>,
        state: Option<State>,
    }

    /// A container's state: only how it terminated (the device failure's exit code).
    #[derive(Deserialize)]
    struct State {
        terminated: Option<Terminated>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Terminated {
        exit_code: i32,
        reason: Option<String>,
        finished_at: Option<Time>,
    }

    impl From<Pod> for core::Pod {
        fn from(pod: Pod) -> core::Pod {
            let Metadata {
                name,
                namespace,
                uid,
                resource_version,
                deletion_timestamp,
                creation_timestamp,
                owner_references,
                annotations,
                labels,
            } = pod.metadata;
            let labels = labels.and_then(|labels| {
                let kept: BTreeMap<String, String> = [
                    (gpu_guard_core::health::pod::JOB_UID_LABEL, labels.job_uid),
                    (
                        gpu_guard_core::memory::failure::JOB_NAME_LABEL,
                        labels.job_name,
                    ),
                    ("job-name", labels.legacy_job_name),
                    (
                        gpu_guard_core::jobset::JOBSET_NAME_LABEL,
                        labels.jobset_name,
                    ),
                ]
                .into_iter()
                .filter_map(|(key, value)| Some((key.to_owned(), value?)))
                .collect();
                (!kept.is_empty()).then_some(kept)
            });
            let containers = |containers: Vec<Container>| {
                containers
                    .into_iter()
                    .map(|c| core::Container {
                        name: c.name,
                        resources: c.resources,
                        ..core::Container::default()
                    })
                    .collect::<Vec<_>>()
            };
            let statuses = |statuses: Vec<ContainerStatus>| {
                statuses
                    .into_iter()
                    .map(|s| core::ContainerStatus {
                        name: s.name,
                        allocated_resources_status: s.allocated_resources_status,
                        state: s.state.map(|state| core::ContainerState {
                            terminated: state.terminated.map(|terminated| {
                                core::ContainerStateTerminated {
                                    exit_code: terminated.exit_code,
                                    reason: terminated.reason,
                                    finished_at: terminated.finished_at,
                                    ..core::ContainerStateTerminated::default()
                                }
                            }),
                            ..core::ContainerState::default()
                        }),
                        ..core::ContainerStatus::default()
                    })
                    .collect::<Vec<_>>()
            };
            core::Pod {
                metadata: ObjectMeta {
                    name,
                    namespace,
                    uid,
                    resource_version,
                    deletion_timestamp,
                    creation_timestamp,
                    owner_references,
                    annotations,
                    labels,
                    ..ObjectMeta::default()
                },
                spec: pod.spec.map(|spec| core::PodSpec {
                    node_name: spec.node_name,
                    tolerations: spec.tolerations,
                    containers: containers(spec.containers),
                    init_containers: spec.init_containers.map(containers),
                    resource_claims: spec.resource_claims,
                    ..core::PodSpec::default()
                }),
                status: pod.status.map(|status| core::PodStatus {
                    phase: status.phase,
                    conditions: status.conditions,
                    container_statuses: status.container_statuses.map(statuses),
                    init_container_statuses: status.init_container_statuses.map(statuses),
                    resource_claim_statuses: status.resource_claim_statuses,
                    extended_resource_claim_status: status.extended_resource_claim_status,
                    ..core::PodStatus::default()
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A running GPU pod as `kubectl get pod -o json` shows it, with everything the controller
    /// does not read (managedFields, env, volumes, probes, images, ...).
    fn realistic_pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "train-worker-3", "namespace": "ml", "uid": "7d1c6b0e-3c1f-4f57-9d0a-0c8e2a1b9f11",
                "resourceVersion": "918273", "generation": 1,
                "creationTimestamp": "2026-11-30T10:00:00Z",
                "labels": {"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/controller-uid": "c0ffee"},
                "annotations": {"kubernetes.io/config.mirror": "abc", "cni.projectcalico.org/podIP": "10.1.2.3/32"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                     "uid": "c0ffee", "controller": true, "blockOwnerDeletion": true}],
                "finalizers": ["batch.kubernetes.io/job-tracking"],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                                   "apiVersion": "v1", "time": "2026-11-30T10:00:00Z",
                                   "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:job-name": {}}}}}]
            },
            "spec": {
                "nodeName": "gpu-7", "restartPolicy": "Never", "schedulerName": "default-scheduler",
                "tolerations": [
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ],
                "initContainers": [{"name": "fetch", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}],
                "containers": [{
                    "name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.10-py3",
                    "command": ["torchrun"], "args": ["--nnodes=4", "train.py"],
                    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                    "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "512Gi"},
                                  "requests": {"nvidia.com/gpu": "8", "cpu": "32"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "readinessProbe": {"exec": {"command": ["true"]}}
                }],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
            },
            "status": {
                "phase": "Running", "hostIP": "10.0.0.7", "podIP": "10.1.2.3",
                "startTime": "2026-11-30T10:00:05Z", "qosClass": "Burstable",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:01:00Z"},
                    {"type": "gpu-guard.io/DeviceFailure", "status": "True", "reason": "UnhealthyDevice",
                     "lastTransitionTime": "2026-11-30T11:00:00Z"}
                ],
                "initContainerStatuses": [{"name": "fetch", "image": "busybox", "imageID": "sha256:1",
                    "ready": true, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
                "containerStatuses": [{
                    "name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.10-py3",
                    "imageID": "sha256:2", "containerID": "containerd://3", "ready": true,
                    "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": "2026-11-30T10:00:30Z"}},
                    "allocatedResourcesStatus": [{"name": "nvidia.com/gpu", "resources": [
                        {"resourceID": "GPU-aaaa", "health": "Healthy"},
                        {"resourceID": "GPU-bbbb", "health": "Unhealthy"}]}]
                }]
            }
        })
    }

    /// The facts of every variation of the pod, read through [`WatchedPod`], equal those of the
    /// whole Pod: the watch parses every field the decisions read.
    #[test]
    fn the_watched_pod_yields_the_same_facts_as_the_whole_pod() {
        let policy = Policy::default();
        let mut variations = vec![realistic_pod()];
        let mut deleting = realistic_pod();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-30T12:00:00Z");
        variations.push(deleting);
        let mut healthy = realistic_pod();
        healthy["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][1]
            ["health"] = json!("Healthy");
        healthy["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .pop();
        variations.push(healthy);
        let mut claim = realistic_pod();
        claim["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpus"}]});
        claim["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = json!([
            {"name": "claim:gpus", "resources": [
                {"resourceID": "k8s.gpu.nvidia.com/device=gpu-3", "health": "Unhealthy"}]}]);
        variations.push(claim);
        // DRA claims: named directly, generated from a template, made by the scheduler for an
        // extended resource backed by DRA.
        let mut dra = realistic_pod();
        dra["spec"]["resourceClaims"] = json!([
            {"name": "shared", "resourceClaimName": "team-gpus"},
            {"name": "gpus", "resourceClaimTemplateName": "gpu-template"}]);
        dra["status"]["resourceClaimStatuses"] =
            json!([{"name": "gpus", "resourceClaimName": "train-worker-3-gpus-x7k2p"}]);
        dra["status"]["extendedResourceClaimStatus"] = json!({
            "resourceClaimName": "train-worker-3-extended-resources-9qz4m",
            "requestMappings": [{"containerName": "trainer", "resourceName": "nvidia.com/gpu",
                                 "requestName": "container-0-request-0"}]});
        variations.push(dra.clone());
        let mut bare = realistic_pod();
        bare["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("ownerReferences");
        bare["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        bare["status"]["phase"] = json!("Failed");
        variations.push(bare);
        // A rank of a gang, marked as the peer of another.
        let mut rank = realistic_pod();
        rank["metadata"]["annotations"] = json!({"gpu-guard.io/gang": "true",
            "batch.kubernetes.io/job-completion-index": "3"});
        rank["status"]["conditions"][1] = json!({"type": "gpu-guard.io/PeerDeviceFailure",
            "status": "True", "reason": "PeerDeviceFailure",
            "lastTransitionTime": "2026-11-30T11:00:00Z"});
        variations.push(rank.clone());
        // Failed of a device (exit 74), a pod of a JobSet's child Job: what the memory reads.
        let mut failed = realistic_pod();
        failed["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = json!("llm");
        failed["status"]["phase"] = json!("Failed");
        failed["status"]["containerStatuses"][0]["state"] = json!({"terminated": {
            "exitCode": 74, "reason": "Error", "finishedAt": "2026-11-30T11:30:00Z",
            "startedAt": "2026-11-30T10:00:30Z", "containerID": "containerd://3"}});
        failed["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][1]["health"] =
            json!("Healthy");
        failed["status"]["conditions"].as_array_mut().unwrap().pop();
        variations.push(failed.clone());
        let mut init_gpu = realistic_pod();
        init_gpu["spec"]["initContainers"][0]["resources"] =
            json!({"limits": {"amd.com/gpu": "1"}});
        variations.push(init_gpu);

        for (index, json) in variations.into_iter().enumerate() {
            let whole: Pod = serde_json::from_value(json.clone()).expect("a Pod");
            let watched: WatchedPod = serde_json::from_value(json).expect("a watched Pod");
            let facts = PodFacts::of(&watched.0, &policy);
            assert_eq!(facts, PodFacts::of(&whole, &policy), "variation {index}");
            assert_eq!(
                kube::ResourceExt::resource_version(&watched).as_deref(),
                Some("918273"),
                "the watch resumes from it"
            );
        }
        // The facts themselves, for the first: a device pod, hit, marked already.
        let pod: WatchedPod = serde_json::from_value(realistic_pod()).expect("a watched Pod");
        let facts = PodFacts::of(&pod.0, &policy);
        assert!(facts.is_device_pod() && facts.marked && facts.unhealthy.is_some());
        assert!(!facts.recreated_elsewhere, "a mirror pod");
        assert_eq!(facts.node.as_deref(), Some("gpu-7"));
        let pod: WatchedPod = serde_json::from_value(rank).expect("a watched Pod");
        let facts = PodFacts::of(&pod.0, &policy);
        assert_eq!(facts.gang.as_deref(), Some("c0ffee"));
        assert_eq!(facts.completion_index.as_deref(), Some("3"));
        assert!(facts.peer_marked && !facts.marked);
        assert_eq!(
            facts.created.map(|created| created.to_string()).as_deref(),
            Some("2026-11-30T10:00:00Z")
        );
        let pod: WatchedPod = serde_json::from_value(failed).expect("a watched Pod");
        let facts = PodFacts::of(&pod.0, &policy);
        let failure = facts.device_failure.as_deref().expect("a device failure");
        assert_eq!(failure.cause, "exit code 74 in container trainer");
        assert_eq!(failure.node, "gpu-7");
        assert_eq!(
            facts
                .workload()
                .map(|workload| workload.to_string())
                .as_deref(),
            Some("JobSet ml/llm")
        );
        let pod: WatchedPod = serde_json::from_value(dra).expect("a watched Pod");
        assert_eq!(
            PodFacts::of(&pod.0, &policy).claims,
            [
                "team-gpus",
                "train-worker-3-extended-resources-9qz4m",
                "train-worker-3-gpus-x7k2p"
            ]
        );
    }

    #[test]
    fn a_watched_pod_is_a_pod_to_the_api() {
        use kube::Resource;
        assert_eq!(WatchedPod::url_path(&(), None), "/api/v1/pods");
        assert_eq!(WatchedPod::kind(&()), "Pod");
    }
}
