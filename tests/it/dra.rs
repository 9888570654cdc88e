//! GPUs claimed through Dynamic Resource Allocation (`resource.k8s.io/v1`): the webhook, the
//! guard and the CLI see a container that names a claim of a listed DeviceClass as a device
//! user, resolve claims from what they know (the cache, the documents of the input) and never
//! guess a claim they cannot resolve. Fixtures: `tests/fixtures/dra/` (NVIDIA's DRA driver
//! quickstart, named in each file).

use assert_cmd::Command;
use base64::Engine as _;
use gpu_guard_core::guard::StaticView;
use gpu_guard_core::mutate::patch;
use gpu_guard_core::policy::Policy;
use gpu_guard_webhook::admission::{ReviewOutcome, Reviewed, Webhook, review};
use json_patch::Patch;
use serde_json::{Value, json};

use crate::reviews;
use reviews::{JOB, JOBSET, review_of};

const POD: (&str, &str, &str, &str) = ("", "v1", "Pod", "pods");

fn dra_fixture(name: &str) -> String {
    format!("{}/tests/fixtures/dra/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The documents of a fixture, as JSON.
fn documents(name: &str) -> Vec<Value> {
    let path = dra_fixture(name);
    let (documents, error) =
        gpu_guard_manifest::parse(&std::fs::read_to_string(&path).unwrap(), &path);
    assert!(error.is_empty(), "{error:?}");
    documents
        .into_iter()
        .map(|document| document.value)
        .collect()
}

fn by_kind(documents: &[Value], kind: &str) -> Value {
    documents
        .iter()
        .find(|document| document["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
        .clone()
}

/// The offline view, knowing `objects` (ResourceClaimTemplates and the like).
fn view_knowing(policy: &Policy, objects: &[Value]) -> StaticView {
    let mut view = StaticView::from_policy(&policy.guard.offline);
    for object in objects {
        assert!(view.add_dra_object(object), "{object}");
    }
    view
}

fn reviewed(webhook: Webhook, body: &Value, view: &StaticView) -> Reviewed {
    let policy = Policy::embedded();
    review(webhook, body.to_string().as_bytes(), &policy, view).expect("reviewed")
}

fn response(reviewed: &Reviewed) -> Value {
    serde_json::from_slice::<Value>(&reviewed.body).unwrap()["response"].clone()
}

fn patched(object: &Value, reviewed: &Reviewed) -> Value {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response(reviewed)["patch"].as_str().expect("a patch"))
        .unwrap();
    let patch: Patch = serde_json::from_slice(&bytes).unwrap();
    patch::apply(object, &patch).expect("the patch applies")
}

fn warnings(reviewed: &Reviewed) -> String {
    response(reviewed)["warnings"].to_string()
}

#[test]
fn a_job_whose_container_claims_gpus_from_a_template_is_protected() {
    let policy = Policy::embedded();
    let documents = documents("job-with-claim-template.yaml");
    let job = by_kind(&documents, "Job");
    let view = view_knowing(&policy, &[by_kind(&documents, "ResourceClaimTemplate")]);
    let reviewed = reviewed(Webhook::Mutate, &review_of(JOB, &job, None, "alice"), &view);
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched);
    let job = patched(&job, &reviewed);
    let rules = job["spec"]["podFailurePolicy"]["rules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|rule| rule["onExitCodes"]["containerName"] == "ctr0"),
        "the claiming container's device exit codes: {rules:?}"
    );
    assert_eq!(job["spec"]["podReplacementPolicy"], "Failed");
    assert!(
        gpu_guard_core::api_rules::job::check_job(&serde_json::from_value(job).unwrap()).is_empty()
    );
}

#[test]
fn an_unresolved_claim_leaves_the_job_unchanged_and_says_so() {
    let policy = Policy::embedded();
    let job = by_kind(&documents("job-with-claim-template.yaml"), "Job");
    let view = view_knowing(&policy, &[]);
    let reviewed = reviewed(Webhook::Mutate, &review_of(JOB, &job, None, "alice"), &view);
    assert_eq!(reviewed.outcome, ReviewOutcome::Allowed);
    assert!(response(&reviewed)["patch"].is_null());
    let warnings = warnings(&reviewed);
    assert!(
        warnings.contains("ResourceClaimTemplate gpu-test1/double-gpu is not known"),
        "{warnings}"
    );
}

#[test]
fn a_claim_of_a_class_the_policy_does_not_list_is_not_a_device() {
    let policy = Policy::embedded();
    let documents = documents("job-with-claim-template.yaml");
    let job = by_kind(&documents, "Job");
    let mut template = by_kind(&documents, "ResourceClaimTemplate");
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] =
        json!("nic.example.com");
    let view = view_knowing(&policy, &[template]);
    let reviewed = reviewed(Webhook::Mutate, &review_of(JOB, &job, None, "alice"), &view);
    assert_eq!(reviewed.outcome, ReviewOutcome::Allowed);
    assert!(response(&reviewed)["patch"].is_null());
    assert_eq!(
        warnings(&reviewed),
        "null",
        "nothing unresolved, nothing to say"
    );
}

#[test]
fn the_guard_sees_a_dra_gpu_pod_as_a_device_user_and_never_guesses_an_unknown_claim() {
    let policy = Policy::embedded();
    let documents = documents("nvidia-gpu-test-count.yaml");
    let pod = by_kind(&documents, "Pod");
    let body = review_of(POD, &pod, None, "alice");
    // Known: a device user tolerating the GPU taint, judged by the device minimum (0).
    let known = view_knowing(&policy, &[by_kind(&documents, "ResourceClaimTemplate")]);
    let allowed = reviewed(Webhook::Validate, &body, &known);
    assert_eq!(allowed.outcome, ReviewOutcome::Allowed);
    assert_eq!(response(&allowed)["allowed"], true);
    // Unknown: as a device user it would pass, as a non-device user it would not: not judged,
    // and said so (before DRA support, it was denied as "without using a device").
    let unknown = reviewed(Webhook::Validate, &body, &view_knowing(&policy, &[]));
    assert_eq!(response(&unknown)["allowed"], true);
    let warnings = warnings(&unknown);
    assert!(warnings.contains("priority not checked"), "{warnings}");
    assert!(warnings.contains("double-gpu"), "{warnings}");
    // Without the toleration nothing targets GPU nodes but the claim itself: still a device
    // user when known, allowed.
    let mut untolerated = pod.clone();
    untolerated["spec"]
        .as_object_mut()
        .unwrap()
        .remove("tolerations");
    let body = review_of(POD, &untolerated, None, "alice");
    assert_eq!(
        response(&reviewed(Webhook::Validate, &body, &known))["allowed"],
        true
    );
}

#[test]
fn a_jobset_whose_workers_claim_gpus_gets_the_gang_policy() {
    let policy = Policy::embedded();
    let documents = documents("job-with-claim-template.yaml");
    let job = by_kind(&documents, "Job");
    let jobset = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "gang", "namespace": "gpu-test1"},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2,
            "template": {"spec": job["spec"]}}]}
    });
    let view = view_knowing(&policy, &[by_kind(&documents, "ResourceClaimTemplate")]);
    let reviewed = reviewed(
        Webhook::Mutate,
        &review_of(JOBSET, &jobset, None, "alice"),
        &view,
    );
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched);
    let jobset = patched(&jobset, &reviewed);
    let rules = jobset["spec"]["failurePolicy"]["rules"].as_array().unwrap();
    assert!(
        rules.iter().any(|rule| rule["action"] == "RestartJobSet"),
        "{rules:?}"
    );
    let child = &jobset["spec"]["replicatedJobs"][0]["template"]["spec"];
    // Every device rule fails the child Job (the JobSet restarts its gang); the budget rule
    // counts.
    assert!(
        child["podFailurePolicy"]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .all(|rule| rule["action"] == "FailJob"
                || (rule["action"] == "Count"
                    && rule["onPodConditions"][0]["type"]
                        == "gpu-guard.io/DeviceRetriesExhausted"))
    );
}

