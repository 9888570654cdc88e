//! The cases of the Job controller's `TestMatchPodFailurePolicy` (kubernetes
//! `pkg/controller/job/pod_failure_policy_test.go`, v1.36), re-expressed as a table, and the
//! Job-level steps that follow (`job_controller.go`).

use super::*;
use serde_json::{Value, json};

/// A failed pod `default/mypod` with these container statuses, init container statuses and
/// conditions.
fn pod(containers: Value, init: Value, conditions: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": "mypod"},
        "status": {"phase": "Failed", "containerStatuses": containers,
                   "initContainerStatuses": init, "conditions": conditions}
    }))
    .unwrap()
}

fn exited(name: &str, code: i32) -> Value {
    json!({"name": name, "state": {"terminated": {"exitCode": code}}})
}

fn exits(statuses: &[(&str, i32)]) -> Pod {
    let statuses: Vec<Value> = statuses.iter().map(|(n, c)| exited(n, *c)).collect();
    pod(json!(statuses), json!([]), json!([]))
}

fn with_condition(type_: &str, status: &str) -> Pod {
    pod(
        json!([]),
        json!([]),
        json!([{"type": type_, "status": status}]),
    )
}

fn on_codes(action: &str, operator: &str, values: &[i32]) -> Value {
    json!({"action": action, "onExitCodes": {"operator": operator, "values": values}})
}

fn on_condition(action: &str, type_: &str, status: &str) -> Value {
    json!({"action": action, "onPodConditions": [{"type": type_, "status": status}]})
}

fn policy(rules: Value) -> PodFailurePolicy {
    serde_json::from_value(json!({ "rules": rules })).unwrap()
}

/// (case, policy, pod, matched rule index and action, counted, FailJob message)
type Case = (
    &'static str,
    Option<PodFailurePolicy>,
    Pod,
    Option<(usize, RuleAction)>,
    bool,
    Option<&'static str>,
);

