//! Table-driven tests of the engine's decisions, one behaviour per case.

use serde_json::{Value, json};

use super::*;
use crate::api_rules;
use crate::policy::{ExistingPolicy, ExitCodeRule, OnFailureRestartPolicy, RuleAction};
use crate::wellknown::{INJECT_KEY, MUTATED_ANNOTATION, SKIP_ANNOTATION};

fn job(value: Value) -> Job {
    serde_json::from_value(value).expect("test Job decodes")
}

/// A Job with one GPU container `main` and the given pod-spec and spec fields merged in.
fn gpu_job(pod_extra: Value, spec_extra: Value) -> Job {
    let mut pod = json!({
        "restartPolicy": "Never",
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    });
    merge(&mut pod, pod_extra);
    let mut spec = json!({"template": {"spec": pod}});
    merge(&mut spec, spec_extra);
    job(json!({"metadata": {"name": "train"}, "spec": spec}))
}

fn merge(target: &mut Value, extra: Value) {
    if let (Value::Object(target), Value::Object(extra)) = (target, extra) {
        target.extend(extra);
    }
}

fn rules(outcome: &Outcome) -> Vec<Value> {
    outcome
        .job
        .spec
        .as_ref()
        .and_then(|spec| spec.pod_failure_policy.as_ref())
        .map(|policy| {
            policy
                .rules
                .iter()
                .map(|rule| serde_json::to_value(rule).unwrap())
                .collect()
        })
        .unwrap_or_default()
}

fn condition_rule(condition: &str, action: &str) -> Value {
    json!({"action": action, "onPodConditions": [{"type": condition, "status": "True"}]})
}

fn exit_rule(container: &str, action: &str, values: &[i32]) -> Value {
    json!({"action": action, "onExitCodes": {"containerName": container, "operator": "In", "values": values}})
}

fn pod(outcome: &Outcome) -> &k8s_openapi::api::core::v1::PodSpec {
    outcome
        .job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn default_rules_for(containers: &[&str]) -> Vec<Value> {
    let mut expected = vec![
        condition_rule("DisruptionTarget", "Ignore"),
        condition_rule("gpu-guard.io/DeviceRetriesExhausted", "Count"),
        condition_rule("gpu-guard.io/DeviceFailure", "Ignore"),
    ];
    expected.extend(
        containers
            .iter()
            .map(|c| exit_rule(c, "Ignore", &[74, 75, 138])),
    );
    expected
}

#[test]
fn a_plain_gpu_job_gets_the_full_treatment() {
    let outcome = mutate_job(&gpu_job(json!({}), json!({})), &Policy::default());
    assert_eq!(rules(&outcome), default_rules_for(&["main"]));
    let spec = outcome.job.spec.as_ref().unwrap();
    assert_eq!(spec.pod_replacement_policy.as_deref(), Some("Failed"));
    assert_eq!(pod(&outcome).termination_grace_period_seconds, Some(60));
    let tolerations = serde_json::to_value(&pod(&outcome).tolerations).unwrap();
    assert_eq!(
        tolerations,
        json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 900},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 900}
        ])
    );
    let annotation = &outcome.job.metadata.annotations.as_ref().unwrap()[MUTATED_ANNOTATION];
    assert!(
        annotation.starts_with("podFailurePolicy (4 rules)"),
        "{annotation}"
    );
    assert!(api_rules::job::check_job(&outcome.job).is_empty());
}

