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
fn excluded(pod: &Value) -> Vec<Vec<String>> {
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
