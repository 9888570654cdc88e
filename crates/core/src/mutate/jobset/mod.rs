//! PURE: the gang-aware mutation of a JobSet spec (a JobSet's `spec`, or the JobSet template of a
//! Kubeflow Trainer runtime).
//!
//! In a gang, retrying only the failed pod (`Ignore`) does harm: the other ranks wait in
//! collective communication until their timeout, then fail anyway. JobSet's own guidance for
//! host and hardware faults (jobset v0.12.0 `site/content/en/docs/tasks/failure_policy.md`
//! L67-75) is the other way round, and this module builds it:
//!
//! 1. Every replicated Job whose pod template uses a device goes through the Job engine as a
//!    [`JobRole::JobSetReplica`]: the device rules fail the child Job at once (`FailJob`), an
//!    empty `restartPolicy` becomes `Never`, and the grace window and node-readiness
//!    tolerations apply as for Jobs. Replicated Jobs without a device are left alone.
//! 2. The JobSet's `failurePolicy` gets rules that tell those failures apart by the message the
//!    Job controller writes on the Job's `Failed` condition (`... matching FailJob rule at index
//!    N`, `pkg/controller/job/pod_failure_policy.go`): a failure from a rule whose policy action
//!    is `Ignore` (a device fault, a disruption) restarts the gang
//!    (`RestartJobSet`); one whose policy action is `FailJob` (a non-retriable code of the
//!    strict profile) fails the JobSet (`FailJobSet`). Message patterns need JobSet v0.10.
//! 3. `maxRestarts` is raised by `mutation.gang.deviceRestarts`, so device restarts do not use
//!    up the user's budget and all restarts stay bounded. A JobSet without a failure policy
//!    failed on any child failure; it keeps doing so for every other failure (a last
//!    `FailJobSet` rule).
//!
//! The JobSet's own rules are kept after gpu-guard's (the first matching rule wins, and
//! gpu-guard's match only the indices of its own child rules), an unnamed one named as JobSet's
//! webhook would name it. `existingPolicy: Keep` leaves a JobSet that has failure-policy rules
//! alone; `Replace` drops its rules.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::{Job, PodFailurePolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::{Change, ClusterFacts, JobRole, Outcome, SkipReason, is_skipped, mutate_owned_job};
use crate::api_rules::jobset::{check_generated_names, check_jobset_spec};
use crate::devices::DraFacts;
use crate::field::FieldPath;
use crate::jobset::{JobSetFailurePolicy, JobSetFailurePolicyRule, JobSetSpec, default_rule_name};
use crate::policy::{ExistingPolicy, Policy, RuleAction};

/// The prefix of every failure-policy rule gpu-guard adds (a valid JobSet rule name start).
pub const RULE_PREFIX: &str = "gpuGuard";
/// The Job failure reason of a podFailurePolicy `FailJob` rule.
const POD_FAILURE_POLICY_REASON: &str = "PodFailurePolicy";

/// What the engine did to one JobSet spec.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSetOutcome {
    /// The mutated spec (unchanged when nothing was done).
    pub spec: JobSetSpec,
    /// The Job engine's outcome for each replicated Job it changed, by index.
    pub replicated: Vec<(usize, Outcome)>,
    /// The new `failurePolicy`, when it changed.
    pub failure_policy: Option<JobSetFailurePolicy>,
    pub warnings: Vec<String>,
    pub skipped: Option<SkipReason>,
}

impl JobSetOutcome {
    fn unchanged(spec: &JobSetSpec, warnings: Vec<String>, skipped: Option<SkipReason>) -> Self {
        Self {
            spec: spec.clone(),
            replicated: Vec::new(),
            failure_policy: None,
            warnings,
            skipped,
        }
    }

    /// Whether anything changed.
    pub fn is_changed(&self) -> bool {
        !self.replicated.is_empty() || self.failure_policy.is_some()
    }

    /// A one-line summary of the changes (for the `gpu-guard.io/mutated` annotation and logs).
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .replicated
            .iter()
            .map(|(index, outcome)| {
                let name = &self.spec.replicated_jobs[*index].name;
                format!("replicatedJob {name}: {}", outcome.summary())
            })
            .collect();
        if let Some(policy) = &self.failure_policy {
            let ours = policy
                .rules
                .iter()
                .filter(|rule| rule.name.starts_with(RULE_PREFIX))
                .count();
            parts.push(format!(
                "failurePolicy: {ours} gang rules, maxRestarts={}",
                policy.max_restarts.unwrap_or_default()
            ));
        }
        parts.join("; ")
    }
}

