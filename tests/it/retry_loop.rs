//! Issue 29's loop, played through the fake API server: a Job whose pods fail with exit 74
//! wherever they run (a device fault the device plugin does not flag, or an application that
//! misreports its own error). The controller records each failure on the Job; each new pod,
//! admitted by the webhook's Pod review on that record, lands on a node where the Job has not
//! failed; past the Job's budget its new pods carry `gpu-guard.io/DeviceRetriesExhausted`, and
//! the Job controller's rules (`simulate::job`, the port of `pod_failure_policy.go`) count their
//! failures until the Job fails by `backoffLimit`.

use gpu_guard_controller::run::{self, ControllerOptions};
use gpu_guard_core::devices::NoDraFacts;
use gpu_guard_core::memory::avoid::Memories;
use gpu_guard_core::memory::{MEMORY_ANNOTATION, Memory, WorkloadRef};
use gpu_guard_core::mutate::object::mutate_object;
use gpu_guard_core::mutate::patch;
use gpu_guard_core::policy::Policy;
use gpu_guard_core::simulate::job::{self, History, Step};
use k8s_openapi::api::batch::v1::JobSpec;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::avoid::excluded;
use crate::avoid::webhook::{admitted, job_pod_review};
use crate::support::controller::{gpu_node, namespace, policy};
use crate::support::eventually;
use crate::support::fake_api::{Fake, JOBS, NAMESPACES, NODES, PODS};

const NODE_NAMES: [&str; 10] = [
    "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7", "gpu-8", "gpu-9", "gpu-10",
];

/// The webhook's view of the records: the Job's annotation as the fake holds it now (the
/// webhook's own label-selected cache is tested in `avoid.rs`).
struct FromFake<'a>(&'a Fake);

impl Memories for FromFake<'_> {
    fn memory_annotation(&self, workload: &WorkloadRef) -> Option<String> {
        let job = self.0.object(JOBS, &format!("ml/{}", workload.name));
        job["metadata"]["annotations"][MEMORY_ANNOTATION]
            .as_str()
            .map(str::to_owned)
    }
}

/// The Job `train` as gpu-guard admits it: one pod with a GPU, backoffLimit 2.
fn admitted_job(policy: &Policy) -> Value {
    let written = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml", "uid": "0b7e6f9e-5b1a-4f0e-9d0c-6a3f2d4c8e11"},
        "spec": {"backoffLimit": 2, "parallelism": 1, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "trainer:1",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}
    });
    let mutation = mutate_object(&written, policy, &NoDraFacts)
        .expect("a Job")
        .expect("mutated");
    patch::apply(&written, &mutation.patch).expect("the patch applies")
}

/// The Job controller creates pod `index`: the webhook admits it on the record as it is now;
/// the scheduler puts it on the first node its affinity allows.
fn create_pod(fake: &Fake, policy: &Policy, index: usize) -> (String, String) {
    let (_, mut pod) = admitted(&job_pod_review("train"), policy, &FromFake(fake));
    let avoided: Vec<String> = excluded(&pod).concat();
    let node = NODE_NAMES
        .iter()
        .find(|node| !avoided.iter().any(|avoided| avoided == *node))
        .expect("a node the pod may use")
        .to_string();
    let name = format!("train-{index}");
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["uid"] = json!(format!("uid-{name}"));
    pod["spec"]["nodeName"] = json!(node);
    pod["status"] = json!({"phase": "Running", "containerStatuses": [{
        "name": "main", "image": "trainer:1", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {"startedAt": "2027-01-15T08:00:00Z"}}}]});
    fake.put(PODS, pod);
    (name, node)
}

