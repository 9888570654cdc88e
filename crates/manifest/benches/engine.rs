//! Benchmarks of the request path and of the offline CLI.
//!
//! - `engine/*`: [`mutate_job`] alone on typed Jobs from the admission fixtures (a plain GPU
//!   Job, a Job with native sidecars, a Job that already has a podFailurePolicy to merge with);
//! - `object/plain`: [`object::mutate_object`] on the raw JSON object, i.e. what the webhook
//!   does per request: decode, engine, JSON Patch derivation and the check that it applies;
//! - `cli/yaml-roundtrip`: what `gpu-guard mutate -f` does with a 100-document YAML stream:
//!   parse, mutate each document (engine + patch applied to the raw document), render YAML.
//!
//! Fixtures are read and decoded once, before any timing.
//!
//! Run: `cargo bench --bench engine -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpu_guard_core::devices::NoDraFacts;
use gpu_guard_core::mutate::mutate_job;
use gpu_guard_core::mutate::object;
use gpu_guard_core::mutate::patch;
use gpu_guard_core::policy::Policy;
use gpu_guard_manifest::{self as manifest, Format};
use k8s_openapi::api::batch::v1::Job;
use serde_json::Value;

/// The admission fixtures whose object is a Job, in file order.
const JOB_FIXTURES: [&str; 7] = [
    "001-Job-CREATE-mutate.json",
    "003-Job-CREATE-mutate.json",
    "005-Job-CREATE-mutate.json",
    "007-Job-CREATE-mutate.json",
    "009-Job-CREATE-mutate.json",
    "017-Job-UPDATE-mutate.json",
    "019-Job-CREATE-mutate.json",
];

/// Documents in the `cli/yaml-roundtrip` stream.
const STREAM_DOCUMENTS: usize = 100;

/// `.request.object` of an AdmissionReview fixture, as raw JSON.
fn admission_object(file: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/admission")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut review: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    review
        .pointer_mut("/request/object")
        .map(Value::take)
        .unwrap_or_else(|| panic!("{} has no .request.object", path.display()))
}

fn typed_job(file: &str) -> Job {
    serde_json::from_value(admission_object(file))
        .unwrap_or_else(|e| panic!("{file}: the object is not a Job: {e}"))
}

/// What `gpu-guard mutate` does with one document (without the `List` recursion): run the
/// engine on the raw object and apply its patch; every other kind passes through.
fn mutate_like_the_cli(value: Value, policy: &Policy) -> Value {
    match object::mutate_object(&value, policy, &NoDraFacts) {
        Some(Ok(mutation)) if !mutation.patch.is_empty() => {
            patch::apply(&value, &mutation.patch).expect("the engine's patch applies")
        }
        Some(Err(error)) => panic!("a fixture Job does not decode: {error}"),
        _ => value,
    }
}

fn engine(c: &mut Criterion) {
    let policy = Policy::embedded();
    let mut group = c.benchmark_group("engine");
    for (name, file) in [
        ("plain", "001-Job-CREATE-mutate.json"),
        ("sidecar", "009-Job-CREATE-mutate.json"),
        ("existing-policy", "005-Job-CREATE-mutate.json"),
    ] {
        let job = typed_job(file);
        let outcome = mutate_job(&job, &policy);
        assert!(outcome.is_changed(), "{file}: the engine changes the Job");
        group.bench_function(name, |b| {
            b.iter(|| mutate_job(black_box(&job), black_box(&policy)));
        });
    }
    group.finish();
}

fn raw_object(c: &mut Criterion) {
    let policy = Policy::embedded();
    let raw = admission_object("001-Job-CREATE-mutate.json");
    let mutation = object::mutate_object(&raw, &policy, &NoDraFacts)
        .expect("a Job is mutable")
        .expect("the fixture decodes");
    assert!(!mutation.patch.is_empty(), "the engine patches the Job");

    let mut group = c.benchmark_group("object");
    group.bench_function("plain", |b| {
        b.iter(|| object::mutate_object(black_box(&raw), black_box(&policy), &NoDraFacts));
    });
    group.finish();
}

fn cli(c: &mut Criterion) {
    let policy = Policy::embedded();
    let jobs: Vec<Value> = JOB_FIXTURES.iter().map(|f| admission_object(f)).collect();
    let stream: Vec<Value> = jobs
        .iter()
        .cycle()
        .take(STREAM_DOCUMENTS)
        .cloned()
        .collect();
    let text = manifest::render(&stream, Format::Yaml);

    // The stream reads back as 100 Jobs, and the round trip changes them.
    let (documents, error) = manifest::parse(&text, "bench.yaml");
    assert!(error.is_empty(), "the stream parses: {error:?}");
    assert_eq!(documents.len(), STREAM_DOCUMENTS);
    let once: Vec<Value> = documents
        .into_iter()
        .map(|document| mutate_like_the_cli(document.value, &policy))
        .collect();
    assert_ne!(once, stream, "the round trip mutates the Jobs");

    let mut group = c.benchmark_group("cli");
    group.throughput(Throughput::Elements(STREAM_DOCUMENTS as u64));
    group.bench_function("yaml-roundtrip", |b| {
        b.iter(|| {
            let (documents, error) = manifest::parse(black_box(&text), "bench.yaml");
            debug_assert!(error.is_empty());
            let mutated: Vec<Value> = documents
                .into_iter()
                .map(|document| mutate_like_the_cli(document.value, &policy))
                .collect();
            manifest::render(&mutated, Format::Yaml)
        });
    });
    group.finish();
}

criterion_group!(benches, engine, raw_object, cli);
criterion_main!(benches);
