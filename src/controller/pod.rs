//! PURE: was a pod hit by a device failure, and what should be done about it?
//!
//! A pod is hit when the kubelet reports one of its allocated devices `Unhealthy`
//! (`status.containerStatuses[].allocatedResourcesStatus`, beta in Kubernetes 1.36), or when
//! its node carries gpu-guard's degraded taint for a device resource the pod uses. The namespace
//! opt-in is the caller's to check.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::policy::{DEVICE_FAILURE_CONDITION, Policy};

/// The `reason` of the condition when a device of the pod is reported unhealthy.
pub const REASON_UNHEALTHY_DEVICE: &str = "UnhealthyDevice";
/// The `reason` of the condition when the pod's node is tainted degraded.
pub const REASON_NODE_DEGRADED: &str = "NodeDeviceDegraded";

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
        /// The resource (`nvidia.com/gpu`) or DRA claim (`claim:name/request`).
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
                super::node::TAINT_KEY,
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

/// Judges one pod. `node_state` is its node's (None: unknown or not scheduled).
///
/// A pod whose device the kubelet reports `Unhealthy` is a device user whatever it requests
/// (a DRA-only pod requests no device resource). A pod is evicted only if something recreates
/// it elsewhere: never a pod without a controller ownerReference (it would be lost), nor a
/// DaemonSet's pod (recreated on the same node, evicted again), nor, for its node's
/// degradation, a pod that tolerates gpu-guard's taint (the scheduler would put it back). Such
/// pods are still marked.
pub fn pod_verdict(pod: &Pod, node_state: Option<&NodeState>, policy: &Policy) -> Action {
    let status = pod.status.as_ref();
    let phase = status.and_then(|status| status.phase.as_deref());
    if phase == Some("Succeeded") {
        return Action::Nothing;
    }
    let uses = device_resources(pod, policy);
    let Some(cause) = unhealthy_device(pod, policy).or_else(|| {
        let node = pod.spec.as_ref()?.node_name.clone()?;
        let resource = uses
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
    let mark = settings.mark_pods && !is_marked(pod);
    let running = matches!(phase, None | Some("Pending" | "Running"));
    let tolerated = matches!(&cause, Cause::NodeDegraded { resource, .. }
        if tolerates(pod, &super::node::degraded_taint(resource, policy.controller.node_health.no_execute)));
    let evict = settings.evict_pods
        && running
        && pod.metadata.deletion_timestamp.is_none()
        && recreated_elsewhere(pod)
        && !tolerated;
    if mark || evict {
        Action::Act { cause, mark, evict }
    } else {
        Action::Nothing
    }
}

/// Whether the pod has a controller ownerReference that is not a DaemonSet: something that
/// recreates it, on another node.
pub fn recreated_elsewhere(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))
        .is_some_and(|owner| owner.kind != "DaemonSet")
}

