//! The device-failure memory against the fake API server: the controller records each device
//! failure of a pod in its workload's annotation (a JobSet's survives its gang restart, a
//! restarted controller records nothing twice), and a workload past its budget has the
//! condition `gpu-guard.io/DeviceRetriesExhausted` put on its running and new pods.

use crate::controller::allowed_by;
use crate::support;

use gpu_guard_controller::RBAC_RULES;
use gpu_guard_controller::run::{self, ControllerOptions, RunningController};
use gpu_guard_core::memory::{MEMORY_ANNOTATION, MEMORY_LABEL, Memory};
use gpu_guard_core::policy::Policy;
use hyper::Method;
use serde_json::{Value, json};
use support::controller::{gpu_node, namespace, policy};
use support::eventually;
use support::fake_api::{Fake, JOBS, JOBSETS, Logged, NAMESPACES, NODES, PODS};

fn without_election() -> ControllerOptions {
    ControllerOptions {
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        leader_election: None,
        identity: Some("test-1".to_owned()),
    }
}

/// A pod of the Job `job` (of the JobSet `jobset`, when given) on `node`, using one GPU:
/// running, or, with `exit`, failed with that exit code in its GPU container.
fn job_pod(name: &str, job: &str, jobset: Option<&str>, node: &str, exit: Option<i32>) -> Value {
    let mut labels = json!({"batch.kubernetes.io/job-name": job, "job-name": job,
                            "batch.kubernetes.io/controller-uid": format!("uid-{job}")});
    if let Some(jobset) = jobset {
        labels["jobset.sigs.k8s.io/jobset-name"] = json!(jobset);
    }
    let (phase, state) = match exit {
        None => (
            "Running",
            json!({"running": {"startedAt": "2027-01-15T08:00:00Z"}}),
        ),
        Some(code) => (
            "Failed",
            json!({"terminated": {"exitCode": code, "reason": "Error",
                                  "finishedAt": "2027-01-15T08:10:00Z"}}),
        ),
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "labels": labels,
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                          "uid": format!("uid-{job}"), "controller": true}]},
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "containers": [{"name": "trainer", "image": "cuda",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": phase, "containerStatuses": [{
            "name": "trainer", "image": "cuda", "imageID": "", "ready": exit.is_none(),
            "restartCount": 0, "state": state}]},
    })
}

fn job(name: &str, parallelism: u32) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
           "spec": {"parallelism": parallelism, "template": {"spec": {"containers": []}}}})
}

fn jobset(name: &str) -> Value {
    json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
           "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2,
                                        "template": {"spec": {"parallelism": 1}}}]}})
}

/// The memory in the workload's annotation (empty without one).
fn memory_of(fake: &Fake, path: &str, name: &str) -> Memory {
    let object = fake.object(path, &format!("ml/{name}"));
    Memory::of_annotation(object["metadata"]["annotations"][MEMORY_ANNOTATION].as_str())
        .expect("gpu-guard's memory")
}

fn recorded_nodes(fake: &Fake, path: &str, name: &str) -> Vec<String> {
    memory_of(fake, path, name)
        .failures
        .iter()
        .map(|failure| failure.node.clone())
        .collect()
}

/// The patches of the namespaced objects of the collection at `path`.
fn patches_of(fake: &Fake, path: &str) -> Vec<Logged> {
    let plural = path.rsplit('/').next().unwrap_or_default();
    fake.requests()
        .into_iter()
        .filter(|r| r.method == Method::PATCH && r.path.contains(&format!("/{plural}/")))
        .collect()
}

fn events(fake: &Fake, reason: &str) -> Vec<(String, String)> {
    fake.events()
        .into_iter()
        .filter(|(found, _, _)| found == reason)
        .map(|(_, name, note)| (name, note))
        .collect()
}

