//! PURE: was a pod hit by a device failure, and what should be done about it?
//!
//! A pod is hit when the kubelet reports one of its allocated devices `Unhealthy`
//! (`status.containerStatuses[].allocatedResourcesStatus`, beta in Kubernetes 1.36), or when
//! its node carries gpu-guard's degraded taint for a device resource the pod uses. The namespace
//! opt-in is the caller's to check.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, ObjectReference, Pod, PodCondition, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

pub mod failure;
pub mod stuck;

pub use failure::{FailureCause, device_exit_codes, device_failure};

use crate::devices::NoDraFacts;
use crate::memory::{DeviceFailure, WorkloadKind, WorkloadRef, workload_of};
use crate::policy::Policy;
use crate::wellknown::{
    DEGRADED_TAINT_KEY, DEVICE_FAILURE_CONDITION, DEVICE_RETRIES_EXHAUSTED_CONDITION, GANG_KEY,
    PEER_DEVICE_FAILURE_CONDITION,
};

/// The `reason` of the condition when a device of the pod is reported unhealthy.
pub const REASON_UNHEALTHY_DEVICE: &str = "UnhealthyDevice";
/// The `reason` of the condition when the pod's node is tainted degraded.
pub const REASON_NODE_DEGRADED: &str = "NodeDeviceDegraded";
/// The `reason` of `gpu-guard.io/PeerDeviceFailure` on the peers of a gang pod hit by a device
/// failure.
pub const REASON_PEER_DEVICE_FAILURE: &str = "PeerDeviceFailure";

/// The label the Job controller puts on every pod of a Job, with the Job's uid (kubernetes
/// `pkg/controller/job`, `batch.kubernetes.io/controller-uid`; its selector matches it).
pub const JOB_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
/// The annotation (and, since Kubernetes 1.28, label) with the index of an Indexed Job's pod
/// (`batch.kubernetes.io/job-completion-index`).
pub const COMPLETION_INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";

/// What the controller knows of a pod's node: the device resources gpu-guard has tainted it
/// degraded for (in a dry run: would have).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    pub degraded: BTreeSet<String>,
}

/// Why a pod counts as hit by a device failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The kubelet reports a device allocated to a container `Unhealthy`.
    UnhealthyDevice {
        container: String,
        /// The resource (`nvidia.com/gpu`) or DRA claim (`claim:name/request`, or
        /// `claim:name` for a claim reference without a request).
        resource: String,
        device_ids: Vec<String>,
    },
    /// The pod's node is tainted degraded for a resource the pod uses.
    NodeDegraded { node: String, resource: String },
}

impl Cause {
    /// The condition's `reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnhealthyDevice { .. } => REASON_UNHEALTHY_DEVICE,
            Self::NodeDegraded { .. } => REASON_NODE_DEGRADED,
        }
    }

    /// The condition's `message`.
    pub fn message(&self) -> String {
        match self {
            Self::UnhealthyDevice {
                container,
                resource,
                device_ids,
            } => format!(
                "{resource} device {} allocated to container {container} is reported Unhealthy \
                 by the kubelet; gpu-guard marks the pod so its failure is retried",
                device_ids.join(", ")
            ),
            Self::NodeDegraded { node, resource } => format!(
                "node {node} is tainted {}={} by gpu-guard: its {resource} devices are degraded; \
                 gpu-guard marks the pod so its failure is retried",
                DEGRADED_TAINT_KEY,
                super::node::taint_value(resource)
            ),
        }
    }
}

/// What to do with a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing: not a device pod, not hit, finished, or already handled.
    Nothing,
    /// The pod was hit: add the condition (`mark`) and/or evict it (`evict`); at least one is
    /// true.
    Act {
        cause: Cause,
        mark: bool,
        evict: bool,
    },
}

