//! The whole request path of the mutating webhook without the network: AdmissionReview bytes
//! in, response bytes out (parse, engine, patch derivation and check, serialization).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpu_guard::admission::{Webhook, review};
use gpu_guard::guard::StaticView;
use gpu_guard::policy::Policy;
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
        let body = std::fs::read(format!("tests/fixtures/admission/{fixture}")).unwrap();
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| review(Webhook::Mutate, black_box(&body), &policy, &view).unwrap())
        });
    }
    // The same pod template as `plain`, as the one replicated Job of a JobSet (the target: a
    // JobSet review costs at most twice a Job review of the same template).
    let jobset = jobset_review(
        &std::fs::read("tests/fixtures/admission/001-Job-CREATE-mutate.json").unwrap(),
    );
    group.throughput(Throughput::Bytes(jobset.len() as u64));
    group.bench_function("jobset-of-plain", |b| {
        b.iter(|| review(Webhook::Mutate, black_box(&jobset), &policy, &view).unwrap())
    });
    group.finish();
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
