//! Table-driven tests of the gang engine, one behaviour per case.

use serde_json::{Value, json};

use super::*;
use crate::devices::NoDraFacts;
use crate::policy::OnFailureRestartPolicy;
use crate::wellknown::SKIP_ANNOTATION;

/// A replicated Job whose pod runs `containers` with `restart` (`None`: left empty).
fn replica(name: &str, restart: Option<&str>, gpu: bool) -> Value {
    let mut container = json!({"name": "trainer", "image": "pytorch:2"});
    if gpu {
        container["resources"] = json!({"limits": {"nvidia.com/gpu": "8"}});
    }
    let mut pod = json!({"containers": [container]});
    if let Some(restart) = restart {
        pod["restartPolicy"] = json!(restart);
    }
    json!({"name": name, "replicas": 4, "template": {"spec": {
        "backoffLimit": 0, "completions": 2, "parallelism": 2,
        "template": {"spec": pod}}}})
}

fn spec(value: Value) -> JobSetSpec {
    serde_json::from_value(value).expect("a JobSet spec")
}

fn run(spec: &JobSetSpec, policy: &Policy) -> JobSetOutcome {
    mutate_jobset(
        &ObjectMeta::default(),
        Some("train"),
        spec,
        &FieldPath::new(["spec"]),
        policy,
        &NoDraFacts,
    )
}

fn child_rules(outcome: &JobSetOutcome, index: usize) -> Value {
    serde_json::to_value(
        &outcome.spec.replicated_jobs[index]
            .template
            .spec
            .as_ref()
            .unwrap()
            .pod_failure_policy,
    )
    .unwrap()["rules"]
        .clone()
}

fn gang_policy(outcome: &JobSetOutcome) -> Value {
    serde_json::to_value(outcome.failure_policy.as_ref().expect("a failure policy")).unwrap()
}

/// The shipped strict profile: FailJob for exit codes 126 and 127.
fn strict() -> Policy {
    crate::policy::parse(
        include_str!("../../../../../policies/strict.yaml"),
        "policies/strict.yaml",
    )
    .expect("the strict profile loads")
}