/// What the controller keeps of a pod: the facts its decisions read, and nothing else (the
/// pod cache holds one per device pod, so 150,000 pods cost what their few device pods cost).
/// Built from a whole Pod by [`PodFacts::of`]; judged by [`verdict`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// `status.phase`.
    pub phase: Option<String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Something recreates it on another node ([`recreated_elsewhere`]).
    pub recreated_elsewhere: bool,
    pub tolerations: Vec<Toleration>,
    /// The device resources its containers and init containers request or limit
    /// ([`device_resources`]). A pass adds `dra/<driver>` for each policy driver that
    /// allocated one of its [`PodFacts::claims`] ([`PodFacts::with_claim_drivers`]).
    pub devices: BTreeSet<String>,
    /// The ResourceClaims (in the pod's namespace) its DRA devices come through
    /// ([`resource_claims`]), sorted.
    pub claims: Vec<String>,
    /// The first device the kubelet reports unhealthy, if any.
    pub unhealthy: Option<Cause>,
    /// It has `gpu-guard.io/DeviceFailure=True` already ([`is_marked`]).
    pub marked: bool,
    /// When that condition was set (its `lastTransitionTime`), if known.
    pub marked_at: Option<Timestamp>,
    /// It has `gpu-guard.io/PeerDeviceFailure=True` already.
    pub peer_marked: bool,
    /// Its Job's uid (the `batch.kubernetes.io/controller-uid` label), when the pod says it is
    /// one of a gang (`gpu-guard.io/gang: "true"`, set on the pod template by the mutation):
    /// the other pods of that Job are its peers ([`PodFacts::is_peer_of`]).
    pub gang: Option<String>,
    /// Its index in an Indexed Job (`batch.kubernetes.io/job-completion-index`).
    pub completion_index: Option<String>,
    /// `metadata.creationTimestamp`.
    pub created: Option<Timestamp>,
    /// `metadata.deletionTimestamp`: when the pod's grace period ends (it is set to the time
    /// of the deletion plus the grace period).
    pub deletion: Option<Timestamp>,
    /// A pod of a Job gpu-guard protects ([`stuck::is_protected`]).
    pub protected: bool,
    /// The kind and name of the workload whose device-failure memory its failures go to
    /// ([`workload_of`]; the namespace is the pod's): what ties a new pod to a workload whose
    /// free retries are spent.
    pub workload: Option<(WorkloadKind, String)>,
    /// Its device failure, once it has failed of one ([`device_failure`]). Boxed: the pod
    /// cache holds a word for the many pods that have not.
    pub device_failure: Option<Box<DeviceFailure>>,
    /// It has `gpu-guard.io/DeviceRetriesExhausted=True` already.
    pub retries_exhausted: bool,
}

