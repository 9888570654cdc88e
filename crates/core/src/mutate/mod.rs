//! The mutation engine: one typed `batch/v1` Job in, the mutated Job, the list of changes and
//! human-readable warnings out. Pure: no IO, no async, no clock; the webhook and the CLI call
//! the same [`mutate_job`], so they cannot disagree.
//!
//! What it does to a device Job (see `policies/default.yaml` for every setting):
//! - injects a podFailurePolicy that retries device errors and disruptions
//!   (`failure_policy`), and makes `podReplacementPolicy` compatible with it; in a gang Job,
//!   also the failures of the peers of a pod hit by a device failure ([`peers`]);
//! - keeps the termination grace period in a window, and raises the node not-ready /
//!   unreachable toleration seconds ([`pod_settings`]);
//! - when the policy asks, adds container restart rules for retriable software exit codes to
//!   the device containers (`restart_rules`), disjoint from the podFailurePolicy's codes;
//! - records what it did in the `gpu-guard.io/mutated` annotation.
//!
//! Every result is checked with [`api_rules::job::check_job`]; a result the API server would reject
//! is never returned: the Job comes back unchanged with a warning saying why.
//!
//! Changes are typed ([`Change`]): the engine applies each one to its copy of the Job with
//! [`Change::apply`], and the patch layer turns the same list into JSON Patch operations, so
//! no whole-object diff is needed on the request path.
//!
//! ```
//! use gpu_guard_core::{mutate::mutate_job, policy::Policy};
//! let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "train"},
//!     "spec": {"template": {"spec": {
//!         "restartPolicy": "Never",
//!         "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
//!     }}}
//! })).unwrap();
//! let outcome = mutate_job(&job, &Policy::embedded());
//! let rules = &outcome.job.spec.as_ref().unwrap().pod_failure_policy.as_ref().unwrap().rules;
//! assert_eq!(rules.len(), 4); // DisruptionTarget, DeviceRetriesExhausted, DeviceFailure, exit codes of "main"
//! assert!(gpu_guard_core::api_rules::job::check_job(&outcome.job).is_empty());
//! ```

mod change;
mod failure_policy;
pub mod jobset;
pub mod object;
pub mod other_kinds;
pub mod patch;
pub mod peers;
pub mod pod_settings;
pub mod reads;
mod restart_rules;
mod workload;

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec, JobTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use change::Change;
pub use workload::{DeviceContainers, device_containers};

use crate::api_rules;
use crate::devices::{DraFacts, NoDraFacts};
use crate::jobset::{GROUP as JOBSET_GROUP, JOBSET_NAME_LABEL};
use crate::policy::{Policy, RuleAction};
use crate::wellknown::{INJECT_KEY, MUTATED_ANNOTATION, SKIP_ANNOTATION};

/// Why a Job was not considered for mutation at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Annotated `gpu-guard.io/skip: "true"`.
    SkipAnnotation,
    /// No container requests or limits a device resource, and no opt-in label or annotation.
    NotDeviceWorkload,
    /// The Job has no spec or no pod template spec.
    NoPodSpec,
    /// A child Job of a JobSet: its JobSet's failure policy protects the gang, and per-pod
    /// `Ignore` rules would leave the other ranks waiting on the one being replaced.
    JobSetChild,
    /// The policy turns this kind of protection off (`mutation.gang.enabled: false`).
    Disabled,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SkipAnnotation => "skip-annotation",
            Self::NotDeviceWorkload => "not-a-device-workload",
            Self::NoPodSpec => "no-pod-spec",
            Self::JobSetChild => "jobset-child",
            Self::Disabled => "disabled",
        }
    }

    /// What the user is told: the object was left alone, and why.
    pub fn describe(self) -> String {
        match self {
            Self::SkipAnnotation => format!("skipped ({SKIP_ANNOTATION} annotation)"),
            Self::NotDeviceWorkload => "unchanged (no container requests a device resource \
                                        listed in the policy)"
                .to_owned(),
            Self::NoPodSpec => "unchanged (no pod template spec)".to_owned(),
            Self::JobSetChild => "unchanged (a child Job of a JobSet: its JobSet's failure \
                                  policy restarts the gang on device failures; per-pod rules \
                                  would leave the other ranks waiting)"
                .to_owned(),
            Self::Disabled => "unchanged (mutation.gang.enabled is false)".to_owned(),
        }
    }
}

/// What the engine decided for one Job.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The Job to admit: the input with `changes` applied, or the input itself.
    pub job: Job,
    /// What changed, in order; empty when the Job is unchanged.
    pub changes: Vec<Change>,
    /// Messages for the user (the webhook sends them as admission warnings).
    pub warnings: Vec<String>,
    /// The `warnings` that describe one of `changes` (`terminationGracePeriodSeconds raised
    /// from 30 to 60`): a caller that drops the changes drops these too
    /// ([`Outcome::input_warnings`]), so that no message tells of a change that was not made.
    pub change_notes: Vec<String>,
    /// Set when the Job was not a candidate at all.
    pub skipped: Option<SkipReason>,
}

