//! Retries avoid where the workload failed (issue 29, item 2): a new pod of a Job whose pods
//! failed of a device is kept off those nodes, by `gpu-guard mutate` from the pods in its
//! input, and by the webhook at Pod CREATE from the memory recorded on the Job.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde::Deserialize;
use serde_json::{Value, json};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/memory/retry.yaml")
}

fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).expect("YAML"))
        .filter(|value| !value.is_null())
        .collect()
}

/// `gpu-guard mutate -f -` on `input`: the documents printed and stderr.
fn mutate(input: &str) -> (Vec<Value>, String) {
    let output = Command::cargo_bin("gpu-guard")
        .expect("the gpu-guard binary is built")
        .env_remove("GPU_GUARD_POLICY")
        .args(["mutate", "-f", "-"])
        .write_stdin(input.to_owned())
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8(output.stderr).expect("UTF-8");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    (
        documents(&String::from_utf8(output.stdout).expect("UTF-8")),
        stderr,
    )
}

/// The node names a pod's required node affinity excludes, per term.
pub(crate) fn excluded(pod: &Value) -> Vec<Vec<String>> {
    pod.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|term| {
            term["matchFields"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|field| field["key"] == "metadata.name" && field["operator"] == "NotIn")
                .flat_map(|field| field["values"].as_array().cloned().unwrap_or_default())
                .map(|value| value.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .collect()
}

#[test]
fn mutate_keeps_the_new_pod_off_the_nodes_where_the_job_failed_of_a_device() {
    let input = std::fs::read_to_string(fixture()).expect("the fixture");
    let before = documents(&input);
    let (after, stderr) = mutate(&input);
    assert_eq!(after.len(), 5);
    // Most recent first; gpu-9 (exit 1, the application's own error) is not avoided.
    let new = &after[4];
    assert_eq!(excluded(new), [["gpu-7", "gpu-3"]]);
    // What the user wrote stays, in the same term.
    let term = &new["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0];
    assert_eq!(
        term["matchExpressions"],
        before[4]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"]
    );
    // Nothing else of the new pod changes; the pods that ran pass unchanged.
    let mut unaffined = new.clone();
    unaffined["spec"]["affinity"] = before[4]["spec"]["affinity"].clone();
    assert_eq!(unaffined, before[4]);
    assert_eq!(after[1..4], before[1..4]);
    assert!(
        stderr.contains("kept off nodes gpu-7, gpu-3, where Job ml/train failed of a device"),
        "{stderr}"
    );
}

#[test]
fn a_pod_of_a_job_without_device_failures_passes_unchanged() {
    // The same pods, failed of the application's own errors.
    let input = std::fs::read_to_string(fixture())
        .expect("the fixture")
        .replace("exitCode: 74", "exitCode: 1");
    let before = documents(&input);
    let (after, stderr) = mutate(&input);
    assert_eq!(after[1..], before[1..]);
    assert!(!stderr.contains("kept off"), "{stderr}");

    // A memory recorded on the Job counts, as the controller wrote it; the pods of the input
    // add to it.
    let mut job = before[0].clone();
    job["metadata"]["annotations"] = json!({"gpu-guard.io/device-failures":
        r#"{"total":1,"failures":[{"node":"gpu-1","pod":"train-old","at":"2026-12-04T08:00:00Z","cause":"exit code 74 in container trainer"}]}"#});
    let mut recorded: Vec<Value> = before.clone();
    recorded[0] = job;
    let original = std::fs::read_to_string(fixture()).expect("the fixture");
    recorded[1..4].clone_from_slice(&documents(&original)[1..4]);
    let text: Vec<String> = recorded
        .iter()
        .map(|document| serde_norway::to_string(document).expect("YAML"))
        .collect();
    let (after, _) = mutate(&text.join("---\n"));
    assert_eq!(excluded(&after[4]), [["gpu-7", "gpu-3", "gpu-1"]]);
}

// === the webhook ===

pub(crate) mod webhook {
    use std::time::Duration;

    use gpu_guard_core::guard::StaticView;
    use gpu_guard_core::memory::avoid::{Memories, NoMemories};
    use gpu_guard_core::memory::{Memory, WorkloadRef};
    use gpu_guard_core::policy::Policy;
    use gpu_guard_runtime::cluster::ClusterCache;
    use gpu_guard_webhook::admission::{Avoided, ReviewOutcome, Webhook, review_with_memories};
    use gpu_guard_webhook::server::ClusterSource;
    use gpu_guard_webhook::server::tls::generate_self_signed;
    use serde_json::{Value, json};

    use crate::server::{admin_get, client, post, sent_patch, server_with, url};
    use crate::support::fake_api::{Fake, JOBS, JOBSETS};

    use super::excluded;

    /// A Pod CREATE as the API server sends it for a pod the Job controller creates for Job
    /// `job` in `ml`: the recorded Pod CREATE (kube-apiserver v1.36), its object made a Job's
    /// pod (generateName, the Job controller's labels, owner reference and finalizer; no name
    /// yet, so none in the request either), sent by the Job controller's service account.
    pub(crate) fn job_pod_review(job: &str) -> Value {
        let mut body: Value = serde_json::from_slice(
            &std::fs::read("tests/fixtures/admission/013-Pod-CREATE-mutate.json")
                .expect("the fixture"),
        )
        .expect("JSON");
        let uid = "0b7e6f9e-5b1a-4f0e-9d0c-6a3f2d4c8e11";
        let request = &mut body["request"];
        request["name"] = json!("");
        request["namespace"] = json!("ml");
        request["userInfo"] = json!({"username": "system:serviceaccount:kube-system:job-controller",
                   "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                              "system:authenticated"]});
        let object = &mut request["object"];
        object["metadata"] = json!({
            "generateName": format!("{job}-"),
            "namespace": "ml",
            "labels": {"batch.kubernetes.io/controller-uid": uid,
                       "batch.kubernetes.io/job-name": job,
                       "controller-uid": uid, "job-name": job},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                 "uid": uid, "controller": true, "blockOwnerDeletion": true}],
            "finalizers": ["batch.kubernetes.io/job-tracking"]
        });
        object["spec"]["restartPolicy"] = json!("Never");
        body
    }

    /// gpu-3 at 10:00, then gpu-7 at 10:20, as the controller records them.
    pub(super) fn memory() -> String {
        let mut memory = Memory::default();
        for (pod, node, at) in [
            ("train-4xk2p", "gpu-3", "2026-12-04T10:00:00Z"),
            ("train-9qzt7", "gpu-7", "2026-12-04T10:20:00Z"),
        ] {
            memory.record(gpu_guard_core::memory::DeviceFailure {
                node: node.to_owned(),
                pod: pod.to_owned(),
                devices: Vec::new(),
                at: Some(at.parse().expect("a time")),
                cause: "exit code 74 in container main".to_owned(),
            });
        }
        memory.to_annotation()
    }

    struct Recorded(String);

    impl Memories for Recorded {
        fn memory_annotation(&self, workload: &WorkloadRef) -> Option<String> {
            (workload.to_string() == "Job ml/train").then(|| self.0.clone())
        }
    }

    /// The review's answer, and the pod as the API server stores it after the patch.
    pub(crate) fn admitted(
        body: &Value,
        policy: &Policy,
        memories: &dyn Memories,
    ) -> (Value, Value) {
        let view = StaticView::from_policy(&policy.guard.offline);
        let reviewed = review_with_memories(
            Webhook::Mutate,
            body.to_string().as_bytes(),
            policy,
            &view,
            memories,
        )
        .expect("reviewed");
        let answer: Value = serde_json::from_slice(&reviewed.body).expect("JSON");
        let mut pod = body["request"]["object"].clone();
        if answer["response"].get("patch").is_some() {
            json_patch::patch(&mut pod, &sent_patch(&answer["response"])).expect("applies");
        }
        (answer["response"].clone(), pod)
    }

    #[test]
    fn a_job_pod_at_create_is_kept_off_the_nodes_its_job_failed_on() {
        let policy = Policy::embedded();
        let body = job_pod_review("train");
        let (response, pod) = admitted(&body, &policy, &Recorded(memory()));
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        assert_eq!(excluded(&pod), [["gpu-7", "gpu-3"]]);
        assert_eq!(
            response["auditAnnotations"]["avoided-nodes"],
            "kept off nodes gpu-7, gpu-3, where Job ml/train failed of a device"
        );
        // Nobody reads a pod's warnings: none.
        assert!(response.get("warnings").is_none());
        // Only the affinity changes.
        let mut rest = pod.clone();
        rest["spec"].as_object_mut().unwrap().remove("affinity");
        assert_eq!(rest, body["request"]["object"]);
    }

    #[test]
    fn no_patch_without_a_record_without_a_cluster_when_off_or_skipped_or_at_update() {
        let policy = Policy::embedded();
        let unchanged = |body: &Value, policy: &Policy, memories: &dyn Memories| {
            let (response, pod) = admitted(body, policy, memories);
            assert_eq!(response["allowed"], true);
            assert!(response.get("patch").is_none(), "{response}");
            assert_eq!(pod, body["request"]["object"]);
        };
        // Another Job's pod; `serve --no-cluster`.
        unchanged(&job_pod_review("eval"), &policy, &Recorded(memory()));
        unchanged(&job_pod_review("train"), &policy, &NoMemories);
        // Avoidance off.
        let mut off = policy.clone();
        off.mutation.avoid_failed_nodes.enabled = false;
        unchanged(&job_pod_review("train"), &off, &Recorded(memory()));
        // The skip annotation (from the Job's pod template).
        let mut skipped = job_pod_review("train");
        skipped["request"]["object"]["metadata"]["annotations"] =
            json!({"gpu-guard.io/skip": "true"});
        unchanged(&skipped, &policy, &Recorded(memory()));
        // A pod created bound to a node; an UPDATE (node affinity is immutable).
        let mut bound = job_pod_review("train");
        bound["request"]["object"]["spec"]["nodeName"] = json!("gpu-3");
        unchanged(&bound, &policy, &Recorded(memory()));
        let mut update = job_pod_review("train");
        update["request"]["operation"] = json!("UPDATE");
        update["request"]["oldObject"] = update["request"]["object"].clone();
        unchanged(&update, &policy, &Recorded(memory()));
    }

    /// A JobSet's record: its child Jobs (and their pods) are recreated by a gang restart.
    struct JobSetRecord;

    impl Memories for JobSetRecord {
        fn memory_annotation(&self, workload: &WorkloadRef) -> Option<String> {
            (workload.to_string() == "JobSet ml/llm").then(memory)
        }
    }

    #[test]
    fn a_jobset_pod_reads_the_jobsets_record_not_its_child_jobs() {
        let policy = Policy::embedded();
        let mut body = job_pod_review("llm-workers-0");
        body["request"]["object"]["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] =
            json!("llm");
        let (response, pod) = admitted(&body, &policy, &JobSetRecord);
        assert_eq!(excluded(&pod), [["gpu-7", "gpu-3"]]);
        assert_eq!(
            response["auditAnnotations"]["avoided-nodes"],
            "kept off nodes gpu-7, gpu-3, where JobSet ml/llm failed of a device"
        );
        // The same child Job's pod outside a JobSet has no record.
        let (response, _) = admitted(&job_pod_review("llm-workers-0"), &policy, &JobSetRecord);
        assert!(response.get("patch").is_none());
    }

    #[test]
    fn a_record_that_is_not_gpu_guards_admits_the_pod_unchanged_and_says_so() {
        let policy = Policy::embedded();
        let body = job_pod_review("train");
        let view = StaticView::from_policy(&policy.guard.offline);
        let reviewed = review_with_memories(
            Webhook::Mutate,
            body.to_string().as_bytes(),
            &policy,
            &view,
            &Recorded("gpu-3,gpu-7".to_owned()),
        )
        .expect("reviewed");
        assert_eq!(reviewed.outcome, ReviewOutcome::Allowed);
        match reviewed.avoided {
            Some(Avoided::Unreadable { workload, error }) => {
                assert_eq!(workload, "Job ml/train");
                assert!(error.contains("remove it"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        let answer: Value = serde_json::from_slice(&reviewed.body).expect("JSON");
        assert!(answer["response"].get("patch").is_none());
    }

    /// `serve` on a cluster: the Jobs the controller labelled come from a label-selected
    /// watch (a cluster without JobSets is no obstacle), a Job pod is patched over HTTPS, and
    /// a record written later is used for the next pod.
    #[tokio::test]
    async fn serve_reads_the_record_from_the_labelled_jobs_of_the_cluster() {
        let fake = Fake::start().await;
        fake.unserve(JOBSETS);
        let job = |name: &str, labelled: bool, record: &str| {
            let mut job = json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": "ml",
                             "annotations": {"gpu-guard.io/device-failures": record}},
                "spec": {"template": {"spec": {"containers": []}}}});
            if labelled {
                job["metadata"]["labels"] = json!({"gpu-guard.io/device-failures": "true"});
            }
            job
        };
        fake.set(JOBS, job("train", true, &memory()));
        // Not labelled: not watched, so not known.
        fake.set(JOBS, job("eval", false, &memory()));
        let cache = ClusterCache::start(fake.client());
        let dir = tempfile::tempdir().expect("a temp dir");
        let pair = generate_self_signed(&[]).expect("a pair");
        let running = server_with(
            dir.path(),
            &pair,
            Duration::ZERO,
            ClusterSource::Cache(cache),
            Policy::embedded(),
        )
        .await;
        let deadline = std::time::Instant::now() + crate::support::DEADLINE;
        while admin_get(&running, "/readyz").await.0 != 200 {
            assert!(std::time::Instant::now() < deadline, "never ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let lists = fake.lists(JOBS);
        assert!(!lists.is_empty());
        for list in &lists {
            let selector = list
                .param("labelSelector")
                .map(|selector| selector.replace("%2F", "/").replace("%3D", "="));
            assert_eq!(
                selector.as_deref(),
                Some("gpu-guard.io/device-failures=true")
            );
        }

        let client = client(&pair.ca_pem);
        let review = |job: &str| job_pod_review(job).to_string().into_bytes();
        let (status, text) = post(&client, &url(&running, "/mutate"), review("train")).await;
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).expect("JSON");
        let mut pod = job_pod_review("train")["request"]["object"].clone();
        json_patch::patch(&mut pod, &sent_patch(&answer["response"])).expect("applies");
        assert_eq!(excluded(&pod), [["gpu-7", "gpu-3"]]);
        let (status, text) = post(&client, &url(&running, "/mutate"), review("eval")).await;
        assert_eq!(status, 200);
        assert!(!text.contains("\"patch\""), "{text}");

        // The controller records a third failure: the next pod avoids that node too.
        let mut record: Memory = serde_json::from_str(&memory()).expect("a memory");
        record.record(gpu_guard_core::memory::DeviceFailure {
            node: "gpu-11".to_owned(),
            pod: "train-x1".to_owned(),
            devices: Vec::new(),
            at: Some("2026-12-04T10:40:00Z".parse().expect("a time")),
            cause: "exit code 74 in container main".to_owned(),
        });
        fake.put(JOBS, job("train", true, &record.to_annotation()));
        let mut latest = Vec::new();
        for _ in 0..500 {
            let (_, text) = post(&client, &url(&running, "/mutate"), review("train")).await;
            let answer: Value = serde_json::from_str(&text).expect("JSON");
            let mut pod = job_pod_review("train")["request"]["object"].clone();
            json_patch::patch(&mut pod, &sent_patch(&answer["response"])).expect("applies");
            latest = excluded(&pod);
            if latest.first().is_some_and(|nodes| nodes.len() == 3) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(latest, [["gpu-11", "gpu-7", "gpu-3"]]);

        let (_, metrics) = admin_get(&running, "/metrics").await;
        assert!(
            metrics.contains("gpu_guard_failed_node_avoidance_total{outcome=\"excluded\"}"),
            "{metrics}"
        );
        assert!(metrics.contains(
            "gpu_guard_admission_requests_total{webhook=\"mutate\",kind=\"Pod\",operation=\"CREATE\",outcome=\"patched\"}"
        ));
        assert!(metrics.contains("gpu_guard_cluster_cache_synced{resource=\"jobsets\"} 1"));
        assert!(metrics.contains("gpu_guard_cluster_cache_objects{resource=\"jobs\"} 1"));
        running.shutdown().await;
    }
}

/// `mutate --kubeconfig`: the record of the Job in the cluster counts, the input's failed pods
/// recorded over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutate_with_a_kubeconfig_adds_the_clusters_record() {
    use crate::support::fake_api::{Fake, JOBS};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = Fake::start().await;
    fake.set(
        JOBS,
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "ml",
                "labels": {"gpu-guard.io/device-failures": "true"},
                "annotations": {"gpu-guard.io/device-failures":
                    r#"{"total":1,"failures":[{"node":"gpu-1","pod":"train-old","at":"2026-12-04T08:00:00Z","cause":"exit code 74 in container trainer"}]}"#}},
            "spec": {"template": {"spec": {"containers": []}}}}),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = crate::cluster::kubeconfig_for(&fake, dir.path());
    let args = vec![
        "gpu-guard".to_owned(),
        "mutate".to_owned(),
        "--kubeconfig".to_owned(),
        kubeconfig.display().to_string(),
        "-f".to_owned(),
        fixture().display().to_string(),
    ];
    // `mutate` runs its own runtime: call it off this one.
    let report = tokio::task::spawn_blocking(move || crate::support::run_in_process(args))
        .await
        .expect("mutate ran");
    assert_eq!(report.exit_code, 0, "{}", report.stderr);
    let after = documents(&report.stdout);
    assert_eq!(excluded(&after[4]), [["gpu-7", "gpu-3", "gpu-1"]]);
}
