//! The API server's validation of a Job's podFailurePolicy and the fields it constrains, as a
//! plain function. It mirrors `pkg/apis/batch/validation` of Kubernetes v1.36 for the fields
//! gpu-guard writes, with the same field paths, messages and order, so that gpu-guard can prove
//! it never emits a Job the API server would reject (and tests can compare with what a real
//! kube-apiserver said, line for line). The pod template's container restart rules, which
//! gpu-guard may also write, are checked too ([`super::container`], after the Job's own rules).

use std::collections::HashSet;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};

use super::container::check_restart_rules;
use super::names::qualified_name_errors;
use crate::field::{FieldPath, Violation, quote};

/// At most this many rules in a podFailurePolicy.
pub const MAX_RULES: usize = 20;
/// At most this many values in one `onExitCodes`.
pub const MAX_EXIT_CODE_VALUES: usize = 255;
/// At most this many patterns in one `onPodConditions`.
pub const MAX_POD_CONDITIONS: usize = 20;

const ACTIONS: [&str; 4] = ["Count", "FailIndex", "FailJob", "Ignore"];
const OPERATORS: [&str; 2] = ["In", "NotIn"];
const STATUSES: [&str; 3] = ["False", "True", "Unknown"];

/// Every violation of the API server's rules for the podFailurePolicy-related fields of a Job,
/// in the order the API server reports them. Empty when the API server would accept them.
pub fn check_job(job: &Job) -> Vec<Violation> {
    match &job.spec {
        Some(spec) => check_job_spec(spec, &FieldPath::new(["spec"])),
        None => vec![Violation::required(
            FieldPath::new(["spec"]),
            "a Job needs a spec",
        )],
    }
}

/// [`check_job`] for a Job spec at `path` (`spec`, or `spec.jobTemplate.spec` in a CronJob).
pub fn check_job_spec(spec: &JobSpec, path: &FieldPath) -> Vec<Violation> {
    let mut violations = Vec::new();
    if let Some(policy) = &spec.pod_failure_policy {
        check_pod_failure_policy(
            spec,
            policy,
            &path.child("podFailurePolicy"),
            &mut violations,
        );
    }

    let replacement_path = path.child("podReplacementPolicy");
    match spec.pod_replacement_policy.as_deref() {
        None => {}
        Some("Failed") => {}
        Some("TerminatingOrFailed") if spec.pod_failure_policy.is_none() => {}
        Some(other) if spec.pod_failure_policy.is_some() => violations.push(
            Violation::not_supported(replacement_path, other, &["Failed"]),
        ),
        Some(other) => violations.push(Violation::not_supported(
            replacement_path,
            other,
            &["Failed", "TerminatingOrFailed"],
        )),
    }

    let restart_path = path.child("template").child("spec").child("restartPolicy");
    let restart_policy = spec
        .template
        .spec
        .as_ref()
        .and_then(|pod| pod.restart_policy.as_deref());
    match restart_policy {
        Some("Never") => {}
        Some("OnFailure") if spec.pod_failure_policy.is_none() => {}
        Some("OnFailure") => violations.push(Violation::invalid(
            restart_path,
            quote("OnFailure"),
            "only \"Never\" is supported when podFailurePolicy is specified",
        )),
        _ => violations.push(Violation::required(
            restart_path,
            "valid values: \"OnFailure\", \"Never\"",
        )),
    }
    if let Some(pod) = &spec.template.spec {
        violations.extend(check_restart_rules(
            pod,
            &path.child("template").child("spec"),
        ));
    }
    violations
}

/// Whether an `onExitCodes` requirement matches a container that exited with `code`, as the
/// Job controller decides (Kubernetes v1.36 `pkg/controller/job/pod_failure_policy.go`,
/// `isOnExitCodesOperatorMatching`): `In` matches a listed code, `NotIn` every code it does not
/// list, and exit code 0 never matches (the controller skips containers that succeeded).
/// `containerName` is the caller's to check.
pub fn exit_codes_match(requirement: &PodFailurePolicyOnExitCodesRequirement, code: i32) -> bool {
    if code == 0 {
        return false;
    }
    let listed = requirement.values.contains(&code);
    match requirement.operator.as_str() {
        "In" => listed,
        "NotIn" => !listed,
        _ => false,
    }
}

