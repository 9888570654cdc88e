//! The policy file: what gpu-guard injects, typed, with its defaults and its own validation.
//!
//! The embedded default is `policies/default.yaml`, compiled into the binary; `--policy FILE`
//! replaces it. Every key has a default, so a file only names what it changes. Unknown keys are
//! refused (a misspelt key must not silently fall back to its default), and [`load`] validates the
//! whole file before anything uses it: a broken file is refused with file, line and field, and
//! nothing is half-applied.
//!
//! ```
//! let policy = gpu_guard_core::policy::Policy::embedded();
//! assert!(policy.devices.is_device_resource("nvidia.com/gpu"));
//! assert!(policy.devices.is_device_resource("nvidia.com/mig-1g.5gb"));
//! assert!(!policy.devices.is_device_resource("cpu"));
//! ```

mod avoid;
mod controller;
mod devices;
mod guard;
mod load;
pub mod reference;
mod validate;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use avoid::{AvoidFailedNodes, RECORDED_FAILURES};
pub use devices::DeviceResources;
pub use guard::{
    ExemptWorkload, Exemptions, GpuNodeLabel, Guard, GuardMode, MinimumPriority, OfflineCluster,
    OfflinePriorityClass, TaintEffect,
};
pub use load::{PolicyError, PolicyProblem, load, parse};

pub use controller::{
    Controller, DeviceRetries, NodeHealth, PodWatcher, StuckPods, SuspectNodes, UnusableThreshold,
};

use crate::wellknown::{DEVICE_FAILURE_CONDITION, DEVICE_RETRIES_EXHAUSTED_CONDITION};
use crate::wellknown::{POLICY_API_VERSION, POLICY_KIND};

/// The source of the embedded default policy.
pub const EMBEDDED_SOURCE: &str = include_str!("../../../../policies/default.yaml");
/// The name under which the embedded policy is reported in errors and `policy show`.
pub const EMBEDDED_NAME: &str = "<embedded policies/default.yaml>";

/// A gpu-guard policy file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[schemars(title = "gpu-guard policy")]
pub struct Policy {
    /// Must be `gpu-guard.io/v1alpha1`.
    pub api_version: String,
    /// Must be `Policy`.
    pub kind: String,
    /// Which extended resources make a pod template a device workload.
    pub devices: DeviceResources,
    /// What the mutating webhook and `gpu-guard mutate` add to device Jobs.
    pub mutation: Mutation,
    /// What the validating webhook and `gpu-guard check` allow on GPU nodes.
    pub guard: Guard,
    /// What `gpu-guard controller` does about degraded GPU nodes and the pods on them.
    pub controller: Controller,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            api_version: POLICY_API_VERSION.to_owned(),
            kind: POLICY_KIND.to_owned(),
            devices: DeviceResources::default(),
            mutation: Mutation::default(),
            guard: Guard::default(),
            controller: Controller::default(),
        }
    }
}

impl Policy {
    /// The embedded default policy (`policies/default.yaml`).
    ///
    /// # Panics
    /// Never in a released binary: a test loads the embedded file and fails the build's tests
    /// when it does not validate.
    pub fn embedded() -> Self {
        parse(EMBEDDED_SOURCE, EMBEDDED_NAME).expect("the embedded default policy is valid")
    }

    /// The JSON Schema of the policy file, generated from these types (`policies/schema.json`).
    pub fn json_schema() -> String {
        let schema = schemars::schema_for!(Policy);
        let mut text = serde_json::to_string_pretty(&schema).expect("a schema serializes");
        text.push('\n');
        text
    }
}

/// What gets added to a device Job.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Mutation {
    /// The injected `spec.podFailurePolicy`.
    pub pod_failure_policy: PodFailurePolicySettings,
    /// The window `spec.template.spec.terminationGracePeriodSeconds` is kept in.
    pub termination_grace_period: GraceWindow,
    /// Minimum `tolerationSeconds` for the node not-ready and unreachable taints.
    pub node_readiness_tolerations: ReadinessTolerations,
    /// When set, `spec.activeDeadlineSeconds` is set to this on Jobs that have none (a bound on
    /// the unlimited retries that `Ignore` rules allow). Unset by default.
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
    /// Gang training: JobSets and the JobSet template of Kubeflow Trainer runtimes.
    pub gang: GangSettings,
    /// In-place restart of device containers for retriable software errors (container
    /// `restartPolicyRules`, Kubernetes 1.35+). Off by default; `policies/in-place-restart.yaml`
    /// turns it on.
    pub restart_rules: RestartRuleSettings,
    /// Keep a workload's new pods off the nodes where its devices failed (Pod CREATE).
    pub avoid_failed_nodes: AvoidFailedNodes,
}