/// The fake with two GPU nodes and the opted-in namespace `ml`, plus `objects`, and a
/// controller on it (no election, no resync during the test: only watch events act).
async fn start(
    objects: Vec<(&'static str, Value)>,
    edit: impl FnOnce(&mut Policy),
) -> (Fake, RunningController) {
    let fake = Fake::start().await;
    for node in ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"] {
        fake.put(NODES, gpu_node(node, 8, 8));
    }
    fake.put(NAMESPACES, namespace("ml", true));
    for (path, object) in objects {
        fake.put(path, object);
    }
    let running = start_controller(&fake, edit).await;
    (fake, running)
}

async fn start_controller(fake: &Fake, edit: impl FnOnce(&mut Policy)) -> RunningController {
    let policy = policy(|p| {
        p.controller.resync_seconds = 3600;
        edit(p);
    });
    let running = run::start(fake.config(), policy, without_election())
        .await
        .expect("start");
    eventually("the pod watch open", || fake.open_watches(PODS) > 0).await;
    running
}

fn recorded_metric(running: &RunningController, kind: &'static str) -> u64 {
    running
        .metrics
        .failures_recorded
        .get_or_create(&vec![("kind", kind)])
        .get()
}

/// Every call the controller made is one its ClusterRole allows (Leases aside: none here).
fn assert_allowed(fake: &Fake) {
    for request in fake.requests() {
        assert!(
            allowed_by(&request, &RBAC_RULES),
            "{} {} is not in controller::RBAC_RULES",
            request.method,
            request.path
        );
    }
}

/// A JobSet's pod fails with exit 74 on gpu-1 and is deleted at once with its child Job (the
/// gang restart); the restarted gang's pod fails on gpu-3. The JobSet's annotation holds both,
/// most recent last, and carries the label that selects it.
#[tokio::test]
async fn a_jobsets_failures_are_recorded_before_its_gang_restart_deletes_the_pods() {
    let first = "llm-workers-0-0-a";
    let (fake, running) = start(
        vec![
            (JOBSETS, jobset("llm")),
            (
                PODS,
                job_pod(first, "llm-workers-0", Some("llm"), "gpu-1", None),
            ),
        ],
        |_| {},
    )
    .await;
    eventually("the pod cached", || running.metrics.device_pods.get() == 1).await;
    let failed = job_pod(first, "llm-workers-0", Some("llm"), "gpu-1", Some(74));
    fake.put(PODS, failed.clone());
    // The JobSet controller deletes the child Job and its pods right away.
    fake.event(PODS, "DELETED", failed);
    eventually("the first failure recorded", || {
        memory_of(&fake, JOBSETS, "llm").total == 1
    })
    .await;
    assert_eq!(recorded_nodes(&fake, JOBSETS, "llm"), ["gpu-1"]);

    let second = "llm-workers-0-0-b";
    fake.put(
        PODS,
        job_pod(second, "llm-workers-0", Some("llm"), "gpu-3", None),
    );
    fake.put(
        PODS,
        job_pod(second, "llm-workers-0", Some("llm"), "gpu-3", Some(74)),
    );
    eventually("the second failure recorded", || {
        memory_of(&fake, JOBSETS, "llm").total == 2
    })
    .await;
    let memory = memory_of(&fake, JOBSETS, "llm");
    assert_eq!(recorded_nodes(&fake, JOBSETS, "llm"), ["gpu-1", "gpu-3"]);
    assert_eq!(memory.failures[1].pod, second);
    assert_eq!(
        memory.failures[1].cause,
        "exit code 74 in container trainer"
    );
    assert_eq!(memory.nodes_to_avoid(8), ["gpu-3", "gpu-1"]);
    let object = fake.object(JOBSETS, "ml/llm");
    assert_eq!(object["metadata"]["labels"][MEMORY_LABEL], "true");
    // The child Job has no memory of its own: a gang restart would delete it.
    assert!(fake.lock().collections[JOBS].objects.is_empty());
    eventually("an Event on the JobSet for each", || {
        events(&fake, "DeviceFailureRecorded").len() == 2
    })
    .await;
    let notes = events(&fake, "DeviceFailureRecorded");
    assert!(notes.iter().all(|(name, _)| name == "llm"), "{notes:?}");
    assert!(
        notes[1].1.contains("node gpu-3") && notes[1].1.contains("exit code 74"),
        "{notes:?}"
    );
    eventually("both records counted", || {
        recorded_metric(&running, "JobSet") == 2
    })
    .await;
    // Each patch carried the resourceVersion it read: a concurrent change is a conflict.
    for patch in patches_of(&fake, JOBSETS) {
        assert!(
            patch.body["metadata"]["resourceVersion"].is_string(),
            "{:?}",
            patch.body
        );
    }
    assert_allowed(&fake);
    running.shutdown().await;
}

