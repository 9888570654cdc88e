//! PURE: what a JobSet does when one of its child Jobs fails, by JobSet's controller (v0.12.0,
//! `pkg/controllers/failure_policy.go`, its messages from `pkg/constants/constants.go`).
//!
//! - No `failurePolicy`: the JobSet fails (`FailedJobs`).
//! - Else the first rule that applies to the failed Job wins: its `onJobFailureReasons` name the
//!   Job's failure reason (empty: any), one of its `onJobFailureMessagePatterns` (Go regular
//!   expressions, searched in the message; a pattern that does not compile is skipped) matches
//!   the message (empty: any), and its `targetReplicatedJobs` name the Job's replicated Job
//!   (empty: any). No rule applies: `RestartJobSet`.
//! - `RestartJobSet` counts against `maxRestarts`: when the restarts that count already reached
//!   it, the JobSet fails (`ReachedMaxRestarts`); `RestartJobSetAndIgnoreMaxRestarts` restarts
//!   without counting; `FailJobSet` fails it at once.
//! - `RestartJob` and `RestartJobAndIgnoreMaxRestarts` need the `RestartJob` feature gate, alpha
//!   and off by default in v0.12.0: without it the controller refuses the action and retries,
//!   and the JobSet neither restarts nor fails. With it, they recreate the failed child Job only
//!   (`RestartJob` counting against `maxRestarts`, the other not), and the restarts that count
//!   are the JobSet's and its child Jobs' together.
//!
//! The upstream tables (`failure_policy_test.go`, `TestFailurePolicyRuleIsApplicable`,
//! `TestFindFirstFailedPolicyRuleAndJob`, `TestApplyFailurePolicyRuleAction`) are re-expressed in
//! this module's tests, as far as one failed Job expresses them.

use regex::Regex;

use crate::jobset::{JobSetFailurePolicyRule, JobSetSpec};

/// The child Job that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedJob<'a> {
    /// Its name (`<jobset>-<replicatedJob>-<index>`).
    pub name: &'a str,
    /// Its replicated Job (the `jobset.sigs.k8s.io/replicatedjob-name` label).
    pub replicated_job: &'a str,
    /// Its `Failed` condition's reason and message, as the Job controller wrote them.
    pub reason: &'a str,
    pub message: &'a str,
}

/// A JobSet failure policy action, as the controller acts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    FailJobSet,
    RestartJobSet,
    RestartJobSetAndIgnoreMaxRestarts,
    RestartJob,
    RestartJobAndIgnoreMaxRestarts,
}

impl Action {
    pub fn parse(action: &str) -> Option<Self> {
        match action {
            "FailJobSet" => Some(Self::FailJobSet),
            "RestartJobSet" => Some(Self::RestartJobSet),
            "RestartJobSetAndIgnoreMaxRestarts" => Some(Self::RestartJobSetAndIgnoreMaxRestarts),
            "RestartJob" => Some(Self::RestartJob),
            "RestartJobAndIgnoreMaxRestarts" => Some(Self::RestartJobAndIgnoreMaxRestarts),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailJobSet => "FailJobSet",
            Self::RestartJobSet => "RestartJobSet",
            Self::RestartJobSetAndIgnoreMaxRestarts => "RestartJobSetAndIgnoreMaxRestarts",
            Self::RestartJob => "RestartJob",
            Self::RestartJobAndIgnoreMaxRestarts => "RestartJobAndIgnoreMaxRestarts",
        }
    }
}

/// What the JobSet does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The JobSet fails with this condition reason and message.
    Failed {
        reason: &'static str,
        message: String,
    },
    /// Every child Job is recreated; `counted` says whether it counts against `maxRestarts`,
    /// `restarts_left` how many counted restarts remain after it. The `Restarting` condition
    /// gets `condition_reason`.
    Restarted {
        counted: bool,
        restarts_left: i32,
        condition_reason: String,
    },
    /// Only the failed child Job is recreated (`RestartJob`, `RestartJobAndIgnoreMaxRestarts`
    /// with the `RestartJob` gate); `counted` and `restarts_left` as for [`Step::Restarted`].
    JobRestarted { counted: bool, restarts_left: i32 },
    /// The controller cannot apply the action (say why) and retries; nothing changes.
    Refused(String),
}