fn check_pod_failure_policy(
    spec: &JobSpec,
    policy: &PodFailurePolicy,
    path: &FieldPath,
    violations: &mut Vec<Violation>,
) {
    let rules_path = path.child("rules");
    if policy.rules.len() > MAX_RULES {
        violations.push(Violation::too_many(
            rules_path.clone(),
            policy.rules.len(),
            MAX_RULES,
        ));
    }
    let container_names: HashSet<&str> = spec
        .template
        .spec
        .iter()
        .flat_map(|pod| {
            pod.containers
                .iter()
                .chain(pod.init_containers.iter().flatten())
        })
        .map(|container| container.name.as_str())
        .collect();
    for (index, rule) in policy.rules.iter().enumerate() {
        check_rule(
            spec,
            rule,
            &rules_path.index(index),
            &container_names,
            violations,
        );
    }
}

fn check_rule(
    spec: &JobSpec,
    rule: &PodFailurePolicyRule,
    path: &FieldPath,
    container_names: &HashSet<&str>,
    violations: &mut Vec<Violation>,
) {
    let action_path = path.child("action");
    if !ACTIONS.contains(&rule.action.as_str()) {
        violations.push(Violation::not_supported(
            action_path,
            &rule.action,
            &ACTIONS,
        ));
    } else if rule.action == "FailIndex" && spec.backoff_limit_per_index.is_none() {
        violations.push(Violation::invalid(
            action_path,
            quote("FailIndex"),
            "requires the backoffLimitPerIndex to be set",
        ));
    }

    let conditions = rule.on_pod_conditions.as_deref().unwrap_or_default();
    match (&rule.on_exit_codes, conditions.is_empty()) {
        (Some(_), false) => violations.push(Violation::invalid_without_value(
            path.clone(),
            "specifying both OnExitCodes and OnPodConditions is not supported",
        )),
        (None, true) => violations.push(Violation::invalid_without_value(
            path.clone(),
            "specifying one of OnExitCodes and OnPodConditions is required",
        )),
        _ => {}
    }
    if let Some(exit_codes) = &rule.on_exit_codes {
        check_exit_codes(
            exit_codes,
            &path.child("onExitCodes"),
            container_names,
            violations,
        );
    }
    let conditions_path = path.child("onPodConditions");
    if conditions.len() > MAX_POD_CONDITIONS {
        violations.push(Violation::too_many(
            conditions_path.clone(),
            conditions.len(),
            MAX_POD_CONDITIONS,
        ));
    }
    for (index, pattern) in conditions.iter().enumerate() {
        check_condition_pattern(pattern, &conditions_path.index(index), violations);
    }
}

fn check_exit_codes(
    requirement: &PodFailurePolicyOnExitCodesRequirement,
    path: &FieldPath,
    container_names: &HashSet<&str>,
    violations: &mut Vec<Violation>,
) {
    let operator = requirement.operator.as_str();
    if !OPERATORS.contains(&operator) {
        violations.push(Violation::not_supported(
            path.child("operator"),
            operator,
            &OPERATORS,
        ));
    }
    if let Some(name) = &requirement.container_name
        && !container_names.contains(name.as_str())
    {
        violations.push(Violation::invalid(
            path.child("containerName"),
            quote(name),
            "must be one of the container or initContainer names in the pod template",
        ));
    }
    let values_path = path.child("values");
    let values = &requirement.values;
    if values.is_empty() {
        violations.push(Violation::invalid(
            values_path,
            "[]",
            "at least one value is required",
        ));
        return;
    }
    if values.len() > MAX_EXIT_CODE_VALUES {
        violations.push(Violation::too_many(
            values_path,
            values.len(),
            MAX_EXIT_CODE_VALUES,
        ));
        return;
    }
    let mut seen = HashSet::with_capacity(values.len());
    let mut ordered = true;
    for (index, &value) in values.iter().enumerate() {
        if operator == "In" && value == 0 {
            violations.push(Violation::invalid(
                values_path.index(index),
                value.to_string(),
                "must not be 0 for the In operator",
            ));
        }
        if !seen.insert(value) {
            violations.push(Violation::duplicate(
                values_path.index(index),
                value.to_string(),
            ));
        }
        if index > 0 && values[index - 1] > value {
            ordered = false;
        }
    }
    if !ordered {
        let rendered: Vec<String> = values.iter().map(i32::to_string).collect();
        violations.push(Violation::invalid(
            values_path,
            format!("[{}]", rendered.join(",")),
            "must be ordered",
        ));
    }
}