/// A Job's failed pod is recorded; the controller restarts and sees the same failed pod again:
/// nothing is written. A new failure, whose first write meets a 409 Conflict (the Job
/// controller changed the Job meanwhile), is recorded beside the old one.
#[tokio::test]
async fn a_restarted_controller_records_nothing_twice_and_adds_new_failures() {
    let (fake, running) = start(
        vec![
            (JOBS, job("train", 1)),
            (PODS, job_pod("train-a", "train", None, "gpu-1", Some(74))),
            // Other failures: not a device's.
            (PODS, job_pod("train-b", "train", None, "gpu-2", Some(1))),
        ],
        |_| {},
    )
    .await;
    eventually("the failure recorded", || {
        memory_of(&fake, JOBS, "train").total == 1
    })
    .await;
    assert_eq!(recorded_nodes(&fake, JOBS, "train"), ["gpu-1"]);
    running.shutdown().await;
    let patches = patches_of(&fake, JOBS).len();
    assert_eq!(patches, 1);

    fake.clear_requests();
    let running = start_controller(&fake, |_| {}).await;
    // The full pass at start reads the Job for the failed pod it sees, and finds it recorded.
    eventually("the Job read again", || {
        fake.requests()
            .iter()
            .any(|r| r.method == Method::GET && r.path.ends_with("/jobs/train"))
    })
    .await;
    fake.put(PODS, job_pod("train-c", "train", None, "gpu-2", None));
    fake.lock().object_conflicts = 1;
    fake.put(PODS, job_pod("train-c", "train", None, "gpu-2", Some(74)));
    eventually("the new failure recorded", || {
        memory_of(&fake, JOBS, "train").total == 2
    })
    .await;
    assert_eq!(recorded_nodes(&fake, JOBS, "train"), ["gpu-1", "gpu-2"]);
    let patches = patches_of(&fake, JOBS);
    assert_eq!(
        patches.len(),
        2,
        "one refused for the conflict, one made; none for the old failure"
    );
    assert!(patches.iter().all(|patch| {
        patch.body["metadata"]["annotations"][MEMORY_ANNOTATION]
            .as_str()
            .is_some_and(|memory| memory.contains("train-c"))
    }));
    eventually("the record counted", || {
        recorded_metric(&running, "Job") == 1
    })
    .await;
    assert_eq!(running.metrics.reconcile_errors.get(), 0);
    assert_allowed(&fake);
    running.shutdown().await;
}

/// In a dry run the patch is sent with dryRun=All and the Job is left as it was; where the
/// JobSet API is not served, a JobSet's pod's failure fails nothing.
#[tokio::test]
async fn a_dry_run_changes_nothing_and_a_missing_jobset_api_fails_nothing() {
    let fake = Fake::start().await;
    fake.unserve(JOBSETS);
    fake.put(NODES, gpu_node("gpu-1", 8, 8));
    fake.put(NAMESPACES, namespace("ml", true));
    fake.put(JOBS, job("train", 1));
    fake.put(PODS, job_pod("train-a", "train", None, "gpu-1", Some(74)));
    fake.put(
        PODS,
        job_pod("llm-w-0-0-a", "llm-w-0", Some("llm"), "gpu-1", Some(74)),
    );
    let running = start_controller(&fake, |p| p.controller.dry_run = true).await;
    eventually("the Job patched in a dry run", || {
        patches_of(&fake, JOBS)
            .iter()
            .any(|patch| patch.param("dryRun") == Some("All"))
    })
    .await;
    eventually("the JobSet looked for", || {
        fake.requests()
            .iter()
            .any(|r| r.path.ends_with("/jobsets/llm"))
    })
    .await;
    assert_eq!(memory_of(&fake, JOBS, "train"), Memory::default());
    eventually("the dry run told in an Event", || {
        events(&fake, "DeviceFailureRecorded")
            .iter()
            .any(|(_, note)| note.starts_with("dry run: would record"))
    })
    .await;
    assert_eq!(running.metrics.reconcile_errors.get(), 0);
    running.shutdown().await;
}

