//! PURE: what the Job controller does with one failed pod, by its own rules (Kubernetes v1.36,
//! `pkg/controller/job`): which rule of the `podFailurePolicy` matches ([`match_rules`],
//! `pod_failure_policy.go`), and what follows for the Job ([`step`], `job_controller.go`
//! `syncJob` and `indexed_job_utils.go` `isIndexFailed`).
//!
//! The upstream unit-test table of `matchPodFailurePolicy` (`pod_failure_policy_test.go`) is
//! the specification: its cases are re-expressed in this module's tests.

use k8s_openapi::api::batch::v1::{
    JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern,
};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};

pub use crate::policy::RuleAction;

/// The `backoffLimit` the API server defaults to (`pkg/apis/batch/v1/defaults.go`), and the one
/// it sets when `backoffLimitPerIndex` is given (the per-index limit then governs).
pub const DEFAULT_BACKOFF_LIMIT: i32 = 6;
pub const PER_INDEX_BACKOFF_LIMIT: i32 = i32::MAX;

/// The rule a failed pod matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleMatch {
    /// Its index in `podFailurePolicy.rules`.
    pub index: usize,
    pub action: RuleAction,
    /// For `FailJob`: the message of the Job's failure, as the controller writes it.
    pub job_failure_message: Option<String>,
}

/// What the policy makes of a failed pod: the rule it matched, if any, and whether the failure
/// counts (against `backoffLimit`, or its index's `backoffLimitPerIndex`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyMatch {
    pub rule: Option<RuleMatch>,
    pub counted: bool,
}

/// Matches a failed pod against the rules, in order, the first match winning. A rule with an
/// action the controller does not know, or an `onExitCodes` operator it does not know, is
/// skipped. `onExitCodes` looks at the terminated containers with a non-zero exit code, the
/// regular containers first and then the init containers (restartable sidecars among them),
/// restricted to `containerName` when it is set; `onPodConditions` at the pod's conditions, in
/// the pod's order, each against every pattern (a pattern's status defaults to `True`).
pub fn match_rules(policy: Option<&PodFailurePolicy>, pod: &Pod) -> PolicyMatch {
    let no_rule = PolicyMatch {
        rule: None,
        counted: true,
    };
    let Some(policy) = policy else {
        return no_rule;
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref();
    for (index, rule) in policy.rules.iter().enumerate() {
        let Some(action) = RuleAction::parse(&rule.action) else {
            continue;
        };
        let message = if let Some(requirement) = &rule.on_exit_codes {
            let Some(container) = status.and_then(|status| exit_code_match(status, requirement))
            else {
                continue;
            };
            let code = terminated_code(container).unwrap_or_default();
            format!(
                "Container {} for pod {namespace}/{name} failed with exit code {code} matching \
                 {} rule at index {index}",
                container.name,
                action.as_str()
            )
        } else if let Some(patterns) = &rule.on_pod_conditions {
            let Some(condition) = status
                .and_then(|status| status.conditions.as_deref())
                .and_then(|conditions| condition_match(conditions, patterns))
            else {
                continue;
            };
            format!(
                "Pod {namespace}/{name} has condition {} matching {} rule at index {index}",
                condition.type_,
                action.as_str()
            )
        } else {
            continue;
        };
        return PolicyMatch {
            counted: action != RuleAction::Ignore,
            rule: Some(RuleMatch {
                index,
                action,
                job_failure_message: (action == RuleAction::FailJob).then_some(message),
            }),
        };
    }
    no_rule
}

/// Whether the pod's failure is a container the kubelet restarts in the same pod: the Job's
/// pods have `restartPolicy: OnFailure` and a container exited with a non-zero code.
pub fn restarts_in_place(spec: &JobSpec, pod: &Pod) -> bool {
    let on_failure = spec
        .template
        .spec
        .as_ref()
        .and_then(|pod| pod.restart_policy.as_deref())
        == Some("OnFailure");
    on_failure && has_exit(pod)
}

/// Whether a container of the pod terminated with a non-zero exit code.
fn has_exit(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|status| {
        status
            .container_statuses
            .iter()
            .flatten()
            .chain(status.init_container_statuses.iter().flatten())
            .any(|container| terminated_code(container).is_some_and(|code| code != 0))
    })
}

fn terminated_code(container: &ContainerStatus) -> Option<i32> {
    Some(container.state.as_ref()?.terminated.as_ref()?.exit_code)
}

fn exit_code_match<'a>(
    status: &'a k8s_openapi::api::core::v1::PodStatus,
    requirement: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<&'a ContainerStatus> {
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|container| {
            let Some(code) = terminated_code(container) else {
                return false;
            };
            let named = requirement
                .container_name
                .as_ref()
                .is_none_or(|name| *name == container.name);
            named
                && code != 0
                && match requirement.operator.as_str() {
                    "In" => requirement.values.contains(&code),
                    "NotIn" => !requirement.values.contains(&code),
                    _ => false,
                }
        })
}

