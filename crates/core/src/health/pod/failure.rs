//! PURE: is a pod's failure a device failure? What goes into its workload's record
//! ([`crate::memory`]); here, beside the controller's other verdicts on pods, because it reads
//! what they read (gpu-guard's condition, the kubelet's device health).

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;

use super::{Cause, is_marked, unhealthy_device};
use crate::devices::{ContainerResources, DraFacts};
use crate::memory::DeviceFailure;
use crate::policy::{Policy, RuleAction};
use crate::wellknown::DEVICE_FAILURE_CONDITION;

/// Why a pod's failure is a device failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureCause {
    /// A container that uses a device exited with one of the policy's free-retry codes.
    ExitCode { container: String, code: i32 },
    /// The pod carries `gpu-guard.io/DeviceFailure=True`.
    Marked,
    /// The kubelet reported a device of the pod `Unhealthy`.
    Unhealthy(Cause),
}

impl FailureCause {
    pub fn describe(&self) -> String {
        match self {
            Self::ExitCode { container, code } => {
                format!("exit code {code} in container {container}")
            }
            Self::Marked => format!("condition {DEVICE_FAILURE_CONDITION}"),
            Self::Unhealthy(Cause::UnhealthyDevice {
                container,
                resource,
                device_ids,
            }) => format!(
                "{resource} device {} of container {container} reported Unhealthy",
                device_ids.join(", ")
            ),
            Self::Unhealthy(Cause::NodeDegraded { node, resource }) => {
                format!("node {node} degraded for {resource}")
            }
        }
    }
}

/// The exit codes the policy makes free retries (its `Ignore` exit-code rules): the codes by
/// which an application says its device failed.
pub fn device_exit_codes(policy: &Policy) -> impl Iterator<Item = i32> + '_ {
    policy
        .mutation
        .pod_failure_policy
        .exit_code_rules
        .iter()
        .filter(|rule| rule.action == RuleAction::Ignore)
        .flat_map(|rule| rule.codes.iter().copied())
}

/// The device failure of a failed pod (`status.phase: Failed`, bound to a node), or `None`
/// when it failed of something else or has not failed. `dra` tells which DRA claims are
/// devices; a container that names a claim nobody can resolve counts as a device container
/// (only its exit code in the device codes makes it a failure).
///
/// The order is the injected podFailurePolicy's: `gpu-guard.io/DeviceFailure=True` counts
/// even beside `DisruptionTarget` (gpu-guard evicted the pod for its device); otherwise
/// `DisruptionTarget=True` (a drain, a preemption) is never a device failure.
pub fn device_failure(pod: &Pod, policy: &Policy, dra: &dyn DraFacts) -> Option<DeviceFailure> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Failed") {
        return None;
    }
    let node = pod
        .spec
        .as_ref()?
        .node_name
        .clone()
        .filter(|n| !n.is_empty())?;
    let (cause, at, devices) = if is_marked(pod) {
        (
            FailureCause::Marked,
            condition_time(pod, DEVICE_FAILURE_CONDITION),
            Vec::new(),
        )
    } else if has_true(pod, "DisruptionTarget") {
        return None;
    } else if let Some(cause) = unhealthy_device(pod, policy) {
        let devices = match &cause {
            Cause::UnhealthyDevice { device_ids, .. } => device_ids.clone(),
            Cause::NodeDegraded { .. } => Vec::new(),
        };
        (FailureCause::Unhealthy(cause), None, devices)
    } else {
        let (container, code, at) = device_exit(pod, policy, dra)?;
        (FailureCause::ExitCode { container, code }, at, Vec::new())
    };
    Some(DeviceFailure {
        node,
        pod: pod.metadata.name.clone().unwrap_or_default(),
        devices,
        at: at.or_else(|| finished_at(status.container_statuses.iter().flatten())),
        cause: cause.describe(),
    })
}

/// The first device container (init containers first, as they run) that terminated with a
/// device exit code, not by an OOM kill: its name, code and when.
fn device_exit(
    pod: &Pod,
    policy: &Policy,
    dra: &dyn DraFacts,
) -> Option<(String, i32, Option<Timestamp>)> {
    let spec = pod.spec.as_ref()?;
    let status = pod.status.as_ref()?;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let codes: Vec<i32> = device_exit_codes(policy).collect();
    let uses_device = |name: &str| {
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .find(|container| container.name == name)
            .is_some_and(|container| {
                let found = policy.devices.container_devices(
                    ContainerResources::of(container),
                    spec.resource_claims.as_deref(),
                    namespace,
                    dra,
                );
                found.uses_device() || !found.unresolved.is_empty()
            })
    };
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find_map(|container| {
            let terminated = container.state.as_ref()?.terminated.as_ref()?;
            let device_code = codes.contains(&terminated.exit_code)
                && terminated.reason.as_deref() != Some("OOMKilled")
                && uses_device(&container.name);
            device_code.then(|| {
                (
                    container.name.clone(),
                    terminated.exit_code,
                    terminated.finished_at.as_ref().map(|time| time.0),
                )
            })
        })
}

