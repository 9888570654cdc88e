//! The `guard` section of the policy file: who may run on GPU nodes.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The GPU-node priority guard (the validating webhook and `gpu-guard check`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Guard {
    /// Run the guard at all. When false, `/validate` allows everything.
    pub enabled: bool,
    /// What a violation does: Enforce (deny), Warn (allow with a warning) or Audit (allow
    /// with an audit annotation).
    pub mode: GuardMode,
    /// Per-namespace overrides of `mode`, e.g. `{research: Warn}`.
    pub namespace_modes: BTreeMap<String, GuardMode>,
    /// The effective priority a pod that targets GPU nodes must reach.
    pub minimum_priority: MinimumPriority,
    /// Keys of the taints GPU nodes carry. A pod that tolerates one targets GPU nodes.
    pub gpu_node_taints: Vec<String>,
    /// The effects of those taints. A toleration limited to another effect (say
    /// `effect: NoExecute` when GPU taints are `NoSchedule`) does not tolerate them.
    pub gpu_node_taint_effects: Vec<TaintEffect>,
    /// Node labels that mark a GPU node. A pod whose nodeSelector or required node affinity
    /// selects one targets GPU nodes; a node that carries one is a GPU node.
    pub gpu_node_labels: Vec<GpuNodeLabel>,
    /// Who the guard never judges.
    pub exemptions: Exemptions,
    /// Cluster facts for `serve --no-cluster` and `gpu-guard check` (a connected server reads
    /// them from the API server instead).
    pub offline: OfflineCluster,
}

impl Default for Guard {
    fn default() -> Self {
        Self {
            enabled: true,
            mode: GuardMode::Enforce,
            namespace_modes: BTreeMap::new(),
            minimum_priority: MinimumPriority::default(),
            gpu_node_taints: ["nvidia.com/gpu", "amd.com/gpu"].map(String::from).to_vec(),
            gpu_node_taint_effects: vec![TaintEffect::NoSchedule],
            gpu_node_labels: vec![
                GpuNodeLabel {
                    key: "nvidia.com/gpu.present".to_owned(),
                    values: vec!["true".to_owned()],
                },
                GpuNodeLabel {
                    key: "nvidia.com/gpu.product".to_owned(),
                    values: Vec::new(),
                },
                GpuNodeLabel {
                    key: "nvidia.com/gpu.count".to_owned(),
                    values: Vec::new(),
                },
            ],
            exemptions: Exemptions::default(),
            offline: OfflineCluster::default(),
        }
    }
}

impl Guard {
    /// The mode for objects in `namespace`.
    pub fn mode_for(&self, namespace: &str) -> GuardMode {
        self.namespace_modes
            .get(namespace)
            .copied()
            .unwrap_or(self.mode)
    }
}

/// A taint effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

/// What a violation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum GuardMode {
    /// Deny the request (HTTP 200, `allowed: false`, code 403).
    Enforce,
    /// Allow it with a warning `kubectl` shows.
    Warn,
    /// Allow it silently, with an audit annotation in the API server's audit log.
    Audit,
}

impl GuardMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "Enforce",
            Self::Warn => "Warn",
            Self::Audit => "Audit",
        }
    }
}

/// The two minimums.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MinimumPriority {
    /// For a pod that would share a GPU node without using a device (it only tolerates the
    /// taint, selects the label or names the node).
    pub without_device: i32,
    /// For a pod that requests or limits a device.
    pub with_device: i32,
}

impl Default for MinimumPriority {
    fn default() -> Self {
        Self {
            without_device: 1000,
            with_device: 0,
        }
    }
}

/// A node label that marks GPU nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuNodeLabel {
    /// The label key, e.g. `nvidia.com/gpu.present` or `node.kubernetes.io/instance-type`.
    pub key: String,
    /// The values that mark a GPU node (e.g. `["true"]`, or GPU instance types). Empty: any
    /// value does, and so do the `Exists`, `Gt` and `Lt` operators on the key.
    #[serde(default)]
    pub values: Vec<String>,
}

impl GpuNodeLabel {
    /// Whether a node whose label `key` has `value` is a GPU node by this entry.
    pub fn marks(&self, value: &str) -> bool {
        self.values.is_empty() || self.values.iter().any(|v| v == value)
    }
}

/// Who the guard never judges. Set only here: an administrator's decision, which no
/// annotation on an object can make (`gpu-guard.io/skip` does not bypass the guard).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Exemptions {
    /// Namespaces whose objects are never judged.
    pub namespaces: Vec<String>,
    /// Pods and templates with one of these `priorityClassName`s are never judged.
    pub priority_classes: Vec<String>,
    /// Node agents: a DaemonSet, and a Pod whose controller is a DaemonSet, that uses no
    /// device is not judged. A DaemonSet puts one pod on each node it selects, by design,
    /// whatever the demand: it does not compete for GPU nodes as a workload does, and the GPU
    /// stack's own agents (device plugins, GPU feature discovery, DCGM exporter, DRA kubelet
    /// plugins, node-feature-discovery workers) are DaemonSets that must run on GPU nodes. A
    /// DaemonSet that requests or claims a device is still judged (`withDevice`). False:
    /// DaemonSets are judged like every other workload.
    pub node_agents: bool,
    /// Workloads that must run on GPU nodes and are not node agents, matched by namespace,
    /// name and kind, and their pods through their controller.
    pub workloads: Vec<ExemptWorkload>,
}

impl Default for Exemptions {
    fn default() -> Self {
        Self {
            namespaces: Vec::new(),
            priority_classes: Vec::new(),
            node_agents: true,
            workloads: Vec::new(),
        }
    }
}

/// A workload exempt from the guard, matched by namespace and name; its pods are matched
/// through their controller (ownerReferences).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExemptWorkload {
    pub namespace: String,
    pub name: String,
    /// The kind (`DaemonSet`, `Deployment`, ...); any kind when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Cluster facts used without an API server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OfflineCluster {
    /// PriorityClasses (beyond the built-in system-cluster-critical and system-node-critical).
    pub priority_classes: Vec<OfflinePriorityClass>,
    /// Names of the GPU nodes, for pods that name one in `spec.nodeName`.
    pub gpu_nodes: Vec<String>,
}

/// A PriorityClass known offline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OfflinePriorityClass {
    pub name: String,
    pub value: i32,
    /// The class pods get when they name none (at most one class may set it).
    #[serde(default)]
    pub global_default: bool,
}