/// The outcome: the rule that applied (its index and name), the action taken, and the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub rule: Option<(usize, String)>,
    pub action: Option<Action>,
    pub step: Step,
}

/// Whether `rule` applies to `failed` (`ruleIsApplicable`).
pub fn rule_applies(rule: &JobSetFailurePolicyRule, failed: &FailedJob<'_>) -> bool {
    let reasons = &rule.on_job_failure_reasons;
    let patterns = &rule.on_job_failure_message_patterns;
    let targets = &rule.target_replicated_jobs;
    (reasons.is_empty() || reasons.iter().any(|reason| reason == failed.reason))
        && (patterns.is_empty()
            || patterns.iter().any(|pattern| {
                Regex::new(pattern).is_ok_and(|regex| regex.is_match(failed.message))
            }))
        && !failed.replicated_job.is_empty()
        && (targets.is_empty() || targets.iter().any(|target| target == failed.replicated_job))
}

/// What the JobSet with `spec` does when `failed` fails, after `restarts_counted` restarts that
/// count against `maxRestarts` (`status.restartsCountTowardsMax`, and with the `RestartJob`
/// gate the child Jobs' counted restarts too); `restart_job_gate`: JobSet's `RestartJob`
/// feature gate is on.
pub fn step(
    spec: &JobSetSpec,
    failed: &FailedJob<'_>,
    restarts_counted: i32,
    restart_job_gate: bool,
) -> Outcome {
    let with_job = |message: &str| format!("{message} (first failed job: {})", failed.name);
    let Some(policy) = &spec.failure_policy else {
        return Outcome {
            rule: None,
            action: None,
            step: Step::Failed {
                reason: "FailedJobs",
                message: with_job("jobset failed due to one or more job failures"),
            },
        };
    };
    let matched = policy
        .rules
        .iter()
        .enumerate()
        .find(|(_, rule)| rule_applies(rule, failed));
    let (rule, action) = match matched {
        Some((index, rule)) => (
            Some((index, rule.name.clone())),
            Action::parse(&rule.action),
        ),
        None => (None, Some(Action::RestartJobSet)),
    };
    let max_restarts = policy.max_restarts.unwrap_or(0);
    let condition_reason = match &rule {
        Some((_, name)) => format!("FailurePolicy_{name}"),
        None => "DefaultFailurePolicy".to_owned(),
    };
    let step = match action {
        None => Step::Refused(format!(
            "the rule's action {:?} is not one JobSet knows: the controller reports an error and \
             retries",
            matched
                .map(|(_, rule)| rule.action.as_str())
                .unwrap_or_default()
        )),
        Some(Action::FailJobSet) => Step::Failed {
            reason: "FailJobSetFailurePolicyAction",
            message: with_job("applying FailJobSet failure policy action"),
        },
        Some(Action::RestartJobSet) if restarts_counted >= max_restarts => Step::Failed {
            reason: "ReachedMaxRestarts",
            message: with_job("jobset failed due to reaching max number of restarts"),
        },
        Some(Action::RestartJobSet) => Step::Restarted {
            counted: true,
            restarts_left: max_restarts - restarts_counted - 1,
            condition_reason,
        },
        Some(Action::RestartJobSetAndIgnoreMaxRestarts) => Step::Restarted {
            counted: false,
            restarts_left: (max_restarts - restarts_counted).max(0),
            condition_reason,
        },
        Some(Action::RestartJob) if restart_job_gate && restarts_counted >= max_restarts => {
            Step::Failed {
                reason: "ReachedMaxRestarts",
                message: with_job("jobset failed due to reaching max number of restarts"),
            }
        }
        Some(Action::RestartJob) if restart_job_gate => Step::JobRestarted {
            counted: true,
            restarts_left: max_restarts - restarts_counted - 1,
        },
        Some(Action::RestartJobAndIgnoreMaxRestarts) if restart_job_gate => Step::JobRestarted {
            counted: false,
            restarts_left: (max_restarts - restarts_counted).max(0),
        },
        Some(action @ (Action::RestartJob | Action::RestartJobAndIgnoreMaxRestarts)) => {
            Step::Refused(format!(
                "{} needs JobSet's RestartJob feature gate (alpha, off by default in v0.12.0): \
                 without it the controller refuses the action and retries",
                action.as_str()
            ))
        }
    };
    Outcome { rule, action, step }
}

#[cfg(test)]
mod tests;
