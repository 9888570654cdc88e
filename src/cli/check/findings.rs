//! What `gpu-guard check` finds: the guard (and what `mutate` would change) on manifests,
//! offline, for CI.
//!
//! The same [`guard::judge`] the webhook calls. Cluster facts come from PriorityClass and Node
//! objects among the inputs, `--priority-class NAME=VALUE` flags and the policy file's
//! `guard.offline` section, or from a cluster (`--kubeconfig`). Exit 1 when anything would be
//! denied, 2 when an input cannot be read, 0 otherwise.

use serde::Serialize;
use serde_json::Value;

use crate::cli::tally;
use gpu_guard_core::guard::{
    self, Allowed, ClusterView, GuardedKind, Priority, StaticView, Verdict,
};
use gpu_guard_core::mutate::{object, other_kinds};
use gpu_guard_core::policy::{GuardMode, Policy};
use gpu_guard_manifest::Object;

/// One object's result.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub source: String,
    pub document: usize,
    /// The position among the items of a `List` document.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    pub kind: String,
    /// The object's namespace, else `check`'s; empty for a cluster-scoped ClusterTrainingRuntime.
    pub namespace: String,
    pub name: String,
    /// `allowed`, `exempt`, `unjudged`, `denied`, `warned`, `audited` or `error`.
    pub verdict: &'static str,
    /// The mode in force for the object's namespace.
    pub mode: &'static str,
    /// The full explanation (for violations, exemptions, unjudged objects and errors).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Each reason the object targets GPU nodes (violations only; of every violating pod
    /// template, each field naming its replicatedJob in a JobSet or runtime).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<Reason>,
    /// The priority and minimum of the (first) violating pod template, or of the template
    /// closest to its minimum when every one passes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minimum: Option<i32>,
    /// What `gpu-guard mutate` (and the mutating webhook) would change, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutation: Option<String>,
}

/// A reason an object targets GPU nodes.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Reason {
    pub field: String,
    pub what: String,
}

/// Everything `check` found.
#[derive(Debug, Default)]
pub struct Checked {
    pub findings: Vec<Finding>,
    /// Inputs that could not be read or decoded.
    pub errors: Vec<String>,
    /// Objects of kinds the guard does not judge.
    pub not_judged: Vec<NotJudged>,
}

/// An object of a kind the guard does not judge.
#[derive(Debug)]
pub struct NotJudged {
    pub kind: String,
    /// Where it is and its name, for a warning.
    pub name: String,
    /// `kubeflow.org/v1 PyTorchJob`.
    pub api_kind: String,
    /// Whether it carries pod templates (then the guard's silence deserves a warning).
    pub carries_pod_template: bool,
    /// Whether it is one of the cluster facts [`learn`] reads.
    pub is_fact: bool,
    /// The runtime it names, when it is a Kubeflow Trainer TrainJob.
    pub trainjob_runtime: Option<other_kinds::RuntimeRef>,
}

/// `namespace/name`, or `name` when the object names no namespace (cluster-scoped, or left to
/// `kubectl -n`).
fn namespaced_name(value: &Value) -> String {
    let text = |pointer: &str| value.pointer(pointer).and_then(Value::as_str);
    let name = text("/metadata/name").unwrap_or("<unnamed>");
    match text("/metadata/namespace").filter(|namespace| !namespace.is_empty()) {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

/// The words the first pass looks for: the kinds [`learn`] reads.
pub const FACT_KINDS: &[&str] = &["PriorityClass", "Node", "ResourceClaim", "DeviceClass"];

/// Why a cluster fact (a PriorityClass or Node among the inputs, a `--priority-class` flag)
/// cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FactError {
    #[error(
        "{location}: a PriorityClass needs metadata.name and a whole-number value between \
         -2147483648 and 1000000000"
    )]
    PriorityClass { location: String },
    #[error("{location}: cannot read the Node: {source}")]
    Node {
        location: String,
        #[source]
        source: gpu_guard_core::decode::JsonError,
    },
    #[error(
        "--priority-class {flag:?}: expected NAME=VALUE with a whole-number VALUE \
         (e.g. high-priority=1000000)"
    )]
    Flag { flag: String },
}