#[test]
fn which_jobs_are_candidates() {
    let cpu_only = job(
        json!({"spec": {"template": {"spec": {"restartPolicy": "Never",
        "containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}}}]}}}}),
    );
    let cases = [
        (
            "no device",
            cpu_only.clone(),
            Some(SkipReason::NotDeviceWorkload),
        ),
        (
            "skip annotation",
            {
                let mut j = gpu_job(json!({}), json!({}));
                j.metadata.annotations =
                    Some([(SKIP_ANNOTATION.to_owned(), "true".to_owned())].into());
                j
            },
            Some(SkipReason::SkipAnnotation),
        ),
        (
            "skip annotation not true",
            {
                let mut j = gpu_job(json!({}), json!({}));
                j.metadata.annotations =
                    Some([(SKIP_ANNOTATION.to_owned(), "yes".to_owned())].into());
                j
            },
            None,
        ),
        (
            "inject label",
            {
                let mut j = cpu_only.clone();
                j.metadata.labels = Some([(INJECT_KEY.to_owned(), "true".to_owned())].into());
                j
            },
            None,
        ),
        (
            "inject annotation",
            {
                let mut j = cpu_only;
                j.metadata.annotations = Some([(INJECT_KEY.to_owned(), "true".to_owned())].into());
                j
            },
            None,
        ),
        ("no spec", Job::default(), Some(SkipReason::NoPodSpec)),
    ];
    for (name, input, skipped) in cases {
        let outcome = mutate_job(&input, &Policy::default());
        assert_eq!(outcome.skipped, skipped, "{name}");
        assert_eq!(outcome.is_changed(), skipped.is_none(), "{name}");
        if skipped.is_some() {
            assert_eq!(
                outcome.job, input,
                "{name}: a skipped Job is returned as it came"
            );
        }
    }
}

#[test]
fn native_sidecars_are_never_named_by_exit_code_rules() {
    let input = gpu_job(
        json!({
            "containers": [
                {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"name": "metrics"}
            ],
            "initContainers": [
                {"name": "fetch"},
                {"name": "log-shipper", "restartPolicy": "Always"},
                {"name": "gpu-exporter", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        }),
        json!({}),
    );
    let outcome = mutate_job(&input, &Policy::default());
    assert_eq!(rules(&outcome), default_rules_for(&["trainer"]));
    assert!(
        outcome.warnings.iter().any(|w| w.contains("gpu-exporter")),
        "{:?}",
        outcome.warnings
    );
}

#[test]
fn existing_rules_are_kept_in_order_after_the_device_rules_without_duplicates() {
    let input = gpu_job(
        json!({}),
        json!({"podFailurePolicy": {"rules": [
            exit_rule("main", "FailJob", &[42]),
            condition_rule("DisruptionTarget", "Ignore"),
            condition_rule("gpu-guard.io/DeviceRetriesExhausted", "Count"),
        ]}}),
    );
    let outcome = mutate_job(&input, &Policy::default());
    assert_eq!(
        rules(&outcome),
        vec![
            condition_rule("gpu-guard.io/DeviceFailure", "Ignore"),
            exit_rule("main", "Ignore", &[74, 75, 138]),
            exit_rule("main", "FailJob", &[42]),
            condition_rule("DisruptionTarget", "Ignore"),
            condition_rule("gpu-guard.io/DeviceRetriesExhausted", "Count"),
        ]
    );
    assert!(matches!(&outcome.changes[0], Change::PrependRules(added) if added.len() == 2));
    assert!(
        outcome.warnings.iter().all(|w| !w.contains("rule")),
        "same action: no warning"
    );
}

#[test]
fn the_jobs_own_rule_wins_for_the_codes_and_conditions_it_handles() {
    let input = gpu_job(
        json!({}),
        json!({"podFailurePolicy": {"rules": [
            json!({"action": "FailJob", "onExitCodes": {"operator": "In", "values": [74]}}),
            condition_rule("DisruptionTarget", "Count"),
        ]}}),
    );
    let outcome = mutate_job(&input, &Policy::default());
    assert_eq!(
        rules(&outcome)[..3],
        [
            condition_rule("gpu-guard.io/DeviceRetriesExhausted", "Count"),
            condition_rule("gpu-guard.io/DeviceFailure", "Ignore"),
            exit_rule("main", "Ignore", &[75, 138]),
        ]
    );
    assert_eq!(rules(&outcome).len(), 5);
    assert_eq!(
        outcome
            .warnings
            .iter()
            .filter(|w| w.contains("the Job's own"))
            .count(),
        2
    );
}

#[test]
fn a_not_in_rule_of_the_job_decides_every_device_code_it_does_not_list() {
    // "Fail on any error" (the shape of the Kubernetes docs' podFailurePolicy examples): the
    // Job controller takes the first matching rule, and `NotIn [0]` matches 74, 75 and 138.
    // An Ignore rule put in front of it would retry a deterministic exit 74 without end.
    let fail_on_any_error = json!({"action": "FailJob", "onExitCodes":
        {"containerName": "main", "operator": "NotIn", "values": [0]}});
    let input = gpu_job(
        json!({}),
        json!({"podFailurePolicy": {"rules": [fail_on_any_error.clone()]}}),
    );
    let outcome = mutate_job(&input, &Policy::default());
    assert_eq!(
        rules(&outcome),
        vec![
            condition_rule("DisruptionTarget", "Ignore"),
            condition_rule("gpu-guard.io/DeviceRetriesExhausted", "Count"),
            condition_rule("gpu-guard.io/DeviceFailure", "Ignore"),
            fail_on_any_error,
        ]
    );
    assert!(
        outcome.warnings.iter().any(|w| w.contains(
            "exit code(s) [74, 75, 138] of main are left to the Job's own FailJob rule (NotIn \
             [0]): they are not retried as device failures"
        )),
        "{:?}",
        outcome.warnings
    );
    assert!(api_rules::job::check_job(&outcome.job).is_empty());
    let again = mutate_job(&outcome.job, &Policy::default());
    assert!(!again.is_changed(), "{:?}", again.changes);

    // A NotIn rule that lists a device code leaves that one code to gpu-guard.
    let but_75 =
        json!({"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [75, 143]}});
    let input = gpu_job(json!({}), json!({"podFailurePolicy": {"rules": [but_75]}}));
    let outcome = mutate_job(&input, &Policy::default());
    assert_eq!(rules(&outcome)[3], exit_rule("main", "Ignore", &[75]));

    // A NotIn rule for another container decides nothing for `main`.
    let other = json!({"action": "FailJob", "onExitCodes":
        {"containerName": "logger", "operator": "NotIn", "values": [0]}});
    let input = gpu_job(
        json!({"containers": [
            {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "logger"}]}),
        json!({"podFailurePolicy": {"rules": [other]}}),
    );
    let outcome = mutate_job(&input, &Policy::default());
    assert_eq!(
        rules(&outcome)[3],
        exit_rule("main", "Ignore", &[74, 75, 138])
    );
}

#[test]
fn keep_and_replace_modes() {
    let own = json!({"podFailurePolicy": {"rules": [exit_rule("main", "FailJob", &[42])]}});
    let mut policy = Policy::default();
    policy.mutation.pod_failure_policy.existing_policy = ExistingPolicy::Keep;
    let kept = mutate_job(&gpu_job(json!({}), own.clone()), &policy);
    assert_eq!(rules(&kept), vec![exit_rule("main", "FailJob", &[42])]);

    policy.mutation.pod_failure_policy.existing_policy = ExistingPolicy::Replace;
    let replaced = mutate_job(&gpu_job(json!({}), own), &policy);
    assert_eq!(rules(&replaced), default_rules_for(&["main"]));
    assert!(matches!(
        replaced.changes[0],
        Change::SetPodFailurePolicy(_)
    ));
}

#[test]
fn restart_policy_on_failure_is_skipped_or_converted() {
    let input = gpu_job(json!({"restartPolicy": "OnFailure"}), json!({}));
    let skipped = mutate_job(&input, &Policy::default());
    assert!(rules(&skipped).is_empty());
    assert_eq!(pod(&skipped).restart_policy.as_deref(), Some("OnFailure"));
    assert!(skipped.warnings.iter().any(|w| w.contains("OnFailure")));
    assert!(api_rules::job::check_job(&skipped.job).is_empty());

    let mut policy = Policy::default();
    policy.mutation.pod_failure_policy.on_failure_restart_policy =
        OnFailureRestartPolicy::ConvertToNever;
    let converted = mutate_job(&input, &policy);
    assert_eq!(pod(&converted).restart_policy.as_deref(), Some("Never"));
    assert_eq!(rules(&converted), default_rules_for(&["main"]));
    assert!(
        converted
            .warnings
            .iter()
            .any(|w| w.contains("changed from OnFailure"))
    );
}

#[test]
fn fail_job_codes_become_fail_index_only_on_per_index_jobs() {
    let mut policy = Policy::default();
    policy
        .mutation
        .pod_failure_policy
        .exit_code_rules
        .push(ExitCodeRule {
            action: RuleAction::FailJob,
            codes: vec![127, 126],
        });
    let plain = mutate_job(&gpu_job(json!({}), json!({})), &policy);
    assert_eq!(rules(&plain)[4], exit_rule("main", "FailJob", &[126, 127]));

    let indexed = gpu_job(
        json!({}),
        json!({"completionMode": "Indexed", "completions": 4, "backoffLimitPerIndex": 1}),
    );
    let per_index = mutate_job(&indexed, &policy);
    assert_eq!(
        rules(&per_index)[4],
        exit_rule("main", "FailIndex", &[126, 127])
    );
    assert!(api_rules::job::check_job(&per_index.job).is_empty());

    policy
        .mutation
        .pod_failure_policy
        .fail_index_for_per_index_jobs = false;
    let opted_out = mutate_job(&indexed, &policy);
    assert_eq!(
        rules(&opted_out)[4],
        exit_rule("main", "FailJob", &[126, 127])
    );
}

fn many_gpu_containers(count: usize) -> Value {
    let containers: Vec<Value> = (0..count)
        .map(|i| json!({"name": format!("c{i}"), "resources": {"limits": {"nvidia.com/gpu": "1"}}}))
        .collect();
    json!({"containers": containers})
}

fn own_rules(count: i32) -> Value {
    let rules: Vec<Value> = (1..=count)
        .map(|code| json!({"action": "Count", "onExitCodes": {"operator": "In", "values": [code]}}))
        .collect();
    json!({"podFailurePolicy": {"rules": rules}})
}

#[test]
fn too_many_rules_fall_back_to_shared_rules_then_to_nothing() {
    // 16 own rules + 3 condition rules + 3 per-container rules = 22: fall back to one rule.
    let crowded = gpu_job(many_gpu_containers(3), own_rules(16));
    let outcome = mutate_job(&crowded, &Policy::default());
    let all = rules(&outcome);
    assert_eq!(all.len(), 20);
    assert_eq!(
        all[3],
        json!({"action": "Ignore", "onExitCodes": {"operator": "In", "values": [74, 75, 138]}})
    );
    assert!(
        outcome
            .warnings
            .iter()
            .any(|w| w.contains("match every container"))
    );

    // 19 own rules: even the shared rules do not fit.
    let full = gpu_job(json!({}), own_rules(19));
    let outcome = mutate_job(&full, &Policy::default());
    assert_eq!(rules(&outcome).len(), 19);
    assert!(
        outcome
            .warnings
            .iter()
            .any(|w| w.contains("exceed the limit"))
    );
    assert!(api_rules::job::check_job(&outcome.job).is_empty());

    // 17 per-container rules alone are fine (with the 3 condition rules).
    let wide = mutate_job(
        &gpu_job(many_gpu_containers(17), json!({})),
        &Policy::default(),
    );
    assert_eq!(rules(&wide).len(), 20);
}

#[test]
fn grace_period_is_kept_in_the_window() {
    let cases = [
        (None, Some(60), true),
        (Some(10), Some(60), true),
        (Some(5000), Some(900), true),
        (Some(120), Some(120), false),
    ];
    for (input, expected, warned) in cases {
        let outcome = mutate_job(
            &gpu_job(json!({"terminationGracePeriodSeconds": input}), json!({})),
            &Policy::default(),
        );
        let result = pod(&outcome).termination_grace_period_seconds;
        assert_eq!(result.or(input), expected, "input {input:?}");
        let warning = outcome
            .warnings
            .iter()
            .any(|w| w.contains("terminationGracePeriodSeconds"));
        assert_eq!(warning, warned, "input {input:?}");
    }
}

#[test]
fn readiness_tolerations_are_raised_never_lowered_and_never_limited() {
    let not_ready = |seconds: Option<i64>| json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds});
    let cases: [(&str, Value, Value); 4] = [
        (
            "300 raised to 900, unreachable added",
            json!([not_ready(Some(300))]),
            json!([not_ready(Some(900)), {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 900}]),
        ),
        (
            "1200 not lowered",
            json!([not_ready(Some(1200)), {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 900}]),
            json!([not_ready(Some(1200)), {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 900}]),
        ),
        (
            "a toleration without seconds is never touched",
            json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}, {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]),
            json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}, {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]),
        ),
        (
            "a wildcard toleration covers both",
            json!([{"operator": "Exists"}]),
            json!([{"operator": "Exists"}]),
        ),
    ];
    for (name, input, expected) in cases {
        let outcome = mutate_job(
            &gpu_job(json!({"tolerations": input}), json!({})),
            &Policy::default(),
        );
        let tolerations = serde_json::to_value(&pod(&outcome).tolerations).unwrap();
        // `tolerationSeconds: null` in the input is the same as absent.
        let expected: Value =
            serde_json::from_value::<Vec<k8s_openapi::api::core::v1::Toleration>>(expected)
                .map(|t| serde_json::to_value(t).unwrap())
                .unwrap();
        assert_eq!(tolerations, expected, "{name}");
    }
}

#[test]
fn pod_replacement_policy() {
    let mut policy = Policy::default();
    policy.mutation.pod_failure_policy.pod_replacement_policy =
        crate::policy::PodReplacementPolicy::Unchanged;
    // Required by the injected podFailurePolicy: the API server's default was TerminatingOrFailed.
    let defaulted = gpu_job(
        json!({}),
        json!({"podReplacementPolicy": "TerminatingOrFailed"}),
    );
    let outcome = mutate_job(&defaulted, &policy);
    assert_eq!(
        outcome
            .job
            .spec
            .as_ref()
            .unwrap()
            .pod_replacement_policy
            .as_deref(),
        Some("Failed")
    );
    // Not set: the API server defaults it to Failed when a podFailurePolicy is present.
    let unset = mutate_job(&gpu_job(json!({}), json!({})), &policy);
    assert_eq!(
        unset.job.spec.as_ref().unwrap().pod_replacement_policy,
        None
    );
    assert!(api_rules::job::check_job(&unset.job).is_empty());
}

#[test]
fn a_result_the_api_server_would_reject_is_never_returned() {
    // The Job's own rule is broken (values not ordered): merging would still be rejected.
    let broken = gpu_job(
        json!({}),
        json!({"podFailurePolicy": {"rules": [exit_rule("main", "FailJob", &[42, 2])]}}),
    );
    let outcome = mutate_job(&broken, &Policy::default());
    assert!(!outcome.is_changed());
    assert_eq!(outcome.job, broken);
    let last = outcome.warnings.last().unwrap();
    assert!(
        last.starts_with(
            "Job left unchanged, the API server would reject the result: spec.podFailurePolicy"
        ) && last.contains("must be ordered"),
        "{last}"
    );
}

#[test]
fn the_object_path_leaves_a_job_it_would_break_as_it_came() {
    // The raw object's path hands the decoded Job to the engine without a copy; a result the
    // API server would reject still comes back as the input, with the same warnings.
    let broken = gpu_job(
        json!({}),
        json!({"podFailurePolicy": {"rules": [exit_rule("main", "FailJob", &[42, 2])]}}),
    );
    let mut raw = serde_json::to_value(&broken).unwrap();
    raw["apiVersion"] = json!("batch/v1");
    raw["kind"] = json!("Job");
    let mutation = object::mutate_object(&raw, &Policy::default(), &crate::devices::NoDraFacts)
        .expect("a Job")
        .unwrap();
    assert!(mutation.patch.is_empty());
    let outcome = mutation.outcome.job().expect("a Job");
    assert_eq!(outcome.job, broken);
    assert!(!outcome.is_changed());
    assert_eq!(
        outcome.warnings,
        mutate_job(&broken, &Policy::default()).warnings
    );
    assert!(
        outcome
            .warnings
            .last()
            .unwrap()
            .starts_with("Job left unchanged, the API server would reject the result"),
        "{:?}",
        outcome.warnings
    );
}

#[test]
fn a_job_left_unchanged_is_told_of_no_change() {
    // No restartPolicy: the API server refuses the Job as it is. The engine drops its grace
    // period change with the rest, and no warning says it was made.
    let mut unset = gpu_job(json!({}), json!({}));
    let pod = unset.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    pod.restart_policy = None;
    let outcome = mutate_job(&unset, &Policy::default());
    assert!(!outcome.is_changed());
    assert_eq!(outcome.job, unset);
    assert_eq!(
        outcome.warnings,
        vec![
            "restartPolicy is not set, and a Job needs Never (or OnFailure): no podFailurePolicy \
             added",
            "Job left unchanged: the API server will reject it as it is: \
             spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \
             \"Never\"",
        ]
    );
    assert!(outcome.change_notes.is_empty());

    // When the changes stand, the note of each is given, and known as one.
    let outcome = mutate_job(&gpu_job(json!({}), json!({})), &Policy::default());
    let raised = "terminationGracePeriodSeconds raised from 30 to 60 to leave time to checkpoint";
    assert_eq!(outcome.warnings, vec![raised]);
    assert_eq!(outcome.change_notes, vec![raised]);
    assert_eq!(outcome.input_warnings().count(), 0);
}

#[test]
fn active_deadline_is_set_only_when_asked_and_absent() {
    let mut policy = Policy::default();
    assert_eq!(
        mutate_job(&gpu_job(json!({}), json!({})), &policy)
            .job
            .spec
            .unwrap()
            .active_deadline_seconds,
        None
    );
    policy.mutation.active_deadline_seconds = Some(86_400);
    assert_eq!(
        mutate_job(&gpu_job(json!({}), json!({})), &policy)
            .job
            .spec
            .unwrap()
            .active_deadline_seconds,
        Some(86_400)
    );
    let own = gpu_job(json!({}), json!({"activeDeadlineSeconds": 60}));
    assert_eq!(
        mutate_job(&own, &policy)
            .job
            .spec
            .unwrap()
            .active_deadline_seconds,
        Some(60)
    );
}

#[test]
fn mutating_twice_changes_nothing_the_second_time() {
    let inputs = [
        gpu_job(json!({}), json!({})),
        gpu_job(many_gpu_containers(3), own_rules(16)),
        gpu_job(
            json!({}),
            json!({"podFailurePolicy": {"rules": [exit_rule("main", "FailJob", &[74])]}}),
        ),
    ];
    for input in inputs {
        let once = mutate_job(&input, &Policy::default());
        let twice = mutate_job(&once.job, &Policy::default());
        assert!(once.is_changed());
        assert_eq!(
            twice.changes,
            vec![],
            "second pass on {:?}",
            input.metadata.name
        );
        assert_eq!(twice.job, once.job);
    }
}

#[test]
fn disabled_sections_change_nothing() {
    let mut policy = Policy::default();
    policy.mutation.pod_failure_policy.enabled = false;
    policy.mutation.termination_grace_period.enabled = false;
    policy.mutation.node_readiness_tolerations.enabled = false;
    let outcome = mutate_job(&gpu_job(json!({}), json!({})), &policy);
    assert_eq!(outcome.changes, vec![]);
    assert_eq!(outcome.skipped, None);
}

// === restart rules ===

/// The default policy with in-place restart rules for 70 and 140 (the shipped profile's codes).
fn in_place_policy() -> Policy {
    let mut policy = Policy::default();
    policy.mutation.restart_rules.enabled = true;
    policy
}

fn restart_rule(action: &str, operator: &str, values: &[i32]) -> Value {
    json!({"action": action, "exitCodes": {"operator": operator, "values": values}})
}

/// Each container's `[restartPolicy, restartPolicyRules]` after the engine ran.
fn container_restart(outcome: &Outcome) -> Vec<(String, Value, Value)> {
    pod(outcome)
        .containers
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                json!(c.restart_policy),
                serde_json::to_value(&c.restart_policy_rules).unwrap(),
            )
        })
        .collect()
}

