//! PURE: the GPU-node priority guard. A [`Workload`] (a Pod or a pod template) and a read-only
//! [`ClusterView`] in, a [`Verdict`] out. No IO, no async: the webhook and `gpu-guard check`
//! call [`judge`] and cannot disagree.
//!
//! A workload **targets GPU nodes** when a container or init container requests or limits a
//! device, a toleration tolerates a GPU node taint (an `Exists` toleration without a key
//! tolerates every taint), `nodeSelector` or a required node-affinity term selects a GPU node
//! label (or names a GPU node in `matchFields`), or `spec.nodeName` names a GPU node. It must
//! then reach `minimumPriority.withDevice` when it uses a device, `withoutDevice` otherwise.
//! Every reason is reported at once, each with its field and the fix. A node agent (a
//! DaemonSet, or a pod whose controller is one) that uses no device is not judged unless
//! `guard.exemptions.nodeAgents` is false: the GPU stack's own agents are DaemonSets.

mod input;
mod view;

#[cfg(test)]
mod tests;

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement};

pub use input::{
    AffinityView, ContainerView, DecodeError, GuardedKind, Metadata, NodeAffinityView,
    OwnerReference, PodSpecView, PodTemplateView, ResourcesView, Workload,
};
pub use view::{BUILT_IN_PRIORITY_CLASSES, ClusterView, KnownNode, Layered, StaticView};

use crate::devices::{ContainerResources, DeviceResources, DeviceUse, UnresolvedClaim};
use crate::field::FieldPath;
use crate::policy::{Guard, GuardMode};

/// The annotation the kubelet puts on mirror pods of static pods: denying one would not stop
/// the static pod, so they are not judged.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The guard's answer for one workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to object to.
    Allowed(Allowed),
    /// The workload targets GPU nodes below its minimum priority; `mode` says what to do.
    Violation(PriorityViolation),
}

/// Why a workload is allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allowed {
    /// `guard.enabled` is false.
    Disabled,
    /// It does not target GPU nodes.
    NotTargetingGpuNodes,
    /// It targets GPU nodes with enough priority.
    PriorityMet { priority: i32, minimum: i32 },
    /// An exemption of the policy file applies (which one).
    Exempt(String),
    /// It may violate, but what decides it is not known here (never guessed).
    Unjudged(Unjudged),
}

/// What the guard could not know about a workload that it would need to judge it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unjudged {
    /// It targets GPU nodes, but the offline view does not know its PriorityClass.
    PriorityClass(String),
    /// Its verdict depends on whether these DRA claims ask for a device, and their
    /// ResourceClaimTemplates or ResourceClaims are not known.
    Claims(Vec<UnresolvedClaim>),
}

impl Unjudged {
    /// The full explanation, with what to do, for `gpu-guard check`: a class can be listed in
    /// the policy file, given with its `--priority-class` flag, or read from a cluster.
    pub fn message(&self) -> String {
        self.explanation(Offline::Check)
    }

    /// The full explanation for the webhook's audit log: `serve` learns a class from the
    /// policy file, or from the cluster when it runs with one (not `--no-cluster`).
    pub fn webhook_message(&self) -> String {
        self.explanation(Offline::Webhook)
    }

    fn explanation(&self, offline: Offline) -> String {
        match self {
            Self::PriorityClass(class) => {
                let flag = match offline {
                    Offline::Check => format!("pass --priority-class {class}=VALUE, "),
                    Offline::Webhook => String::new(),
                };
                format!(
                    "PriorityClass {class:?} is not known offline, so the priority of this \
                     workload, which targets GPU nodes, was not checked; list it in \
                     guard.offline.priorityClasses, {flag}or {}",
                    offline.connect()
                )
            }
            Self::Claims(claims) => format!(
                "whether this workload uses a device decides its minimum priority, and that \
                 depends on DRA claims gpu-guard cannot resolve ({}), so it was not checked; \
                 {}",
                claims
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
                match offline {
                    Offline::Check => format!(
                        "ship the ResourceClaimTemplate beside the workload, or {}",
                        offline.connect()
                    ),
                    Offline::Webhook => offline.connect().to_owned(),
                }
            ),
        }
    }