#[test]
fn the_upstream_matching_table() {
    use RuleAction::*;
    let cases: Vec<Case> = vec![
        (
            "a rule with an unknown action is skipped (exit codes)",
            Some(policy(json!([
                on_codes("UnknownAction", "In", &[1, 2]),
                on_codes("FailJob", "In", &[2, 3])
            ]))),
            exits(&[("main-container", 2)]),
            Some((1, FailJob)),
            true,
            Some(
                "Container main-container for pod default/mypod failed with exit code 2 matching FailJob rule at index 1",
            ),
        ),
        (
            "a rule with an unknown action is skipped (conditions)",
            Some(policy(json!([
                on_condition("UnknownAction", "DisruptionTarget", "True"),
                on_condition("Ignore", "DisruptionTarget", "True")
            ]))),
            with_condition("DisruptionTarget", "True"),
            Some((1, Ignore)),
            false,
            None,
        ),
        (
            "a rule with an unknown operator is skipped",
            Some(policy(json!([
                on_codes("Ignore", "UnknownOperator", &[1, 2]),
                on_codes("FailJob", "In", &[2, 3])
            ]))),
            exits(&[("main-container", 2)]),
            Some((1, FailJob)),
            true,
            Some(
                "Container main-container for pod default/mypod failed with exit code 2 matching FailJob rule at index 1",
            ),
        ),
        ("no policy", None, exits(&[("", 2)]), None, true, None),
        (
            "Ignore on exit codes",
            Some(policy(json!([on_codes("Ignore", "In", &[1, 2, 3])]))),
            exits(&[("", 2)]),
            Some((0, Ignore)),
            false,
            None,
        ),
        (
            "negative exit codes (Windows)",
            Some(policy(json!([on_codes(
                "Ignore",
                "In",
                &[-1073741676, -1073741510]
            )]))),
            exits(&[("", -1073741510)]),
            Some((0, Ignore)),
            false,
            None,
        ),
        (
            "FailJob on exit codes",
            Some(policy(json!([on_codes("FailJob", "In", &[1, 2, 3])]))),
            exits(&[("main-container", 2)]),
            Some((0, FailJob)),
            true,
            Some(
                "Container main-container for pod default/mypod failed with exit code 2 matching FailJob rule at index 0",
            ),
        ),
        (
            "containers that succeeded are never matched, NotIn included",
            Some(policy(json!([on_codes("FailJob", "NotIn", &[111])]))),
            pod(
                json!([
                    exited("main-container", 111),
                    exited("support-container", 0)
                ]),
                json!([exited("init-container", 0)]),
                json!([]),
            ),
            None,
            true,
            None,
        ),
        (
            "FailIndex on exit codes",
            Some(policy(json!([on_codes("FailIndex", "In", &[1, 2, 3])]))),
            exits(&[("", 2)]),
            Some((0, FailIndex)),
            true,
            None,
        ),
        (
            "NotIn [0] matches the container that failed, not the one that succeeded",
            Some(policy(json!([on_codes("FailJob", "NotIn", &[0])]))),
            exits(&[("main-container", 1), ("support-container", 0)]),
            Some((0, FailJob)),
            true,
            Some(
                "Container main-container for pod default/mypod failed with exit code 1 matching FailJob rule at index 0",
            ),
        ),
        (
            "the second rule matches",
            Some(policy(json!([
                on_codes("Count", "In", &[1, 2, 3]),
                on_codes("FailJob", "In", &[4, 5, 6])
            ]))),
            exits(&[("main-container", 6)]),
            Some((1, FailJob)),
            true,
            Some(
                "Container main-container for pod default/mypod failed with exit code 6 matching FailJob rule at index 1",
            ),
        ),
        (
            "Count on exit codes, a container without a state skipped",
            Some(policy(json!([on_codes("Count", "In", &[1, 2, 3])]))),
            pod(
                json!([{"name": "foo"}, exited("bar", 2)]),
                json!([]),
                json!([]),
            ),
            Some((0, Count)),
            true,
            None,
        ),
        (
            "FailIndex on a condition",
            Some(policy(json!([on_condition(
                "FailIndex",
                "DisruptionTarget",
                "True"
            )]))),
            with_condition("DisruptionTarget", "True"),
            Some((0, FailIndex)),
            true,
            None,
        ),
        (
            "Ignore on a condition",
            Some(policy(json!([on_condition(
                "Ignore",
                "DisruptionTarget",
                "True"
            )]))),
            with_condition("DisruptionTarget", "True"),
            Some((0, Ignore)),
            false,
            None,
        ),
        (
            "a pattern with status False matches a condition False",
            Some(policy(json!([on_condition(
                "Ignore",
                "DisruptionTarget",
                "False"
            )]))),
            with_condition("DisruptionTarget", "False"),
            Some((0, Ignore)),
            false,
            None,
        ),
        (
            "a pattern with status Unknown matches a condition Unknown",
            Some(policy(json!([on_condition(
                "Ignore",
                "DisruptionTarget",
                "Unknown"
            )]))),
            with_condition("DisruptionTarget", "Unknown"),
            Some((0, Ignore)),
            false,
            None,
        ),
        (
            "a pattern False does not match a condition True",
            Some(policy(json!([on_condition(
                "Ignore",
                "DisruptionTarget",
                "False"
            )]))),
            with_condition("DisruptionTarget", "True"),
            None,
            true,
            None,
        ),
        (
            "a pattern True does not match a condition False",
            Some(policy(json!([on_condition(
                "Ignore",
                "DisruptionTarget",
                "True"
            )]))),
            with_condition("DisruptionTarget", "False"),
            None,
            true,
            None,
        ),
        (
            "FailJob on a condition",
            Some(policy(json!([on_condition(
                "FailJob",
                "DisruptionTarget",
                "True"
            )]))),
            with_condition("DisruptionTarget", "True"),
            Some((0, FailJob)),
            true,
            Some(
                "Pod default/mypod has condition DisruptionTarget matching FailJob rule at index 0",
            ),
        ),
        (
            "Count on a condition",
            Some(policy(json!([on_condition(
                "Count",
                "DisruptionTarget",
                "True"
            )]))),
            with_condition("DisruptionTarget", "True"),
            Some((0, Count)),
            true,
            None,
        ),
        (
            "NotIn [8] matches exit 32 first, before any later rule",
            Some(policy(json!([
                on_codes("Count", "NotIn", &[8]),
                on_codes("Ignore", "In", &[1, 2, 3]),
                on_codes("FailJob", "NotIn", &[5, 6, 7]),
                on_condition("Count", "ResourceLimitExceeded", "True"),
                on_condition("Ignore", "DisruptionTarget", "True")
            ]))),
            exits(&[("", 32)]),
            Some((0, Count)),
            true,
            None,
        ),
        (
            "a condition rule that does not match is passed over",
            Some(policy(json!([
                on_condition("FailJob", "MaxFailedIndexesExceeded", "True"),
                on_condition("Ignore", "DisruptionTarget", "True")
            ]))),
            with_condition("DisruptionTarget", "True"),
            Some((1, Ignore)),
            false,
            None,
        ),
    ];
    for (case, policy, pod, rule, counted, message) in cases {
        let found = match_rules(policy.as_ref(), &pod);
        assert_eq!(
            found.rule.as_ref().map(|r| (r.index, r.action)),
            rule,
            "{case}"
        );
        assert_eq!(found.counted, counted, "{case}");
        assert_eq!(
            found
                .rule
                .as_ref()
                .and_then(|r| r.job_failure_message.as_deref()),
            message,
            "{case}"
        );
    }
}