impl PodFacts {
    /// The facts of `pod`, by `policy`'s devices.
    pub fn of(pod: &Pod, policy: &Policy) -> PodFacts {
        let spec = pod.spec.as_ref();
        PodFacts {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            node: spec.and_then(|spec| spec.node_name.clone()),
            phase: pod.status.as_ref().and_then(|status| status.phase.clone()),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            recreated_elsewhere: recreated_elsewhere(pod),
            tolerations: spec
                .and_then(|spec| spec.tolerations.clone())
                .unwrap_or_default(),
            devices: device_resources(pod, policy),
            claims: resource_claims(pod),
            unhealthy: unhealthy_device(pod, policy),
            marked: is_marked(pod),
            marked_at: condition(pod, DEVICE_FAILURE_CONDITION)
                .and_then(|condition| condition.last_transition_time.as_ref())
                .map(|time| time.0),
            peer_marked: condition(pod, PEER_DEVICE_FAILURE_CONDITION).is_some(),
            gang: gang_of(pod),
            completion_index: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(COMPLETION_INDEX_ANNOTATION))
                .cloned(),
            created: pod.metadata.creation_timestamp.as_ref().map(|time| time.0),
            deletion: pod.metadata.deletion_timestamp.as_ref().map(|time| time.0),
            protected: stuck::is_protected(pod),
            workload: workload_of(pod).map(|workload| (workload.kind, workload.name)),
            // Without the DRA objects: a container that names a claim counts as a device
            // container (its exit code must still be a device code). The pod cache reads
            // none, and a failed pod's claims may be gone already.
            device_failure: device_failure(pod, policy, &NoDraFacts).map(Box::new),
            retries_exhausted: condition(pod, DEVICE_RETRIES_EXHAUSTED_CONDITION).is_some(),
        }
    }

    /// The workload whose memory this pod's failures go to.
    pub fn workload(&self) -> Option<WorkloadRef> {
        self.workload.as_ref().map(|(kind, name)| WorkloadRef {
            kind: *kind,
            namespace: self.namespace.clone(),
            name: name.clone(),
        })
    }

    /// Whether the pod is one of `workload`'s, still to be given
    /// `gpu-guard.io/DeviceRetriesExhausted`: not finished, not carrying it yet.
    pub fn needs_retries_exhausted(&self, workload: &WorkloadRef) -> bool {
        self.namespace == workload.namespace
            && self
                .workload
                .as_ref()
                .is_some_and(|(kind, name)| *kind == workload.kind && *name == workload.name)
            && matches!(self.phase.as_deref(), None | Some("Pending" | "Running"))
            && !self.deleting
            && !self.retries_exhausted
    }

    /// Whether the running peers of this pod are to be marked `gpu-guard.io/PeerDeviceFailure`:
    /// it is one of a gang, it carries `gpu-guard.io/DeviceFailure` (or `marked`: this replica
    /// just marked it, and the cache may not show it yet), and its device failure is real
    /// now: the kubelet reports a device of it unhealthy, or the pod has failed. A pod marked
    /// only because its node is degraded, and running on a healthy device, leaves its peers
    /// alone: nothing has failed yet.
    pub fn peers_due(&self, marked: bool) -> bool {
        self.gang.is_some()
            && (self.marked || marked)
            && (self.unhealthy.is_some() || self.phase.as_deref() == Some("Failed"))
    }

    /// Whether this pod is a peer of `failed` still to mark: a pod of the same gang (same
    /// namespace and Job) other than `failed` and than its replacement (same completion index),
    /// not terminated, carrying neither condition yet, and, when `since` is given, created by
    /// then (a pod created after the failure is a replacement, not a rank that ran beside it).
    pub fn is_peer_of(&self, failed: &PodFacts, since: Option<Timestamp>) -> bool {
        let same_index =
            self.completion_index.is_some() && self.completion_index == failed.completion_index;
        self.gang.is_some()
            && self.gang == failed.gang
            && self.namespace == failed.namespace
            && self.uid != failed.uid
            && !same_index
            && matches!(self.phase.as_deref(), None | Some("Pending" | "Running"))
            && !self.marked
            && !self.peer_marked
            && since.is_none_or(|since| self.created.is_some_and(|created| created <= since))
    }

    /// Whether the controller has anything to judge: the pod uses a device resource, holds a
    /// ResourceClaim (which driver allocated it is known only at judging time), or the kubelet
    /// reports one of its devices unhealthy. Other pods are not cached.
    pub fn is_device_pod(&self) -> bool {
        !self.devices.is_empty() || !self.claims.is_empty() || self.unhealthy.is_some()
    }

    /// These facts with `dra/<driver>` added to [`PodFacts::devices`] for each of `drivers`
    /// (the drivers that allocated the pod's claims) that is one of the policy's
    /// `devices.drivers`: the name the node's DRA devices are judged under, so a pod on a node
    /// degraded for `dra/gpu.nvidia.com` is hit like a device-plugin pod on a node degraded
    /// for `nvidia.com/gpu`. `None`: nothing to add.
    pub fn with_claim_drivers<'a>(
        &self,
        drivers: impl IntoIterator<Item = &'a str>,
        policy: &Policy,
    ) -> Option<PodFacts> {
        let added: BTreeSet<String> = drivers
            .into_iter()
            .filter(|driver| policy.devices.is_device_driver(driver))
            .map(dra_resource)
            .filter(|resource| !self.devices.contains(resource))
            .collect();
        if added.is_empty() {
            return None;
        }
        let mut facts = self.clone();
        facts.devices.extend(added);
        Some(facts)
    }

    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the pod should be marked at once from its own watch event, before any node is
    /// judged: the kubelet reports a device unhealthy, the pod is not marked yet, marking is on,
    /// and the pod has not succeeded.
    pub fn needs_mark_now(&self, policy: &Policy) -> bool {
        policy.controller.pods.mark_pods
            && self.unhealthy.is_some()
            && !self.marked
            && self.phase.as_deref() != Some("Succeeded")
    }

    /// What an Event about the pod regards.
    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone()).filter(|uid| !uid.is_empty()),
            ..ObjectReference::default()
        }
    }

    /// Whether one of the pod's tolerations tolerates `taint` ([`tolerates`]).
    pub fn tolerates(&self, taint: &Taint) -> bool {
        tolerates(&self.tolerations, taint)
    }
}

/// Judges one pod. `node_state` is its node's (None: unknown or not scheduled).
pub fn pod_verdict(pod: &Pod, node_state: Option<&NodeState>, policy: &Policy) -> Action {
    verdict(&PodFacts::of(pod, policy), node_state, policy)
}