fn check_condition_pattern(
    pattern: &PodFailurePolicyOnPodConditionsPattern,
    path: &FieldPath,
    violations: &mut Vec<Violation>,
) {
    // The API server defaults a missing status to True before validating.
    let status = pattern.status.as_deref().unwrap_or("True");
    if !STATUSES.contains(&status) {
        violations.push(Violation::not_supported(
            path.child("status"),
            status,
            &STATUSES,
        ));
    }
    for reason in qualified_name_errors(&pattern.type_) {
        violations.push(Violation::invalid(
            path.child("type"),
            quote(&pattern.type_),
            reason,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

    fn job(restart: &str, rules: Vec<PodFailurePolicyRule>) -> Job {
        Job {
            spec: Some(JobSpec {
                pod_failure_policy: Some(PodFailurePolicy { rules }),
                template: PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        restart_policy: Some(restart.to_owned()),
                        containers: vec![Container {
                            name: "main".to_owned(),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..JobSpec::default()
            }),
            ..Job::default()
        }
    }

    fn exit_rule(action: &str, operator: &str, values: Vec<i32>) -> PodFailurePolicyRule {
        PodFailurePolicyRule {
            action: action.to_owned(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: None,
                operator: operator.to_owned(),
                values,
            }),
            on_pod_conditions: None,
        }
    }

    fn messages(job: &Job) -> Vec<String> {
        check_job(job).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_valid_policy_has_no_violations() {
        let valid = job(
            "Never",
            vec![
                exit_rule("Ignore", "In", vec![74, 75, 138]),
                exit_rule("Count", "NotIn", vec![0, 1]),
            ],
        );
        assert!(messages(&valid).is_empty());
    }

    #[test]
    fn table_of_single_violations() {
        let cases: Vec<(PodFailurePolicyRule, &str)> = vec![
            (
                exit_rule("Ignore", "In", vec![]),
                "spec.podFailurePolicy.rules[0].onExitCodes.values: Invalid value: []: at least one value is required",
            ),
            (
                exit_rule("Ignore", "Equals", vec![1]),
                r#"spec.podFailurePolicy.rules[0].onExitCodes.operator: Unsupported value: "Equals": supported values: "In", "NotIn""#,
            ),
            (
                exit_rule("Retry", "In", vec![1]),
                r#"spec.podFailurePolicy.rules[0].action: Unsupported value: "Retry": supported values: "Count", "FailIndex", "FailJob", "Ignore""#,
            ),
            (
                exit_rule("Ignore", "In", (1..=256).collect()),
                "spec.podFailurePolicy.rules[0].onExitCodes.values: Too many: 256: must have at most 255 items",
            ),
            (
                PodFailurePolicyRule {
                    action: "Ignore".to_owned(),
                    on_exit_codes: None,
                    on_pod_conditions: Some(vec![]),
                },
                "spec.podFailurePolicy.rules[0]: Invalid value: specifying one of OnExitCodes and OnPodConditions is required",
            ),
            (
                PodFailurePolicyRule {
                    action: "Ignore".to_owned(),
                    on_exit_codes: None,
                    on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                        type_: "DisruptionTarget".to_owned(),
                        status: Some("Maybe".to_owned()),
                    }]),
                },
                r#"spec.podFailurePolicy.rules[0].onPodConditions[0].status: Unsupported value: "Maybe": supported values: "False", "True", "Unknown""#,
            ),
        ];
        for (rule, expected) in cases {
            assert_eq!(
                messages(&job("Never", vec![rule])),
                vec![expected.to_owned()]
            );
        }
    }

    #[test]
    fn not_in_may_contain_zero_but_in_may_not() {
        assert!(messages(&job("Never", vec![exit_rule("Count", "NotIn", vec![0])])).is_empty());
        assert_eq!(
            messages(&job("Never", vec![exit_rule("Count", "In", vec![0])])),
            vec![
                "spec.podFailurePolicy.rules[0].onExitCodes.values[0]: Invalid value: 0: must not be 0 for the In operator"
            ]
        );
    }

    #[test]
    fn a_job_without_a_policy_may_use_on_failure_but_not_always() {
        let mut plain = job("OnFailure", vec![]);
        plain.spec.as_mut().unwrap().pod_failure_policy = None;
        assert!(messages(&plain).is_empty());
        plain
            .spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .restart_policy = Some("Always".to_owned());
        assert_eq!(
            messages(&plain),
            vec![
                r#"spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never""#
            ]
        );
    }
}