#[test]
fn restart_rules_go_into_device_containers_only_and_leave_the_failure_policy_codes_alone() {
    let policy = in_place_policy();
    let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
    let restart_70_140 = json!([restart_rule("Restart", "In", &[70, 140])]);
    let cases = [
        (
            "a device container gets restartPolicy Never and one rule; a CPU container nothing",
            json!({"containers": [
                {"name": "main", "resources": gpu},
                {"name": "metrics", "resources": {"limits": {"cpu": "1"}}},
            ]}),
            json!({}),
            vec![
                ("main", json!("Never"), restart_70_140.clone()),
                ("metrics", json!(null), json!(null)),
            ],
        ),
        (
            "the container's own rules are kept first; a code they catch is left to them",
            json!({"containers": [{"name": "main", "resources": gpu, "restartPolicy": "Never",
                "restartPolicyRules": [restart_rule("Restart", "In", &[3, 70])]}]}),
            json!({}),
            vec![(
                "main",
                json!("Never"),
                json!([
                    restart_rule("Restart", "In", &[3, 70]),
                    restart_rule("Restart", "In", &[140])
                ]),
            )],
        ),
        (
            "a code the Job's own podFailurePolicy names for the container stays with it",
            json!({}),
            json!({"podFailurePolicy": {"rules": [exit_rule("main", "FailJob", &[70])]}}),
            vec![(
                "main",
                json!("Never"),
                json!([restart_rule("Restart", "In", &[140])]),
            )],
        ),
        (
            "a container that restarts on every failure already gets nothing",
            json!({"containers": [{"name": "main", "resources": gpu, "restartPolicy": "OnFailure"}]}),
            json!({}),
            vec![("main", json!("OnFailure"), json!(null))],
        ),
        (
            "a user's NotIn rule catches every code first: nothing to add, nothing removed",
            json!({"containers": [{"name": "main", "resources": gpu, "restartPolicy": "Never",
                "restartPolicyRules": [restart_rule("Restart", "NotIn", &[0])]}]}),
            json!({}),
            vec![(
                "main",
                json!("Never"),
                json!([restart_rule("Restart", "NotIn", &[0])]),
            )],
        ),
    ];
    for (name, pod_extra, spec_extra, expected) in cases {
        let outcome = mutate_job(&gpu_job(pod_extra, spec_extra), &policy);
        let got: Vec<(String, Value, Value)> = container_restart(&outcome);
        let expected: Vec<(String, Value, Value)> = expected
            .into_iter()
            .map(|(c, p, r)| (c.to_owned(), p, r))
            .collect();
        assert_eq!(got, expected, "{name}");
        assert!(
            api_rules::job::check_job(&outcome.job).is_empty(),
            "{name}: {:?}",
            api_rules::job::check_job(&outcome.job)
        );
        let again = mutate_job(&outcome.job, &policy);
        assert_eq!(again.changes, Vec::new(), "{name}: second pass");
    }
}