fn cli() -> Command {
    let mut command = Command::cargo_bin("gpu-guard").unwrap();
    command.env_remove("GPU_GUARD_POLICY");
    command
}

#[test]
fn mutate_resolves_a_claim_template_shipped_after_its_job() {
    let output = cli()
        .args(["mutate", "-f", &dra_fixture("job-with-claim-template.yaml")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let (out, error) =
        gpu_guard_manifest::parse(&String::from_utf8_lossy(&output.stdout), "stdout");
    assert!(error.is_empty());
    let job = &out[0].value;
    assert_eq!(
        job["spec"]["podFailurePolicy"]["rules"][3]["onExitCodes"]["containerName"],
        "ctr0"
    );
    let template = &out[1].value;
    assert_eq!(
        template,
        &by_kind(
            &documents("job-with-claim-template.yaml"),
            "ResourceClaimTemplate"
        ),
        "the template is written unchanged"
    );
}

#[test]
fn mutate_warns_about_a_claim_it_cannot_resolve_and_leaves_the_job_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.yaml");
    let job = by_kind(&documents("job-with-claim-template.yaml"), "Job");
    std::fs::write(&path, serde_json::to_string(&job).unwrap()).unwrap();
    let output = cli().args(["mutate", "-f"]).arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "ResourceClaimTemplate gpu-test1/double-gpu is not known (claim \"twogpus\") of \
             container \"ctr0\": not counted as a device"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("unchanged"), "{stderr}");
    let (out, _) = gpu_guard_manifest::parse(&String::from_utf8_lossy(&output.stdout), "stdout");
    assert_eq!(out[0].value, job);
}