/// Mutates a JobSet spec whose object has `metadata`; `path` is where the spec is
/// (`spec`, or `spec.template.spec` in a Trainer runtime), for messages. `jobset_name` is the
/// name of the JobSet the spec is (`None` for a Trainer runtime, whose JobSets take their
/// TrainJob's name): JobSet's webhook checks the child Job names it makes from it.
pub fn mutate_jobset(
    metadata: &ObjectMeta,
    jobset_name: Option<&str>,
    spec: &JobSetSpec,
    path: &FieldPath,
    policy: &Policy,
    dra: &dyn DraFacts,
) -> JobSetOutcome {
    if is_skipped(metadata) {
        return JobSetOutcome::unchanged(spec, Vec::new(), Some(SkipReason::SkipAnnotation));
    }
    if !policy.mutation.gang.enabled {
        return JobSetOutcome::unchanged(spec, Vec::new(), Some(SkipReason::Disabled));
    }
    let existing_rules = spec
        .failure_policy
        .as_ref()
        .is_some_and(|policy| !policy.rules.is_empty());
    if existing_rules && policy.mutation.pod_failure_policy.existing_policy == ExistingPolicy::Keep
    {
        return JobSetOutcome::unchanged(
            spec,
            vec![
                "the JobSet has failure-policy rules and existingPolicy is Keep: left \
                  unchanged"
                    .to_owned(),
            ],
            None,
        );
    }
    if spec
        .failure_policy
        .iter()
        .flat_map(|policy| &policy.rules)
        .any(|rule| rule.name.starts_with(RULE_PREFIX))
    {
        // Protected already (a mutated manifest, or a JobSet built from a protected runtime).
        return JobSetOutcome::unchanged(spec, Vec::new(), None);
    }

    let mut mutated = spec.clone();
    let mut replicated = Vec::new();
    let mut warnings = Vec::new();
    // The warnings that stay true if the JobSet is left unchanged after all: none that tells
    // of a change to a replicated Job or to the JobSet's failure policy.
    let mut input_warnings = Vec::new();
    let mut any_device = false;
    for (index, replica) in spec.replicated_jobs.iter().enumerate() {
        let job = || Job {
            metadata: replica.template.metadata.clone().unwrap_or_default(),
            spec: replica.template.spec.clone(),
            status: None,
        };
        // The replicated Jobs are created in the JobSet's namespace.
        let facts = ClusterFacts::of(metadata, dra);
        let outcome = mutate_owned_job(job(), policy, JobRole::JobSetReplica, facts, job);
        let about_replica = |warning: &String| format!("replicatedJob {}: {warning}", replica.name);
        any_device |= outcome.skipped != Some(SkipReason::NotDeviceWorkload);
        warnings.extend(outcome.warnings.iter().map(about_replica));
        input_warnings.extend(outcome.input_warnings().map(about_replica));
        if outcome.is_changed() {
            let template = &mut mutated.replicated_jobs[index].template;
            template.metadata = Some(outcome.job.metadata.clone());
            template.spec = outcome.job.spec.clone();
            replicated.push((index, outcome));
        }
    }
    if replicated.is_empty() {
        // Told as for a Job: no replicated Job is a device workload, so nothing to protect.
        let skipped = (!any_device).then_some(SkipReason::NotDeviceWorkload);
        return JobSetOutcome::unchanged(spec, warnings, skipped);
    }

    let gang_rules = gang_rules(&mutated, &replicated, policy);
    // No device rule was added (e.g. restartPolicy OnFailure left as it is): the JobSet's
    // failure policy has nothing new to tell apart.
    let failure_policy = (!gang_rules.is_empty())
        .then(|| merged_failure_policy(spec, gang_rules, policy, &mut warnings));
    if let Some(failure_policy) = &failure_policy {
        mutated.failure_policy = Some(failure_policy.clone());
    }

    // As for Jobs: a result that would be refused is not returned. When the JobSet is refused
    // as it came (a rule naming a missing replicated Job, an action the CRD does not know),
    // the warning says so, with the input's own first violation.
    let check = |spec: &JobSetSpec| {
        let mut violations = check_jobset_spec(spec, path);
        violations.extend(check_generated_names(jobset_name, spec, path));
        violations
    };
    if let Some(first) = check(&mutated).first() {
        input_warnings.push(match check(spec).first() {
            Some(own) => format!(
                "JobSet left unchanged: JobSet's webhook or the API server will reject it as it \
                 is: {own}"
            ),
            None => format!(
                "JobSet left unchanged, JobSet's webhook or the API server would reject the \
                 result: {first}"
            ),
        });
        return JobSetOutcome::unchanged(spec, input_warnings, None);
    }
    JobSetOutcome {
        spec: mutated,
        replicated,
        failure_policy,
        warnings,
        skipped: None,
    }
}

