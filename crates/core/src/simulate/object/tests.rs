use super::*;
use crate::devices::NoDraFacts;
use crate::mutate::object::mutate_object;
use crate::policy::Policy;
use serde_json::json;

fn gpu_job() -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "containers": [{"name": "trainer", "image": "trainer:1",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]
        }}}
    })
}

fn exit(container: &str, code: i32) -> Failure {
    Failure {
        exits: vec![(container.to_owned(), code)],
        ..Failure::default()
    }
}

/// The Job as gpu-guard admits it, by the default policy.
fn mutated(raw: &Value) -> Value {
    let mutation = mutate_object(raw, &Policy::embedded(), &NoDraFacts)
        .unwrap()
        .unwrap();
    let mut value = raw.clone();
    json_patch::patch(&mut value, &mutation.patch).unwrap();
    value
}

#[test]
fn a_device_exit_is_free_only_after_gpu_guard_and_an_ordinary_crash_still_counts() {
    let job = gpu_job();
    let written = simulate(&job, &exit("trainer", 74)).unwrap().unwrap();
    assert_eq!(written.job.rule_index, None);
    assert!(written.job.counted);
    assert!(!written.job.job_failed);
    let admitted = mutated(&job);
    let protected = simulate(&admitted, &exit("trainer", 74)).unwrap().unwrap();
    assert_eq!(protected.job.action, Some("Ignore"));
    assert!(!protected.job.counted);
    let crash = simulate(&admitted, &exit("trainer", 1)).unwrap().unwrap();
    assert!(crash.job.counted, "{:?}", crash.story);
    assert_eq!(crash.job.rule_index, None);
    let drained = Failure {
        conditions: vec!["DisruptionTarget".to_owned()],
        ..exit("trainer", 143)
    };
    let drain = simulate(&admitted, &drained).unwrap().unwrap();
    assert_eq!(drain.job.action, Some("Ignore"));
}

#[test]
fn the_job_fails_with_the_controllers_reason_and_message() {
    let mut job = gpu_job();
    job["spec"]["backoffLimit"] = json!(0);
    job["spec"]["podFailurePolicy"] = json!({"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}
    ]});
    let failed = simulate(&job, &exit("trainer", 3)).unwrap().unwrap();
    assert_eq!(failed.job.reason.as_deref(), Some("PodFailurePolicy"));
    assert_eq!(
        failed.job.message.as_deref(),
        Some(
            "Container trainer for pod ml/train-xxxxx failed with exit code 3 matching FailJob rule at index 0"
        )
    );
    let counted = simulate(&job, &exit("fetch", 1)).unwrap().unwrap();
    assert_eq!(counted.job.reason.as_deref(), Some("BackoffLimitExceeded"));
}

#[test]
fn a_jobset_restarts_or_fails_by_its_own_rules() {
    let jobset = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": {
            "failurePolicy": {"maxRestarts": 2, "rules": [
                {"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
                 "onJobFailureMessagePatterns": ["matching FailJob rule at index 0$"]}
            ]},
            "replicatedJobs": [
                {"name": "driver", "template": {"spec": {"template": {"spec": {
                    "containers": [{"name": "main"}]}}}}},
                {"name": "workers", "replicas": 4, "template": {"spec": {
                    "backoffLimit": 0,
                    "podFailurePolicy": {"rules": [
                        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}}
                    ]},
                    "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main"}]}}}}}
            ]
        }
    });
    let worker = |code| Failure {
        replicated_job: Some("workers".to_owned()),
        restarts_so_far: 1,
        ..exit("main", code)
    };
    let stop = simulate(&jobset, &worker(42)).unwrap().unwrap();
    let level = stop.job_set.as_ref().unwrap();
    assert_eq!(level.rule.as_deref(), Some("failurePolicyRule0"));
    assert_eq!(level.action, Some("FailJobSet"));
    assert!(level.job_set_failed);
    assert_eq!(
        level.message.as_deref(),
        Some("applying FailJobSet failure policy action (first failed job: llm-workers-0)")
    );
    let retry = simulate(&jobset, &worker(1)).unwrap().unwrap();
    let level = retry.job_set.unwrap();
    assert_eq!(level.rule, None);
    assert_eq!(level.action, Some("RestartJobSet"));
    assert_eq!(level.restarts_left, Some(0));
    assert!(!level.job_set_failed);
    // The driver's Job has backoffLimit 6: its pod's failure does not reach the JobSet.
    let driver = simulate(&jobset, &exit("main", 1)).unwrap().unwrap();
    assert_eq!(driver.job_set.unwrap().action, None);
}

#[test]
fn bad_input_says_what_is_known() {
    let job = gpu_job();
    let error = simulate(&job, &exit("sidecar", 1)).unwrap().unwrap_err();
    assert_eq!(
        error.to_string(),
        "batch/v1 Job ml/train has no container or init container \"sidecar\" (it has: \
         trainer, fetch); name one of them with --container"
    );
    assert!(
        simulate(
            &json!({"apiVersion": "v1", "kind": "ConfigMap"}),
            &Failure::default()
        )
        .is_none()
    );
}

#[test]
fn a_cron_job_is_its_job_template_and_a_runtime_its_jobset_template() {
    let cron = json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "ml"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}}
            ]},
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "eval"}]}}
        }}}
    });
    let failed = simulate(&cron, &exit("eval", 2)).unwrap().unwrap();
    assert_eq!(failed.kind, "CronJob");
    assert_eq!(failed.job.action, Some("FailJob"));
    assert_eq!(
        failed.job.message.as_deref(),
        Some(
            "Container eval for pod ml/nightly-xxxxx failed with exit code 2 matching FailJob rule at index 0"
        )
    );
    let runtime = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch"},
        "spec": {"template": {"spec": {
            "failurePolicy": {"maxRestarts": 1},
            "replicatedJobs": [{"name": "node", "template": {"spec": {
                "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "node"}]}}
            }}}]
        }}}
    });
    let restarted = simulate(&runtime, &exit("node", 1)).unwrap().unwrap();
    assert_eq!(restarted.kind, "ClusterTrainingRuntime");
    assert!(restarted.job.job_failed);
    let jobset = restarted.job_set.unwrap();
    assert_eq!(jobset.action, Some("RestartJobSet"));
    assert_eq!(jobset.restarts_left, Some(0));
    assert!(
        restarted.story[0].contains("child Job <trainjob>-node-0"),
        "{:?}",
        restarted.story
    );
}