#[test]
fn a_gpu_jobset_without_a_failure_policy_restarts_its_gang_on_device_failures() {
    let input = spec(json!({"replicatedJobs": [
        replica("launcher", Some("Never"), false),
        replica("workers", None, true),
    ]}));
    let outcome = run(&input, &Policy::embedded());
    assert_eq!(outcome.replicated.len(), 1, "only the GPU replicated Job");
    assert_eq!(outcome.replicated[0].0, 1);
    assert_eq!(outcome.spec.replicated_jobs[0], input.replicated_jobs[0]);
    assert_eq!(
        child_rules(&outcome, 1),
        json!([
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            // Past the budget a device failure counts against the child Job's backoffLimit:
            // the Job fails of BackoffLimitExceeded, and the JobSet's restart counts.
            {"action": "Count", "onPodConditions": [{"type": "gpu-guard.io/DeviceRetriesExhausted", "status": "True"}]},
            {"action": "FailJob", "onPodConditions": [{"type": "gpu-guard.io/DeviceFailure", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [74, 75, 138]}},
        ])
    );
    let pod = outcome.spec.replicated_jobs[1]
        .template
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert!(
        outcome.warnings.iter().any(|w| w.starts_with(
            "replicatedJob workers: restartPolicy was empty, which JobSet turns into OnFailure"
        )),
        "{:?}",
        outcome.warnings
    );
    assert_eq!(
        gang_policy(&outcome),
        json!({"maxRestarts": 5, "rules": [
            {"name": "gpuGuardDeviceRestart", "action": "RestartJobSet",
             "onJobFailureReasons": ["PodFailurePolicy"],
             "onJobFailureMessagePatterns": ["matching FailJob rule at index (0|2|3)$"],
             "targetReplicatedJobs": ["workers"]},
            // Without a failure policy any failure failed the JobSet: still so for the rest.
            {"name": "gpuGuardOtherFailures", "action": "FailJobSet"},
        ]})
    );
    assert_eq!(
        check_jobset_spec(&outcome.spec, &FieldPath::new(["spec"])),
        vec![]
    );
}

#[test]
fn the_jobsets_own_rules_follow_gpu_guards_and_its_budget_grows() {
    // JobSet's host-maintenance example (jobset v0.12.0), with GPUs: the Job's own
    // DisruptionTarget rule wins, gpu-guard's rules come first and match only their indices.
    let mut workers = replica("workers", Some("Never"), true);
    workers["template"]["spec"]["podFailurePolicy"] = json!({"rules": [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]});
    let input = spec(json!({
        "replicatedJobs": [workers],
        "failurePolicy": {"maxRestarts": 2, "rules": [
            {"action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"]},
            {"name": "leader", "action": "RestartJobSet", "targetReplicatedJobs": ["workers"]},
        ]}
    }));
    let outcome = run(&input, &Policy::embedded());
    let rules = child_rules(&outcome, 0);
    assert_eq!(rules.as_array().unwrap().len(), 4);
    assert_eq!(
        rules[3],
        json!({"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}),
        "the Job's own rule is kept, last"
    );
    let policy = gang_policy(&outcome);
    assert_eq!(policy["maxRestarts"], 7, "2 of the user's + 5 for devices");
    assert_eq!(
        policy["rules"][0]["onJobFailureMessagePatterns"],
        json!(["matching FailJob rule at index (1|2)$"])
    );
    assert_eq!(
        policy["rules"][1],
        json!({"name": "failurePolicyRule0", "action": "RestartJobSetAndIgnoreMaxRestarts",
               "onJobFailureReasons": ["PodFailurePolicy"]}),
        "an unnamed rule keeps the name JobSet would give it"
    );
    assert_eq!(policy["rules"][2]["name"], "leader");
    assert_eq!(policy["rules"].as_array().unwrap().len(), 3);
    assert_eq!(
        check_jobset_spec(&outcome.spec, &FieldPath::new(["spec"])),
        vec![]
    );
}

#[test]
fn non_retriable_codes_fail_the_jobset() {
    let input = spec(json!({"replicatedJobs": [replica("workers", Some("Never"), true)]}));
    let outcome = run(&input, &strict());
    let policy = gang_policy(&outcome);
    assert_eq!(
        policy["rules"][0],
        json!({"name": "gpuGuardNonRetriable", "action": "FailJobSet",
               "onJobFailureReasons": ["PodFailurePolicy"],
               "onJobFailureMessagePatterns": ["matching FailJob rule at index (4)$"],
               "targetReplicatedJobs": ["workers"]})
    );
    assert_eq!(
        policy["rules"][1]["onJobFailureMessagePatterns"],
        json!(["matching FailJob rule at index (0|2|3)$"])
    );
    assert_eq!(
        child_rules(&outcome, 0)[4]["onExitCodes"]["values"],
        json!([126, 127])
    );
}

#[test]
fn replicated_jobs_with_different_rule_layouts_get_rules_of_their_own() {
    let mut two = replica("workers", Some("Never"), true);
    two["template"]["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "helper", "resources": {"limits": {"nvidia.com/gpu": "1"}}}));
    let input = spec(json!({"replicatedJobs": [replica("leader", Some("Never"), true), two]}));
    let outcome = run(&input, &Policy::embedded());
    let rules = &gang_policy(&outcome)["rules"];
    assert_eq!(rules[0]["name"], "gpuGuardDeviceRestart");
    assert_eq!(rules[0]["targetReplicatedJobs"], json!(["leader"]));
    assert_eq!(rules[1]["name"], "gpuGuardDeviceRestart2");
    assert_eq!(rules[1]["targetReplicatedJobs"], json!(["workers"]));
    assert_eq!(
        rules[1]["onJobFailureMessagePatterns"],
        json!(["matching FailJob rule at index (0|2|3|4)$"])
    );
}

#[test]
fn which_jobsets_are_left_alone() {
    let gpu = spec(json!({"replicatedJobs": [replica("workers", Some("Never"), true)]}));
    let cpu = spec(json!({"replicatedJobs": [replica("workers", Some("Never"), false)]}));
    let skipped = mutate_jobset(
        &ObjectMeta {
            annotations: Some([(SKIP_ANNOTATION.to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        None,
        &gpu,
        &FieldPath::new(["spec"]),
        &Policy::embedded(),
        &NoDraFacts,
    );
    assert_eq!(skipped.skipped, Some(SkipReason::SkipAnnotation));
    assert!(!skipped.is_changed());
    assert!(!run(&cpu, &Policy::embedded()).is_changed(), "no device");

    let mut off = Policy::embedded();
    off.mutation.gang.enabled = false;
    assert_eq!(run(&gpu, &off).skipped, Some(SkipReason::Disabled));

    let mut keep = Policy::embedded();
    keep.mutation.pod_failure_policy.existing_policy = ExistingPolicy::Keep;
    let mut with_rules = gpu.clone();
    with_rules.failure_policy = Some(JobSetFailurePolicy {
        rules: vec![JobSetFailurePolicyRule {
            name: "mine".to_owned(),
            action: "FailJobSet".to_owned(),
            ..JobSetFailurePolicyRule::default()
        }],
        ..JobSetFailurePolicy::default()
    });
    let kept = run(&with_rules, &keep);
    assert!(!kept.is_changed());
    assert_eq!(kept.warnings.len(), 1);
}

#[test]
fn on_failure_follows_the_policy_and_adds_no_gang_rule_when_skipped() {
    let input = spec(json!({"replicatedJobs": [replica("workers", Some("OnFailure"), true)]}));
    let skipped = run(&input, &Policy::embedded());
    assert!(
        skipped.failure_policy.is_none(),
        "no device rule, no JobSet rule"
    );
    assert!(
        skipped
            .warnings
            .iter()
            .any(|w| w.contains("restartPolicy OnFailure: no podFailurePolicy added"))
    );
    let mut convert = Policy::embedded();
    convert
        .mutation
        .pod_failure_policy
        .on_failure_restart_policy = OnFailureRestartPolicy::ConvertToNever;
    let converted = run(&input, &convert);
    assert!(converted.failure_policy.is_some());
}

#[test]
fn mutating_twice_changes_nothing_the_second_time() {
    for policy in [Policy::embedded(), strict()] {
        let input = spec(json!({
            "replicatedJobs": [replica("launcher", None, false), replica("workers", None, true)],
            "failurePolicy": {"maxRestarts": 1, "rules": [{"action": "FailJobSet",
                "onJobFailureReasons": ["DeadlineExceeded"]}]}
        }));
        let first = run(&input, &policy);
        assert!(first.is_changed());
        let second = run(&first.spec, &policy);
        assert!(!second.is_changed(), "{:?}", second.summary());
    }
}

#[test]
fn in_place_restart_keeps_its_job_settings() {
    let mut workers = replica("workers", Some("Never"), true);
    workers["template"]["spec"]["backoffLimit"] = json!(2147483647);
    workers["template"]["spec"]["podReplacementPolicy"] = json!("Failed");
    let input = spec(json!({
        "replicatedJobs": [workers],
        "failurePolicy": {"maxRestarts": 3, "restartStrategy": "InPlaceRestart"}
    }));
    let outcome = run(&input, &Policy::embedded());
    let job = outcome.spec.replicated_jobs[0]
        .template
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(job.backoff_limit, Some(i32::MAX));
    assert_eq!(gang_policy(&outcome)["maxRestarts"], 8);
    assert_eq!(gang_policy(&outcome)["restartStrategy"], "InPlaceRestart");
    assert!(
        outcome
            .warnings
            .iter()
            .any(|w| w.contains("InPlaceRestart"))
    );
    assert_eq!(
        check_jobset_spec(&outcome.spec, &FieldPath::new(["spec"])),
        vec![]
    );
}

#[test]
fn the_summary_names_each_replicated_job_and_the_gang_rules() {
    let input = spec(json!({"replicatedJobs": [replica("workers", Some("Never"), true)]}));
    let summary = run(&input, &Policy::embedded()).summary();
    assert!(
        summary.starts_with("replicatedJob workers: podFailurePolicy (4 rules)"),
        "{summary}"
    );
    assert!(
        summary.ends_with("failurePolicy: 2 gang rules, maxRestarts=5"),
        "{summary}"
    );
}
