//! The rules JobSet's own admission webhook enforces on the parts of a JobSet gpu-guard writes
//! (its types are [`crate::jobset`]), as a plain function, so that gpu-guard can prove it never
//! emits a JobSet that JobSet's webhook (or the Job API, inside every template) rejects.
//!
//! Read from kubernetes-sigs/jobset v0.12.0 (commit f22e565a):
//! - the enums: `api/jobset/v1alpha2/jobset_types.go` (actions L408-435, restart strategies
//!   L497-521);
//! - `pkg/webhooks/jobset_webhook.go`: `Default()` L111-161 (an empty pod `restartPolicy`
//!   becomes `OnFailure`; an unnamed failure-policy rule is named `failurePolicyRule<index>`),
//!   `ValidateCreate` L166-309 and `validateFailurePolicy` L425-494 (the messages below are
//!   its own), `ValidateUpdate` L312-407 (`replicatedJobs` and `failurePolicy` immutable).
//!
//! JobSet's webhook reports these as `Internal error: <message>` with no field path; gpu-guard
//! adds the path so a user can find the field.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::batch::v1::JobSpec;

use super::job::check_job_spec;
use super::names;
use crate::field::{FieldPath, Violation, quote};
use crate::jobset::{JobSetFailurePolicy, JobSetSpec, ReplicatedJob, default_rule_name};

/// The Job failure reasons a failure-policy rule may name (`jobset_webhook.go` L85-91: the
/// batch/v1 `JobReason*` constants).
pub const FAILURE_REASONS: [&str; 5] = [
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
];
/// The actions of a failure-policy rule (the CRD's enum).
pub const ACTIONS: [&str; 5] = [
    "FailJobSet",
    "RestartJobSet",
    "RestartJobSetAndIgnoreMaxRestarts",
    "RestartJob",
    "RestartJobAndIgnoreMaxRestarts",
];
/// The restart strategies (the CRD's enum; `Recreate` by default).
pub const RESTART_STRATEGIES: [&str; 3] = ["Recreate", "BlockingRecreate", "InPlaceRestart"];
/// A rule name is 1 to this many characters.
pub const MAX_RULE_NAME_LENGTH: usize = 128;
/// `backoffLimit` every replicated Job must have under `InPlaceRestart`.
pub const IN_PLACE_RESTART_BACKOFF_LIMIT: i32 = i32::MAX;
/// `RestartJob` actions allow at most this many replicas per replicated Job.
pub const MAX_RESTART_JOB_REPLICAS: i32 = 1024;

/// Every violation of JobSet's webhook rules and of the Job API's rules (in every replicated
/// Job's template) for a JobSet spec at `path` (`spec`, or `spec.template.spec` of a Trainer
/// runtime). Empty when both would accept it.
pub fn check_jobset_spec(spec: &JobSetSpec, path: &FieldPath) -> Vec<Violation> {
    let mut violations = Vec::new();
    let names: HashSet<&str> = spec
        .replicated_jobs
        .iter()
        .map(|job| job.name.as_str())
        .collect();
    let in_place = spec
        .failure_policy
        .as_ref()
        .and_then(|policy| policy.restart_strategy.as_deref())
        == Some("InPlaceRestart");
    for (index, job) in spec.replicated_jobs.iter().enumerate() {
        let job_path = path.child("replicatedJobs").index(index);
        let template_spec_path = job_path.child("template").child("spec");
        match &job.template.spec {
            Some(job_spec) => {
                violations.extend(check_job_spec(
                    &as_defaulted_by_jobset(job_spec),
                    &template_spec_path,
                ));
                if in_place {
                    check_in_place_restart(job, job_spec, &template_spec_path, &mut violations);
                }
            }
            None => violations.push(Violation::required(
                template_spec_path,
                "a replicated Job needs a Job spec",
            )),
        }
    }
    if let Some(policy) = &spec.failure_policy {
        check_failure_policy(spec, policy, &names, path, &mut violations);
    }
    violations
}