    /// The short admission warning.
    pub fn warning(&self) -> String {
        match self {
            Self::PriorityClass(class) => {
                format!("priority not checked: PriorityClass {class:?} is unknown offline")
            }
            // Only what is unknown (`ResourceClaimTemplate ns/x is not known`): a warning is
            // cut at 120 characters.
            Self::Claims(claims) => {
                let unknown: Vec<String> = claims.iter().map(UnresolvedClaim::what).collect();
                format!("priority not checked: {}", unknown.join("; "))
            }
        }
    }
}

/// Who explains an unjudged workload: the fixes each can offer differ.
#[derive(Clone, Copy)]
enum Offline {
    /// `gpu-guard check`: manifests, its flags, or `--kubeconfig`.
    Check,
    /// `gpu-guard serve` without a cluster: the policy file, or a cluster.
    Webhook,
}

impl Offline {
    fn connect(self) -> &'static str {
        match self {
            Self::Check => "read the cluster's with --kubeconfig",
            Self::Webhook => "run the webhook with a cluster (without --no-cluster)",
        }
    }
}

/// A workload that targets GPU nodes below its minimum priority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityViolation {
    /// What to do about it (the policy's mode for the namespace).
    pub mode: GuardMode,
    /// `Kind namespace/name`.
    pub subject: String,
    /// The replicatedJob whose pod template this is (JobSets and Trainer runtimes).
    pub replicated_job: Option<String>,
    /// Every reason the workload targets GPU nodes.
    pub targets: Vec<Target>,
    /// Whether a container requests or limits a device (which minimum applies).
    pub uses_device: bool,
    /// The priority found, or why none could be found.
    pub priority: Priority,
    /// The minimum that applies.
    pub minimum: i32,
    /// Where `priorityClassName` goes.
    pub class_path: FieldPath,
    /// The workload's other pod templates below their minimum (a JobSet or Trainer runtime has
    /// one per replicatedJob), each judged alone; their own `other_templates` are empty. Empty for the single-template kinds.
    pub other_templates: Vec<PriorityViolation>,
}

/// One reason a workload targets GPU nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The field, e.g. `spec.template.spec.tolerations[0]`.
    pub path: FieldPath,
    /// What it does, e.g. `tolerates the GPU node taint nvidia.com/gpu`.
    pub what: String,
    /// What to remove to stop it, e.g. `the nvidia.com/gpu toleration`.
    pub undo: String,
    /// Whether this is a device request (not undone by the fix that lowers the minimum).
    pub device: bool,
}

/// The effective priority of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Priority {
    /// A value, and where it came from (`spec.priority`, `PriorityClass "x"`, ...).
    Known { value: i32, source: String },
    /// `priorityClassName` names a class the cluster does not have.
    UnknownClass(String),
}

/// Why the guard could not decide (HTTP 500: the webhook's failurePolicy applies).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the cluster cache has not synced yet, so {0} is unknown; retry shortly")]
pub struct NotSynced(pub String);