/// The retriable and non-retriable podFailurePolicy rule indices of one replicated Job:
/// gpu-guard's `FailJob` rules whose policy action is `Ignore` (restart the gang), and those
/// whose policy action is `FailJob` (fail the JobSet).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Classified {
    retriable: Vec<usize>,
    fatal: Vec<usize>,
}

/// gpu-guard's JobSet rules: for each group of replicated Jobs whose rule indices agree, a
/// `FailJobSet` rule for the non-retriable indices and a `RestartJobSet` rule for the
/// retriable ones, each targeting that group.
fn gang_rules(
    mutated: &JobSetSpec,
    replicated: &[(usize, Outcome)],
    policy: &Policy,
) -> Vec<JobSetFailurePolicyRule> {
    let mut groups: Vec<(Classified, Vec<String>)> = Vec::new();
    for (index, outcome) in replicated {
        let Some(rules) = outcome
            .job
            .spec
            .as_ref()
            .and_then(|spec| spec.pod_failure_policy.as_ref())
            .map(|policy| &policy.rules)
        else {
            continue;
        };
        let classified = classify(&rules[..own_rule_count(outcome)], policy);
        if classified == Classified::default() {
            continue;
        }
        let name = mutated.replicated_jobs[*index].name.clone();
        match groups.iter_mut().find(|(c, _)| *c == classified) {
            Some((_, names)) => names.push(name),
            None => groups.push((classified, vec![name])),
        }
    }
    let mut rules = Vec::new();
    for (group, (classified, targets)) in groups.iter().enumerate() {
        let suffix = if group == 0 {
            String::new()
        } else {
            (group + 1).to_string()
        };
        for (indices, action, name) in [
            (&classified.fatal, "FailJobSet", "NonRetriable"),
            (&classified.retriable, "RestartJobSet", "DeviceRestart"),
        ] {
            if indices.is_empty() {
                continue;
            }
            rules.push(JobSetFailurePolicyRule {
                name: format!("{RULE_PREFIX}{name}{suffix}"),
                action: action.to_owned(),
                on_job_failure_reasons: vec![POD_FAILURE_POLICY_REASON.to_owned()],
                on_job_failure_message_patterns: vec![index_pattern(indices)],
                target_replicated_jobs: targets.clone(),
            });
        }
    }
    rules
}

/// How many rules at the front of the replicated Job's podFailurePolicy are gpu-guard's: the
/// engine prepends its rules to the Job's own (Merge), or sets the whole policy.
fn own_rule_count(outcome: &Outcome) -> usize {
    outcome
        .changes
        .iter()
        .find_map(|change| match change {
            Change::PrependRules(added) => Some(added.len()),
            Change::SetPodFailurePolicy(policy) => Some(policy.rules.len()),
            _ => None,
        })
        .unwrap_or(0)
}

/// Sorts gpu-guard's rules (`own`, the front of the policy) by what their policy action was.
fn classify(own: &[PodFailurePolicyRule], policy: &Policy) -> Classified {
    let settings = &policy.mutation.pod_failure_policy;
    let mut classified = Classified::default();
    for (index, rule) in own.iter().enumerate() {
        if rule.action != RuleAction::FailJob.as_str() {
            continue;
        }
        let original = if let Some(patterns) = &rule.on_pod_conditions {
            settings
                .pod_condition_rules
                .iter()
                .find(|setting| patterns.iter().any(|p| p.type_ == setting.condition_type))
                .map(|setting| setting.action)
        } else {
            let codes: BTreeSet<i32> = rule
                .on_exit_codes
                .iter()
                .flat_map(|codes| codes.values.iter().copied())
                .collect();
            settings
                .exit_code_rules
                .iter()
                .find(|setting| setting.codes.iter().any(|code| codes.contains(code)))
                .map(|setting| setting.action)
        };
        match original {
            Some(RuleAction::Ignore) => classified.retriable.push(index),
            Some(RuleAction::FailJob) => classified.fatal.push(index),
            _ => {}
        }
    }
    classified
}

