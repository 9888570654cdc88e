//! PURE: which DaemonSets gpu-guard's taint would shut out of a node it taints.
//!
//! The DaemonSet controller creates no pod on a node with a `NoSchedule` or `NoExecute` taint
//! the pod template does not tolerate, and deletes its running pods for a `NoExecute` one
//! (kubernetes `pkg/controller/daemon/daemon_controller.go`, `NodeShouldRunDaemonPod`). The
//! device plugin, the DCGM exporter and the driver are DaemonSets: a node gpu-guard tainted
//! would then lose the agents that heal it, or never get them back after a roll-out. A GPU
//! DaemonSet (by the policy: its pod template requests a device resource, tolerates a GPU node
//! taint, or selects a GPU node label) must tolerate `gpu-guard.io/device-degraded` with
//! `operator: Exists` (the taint's value names the resource), for `NoSchedule`, and for
//! `NoExecute` too when `controller.nodeHealth.noExecute` is on.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{PodSpec, Toleration};

use crate::policy::Policy;
use crate::wellknown::DEGRADED_TAINT_KEY;

/// A GPU DaemonSet that does not tolerate gpu-guard's taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShutOut {
    /// `namespace/name`.
    pub daemonset: String,
    /// Why it is a GPU DaemonSet: `requests nvidia.com/gpu`, `tolerates the GPU node taint
    /// nvidia.com/gpu`, `selects the GPU node label nvidia.com/gpu.present`.
    pub gpu: String,
    /// The effects of gpu-guard's taint it does not tolerate.
    pub effects: Vec<&'static str>,
}

impl ShutOut {
    /// The warning, naming the fix.
    pub fn message(&self) -> String {
        format!(
            "DaemonSet {} {} but does not tolerate gpu-guard's taint {DEGRADED_TAINT_KEY} ({}): \
             on a node gpu-guard taints it gets no pod{}; add the toleration \
             {{key: {DEGRADED_TAINT_KEY}, operator: Exists}} to its pod template (see \
             docs/controller.md)",
            self.daemonset,
            self.gpu,
            self.effects.join(", "),
            if self.effects.contains(&"NoExecute") {
                ", and its running pod is evicted"
            } else {
                ""
            },
        )
    }
}

/// The effects gpu-guard's taint can have under `policy`: `NoSchedule` always (a node whose
/// device plugin is down gets `NoSchedule` even with `noExecute`), `NoExecute` with
/// `controller.nodeHealth.noExecute`.
pub fn taint_effects(policy: &Policy) -> Vec<&'static str> {
    if policy.controller.node_health.no_execute {
        vec!["NoSchedule", "NoExecute"]
    } else {
        vec!["NoSchedule"]
    }
}

/// `Some` when `daemonset` is a GPU DaemonSet that does not tolerate every taint gpu-guard may
/// add; `None` when it is not a GPU DaemonSet or tolerates them.
pub fn shut_out(daemonset: &DaemonSet, policy: &Policy) -> Option<ShutOut> {
    let spec = daemonset.spec.as_ref()?.template.spec.as_ref()?;
    let gpu = gpu_use(spec, policy)?;
    let effects: Vec<&'static str> = taint_effects(policy)
        .into_iter()
        .filter(|effect| {
            !spec
                .tolerations
                .iter()
                .flatten()
                .any(|toleration| tolerates_every_value(toleration, effect))
        })
        .collect();
    if effects.is_empty() {
        return None;
    }
    Some(ShutOut {
        daemonset: format!(
            "{}/{}",
            daemonset.metadata.namespace.as_deref().unwrap_or_default(),
            daemonset.metadata.name.as_deref().unwrap_or_default()
        ),
        gpu,
        effects,
    })
}

/// What makes a pod template a GPU one, by the policy: a device resource requested or limited
/// by a container or init container, a toleration of a GPU node taint (`guard.gpuNodeTaints`),
/// or a nodeSelector on a GPU node label (`guard.gpuNodeLabels`).
fn gpu_use(spec: &PodSpec, policy: &Policy) -> Option<String> {
    let requested = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|container| container.resources.as_ref())
        .find_map(|resources| {
            policy
                .devices
                .devices_in(resources.limits.as_ref(), resources.requests.as_ref())
                .map(|(_, resource)| resource.to_owned())
                .next()
        });
    if let Some(resource) = requested {
        return Some(format!("requests {resource}"));
    }
    let tolerated = spec.tolerations.iter().flatten().find_map(|toleration| {
        let key = toleration.key.as_deref()?;
        policy
            .guard
            .gpu_node_taints
            .iter()
            .any(|taint| taint == key)
            .then(|| key.to_owned())
    });
    if let Some(key) = tolerated {
        return Some(format!("tolerates the GPU node taint {key}"));
    }
    spec.node_selector
        .iter()
        .flatten()
        .find(|(key, value)| {
            policy
                .guard
                .gpu_node_labels
                .iter()
                .any(|label| label.key == **key && label.marks(value))
        })
        .map(|(key, value)| format!("selects the GPU node label {key}={value}"))
}