/// Judges one workload of `kind` in `namespace` (the request's namespace: a Pod's metadata may
/// not carry it yet). Each pod template is judged alone, with its own priority; the workload
/// violates when any of them does, and every violating template is reported at once.
pub fn judge(
    kind: GuardedKind,
    namespace: &str,
    workload: &Workload,
    guard: &Guard,
    devices: &DeviceResources,
    view: &dyn ClusterView,
) -> Result<Verdict, NotSynced> {
    if !guard.enabled {
        return Ok(Verdict::Allowed(Allowed::Disabled));
    }
    let namespace = kind.policy_namespace(namespace);
    if let Some(exemption) = exemption(kind, namespace, &workload.metadata, guard) {
        return Ok(Verdict::Allowed(Allowed::Exempt(exemption)));
    }
    // The DaemonSet controller names the node of each pod it creates (matchFields): the
    // DaemonSet's template was judged, so its pods are not judged again for where they run.
    let daemonset = workload
        .metadata
        .controller()
        .filter(|owner| kind == GuardedKind::Pod && owner.kind == "DaemonSet");
    let node_agent = if !guard.exemptions.node_agents {
        None
    } else if kind == GuardedKind::DaemonSet {
        Some("this DaemonSet".to_owned())
    } else {
        daemonset.map(|owner| format!("this pod of DaemonSet {namespace}/{}", owner.name))
    };
    let judging = Judging {
        kind,
        namespace,
        metadata: &workload.metadata,
        guard,
        devices,
        view,
        placed_by_daemonset: daemonset.is_some(),
        node_agent,
    };
    let mut verdicts = Vec::with_capacity(workload.templates.len());
    for template in &workload.templates {
        verdicts.push(judging.template(template)?);
    }
    Ok(combine(verdicts))
}

/// What each pod template of one workload is judged with.
struct Judging<'a> {
    kind: GuardedKind,
    /// The namespace whose mode applies ([`GuardedKind::policy_namespace`]).
    namespace: &'a str,
    metadata: &'a Metadata,
    guard: &'a Guard,
    devices: &'a DeviceResources,
    view: &'a dyn ClusterView,
    placed_by_daemonset: bool,
    /// What makes the workload a node agent ([`crate::policy::Exemptions::node_agents`]):
    /// `this DaemonSet`, `this pod of DaemonSet ns/name`; `None` when it is not one, or when node
    /// agents are judged.
    node_agent: Option<String>,
}

impl Judging<'_> {
    /// One pod template's verdict, as if it were the workload's only one.
    fn template(&self, template: &PodTemplateView) -> Result<Verdict, NotSynced> {
        let (guard, view) = (self.guard, self.view);
        let spec = &template.spec;
        let spec_path = &template.path;
        let (targets, unresolved) = targets(
            spec_path,
            spec,
            guard,
            self.devices,
            view,
            self.placed_by_daemonset,
            self.namespace,
        )?;
        if targets.is_empty() && unresolved.is_empty() {
            return Ok(Verdict::Allowed(Allowed::NotTargetingGpuNodes));
        }
        if let Some(class) = spec.priority_class_name.as_deref()
            && guard.exemptions.priority_classes.iter().any(|c| c == class)
        {
            return Ok(Verdict::Allowed(Allowed::Exempt(format!(
                "priority class {class:?} is exempt"
            ))));
        }
        let uses_device = targets.iter().any(|target| target.device);
        let node_agent = self.node_agent.as_deref().map(|agent| {
            Verdict::Allowed(Allowed::Exempt(format!(
                "node agent, not judged: {agent} uses no device, and a DaemonSet runs one pod \
                 on each node it selects (guard.exemptions.nodeAgents)"
            )))
        });
        // Before the priority is looked up: a node agent's class need not be known.
        if let Some(exempt) = &node_agent
            && !uses_device
            && unresolved.is_empty()
        {
            return Ok(exempt.clone());
        }
        let priority = priority(self.kind, spec, view)?;
        if let Priority::UnknownClass(class) = &priority
            && !view.authoritative()
        {
            return Ok(Verdict::Allowed(Allowed::Unjudged(
                Unjudged::PriorityClass(class.clone()),
            )));
        }
        let verdict = |uses_device: bool| {
            if targets.is_empty() && !uses_device {
                return Verdict::Allowed(Allowed::NotTargetingGpuNodes);
            }
            if let Some(exempt) = node_agent.as_ref().filter(|_| !uses_device) {
                return exempt.clone();
            }
            let minimum = if uses_device {
                guard.minimum_priority.with_device
            } else {
                guard.minimum_priority.without_device
            };
            if let Priority::Known { value, .. } = priority
                && value >= minimum
            {
                return Verdict::Allowed(Allowed::PriorityMet {
                    priority: value,
                    minimum,
                });
            }
            Verdict::Violation(PriorityViolation {
                mode: guard.mode_for(self.namespace),
                subject: self.subject(),
                replicated_job: template.replicated_job.clone(),
                targets: targets.clone(),
                uses_device,
                priority: priority.clone(),
                minimum,
                class_path: spec_path.child("priorityClassName"),
                other_templates: Vec::new(),
            })
        };
        let known = verdict(uses_device);
        if uses_device || unresolved.is_empty() {
            return Ok(known);
        }
        // Unresolved claims may be devices: judge both ways, and never guess between them.
        let allowed = |verdict: &Verdict| matches!(verdict, Verdict::Allowed(_));
        if allowed(&known) == allowed(&verdict(true)) {
            return Ok(known);
        }
        Ok(Verdict::Allowed(Allowed::Unjudged(Unjudged::Claims(
            unresolved,
        ))))
    }

    /// `Kind namespace/name`, or `Kind name` when cluster-scoped.
    fn subject(&self) -> String {
        let kind = self.kind.as_str();
        let name = self.metadata.display_name();
        if self.namespace.is_empty() {
            format!("{kind} {name}")
        } else {
            format!("{kind} {}/{name}", self.namespace)
        }
    }
}

