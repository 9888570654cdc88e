//! The whole request path of the mutating webhook without the network: AdmissionReview bytes
//! in, response bytes out (parse, engine, patch derivation and check, serialization).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpu_guard_core::guard::StaticView;
use gpu_guard_core::policy::Policy;
use gpu_guard_webhook::admission::{ReviewOutcome, Webhook, review};
use serde_json::{Value, json};

fn request_path(c: &mut Criterion) {
    let policy = Policy::embedded();
    let view = StaticView::from_policy(&policy.guard.offline);
    let mut group = c.benchmark_group("request");
    for (name, fixture) in [
        ("plain", "001-Job-CREATE-mutate.json"),
        ("sidecar", "009-Job-CREATE-mutate.json"),
        ("existing-policy", "005-Job-CREATE-mutate.json"),
        ("update-passthrough", "017-Job-UPDATE-mutate.json"),
        ("load-test-7k", "../load/job-7k-review.json"),
    ] {
        let body = std::fs::read(format!(
            "{}/../../tests/fixtures/admission/{fixture}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| review(Webhook::Mutate, black_box(&body), &policy, &view).unwrap())
        });
    }
    // The same pod template as `plain`, as the one replicated Job of a JobSet (the target: a
    // JobSet review costs at most twice a Job review of the same template).
    let jobset = jobset_review(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/admission/001-Job-CREATE-mutate.json"
        ))
        .unwrap(),
    );
    group.throughput(Throughput::Bytes(jobset.len() as u64));
    group.bench_function("jobset-of-plain", |b| {
        b.iter(|| review(Webhook::Mutate, black_box(&jobset), &policy, &view).unwrap())
    });
    // The same Job whose container claims its GPU through DRA, the claim's template known to
    // the view (the target: at most 1.5 times `plain`).
    let (claimed, dra_view) = dra_review(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/admission/001-Job-CREATE-mutate.json"
        ))
        .unwrap(),
        &policy,
    );
    // Measured only as what it claims to be: a review that patches.
    for (body, view) in [(&jobset, &view), (&claimed, &dra_view)] {
        let outcome = review(Webhook::Mutate, body, &policy, view)
            .unwrap()
            .outcome;
        assert_eq!(outcome, ReviewOutcome::Patched);
    }
    group.throughput(Throughput::Bytes(claimed.len() as u64));
    group.bench_function("dra-claim", |b| {
        b.iter(|| review(Webhook::Mutate, black_box(&claimed), &policy, &dra_view).unwrap())
    });
    group.finish();
}

/// The Job review `body` with its container's `nvidia.com/gpu` limit replaced by a DRA claim
/// from a ResourceClaimTemplate asking for `gpu.nvidia.com`, and a view that knows the template.
fn dra_review(body: &[u8], policy: &Policy) -> (Vec<u8>, StaticView) {
    let mut review: Value = serde_json::from_slice(body).unwrap();
    let object = &mut review["request"]["object"];
    let namespace = object["metadata"]["namespace"].clone();
    let pod = &mut object["spec"]["template"]["spec"];
    pod["containers"][0]["resources"] = json!({"claims": [{"name": "gpus"}]});
    pod["resourceClaims"] = json!([{"name": "gpus", "resourceClaimTemplateName": "one-gpu"}]);
    let mut view = StaticView::from_policy(&policy.guard.offline);
    view.add_dra_object(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    }));
    (serde_json::to_vec(&review).unwrap(), view)
}

/// The Job review `body` turned into the review of a JobSet whose one replicated Job has the
/// Job's spec.
fn jobset_review(body: &[u8]) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(body).unwrap();
    let request = &mut review["request"];
    let job = request["object"].clone();
    let gvk = json!({"group": "jobset.x-k8s.io", "version": "v1alpha2", "kind": "JobSet"});
    let gvr = json!({"group": "jobset.x-k8s.io", "version": "v1alpha2", "resource": "jobsets"});
    request["kind"] = gvk.clone();
    request["requestKind"] = gvk;
    request["resource"] = gvr.clone();
    request["requestResource"] = gvr;
    request["object"] = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": job["metadata"],
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 4,
            "template": {"spec": job["spec"]}}]}
    });
    serde_json::to_vec(&review).unwrap()
}

criterion_group!(benches, request_path);
criterion_main!(benches);