/// The names JobSet gives a JobSet's child Jobs (`<jobset>-<replicatedJob>-<index>`) and, for
/// an Indexed Job with `completions`, their pods (`<job>-<pod index>-<5 characters>`) must be
/// DNS-1035 labels (`jobset_webhook.go` L233-256, `pkg/util/placement/placement.go`); JobSet's
/// webhook checks the longest of each. `jobset_name` is `None` for a Trainer runtime's
/// template, whose JobSets take their TrainJob's name: then only the form of the replicated
/// Job's own name is checked, not the length.
pub fn check_generated_names(
    jobset_name: Option<&str>,
    spec: &JobSetSpec,
    path: &FieldPath,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    // A stand-in that is a valid label on its own, so that only the replicated Job's name
    // can make the generated name invalid.
    let jobset = jobset_name.unwrap_or("x");
    for (index, job) in spec.replicated_jobs.iter().enumerate() {
        let name_path = path.child("replicatedJobs").index(index).child("name");
        let last_job = job.replicas.unwrap_or(1).saturating_sub(1);
        let job_name = format!("{jobset}-{}-{last_job}", job.name);
        let mut problems = names::dns1035_label_errors(&job_name);
        let too_long = |problems: &[String]| problems.iter().any(|p| p == names::DNS1035_TOO_LONG);
        let job_too_long = too_long(&problems);
        problems.retain(|problem| problem != names::DNS1035_TOO_LONG);
        for problem in problems {
            violations.push(Violation::invalid(
                name_path.clone(),
                quote(&job.name),
                format!("the child Job name {job_name:?} is not valid: {problem}"),
            ));
        }
        if jobset_name.is_none() {
            continue;
        }
        if job_too_long {
            violations.push(Violation::invalid(
                name_path.clone(),
                quote(&job.name),
                "JobSet name is too long, job names generated for this JobSet will exceed 63 \
                 characters",
            ));
            continue;
        }
        let indexed_completions = job.template.spec.as_ref().and_then(|spec| {
            (spec.completion_mode.as_deref() == Some("Indexed"))
                .then_some(spec.completions)
                .flatten()
        });
        if let Some(completions) = indexed_completions {
            let pod_name = format!("{job_name}-{}-abcde", completions.saturating_sub(1));
            if too_long(&names::dns1035_label_errors(&pod_name)) {
                violations.push(Violation::invalid(
                    name_path,
                    quote(&job.name),
                    "JobSet name is too long, pod names generated for this JobSet will exceed 63 \
                     characters",
                ));
            }
        }
    }
    violations
}

/// A replicated Job's spec as JobSet's defaulting webhook leaves it before the Job rules apply:
/// an empty pod `restartPolicy` becomes `OnFailure` (`jobset_webhook.go` L125-127).
fn as_defaulted_by_jobset(spec: &JobSpec) -> std::borrow::Cow<'_, JobSpec> {
    let empty = spec
        .template
        .spec
        .as_ref()
        .is_some_and(|pod| pod.restart_policy.as_deref().unwrap_or_default().is_empty());
    if !empty {
        return std::borrow::Cow::Borrowed(spec);
    }
    let mut defaulted = spec.clone();
    if let Some(pod) = defaulted.template.spec.as_mut() {
        pod.restart_policy = Some("OnFailure".to_owned());
    }
    std::borrow::Cow::Owned(defaulted)
}

