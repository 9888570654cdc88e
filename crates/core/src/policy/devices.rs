//! The `devices` section of the policy file: the extended resources, DeviceClasses and DRA
//! drivers that mark a device. The rule that reads it is [`crate::devices`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Extended resources and DRA DeviceClasses that mark a container as using a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DeviceResources {
    /// Exact resource names, e.g. `nvidia.com/gpu`.
    pub names: Vec<String>,
    /// Name prefixes, e.g. `nvidia.com/mig-` for every MIG profile.
    pub prefixes: Vec<String>,
    /// Exact DRA DeviceClass names whose devices are devices, e.g. `gpu.nvidia.com`.
    pub classes: Vec<String>,
    /// DeviceClass name prefixes.
    pub class_prefixes: Vec<String>,
    /// DRA drivers whose devices are GPUs: the node health controller counts the devices their
    /// ResourceSlices publish for a node (and those tainted unusable), beside the extended
    /// resources of its status, and only their devices mark a pod the kubelet reports an
    /// unhealthy DRA device of.
    pub drivers: Vec<String>,
}

impl Default for DeviceResources {
    fn default() -> Self {
        Self {
            names: ["nvidia.com/gpu", "amd.com/gpu"].map(String::from).to_vec(),
            prefixes: vec!["nvidia.com/mig-".to_owned()],
            classes: ["gpu.nvidia.com", "mig.nvidia.com", "gpu.amd.com"]
                .map(String::from)
                .to_vec(),
            class_prefixes: Vec::new(),
            drivers: ["gpu.nvidia.com", "gpu.amd.com"].map(String::from).to_vec(),
        }
    }
}