/// Judges one pod by its facts. `node_state` is its node's (None: unknown or not scheduled).
///
/// A pod whose device the kubelet reports `Unhealthy` is a device user whatever it requests
/// (a DRA-only pod requests no device resource). A pod is evicted only if something recreates
/// it elsewhere: never a pod without a controller ownerReference (it would be lost), nor a
/// DaemonSet's pod (recreated on the same node, evicted again), nor, for its node's
/// degradation, a pod that tolerates gpu-guard's taint (the scheduler would put it back). Such
/// pods are still marked.
pub fn verdict(facts: &PodFacts, node_state: Option<&NodeState>, policy: &Policy) -> Action {
    let phase = facts.phase.as_deref();
    if phase == Some("Succeeded") {
        return Action::Nothing;
    }
    let Some(cause) = facts.unhealthy.clone().or_else(|| {
        let node = facts.node.clone()?;
        let resource = facts
            .devices
            .iter()
            .find(|resource| node_state.is_some_and(|state| state.degraded.contains(*resource)))?;
        Some(Cause::NodeDegraded {
            node,
            resource: resource.clone(),
        })
    }) else {
        return Action::Nothing;
    };
    let settings = &policy.controller.pods;
    let mark = settings.mark_pods && !facts.marked;
    let running = matches!(phase, None | Some("Pending" | "Running"));
    let tolerated = matches!(&cause, Cause::NodeDegraded { resource, .. }
        if facts.tolerates(&super::node::degraded_taint(resource, policy.controller.node_health.no_execute)));
    let evict = settings.evict_pods
        && running
        && !facts.deleting
        && facts.recreated_elsewhere
        && !tolerated;
    if mark || evict {
        Action::Act { cause, mark, evict }
    } else {
        Action::Nothing
    }
}

/// Whether the pod has a controller ownerReference that is not a DaemonSet nor a Node:
/// something that recreates it, on another node. A mirror pod (the API server's copy of a
/// static pod: the annotation `kubernetes.io/config.mirror`, and a Node as its controller
/// owner) is never recreated elsewhere: evicting it only deletes the mirror, which the kubelet
/// creates again.
pub fn recreated_elsewhere(pod: &Pod) -> bool {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|annotations| annotations.contains_key(MIRROR_ANNOTATION));
    !mirror
        && pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|owner| owner.controller == Some(true))
            .is_some_and(|owner| !matches!(owner.kind.as_str(), "DaemonSet" | "Node"))
}

/// The annotation the kubelet puts on the mirror pod of a static pod (k8s.io/api `core/v1`,
/// `MirrorPodAnnotationKey`).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether a device the kubelet reports for a DRA claim is one of the policy's: its resource ID
/// names a driver of `devices.drivers`. The kubelet identifies a DRA device by the first CDI
/// device ID its driver returned for it (`<vendor>/<class>=<name>`), or else by
/// `<driver>/<pool>/<device>` (kubernetes `pkg/kubelet/cm/dra/manager.go`,
/// `buildResourceHealth`, as `test/e2e/dra` reads it); drivers conventionally name their CDI
/// vendor `k8s.<driver>` (NVIDIA/k8s-dra-driver-gpu `cdiVendor = "k8s." + DriverName`). So an
/// unhealthy NIC claimed through DRA does not mark a pod, and a device whose ID names no known
/// driver is not counted (never guessed to be a GPU).
pub fn is_policy_dra_device(resource_id: &str, policy: &Policy) -> bool {
    let Some((head, _)) = resource_id.split_once('/') else {
        return false;
    };
    let driver = head.strip_prefix("k8s.").unwrap_or(head);
    policy.devices.is_device_driver(head) || policy.devices.is_device_driver(driver)
}

/// Whether one of `tolerations` tolerates `taint` (as the scheduler matches them: an empty key
/// with `Exists` matches every key; an empty effect matches every effect).
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|toleration| {
        let effect = toleration.effect.as_deref().unwrap_or_default();
        if !effect.is_empty() && effect != taint.effect {
            return false;
        }
        let key = toleration.key.as_deref().unwrap_or_default();
        let exists = toleration.operator.as_deref() == Some("Exists");
        if key.is_empty() {
            return exists;
        }
        key == taint.key
            && (exists
                || toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default())
    })
}