fn condition_match<'a>(
    conditions: &'a [PodCondition],
    patterns: &[PodFailurePolicyOnPodConditionsPattern],
) -> Option<&'a PodCondition> {
    conditions.iter().find(|condition| {
        patterns.iter().any(|pattern| {
            condition.type_ == pattern.type_
                && condition.status == pattern.status.as_deref().unwrap_or("True")
        })
    })
}

/// What the Job has been through before this failure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Pod failures counted so far (`status.failed`).
    pub failed: i32,
    /// Counted failures of this pod's index so far (its `job-index-failure-count`), with
    /// `backoffLimitPerIndex`.
    pub index_failed: i32,
    /// Indexes failed so far, with `backoffLimitPerIndex`.
    pub failed_indexes: i32,
}

/// What the Job does after the failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Not counted: the pod is replaced.
    Replaced,
    /// Counted: `failed` of `backoff_limit` allowed (the Job fails past it); the pod is
    /// replaced.
    Counted { failed: i32, backoff_limit: i32 },
    /// Counted against its index: `failed` of `backoff_limit_per_index`; the index is retried.
    IndexCounted {
        failed: i32,
        backoff_limit_per_index: i32,
    },
    /// The index failed and is not retried; the Job goes on with the others (and ends with
    /// reason `FailedIndexes` once they finish).
    IndexFailed {
        failed_indexes: i32,
        max_failed_indexes: Option<i32>,
    },
    /// `restartPolicy: OnFailure`: the kubelet restarts the container in the same pod; the
    /// Job counts `restarts` of the `backoff_limit` it allows.
    RestartedInPlace { restarts: i32, backoff_limit: i32 },
    /// The Job fails with this condition reason and message.
    JobFailed {
        reason: &'static str,
        message: String,
    },
}

/// The Job-level outcome of one failed pod of a Job with `spec` (as stored: its defaults
/// applied; a missing `backoffLimit` is taken as the API server defaults it).
pub fn step(spec: &JobSpec, pod: &Pod, history: History) -> (PolicyMatch, Step) {
    let matched = match_rules(spec.pod_failure_policy.as_ref(), pod);
    let per_index = spec.backoff_limit_per_index;
    let backoff_limit = spec.backoff_limit.unwrap_or(if per_index.is_some() {
        PER_INDEX_BACKOFF_LIMIT
    } else {
        DEFAULT_BACKOFF_LIMIT
    });
    // `restartPolicy: OnFailure` (no podFailurePolicy is allowed with it): a container that
    // exits is restarted in place, and `pastBackoffLimitOnFailure` fails the Job once the
    // pods' restarts reach backoffLimit (any restart when it is 0). A pod that fails whole
    // (an eviction: no container exit given) is counted as below.
    if restarts_in_place(spec, pod) {
        let restarts = history.failed.saturating_add(1);
        let step = if restarts >= backoff_limit.max(1) {
            Step::JobFailed {
                reason: "BackoffLimitExceeded",
                message: "Job has reached the specified backoff limit".to_owned(),
            }
        } else {
            Step::RestartedInPlace {
                restarts,
                backoff_limit,
            }
        };
        return (matched, step);
    }
    let action = matched.rule.as_ref().map(|rule| rule.action);
    if let Some(rule) = &matched.rule
        && let Some(message) = &rule.job_failure_message
    {
        let step = Step::JobFailed {
            reason: "PodFailurePolicy",
            message: message.clone(),
        };
        return (matched, step);
    }
    if !matched.counted {
        return (matched, Step::Replaced);
    }
    let failed = history.failed.saturating_add(1);
    // `syncJob`: the Job's counted failures against backoffLimit, per-index or not.
    if failed > backoff_limit {
        let step = Step::JobFailed {
            reason: "BackoffLimitExceeded",
            message: "Job has reached the specified backoff limit".to_owned(),
        };
        return (matched, step);
    }
    let Some(per_index) = per_index else {
        return (
            matched,
            Step::Counted {
                failed,
                backoff_limit,
            },
        );
    };
    // `isIndexFailed`: a FailIndex rule fails the index at once; a counted failure once the
    // index had failed `backoffLimitPerIndex` times before.
    if action != Some(RuleAction::FailIndex) && history.index_failed < per_index {
        let step = Step::IndexCounted {
            failed: history.index_failed.saturating_add(1),
            backoff_limit_per_index: per_index,
        };
        return (matched, step);
    }
    let failed_indexes = history.failed_indexes.saturating_add(1);
    if spec
        .max_failed_indexes
        .is_some_and(|max| failed_indexes > max)
    {
        let step = Step::JobFailed {
            reason: "MaxFailedIndexesExceeded",
            message: "Job has exceeded the specified maximal number of failed indexes".to_owned(),
        };
        return (matched, step);
    }
    let step = Step::IndexFailed {
        failed_indexes,
        max_failed_indexes: spec.max_failed_indexes,
    };
    (matched, step)
}

#[cfg(test)]
mod tests;