#[test]
fn check_allows_nvidias_quickstart_pod_and_reports_an_unknown_claim_as_unjudged() {
    let output = cli()
        .args(["check", "-f", &dra_fixture("nvidia-gpu-test-count.yaml")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("gpu-pod: allowed"), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pod.yaml");
    let pod = by_kind(&documents("nvidia-gpu-test-count.yaml"), "Pod");
    std::fs::write(&path, serde_json::to_string(&pod).unwrap()).unwrap();
    let output = cli()
        .args(["check", "-o", "json", "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let finding = &report["findings"][0];
    assert_eq!(finding["verdict"], "unjudged", "{report:#}");
    assert!(
        finding["message"]
            .as_str()
            .unwrap()
            .contains("ResourceClaimTemplate gpu-test1/double-gpu"),
        "{finding}"
    );
}

// === the controller: DRA pods on a node degraded for their driver ===

use crate::support;

use support::controller::{World, dra_node, namespace, nvidia_dra_slice, policy};
use support::fake_api::{CLAIMS, NAMESPACES, NODES, PODS, RESOURCE_SLICES};

/// An allocated ResourceClaim `ml/<name>`, its devices allocated by `driver` on node `dra-1`.
fn allocated_claim(name: &str, driver: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
           "spec": {"devices": {"requests": [{"name": "gpu",
               "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
           "status": {"allocation": {"devices": {"results": [
               {"request": "gpu", "driver": driver, "pool": "dra-1", "device": "gpu-0"}]}}}})
}

/// A running Job pod `ml/<name>` on node `dra-1`, its container as `resources` says, with
/// `status` merged into its status.
fn dra_pod(name: &str, spec: Value, status: Value) -> Value {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                          "name": "train", "uid": "uid-train", "controller": true}]},
        "spec": {"nodeName": "dra-1", "restartPolicy": "Never"},
        "status": {"phase": "Running"}});
    json_patch::merge(&mut pod["spec"], &spec);
    json_patch::merge(&mut pod["status"], &status);
    pod
}

/// A node whose GPUs come only from NVIDIA's DRA driver degrades (the driver taints one of its 8
/// devices). Its pods that use the driver's devices, through a claim made from a template or
/// through DRA's extended-resource mapping (the pod requests `nvidia.com/gpu`, the scheduler
/// allocates it through a DeviceClass's `extendedResourceName` and names the claim it made in
/// `status.extendedResourceClaimStatus`), are marked and evicted when the node is tainted, like
/// device-plugin pods; a pod whose claim another driver allocated (a NIC) is not.
#[tokio::test]
async fn dra_pods_on_a_node_degraded_for_their_driver_are_marked_and_evicted() {
    let claim_container = json!({"containers": [{"name": "trainer", "image": "cuda",
                               "resources": {"claims": [{"name": "gpus"}]}}],
               "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "one-gpu"}]});
    let objects = vec![
        (NODES, dra_node("dra-1")),
        (RESOURCE_SLICES, nvidia_dra_slice("dra-1", &[3])),
        (NAMESPACES, namespace("ml", true)),
        (
            CLAIMS,
            allocated_claim("templated-gpus-x7k2p", "gpu.nvidia.com"),
        ),
        (
            CLAIMS,
            allocated_claim("mapped-extended-resources-9qz4m", "gpu.nvidia.com"),
        ),
        (
            CLAIMS,
            allocated_claim("nic-user-nics-p2r8d", "sriovnetwork.k8s.cni.cncf.io"),
        ),
        (
            PODS,
            dra_pod(
                "templated",
                claim_container.clone(),
                json!({"resourceClaimStatuses": [
                    {"name": "gpus", "resourceClaimName": "templated-gpus-x7k2p"}]}),
            ),
        ),
        (
            PODS,
            dra_pod(
                "mapped",
                json!({"containers": [{"name": "trainer", "image": "cuda",
                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
                json!({"extendedResourceClaimStatus": {
                    "resourceClaimName": "mapped-extended-resources-9qz4m",
                    "requestMappings": [{"containerName": "trainer",
                        "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]}}),
            ),
        ),
        // Its claim is not known (not allocated, or not listed yet): no driver is guessed.
        (
            PODS,
            dra_pod(
                "unknown-claim",
                claim_container.clone(),
                json!({"resourceClaimStatuses": [
                    {"name": "gpus", "resourceClaimName": "unknown-claim-gpus-4hj2k"}]}),
            ),
        ),
        (
            PODS,
            dra_pod(
                "nic-user",
                claim_container,
                json!({"resourceClaimStatuses": [
                    {"name": "gpus", "resourceClaimName": "nic-user-nics-p2r8d"}]}),
            ),
        ),
    ];
    let mut world = World::start(policy(|p| p.controller.pods.evict_pods = true), objects).await;
    let report = world.pass(0).await;
    assert!(report.marked.is_empty(), "not tainted yet: {report:?}");
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["dra-1"]);
    assert_eq!(report.marked, ["ml/mapped", "ml/templated"]);
    assert_eq!(report.evicted, ["ml/mapped", "ml/templated"]);
    let mark = world
        .fake
        .writes()
        .into_iter()
        .find(|w| w.path == "/api/v1/namespaces/ml/pods/templated/status")
        .expect("the mark");
    let condition = &mark.body["status"]["conditions"][0];
    assert_eq!(condition["reason"], "NodeDeviceDegraded");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("gpu-guard.io/device-degraded=dra_gpu.nvidia.com"),
        "{condition}"
    );
    assert_eq!(world.metrics.pods_marked.get(), 2);
}