/// The message pattern of the Job controller's `Failed` condition for these FailJob rules.
fn index_pattern(indices: &[usize]) -> String {
    let alternatives: Vec<String> = indices.iter().map(ToString::to_string).collect();
    format!(
        "matching FailJob rule at index ({})$",
        alternatives.join("|")
    )
}

/// Whether `new` is exactly the failure policy `old` was before gpu-guard added its part
/// (its rules, the raised `maxRestarts`, the names it gave unnamed rules): what a server-side
/// apply of the user's own failure policy leaves once it owns the atomic `rules` list.
pub fn lacks_exactly_the_gang_part(old: &Value, new: Option<&Value>, policy: &Policy) -> bool {
    let Some(new) = new else {
        return false;
    };
    let own_rules = |fp: &Value, strip_ours: bool| -> Vec<Value> {
        fp.get("rules")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|rule| {
                !strip_ours
                    || !rule
                        .get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|name| name.starts_with(RULE_PREFIX))
            })
            .enumerate()
            .map(|(index, rule)| {
                let mut rule = rule.clone();
                if rule
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .is_empty()
                    && let Some(fields) = rule.as_object_mut()
                {
                    fields.insert("name".to_owned(), Value::from(default_rule_name(index)));
                }
                rule
            })
            .collect()
    };
    let max_restarts = |fp: &Value| fp.get("maxRestarts").and_then(Value::as_i64).unwrap_or(0);
    let ours = own_rules(old, false).len() != own_rules(old, true).len();
    let without = |fp: &Value| {
        let mut rest = fp.clone();
        if let Some(fields) = rest.as_object_mut() {
            fields.remove("rules");
            fields.remove("maxRestarts");
        }
        rest
    };
    ours && own_rules(old, true) == own_rules(new, false)
        && max_restarts(old) - i64::from(policy.mutation.gang.device_restarts) == max_restarts(new)
        && without(old) == without(new)
}

/// The JobSet's failure policy with gpu-guard's rules in front and `maxRestarts` raised.
fn merged_failure_policy(
    spec: &JobSetSpec,
    gang_rules: Vec<JobSetFailurePolicyRule>,
    policy: &Policy,
    warnings: &mut Vec<String>,
) -> JobSetFailurePolicy {
    let budget = policy.mutation.gang.device_restarts;
    let Some(existing) = &spec.failure_policy else {
        // Without a failure policy any child failure failed the JobSet: keep that for every
        // failure gpu-guard's rules do not claim.
        let mut rules = gang_rules;
        rules.push(JobSetFailurePolicyRule {
            name: format!("{RULE_PREFIX}OtherFailures"),
            action: "FailJobSet".to_owned(),
            ..JobSetFailurePolicyRule::default()
        });
        return JobSetFailurePolicy {
            max_restarts: Some(budget),
            restart_strategy: None,
            rules,
        };
    };
    let mut rules = gang_rules;
    match policy.mutation.pod_failure_policy.existing_policy {
        ExistingPolicy::Replace if !existing.rules.is_empty() => warnings.push(format!(
            "the JobSet's {} failure-policy rules are replaced (existingPolicy: Replace)",
            existing.rules.len()
        )),
        _ => rules.extend(existing.rules.iter().enumerate().map(|(index, rule)| {
            let mut rule = rule.clone();
            if rule.name.is_empty() {
                rule.name = default_rule_name(index);
            }
            rule
        })),
    }
    if existing
        .rules
        .iter()
        .any(|rule| !rule.on_job_failure_message_patterns.is_empty())
    {
        warnings.push(
            "the JobSet's own rules match Job failure messages: gpu-guard's podFailurePolicy \
             rules come first in the device replicated Jobs, so a pattern naming the index of a \
             Job's own rule (\"... rule at index N\") must count them"
                .to_owned(),
        );
    }
    if existing.restart_strategy.as_deref() == Some("InPlaceRestart") {
        warnings.push(format!(
            "restartStrategy InPlaceRestart: maxRestarts also bounds in-place container \
             restarts, and is raised by {budget}"
        ));
    }
    JobSetFailurePolicy {
        max_restarts: Some(existing.max_restarts.unwrap_or(0).saturating_add(budget)),
        restart_strategy: existing.restart_strategy.clone(),
        rules,
    }
}

#[cfg(test)]
mod tests;