/// When the pod's condition `type_` turned `True`.
fn condition_time(pod: &Pod, type_: &str) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|time| time.0)
}

fn has_true(pod: &Pod, type_: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == "True")
        })
}

/// The latest `finishedAt` of the terminated containers.
fn finished_at<'a>(statuses: impl Iterator<Item = &'a ContainerStatus>) -> Option<Timestamp> {
    statuses
        .filter_map(|status| {
            status
                .state
                .as_ref()?
                .terminated
                .as_ref()?
                .finished_at
                .as_ref()
        })
        .map(|time| time.0)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::NoDraFacts;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "train-0-abcde", "namespace": "ml",
                "labels": {"batch.kubernetes.io/job-name": "train"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                     "uid": "u1", "controller": true}]
            },
            "spec": {
                "nodeName": "gpu-3",
                "restartPolicy": "Never",
                "containers": [
                    {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}},
                    {"name": "logger"}
                ]
            },
            "status": status
        }))
        .unwrap()
    }

    fn terminated(container: &str, code: i32, reason: &str) -> serde_json::Value {
        json!({"name": container, "state": {"terminated": {
            "exitCode": code, "reason": reason, "finishedAt": "2026-12-04T10:00:00Z"}}})
    }

    fn failed(statuses: Vec<serde_json::Value>, conditions: serde_json::Value) -> Pod {
        pod(json!({"phase": "Failed", "containerStatuses": statuses, "conditions": conditions}))
    }

    #[test]
    fn what_is_and_is_not_a_device_failure() {
        let policy = Policy::embedded();
        let cause = |pod: &Pod| device_failure(pod, &policy, &NoDraFacts).map(|f| f.cause);
        let exit = |container: &str, code: i32, reason: &str| {
            failed(vec![terminated(container, code, reason)], json!([]))
        };
        assert_eq!(
            cause(&exit("trainer", 74, "Error")).as_deref(),
            Some("exit code 74 in container trainer")
        );
        assert_eq!(
            cause(&exit("trainer", 138, "Error")).as_deref(),
            Some("exit code 138 in container trainer")
        );
        // Other codes, OOM kills and containers without a device are not.
        assert_eq!(cause(&exit("trainer", 1, "Error")), None);
        assert_eq!(cause(&exit("trainer", 74, "OOMKilled")), None);
        assert_eq!(cause(&exit("logger", 74, "Error")), None);
        // A drain or a preemption is not; gpu-guard's own mark is, even beside it.
        let drained = failed(
            vec![terminated("trainer", 74, "Error")],
            json!([{"type": "DisruptionTarget", "status": "True"}]),
        );
        assert_eq!(cause(&drained), None);
        let marked = failed(
            vec![terminated("trainer", 143, "Error")],
            json!([{"type": "DisruptionTarget", "status": "True"},
                   {"type": "gpu-guard.io/DeviceFailure", "status": "True",
                    "lastTransitionTime": "2026-12-04T09:59:00Z"}]),
        );
        let found = device_failure(&marked, &policy, &NoDraFacts).unwrap();
        assert_eq!(found.cause, "condition gpu-guard.io/DeviceFailure");
        assert_eq!(found.at, Some("2026-12-04T09:59:00Z".parse().unwrap()));
        assert_eq!(found.node, "gpu-3");
        // A pod that has not failed, or never ran on a node, is not.
        let running = pod(json!({"phase": "Running"}));
        assert_eq!(cause(&running), None);
    }

    #[test]
    fn an_unhealthy_device_names_its_ids() {
        let policy = Policy::embedded();
        let pod = failed(
            vec![
                json!({"name": "trainer", "state": {"terminated": {"exitCode": 1}},
                "allocatedResourcesStatus": [{"name": "nvidia.com/gpu", "resources": [
                    {"resourceID": "GPU-1", "health": "Healthy"},
                    {"resourceID": "GPU-2", "health": "Unhealthy"}]}]}),
            ],
            json!([]),
        );
        let found = device_failure(&pod, &policy, &NoDraFacts).unwrap();
        assert_eq!(found.devices, ["GPU-2"]);
    }
}