#[test]
fn a_pattern_without_status_matches_true_as_the_api_server_defaults_it() {
    let policy =
        policy(json!([{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]));
    let found = match_rules(Some(&policy), &with_condition("DisruptionTarget", "True"));
    assert!(!found.counted);
    let found = match_rules(Some(&policy), &with_condition("DisruptionTarget", "False"));
    assert!(found.counted);
}

#[test]
fn container_name_restricts_exit_codes_and_init_containers_count() {
    let rule = json!([{"action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [74]}}]);
    let policy = policy(rule);
    let sidecar = exits(&[("logger", 74)]);
    assert_eq!(match_rules(Some(&policy), &sidecar).rule, None);
    let init = pod(json!([]), json!([exited("trainer", 74)]), json!([]));
    assert_eq!(
        match_rules(Some(&policy), &init).rule.map(|r| r.index),
        Some(0)
    );
}

fn spec(fields: Value) -> JobSpec {
    let mut spec = json!({"template": {}});
    spec.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    serde_json::from_value(spec).unwrap()
}

#[test]
fn the_job_counts_against_backoff_limit_six_by_default() {
    let spec = spec(json!({}));
    let failure = exits(&[("main", 1)]);
    let (_, step) = step(
        &spec,
        &failure,
        History {
            failed: 5,
            ..Default::default()
        },
    );
    assert_eq!(
        step,
        Step::Counted {
            failed: 6,
            backoff_limit: 6
        }
    );
    let (_, step) = step_of(&spec, &failure, 6);
    assert_eq!(
        step,
        Step::JobFailed {
            reason: "BackoffLimitExceeded",
            message: "Job has reached the specified backoff limit".to_owned()
        }
    );
}

fn step_of(spec: &JobSpec, pod: &Pod, failed: i32) -> (PolicyMatch, Step) {
    step(
        spec,
        pod,
        History {
            failed,
            ..Default::default()
        },
    )
}

#[test]
fn ignore_replaces_and_fail_job_fails_with_the_rule_message() {
    let spec = spec(json!({"backoffLimit": 0, "podFailurePolicy": {"rules": [
        on_codes("FailJob", "In", &[42]),
        on_codes("Ignore", "In", &[74])
    ]}}));
    let (_, step) = step_of(&spec, &exits(&[("trainer", 74)]), 0);
    assert_eq!(step, Step::Replaced);
    let (_, step) = step_of(&spec, &exits(&[("trainer", 42)]), 0);
    assert_eq!(
        step,
        Step::JobFailed {
            reason: "PodFailurePolicy",
            message: "Container trainer for pod default/mypod failed with exit code 42 matching FailJob rule at index 0".to_owned()
        }
    );
}

#[test]
fn per_index_limits_fail_the_index_then_the_job() {
    let spec = spec(json!({"completionMode": "Indexed", "completions": 4,
        "backoffLimitPerIndex": 1, "maxFailedIndexes": 1,
        "podFailurePolicy": {"rules": [on_codes("FailIndex", "In", &[42])]}}));
    let failure = exits(&[("main", 1)]);
    let first = History::default();
    assert_eq!(
        step(&spec, &failure, first).1,
        Step::IndexCounted {
            failed: 1,
            backoff_limit_per_index: 1
        }
    );
    let again = History {
        failed: 1,
        index_failed: 1,
        failed_indexes: 0,
    };
    assert_eq!(
        step(&spec, &failure, again).1,
        Step::IndexFailed {
            failed_indexes: 1,
            max_failed_indexes: Some(1)
        }
    );
    // FailIndex fails the index at once; a second failed index is past maxFailedIndexes.
    let second = History {
        failed: 2,
        index_failed: 0,
        failed_indexes: 1,
    };
    assert_eq!(
        step(&spec, &exits(&[("main", 42)]), second).1,
        Step::JobFailed {
            reason: "MaxFailedIndexesExceeded",
            message: "Job has exceeded the specified maximal number of failed indexes".to_owned()
        }
    );
}

#[test]
fn on_failure_restarts_in_place_until_backoff_limit() {
    let spec = spec(
        json!({"backoffLimit": 2, "template": {"spec": {"restartPolicy": "OnFailure", "containers": []}}}),
    );
    let crash = exits(&[("main", 1)]);
    assert_eq!(
        step_of(&spec, &crash, 0).1,
        Step::RestartedInPlace {
            restarts: 1,
            backoff_limit: 2
        }
    );
    assert!(matches!(
        step_of(&spec, &crash, 1).1,
        Step::JobFailed {
            reason: "BackoffLimitExceeded",
            ..
        }
    ));
    // With backoffLimit 0 the first restart fails the Job.
    let strict = spec_limit_zero();
    assert!(matches!(
        step_of(&strict, &crash, 0).1,
        Step::JobFailed { .. }
    ));
    // An evicted pod fails whole: counted as a pod failure.
    let evicted = with_condition("DisruptionTarget", "True");
    assert_eq!(
        step_of(&spec, &evicted, 0).1,
        Step::Counted {
            failed: 1,
            backoff_limit: 2
        }
    );
}

fn spec_limit_zero() -> JobSpec {
    spec(
        json!({"backoffLimit": 0, "template": {"spec": {"restartPolicy": "OnFailure", "containers": []}}}),
    )
}
