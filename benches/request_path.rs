//! The whole request path of the mutating webhook without the network: AdmissionReview bytes
//! in, response bytes out (parse, engine, patch derivation and check, serialization).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpu_guard::admission::{Webhook, review};
use gpu_guard::guard::StaticView;
use gpu_guard::policy::Policy;

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
    group.finish();
}

criterion_group!(benches, request_path);
criterion_main!(benches);
