//! Judging one workload: each pod template alone, with its own priority, then the workload's
//! verdict from its templates'.

use super::exemptions::exemption;
use super::input::{GuardedKind, Metadata, PodSpecView, PodTemplateView, Workload};
use super::targets::targets;
use super::verdict::{Allowed, NotSynced, Priority, PriorityViolation, Unjudged, Verdict};
use super::view::ClusterView;
use crate::devices::DeviceResources;
use crate::policy::Guard;

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