/// The workload's verdict from its templates' (one for most kinds): every violation, the first
/// carrying the others; else an unjudged template (its priority may be too low); else the
/// priority closest to its minimum; else an exemption by class; else nothing targets GPU nodes.
fn combine(verdicts: Vec<Verdict>) -> Verdict {
    let mut violations = Vec::new();
    let mut unjudged = None;
    let mut met: Option<(i32, i32)> = None;
    let mut exempt = None;
    for verdict in verdicts {
        match verdict {
            Verdict::Violation(violation) => violations.push(violation),
            Verdict::Allowed(Allowed::Unjudged(why)) => {
                unjudged.get_or_insert(why);
            }
            Verdict::Allowed(Allowed::PriorityMet { priority, minimum }) => {
                let margin =
                    |(priority, minimum): (i32, i32)| i64::from(priority) - i64::from(minimum);
                if met.is_none_or(|closest| margin((priority, minimum)) < margin(closest)) {
                    met = Some((priority, minimum));
                }
            }
            Verdict::Allowed(Allowed::Exempt(why)) => {
                exempt.get_or_insert(why);
            }
            Verdict::Allowed(Allowed::NotTargetingGpuNodes | Allowed::Disabled) => {}
        }
    }
    let mut violations = violations.into_iter();
    if let Some(mut first) = violations.next() {
        first.other_templates = violations.collect();
        return Verdict::Violation(first);
    }
    Verdict::Allowed(if let Some(why) = unjudged {
        Allowed::Unjudged(why)
    } else if let Some((priority, minimum)) = met {
        Allowed::PriorityMet { priority, minimum }
    } else if let Some(why) = exempt {
        Allowed::Exempt(why)
    } else {
        Allowed::NotTargetingGpuNodes
    })
}