/// Adds a PriorityClass, Node or DRA (ResourceClaimTemplate, ResourceClaim, DeviceClass)
/// object to `view`; any other object is ignored. An error says why such an object cannot be
/// read.
pub fn learn(view: &mut StaticView, object: &Object<'_>) -> Result<(), FactError> {
    let value = &object.value;
    let api_version = value.get("apiVersion").and_then(Value::as_str);
    let kind = value.get("kind").and_then(Value::as_str);
    match (api_version, kind) {
        (Some("scheduling.k8s.io/v1"), Some("PriorityClass")) => {
            let name = value.pointer("/metadata/name").and_then(Value::as_str);
            let class_value = value
                .get("value")
                .and_then(Value::as_i64)
                .and_then(|v| i32::try_from(v).ok());
            match (name, class_value) {
                (Some(name), Some(class_value)) => view.add_priority_class(
                    name,
                    class_value,
                    value.get("globalDefault").and_then(Value::as_bool) == Some(true),
                ),
                _ => {
                    return Err(FactError::PriorityClass {
                        location: object.location(),
                    });
                }
            }
        }
        (Some("v1"), Some("Node")) => match gpu_guard_core::decode::from_json_value(value) {
            Ok(node) => view.add_node(node),
            Err(source) => {
                return Err(FactError::Node {
                    location: object.location(),
                    source,
                });
            }
        },
        // ResourceClaimTemplates, ResourceClaims and DeviceClasses: to resolve DRA claims.
        _ => {
            view.add_dra_object(value);
        }
    }
    Ok(())
}

/// Whether an object is one of the cluster facts [`learn`] reads.
pub fn is_fact(value: &Value) -> bool {
    let api_version = value.get("apiVersion").and_then(Value::as_str);
    let group = api_version
        .and_then(|v| v.rsplit_once('/'))
        .map(|(group, _)| group);
    match (api_version, value.get("kind").and_then(Value::as_str)) {
        (Some("scheduling.k8s.io/v1"), Some("PriorityClass")) | (Some("v1"), Some("Node")) => true,
        (_, Some("ResourceClaimTemplate" | "ResourceClaim" | "DeviceClass")) => {
            group == Some("resource.k8s.io")
        }
        _ => false,
    }
}