#[test]
fn what_the_user_is_told_about_restart_rules() {
    let policy = in_place_policy();
    let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
    let warnings = |pod_extra: Value, spec_extra: Value| {
        mutate_job(&gpu_job(pod_extra, spec_extra), &policy).warnings
    };
    let has = |warnings: &[String], words: &str| warnings.iter().any(|w| w.contains(words));

    let not_in = warnings(
        json!({"containers": [{"name": "main", "resources": gpu, "restartPolicy": "Never",
            "restartPolicyRules": [restart_rule("Restart", "NotIn", &[0])]}]}),
        json!({}),
    );
    assert!(
        has(
            &not_in,
            "container main: its restartPolicyRules[0] (NotIn) restarts it in place on exit \
             code(s) [74, 75, 138]"
        ),
        "{not_in:?}"
    );
    let on_failure = warnings(
        json!({"containers": [{"name": "main", "resources": gpu, "restartPolicy": "OnFailure"}]}),
        json!({}),
    );
    assert!(
        has(&on_failure, "container main has restartPolicy OnFailure"),
        "{on_failure:?}"
    );
    let own_70 = warnings(
        json!({}),
        json!({"podFailurePolicy": {"rules": [exit_rule("main", "FailJob", &[70])]}}),
    );
    assert!(
        has(&own_70, "names exit code(s) [70]; they are left to it"),
        "{own_70:?}"
    );
    let full: Vec<Value> = (1..=20)
        .map(|code| restart_rule("Restart", "In", &[code + 200]))
        .collect();
    let twenty = mutate_job(
        &gpu_job(
            json!({"containers": [{"name": "main", "resources": gpu, "restartPolicy": "Never",
                "restartPolicyRules": full}]}),
            json!({}),
        ),
        &policy,
    );
    assert!(
        has(
            &twenty.warnings,
            "has 20 restart rules, the API server's limit"
        ),
        "{:?}",
        twenty.warnings
    );
    assert!(
        !twenty
            .changes
            .iter()
            .any(|c| matches!(c, Change::AddContainerRestartRule { .. }))
    );
}

