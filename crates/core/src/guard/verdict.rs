//! The guard's answer and what it carries: a [`Verdict`], why a workload is allowed, and what a
//! violation found (its targets, its priority, its minimum).

use crate::devices::UnresolvedClaim;
use crate::field::FieldPath;
use crate::policy::GuardMode;

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
