//! The GPU-node guard: one decision on an already decoded workload (the budget is 10 µs), the
//! decode from JSON, and the whole `/validate` request path on a real Pod review.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_guard_core::guard::{GuardedKind, StaticView, Workload, judge};
use gpu_guard_core::policy::{OfflinePriorityClass, Policy};
use gpu_guard_webhook::admission::{Webhook, review};
use serde_json::{Value, json};

fn guard(c: &mut Criterion) {
    let mut policy = Policy::embedded();
    policy
        .guard
        .offline
        .priority_classes
        .push(OfflinePriorityClass {
            name: "gpu-high".into(),
            value: 100_000,
            global_default: false,
        });
    let mut view = StaticView::from_policy(&policy.guard.offline);
    view.add_node(
        serde_json::from_value(json!({"metadata": {"name": "gpu-7",
            "labels": {"nvidia.com/gpu.present": "true"}},
            "status": {"capacity": {"cpu": "96", "nvidia.com/gpu": "8"}}}))
        .unwrap(),
    );
    // A notebook that targets GPU nodes four ways without priority: a denial with its message.
    let notebook = json!({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "notebook", "namespace": "research"},
    "spec": {"template": {"spec": {
        "nodeName": "gpu-7",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]}]}]}}},
        "containers": [{"name": "nb", "image": "jupyter", "resources": {"limits": {"cpu": "2"}}}]
    }}}});
    // A training job that passes through its class.
    let training = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
        "spec": {"template": {"spec": {"priorityClassName": "gpu-high", "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "t",
                "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "32"}}}]}}}});

    let mut group = c.benchmark_group("guard");
    for (name, kind, object) in [
        (
            "decide-denied-4-reasons",
            GuardedKind::Deployment,
            &notebook,
        ),
        ("decide-allowed-gpu-job", GuardedKind::Job, &training),
    ] {
        let workload = Workload::from_value(kind, object).unwrap();
        group.bench_function(name, |b| {
            b.iter(|| {
                let verdict = judge(
                    kind,
                    "research",
                    black_box(&workload),
                    &policy.guard,
                    &policy.devices,
                    &view,
                )
                .unwrap();
                // A denial is only useful with its message: build it too.
                if let gpu_guard_core::guard::Verdict::Violation(violation) = &verdict {
                    black_box(violation.message());
                }
                verdict
            })
        });
    }
    let text = notebook.to_string();
    group.bench_function("decode-deployment", |b| {
        b.iter(|| Workload::from_json(GuardedKind::Deployment, black_box(&text)).unwrap())
    });
    group.finish();

    let mut request = c.benchmark_group("validate-request");
    let mut body: Value = serde_json::from_slice(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/admission/016-Pod-CREATE-validate.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let allowed = body.to_string().into_bytes();
    body["request"]["object"]["spec"]["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "nvidia.com/gpu", "operator": "Exists"}));
    let denied = body.to_string().into_bytes();
    for (name, body) in [("pod-allowed", &allowed), ("pod-denied", &denied)] {
        request.bench_function(name, |b| {
            b.iter(|| review(Webhook::Validate, black_box(body), &policy, &view).unwrap())
        });
    }
    request.finish();
}

criterion_group!(benches, guard);
criterion_main!(benches);