#[test]
fn restart_rules_need_the_pod_restart_policy_never() {
    let policy = in_place_policy();
    let outcome = mutate_job(
        &gpu_job(json!({"restartPolicy": "OnFailure"}), json!({})),
        &policy,
    );
    assert_eq!(
        container_restart(&outcome),
        vec![("main".to_owned(), json!(null), json!(null))]
    );
    // Converted to Never by the failure-policy step: the rules follow.
    let mut convert = in_place_policy();
    convert
        .mutation
        .pod_failure_policy
        .on_failure_restart_policy = OnFailureRestartPolicy::ConvertToNever;
    let outcome = mutate_job(
        &gpu_job(json!({"restartPolicy": "OnFailure"}), json!({})),
        &convert,
    );
    assert_eq!(
        container_restart(&outcome)[0].2,
        json!([restart_rule("Restart", "In", &[70, 140])])
    );
}

#[test]
fn restart_all_containers_is_written_when_chosen_and_off_by_default() {
    let outcome = mutate_job(&gpu_job(json!({}), json!({})), &Policy::default());
    assert_eq!(
        container_restart(&outcome),
        vec![("main".to_owned(), json!(null), json!(null))],
        "the default policy adds no restart rules"
    );
    let mut policy = in_place_policy();
    policy.mutation.restart_rules.action = crate::policy::RestartAction::RestartAllContainers;
    let outcome = mutate_job(&gpu_job(json!({}), json!({})), &policy);
    assert_eq!(
        container_restart(&outcome)[0].2,
        json!([restart_rule("RestartAllContainers", "In", &[70, 140])])
    );
    let annotation = &outcome.job.metadata.annotations.as_ref().unwrap()[MUTATED_ANNOTATION];
    assert!(
        annotation.contains(
            "container main restartPolicy=Never, container main restart rule \
             (RestartAllContainers on [70, 140])"
        ),
        "{annotation}"
    );
}