/// Whether `toleration` tolerates gpu-guard's taint of `effect` whatever its value (the value
/// names the degraded resource, so an `Equal` toleration covers one resource only): `Exists`
/// with the taint's key or no key, and no effect or that one.
fn tolerates_every_value(toleration: &Toleration, effect: &str) -> bool {
    let key = toleration.key.as_deref().unwrap_or_default();
    toleration.operator.as_deref() == Some("Exists")
        && (key.is_empty() || key == DEGRADED_TAINT_KEY)
        && toleration
            .effect
            .as_deref()
            .is_none_or(|own| own.is_empty() || own == effect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn daemonset(template: Value) -> DaemonSet {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"namespace": "gpu-operator", "name": "agent"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                     "template": {"metadata": {"labels": {"app": "agent"}}, "spec": template}},
        }))
        .expect("a DaemonSet")
    }

    fn container(resources: Value) -> Value {
        json!([{"name": "agent", "image": "agent", "resources": resources}])
    }

    /// (name, template, noExecute, what makes it GPU (None: not shut out), effects missing)
    type Row = (
        &'static str,
        Value,
        bool,
        Option<&'static str>,
        &'static [&'static str],
    );

    const PLUGIN_TOLERATION: &str =
        r#"{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}"#;

    #[test]
    fn gpu_daemonsets_that_do_not_tolerate_the_taint_are_found() {
        let plugin: Value = serde_json::from_str(PLUGIN_TOLERATION).unwrap();
        let ours = json!({"key": DEGRADED_TAINT_KEY, "operator": "Exists"});
        let table: Vec<Row> = vec![
            (
                "NVIDIA's device plugin manifest: tolerates only nvidia.com/gpu",
                json!({"containers": container(json!({})), "tolerations": [plugin.clone()]}),
                false,
                Some("tolerates the GPU node taint nvidia.com/gpu"),
                &["NoSchedule"],
            ),
            (
                "a DCGM-like agent requesting a GPU",
                json!({"containers": container(json!({"limits": {"nvidia.com/gpu": "1"}}))}),
                false,
                Some("requests nvidia.com/gpu"),
                &["NoSchedule"],
            ),
            (
                "a driver DaemonSet selecting GPU nodes by label",
                json!({"containers": container(json!({})),
                       "nodeSelector": {"nvidia.com/gpu.present": "true"}}),
                false,
                Some("selects the GPU node label nvidia.com/gpu.present=true"),
                &["NoSchedule"],
            ),
            (
                "an init container's device request counts",
                json!({"containers": container(json!({})),
                       "initContainers": [{"name": "init", "resources": {"requests": {"amd.com/gpu": "1"}}}]}),
                false,
                Some("requests amd.com/gpu"),
                &["NoSchedule"],
            ),
            (
                "tolerates gpu-guard's taint: fine",
                json!({"containers": container(json!({})), "tolerations": [plugin.clone(), ours.clone()]}),
                true,
                None,
                &[],
            ),
            (
                "tolerates every taint: fine",
                json!({"containers": container(json!({})),
                       "tolerations": [plugin.clone(), {"operator": "Exists"}]}),
                true,
                None,
                &[],
            ),
            (
                "tolerates NoSchedule only while noExecute is on: NoExecute missing",
                json!({"containers": container(json!({})),
                       "tolerations": [plugin.clone(), {"key": DEGRADED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]}),
                true,
                Some("tolerates the GPU node taint nvidia.com/gpu"),
                &["NoExecute"],
            ),
            (
                "tolerates NoSchedule only, noExecute off: fine",
                json!({"containers": container(json!({})),
                       "tolerations": [plugin.clone(), {"key": DEGRADED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]}),
                false,
                None,
                &[],
            ),
            (
                "an Equal toleration covers one resource only",
                json!({"containers": container(json!({})),
                       "tolerations": [plugin.clone(), {"key": DEGRADED_TAINT_KEY, "value": "nvidia.com_gpu"}]}),
                false,
                Some("tolerates the GPU node taint nvidia.com/gpu"),
                &["NoSchedule"],
            ),
            (
                "not a GPU DaemonSet (kube-proxy)",
                json!({"containers": container(json!({"requests": {"cpu": "100m"}})),
                       "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]}),
                true,
                None,
                &[],
            ),
        ];
        for (name, template, no_execute, gpu, effects) in table {
            let mut policy = Policy::default();
            policy.controller.node_health.no_execute = no_execute;
            let found = shut_out(&daemonset(template), &policy);
            assert_eq!(found.as_ref().map(|f| f.gpu.as_str()), gpu, "{name}");
            let missing: Vec<&str> = found.iter().flat_map(|f| f.effects.clone()).collect();
            assert_eq!(missing, effects, "{name}");
        }
    }

    #[test]
    fn the_warning_names_the_daemonset_and_the_fix() {
        let plugin: Value = serde_json::from_str(PLUGIN_TOLERATION).unwrap();
        let mut policy = Policy::default();
        policy.controller.node_health.no_execute = true;
        let found = shut_out(
            &daemonset(json!({"containers": container(json!({})), "tolerations": [plugin]})),
            &policy,
        )
        .expect("shut out");
        assert_eq!(
            found.message(),
            "DaemonSet gpu-operator/agent tolerates the GPU node taint nvidia.com/gpu but does \
             not tolerate gpu-guard's taint gpu-guard.io/device-degraded (NoSchedule, NoExecute): \
             on a node gpu-guard taints it gets no pod, and its running pod is evicted; add the \
             toleration {key: gpu-guard.io/device-degraded, operator: Exists} to its pod \
             template (see docs/controller.md)"
        );
    }
}