/// `InPlaceRestart` constraints (`jobset_webhook.go` L266-281): never weakened by gpu-guard,
/// which does not touch `backoffLimit`, `completions` or `parallelism`.
fn check_in_place_restart(
    job: &ReplicatedJob,
    spec: &JobSpec,
    path: &FieldPath,
    violations: &mut Vec<Violation>,
) {
    let name = &job.name;
    if spec.backoff_limit != Some(IN_PLACE_RESTART_BACKOFF_LIMIT) {
        violations.push(Violation::invalid_without_value(
            path.child("backoffLimit"),
            format!(
                "replicatedJob {name}: must be set to 2147483647 (MaxInt32) when in-place \
                 restart is enabled"
            ),
        ));
    }
    if spec.pod_replacement_policy.as_deref() != Some("Failed") {
        violations.push(Violation::invalid_without_value(
            path.child("podReplacementPolicy"),
            format!("replicatedJob {name}: must be set to Failed when in-place restart is enabled"),
        ));
    }
    if spec.completions.is_none() || spec.completions != spec.parallelism {
        violations.push(Violation::invalid_without_value(
            path.child("completions"),
            format!(
                "replicatedJob {name}: completions and parallelism must be set and equal to \
                 each other when in-place restart is enabled"
            ),
        ));
    }
}

fn check_failure_policy(
    spec: &JobSetSpec,
    policy: &JobSetFailurePolicy,
    names: &HashSet<&str>,
    spec_path: &FieldPath,
    violations: &mut Vec<Violation>,
) {
    let path = spec_path.child("failurePolicy");
    if let Some(strategy) = policy.restart_strategy.as_deref()
        && !RESTART_STRATEGIES.contains(&strategy)
    {
        violations.push(Violation::not_supported(
            path.child("restartStrategy"),
            strategy,
            &RESTART_STRATEGIES,
        ));
    }
    let rules_path = path.child("rules");
    let restarts_jobs = policy.rules.iter().any(|rule| {
        rule.action.starts_with("RestartJob") && !rule.action.starts_with("RestartJobSet")
    });
    if restarts_jobs
        && let Some((index, job)) = spec
            .replicated_jobs
            .iter()
            .enumerate()
            .find(|(_, job)| job.replicas.unwrap_or(1) > MAX_RESTART_JOB_REPLICAS)
    {
        violations.push(Violation::invalid_without_value(
            spec_path
                .child("replicatedJobs")
                .index(index)
                .child("replicas"),
            format!(
                "JobSet cannot have a failure policy rule with RestartJob or \
                 RestartJobAndIgnoreMaxRestarts action and a replicated job with replicas > \
                 {MAX_RESTART_JOB_REPLICAS} ({} has {})",
                job.name,
                job.replicas.unwrap_or(1)
            ),
        ));
    }
    // Names as JobSet's defaulting webhook leaves them, for the uniqueness check.
    let mut by_name: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (index, rule) in policy.rules.iter().enumerate() {
        let rule_path = rules_path.index(index);
        let name = if rule.name.is_empty() {
            default_rule_name(index)
        } else {
            rule.name.clone()
        };
        if let Some(problem) = rule_name_problem(&name) {
            violations.push(Violation::invalid(
                rule_path.child("name"),
                quote(&name),
                problem,
            ));
        }
        by_name.entry(name).or_default().push(index);
        if !ACTIONS.contains(&rule.action.as_str()) {
            violations.push(Violation::not_supported(
                rule_path.child("action"),
                &rule.action,
                &ACTIONS,
            ));
        }
        for (at, target) in rule.target_replicated_jobs.iter().enumerate() {
            if !names.contains(target.as_str()) {
                violations.push(Violation::invalid(
                    rule_path.child("targetReplicatedJobs").index(at),
                    quote(target),
                    format!(
                        "invalid replicatedJob name '{target}' in failure policy does not \
                         appear in .spec.ReplicatedJobs"
                    ),
                ));
            }
        }
        for (at, reason) in rule.on_job_failure_reasons.iter().enumerate() {
            if !FAILURE_REASONS.contains(&reason.as_str()) {
                violations.push(Violation::invalid(
                    rule_path.child("onJobFailureReasons").index(at),
                    quote(reason),
                    format!(
                        "invalid job failure reason '{reason}' in failure policy is not a \
                         recognized job failure reason"
                    ),
                ));
            }
        }
    }
    for (name, indices) in by_name {
        if indices.len() > 1 {
            violations.push(Violation::invalid(
                rules_path.index(indices[1]).child("name"),
                quote(&name),
                format!(
                    "rule names are not unique, rules with indices {indices:?} all have the same \
                     name '{name}'"
                ),
            ));
        }
    }
}