impl Outcome {
    pub(crate) fn skipped(job: Job, reason: SkipReason) -> Self {
        Self {
            job,
            changes: Vec::new(),
            warnings: Vec::new(),
            change_notes: Vec::new(),
            skipped: Some(reason),
        }
    }

    /// The warnings that stay true when the changes are dropped: those about the Job as it
    /// came, not about what the engine changed.
    pub fn input_warnings(&self) -> impl Iterator<Item = &String> {
        self.warnings
            .iter()
            .filter(|warning| !self.change_notes.contains(warning))
    }

    /// Whether the engine changed the Job.
    pub fn is_changed(&self) -> bool {
        !self.changes.is_empty()
    }

    /// A one-line summary of the changes, e.g. for an audit annotation.
    pub fn summary(&self) -> String {
        summarize(&self.changes)
    }
}

fn summarize(changes: &[Change]) -> String {
    let parts: Vec<String> = changes
        .iter()
        .filter(|change| !matches!(change, Change::SetAnnotation { .. }))
        .map(Change::summary)
        .collect();
    parts.join(", ")
}

/// The working copy of a Job while the engine decides: every change goes through
/// [`Draft::apply`], so the typed copy and the change list never disagree.
pub(crate) struct Draft {
    job: Job,
    role: JobRole,
    /// A standalone gang Job whose peers the controller marks ([`peers`]).
    gang: bool,
    changes: Vec<Change>,
    warnings: Vec<String>,
    change_notes: Vec<String>,
}

impl Draft {
    pub(crate) fn apply(&mut self, change: Change) {
        change.apply(&mut self.job);
        self.changes.push(change);
    }

    /// A warning about the Job as it came: it stays true whatever the engine decides.
    pub(crate) fn warn(&mut self, warning: impl Into<String>) {
        self.warnings.push(warning.into());
    }

    /// A warning that tells of a change this run makes (`raised from 30 to 60`): dropped with
    /// the changes when the result is not returned.
    pub(crate) fn note_change(&mut self, note: impl Into<String>) {
        let note = note.into();
        self.change_notes.push(note.clone());
        self.warnings.push(note);
    }

    pub(crate) fn spec(&self) -> &JobSpec {
        self.job
            .spec
            .as_ref()
            .expect("the engine only drafts Jobs that have a spec")
    }
}

/// How the Job the engine mutates runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobRole {
    /// On its own (a Job, or the Jobs of a CronJob): a device failure is retried in place of
    /// the failed pod (`Ignore`).
    Standalone,
    /// A replicated Job of a JobSet, one part of a gang: a device failure fails the child Job
    /// at once (`FailJob`) so the JobSet restarts the whole gang, and an empty pod
    /// `restartPolicy` (which JobSet's webhook would turn into `OnFailure`) becomes `Never`.
    JobSetReplica,
}

impl JobRole {
    /// The action a policy rule's action becomes in this role.
    pub fn action(self, action: RuleAction) -> RuleAction {
        match (self, action) {
            (JobRole::JobSetReplica, RuleAction::Ignore) => RuleAction::FailJob,
            (_, action) => action,
        }
    }
}

/// Where a Job is, and what is known of the cluster's DRA objects (to tell whether a claim is
/// a device): the webhook's caches, a manifest's documents, or nothing ([`NoDraFacts`]).
#[derive(Clone, Copy)]
pub struct ClusterFacts<'a> {
    /// The namespace of the Job (claims are namespaced).
    pub namespace: &'a str,
    pub dra: &'a dyn DraFacts,
}

impl<'a> ClusterFacts<'a> {
    /// The facts for an object with `metadata`.
    pub fn of(metadata: &'a ObjectMeta, dra: &'a dyn DraFacts) -> Self {
        Self {
            namespace: metadata.namespace.as_deref().unwrap_or_default(),
            dra,
        }
    }
}

/// Decides and applies everything the policy asks for on one Job, with no DRA objects known
/// (a Job that claims GPUs through DRA is then not seen as a device Job: see
/// [`mutate_job_as`]).
pub fn mutate_job(job: &Job, policy: &Policy) -> Outcome {
    mutate_job_as(
        job,
        policy,
        JobRole::Standalone,
        ClusterFacts::of(&job.metadata, &NoDraFacts),
    )
}

/// [`mutate_job`] for a Job in `role`, in the namespace and with the DRA objects of `facts`.
pub fn mutate_job_as(
    job: &Job,
    policy: &Policy,
    role: JobRole,
    facts: ClusterFacts<'_>,
) -> Outcome {
    mutate_owned_job(job.clone(), policy, role, facts, || job.clone())
}