/// Whether the pod already has `gpu-guard.io/DeviceFailure=True`.
pub fn is_marked(pod: &Pod) -> bool {
    condition(pod, DEVICE_FAILURE_CONDITION).is_some()
}

/// The pod's condition `type_` with status `True`.
fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|c| c.type_ == type_ && c.status == "True")
        })
}

/// The Job uid of a pod annotated `gpu-guard.io/gang: "true"` (see [`PodFacts::gang`]).
fn gang_of(pod: &Pod) -> Option<String> {
    let says_gang = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(GANG_KEY))
        .is_some_and(|value| value == "true");
    if !says_gang {
        return None;
    }
    pod.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(JOB_UID_LABEL))
        .filter(|uid| !uid.is_empty())
        .cloned()
}

/// The name node health gives the devices of a DRA driver (`dra/<driver>`).
pub fn dra_resource(driver: &str) -> String {
    format!("dra/{driver}")
}

/// The ResourceClaims, in the pod's namespace, its DRA devices come through, sorted: each
/// `spec.resourceClaims[].resourceClaimName` (a claim named directly), each
/// `status.resourceClaimStatuses[].resourceClaimName` (a claim generated from a
/// ResourceClaimTemplate), and `status.extendedResourceClaimStatus.resourceClaimName` (the claim
/// the scheduler makes when it allocates an extended resource such as `nvidia.com/gpu` through
/// a DeviceClass's `extendedResourceName`: KEP-5004, beta and on by default in Kubernetes 1.36).
/// A pod is bound to a node only once its claims are allocated, so the pods the controller
/// watches (bound ones) name them all.
pub fn resource_claims(pod: &Pod) -> Vec<String> {
    let direct = pod
        .spec
        .iter()
        .flat_map(|spec| spec.resource_claims.iter().flatten())
        .filter_map(|claim| claim.resource_claim_name.clone());
    let status = pod.status.as_ref();
    let generated = status
        .into_iter()
        .flat_map(|status| status.resource_claim_statuses.iter().flatten())
        .filter_map(|claim| claim.resource_claim_name.clone());
    let extended = status
        .and_then(|status| status.extended_resource_claim_status.as_ref())
        .map(|extended| extended.resource_claim_name.clone());
    let mut claims: Vec<String> = direct
        .chain(generated)
        .chain(extended)
        .filter(|name| !name.is_empty())
        .collect();
    claims.sort();
    claims.dedup();
    claims
}

/// The device resources the pod's containers and init containers request or limit, by name.
pub fn device_resources(pod: &Pod, policy: &Policy) -> BTreeSet<String> {
    let Some(spec) = &pod.spec else {
        return BTreeSet::new();
    };
    let containers: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    containers
        .into_iter()
        .filter_map(|container| container.resources.as_ref())
        .flat_map(|resources| {
            policy
                .devices
                .devices_in(resources.limits.as_ref(), resources.requests.as_ref())
                .map(|(_, name)| name.to_owned())
        })
        .collect()
}

/// The first device reported unhealthy in the container and init container statuses: a
/// configured device resource, or a device of a policy driver in a DRA claim. The kubelet names
/// a claim's entry `claim:<claim>/<request>`, or `claim:<claim>` when the container's claim
/// reference names no request (kubernetes `test/e2e/dra`, the health test: "the name of the
/// claim as declared in the container, including the request name if one was set there"):
/// both count.
pub(crate) fn unhealthy_device(pod: &Pod, policy: &Policy) -> Option<Cause> {
    let status = pod.status.as_ref()?;
    let statuses: Vec<&ContainerStatus> = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .collect();
    statuses.into_iter().find_map(|container| {
        container
            .allocated_resources_status
            .iter()
            .flatten()
            .filter(|resource| {
                policy.devices.is_device_resource(&resource.name)
                    || resource.name.starts_with("claim:")
            })
            .find_map(|resource| {
                let claimed = resource.name.starts_with("claim:");
                let device_ids: Vec<String> = resource
                    .resources
                    .iter()
                    .flatten()
                    .filter(|device| device.health.as_deref() == Some("Unhealthy"))
                    .filter(|device| !claimed || is_policy_dra_device(&device.resource_id, policy))
                    .map(|device| device.resource_id.clone())
                    .collect();
                (!device_ids.is_empty()).then(|| Cause::UnhealthyDevice {
                    container: container.name.clone(),
                    resource: resource.name.clone(),
                    device_ids,
                })
            })
    })
}