/// The pod's main container exits 74, at `minute` past 08:00.
fn fail(fake: &Fake, name: &str, minute: usize) -> Value {
    let mut pod = fake.object(PODS, &format!("ml/{name}"));
    pod["status"]["phase"] = json!("Failed");
    pod["status"]["containerStatuses"][0]["ready"] = json!(false);
    pod["status"]["containerStatuses"][0]["state"] = json!({"terminated": {
        "exitCode": 74, "reason": "Error",
        "finishedAt": format!("2027-01-15T08:{minute:02}:00Z")}});
    fake.put(PODS, pod.clone());
    pod
}

fn exhausted(fake: &Fake, name: &str) -> bool {
    fake.object(PODS, &format!("ml/{name}"))["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "gpu-guard.io/DeviceRetriesExhausted" && c["status"] == "True")
}

#[tokio::test]
async fn a_job_failing_with_74_moves_node_each_retry_and_past_its_budget_ends_by_backoff_limit() {
    let policy = policy(|p| p.controller.resync_seconds = 3600);
    let job = admitted_job(&policy);
    let spec: JobSpec = serde_json::from_value(job["spec"].clone()).expect("a Job spec");
    let fake = Fake::start().await;
    for node in NODE_NAMES {
        fake.put(NODES, gpu_node(node, 8, 8));
    }
    fake.put(NAMESPACES, namespace("ml", true));
    fake.put(JOBS, job);
    let options = ControllerOptions {
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        leader_election: None,
        identity: Some("test-1".to_owned()),
    };
    let running = run::start(fake.config(), policy.clone(), options)
        .await
        .expect("the controller starts");
    eventually("the pod watch open", || fake.open_watches(PODS) > 0).await;

    let mut counted = 0;
    let mut nodes = Vec::new();
    let mut steps = Vec::new();
    for index in 0..10 {
        let (name, node) = create_pod(&fake, &policy, index);
        // No pod goes back to a node where the Job failed (all ten nodes fit 8 exclusions).
        assert!(
            !nodes.contains(&node),
            "pod {index} went back to {node}: {nodes:?}"
        );
        nodes.push(node);
        // Past the budget (3, for one pod), the controller marks each new pod while it runs.
        let total = Memory::of_annotation(
            fake.object(JOBS, "ml/train")["metadata"]["annotations"][MEMORY_ANNOTATION].as_str(),
        )
        .expect("gpu-guard's record")
        .total;
        if total > 3 {
            eventually(&format!("{name} marked"), || exhausted(&fake, &name)).await;
        } else {
            assert!(!exhausted(&fake, &name));
        }
        let failed: Pod = serde_json::from_value(fail(&fake, &name, index)).expect("a pod");
        eventually(&format!("{name}'s failure recorded"), || {
            Memory::of_annotation(
                fake.object(JOBS, "ml/train")["metadata"]["annotations"][MEMORY_ANNOTATION]
                    .as_str(),
            )
            .is_ok_and(|memory| memory.total as usize == index + 1)
        })
        .await;
        // The pod as the Job controller judges it: with its condition, when it has one.
        let judged: Pod =
            serde_json::from_value(fake.object(PODS, &format!("ml/{name}"))).expect("a pod");
        let judged = if exhausted(&fake, &name) {
            judged
        } else {
            failed
        };
        let (matched, step) = job::step(
            &spec,
            &judged,
            History {
                failed: counted,
                ..History::default()
            },
        );
        if matched.counted {
            counted += 1;
        }
        steps.push(step.clone());
        if let Step::JobFailed { reason, .. } = step {
            assert_eq!(reason, "BackoffLimitExceeded");
            break;
        }
    }
    // Four free retries (the fourth failure exceeds the budget), then three counted failures:
    // the third is past backoffLimit 2.
    assert_eq!(
        steps.iter().filter(|s| **s == Step::Replaced).count(),
        4,
        "{steps:?}"
    );
    assert!(
        matches!(steps.last(), Some(Step::JobFailed { .. })),
        "{steps:?}"
    );
    assert_eq!(steps.len(), 7, "{steps:?}");
    assert_eq!(nodes.len(), 7);
    running.shutdown().await;
}
