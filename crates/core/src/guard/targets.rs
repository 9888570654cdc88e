//! What makes a pod spec target GPU nodes: a device request or DRA claim, a toleration of a GPU
//! node taint, a node selector or required node-affinity term on a GPU node label, or a GPU node
//! named outright; and what makes a node a GPU node.

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement};

use super::input::PodSpecView;
use super::verdict::{NotSynced, Target};
use super::view::{ClusterView, KnownNode};
use crate::devices::{ContainerResources, DeviceResources, DeviceUse, UnresolvedClaim};
use crate::field::FieldPath;
use crate::policy::Guard;

/// Every reason the pod spec at `spec_path` targets GPU nodes, in field order.
#[allow(clippy::too_many_arguments)]
pub(super) fn targets(
    spec_path: &FieldPath,
    spec: &PodSpecView,
    guard: &Guard,
    devices: &DeviceResources,
    view: &dyn ClusterView,
    placed_by_daemonset: bool,
    namespace: &str,
) -> Result<(Vec<Target>, Vec<UnresolvedClaim>), NotSynced> {
    let mut found = Vec::new();
    let mut unresolved = Vec::new();
    for (list, containers) in [
        ("containers", &spec.containers),
        ("initContainers", &spec.init_containers),
    ] {
        for (index, container) in containers.iter().flatten().enumerate() {
            let Some(resources) = &container.resources else {
                continue;
            };
            let resources_path = || spec_path.child(list).index(index).child("resources");
            let uses = devices.container_devices(
                ContainerResources {
                    limits: resources.limits.as_ref(),
                    requests: resources.requests.as_ref(),
                    claims: resources.claims.as_deref(),
                },
                spec.resource_claims.as_deref(),
                namespace,
                view.dra(),
            );
            // One reason per container is enough.
            match uses.devices.first() {
                Some(DeviceUse::Resource { field, resource }) => found.push(Target {
                    path: resources_path().child(*field).key(resource),
                    what: format!("container {:?} uses the device {resource}", container.name),
                    undo: format!("the {resource} request"),
                    device: true,
                }),
                Some(DeviceUse::Claim {
                    index: at,
                    claim,
                    class,
                }) => found.push(Target {
                    path: resources_path().child("claims").index(*at),
                    what: format!(
                        "container {:?} uses a device of DeviceClass {class} (DRA claim \
                         {claim:?})",
                        container.name
                    ),
                    undo: format!("the {claim} claim"),
                    device: true,
                }),
                None => unresolved.extend(uses.unresolved),
            }
        }
    }
    for (index, toleration) in spec.tolerations.iter().flatten().enumerate() {
        let key = toleration.key.as_deref().unwrap_or_default();
        let operator = toleration.operator.as_deref().unwrap_or("Equal");
        let path = spec_path.child("tolerations").index(index);
        // A toleration limited to one effect tolerates only taints of that effect.
        let effect = toleration.effect.as_deref().unwrap_or_default();
        if !effect.is_empty()
            && !guard
                .gpu_node_taint_effects
                .iter()
                .any(|gpu| gpu.as_str() == effect)
        {
            continue;
        }
        if key.is_empty() && operator == "Exists" {
            found.push(Target {
                path,
                what: "tolerates every taint (operator Exists without a key), GPU taints included"
                    .to_owned(),
                undo: "the tolerate-everything toleration (list the taints it needs instead)"
                    .to_owned(),
                device: false,
            });
        } else if guard.gpu_node_taints.iter().any(|taint| taint == key) {
            found.push(Target {
                path,
                what: format!("tolerates the GPU node taint {key}"),
                undo: format!("the {key} toleration"),
                device: false,
            });
        }
    }
    for (key, value) in spec.node_selector.iter().flatten() {
        if guard
            .gpu_node_labels
            .iter()
            .any(|label| label.key == *key && label.marks(value))
        {
            found.push(Target {
                path: spec_path.child("nodeSelector").key(key),
                what: format!("selects the GPU node label {key}={value}"),
                undo: format!("the {key} node selector"),
                device: false,
            });
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|affinity| affinity.node_affinity.as_ref())
        .and_then(|node_affinity| node_affinity.required.as_ref());
    if let Some(required) = required {
        let terms_path = spec_path
            .child("affinity")
            .child("nodeAffinity")
            .child("requiredDuringSchedulingIgnoredDuringExecution")
            .child("nodeSelectorTerms");
        for (index, term) in required.node_selector_terms.iter().enumerate() {
            let term_path = terms_path.index(index);
            for (field, requirements) in [
                ("matchExpressions", &term.match_expressions),
                ("matchFields", &term.match_fields),
            ] {
                for (at, requirement) in requirements.iter().flatten().enumerate() {
                    let selects = if field == "matchExpressions" {
                        label_requirement_selects_gpu(requirement, guard)
                    } else if placed_by_daemonset {
                        None
                    } else {
                        node_requirement_selects_gpu(requirement, guard, devices, view)?
                    };
                    if let Some(what) = selects {
                        found.push(Target {
                            path: term_path.child(field).index(at),
                            what: format!("requires {what}"),
                            undo: format!("the GPU requirement of node affinity term {index}"),
                            device: false,
                        });
                    }
                }
            }
        }
    }
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty())
        && !placed_by_daemonset
        && let Some(why) = gpu_node(node, guard, devices, view)?
    {
        let path = spec_path.child("nodeName");
        found.push(Target {
            undo: path.to_string(),
            path,
            what: format!("names the GPU node {node} ({why})"),
            device: false,
        });
    }
    Ok((found, unresolved))
}