/// The exemption that applies, described, if any.
fn exemption(
    kind: GuardedKind,
    namespace: &str,
    metadata: &Metadata,
    guard: &Guard,
) -> Option<String> {
    let exemptions = &guard.exemptions;
    if exemptions.namespaces.iter().any(|n| n == namespace) {
        return Some(format!("namespace {namespace:?} is exempt"));
    }
    if kind == GuardedKind::Pod && metadata.annotation(MIRROR_POD_ANNOTATION).is_some() {
        return Some("mirror pod of a static pod".to_owned());
    }
    let name = metadata.name.as_deref().unwrap_or_default();
    let matches = |kind: &str, name: &str| {
        exemptions.workloads.iter().find(|w| {
            w.namespace == namespace
                && w.name == name
                && w.kind.as_deref().is_none_or(|k| k == kind)
        })
    };
    if let Some(workload) = matches(kind.as_str(), name) {
        return Some(format!(
            "workload {}/{} is exempt",
            workload.namespace, name
        ));
    }
    // A pod is exempt with its controller: a DaemonSet or StatefulSet owns its pods directly,
    // a Deployment through a ReplicaSet named `<deployment>-<pod-template-hash>`.
    let owner = metadata.controller()?;
    if let Some(workload) = matches(&owner.kind, &owner.name) {
        return Some(format!(
            "its {} {}/{} is exempt",
            owner.kind, workload.namespace, owner.name
        ));
    }
    // A CronJob owns its Jobs, named `<cronjob>-<scheduled minute>`, which own the pods.
    if owner.kind == "Job"
        && let Some((cronjob, minute)) = owner.name.rsplit_once('-')
        && !minute.is_empty()
        && minute.bytes().all(|b| b.is_ascii_digit())
        && let Some(workload) = matches("CronJob", cronjob)
    {
        return Some(format!(
            "its CronJob {}/{cronjob} is exempt",
            workload.namespace
        ));
    }
    if owner.kind == "ReplicaSet"
        && let Some(hash) = metadata.label("pod-template-hash")
        && let Some(deployment) = owner
            .name
            .strip_suffix(hash)
            .and_then(|rest| rest.strip_suffix('-'))
        && let Some(workload) = matches("Deployment", deployment)
    {
        return Some(format!(
            "its Deployment {}/{deployment} is exempt",
            workload.namespace
        ));
    }
    None
}