#[test]
fn a_job_whose_own_restart_rules_are_invalid_is_left_unchanged_with_the_reason() {
    // An action the API server does not know: it refuses the Job anyway.
    let outcome = mutate_job(
        &gpu_job(
            json!({"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "restartPolicy": "Never",
                "restartPolicyRules": [restart_rule("Reboot", "In", &[3])]}]}),
            json!({}),
        ),
        &in_place_policy(),
    );
    assert!(!outcome.is_changed());
    assert!(
        outcome.warnings.iter().any(|w| w.contains(
            r#"spec.template.spec.containers[0].restartPolicyRules[0].action: Unsupported value: "Reboot""#
        )),
        "{:?}",
        outcome.warnings
    );
}

// --- Gangs in a single Job: the peers of a device failure ------------------------------------

/// An Indexed GPU Job of `parallelism` pods and `completions` indexes.
fn indexed_job(parallelism: Option<i32>, completions: i32) -> Job {
    let mut spec = json!({"completionMode": "Indexed", "completions": completions});
    if let Some(parallelism) = parallelism {
        spec["parallelism"] = json!(parallelism);
    }
    gpu_job(json!({}), spec)
}

fn gang_annotation(outcome: &Outcome) -> Option<&str> {
    outcome
        .job
        .spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(crate::wellknown::GANG_KEY)
        .map(String::as_str)
}