/// [`mutate_job_as`] on a Job the caller gives up, so that the engine drafts on it without a
/// copy (a Job decoded for the engine alone). `original` makes the Job as it came once more, for the
/// rare result the API server would reject: the engine then returns the input, with the
/// input's own verdict in the warning.
pub(crate) fn mutate_owned_job(
    job: Job,
    policy: &Policy,
    role: JobRole,
    facts: ClusterFacts<'_>,
    original: impl FnOnce() -> Job,
) -> Outcome {
    if has_true(job.metadata.annotations.as_ref(), SKIP_ANNOTATION) {
        return Outcome::skipped(job, SkipReason::SkipAnnotation);
    }
    if role == JobRole::Standalone && is_jobset_child(&job.metadata) {
        return Outcome::skipped(job, SkipReason::JobSetChild);
    }
    let Some(pod) = job
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
    else {
        return Outcome::skipped(job, SkipReason::NoPodSpec);
    };
    let opted_in = has_true(job.metadata.labels.as_ref(), INJECT_KEY)
        || has_true(job.metadata.annotations.as_ref(), INJECT_KEY);
    let devices = device_containers(pod, &policy.devices, opted_in, facts.namespace, facts.dra);
    if devices.is_empty() {
        let mut outcome = Outcome::skipped(job, SkipReason::NotDeviceWorkload);
        outcome.warnings = devices.unresolved;
        return outcome;
    }

    let mutation = &policy.mutation;
    let gang = peers::applies(&job, role, &mutation.pod_failure_policy);
    let mut draft = Draft {
        job,
        role,
        gang,
        changes: Vec::new(),
        warnings: Vec::new(),
        change_notes: Vec::new(),
    };
    draft.warnings.extend(devices.unresolved.iter().cloned());
    failure_policy::apply(&mut draft, &devices, &mutation.pod_failure_policy);
    peers::annotate(&mut draft);
    // After the failure policy: the restart rules leave its exit codes to it, and see the
    // pod restartPolicy it may have set.
    restart_rules::apply(&mut draft, &devices, &mutation.restart_rules);
    pod_settings::apply_grace_window(&mut draft, &mutation.termination_grace_period);
    pod_settings::apply_readiness_tolerations(&mut draft, &mutation.node_readiness_tolerations);
    if let Some(deadline) = mutation.active_deadline_seconds
        && draft.spec().active_deadline_seconds.is_none()
    {
        draft.apply(Change::SetActiveDeadlineSeconds(deadline));
    }

    dedup_in_place(&mut draft.warnings);
    if draft.changes.is_empty() {
        return Outcome {
            job: draft.job,
            changes: draft.changes,
            warnings: draft.warnings,
            change_notes: Vec::new(),
            skipped: None,
        };
    }
    let summary = summarize(&draft.changes);
    draft.apply(Change::SetAnnotation {
        key: MUTATED_ANNOTATION.to_owned(),
        value: summary,
    });

    let violations = api_rules::job::check_job(&draft.job);
    if let Some(first) = violations.first() {
        // Nothing is changed, so no warning may tell of a change.
        let mut warnings: Vec<String> = draft
            .warnings
            .into_iter()
            .filter(|warning| !draft.change_notes.contains(warning))
            .collect();
        let job = original();
        warnings.push(if api_rules::job::check_job(&job).contains(first) {
            format!("Job left unchanged: the API server will reject it as it is: {first}")
        } else {
            format!("Job left unchanged, the API server would reject the result: {first}")
        });
        return Outcome {
            job,
            changes: Vec::new(),
            warnings,
            change_notes: Vec::new(),
            skipped: None,
        };
    }
    Outcome {
        job: draft.job,
        changes: draft.changes,
        warnings: draft.warnings,
        change_notes: draft.change_notes,
        skipped: None,
    }
}

/// The Job a CronJob's `jobTemplate` describes (its metadata and spec).
pub fn template_as_job(template: &JobTemplateSpec) -> Job {
    Job {
        metadata: template.metadata.clone().unwrap_or_default(),
        spec: template.spec.clone(),
        status: None,
    }
}

/// Whether a Job is a child of a JobSet: controlled by one (its ownerReference), or labelled
/// with its name as JobSet labels its Jobs.
pub fn is_jobset_child(metadata: &ObjectMeta) -> bool {
    let owned = metadata.owner_references.iter().flatten().any(|owner| {
        owner.kind == "JobSet"
            && owner.api_version.starts_with(JOBSET_GROUP)
            && owner.controller == Some(true)
    });
    owned
        || metadata
            .labels
            .as_ref()
            .is_some_and(|labels| labels.contains_key(JOBSET_NAME_LABEL))
}

/// Whether an object's metadata says `gpu-guard.io/skip: "true"`.
pub fn is_skipped(metadata: &ObjectMeta) -> bool {
    has_true(metadata.annotations.as_ref(), SKIP_ANNOTATION)
}

/// Drops repeated warnings, keeping the first of each.
fn dedup_in_place(warnings: &mut Vec<String>) {
    let mut seen = std::collections::BTreeSet::new();
    warnings.retain(|warning| seen.insert(warning.clone()));
}

fn has_true(map: Option<&BTreeMap<String, String>>, key: &str) -> bool {
    map.and_then(|map| map.get(key))
        .is_some_and(|value| value == "true")
}

#[cfg(test)]
mod tests;