/// Whether one of the pod's tolerations tolerates `taint` (as the scheduler matches them: an
/// empty key with `Exists` matches every key; an empty effect matches every effect).
pub fn tolerates(pod: &Pod, taint: &k8s_openapi::api::core::v1::Taint) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.tolerations.as_ref())
        .into_iter()
        .flatten()
        .any(|toleration| {
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
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == DEVICE_FAILURE_CONDITION && c.status == "True")
        })
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
/// configured device resource, or a DRA claim (`claim:...`).
fn unhealthy_device(pod: &Pod, policy: &Policy) -> Option<Cause> {
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
                let device_ids: Vec<String> = resource
                    .resources
                    .iter()
                    .flatten()
                    .filter(|device| device.health.as_deref() == Some("Unhealthy"))
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
/// `status.conditions` by `type`, so the pod's other conditions stay).
pub fn condition_patch(cause: &Cause, now: Timestamp) -> Value {
    json!({"status": {"conditions": [device_failure_condition(cause, now)]}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        PodSpec, PodStatus, ResourceHealth, ResourceRequirements, ResourceStatus,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn pod(resource: Option<&str>, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("train-0".to_owned()),
                namespace: Some("ml".to_owned()),
                owner_references: Some(vec![owner("Job")]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("gpu-1".to_owned()),
                containers: vec![Container {
                    name: "trainer".to_owned(),
                    resources: resource.map(|resource| ResourceRequirements {
                        limits: Some([(resource.to_owned(), Quantity("1".to_owned()))].into()),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                ..PodStatus::default()
            }),
        }
    }

    fn health(mut pod: Pod, resource: &str, devices: &[(&str, &str)]) -> Pod {
        pod.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: "trainer".to_owned(),
            allocated_resources_status: Some(vec![ResourceStatus {
                name: resource.to_owned(),
                resources: Some(
                    devices
                        .iter()
                        .map(|(id, health)| ResourceHealth {
                            resource_id: (*id).to_owned(),
                            health: Some((*health).to_owned()),
                            message: None,
                        })
                        .collect(),
                ),
            }]),
            ..ContainerStatus::default()
        }]);
        pod
    }

    fn owner(kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: "batch/v1".to_owned(),
            kind: kind.to_owned(),
            name: "train".to_owned(),
            uid: "uid-train".to_owned(),
            controller: Some(true),
            ..OwnerReference::default()
        }
    }

    fn marked(mut pod: Pod, status: &str) -> Pod {
        pod.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: DEVICE_FAILURE_CONDITION.to_owned(),
            status: status.to_owned(),
            ..PodCondition::default()
        }]);
        pod
    }

    fn deleting(mut pod: Pod) -> Pod {
        pod.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        pod
    }

    fn degraded(resource: &str) -> NodeState {
        NodeState {
            degraded: [resource.to_owned()].into(),
        }
    }

    fn unhealthy(ids: &[&str]) -> Cause {
        Cause::UnhealthyDevice {
            container: "trainer".to_owned(),
            resource: "nvidia.com/gpu".to_owned(),
            device_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
        }
    }

    fn node_degraded() -> Cause {
        Cause::NodeDegraded {
            node: "gpu-1".to_owned(),
            resource: "nvidia.com/gpu".to_owned(),
        }
    }

    fn act(cause: Cause, mark: bool, evict: bool) -> Action {
        Action::Act { cause, mark, evict }
    }

    /// (name, pod, node state, mark_pods, evict_pods, action)
    type Row = (&'static str, Pod, Option<NodeState>, bool, bool, Action);

    #[test]
    fn verdicts() {
        let gpu = Some("nvidia.com/gpu");
        let sick = |phase| {
            health(
                pod(gpu, phase),
                "nvidia.com/gpu",
                &[("GPU-a", "Healthy"), ("GPU-b", "Unhealthy")],
            )
        };
        let tainted = degraded("nvidia.com/gpu");
        // (name, pod, node state, mark_pods, evict_pods, action)
        let table: Vec<Row> = vec![
            (
                "healthy device pod",
                pod(gpu, "Running"),
                None,
                true,
                false,
                Action::Nothing,
            ),
            (
                "all devices healthy",
                health(
                    pod(gpu, "Running"),
                    "nvidia.com/gpu",
                    &[("GPU-a", "Healthy"), ("GPU-b", "Unknown")],
                ),
                None,
                true,
                true,
                Action::Nothing,
            ),
            (
                "unhealthy device: mark",
                sick("Running"),
                None,
                true,
                false,
                act(unhealthy(&["GPU-b"]), true, false),
            ),
            (
                "unhealthy device: mark and evict",
                sick("Running"),
                None,
                true,
                true,
                act(unhealthy(&["GPU-b"]), true, true),
            ),
            (
                "unhealthy device: evict only",
                sick("Pending"),
                None,
                false,
                true,
                act(unhealthy(&["GPU-b"]), false, true),
            ),
            (
                "neither configured",
                sick("Running"),
                None,
                false,
                false,
                Action::Nothing,
            ),
            (
                "already marked",
                marked(sick("Running"), "True"),
                None,
                true,
                false,
                Action::Nothing,
            ),
            (
                "already marked, eviction still due",
                marked(sick("Running"), "True"),
                None,
                true,
                true,
                act(unhealthy(&["GPU-b"]), false, true),
            ),
            (
                "a False condition is not a mark",
                marked(sick("Running"), "False"),
                None,
                true,
                false,
                act(unhealthy(&["GPU-b"]), true, false),
            ),
            (
                "failed pod: marked (the Job may not have counted it yet), never evicted",
                sick("Failed"),
                None,
                true,
                true,
                act(unhealthy(&["GPU-b"]), true, false),
            ),
            (
                "succeeded pod: nothing",
                sick("Succeeded"),
                None,
                true,
                true,
                Action::Nothing,
            ),
            (
                "terminating pod: not evicted again",
                deleting(sick("Running")),
                None,
                false,
                true,
                Action::Nothing,
            ),
            (
                "node tainted for the pod's resource",
                pod(gpu, "Running"),
                Some(tainted.clone()),
                true,
                true,
                act(node_degraded(), true, true),
            ),
            (
                "node tainted for another resource",
                pod(gpu, "Running"),
                Some(degraded("amd.com/gpu")),
                true,
                true,
                Action::Nothing,
            ),
            (
                "node not tainted",
                pod(gpu, "Running"),
                Some(NodeState::default()),
                true,
                true,
                Action::Nothing,
            ),
            (
                "not a device pod",
                pod(Some("cpu"), "Running"),
                Some(tainted.clone()),
                true,
                true,
                Action::Nothing,
            ),
            (
                "no resources",
                pod(None, "Running"),
                Some(tainted.clone()),
                true,
                true,
                Action::Nothing,
            ),
            (
                "the unhealthy device wins over the node",
                sick("Running"),
                Some(tainted.clone()),
                true,
                false,
                act(unhealthy(&["GPU-b"]), true, false),
            ),
            (
                "an unconfigured resource reported unhealthy is ignored",
                health(
                    pod(gpu, "Running"),
                    "example.com/fpga",
                    &[("F-1", "Unhealthy")],
                ),
                None,
                true,
                false,
                Action::Nothing,
            ),
            (
                "a DRA claim reported unhealthy counts",
                health(
                    pod(gpu, "Running"),
                    "claim:gpu/req-0",
                    &[("gpu-0", "Unhealthy")],
                ),
                None,
                true,
                false,
                act(
                    Cause::UnhealthyDevice {
                        container: "trainer".to_owned(),
                        resource: "claim:gpu/req-0".to_owned(),
                        device_ids: vec!["gpu-0".to_owned()],
                    },
                    true,
                    false,
                ),
            ),
        ];
        for (name, pod, node, mark_pods, evict_pods, expected) in table {
            let mut policy = Policy::default();
            policy.controller.pods.mark_pods = mark_pods;
            policy.controller.pods.evict_pods = evict_pods;
            assert_eq!(
                pod_verdict(&pod, node.as_ref(), &policy),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn init_containers_count_as_device_users() {
        let mut pod = pod(None, "Running");
        let spec = pod.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![Container {
            name: "warmup".to_owned(),
            resources: Some(ResourceRequirements {
                requests: Some(
                    [("nvidia.com/mig-1g.5gb".to_owned(), Quantity("1".to_owned()))].into(),
                ),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }]);
        assert_eq!(
            device_resources(&pod, &Policy::default()),
            ["nvidia.com/mig-1g.5gb".to_owned()].into()
        );
    }

    #[test]
    fn the_condition_patch() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        assert_eq!(
            condition_patch(&unhealthy(&["GPU-b", "GPU-c"]), now),
            json!({"status": {"conditions": [{
                "type": "gpu-guard.io/DeviceFailure",
                "status": "True",
                "reason": "UnhealthyDevice",
                "message": "nvidia.com/gpu device GPU-b, GPU-c allocated to container trainer is \
                            reported Unhealthy by the kubelet; gpu-guard marks the pod so its \
                            failure is retried",
                "lastTransitionTime": "2027-01-15T08:00:00Z",
            }]}})
        );
        assert_eq!(
            node_degraded().message(),
            "node gpu-1 is tainted gpu-guard.io/device-degraded=nvidia.com_gpu by gpu-guard: its \
             nvidia.com/gpu devices are degraded; gpu-guard marks the pod so its failure is retried"
        );
    }

    #[test]
    fn a_dra_only_pod_reported_unhealthy_is_marked_and_evicted() {
        // It requests no device resource: only a DRA claim, whose device the kubelet reports.
        let dra = health(
            pod(None, "Running"),
            "claim:gpu-claim/gpu",
            &[("gpu-0", "Unhealthy")],
        );
        let mut policy = Policy::default();
        policy.controller.pods.evict_pods = true;
        assert_eq!(
            pod_verdict(&dra, None, &policy),
            act(
                Cause::UnhealthyDevice {
                    container: "trainer".to_owned(),
                    resource: "claim:gpu-claim/gpu".to_owned(),
                    device_ids: vec!["gpu-0".to_owned()],
                },
                true,
                true
            )
        );
        // Healthy, or on a degraded node it does not use a device resource of: nothing.
        let fine = health(
            pod(None, "Running"),
            "claim:gpu-claim/gpu",
            &[("gpu-0", "Healthy")],
        );
        assert_eq!(
            pod_verdict(&fine, Some(&degraded("nvidia.com/gpu")), &policy),
            Action::Nothing
        );
    }

    #[test]
    fn pods_nothing_recreates_elsewhere_or_that_tolerate_the_taint_are_marked_not_evicted() {
        let mut policy = Policy::default();
        policy.controller.pods.evict_pods = true;
        let gpu = Some("nvidia.com/gpu");
        let tainted = degraded("nvidia.com/gpu");
        let sick = || {
            health(
                pod(gpu, "Running"),
                "nvidia.com/gpu",
                &[("GPU-b", "Unhealthy")],
            )
        };
        let on_node = |edit: &dyn Fn(&mut Pod)| {
            let mut pod = pod(gpu, "Running");
            edit(&mut pod);
            pod_verdict(&pod, Some(&tainted), &policy)
        };
        assert_eq!(on_node(&|_| {}), act(node_degraded(), true, true));
        // No controller: it would not be recreated.
        assert_eq!(
            on_node(&|pod| pod.metadata.owner_references = None),
            act(node_degraded(), true, false)
        );
        assert_eq!(
            on_node(&|pod| pod.metadata.owner_references.as_mut().unwrap()[0].controller = None),
            act(node_degraded(), true, false)
        );
        // A DaemonSet's pod comes back on the same node.
        assert_eq!(
            on_node(&|pod| pod.metadata.owner_references = Some(vec![owner("DaemonSet")])),
            act(node_degraded(), true, false)
        );
        let mut bare = sick();
        bare.metadata.owner_references = None;
        assert_eq!(
            pod_verdict(&bare, None, &policy),
            act(unhealthy(&["GPU-b"]), true, false)
        );
        // Tolerating the taint: the scheduler would put it back on the node.
        let toleration =
            |key: Option<&str>, operator: &str, value: Option<&str>, effect: Option<&str>| {
                k8s_openapi::api::core::v1::Toleration {
                    key: key.map(str::to_owned),
                    operator: Some(operator.to_owned()),
                    value: value.map(str::to_owned),
                    effect: effect.map(str::to_owned),
                    toleration_seconds: None,
                }
            };
        for (tolerations, tolerated) in [
            (
                vec![toleration(
                    Some(super::super::node::TAINT_KEY),
                    "Exists",
                    None,
                    None,
                )],
                true,
            ),
            (vec![toleration(None, "Exists", None, None)], true),
            (
                vec![toleration(
                    Some(super::super::node::TAINT_KEY),
                    "Equal",
                    Some("nvidia.com_gpu"),
                    Some("NoSchedule"),
                )],
                true,
            ),
            (
                vec![toleration(
                    Some(super::super::node::TAINT_KEY),
                    "Equal",
                    Some("amd.com_gpu"),
                    None,
                )],
                false,
            ),
            (
                vec![toleration(
                    Some(super::super::node::TAINT_KEY),
                    "Exists",
                    None,
                    Some("NoExecute"),
                )],
                false,
            ),
            (vec![toleration(Some("other"), "Exists", None, None)], false),
        ] {
            let verdict = on_node(&|pod| {
                pod.spec.as_mut().unwrap().tolerations = Some(tolerations.clone());
            });
            assert_eq!(
                verdict,
                act(node_degraded(), true, !tolerated),
                "{tolerations:?}"
            );
        }
        // An unhealthy device is evicted even when the pod tolerates the node's taint.
        let mut sick_tolerating = sick();
        sick_tolerating.spec.as_mut().unwrap().tolerations =
            Some(vec![toleration(None, "Exists", None, None)]);
        assert_eq!(
            pod_verdict(&sick_tolerating, Some(&tainted), &policy),
            act(unhealthy(&["GPU-b"]), true, true)
        );
    }
}