fn gang_rules() -> Vec<Value> {
    vec![
        condition_rule("DisruptionTarget", "Ignore"),
        condition_rule("gpu-guard.io/DeviceRetriesExhausted", "Count"),
        condition_rule("gpu-guard.io/DeviceFailure", "Ignore"),
        condition_rule("gpu-guard.io/PeerDeviceFailure", "Ignore"),
        exit_rule("main", "Ignore", &[74, 75, 138]),
    ]
}

#[test]
fn a_gang_job_ignores_the_failures_of_the_peers_of_a_device_failure() {
    let policy = Policy::embedded();
    let outcome = mutate_job(&indexed_job(Some(4), 4), &policy);
    assert_eq!(rules(&outcome), gang_rules());
    assert_eq!(gang_annotation(&outcome), Some("true"));
    assert!(api_rules::job::check_job(&outcome.job).is_empty());
    assert!(
        outcome
            .summary()
            .contains("pod annotation gpu-guard.io/gang"),
        "{}",
        outcome.summary()
    );
    // The template's own annotations stay.
    let mut annotated = indexed_job(Some(4), 4);
    annotated.spec.as_mut().unwrap().template.metadata = Some(ObjectMeta {
        annotations: Some(BTreeMap::from([("team".to_owned(), "vision".to_owned())])),
        ..ObjectMeta::default()
    });
    let outcome = mutate_job(&annotated, &policy);
    let annotations = outcome
        .job
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref();
    assert_eq!(
        annotations.and_then(|m| m.annotations.clone()),
        Some(BTreeMap::from([
            ("gpu-guard.io/gang".to_owned(), "true".to_owned()),
            ("team".to_owned(), "vision".to_owned()),
        ]))
    );

    // Said by the user: any Job (here a non-indexed one), through a label or an annotation.
    for place in ["labels", "annotations"] {
        let mut job = gpu_job(json!({}), json!({"parallelism": 2}));
        let said = Some(BTreeMap::from([(
            "gpu-guard.io/gang".to_owned(),
            "true".to_owned(),
        )]));
        match place {
            "labels" => job.metadata.labels = said,
            _ => job.metadata.annotations = said,
        }
        let outcome = mutate_job(&job, &policy);
        assert_eq!(rules(&outcome), gang_rules(), "{place}");
        assert_eq!(gang_annotation(&outcome), Some("true"), "{place}");
    }
}

#[test]
fn jobs_that_are_not_gangs_get_no_peer_rule() {
    let policy = Policy::embedded();
    let mut opted_out = indexed_job(Some(4), 4);
    opted_out.metadata.labels = Some(BTreeMap::from([(
        "gpu-guard.io/gang".to_owned(),
        "false".to_owned(),
    )]));
    let cases = [
        (
            "indexed, parallelism below completions",
            indexed_job(Some(2), 4),
        ),
        ("indexed, parallelism defaulted to 1", indexed_job(None, 4)),
        ("indexed, a single index", indexed_job(Some(1), 1)),
        (
            "non-indexed, parallelism = completions",
            gpu_job(json!({}), json!({"parallelism": 4, "completions": 4})),
        ),
        ("opted out", opted_out),
    ];
    for (name, job) in cases {
        let outcome = mutate_job(&job, &policy);
        assert_eq!(rules(&outcome), default_rules_for(&["main"]), "{name}");
        assert_eq!(gang_annotation(&outcome), None, "{name}");
    }

    // A JobSet's replicated Job: the JobSet restarts the whole gang on a device failure.
    let outcome = mutate_job_as(
        &indexed_job(Some(4), 4),
        &policy,
        JobRole::JobSetReplica,
        ClusterFacts::of(&ObjectMeta::default(), &NoDraFacts),
    );
    assert!(outcome.is_changed());
    assert!(
        !rules(&outcome)
            .iter()
            .any(|rule| rule.to_string().contains("PeerDeviceFailure")),
        "{:?}",
        rules(&outcome)
    );
    assert_eq!(gang_annotation(&outcome), None);

    // Turned off in the policy.
    let mut off = Policy::embedded();
    off.mutation.pod_failure_policy.gang_peers = false;
    let outcome = mutate_job(&indexed_job(Some(4), 4), &off);
    assert_eq!(rules(&outcome), default_rules_for(&["main"]));
    assert_eq!(gang_annotation(&outcome), None);
}

