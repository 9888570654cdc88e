//! Which containers of a pod template use a device.

use k8s_openapi::api::core::v1::{Container, PodSpec};

use crate::devices::{ContainerResources, DeviceResources, DraFacts};

/// The containers of a pod template that exit-code rules should name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceContainers {
    /// Containers whose exit codes the device rules match: regular containers and run-to-
    /// completion init containers that request or limit a device (every regular container when
    /// the Job opted in without a device request), in pod order, regular containers first.
    pub targets: Vec<String>,
    /// Native sidecars (init containers with `restartPolicy: Always`) that use a device. The Job
    /// controller sees them exit 137/143 at every shutdown, so exit-code rules never name them.
    pub device_sidecars: Vec<String>,
    /// Whether the pod has any native sidecar.
    pub has_sidecars: bool,
    /// DRA claims that could not be resolved, one warning each (not counted as devices).
    pub unresolved: Vec<String>,
}

impl DeviceContainers {
    /// Whether the Job is not a device workload at all.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty() && self.device_sidecars.is_empty()
    }
}

/// Finds the device containers of a pod template of a workload in `namespace`, with the DRA
/// objects `facts` knows. With `opted_in`, a template that requests no device is treated as
/// if every regular container did.
pub fn device_containers(
    pod: &PodSpec,
    devices: &DeviceResources,
    opted_in: bool,
    namespace: &str,
    facts: &dyn DraFacts,
) -> DeviceContainers {
    let mut unresolved = Vec::new();
    let mut uses_device = |container: &Container| {
        let found = devices.container_devices(
            ContainerResources::of(container),
            pod.resource_claims.as_deref(),
            namespace,
            facts,
        );
        unresolved.extend(found.unresolved.iter().map(|claim| {
            format!(
                "{claim} of container {:?}: not counted as a device",
                container.name
            )
        }));
        found.uses_device()
    };
    let mut found = DeviceContainers::default();
    for container in &pod.containers {
        if uses_device(container) {
            found.targets.push(container.name.clone());
        }
    }
    for container in pod.init_containers.iter().flatten() {
        let sidecar = container.restart_policy.as_deref() == Some("Always");
        found.has_sidecars |= sidecar;
        if uses_device(container) {
            if sidecar {
                found.device_sidecars.push(container.name.clone());
            } else {
                found.targets.push(container.name.clone());
            }
        }
    }
    found.unresolved = unresolved;
    if found.is_empty() && opted_in {
        found.targets = pod.containers.iter().map(|c| c.name.clone()).collect();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::NoDraFacts;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> PodSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn table() {
        let devices = DeviceResources::default();
        let cases = [
            (
                "limit on a regular container",
                json!({"containers": [
                    {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "metrics", "resources": {"requests": {"cpu": "1"}}}]}),
                false,
                vec!["main"],
                vec![],
            ),
            (
                "request of a MIG profile matches the prefix",
                json!({"containers": [
                    {"name": "a", "resources": {"requests": {"nvidia.com/mig-1g.5gb": "1"}}}]}),
                false,
                vec!["a"],
                vec![],
            ),
            (
                "init containers: run-to-completion is a target, a native sidecar is not",
                json!({"containers": [{"name": "main"}],
                       "initContainers": [
                    {"name": "warmup", "resources": {"limits": {"amd.com/gpu": "1"}}},
                    {"name": "sidecar", "restartPolicy": "Always",
                     "resources": {"limits": {"amd.com/gpu": "1"}}}]}),
                false,
                vec!["warmup"],
                vec!["sidecar"],
            ),
            (
                "no device, not opted in",
                json!({"containers": [{"name": "main", "resources": {"limits": {"cpu": "1"}}}]}),
                false,
                vec![],
                vec![],
            ),
            (
                "no device, opted in: every regular container",
                json!({"containers": [{"name": "a"}, {"name": "b"}]}),
                true,
                vec!["a", "b"],
                vec![],
            ),
        ];
        for (name, spec, opted_in, targets, sidecars) in cases {
            let found = device_containers(&pod(spec), &devices, opted_in, "ns", &NoDraFacts);
            assert_eq!(found.targets, targets, "{name}");
            assert_eq!(found.device_sidecars, sidecars, "{name}");
        }
    }
}