/// Every reason the pod spec at `spec_path` targets GPU nodes, in field order.
#[allow(clippy::too_many_arguments)]
fn targets(
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
fn is_zero_quantity(quantity: &str) -> bool {
    let number = quantity
        .trim()
        .trim_start_matches('+')
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    !number.is_empty() && number.bytes().all(|b| b == b'0' || b == b'.')
}

/// The effective priority: a Pod's `spec.priority` (the API server's Priority admission plugin
/// resolved it before validating webhooks run); a template's `priorityClassName` resolved
/// through the view, or the global default class, or 0.
fn priority(
    kind: GuardedKind,
    spec: &PodSpecView,
    view: &dyn ClusterView,
) -> Result<Priority, NotSynced> {
    if kind == GuardedKind::Pod
        && let Some(value) = spec.priority
    {
        return Ok(Priority::Known {
            value,
            source: match spec.priority_class_name.as_deref() {
                Some(class) => format!("spec.priority, from PriorityClass {class:?}"),
                None => "spec.priority".to_owned(),
            },
        });
    }
    match spec
        .priority_class_name
        .as_deref()
        .filter(|c| !c.is_empty())
    {
        Some(class) => match view.priority_class(class) {
            Some(value) => Ok(Priority::Known {
                value,
                source: format!("PriorityClass {class:?}"),
            }),
            None if view.synced() => Ok(Priority::UnknownClass(class.to_owned())),
            None => Err(NotSynced(format!("PriorityClass {class:?}"))),
        },
        None => {
            if !view.synced() {
                return Err(NotSynced("the globalDefault PriorityClass".to_owned()));
            }
            Ok(match view.global_default_priority_class() {
                Some((class, value)) => Priority::Known {
                    value,
                    source: format!("no priorityClassName: the globalDefault class {class:?}"),
                },
                None => Priority::Known {
                    value: 0,
                    source: "no priorityClassName and no globalDefault PriorityClass".to_owned(),
                },
            })
        }
    }
}

impl PriorityViolation {
    /// The whole story in one message (a denial, an audit annotation, `gpu-guard check`):
    /// what targets GPU nodes, the priority found, the minimum and how to fix it, for each
    /// violating pod template.
    pub fn message(&self) -> String {
        let mut text = self.template_message();
        for other in &self.other_templates {
            text.push(' ');
            text.push_str(&other.template_message());
        }
        text
    }

    /// [`PriorityViolation::message`] of this pod template alone.
    fn template_message(&self) -> String {
        let mut text = self.subject.clone();
        if let Some(job) = &self.replicated_job {
            let _ = write!(text, " replicatedJob {job:?}");
        }
        let _ = write!(
            text,
            " targets GPU nodes {}, so it needs priority >= {}, but {}. Why it targets GPU \
             nodes: ",
            if self.uses_device {
                "and uses a device"
            } else {
                "without using a device"
            },
            self.minimum,
            self.priority_found(),
        );
        for (index, target) in self.targets.iter().enumerate() {
            if index > 0 {
                text.push_str("; ");
            }
            let _ = write!(text, "{} {}", target.path, target.what);
        }
        let _ = write!(text, ". Fix: {}.", self.fix());
        text
    }

    /// The same, as admission warnings of at most 120 characters each (the API server's limit):
    /// the verdict, one line per reason, and the fix, for each violating pod template.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = self.template_warnings();
        for other in &self.other_templates {
            warnings.extend(other.template_warnings());
        }
        warnings
    }

    /// [`PriorityViolation::warnings`] of this pod template alone.
    fn template_warnings(&self) -> Vec<String> {
        let mut warnings = vec![format!(
            "{}: priority {} is below the minimum {} for GPU nodes",
            self.subject,
            match &self.priority {
                Priority::Known { value, .. } => value.to_string(),
                Priority::UnknownClass(class) => format!("unknown (no PriorityClass {class:?})"),
            },
            self.minimum
        )];
        // On its own line: the verdict line with it would often pass 120 characters.
        if let Some(job) = &self.replicated_job {
            warnings.push(format!("in replicatedJob {job:?}:"));
        }
        // Paths relative to the pod spec, node-affinity ones from their term: a warning is cut
        // at 120 characters.
        let full = self.class_path.to_string();
        let spec_prefix = full.strip_suffix("priorityClassName").unwrap_or_default();
        for target in &self.targets {
            let path = target.path.to_string();
            let short = match path.find("nodeSelectorTerms") {
                Some(at) => &path[at..],
                None => path.strip_prefix(spec_prefix).unwrap_or(&path),
            };
            warnings.push(format!("{short}: {}", target.what));
        }
        warnings.push(match &self.priority {
            Priority::UnknownClass(class) => {
                format!(
                    "fix: create PriorityClass {class:?} (value >= {})",
                    self.minimum
                )
            }
            Priority::Known { .. } => format!(
                "fix: set priorityClassName to a class with value >= {}",
                self.minimum
            ),
        });
        if !self.uses_device {
            for undo in self.undo_list() {
                warnings.push(format!("or, if it needs no GPU node, remove {undo}"));
            }
        }
        warnings
    }

    /// What to remove to stop targeting GPU nodes, each once, in order.
    fn undo_list(&self) -> Vec<&str> {
        let mut undo: Vec<&str> = Vec::new();
        for target in &self.targets {
            if !undo.contains(&target.undo.as_str()) {
                undo.push(&target.undo);
            }
        }
        undo
    }

    fn priority_found(&self) -> String {
        match &self.priority {
            Priority::Known { value, source } => format!("its priority is {value} ({source})"),
            Priority::UnknownClass(class) => {
                format!("its priorityClassName {class:?} names no PriorityClass the cluster has")
            }
        }
    }

    /// How to fix it: a class high enough, or (when it uses no device) stop targeting GPU nodes;
    /// for this pod template (each of `other_templates` has its own).
    pub fn fix(&self) -> String {
        let mut fix = match &self.priority {
            Priority::UnknownClass(class) => format!(
                "create PriorityClass {class:?} with value >= {} or set {} to an existing class \
                 with such a value",
                self.minimum, self.class_path
            ),
            Priority::Known { .. } => format!(
                "set {} to a PriorityClass with value >= {}",
                self.class_path, self.minimum
            ),
        };
        if !self.uses_device {
            let undo = self.undo_list();
            let list = match undo.split_last() {
                Some((last, [])) => (*last).to_owned(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => String::new(),
            };
            let _ = write!(fix, ", or remove {list} if it does not need a GPU node");
        }
        fix
    }
}