#[test]
fn a_gang_jobs_own_peer_rule_wins_and_its_pods_are_still_announced() {
    let policy = Policy::embedded();
    let own = condition_rule("gpu-guard.io/PeerDeviceFailure", "FailJob");
    let job = gpu_job(
        json!({}),
        json!({"completionMode": "Indexed", "completions": 4, "parallelism": 4,
               "podFailurePolicy": {"rules": [own.clone()]}}),
    );
    let outcome = mutate_job(&job, &policy);
    let mut expected = default_rules_for(&["main"]);
    expected.push(own);
    assert_eq!(
        rules(&outcome),
        expected,
        "no second rule for the condition"
    );
    assert!(
        outcome.warnings.iter().any(|w| w
            == "the Job's own FailJob rule handles gpu-guard.io/PeerDeviceFailure=True; \
                gpu-guard's Ignore rule is not added"),
        "{:?}",
        outcome.warnings
    );
    // The Job reads the peers' mark with its own rule: the controller must still make it.
    assert_eq!(gang_annotation(&outcome), Some("true"));

    // A policy that keeps the Job's own podFailurePolicy, which does not read the mark: no
    // annotation either (a mark nothing reads would change nothing).
    let mut keep = Policy::embedded();
    keep.mutation.pod_failure_policy.existing_policy = ExistingPolicy::Keep;
    let job = gpu_job(
        json!({}),
        json!({"completionMode": "Indexed", "completions": 4, "parallelism": 4,
               "podFailurePolicy": {"rules": [exit_rule("main", "FailJob", &[42])]}}),
    );
    let outcome = mutate_job(&job, &keep);
    assert_eq!(rules(&outcome), [exit_rule("main", "FailJob", &[42])]);
    assert_eq!(gang_annotation(&outcome), None);
}

#[test]
fn the_peer_rule_follows_the_device_failure_rule_and_counts_toward_the_limit() {
    // The DeviceFailure rule's action is the peers' too.
    let mut count = Policy::embedded();
    count.mutation.pod_failure_policy.pod_condition_rules[2].action = RuleAction::FailJob;
    let outcome = mutate_job(&indexed_job(Some(4), 4), &count);
    assert_eq!(
        rules(&outcome)[2..4],
        [
            condition_rule("gpu-guard.io/DeviceFailure", "FailJob"),
            condition_rule("gpu-guard.io/PeerDeviceFailure", "FailJob"),
        ]
    );
    // No DeviceFailure rule in the policy: no peer rule, no annotation.
    let mut none = Policy::embedded();
    none.mutation
        .pod_failure_policy
        .pod_condition_rules
        .truncate(2);
    let outcome = mutate_job(&indexed_job(Some(4), 4), &none);
    assert_eq!(rules(&outcome).len(), 3);
    assert_eq!(gang_annotation(&outcome), None);

    // 14 own rules, 3 condition rules and 3 per-container rules fit (20); with the peer rule
    // they do not, so the exit-code rules fall back to one for every container (19).
    let mut spec = own_rules(14);
    merge(
        &mut spec,
        json!({"completionMode": "Indexed", "completions": 4, "parallelism": 4}),
    );
    let crowded = gpu_job(many_gpu_containers(3), spec.clone());
    let outcome = mutate_job(&crowded, &Policy::embedded());
    let all = rules(&outcome);
    assert_eq!(all.len(), 19);
    assert_eq!(
        all[3],
        condition_rule("gpu-guard.io/PeerDeviceFailure", "Ignore")
    );
    assert_eq!(
        all[4],
        json!({"action": "Ignore", "onExitCodes": {"operator": "In", "values": [74, 75, 138]}})
    );
    assert!(api_rules::job::check_job(&outcome.job).is_empty());
    assert!(
        outcome
            .warnings
            .iter()
            .any(|w| w.contains("match every container")),
        "{:?}",
        outcome.warnings
    );
    assert_eq!(gang_annotation(&outcome), Some("true"));
    let twice = mutate_job(&outcome.job, &Policy::embedded());
    assert!(twice.changes.is_empty(), "{:?}", twice.changes);
    // The same Job as no gang keeps one rule per container.
    spec["parallelism"] = json!(2);
    let outcome = mutate_job(&gpu_job(many_gpu_containers(3), spec), &Policy::embedded());
    assert_eq!(rules(&outcome).len(), 20);
}

#[test]
fn a_mutated_gang_job_is_not_changed_again() {
    let policy = Policy::embedded();
    let once = mutate_job(&indexed_job(Some(8), 8), &policy);
    assert!(once.is_changed());
    let twice = mutate_job(&once.job, &policy);
    assert!(twice.changes.is_empty(), "{:?}", twice.changes);
    assert_eq!(twice.job, once.job);
}

#[test]
fn a_policy_that_names_the_peer_condition_itself_places_it_for_every_job() {
    let mut policy = Policy::embedded();
    policy
        .mutation
        .pod_failure_policy
        .pod_condition_rules
        .insert(
            0,
            crate::policy::PodConditionRule {
                condition_type: "gpu-guard.io/PeerDeviceFailure".to_owned(),
                status: crate::policy::ConditionStatus::True,
                action: RuleAction::Ignore,
            },
        );
    let peer_first = |outcome: &Outcome| {
        let all = rules(outcome);
        assert_eq!(
            all[0],
            condition_rule("gpu-guard.io/PeerDeviceFailure", "Ignore")
        );
        assert_eq!(
            all.iter()
                .filter(|rule| rule.to_string().contains("PeerDeviceFailure"))
                .count(),
            1
        );
    };
    let plain = mutate_job(&gpu_job(json!({}), json!({})), &policy);
    peer_first(&plain);
    assert_eq!(gang_annotation(&plain), None);
    let gang = mutate_job(&indexed_job(Some(4), 4), &policy);
    peer_first(&gang);
    assert_eq!(gang_annotation(&gang), Some("true"));
}