/// Container restart rules (KEP-5307) for the device containers of Jobs and of JobSet
/// templates: the kubelet restarts a container in place, keeping its pod and its devices, when
/// it exits with one of these codes. The pod does not fail, so neither the podFailurePolicy nor
/// `backoffLimit` sees that exit (crash-loop backoff still applies). The codes can never be a
/// device code, a code of any `podFailurePolicy.exitCodeRules` entry, 0, or an ordinary crash
/// (1, 134, 137, 139, 143): the loader refuses such a policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RestartRuleSettings {
    /// Add restart rules at all.
    pub enabled: bool,
    /// Exit codes (1 to 255) that mean "a transient fault in my own code: restart me here".
    /// The convention: 70 (`EX_SOFTWARE`) and 140 (128 + SIGUSR2, the in-place twin of 138).
    #[schemars(length(min = 1, max = 255))]
    pub exit_codes: Vec<i32>,
    /// What the kubelet restarts on those codes.
    pub action: RestartAction,
}

impl Default for RestartRuleSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            exit_codes: vec![70, 140],
            action: RestartAction::Restart,
        }
    }
}

/// The action of an injected container restart rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RestartAction {
    /// Restart only the container that exited.
    Restart,
    /// Restart every container of the pod in place, init containers first again (KEP-5532,
    /// beta in Kubernetes 1.36, gate `RestartAllContainersOnContainerExits`; an API server
    /// without it refuses the Job). The grace period and preStop hooks are not honoured.
    RestartAllContainers,
}

impl RestartAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restart => crate::api_rules::container::RESTART,
            Self::RestartAllContainers => crate::api_rules::container::RESTART_ALL_CONTAINERS,
        }
    }
}

/// How device failures are handled in a gang (a JobSet): the child Job fails fast and the
/// JobSet restarts the whole gang, as JobSet recommends for host and hardware faults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GangSettings {
    /// Protect JobSets and Trainer runtimes at all. The podFailurePolicy and pod settings
    /// sections above say what their device replicated Jobs get.
    pub enabled: bool,
    /// Gang restarts granted for device failures and disruptions, on top of the JobSet's own
    /// `failurePolicy.maxRestarts`, which is raised by this much: device restarts do not use up
    /// the user's budget, and all restarts together stay bounded by `maxRestarts` plus this.
    #[schemars(range(min = 1, max = 1000))]
    pub device_restarts: i32,
}

impl Default for GangSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            device_restarts: 5,
        }
    }
}

/// How the pod failure policy is built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PodFailurePolicySettings {
    /// Inject a podFailurePolicy at all.
    pub enabled: bool,
    /// What to do when the Job already has a podFailurePolicy.
    pub existing_policy: ExistingPolicy,
    /// What to do with a Job whose pod template has `restartPolicy: OnFailure` (a
    /// podFailurePolicy needs `Never`).
    pub on_failure_restart_policy: OnFailureRestartPolicy,
    /// What to do with `spec.podReplacementPolicy`.
    pub pod_replacement_policy: PodReplacementPolicy,
    /// Pod-condition rules, in order. They come first in the injected policy.
    pub pod_condition_rules: Vec<PodConditionRule>,
    /// Exit-code rules, in order, one injected per device container (naming it in
    /// `containerName`). Each exit code may appear in one rule only.
    pub exit_code_rules: Vec<ExitCodeRule>,
    /// On Indexed Jobs with `backoffLimitPerIndex`, turn `FailJob` exit-code rules into
    /// `FailIndex`, so one bad index does not fail the others.
    pub fail_index_for_per_index_jobs: bool,
    /// On a Job whose pods are a gang (an Indexed Job whose parallelism equals its
    /// completions, above 1, or a Job labelled or annotated `gpu-guard.io/gang: "true"`; not
    /// one saying `"false"`), add a rule for `gpu-guard.io/PeerDeviceFailure=True` right after
    /// the `gpu-guard.io/DeviceFailure` rule, with its action, and annotate the pod template
    /// `gpu-guard.io/gang: "true"`: the controller then marks the running peers of a pod hit by
    /// a device failure, whose failure follows from it.
    pub gang_peers: bool,
}

impl Default for PodFailurePolicySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            existing_policy: ExistingPolicy::Merge,
            on_failure_restart_policy: OnFailureRestartPolicy::Skip,
            pod_replacement_policy: PodReplacementPolicy::Failed,
            pod_condition_rules: vec![
                PodConditionRule {
                    condition_type: "DisruptionTarget".to_owned(),
                    status: ConditionStatus::True,
                    action: RuleAction::Ignore,
                },
                // Past its budget a workload's failures count, even of a device: ahead of
                // the device Ignore rules, after DisruptionTarget (a drain or a preemption is
                // never the workload's fault, budget or not).
                PodConditionRule {
                    condition_type: DEVICE_RETRIES_EXHAUSTED_CONDITION.to_owned(),
                    status: ConditionStatus::True,
                    action: RuleAction::Count,
                },
                PodConditionRule {
                    condition_type: DEVICE_FAILURE_CONDITION.to_owned(),
                    status: ConditionStatus::True,
                    action: RuleAction::Ignore,
                },
            ],
            exit_code_rules: vec![ExitCodeRule {
                action: RuleAction::Ignore,
                codes: vec![74, 75, 138],
            }],
            fail_index_for_per_index_jobs: true,
            gang_peers: true,
        }
    }
}