/// An annotation of the memory's name that is not gpu-guard's record is left alone, and said so.
#[tokio::test]
async fn an_annotation_that_is_not_gpu_guards_record_is_never_overwritten() {
    let mut foreign = job("train", 1);
    foreign["metadata"]["annotations"] = json!({MEMORY_ANNOTATION: "gpu-1,gpu-2"});
    let (fake, running) = start(
        vec![
            (JOBS, foreign),
            (PODS, job_pod("train-a", "train", None, "gpu-1", Some(74))),
        ],
        |_| {},
    )
    .await;
    eventually("the Event that says so", || {
        !events(&fake, "DeviceFailureMemoryUnreadable").is_empty()
    })
    .await;
    let notes = events(&fake, "DeviceFailureMemoryUnreadable");
    assert!(notes[0].1.contains("remove it"), "{notes:?}");
    assert!(patches_of(&fake, JOBS).is_empty());
    assert_eq!(
        fake.object(JOBS, "ml/train")["metadata"]["annotations"][MEMORY_ANNOTATION],
        "gpu-1,gpu-2"
    );
    assert_eq!(running.metrics.reconcile_errors.get(), 0);
    running.shutdown().await;
}

/// A Job whose device keeps failing (exit 74, each time on another node) is recorded each
/// time; past its budget (the default: 3 for one pod), its running pod gets
/// `gpu-guard.io/DeviceRetriesExhausted=True` while it runs, and so does the next pod that
/// appears; the Job gets one Event saying so.
#[tokio::test]
async fn past_its_budget_a_jobs_running_and_new_pods_get_retries_exhausted() {
    let (fake, running) = start(vec![(JOBS, job("train", 1))], |_| {}).await;
    for (index, node) in ["gpu-1", "gpu-2", "gpu-3", "gpu-4"].into_iter().enumerate() {
        let name = format!("train-{index}");
        fake.put(PODS, job_pod(&name, "train", None, node, None));
        fake.put(PODS, job_pod(&name, "train", None, node, Some(74)));
        eventually(&format!("failure {index} recorded"), || {
            memory_of(&fake, JOBS, "train").total == u32::try_from(index + 1).unwrap_or(0)
        })
        .await;
        if index < 3 {
            assert!(events(&fake, "DeviceRetriesExhausted").is_empty());
        }
    }
    // Within budget so far, nothing marked; the fourth exceeds it. Its replacement runs now.
    fake.put(PODS, job_pod("train-4", "train", None, "gpu-5", None));
    let condition = |name: &str| {
        fake.object(PODS, &format!("ml/{name}"))["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "gpu-guard.io/DeviceRetriesExhausted")
            .cloned()
    };
    eventually("the running pod marked", || condition("train-4").is_some()).await;
    let marked = condition("train-4").expect("the condition");
    assert_eq!(marked["status"], "True");
    assert_eq!(marked["reason"], "DeviceRetryBudgetExhausted");
    let message = marked["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("4 device failures") && message.contains("budget of 3"),
        "{message}"
    );
    // The failed pods are left alone.
    assert!(condition("train-0").is_none() && condition("train-3").is_none());
    // A pod that appears later gets it too.
    fake.put(PODS, job_pod("train-5", "train", None, "gpu-1", None));
    eventually("the new pod marked", || condition("train-5").is_some()).await;
    eventually("one Event on the Job", || {
        events(&fake, "DeviceRetriesExhausted").len() == 1
    })
    .await;
    assert_eq!(events(&fake, "DeviceRetriesExhausted")[0].0, "train");
    eventually("both marks counted", || {
        running.metrics.pods_marked_exhausted.get() == 2
    })
    .await;
    assert_allowed(&fake);
    running.shutdown().await;
}