/// `gpu-guard.io/PeerDeviceFailure=True` for a peer of `failed`, the gang pod hit by a device
/// failure.
pub fn peer_condition(failed: &PodFacts, now: Timestamp) -> PodCondition {
    PodCondition {
        type_: PEER_DEVICE_FAILURE_CONDITION.to_owned(),
        status: "True".to_owned(),
        reason: Some(REASON_PEER_DEVICE_FAILURE.to_owned()),
        message: Some(peer_message(failed)),
        last_transition_time: Some(Time(now)),
        ..PodCondition::default()
    }
}

/// The message of [`peer_condition`], and of its Event.
pub fn peer_message(failed: &PodFacts) -> String {
    format!(
        "pod {} of the same gang, on node {}, was hit by a device failure; gpu-guard marks \
         this peer so its failure, which follows from it, is retried",
        failed.name,
        failed.node.as_deref().unwrap_or("(none)")
    )
}

/// The strategic merge patch that adds [`peer_condition`] to the pod whose uid is `uid` (see
/// [`condition_patch`] for the uid).
pub fn peer_condition_patch(uid: &str, failed: &PodFacts, now: Timestamp) -> Value {
    with_uid(
        json!({"status": {"conditions": [peer_condition(failed, now)]}}),
        uid,
    )
}

/// The `reason` of `gpu-guard.io/DeviceRetriesExhausted`.
pub const REASON_RETRY_BUDGET_EXHAUSTED: &str = "DeviceRetryBudgetExhausted";

/// The message of `gpu-guard.io/DeviceRetriesExhausted`, and of its Event: how many device
/// failures `workload` has on record against what budget.
pub fn retries_exhausted_message(workload: &WorkloadRef, total: u32, budget: u32) -> String {
    format!(
        "{workload} has {total} device failures on record, more than its budget of {budget} \
         free retries (controller.deviceRetries): from now on its pods' failures count against \
         backoffLimit"
    )
}

/// The strategic merge patch that adds `gpu-guard.io/DeviceRetriesExhausted=True` to the pod
/// `uid` (with the uid, so a pod recreated under its name is refused).
pub fn retries_exhausted_patch(uid: &str, message: &str, now: Timestamp) -> Value {
    let condition = PodCondition {
        type_: DEVICE_RETRIES_EXHAUSTED_CONDITION.to_owned(),
        status: "True".to_owned(),
        reason: Some(REASON_RETRY_BUDGET_EXHAUSTED.to_owned()),
        message: Some(message.to_owned()),
        last_transition_time: Some(Time(now)),
        ..PodCondition::default()
    };
    with_uid(json!({"status": {"conditions": [condition]}}), uid)
}

/// The condition gpu-guard adds.
pub fn device_failure_condition(cause: &Cause, now: Timestamp) -> PodCondition {
    PodCondition {
        type_: DEVICE_FAILURE_CONDITION.to_owned(),
        status: "True".to_owned(),
        reason: Some(cause.reason().to_owned()),
        message: Some(cause.message()),
        last_transition_time: Some(Time(now)),
        ..PodCondition::default()
    }
}

/// The strategic merge patch of `pods/{name}/status` that adds the condition (the API merges
/// `status.conditions` by `type`, so the pod's other conditions stay), for the pod whose uid is
/// `uid`. The uid makes the patch apply to that pod only, as the kubelet's status patches do
/// (kubernetes `pkg/util/pod/pod.go`, `preparePatchBytesForPodStatus`: "only put the uid in the
/// new object to ensure it appears in the patch as a precondition"; PR #86320): `metadata.uid`
/// cannot change, so the API server refuses the patch of a pod recreated under the same name
/// since it was cached (422 Invalid, `metadata.uid: field is immutable`, from the object meta
/// update validation). An empty uid (never, from the API server) adds no precondition.
pub fn condition_patch(uid: &str, cause: &Cause, now: Timestamp) -> Value {
    with_uid(
        json!({"status": {"conditions": [device_failure_condition(cause, now)]}}),
        uid,
    )
}

fn with_uid(mut patch: Value, uid: &str) -> Value {
    if !uid.is_empty() {
        patch["metadata"] = json!({"uid": uid});
    }
    patch
}

#[cfg(test)]
mod tests;