/// What to do when the Job already has a podFailurePolicy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ExistingPolicy {
    /// Put the device rules in front of the Job's own rules, leaving out those the Job already
    /// has (or handles differently: the Job's own rule wins), within the 20-rule limit.
    Merge,
    /// Leave the Job's podFailurePolicy as it is.
    Keep,
    /// Replace the Job's rules with the device rules.
    Replace,
}

/// What to do with `restartPolicy: OnFailure`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OnFailureRestartPolicy {
    /// Inject no podFailurePolicy and warn (the Job keeps restarting containers in place).
    Skip,
    /// Change it to `Never` (failed pods are replaced instead of restarted) and warn.
    ConvertToNever,
}

/// What to do with `spec.podReplacementPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PodReplacementPolicy {
    /// Set `Failed` on every device Job: a replacement pod starts only once the old one has
    /// fully terminated and released its devices.
    Failed,
    /// Leave it alone, except where a podFailurePolicy requires `Failed` (the API server
    /// rejects anything else then).
    Unchanged,
}

/// A pod-condition rule of the injected podFailurePolicy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodConditionRule {
    /// The pod condition type, a qualified name (`DisruptionTarget`, `example.com/Xid`).
    #[serde(rename = "type")]
    pub condition_type: String,
    /// The condition status that matches.
    #[serde(default)]
    pub status: ConditionStatus,
    /// What the Job controller does with a failed pod that has the condition.
    pub action: RuleAction,
}

/// An exit-code rule of the injected podFailurePolicy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExitCodeRule {
    /// What the Job controller does with a pod whose device container exits with one of these.
    pub action: RuleAction,
    /// Exit codes, 1 to 255, each once (operator `In`).
    #[schemars(length(min = 1, max = 255))]
    pub codes: Vec<i32>,
}

/// A pod condition status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    #[default]
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// A podFailurePolicy rule action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RuleAction {
    /// Fail the whole Job.
    FailJob,
    /// Fail the pod's index (Indexed Jobs with `backoffLimitPerIndex` only).
    FailIndex,
    /// Retry without counting against `backoffLimit`.
    Ignore,
    /// Count against `backoffLimit` (the default for failures no rule matches).
    Count,
}

impl RuleAction {
    /// The action a rule names; `None` for a value that is none of them (the Job controller
    /// skips such a rule, `pkg/controller/job/pod_failure_policy.go`).
    pub fn parse(action: &str) -> Option<Self> {
        match action {
            "FailJob" => Some(Self::FailJob),
            "FailIndex" => Some(Self::FailIndex),
            "Ignore" => Some(Self::Ignore),
            "Count" => Some(Self::Count),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailJob => "FailJob",
            Self::FailIndex => "FailIndex",
            Self::Ignore => "Ignore",
            Self::Count => "Count",
        }
    }
}

/// The window the pod's termination grace period is kept in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GraceWindow {
    /// Keep the grace period in the window at all.
    pub enabled: bool,
    /// Raised to this when below it (time to write a checkpoint).
    #[schemars(range(min = 0))]
    pub minimum_seconds: i64,
    /// Lowered to this when above it (a failed pod must not hold its devices for long).
    #[schemars(range(min = 0))]
    pub maximum_seconds: i64,
}

impl Default for GraceWindow {
    fn default() -> Self {
        Self {
            enabled: true,
            minimum_seconds: 60,
            maximum_seconds: 900,
        }
    }
}

/// Minimum toleration of the node-readiness taints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReadinessTolerations {
    /// Adjust the tolerations at all.
    pub enabled: bool,
    /// Seconds to tolerate `node.kubernetes.io/not-ready:NoExecute` (Kubernetes adds 300).
    #[schemars(range(min = 0))]
    pub not_ready_seconds: i64,
    /// Seconds to tolerate `node.kubernetes.io/unreachable:NoExecute` (Kubernetes adds 300).
    #[schemars(range(min = 0))]
    pub unreachable_seconds: i64,
}

impl Default for ReadinessTolerations {
    fn default() -> Self {
        Self {
            enabled: true,
            not_ready_seconds: 900,
            unreachable_seconds: 900,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_schema_is_up_to_date() {
        let published = include_str!("../../../../policies/schema.json");
        assert!(
            published == Policy::json_schema(),
            "policies/schema.json is stale: run `cargo run -- policy schema > policies/schema.json`"
        );
    }

    #[test]
    fn every_shipped_profile_is_valid() {
        for entry in
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../policies")).unwrap()
        {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                load(&path).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}