/// Why `name` is not a valid rule name (`jobset_webhook.go` L457-468), if it is not: 1 to 128
/// characters matching `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`.
pub fn rule_name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_RULE_NAME_LENGTH {
        return Some(format!(
            "invalid failure policy rule name of length {}, the rule name must be at least 1 \
             characters long and at most {MAX_RULE_NAME_LENGTH} characters long",
            name.len()
        ));
    }
    let bytes = name.as_bytes();
    let first_ok = bytes[0].is_ascii_alphabetic();
    let middle_ok = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',' | b':'));
    let last = bytes[bytes.len() - 1];
    let last_ok = bytes.len() == 1 || last.is_ascii_alphanumeric() || last == b'_';
    (!(first_ok && middle_ok && last_ok)).then(|| {
        format!(
            "invalid failure policy rule name '{name}', a failure policy rule name must start \
             with an alphabetic character, optionally followed by a string of alphanumeric \
             characters or '_,:', and must end with an alphanumeric character or '_'"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> JobSetSpec {
        serde_json::from_value(value).expect("a JobSet spec")
    }

    fn never_job(name: &str) -> serde_json::Value {
        json!({"name": name, "replicas": 2, "template": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "x"}]}}}}})
    }

    fn messages(spec: &JobSetSpec) -> Vec<String> {
        check_jobset_spec(spec, &FieldPath::new(["spec"]))
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_valid_failure_policy_passes() {
        let valid = spec(json!({
            "replicatedJobs": [never_job("leader"), never_job("workers")],
            "failurePolicy": {"maxRestarts": 3, "restartStrategy": "BlockingRecreate", "rules": [
                {"name": "gpuGuard_device:restart", "action": "RestartJobSet",
                 "onJobFailureReasons": ["PodFailurePolicy"],
                 "onJobFailureMessagePatterns": ["matching FailJob rule at index (0|1)$"],
                 "targetReplicatedJobs": ["workers"]},
                {"action": "FailJobSet"},
            ]}
        }));
        assert_eq!(messages(&valid), Vec::<String>::new());
    }

    #[test]
    fn every_jobset_webhook_rule_is_reported_with_its_field() {
        let invalid = spec(json!({
            "replicatedJobs": [never_job("workers")],
            "failurePolicy": {"restartStrategy": "Sometimes", "rules": [
                {"name": "gpu-guard", "action": "RestartJobSet"},
                {"name": "twice", "action": "Explode",
                 "onJobFailureReasons": ["OOMKilled"], "targetReplicatedJobs": ["leader"]},
                {"name": "twice", "action": "FailJobSet"},
                {"name": "failurePolicyRule4", "action": "FailJobSet"},
                {"action": "FailJobSet"},
            ]}
        }));
        assert_eq!(
            messages(&invalid),
            [
                "spec.failurePolicy.restartStrategy: Unsupported value: \"Sometimes\": supported values: \"Recreate\", \"BlockingRecreate\", \"InPlaceRestart\"",
                "spec.failurePolicy.rules[0].name: Invalid value: \"gpu-guard\": invalid failure policy rule name 'gpu-guard', a failure policy rule name must start with an alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_'",
                "spec.failurePolicy.rules[1].action: Unsupported value: \"Explode\": supported values: \"FailJobSet\", \"RestartJobSet\", \"RestartJobSetAndIgnoreMaxRestarts\", \"RestartJob\", \"RestartJobAndIgnoreMaxRestarts\"",
                "spec.failurePolicy.rules[1].targetReplicatedJobs[0]: Invalid value: \"leader\": invalid replicatedJob name 'leader' in failure policy does not appear in .spec.ReplicatedJobs",
                "spec.failurePolicy.rules[1].onJobFailureReasons[0]: Invalid value: \"OOMKilled\": invalid job failure reason 'OOMKilled' in failure policy is not a recognized job failure reason",
                "spec.failurePolicy.rules[4].name: Invalid value: \"failurePolicyRule4\": rule names are not unique, rules with indices [3, 4] all have the same name 'failurePolicyRule4'",
                "spec.failurePolicy.rules[2].name: Invalid value: \"twice\": rule names are not unique, rules with indices [1, 2] all have the same name 'twice'",
            ]
        );
    }

    #[test]
    fn rule_names_follow_jobsets_pattern_and_length() {
        for good in ["a", "R", "gpuGuardDeviceRestart", "a_b,c:d", "ends_", "x1"] {
            assert_eq!(rule_name_problem(good), None, "{good}");
        }
        for bad in [
            "", "1abc", "has-dash", "has.dot", "ends:", "ends,", "_start",
        ] {
            assert!(rule_name_problem(bad).is_some(), "{bad}");
        }
        assert!(rule_name_problem(&"a".repeat(128)).is_none());
        assert!(rule_name_problem(&"a".repeat(129)).is_some());
    }

    #[test]
    fn in_place_restart_needs_its_job_settings_and_the_job_rules_apply_inside() {
        let mut job = never_job("workers");
        job["template"]["spec"]["podFailurePolicy"] = json!({"rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]});
        job["template"]["spec"]["template"]["spec"]["restartPolicy"] = json!("OnFailure");
        let in_place = spec(json!({
            "replicatedJobs": [job],
            "failurePolicy": {"restartStrategy": "InPlaceRestart"}
        }));
        assert_eq!(
            messages(&in_place),
            [
                "spec.replicatedJobs[0].template.spec.template.spec.restartPolicy: Invalid value: \"OnFailure\": only \"Never\" is supported when podFailurePolicy is specified",
                "spec.replicatedJobs[0].template.spec.backoffLimit: Invalid value: replicatedJob workers: must be set to 2147483647 (MaxInt32) when in-place restart is enabled",
                "spec.replicatedJobs[0].template.spec.podReplacementPolicy: Invalid value: replicatedJob workers: must be set to Failed when in-place restart is enabled",
                "spec.replicatedJobs[0].template.spec.completions: Invalid value: replicatedJob workers: completions and parallelism must be set and equal to each other when in-place restart is enabled",
            ]
        );
    }

    #[test]
    fn restart_job_actions_allow_at_most_1024_replicas() {
        let mut big = never_job("workers");
        big["replicas"] = json!(1025);
        let too_many = spec(json!({
            "replicatedJobs": [big],
            "failurePolicy": {"rules": [{"name": "one", "action": "RestartJob"}]}
        }));
        let found = messages(&too_many);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("spec.replicatedJobs[0].replicas: Invalid value: JobSet cannot have a failure policy rule with RestartJob"), "{found:?}");
    }

    #[test]
    fn an_empty_restart_policy_is_checked_as_jobset_defaults_it() {
        let mut job = never_job("workers");
        job["template"]["spec"]["template"]["spec"]
            .as_object_mut()
            .unwrap()
            .remove("restartPolicy");
        assert_eq!(
            messages(&spec(json!({"replicatedJobs": [job.clone()]}))),
            Vec::<String>::new()
        );
        job["template"]["spec"]["podFailurePolicy"] = json!({"rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]});
        assert_eq!(
            messages(&spec(json!({"replicatedJobs": [job]}))),
            [
                "spec.replicatedJobs[0].template.spec.template.spec.restartPolicy: Invalid value: \"OnFailure\": only \"Never\" is supported when podFailurePolicy is specified"
            ]
        );
    }
}