/// Whether a label requirement of a node-affinity term can only be met by GPU nodes: `In`
/// with a GPU value of a GPU label, or `Exists`/`Gt`/`Lt` on a label any value of which marks a
/// GPU node. `NotIn` and `DoesNotExist` select away from GPU nodes.
fn label_requirement_selects_gpu(
    requirement: &NodeSelectorRequirement,
    guard: &Guard,
) -> Option<String> {
    let labels = guard
        .gpu_node_labels
        .iter()
        .filter(|label| label.key == requirement.key);
    for label in labels {
        let values = requirement.values.iter().flatten();
        match requirement.operator.as_str() {
            "In" => {
                if let Some(value) = values.into_iter().find(|value| label.marks(value)) {
                    return Some(format!("GPU label {}={value}", label.key));
                }
            }
            "Exists" | "Gt" | "Lt" if label.values.is_empty() => {
                return Some(format!(
                    "GPU label {} ({})",
                    label.key, requirement.operator
                ));
            }
            _ => {}
        }
    }
    None
}

/// Whether a `matchFields` requirement names a GPU node (`metadata.name In [...]`, as the
/// DaemonSet controller sets on the pods it creates).
fn node_requirement_selects_gpu(
    requirement: &NodeSelectorRequirement,
    guard: &Guard,
    devices: &DeviceResources,
    view: &dyn ClusterView,
) -> Result<Option<String>, NotSynced> {
    if requirement.key != "metadata.name" || requirement.operator != "In" {
        return Ok(None);
    }
    for node in requirement.values.iter().flatten() {
        if let Some(why) = gpu_node(node, guard, devices, view)? {
            return Ok(Some(format!("the GPU node {node} ({why})")));
        }
    }
    Ok(None)
}

/// Why the node `name` is a GPU node, or `None` when it is not (or is not known in a synced
/// view: a pod naming a node that does not exist is the scheduler's problem, not the guard's).
fn gpu_node(
    name: &str,
    guard: &Guard,
    devices: &DeviceResources,
    view: &dyn ClusterView,
) -> Result<Option<String>, NotSynced> {
    match view.node(name) {
        Some(KnownNode::ListedGpuNode) => Ok(Some("listed in guard.offline.gpuNodes".to_owned())),
        Some(KnownNode::Object(node)) => Ok(gpu_node_reason(&node, guard, devices)),
        None if view.synced() => Ok(None),
        None => Err(NotSynced(format!("node {name:?}"))),
    }
}

/// Why a Node is a GPU node: device resources in its capacity, a GPU node label, or a GPU
/// node taint. `None` when it has none of them.
pub fn gpu_node_reason(node: &Node, guard: &Guard, devices: &DeviceResources) -> Option<String> {
    let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    if let Some((resource, quantity)) =
        capacity.into_iter().flatten().find(|(resource, quantity)| {
            devices.is_device_resource(resource) && !is_zero_quantity(&quantity.0)
        })
    {
        return Some(format!("capacity {resource}: {}", quantity.0));
    }
    let labels = node.metadata.labels.as_ref();
    for label in &guard.gpu_node_labels {
        if let Some(value) = labels.and_then(|labels| labels.get(&label.key))
            && label.marks(value)
        {
            return Some(format!("label {}={value}", label.key));
        }
    }
    let taints = node.spec.as_ref().and_then(|spec| spec.taints.as_ref());
    taints
        .into_iter()
        .flatten()
        .find(|taint| guard.gpu_node_taints.contains(&taint.key))
        .map(|taint| format!("taint {}", taint.key))
}

/// Whether a quantity is zero in any spelling (`0`, `0k`, `0.0`, `+0`).
pub(super) fn is_zero_quantity(quantity: &str) -> bool {
    let number = quantity
        .trim()
        .trim_start_matches('+')
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    !number.is_empty() && number.bytes().all(|b| b == b'0' || b == b'.')
}