/// Judges every guarded object (and reports what `mutate` would change on Jobs and CronJobs).
/// `namespace` is used for objects that name none.
pub fn check(
    objects: &[Object<'_>],
    policy: &Policy,
    view: &dyn ClusterView,
    namespace: &str,
) -> Checked {
    let mut checked = Checked::default();
    for object in objects {
        let (document, value) = (object.document, &object.value);
        let api_version = value.get("apiVersion").and_then(Value::as_str);
        let kind = value.get("kind").and_then(Value::as_str);
        let Some(guarded) = api_version
            .zip(kind)
            .and_then(|(api_version, kind)| GuardedKind::from_api_version(api_version, kind))
        else {
            checked.not_judged.push(NotJudged {
                kind: tally::kind_of(value).to_owned(),
                name: format!(
                    "{} {} {}",
                    object.location(),
                    tally::kind_of(value),
                    namespaced_name(value)
                ),
                api_kind: tally::api_kind(value),
                carries_pod_template: tally::carries_pod_template(value),
                is_fact: is_fact(value),
                trainjob_runtime: other_kinds::trainjob_runtime(value),
            });
            continue;
        };
        let object_namespace = guarded
            .policy_namespace(
                value
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .unwrap_or(namespace),
            )
            .to_owned();
        let mode = policy.guard.mode_for(&object_namespace);
        let mut finding = Finding {
            source: document.source.clone(),
            document: document.index,
            item: object.item,
            kind: guarded.as_str().to_owned(),
            namespace: object_namespace.clone(),
            name: value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("<unnamed>")
                .to_owned(),
            verdict: "allowed",
            mode: mode.as_str(),
            message: None,
            reasons: Vec::new(),
            priority: None,
            minimum: None,
            mutation: None,
        };
        let judged = guard::Workload::from_value(guarded, value)
            .map_err(|error| error.to_string())
            .and_then(|workload| {
                guard::judge(
                    guarded,
                    &object_namespace,
                    &workload,
                    &policy.guard,
                    &policy.devices,
                    view,
                )
                .map_err(|error| error.to_string())
            });
        match judged {
            Err(message) => {
                finding.verdict = "error";
                finding.message = Some(message.clone());
                checked.errors.push(format!(
                    "{} {} {}: {message}",
                    object.location(),
                    finding.kind,
                    finding.name
                ));
            }
            Ok(Verdict::Allowed(Allowed::Exempt(why))) => {
                finding.verdict = "exempt";
                finding.message = Some(why);
            }
            Ok(Verdict::Allowed(Allowed::Unjudged(why))) => {
                finding.verdict = "unjudged";
                finding.message = Some(why.message());
            }
            Ok(Verdict::Allowed(Allowed::PriorityMet { priority, minimum })) => {
                finding.priority = Some(priority);
                finding.minimum = Some(minimum);
            }
            Ok(Verdict::Allowed(Allowed::NotTargetingGpuNodes | Allowed::Disabled)) => {}
            Ok(Verdict::Violation(violation)) => {
                finding.verdict = match violation.mode {
                    GuardMode::Enforce => "denied",
                    GuardMode::Warn => "warned",
                    GuardMode::Audit => "audited",
                };
                finding.message = Some(violation.message());
                finding.reasons = std::iter::once(&violation)
                    .chain(&violation.other_templates)
                    .flat_map(|template| &template.targets)
                    .map(|target| Reason {
                        field: target.path.to_string(),
                        what: target.what.clone(),
                    })
                    .collect();
                if let Priority::Known { value, .. } = violation.priority {
                    finding.priority = Some(value);
                }
                finding.minimum = Some(violation.minimum);
            }
        }
        match object::mutate_object(value, policy, view.dra()) {
            Some(Ok(mutation)) if !mutation.patch.is_empty() => {
                finding.mutation = Some(mutation.outcome.summary());
            }
            // `mutate` reports the same object as an error: the API server would refuse it.
            Some(Err(error)) if finding.verdict != "error" => {
                finding.mutation = Some(format!("cannot mutate: {error}"));
                checked.errors.push(format!(
                    "{} {} {}: {error}",
                    object.location(),
                    finding.kind,
                    finding.name
                ));
            }
            _ => {}
        }
        checked.findings.push(finding);
    }
    checked
}

/// One object's lines of the text report: the object and its verdict, the explanation
/// indented below it.
pub fn render_finding(finding: &Finding) -> String {
    let mut text = String::new();
    let verdict = match finding.verdict {
        "denied" => "DENIED",
        other => other,
    };
    let location = match finding.item {
        Some(item) => format!(
            "{} (document {}, item {item})",
            finding.source, finding.document
        ),
        None => format!("{} (document {})", finding.source, finding.document),
    };
    // A cluster-scoped object (a ClusterTrainingRuntime) has no namespace to show.
    let object = if finding.namespace.is_empty() {
        finding.name.clone()
    } else {
        format!("{}/{}", finding.namespace, finding.name)
    };
    text.push_str(&format!("{location} {} {object}: {verdict}", finding.kind));
    if finding.verdict == "allowed"
        && let (Some(priority), Some(minimum)) = (finding.priority, finding.minimum)
    {
        text.push_str(&format!(
            " (targets GPU nodes; priority {priority} >= {minimum})"
        ));
    }
    text.push('\n');
    if let Some(message) = &finding.message {
        text.push_str(&format!("  {message}\n"));
    }
    if let Some(mutation) = &finding.mutation {
        text.push_str(&format!("  mutate would: {mutation}\n"));
    }
    text
}

/// The text report's last line: `3 object(s) checked: 2 allowed, 1 denied`, then the objects
/// the guard does not judge, by kind.
pub fn summary_line(
    verdicts: &std::collections::BTreeMap<&str, usize>,
    not_judged: &str,
) -> String {
    let checked: usize = verdicts.values().sum();
    let summary: Vec<String> = verdicts
        .iter()
        .map(|(verdict, count)| format!("{count} {verdict}"))
        .collect();
    let mut line = format!(
        "{checked} object(s) checked{}{}",
        if summary.is_empty() { "" } else { ": " },
        summary.join(", ")
    );
    if !not_judged.is_empty() {
        line.push_str(&format!("; {not_judged}"));
    }
    line
}

/// The `--priority-class NAME=VALUE` flags added to `view`.
pub fn add_flags(view: &mut StaticView, flags: &[String]) -> Result<(), FactError> {
    for flag in flags {
        let (name, value) = flag
            .split_once('=')
            .and_then(|(name, value)| Some((name, value.trim().parse::<i32>().ok()?)))
            .filter(|(name, _)| !name.is_empty())
            .ok_or_else(|| FactError::Flag { flag: flag.clone() })?;
        view.add_priority_class(name, value, false);
    }
    Ok(())
}
