//! End-to-end tests of the `gpu-guard` binary: what a user sees on stdout, stderr and in the
//! exit status. Outputs are parsed (YAML streams, JSON, diffs) and checked field by field.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use gpu_guard_core::api_rules::job::{check_job, check_job_spec};
use gpu_guard_core::field::FieldPath;
use gpu_guard_core::policy::{self, Policy};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use serde::Deserialize;
use serde_json::{Value, json};

// === helpers ===

/// The binary, with no policy inherited from the environment of the test run.
fn gpu_guard() -> Command {
    let mut command = Command::cargo_bin("gpu-guard").expect("the gpu-guard binary is built");
    command.env_remove("GPU_GUARD_POLICY");
    command
}

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A file under `tests/fixtures/cli/`.
fn fixture(name: &str) -> PathBuf {
    manifest_dir().join("tests/fixtures/cli").join(name)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// What a finished run printed, and how it exited.
struct Run {
    stdout: String,
    stderr: String,
    code: Option<i32>,
}

fn run(command: &mut Command) -> Run {
    let output = command.output().expect("the binary runs");
    Run {
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
        code: output.status.code(),
    }
}

impl Run {
    /// Asserts the exit status, showing both streams when it differs.
    fn expect_code(self, code: i32) -> Self {
        assert_eq!(
            self.code,
            Some(code),
            "unexpected exit status\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Every non-empty document of a YAML stream, as JSON values, in order.
fn yaml_documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|document| {
            Value::deserialize(document)
                .unwrap_or_else(|e| panic!("the output is not valid YAML: {e}\n{text}"))
        })
        .filter(|value| !value.is_null())
        .collect()
}

fn single_yaml_document(text: &str) -> Value {
    let mut documents = yaml_documents(text);
    assert_eq!(documents.len(), 1, "expected one document:\n{text}");
    documents.remove(0)
}

fn json_output(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("the output is not JSON: {e}\n{text}"))
}

/// Compares two values including the order of object keys (serde_json's `==` ignores it).
fn assert_same_document(actual: &Value, expected: &Value, what: &str) {
    assert_eq!(
        serde_json::to_string_pretty(actual).unwrap(),
        serde_json::to_string_pretty(expected).unwrap(),
        "{what} must come out exactly as it went in"
    );
}

fn name_of(document: &Value) -> &str {
    document
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("document without metadata.name: {document}"))
}

/// The budget rule: past its budget of free device retries, a workload's failures count.
fn budget_rule() -> Value {
    json!({"action": "Count",
           "onPodConditions": [{"status": "True", "type": "gpu-guard.io/DeviceRetriesExhausted"}]})
}

fn pod_condition_rule(condition: &str) -> Value {
    json!({
        "action": "Ignore",
        "onPodConditions": [{"status": "True", "type": condition}]
    })
}

fn exit_code_rule(action: &str, container: &str, codes: &[i32]) -> Value {
    json!({
        "action": action,
        "onExitCodes": {"containerName": container, "operator": "In", "values": codes}
    })
}

/// The podFailurePolicy the embedded policy injects for device containers with these names.
fn default_failure_policy(containers: &[&str]) -> Value {
    let mut rules = vec![
        pod_condition_rule("DisruptionTarget"),
        budget_rule(),
        pod_condition_rule("gpu-guard.io/DeviceFailure"),
    ];
    rules.extend(
        containers
            .iter()
            .map(|name| exit_code_rule("Ignore", name, &[74, 75, 138])),
    );
    json!({ "rules": rules })
}

/// Asserts the device-Job mutation of the embedded policy on a Job spec (or jobTemplate.spec).
fn assert_device_job_spec(spec: &Value, containers: &[&str]) {
    assert_eq!(
        spec["podFailurePolicy"],
        default_failure_policy(containers),
        "podFailurePolicy of {spec:#}"
    );
    assert_eq!(spec["podReplacementPolicy"], "Failed");
    assert_eq!(spec["template"]["spec"]["restartPolicy"], "Never");
}

fn mutated_annotation(metadata: &Value) -> Option<&str> {
    metadata
        .pointer("/annotations/gpu-guard.io~1mutated")
        .and_then(Value::as_str)
}

// === mutate: the basic case ===

#[test]
fn mutate_injects_the_device_failure_policy_into_a_gpu_job() {
    let path = fixture("gpu-job.yaml");
    let input = single_yaml_document(&read(&path));
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    let job = single_yaml_document(&out.stdout);

    assert_device_job_spec(&job["spec"], &["main"]);
    assert_eq!(
        job["spec"]["podFailurePolicy"]["rules"][3]["onExitCodes"],
        json!({"containerName": "main", "operator": "In", "values": [74, 75, 138]})
    );
    let annotation = mutated_annotation(&job["metadata"]).expect("gpu-guard.io/mutated is set");
    assert!(
        annotation.contains("podFailurePolicy"),
        "the annotation says what changed: {annotation}"
    );
    // Grace period and readiness tolerations of the embedded policy.
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["terminationGracePeriodSeconds"], 60);
    let tolerations: Vec<(&str, i64)> = pod["tolerations"]
        .as_array()
        .expect("tolerations are added")
        .iter()
        .map(|t| {
            (
                t["key"].as_str().unwrap(),
                t["tolerationSeconds"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        tolerations,
        vec![
            ("node.kubernetes.io/not-ready", 900),
            ("node.kubernetes.io/unreachable", 900)
        ]
    );
    // Everything the user wrote is still there, unchanged.
    assert_eq!(job["metadata"]["name"], input["metadata"]["name"]);
    assert_eq!(job["metadata"]["namespace"], "ml");
    assert_eq!(job["spec"]["backoffLimit"], 3);
    assert_eq!(
        pod["containers"],
        input["spec"]["template"]["spec"]["containers"]
    );
    // The summary goes to stderr, naming the object.
    assert!(out.stderr.contains("job/train"), "{}", out.stderr);
}

#[test]
fn the_mutated_job_passes_the_api_server_rules_and_a_second_run_changes_nothing() {
    let first = run(gpu_guard()
        .args(["mutate", "-o", "json", "-f"])
        .arg(fixture("gpu-job.yaml")))
    .expect_code(0);
    let job: Job = serde_json::from_str(&first.stdout).expect("the output is a batch/v1 Job");
    assert!(check_job(&job).is_empty(), "{:?}", check_job(&job));

    let second = run(gpu_guard()
        .args(["mutate", "-o", "json", "-f", "-"])
        .write_stdin(first.stdout.clone()))
    .expect_code(0);
    assert_eq!(
        second.stdout, first.stdout,
        "mutating twice changes nothing"
    );
    assert!(second.stderr.contains("unchanged"), "{}", second.stderr);
}

// === mutate: the shapes of input ===

#[test]
fn a_multi_document_file_keeps_its_order_and_only_device_jobs_change() {
    let path = fixture("multi.yaml");
    let inputs = yaml_documents(&read(&path));
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    let outputs = yaml_documents(&out.stdout);

    let names: Vec<&str> = outputs.iter().map(name_of).collect();
    assert_eq!(
        names,
        vec![
            "train-config",
            "train-gpu",
            "preprocess-cpu",
            "nightly-train"
        ]
    );
    assert_same_document(&outputs[0], &inputs[0], "the ConfigMap");
    assert_same_document(&outputs[2], &inputs[2], "the Job without a device");

    assert_device_job_spec(&outputs[1]["spec"], &["main"]);
    assert!(mutated_annotation(&outputs[1]["metadata"]).is_some());

    let template = &outputs[3]["spec"]["jobTemplate"];
    assert_device_job_spec(&template["spec"], &["main"]);
    assert!(
        mutated_annotation(&template["metadata"]).is_some(),
        "the annotation goes on the Jobs the CronJob creates: {template:#}"
    );
    assert!(
        outputs[3]["spec"].get("podFailurePolicy").is_none(),
        "a CronJob spec has no podFailurePolicy"
    );
    assert_eq!(outputs[3]["spec"]["schedule"], "0 2 * * *");
    assert_eq!(outputs[3]["spec"]["concurrencyPolicy"], "Forbid");

    let cron_job: CronJob = serde_json::from_value(outputs[3].clone()).expect("a CronJob");
    let spec = cron_job.spec.job_template.spec.unwrap();
    let violations = check_job_spec(&spec, &FieldPath::new(["spec", "jobTemplate", "spec"]));
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn a_list_has_its_jobs_mutated_in_place() {
    let path = fixture("list.yaml");
    let input = single_yaml_document(&read(&path));
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    let list = single_yaml_document(&out.stdout);

    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().expect("items");
    let names: Vec<&str> = items.iter().map(name_of).collect();
    assert_eq!(names, vec!["shard-a", "shard-config", "shard-b"]);
    assert_device_job_spec(&items[0]["spec"], &["main"]);
    assert_device_job_spec(&items[2]["spec"], &["main"]);
    assert_same_document(&items[1], &input["items"][1], "the ConfigMap in the List");
}

#[test]
fn a_job_list_from_the_api_has_its_items_mutated_without_gaining_kind_fields() {
    // The API's JobList leaves apiVersion and kind out of its items.
    let job = single_yaml_document(&read(&fixture("gpu-job.yaml")));
    let mut item = job.clone();
    item.as_object_mut().unwrap().shift_remove("apiVersion");
    item.as_object_mut().unwrap().shift_remove("kind");
    let list =
        json!({"apiVersion": "batch/v1", "kind": "JobList", "metadata": {}, "items": [item]});
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.json");
    std::fs::write(&path, serde_json::to_string(&list).unwrap()).unwrap();
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    let mutated = single_yaml_document(&out.stdout);
    let item = &mutated["items"][0];
    assert_device_job_spec(&item["spec"], &["main"]);
    assert!(
        item.get("kind").is_none() && item.get("apiVersion").is_none(),
        "{item}"
    );
    let keys: Vec<&String> = item.as_object().unwrap().keys().collect();
    assert_eq!(keys, vec!["metadata", "spec"], "key order kept");

    // An item that has its apiVersion but no kind keeps its apiVersion.
    let mut with_version = list.clone();
    with_version["items"][0]["apiVersion"] = json!("batch/v1");
    std::fs::write(&path, serde_json::to_string(&with_version).unwrap()).unwrap();
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    let item = &single_yaml_document(&out.stdout)["items"][0];
    assert_eq!(item["apiVersion"], "batch/v1");
    assert!(item.get("kind").is_none());
    assert_device_job_spec(&item["spec"], &["main"]);
}

#[test]
fn a_directory_is_read_file_by_file_in_path_order_and_other_files_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let job = read(&fixture("gpu-job.yaml"));
    std::fs::write(
        dir.path().join("b-second.yaml"),
        job.replace("name: train", "name: second"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("a-first.yaml"),
        job.replace("name: train", "name: first"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("notes.txt"),
        job.replace("name: train", "name: from-txt"),
    )
    .unwrap();

    let out = run(gpu_guard().arg("mutate").arg("-f").arg(dir.path())).expect_code(0);
    let documents = yaml_documents(&out.stdout);
    let names: Vec<&str> = documents.iter().map(name_of).collect();
    assert_eq!(names, vec!["first", "second"], "notes.txt must not be read");
    for document in &documents {
        assert_device_job_spec(&document["spec"], &["main"]);
    }
    assert!(!out.stderr.contains("notes.txt"), "{}", out.stderr);
}

#[test]
fn stdin_is_read_with_dash() {
    let out = run(gpu_guard()
        .args(["mutate", "-f", "-"])
        .write_stdin(read(&fixture("gpu-job.yaml"))))
    .expect_code(0);
    let job = single_yaml_document(&out.stdout);
    assert_device_job_spec(&job["spec"], &["main"]);
    assert!(
        out.stderr.contains("- (document 0) job/train"),
        "stdin is named `-` in messages: {}",
        out.stderr
    );
}

#[test]
fn json_output_is_one_object_or_a_v1_list_of_all_documents() {
    let single = run(gpu_guard()
        .args(["mutate", "-o", "json", "-f"])
        .arg(fixture("gpu-job.yaml")))
    .expect_code(0);
    let job = json_output(&single.stdout);
    assert_eq!(job["kind"], "Job", "one document is printed as itself");
    assert_device_job_spec(&job["spec"], &["main"]);

    let many = run(gpu_guard()
        .args(["mutate", "-o", "json", "-f"])
        .arg(fixture("multi.yaml")))
    .expect_code(0);
    let list = json_output(&many.stdout);
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().expect("items");
    let names: Vec<&str> = items.iter().map(name_of).collect();
    assert_eq!(
        names,
        vec![
            "train-config",
            "train-gpu",
            "preprocess-cpu",
            "nightly-train"
        ]
    );
    // The JSON output carries the same documents as the YAML output.
    let yaml = run(gpu_guard()
        .arg("mutate")
        .arg("-f")
        .arg(fixture("multi.yaml")))
    .expect_code(0);
    assert_eq!(items, &yaml_documents(&yaml.stdout));
}

#[test]
fn json_input_is_accepted() {
    let job = single_yaml_document(&read(&fixture("gpu-job.yaml")));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.json");
    std::fs::write(&path, serde_json::to_string_pretty(&job).unwrap()).unwrap();
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    assert_device_job_spec(&single_yaml_document(&out.stdout)["spec"], &["main"]);
}

// === mutate --diff ===

#[test]
fn diff_shows_the_added_lines_and_nothing_for_an_unchanged_file() {
    let path = fixture("gpu-job.yaml");
    // Exit 1: something would change, as `diff` and `kubectl diff` say it.
    let out = run(gpu_guard().args(["mutate", "--diff", "-f"]).arg(&path)).expect_code(1);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("--- a/") && l.ends_with("gpu-job.yaml")),
        "{}",
        out.stdout
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("+++ b/") && l.ends_with("gpu-job.yaml")),
        "{}",
        out.stdout
    );
    assert!(lines.iter().any(|l| l.starts_with("@@ ")), "{}", out.stdout);
    for added in [
        "+  podFailurePolicy:",
        "+  podReplacementPolicy: Failed",
        "+      terminationGracePeriodSeconds: 60",
    ] {
        assert!(
            lines.contains(&added),
            "missing {added:?} in\n{}",
            out.stdout
        );
    }
    let removed: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
        .collect();
    assert!(removed.is_empty(), "the mutation only adds: {removed:?}");
    assert!(
        !out.stdout.contains("kind: Job\n---"),
        "--diff prints a diff, not the manifests"
    );

    let skipped = run(gpu_guard()
        .args(["mutate", "--diff", "-f"])
        .arg(fixture("skip.yaml")))
    .expect_code(0);
    assert_eq!(skipped.stdout, "", "no diff for an unchanged Job");
    let dir = tempfile::tempdir().unwrap();
    let config_map = dir.path().join("cm.yaml");
    std::fs::write(
        &config_map,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
    )
    .unwrap();
    let out = run(gpu_guard()
        .args(["mutate", "--diff", "-f"])
        .arg(&config_map))
    .expect_code(0);
    assert_eq!(out.stdout, "", "no diff for a file without Jobs");
}

// === mutate: what must not change ===

#[test]
fn unknown_fields_survive_at_every_level() {
    let out = run(gpu_guard()
        .arg("mutate")
        .arg("-f")
        .arg(fixture("unknown-fields.yaml")))
    .expect_code(0);
    let job = single_yaml_document(&out.stdout);
    for pointer in [
        "/futureField",
        "/spec/futureField",
        "/spec/template/spec/futureField",
        "/spec/template/spec/containers/0/futureField",
    ] {
        assert_eq!(
            job.pointer(pointer),
            Some(&json!(1)),
            "{pointer} in {job:#}"
        );
    }
    assert_device_job_spec(&job["spec"], &["main"]);
}

#[test]
fn a_job_annotated_skip_is_left_alone_and_stderr_says_so() {
    let path = fixture("skip.yaml");
    let input = single_yaml_document(&read(&path));
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    let job = single_yaml_document(&out.stdout);
    assert_same_document(&job, &input, "a skipped Job");
    assert!(mutated_annotation(&job["metadata"]).is_none());
    assert!(
        out.stderr.contains("job/hands-off") && out.stderr.contains("skipped"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("gpu-guard.io/skip"), "{}", out.stderr);
}

// === mutate: errors ===

#[test]
fn a_broken_document_is_reported_with_file_document_and_line_and_written_through() {
    let path = fixture("broken-second-document.yaml");
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(2);

    let error = out
        .stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line in {}", out.stderr));
    assert!(error.contains(&path.display().to_string()), "{error}");
    assert!(error.contains("document 1"), "{error}");
    assert!(error.contains("written through unchanged"), "{error}");
    let line: usize = error
        .split("line ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no line number in {error}"));
    assert!(
        (8..=13).contains(&line),
        "line {line} is not in the broken document (lines 8 to 13): {error}"
    );

    // The first document, then the broken one as it came.
    let (first, rest) = out.stdout.split_once("---\n").expect("two documents");
    assert_eq!(name_of(&single_yaml_document(first)), "before-the-break");
    let input = read(&path);
    let broken = &input[input
        .find("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: broken")
        .unwrap()..];
    assert_eq!(rest, broken);
}

#[test]
fn documents_after_a_broken_one_are_still_mutated() {
    let dir = tempfile::tempdir().unwrap();
    let job = read(&fixture("gpu-job.yaml"));
    let path = dir.path().join("three.yaml");
    let broken = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: broken\n";
    std::fs::write(&path, format!("{job}---\n{broken}---\n{job}")).unwrap();
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(2);
    let parts: Vec<&str> = out.stdout.split("---\n").collect();
    assert_eq!(parts.len(), 3, "{}", out.stdout);
    assert_eq!(
        parts[1], broken,
        "the broken document is written as it came"
    );
    for part in [parts[0], parts[2]] {
        assert_device_job_spec(&single_yaml_document(part)["spec"], &["main"]);
    }
    // The broken document's last line: after the Job and the separator, its third line.
    let line = job.lines().count() + 4;
    assert!(
        out.stderr.contains(&format!("document 1, line {line}: ")),
        "the error names the document and line: {}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("summary: 2 object(s): 2 mutated (Job 2); 1 document(s) unreadable"),
        "{}",
        out.stderr
    );
    // -o json cannot hold the broken text: it is left out and the output is still JSON.
    let out = run(gpu_guard().args(["mutate", "-o", "json", "-f"]).arg(&path)).expect_code(2);
    let list = json_output(&out.stdout);
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2));
    assert!(
        out.stderr.contains("left out of the output"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_missing_file_exits_2_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-file.yaml");
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&missing)).expect_code(2);
    assert!(out.stderr.contains("no-such-file.yaml"), "{}", out.stderr);
    assert_eq!(out.stdout, "");

    // The other inputs are still processed.
    let out = run(gpu_guard()
        .arg("mutate")
        .arg("-f")
        .arg(&missing)
        .arg("-f")
        .arg(fixture("gpu-job.yaml")))
    .expect_code(2);
    assert_device_job_spec(&single_yaml_document(&out.stdout)["spec"], &["main"]);
}

#[test]
fn usage_errors_exit_2() {
    let out = run(gpu_guard().args(["mutate", "--no-such-flag", "-f", "x.yaml"])).expect_code(2);
    assert!(out.stderr.contains("--no-such-flag"), "{}", out.stderr);
    assert_eq!(out.stdout, "");

    let out = run(gpu_guard().arg("mutate")).expect_code(2);
    assert!(
        out.stderr.contains("--filename"),
        "-f is required: {}",
        out.stderr
    );

    let out = run(gpu_guard().args(["mutate", "-o", "toml", "-f", "x.yaml"])).expect_code(2);
    assert!(out.stderr.contains("toml"), "{}", out.stderr);
}

#[test]
fn a_job_that_does_not_decode_is_reported_and_passed_through() {
    let path = fixture("undecodable-job.yaml");
    let inputs = yaml_documents(&read(&path));
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(2);

    let error = out
        .stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line in {}", out.stderr));
    assert!(error.contains("job/bad-containers"), "{error}");
    assert!(error.contains("does not decode"), "{error}");

    let outputs = yaml_documents(&out.stdout);
    assert_eq!(outputs.len(), 2);
    assert_same_document(&outputs[0], &inputs[0], "the Job that does not decode");
    assert_eq!(name_of(&outputs[1]), "good");
    assert_device_job_spec(&outputs[1]["spec"], &["main"]);
}

// === generate failure-policy ===

#[test]
fn generate_names_each_device_container_in_its_exit_code_rules() {
    let out = run(gpu_guard().args([
        "generate",
        "failure-policy",
        "--container",
        "trainer",
        "--container",
        "eval",
    ]))
    .expect_code(0);
    let generated = single_yaml_document(&out.stdout);
    assert_eq!(
        generated,
        json!({ "podFailurePolicy": default_failure_policy(&["trainer", "eval"]) })
    );

    let json_out = run(gpu_guard().args([
        "generate",
        "failure-policy",
        "-o",
        "json",
        "--container",
        "trainer",
        "--container",
        "eval",
    ]))
    .expect_code(0);
    assert_eq!(json_output(&json_out.stdout), generated);
}

#[test]
fn generate_without_container_matches_every_container_and_says_so() {
    let out = run(gpu_guard().args(["generate", "failure-policy"])).expect_code(0);
    let generated = single_yaml_document(&out.stdout);
    let rules = generated["podFailurePolicy"]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 4);
    assert_eq!(
        rules[3]["onExitCodes"],
        json!({"operator": "In", "values": [74, 75, 138]})
    );
    assert!(out.stderr.contains("--container"), "{}", out.stderr);
}

#[test]
fn generate_per_index_turns_fail_job_rules_into_fail_index() {
    let policy = fixture("policy-fail-job.yaml");
    let per_index = run(gpu_guard().arg("--policy").arg(&policy).args([
        "generate",
        "failure-policy",
        "--per-index",
        "--container",
        "main",
    ]))
    .expect_code(0);
    let rules = single_yaml_document(&per_index.stdout)["podFailurePolicy"]["rules"].clone();
    assert_eq!(
        rules,
        json!([
            pod_condition_rule("DisruptionTarget"),
            budget_rule(),
            pod_condition_rule("gpu-guard.io/DeviceFailure"),
            exit_code_rule("Ignore", "main", &[74, 75, 138]),
            exit_code_rule("FailIndex", "main", &[126, 127]),
        ])
    );

    let whole_job = run(gpu_guard().arg("--policy").arg(&policy).args([
        "generate",
        "failure-policy",
        "--container",
        "main",
    ]))
    .expect_code(0);
    let rules = single_yaml_document(&whole_job.stdout)["podFailurePolicy"]["rules"].clone();
    assert_eq!(rules[4], exit_code_rule("FailJob", "main", &[126, 127]));
}

#[test]
fn generate_falls_back_from_container_names_with_a_warning_when_the_rules_do_not_fit() {
    // One rule per container would be 3 + 25 rules, over the API server's 20.
    let mut command = gpu_guard();
    command.args(["generate", "failure-policy"]);
    for index in 1..=25 {
        command.arg("--container").arg(format!("worker-{index}"));
    }
    let out = run(&mut command).expect_code(0);
    assert_eq!(
        single_yaml_document(&out.stdout)["podFailurePolicy"]["rules"],
        json!([
            pod_condition_rule("DisruptionTarget"),
            budget_rule(),
            pod_condition_rule("gpu-guard.io/DeviceFailure"),
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [74, 75, 138]}},
        ])
    );
    assert_eq!(
        out.stderr,
        "warning: 25 device containers would need 28 rules (limit 20): exit-code rules match \
         every container, without containerName\n"
    );
}

#[test]
fn generate_refuses_container_names_a_pod_cannot_have() {
    let out = run(gpu_guard().args([
        "generate",
        "failure-policy",
        "--container",
        "Bad_Name!",
        "--container",
        "eval",
        "--container",
        "eval",
    ]))
    .expect_code(2);
    assert_eq!(out.stdout, "");
    assert_eq!(
        out.stderr,
        "error: --container \"Bad_Name!\": a container name must be a lowercase RFC 1123 label: \
         at most 63 lower case alphanumeric characters or '-', starting and ending with an \
         alphanumeric character (e.g. 'my-name')\n\
         error: --container \"eval\" is given more than once: the containers of a pod must have \
         different names\n"
    );
}

// === what people are told ===

/// The binary with no cluster configuration from the environment of the test run.
fn without_cluster_configuration<'a>(command: &'a mut Command, home: &Path) -> &'a mut Command {
    command
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("GPU_GUARD_KUBECONFIG")
        .env_remove("GPU_GUARD_NO_CLUSTER")
}

#[test]
fn a_command_without_a_cluster_names_only_its_own_flags_and_logs_to_a_pipe_without_colour() {
    let home = tempfile::tempdir().unwrap();
    // `controller` has no --no-cluster: it is not offered.
    let mut controller = gpu_guard();
    controller.arg("controller");
    let out = run(without_cluster_configuration(&mut controller, home.path())).expect_code(1);
    assert!(
        out.stderr.contains("pass a kubeconfig with --kubeconfig"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("--no-cluster"), "{}", out.stderr);
    assert!(
        !out.stderr.contains('\u{1b}'),
        "escape codes: {:?}",
        out.stderr
    );
    // Asked for, colour is there even in a pipe.
    let mut coloured = gpu_guard();
    coloured.args(["controller", "--log-color", "always"]);
    let out = run(without_cluster_configuration(&mut coloured, home.path())).expect_code(1);
    assert!(out.stderr.contains('\u{1b}'), "no colour: {:?}", out.stderr);

    // `serve` with a kubeconfig it cannot use: both ways out are its own flags.
    let kubeconfig = home.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
    let mut serve = gpu_guard();
    serve
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--ca-bundle-file")
        .arg(home.path().join("ca.crt"));
    without_cluster_configuration(&mut serve, home.path()).env("KUBECONFIG", &kubeconfig);
    let out = run(&mut serve).expect_code(1);
    assert!(
        out.stderr.contains("--kubeconfig")
            && out
                .stderr
                .contains("or run without a cluster with --no-cluster"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains('\u{1b}'),
        "escape codes: {:?}",
        out.stderr
    );
}

#[test]
fn a_job_of_the_wrong_types_is_reported_with_its_field_and_no_rust_type() {
    let input = "\
apiVersion: batch/v1
kind: Job
metadata: {name: soon}
spec:
  activeDeadlineSeconds: soon
  template: {spec: {restartPolicy: Never, containers: [{name: main}]}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: huge}
spec:
  parallelism: 5000000000
  template: {spec: {restartPolicy: Never, containers: [{name: main}]}}
";
    let out = run(gpu_guard().args(["mutate", "-f", "-"]).write_stdin(input));
    assert_ne!(out.code, Some(0), "{}", out.stderr);
    for expected in [
        "spec.activeDeadlineSeconds (line 5): expected a whole number, found the string \"soon\"",
        "spec.parallelism (line 12): expected a whole number from -2147483648 to 2147483647, \
         found 5000000000",
    ] {
        assert!(out.stderr.contains(expected), "{expected}\n{}", out.stderr);
    }
    for rust in ["i64", "i32", "u128", "Some(", "struct "] {
        assert!(!out.stderr.contains(rust), "{rust}: {}", out.stderr);
    }
}

#[test]
fn a_job_left_unchanged_is_not_told_of_changes() {
    // No restartPolicy: the API server refuses this Job whatever gpu-guard does.
    let input = "\
apiVersion: batch/v1
kind: Job
metadata: {name: unset}
spec:
  template:
    spec:
      containers: [{name: main, resources: {limits: {nvidia.com/gpu: 1}}}]
";
    let out = run(gpu_guard().args(["mutate", "-f", "-"]).write_stdin(input)).expect_code(0);
    assert_same_document(
        &single_yaml_document(&out.stdout),
        &single_yaml_document(input),
        "the Job left unchanged",
    );
    assert!(!out.stderr.contains("raised"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("Job left unchanged: the API server will reject it as it is"),
        "{}",
        out.stderr
    );
}

// === policy ===

#[test]
fn policy_check_accepts_valid_files() {
    for path in [
        fixture("policy-valid.yaml"),
        fixture("policy-fail-job.yaml"),
        manifest_dir().join("policies/default.yaml"),
        manifest_dir().join("policies/strict.yaml"),
        manifest_dir().join("policies/audit-only.yaml"),
        manifest_dir().join("policies/in-place-restart.yaml"),
    ] {
        let out = run(gpu_guard().args(["policy", "check"]).arg(&path)).expect_code(0);
        assert!(out.stdout.contains("valid"), "{}", out.stdout);
        assert_eq!(out.stderr, "");
    }
}

#[test]
fn policy_check_refuses_a_broken_file_with_file_line_and_field() {
    // Both an exit code 0 and a misspelt key: the file is refused, the unknown key reported.
    let path = fixture("policy-broken.yaml");
    let out = run(gpu_guard().args(["policy", "check"]).arg(&path)).expect_code(1);
    let place = format!("{}:8:", path.display());
    assert!(
        out.stderr.contains(&place),
        "expected {place} in\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("mutation.podFailurePolicy.enabeld"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "");

    // A semantic error (exit code 0), and restart-rule codes that overlap the device codes:
    // each refused at the line and column of the offending value, with its field.
    for (file, line, field) in [
        (
            "policy-bad-exit-code.yaml",
            "7:21:",
            "mutation.podFailurePolicy.exitCodeRules[0].codes[1]",
        ),
        (
            "policy-restart-overlap.yaml",
            "7:21:",
            "mutation.restartRules.exitCodes[1]: exit code 75 is in \
             mutation.podFailurePolicy.exitCodeRules[0]",
        ),
    ] {
        let path = fixture(file);
        let out = run(gpu_guard().args(["policy", "check"]).arg(&path)).expect_code(1);
        let place = format!("{}:{line} {field}", path.display());
        assert!(
            out.stderr.contains(&place),
            "expected {place} in\n{}",
            out.stderr
        );
    }

    // A file that cannot be read is an input error (2), not a refused policy (1).
    let missing = run(gpu_guard().args(["policy", "check", "no-such-policy.yaml"])).expect_code(2);
    assert!(
        missing.stderr.contains("no-such-policy.yaml"),
        "{}",
        missing.stderr
    );
}

#[test]
fn in_place_restart_rules_go_into_the_device_containers_of_every_document() {
    let path = fixture("in-place-restart.yaml");
    let profile = manifest_dir().join("policies/in-place-restart.yaml");
    let mutate = |input: &Path| {
        run(gpu_guard()
            .arg("--policy")
            .arg(&profile)
            .arg("mutate")
            .arg("-f")
            .arg(input))
        .expect_code(0)
    };
    let out = mutate(&path);
    let outputs = yaml_documents(&out.stdout);
    let names: Vec<&str> = outputs.iter().map(name_of).collect();
    assert_eq!(
        names,
        [
            "train-gpu",
            "train-own-rules",
            "nightly-train",
            "preprocess-cpu"
        ]
    );
    let restart_70_140 =
        json!({"action": "Restart", "exitCodes": {"operator": "In", "values": [70, 140]}});

    // The GPU container gets an explicit restartPolicy and the rule; the CPU container nothing.
    let containers = &outputs[0]["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers[0]["restartPolicy"], "Never");
    assert_eq!(containers[0]["restartPolicyRules"], json!([restart_70_140]));
    assert!(
        containers[1].get("restartPolicy").is_none(),
        "{containers:#}"
    );
    assert!(containers[1].get("restartPolicyRules").is_none());
    // The device rules of the podFailurePolicy are still there, and disjoint from 70 and 140.
    assert_device_job_spec(&outputs[0]["spec"], &["main"]);

    // A container's own rule stays first and keeps 70; gpu-guard's rule adds only 140.
    let trainer = &outputs[1]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        trainer["restartPolicyRules"],
        json!([
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [3, 70]}},
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [140]}},
        ])
    );

    let template = &outputs[2]["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(
        template["containers"][0]["restartPolicyRules"],
        json!([restart_70_140])
    );
    assert!(
        mutated_annotation(&outputs[2]["spec"]["jobTemplate"]["metadata"])
            .is_some_and(|summary| summary.contains("container main restart rule")),
        "{:#}",
        outputs[2]
    );
    assert!(
        outputs[3]["spec"]["template"]["spec"]["containers"][0]
            .get("restartPolicyRules")
            .is_none()
    );

    for output in &outputs[..2] {
        let job: Job = serde_json::from_value(output.clone()).expect("a Job");
        assert_eq!(check_job(&job), Vec::new(), "{output:#}");
    }

    // A second run on the output changes nothing.
    let dir = tempfile::tempdir().unwrap();
    let again = dir.path().join("mutated.yaml");
    std::fs::write(&again, &out.stdout).unwrap();
    assert_eq!(yaml_documents(&mutate(&again).stdout), outputs);

    // Without the profile (the default policy), no restart rules at all.
    let default = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    for output in yaml_documents(&default.stdout) {
        let pod = output
            .pointer("/spec/template/spec")
            .or_else(|| output.pointer("/spec/jobTemplate/spec/template/spec"))
            .expect("a pod template");
        for container in pod["containers"].as_array().unwrap() {
            assert!(
                container
                    .get("restartPolicyRules")
                    .map(|r| r.as_array().unwrap().len())
                    <= Some(1),
                "{output:#}"
            );
            assert!(!container.to_string().contains("140"), "{output:#}");
        }
    }
}

#[test]
fn a_broken_policy_stops_mutate_before_anything_is_printed() {
    for broken in ["policy-broken.yaml", "policy-bad-exit-code.yaml"] {
        let path = fixture(broken);
        let out = run(gpu_guard()
            .arg("--policy")
            .arg(&path)
            .arg("mutate")
            .arg("-f")
            .arg(fixture("gpu-job.yaml")))
        .expect_code(2);
        assert_eq!(out.stdout, "", "nothing is half-applied");
        assert!(out.stderr.contains(broken), "{}", out.stderr);

        // The same through the environment variable.
        let out = run(gpu_guard()
            .env("GPU_GUARD_POLICY", &path)
            .arg("mutate")
            .arg("-f")
            .arg(fixture("gpu-job.yaml")))
        .expect_code(2);
        assert_eq!(out.stdout, "");
    }
}

#[test]
fn a_policy_file_changes_what_mutate_injects() {
    let out = run(gpu_guard()
        .arg("--policy")
        .arg(fixture("policy-valid.yaml"))
        .arg("mutate")
        .arg("-f")
        .arg(fixture("gpu-job.yaml")))
    .expect_code(0);
    let job = single_yaml_document(&out.stdout);
    assert_eq!(
        job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        120
    );
}

#[test]
fn policy_show_prints_the_embedded_default_with_every_key() {
    let out = run(gpu_guard().args(["policy", "show"])).expect_code(0);
    let shown = policy::parse(&out.stdout, "policy show output").unwrap_or_else(|e| {
        panic!(
            "`policy show` prints an invalid policy: {e}\n{}",
            out.stdout
        )
    });
    assert_eq!(shown, Policy::embedded());
    // Every key is spelt out, so the output documents the defaults.
    let value = single_yaml_document(&out.stdout);
    assert_eq!(
        value["mutation"]["podFailurePolicy"]["existingPolicy"],
        "Merge"
    );
    assert_eq!(
        value["mutation"]["terminationGracePeriod"]["maximumSeconds"],
        900
    );

    let with_file = run(gpu_guard()
        .arg("--policy")
        .arg(fixture("policy-valid.yaml"))
        .args(["policy", "show"]))
    .expect_code(0);
    let shown = policy::parse(&with_file.stdout, "policy show output").unwrap();
    assert_eq!(shown.mutation.termination_grace_period.minimum_seconds, 120);
}

#[test]
fn the_committed_policy_schema_is_up_to_date() {
    let out = run(gpu_guard().args(["policy", "schema"])).expect_code(0);
    let committed = read(&manifest_dir().join("policies/schema.json"));
    if out.stdout != committed {
        let first_difference = out
            .stdout
            .lines()
            .zip(committed.lines())
            .position(|(generated, file)| generated != file)
            .unwrap_or_else(|| out.stdout.lines().count().min(committed.lines().count()));
        panic!(
            "policies/schema.json is stale (first difference at line {}): run \
             `cargo run -- policy schema > policies/schema.json`",
            first_difference + 1
        );
    }
    let schema = json_output(&out.stdout);
    assert_eq!(schema["title"], "gpu-guard policy");
}

// === help ===

#[test]
fn mutate_help_documents_the_exit_statuses() {
    let out = run(gpu_guard().args(["mutate", "--help"])).expect_code(0);
    let text = out.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    let lower = text.to_lowercase();
    assert!(lower.contains("exit status"), "{}", out.stdout);
    for status in ["0 on success", "1 with --diff", "2 when a flag"] {
        assert!(
            text.contains(status),
            "missing {status:?} in\n{}",
            out.stdout
        );
    }
}

// === the real admission requests ===

#[test]
fn every_job_and_cron_job_of_the_admission_fixtures_mutates_to_a_valid_object() {
    let dir = manifest_dir().join("tests/fixtures/admission");
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.ends_with("-mutate.json"))
        })
        .collect();
    fixtures.sort();
    let work = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();

    for path in &fixtures {
        let review: Value = serde_json::from_str(&read(path)).unwrap();
        let object = &review["request"]["object"];
        let kind = object["kind"].as_str().unwrap_or_default();
        if !matches!(kind, "Job" | "CronJob") {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let input = work.path().join(name.replace("-mutate.json", ".json"));
        std::fs::write(&input, serde_json::to_string_pretty(object).unwrap()).unwrap();

        let out = run(gpu_guard().args(["mutate", "-o", "json", "-f"]).arg(&input));
        assert_eq!(out.code, Some(0), "{name}: {}", out.stderr);
        let output = json_output(&out.stdout);
        assert_eq!(
            output["metadata"]["name"], object["metadata"]["name"],
            "{name}"
        );

        match kind {
            "Job" => {
                let job: Job = serde_json::from_value(output.clone())
                    .unwrap_or_else(|e| panic!("{name}: the output is not a Job: {e}"));
                let violations = check_job(&job);
                assert!(violations.is_empty(), "{name}: {violations:?}");
                assert!(mutated_annotation(&output["metadata"]).is_some(), "{name}");
            }
            _ => {
                let cron_job: CronJob = serde_json::from_value(output.clone())
                    .unwrap_or_else(|e| panic!("{name}: the output is not a CronJob: {e}"));
                let spec = cron_job.spec.job_template.spec.unwrap();
                let path = FieldPath::new(["spec", "jobTemplate", "spec"]);
                let violations = check_job_spec(&spec, &path);
                assert!(violations.is_empty(), "{name}: {violations:?}");
                assert!(
                    mutated_annotation(&output["spec"]["jobTemplate"]["metadata"]).is_some(),
                    "{name}"
                );
            }
        }
        // Server-set fields pass through untouched.
        assert_eq!(
            output["metadata"]["uid"], object["metadata"]["uid"],
            "{name}"
        );
        assert_eq!(
            output["metadata"]["managedFields"], object["metadata"]["managedFields"],
            "{name}"
        );
        checked.push(name);
    }
    assert!(
        checked.len() >= 8,
        "expected the Job and CronJob fixtures, checked only {checked:?}"
    );
}

// === known bugs in src/ (ignored until fixed; run with `cargo test --test it cli:: -- --ignored`) ===

/// Whether a YAML output line sets `key` to the string `value` with quotes.
fn is_quoted(yaml: &str, key: &str, value: &str) -> bool {
    yaml.lines().any(|line| {
        let line = line.trim_start().trim_start_matches("- ");
        line == format!("{key}: '{value}'") || line == format!("{key}: \"{value}\"")
    })
}

#[test]
fn strings_that_yaml_1_1_reads_as_booleans_or_numbers_stay_quoted() {
    let out = run(gpu_guard()
        .arg("mutate")
        .arg("-f")
        .arg(fixture("yaml11-strings.yaml")))
    .expect_code(0);
    let mut unquoted = Vec::new();
    for (key, value) in [
        ("amp", "yes"),
        ("profiler", "off"),
        ("tf32", "on"),
        ("debug", "NO"),
        ("short", "y"),
        ("steps", "1_000"),
        ("value", "on"),
    ] {
        if !is_quoted(&out.stdout, key, value) {
            unquoted.push(format!("{key}: {value}"));
        }
    }
    assert!(
        unquoted.is_empty(),
        "kubectl would read these as booleans or numbers: {unquoted:?}\n{}",
        out.stdout
    );
}

#[test]
fn merge_keys_are_resolved_as_kubectl_resolves_them() {
    let out = run(gpu_guard()
        .arg("mutate")
        .arg("-f")
        .arg(fixture("merge-key-job.yaml")))
    .expect_code(0);
    let job = single_yaml_document(&out.stdout);
    assert_eq!(
        job.pointer("/spec/template/spec/containers/0/resources/limits/nvidia.com~1gpu"),
        Some(&json!(1)),
        "the merge key is resolved: {job:#}"
    );
    assert_device_job_spec(&job["spec"], &["main"]);
}

// === serve as a process: configuration and signals ===

#[test]
fn print_config_shows_flags_and_environment_and_exits() {
    let out = run(gpu_guard().env("GPU_GUARD_LISTEN", "127.0.0.1:9443").args([
        "serve",
        "--print-config",
        "--drain-delay-seconds",
        "7",
        "--dns-name",
        "a.example",
    ]))
    .expect_code(0);
    let config = single_yaml_document(&out.stdout);
    assert_eq!(
        config["serve"]["listen"], "127.0.0.1:9443",
        "from the environment"
    );
    assert_eq!(config["serve"]["drainDelaySeconds"], 7, "from a flag");
    assert_eq!(config["serve"]["adminListen"], "0.0.0.0:8080", "a default");
    assert_eq!(config["serve"]["dnsNames"], json!(["a.example"]));
    assert!(config["policy"].as_str().unwrap().contains("embedded"));
}

/// A `gpu-guard serve` process on free loopback ports, with its admin address read from its
/// JSON log.
struct ServeProcess {
    child: std::process::Child,
    admin: String,
}

impl ServeProcess {
    fn start(drain_delay_seconds: u32) -> Self {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        // No cluster configured: `serve` runs offline (as on a fresh machine).
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-guard"))
            .env_remove("GPU_GUARD_POLICY")
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", dir.path())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(["--log-format", "json", "--drain-delay-seconds"])
            .arg(drain_delay_seconds.to_string())
            .arg("--ca-bundle-file")
            .arg(dir.path().join("ca.pem"))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let admin = loop {
            let line = lines.next().expect("serve logs its addresses").unwrap();
            let entry: Value = serde_json::from_str(&line).unwrap();
            if entry["message"] == "serving" {
                break entry["admin"].as_str().unwrap().to_owned();
            }
        };
        // Keep draining the log so the process never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, admin }
    }

    fn readyz(&self) -> Option<u16> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&self.admin).ok()?;
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        response.get(9..12)?.parse().ok()
    }

    fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn wait(&mut self, limit: std::time::Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sigterm_turns_readiness_false_drains_and_exits_0() {
    let mut server = ServeProcess::start(1);
    assert_eq!(server.readyz(), Some(200));
    server.signal("TERM");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(server.readyz(), Some(503), "not ready while draining");
    assert_eq!(server.wait(std::time::Duration::from_secs(10)), Some(0));
}

#[test]
fn a_second_signal_exits_at_once() {
    let mut server = ServeProcess::start(60);
    server.signal("TERM");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        server.wait(std::time::Duration::from_millis(100)),
        None,
        "still draining"
    );
    server.signal("INT");
    assert_eq!(server.wait(std::time::Duration::from_secs(5)), Some(130));
}

#[test]
fn yaml_1_1_numbers_and_booleans_keep_the_values_kubectl_reads() {
    let path = fixture("yaml11-values.yaml");
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    let documents = yaml_documents(&out.stdout);
    let pod = &documents[0]["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][0]["configMap"]["defaultMode"], 420,
        "octal 0644"
    );
    assert_eq!(pod["containers"][0]["volumeMounts"][0]["readOnly"], true);
    assert_device_job_spec(&documents[0]["spec"], &["main"]);
    assert_eq!(
        documents[1]["data"]["quoted"], "0644",
        "a quoted string stays a string"
    );
    assert!(out.stdout.contains("quoted: \"0644\""), "{}", out.stdout);
}

// === check ===

fn check_fixture(name: &str) -> PathBuf {
    manifest_dir().join("tests/fixtures/check").join(name)
}

#[test]
fn check_names_each_object_and_exits_1_when_something_would_be_denied() {
    let run = run(gpu_guard()
        .arg("check")
        .arg("-f")
        .arg(check_fixture("workloads.yaml")))
    .expect_code(1);
    let source = check_fixture("workloads.yaml").display().to_string();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("{source} (document 1) Deployment research/notebook: DENIED")
    );
    assert!(
        lines[1].contains("needs priority >= 1000, but its priority is 0"),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains(
            "spec.template.spec.tolerations[0] tolerates the GPU node taint nvidia.com/gpu"
        )
    );
    assert_eq!(
        lines[2],
        format!(
            "{source} (document 2) Job default/train: allowed (targets GPU nodes; priority 100000 >= 0)"
        )
    );
    assert!(
        lines[3].starts_with("  mutate would: podFailurePolicy (4 rules)"),
        "{}",
        lines[3]
    );
    assert_eq!(
        lines[4],
        format!("{source} (document 3, item 0) StatefulSet default/db: allowed")
    );
    assert_eq!(
        lines[5],
        "3 object(s) checked: 2 allowed, 1 denied; 1 read as cluster facts (PriorityClass 1)"
    );
    assert_eq!(run.stderr, "");
}

#[test]
fn check_in_warn_mode_reports_but_passes() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\nguard:\n  namespaceModes: {research: Warn}\n",
    )
    .unwrap();
    let run = run(gpu_guard()
        .arg("--policy")
        .arg(&policy)
        .args(["check", "-o", "json", "-f"])
        .arg(check_fixture("workloads.yaml")))
    .expect_code(0);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["denied"], false);
    let notebook = &report["findings"][0];
    assert_eq!(notebook["verdict"], "warned");
    assert_eq!(notebook["mode"], "Warn");
    assert_eq!(notebook["priority"], 0);
    assert_eq!(notebook["minimum"], 1000);
    assert_eq!(
        notebook["reasons"],
        json!([
            {"field": "spec.template.spec.tolerations[0]", "what": "tolerates the GPU node taint nvidia.com/gpu"},
            {"field": "spec.template.spec.nodeSelector[nvidia.com/gpu.present]", "what": "selects the GPU node label nvidia.com/gpu.present=true"}
        ])
    );
}

#[test]
fn check_takes_priority_classes_from_flags_and_reports_unknown_ones() {
    let file = check_fixture("preemptible.yaml");
    // Unknown offline: reported, not denied.
    let unknown = run(gpu_guard().arg("check").arg("-f").arg(&file)).expect_code(0);
    assert!(
        unknown
            .stdout
            .contains("CronJob experiments/sweep: unjudged"),
        "{}",
        unknown.stdout
    );
    assert!(
        unknown
            .stdout
            .contains("pass --priority-class preemptible=VALUE")
    );
    // A negative class is below withDevice (0): denied.
    let denied = run(gpu_guard()
        .args(["check", "--priority-class", "preemptible=-100", "-f"])
        .arg(&file))
    .expect_code(1);
    assert!(
        denied
            .stdout
            .contains("its priority is -100 (PriorityClass \"preemptible\")"),
        "{}",
        denied.stdout
    );
    assert!(denied.stdout.contains(
        "spec.jobTemplate.spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]"
    ));
    // A malformed flag is a usage error.
    let bad = run(gpu_guard()
        .args(["check", "--priority-class", "preemptible", "-f"])
        .arg(&file))
    .expect_code(2);
    assert!(bad.stderr.contains("expected NAME=VALUE"), "{}", bad.stderr);
}

#[test]
fn check_exits_2_on_unreadable_input() {
    let run = run(gpu_guard().args(["check", "-f", "/nonexistent/app.yaml"])).expect_code(2);
    assert!(
        run.stderr.contains("/nonexistent/app.yaml"),
        "{}",
        run.stderr
    );
    let run = run_with_stdin("check", "kind: [unclosed");
    assert_eq!(run.code, Some(2), "{}", run.stderr);
}

fn run_with_stdin(command: &str, input: &str) -> Run {
    run(gpu_guard().args([command, "-f", "-"]).write_stdin(input))
}

#[test]
fn serve_refuses_a_kubeconfig_it_cannot_read() {
    let run = run(gpu_guard().args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
    ]))
    .expect_code(1);
    assert!(
        run.stderr.contains("/nonexistent/kubeconfig"),
        "{}",
        run.stderr
    );
}

#[test]
fn certs_writes_a_ca_and_a_serving_certificate_for_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("certs");
    let made = run(gpu_guard().args(["certs", "--out-dir"]).arg(&out)).expect_code(0);
    assert!(
        made.stderr.contains("for development only"),
        "{}",
        made.stderr
    );
    let pem = |name: &str| std::fs::read(out.join(name)).unwrap();
    let der = |bytes: &[u8]| x509_parser::pem::parse_x509_pem(bytes).unwrap().1.contents;
    let (ca_der, leaf_der) = (der(&pem("ca.crt")), der(&pem("tls.crt")));
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).unwrap();
    assert!(ca.is_ca());
    assert_eq!(leaf.issuer(), ca.subject());
    // A TLS client trusting only ca.crt accepts tls.crt for the Service's name.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca_der.clone()))
        .unwrap();
    use rustls::client::danger::ServerCertVerifier as _;
    let verifier = rustls::client::WebPkiServerVerifier::builder(std::sync::Arc::new(roots))
        .build()
        .unwrap();
    for name in ["gpu-guard.gpu-guard.svc", "localhost"] {
        verifier
            .verify_server_cert(
                &rustls::pki_types::CertificateDer::from(leaf_der.clone()),
                &[],
                &rustls::pki_types::ServerName::try_from(name).unwrap(),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let names: Vec<String> = leaf
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|name| name.to_string())
        .collect();
    for expected in [
        "gpu-guard.gpu-guard.svc",
        "gpu-guard.gpu-guard.svc.cluster.local",
        "localhost",
    ] {
        assert!(
            names.iter().any(|n| n.contains(expected)),
            "{expected} not in {names:?}"
        );
    }
    // Valid now, for a year at most (not for ever).
    let validity = leaf.validity();
    assert!(validity.is_valid());
    let lifetime = validity.not_after.timestamp() - validity.not_before.timestamp();
    assert!(lifetime <= 367 * 86_400, "{lifetime}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(out.join("tls.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // An existing set is kept unless --force.
    let again = run(gpu_guard().args(["certs", "--out-dir"]).arg(&out)).expect_code(2);
    assert!(again.stderr.contains("pass --force"), "{}", again.stderr);
    run(gpu_guard()
        .args(["certs", "--force", "--out-dir"])
        .arg(&out))
    .expect_code(0);
    assert_ne!(der(&pem("ca.crt")), ca_der, "--force makes a new CA");
}

#[test]
fn generate_webhook_config_prints_the_base_and_takes_options() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    run(gpu_guard().args(["certs", "--out-dir"]).arg(dir.path())).expect_code(0);
    let out = run(gpu_guard()
        .args([
            "generate",
            "webhook-config",
            "--namespace",
            "infra",
            "--image",
            "registry.example/gpu-guard:1",
            "--validate-failure-policy",
            "fail",
            "--ca-bundle-file",
        ])
        .arg(&ca))
    .expect_code(0);
    let documents = gpu_guard_manifest::parse(&out.stdout, "-").0;
    let kinds: Vec<&str> = documents
        .iter()
        .map(|d| d.value["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "PodDisruptionBudget",
            "Service",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            "NetworkPolicy"
        ]
    );
    assert_eq!(documents[9].value["metadata"]["namespace"], "infra");
    let validating = &documents[8].value["webhooks"][0];
    assert_eq!(validating["failurePolicy"], "Fail");
    assert_eq!(validating["clientConfig"]["service"]["namespace"], "infra");
    use base64::Engine as _;
    let bundle = base64::engine::general_purpose::STANDARD
        .decode(validating["clientConfig"]["caBundle"].as_str().unwrap())
        .unwrap();
    assert_eq!(bundle, std::fs::read(&ca).unwrap());
    assert_eq!(
        documents[4].value["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example/gpu-guard:1"
    );
    // A file that is not a certificate is refused.
    let bad = run(gpu_guard()
        .args(["generate", "webhook-config", "--ca-bundle-file"])
        .arg(dir.path().join("tls.key")))
    .expect_code(2);
    assert!(
        bad.stderr.contains("not a PEM certificate"),
        "{}",
        bad.stderr
    );
}

#[test]
fn check_judges_each_trainer_runtime_under_the_default_mode() {
    let runtimes = manifest_dir().join("tests/fixtures/trainer");
    let source = |file: &str| runtimes.join(file).display().to_string();
    let run_default = run(gpu_guard().arg("check").arg("-f").arg(&runtimes)).expect_code(0);
    let lines: Vec<&str> = run_default.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "{} (document 0) ClusterTrainingRuntime deepspeed-distributed: allowed",
                source("deepspeed-distributed.yaml")
            ),
            format!(
                "{} (document 0) ClusterTrainingRuntime mlx-distributed: allowed",
                source("mlx-distributed.yaml")
            ),
            format!(
                "{} (document 0) ClusterTrainingRuntime torch-distributed: allowed",
                source("torch-distributed.yaml")
            ),
            format!(
                "{} (document 0) ClusterTrainingRuntime torchtune-llama3.2-1b: allowed (targets \
                 GPU nodes; priority 0 >= 0)",
                source("torchtune-llama3.2-1b.yaml")
            ),
            // The GPU runtime's JobSet template gets the gang protection; the others use no
            // device.
            "  mutate would: replicatedJob node: restartPolicy=Never, podFailurePolicy (4 rules), \
             podReplacementPolicy=Failed, terminationGracePeriodSeconds=60, toleration \
             node.kubernetes.io/not-ready=900s, toleration node.kubernetes.io/unreachable=900s; \
             failurePolicy: 2 gang rules, maxRestarts=5"
                .to_owned(),
            "4 object(s) checked: 4 allowed".to_owned(),
        ]
    );
    // Raise the device minimum: the GPU runtime is denied, whatever the namespace of `check`
    // or its mode (a cluster-scoped runtime serves TrainJobs of every namespace).
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\nguard:\n  namespaceModes: {research: Warn}\n  minimumPriority: {withDevice: 1000}\n",
    )
    .unwrap();
    let denied = run(gpu_guard()
        .arg("--policy")
        .arg(&policy)
        .args(["check", "--namespace", "research", "-o", "json", "-f"])
        .arg(runtimes.join("torchtune-llama3.2-1b.yaml")))
    .expect_code(1);
    let report: Value = serde_json::from_str(&denied.stdout).unwrap();
    let finding = &report["findings"][0];
    assert_eq!(finding["kind"], "ClusterTrainingRuntime");
    assert_eq!(finding["namespace"], "");
    assert_eq!(
        (&finding["verdict"], &finding["mode"]),
        (&json!("denied"), &json!("Enforce"))
    );
    assert_eq!(
        finding["reasons"],
        json!([{
            "field": "spec.template.spec.replicatedJobs[2].template.spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]",
            "what": "container \"node\" uses the device nvidia.com/gpu"
        }])
    );
    assert!(
        finding["message"]
            .as_str()
            .unwrap()
            .starts_with("ClusterTrainingRuntime torchtune-llama3.2-1b replicatedJob \"node\" targets GPU nodes and uses a device"),
        "{finding}"
    );
}

#[test]
fn check_reports_every_violating_replicated_job_of_a_jobset() {
    let jobset = r#"
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: sweep, namespace: research}
spec:
  replicatedJobs:
  - name: driver
    template:
      spec:
        template:
          spec:
            tolerations: [{key: nvidia.com/gpu, operator: Exists}]
            containers: [{name: driver, image: busybox}]
  - name: workers
    replicas: 4
    template:
      spec:
        template:
          spec:
            nodeSelector: {nvidia.com/gpu.present: "true"}
            containers: [{name: worker, image: busybox}]
"#;
    let run = run(gpu_guard()
        .args(["check", "-o", "json", "-f", "-"])
        .write_stdin(jobset))
    .expect_code(1);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let finding = &report["findings"][0];
    assert_eq!(
        (&finding["kind"], &finding["namespace"], &finding["name"]),
        (&json!("JobSet"), &json!("research"), &json!("sweep"))
    );
    assert_eq!(
        (&finding["priority"], &finding["minimum"]),
        (&json!(0), &json!(1000))
    );
    let fields: Vec<&str> = finding["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|reason| reason["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "spec.replicatedJobs[0].template.spec.template.spec.tolerations[0]",
            "spec.replicatedJobs[1].template.spec.template.spec.nodeSelector[nvidia.com/gpu.present]",
        ]
    );
    let message = finding["message"].as_str().unwrap();
    assert!(
        message.contains("JobSet research/sweep replicatedJob \"driver\" targets"),
        "{message}"
    );
    assert!(
        message.contains("JobSet research/sweep replicatedJob \"workers\" targets"),
        "{message}"
    );
}

// === hostile and broken input (a CI gate meets them sooner or later) ===

/// A "billion laughs" document: `levels` levels of ten aliases to the level below.
fn alias_bomb(levels: usize) -> String {
    let mut text = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: laughs}\ndata:\n  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
    );
    for level in 1..levels {
        let below = format!("*l{}", level - 1);
        text.push_str(&format!(
            "  l{level}: &l{level} [{}]\n",
            [below.as_str(); 10].join(", ")
        ));
    }
    text
}

#[test]
fn an_alias_bomb_is_refused_quickly_and_the_other_documents_are_processed() {
    let dir = tempfile::tempdir().unwrap();
    let job = read(&fixture("gpu-job.yaml"));
    let path = dir.path().join("bomb.yaml");
    std::fs::write(&path, format!("{}---\n{job}", alias_bomb(10))).unwrap();
    for command in ["mutate", "check"] {
        let out = run(gpu_guard().arg(command).arg("-f").arg(&path)).expect_code(2);
        assert!(
            out.stderr
                .contains("bomb.yaml: document 0, line 8: excessive aliasing"),
            "{command}: {}",
            out.stderr
        );
        assert!(out.stdout.len() < 10_000, "{command}: nothing was expanded");
        assert!(
            out.stdout.contains("train"),
            "{command}: the Job after it is processed"
        );
    }
    // A few aliases, as real manifests use them, are read.
    let fine = dir.path().join("fine.yaml");
    std::fs::write(&fine, alias_bomb(2)).unwrap();
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&fine)).expect_code(0);
    let config_map = single_yaml_document(&out.stdout);
    assert_eq!(config_map["data"]["l1"][9], json!(["lol"; 10].to_vec()));
}

#[test]
fn deep_nesting_is_refused_not_a_stack_overflow() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("block.yaml", "- ".repeat(100_000) + "x\n"),
        ("flow.yaml", "a: ".to_owned() + &"[".repeat(100_000)),
        ("deep.json", "{\"a\": ".to_owned() + &"[".repeat(100_000)),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &text).unwrap();
        for command in ["mutate", "check"] {
            let out = run(gpu_guard().arg(command).arg("-f").arg(&path)).expect_code(2);
            assert!(
                out.stderr
                    .contains(&format!("{name}: document 0, line 1: ")),
                "{command} {name}: {}",
                out.stderr
            );
        }
    }
    // Deep, but within the limit of 1000 levels: read, mutated and written back, as YAML and
    // as JSON.
    let path = dir.path().join("deep-ok.yaml");
    let deep = "- ".repeat(900) + "x";
    std::fs::write(
        &path,
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: deep}}\nx:\n{deep}\n"),
    )
    .unwrap();
    let json = run(gpu_guard().args(["mutate", "-o", "json", "-f"]).arg(&path)).expect_code(0);
    let yaml = run(gpu_guard().args(["mutate", "-f"]).arg(&path)).expect_code(0);
    // Values 900 levels deep need more than a test thread's stack in a debug build.
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            let mut deserializer = serde_json::Deserializer::from_str(&json.stdout);
            deserializer.disable_recursion_limit();
            let config_map = Value::deserialize(&mut deserializer).expect("JSON output");
            assert_eq!(config_map["metadata"]["name"], "deep");
            let back = gpu_guard_manifest::parse(&yaml.stdout, "stdout");
            assert_eq!(back.0[0].value, config_map, "{:?}", back.1);
        })
        .unwrap()
        .join()
        .unwrap();
    // Flow nesting: the YAML scanner's own limit is 255 levels, named as such.
    std::fs::write(&path, "x: ".to_owned() + &"[".repeat(300)).unwrap();
    let out = run(gpu_guard().args(["mutate", "-f"]).arg(&path)).expect_code(2);
    assert!(
        out.stderr
            .contains("nested deeper than 255 levels of [ ] and { }"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_document_over_the_size_limit_is_reported_and_the_next_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    let big = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big}}\ndata:\n  blob: {}\n",
        "x".repeat(20_000)
    );
    let job = read(&fixture("gpu-job.yaml"));
    std::fs::write(&path, format!("{big}---\n{job}")).unwrap();
    let out = run(gpu_guard()
        .args(["mutate", "--max-document-bytes", "16Ki", "-f"])
        .arg(&path))
    .expect_code(2);
    let expected = format!(
        "big.yaml: document 0, line 1: the document is {} bytes, more than the limit of 16384 \
         bytes (raise it with --max-document-bytes) (left out of the output)",
        big.len()
    );
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    assert_device_job_spec(&single_yaml_document(&out.stdout)["spec"], &["main"]);
    // The default limit (16 MiB) reads it.
    run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
}

#[test]
fn text_that_is_not_utf8_costs_only_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latin1.yaml");
    let job = read(&fixture("gpu-job.yaml"));
    let mut bytes = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: caf\xe9}\n---\n".to_vec();
    bytes.extend(job.as_bytes());
    std::fs::write(&path, bytes).unwrap();
    let out = run(gpu_guard().args(["check", "-f"]).arg(&path)).expect_code(2);
    assert!(
        out.stderr
            .contains("latin1.yaml: document 0, line 3: the text is not UTF-8"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.contains("Job ml/train"), "{}", out.stdout);
}

#[test]
fn kinds_with_pod_templates_that_are_not_handled_are_named_and_everything_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.yaml");
    let job = read(&fixture("gpu-job.yaml"));
    let pytorch = "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: bert}\nspec:\n  \
                   pytorchReplicaSpecs:\n    Master:\n      replicas: 1\n      template:\n        \
                   spec:\n          containers:\n          - name: pytorch\n            image: \
                   trainer:1\n            resources: {limits: {nvidia.com/gpu: 8}}\n";
    let config_map = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n";
    std::fs::write(
        &path,
        format!("{job}---\n{pytorch}---\n{config_map}---\n{job}"),
    )
    .unwrap();
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    assert!(
        out.stderr.contains("warning: ")
            && out.stderr.contains(
                "(document 1) pytorchjob/bert: gpu-guard does not mutate kubeflow.org/v1 PyTorchJob"
            ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "summary: 4 object(s): 2 mutated (Job 2), 2 not handled (ConfigMap 1, PyTorchJob 1)"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(
        yaml_documents(&out.stdout).len(),
        4,
        "every document is written"
    );

    let out = run(gpu_guard().args(["check", "-f"]).arg(&path)).expect_code(0);
    assert!(
        out.stderr
            .contains("the guard does not judge kubeflow.org/v1 PyTorchJob"),
        "{}",
        out.stderr
    );
    let summary = out.stdout.lines().last().unwrap();
    assert_eq!(
        summary,
        "2 object(s) checked: 2 allowed; 2 not judged (ConfigMap 1, PyTorchJob 1)"
    );
    let report = json_output(
        &run(gpu_guard().args(["check", "-o", "json", "-f"]).arg(&path))
            .expect_code(0)
            .stdout,
    );
    assert_eq!(
        report["summary"],
        json!({"allowed": {"Job": 2}, "not judged": {"ConfigMap": 1, "PyTorchJob": 1}})
    );
    assert_eq!(report["warnings"].as_array().map(Vec::len), Some(1));
}

#[test]
fn the_kinds_of_other_operators_and_trainjobs_are_told_what_protects_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("operators.yaml");
    let pod = "      template:\n        spec:\n          containers:\n          - name: w\n            \
               image: trainer:1\n            resources: {limits: {nvidia.com/gpu: 8}}\n";
    // The TrainJob comes before its runtime: the runtime is found wherever it is.
    let documents = [
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: tune, \
         namespace: ml}\nspec:\n  runtimeRef: {name: torch-gpu}\n"
            .to_owned(),
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: cpu-tune}\n\
         spec:\n  runtimeRef: {name: torch-cpu, kind: TrainingRuntime}\n"
            .to_owned(),
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: elsewhere}\n\
         spec:\n  runtimeRef: {name: deepspeed}\n"
            .to_owned(),
        format!(
            "apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\nmetadata: {{name: imex}}\nspec:\n  \
             mpiReplicaSpecs:\n    Worker:\n{pod}"
        ),
        format!(
            "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {{name: vc}}\nspec:\n  \
             tasks:\n    - name: w\n{pod}"
        ),
        format!(
            "apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {{name: ray}}\nspec:\n  \
             rayClusterSpec:\n    headGroupSpec:\n{pod}"
        ),
        "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: \
             lws}\nspec:\n  leaderWorkerTemplate:\n    workerTemplate:\n        spec:\n          \
             containers: [{name: w, image: vllm}]\n"
            .to_owned(),
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\nmetadata: \
             {name: torch-gpu}\nspec:\n  template:\n    spec:\n      replicatedJobs:\n      - \
             name: node\n        template:\n          spec:\n            template:\n              \
             spec:\n                restartPolicy: Never\n                containers:\n                \
             - {name: node, image: torch:2, resources: {limits: {nvidia.com/gpu: 8}}}\n"
            .to_owned(),
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainingRuntime\nmetadata: {name: \
         torch-cpu}\nspec:\n  template:\n    spec:\n      replicatedJobs:\n      - name: node\n        \
         template:\n          spec:\n            template:\n              spec:\n                \
         containers: [{name: node, image: torch:2}]\n"
            .to_owned(),
    ];
    std::fs::write(&path, documents.join("---\n")).unwrap();
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    let line = |fragment: &str| {
        out.stderr
            .lines()
            .find(|line| line.contains(fragment))
            .unwrap_or_else(|| panic!("no line with {fragment:?} in\n{}", out.stderr))
            .to_owned()
    };
    let protected = line("trainjob/tune:");
    assert!(!protected.starts_with("warning:"), "{protected}");
    assert!(
        protected.contains("from ClusterTrainingRuntime torch-gpu")
            && protected.ends_with(
                "ClusterTrainingRuntime torch-gpu is protected: gpu-guard mutates it at admission"
            ),
        "{protected}"
    );
    let unprotected = line("trainjob/cpu-tune:");
    assert!(
        unprotected.starts_with("warning:")
            && unprotected.contains(
                "TrainingRuntime torch-cpu is not protected: none of its \
                                     replicated Jobs requests a device resource"
            ),
        "{unprotected}"
    );
    assert!(
        line("trainjob/elsewhere:")
            .contains("ClusterTrainingRuntime deepspeed is not in the input"),
        "{}",
        out.stderr
    );
    for (object, operator) in [
        (
            "mpijob/imex",
            "the MPI Operator runs the workers as bare Pods",
        ),
        ("job/vc", "the Volcano controller creates bare Pods"),
        ("rayjob/ray", "KubeRay runs the Ray cluster as bare Pods"),
        (
            "leaderworkerset/lws",
            "LeaderWorkerSet runs each group as StatefulSets",
        ),
    ] {
        let said = line(&format!("{object}:"));
        assert!(
            said.starts_with("warning:") && said.contains(operator),
            "{object}: {said}"
        );
    }
    assert!(
        out.stderr.contains(
            "summary: 9 object(s): 1 mutated (ClusterTrainingRuntime 1), 1 skipped \
             (TrainingRuntime 1), 7 not handled (Job 1, LeaderWorkerSet 1, MPIJob 1, RayJob 1, \
             TrainJob 3)"
        ),
        "{}",
        out.stderr
    );

    let out = run(gpu_guard().args(["check", "-f"]).arg(&path)).expect_code(0);
    assert!(
        out.stderr.contains(
            "TrainJob ml/tune: not judged itself: the guard judges the JobSet Kubeflow Trainer \
             builds from ClusterTrainingRuntime torch-gpu"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "MPIJob imex: the guard does not judge kubeflow.org/v2beta1 MPIJob in a manifest, \
             although it carries pod templates: the pods its operator creates are judged"
        ),
        "{}",
        out.stderr
    );
}

/// A kind of another operator that gpu-guard does not know, carrying a pod template: the warning
/// names every kind gpu-guard does mutate (the kind registry's), so the user knows what would work.
#[test]
fn an_unknown_kind_with_pod_templates_is_told_which_kinds_are_mutated() {
    let input = "apiVersion: batch.example.com/v1\nkind: GpuBatch\nmetadata:\n  name: nightly\n\
                 spec:\n  template:\n    spec:\n      containers:\n      - name: train\n\
                 \x20       image: train:1\n";
    let out = run(gpu_guard().args(["mutate", "-f", "-"]).write_stdin(input)).expect_code(0);
    assert!(
        out.stderr.contains(
            "gpu-guard does not mutate batch.example.com/v1 GpuBatch, although it carries pod \
             templates: its pods get no podFailurePolicy for device failures (supported: Job, \
             CronJob, JobSet, TrainingRuntime, ClusterTrainingRuntime; \
             docs/mutation.md#what-is-not-handled)"
        ),
        "{}",
        out.stderr
    );
}

/// The exit-code contract of docs/cli.md#exit-status: 0 nothing to report, 1 findings, 2 a
/// usage or input error, for every command.
#[test]
fn every_command_keeps_the_exit_code_contract() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml").display().to_string();
    let broken_policy = fixture("policy-broken.yaml").display().to_string();
    let job = fixture("gpu-job.yaml").display().to_string();
    let skip = fixture("skip.yaml").display().to_string();
    let denied = check_fixture("workloads.yaml").display().to_string();
    let certs = dir.path().join("certs").display().to_string();
    let cases: Vec<(Vec<&str>, i32)> = vec![
        (vec!["mutate", "-f", &job], 0),
        (vec!["mutate", "--diff", "-f", &skip], 0),
        (vec!["mutate", "--diff", "-f", &job], 1),
        (vec!["mutate", "-f", &missing], 2),
        (vec!["--policy", &broken_policy, "mutate", "-f", &job], 2),
        (vec!["--policy", &missing, "mutate", "-f", &job], 2),
        (vec!["mutate", "--bogus", "-f", &job], 2),
        (vec!["check", "-f", &job], 0),
        (vec!["check", "-f", &denied], 1),
        (vec!["check", "-f", &missing], 2),
        (vec!["--policy", &broken_policy, "check", "-f", &job], 2),
        (vec!["check", "--priority-class", "x", "-f", &job], 2),
        (vec!["policy", "check", "policies/strict.yaml"], 0),
        (vec!["policy", "check", &broken_policy], 1),
        (vec!["policy", "check", &missing], 2),
        (vec!["policy", "show"], 0),
        (vec!["--policy", &broken_policy, "policy", "show"], 2),
        (vec!["generate", "failure-policy", "--container", "main"], 0),
        (
            vec!["--policy", &broken_policy, "generate", "failure-policy"],
            2,
        ),
        (vec!["certs", "--out-dir", &certs], 0),
        (vec!["certs", "--out-dir", &certs], 2),
        (vec!["no-such-command"], 2),
    ];
    for (args, code) in cases {
        let out = run(gpu_guard().current_dir(manifest_dir()).args(&args));
        assert_eq!(
            out.code,
            Some(code),
            "gpu-guard {}\n--- stdout\n{}\n--- stderr\n{}",
            args.join(" "),
            out.stdout,
            out.stderr
        );
    }
}

#[test]
fn json_output_is_always_one_json_document_errors_included() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let broken_policy = fixture("policy-broken.yaml");
    let job = fixture("gpu-job.yaml");
    let check_runs = [
        run(gpu_guard()
            .args(["check", "-o", "json", "-f"])
            .arg(&missing)),
        run(gpu_guard()
            .arg("--policy")
            .arg(&broken_policy)
            .args(["check", "-o", "json", "-f"])
            .arg(&job)),
        run(gpu_guard()
            .args(["check", "-o", "json", "--bogus", "-f"])
            .arg(&job)),
        run(gpu_guard()
            .args(["check", "-o", "json", "--priority-class", "nonsense", "-f"])
            .arg(&job)),
    ];
    for out in check_runs {
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        let report = json_output(&out.stdout);
        assert_eq!(report["denied"], false);
        let errors = report["errors"].as_array().expect("errors");
        assert!(!errors.is_empty(), "{}", out.stdout);
    }
    let mutate_runs = [
        run(gpu_guard()
            .arg("--policy")
            .arg(&broken_policy)
            .args(["mutate", "-o", "json", "-f"])
            .arg(&job)),
        run(gpu_guard()
            .args(["mutate", "-o", "json", "--bogus", "-f"])
            .arg(&job)),
        run(gpu_guard()
            .args(["mutate", "-o", "json", "-f"])
            .arg(&missing)),
    ];
    for out in mutate_runs {
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert_eq!(
            json_output(&out.stdout),
            json!({"apiVersion": "v1", "kind": "List", "items": []})
        );
    }
}

#[test]
fn stdin_is_read_once_and_a_job_before_its_claim_template_still_resolves() {
    let template = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: \
                    {name: gpu, namespace: default}\nspec:\n  spec:\n    devices:\n      \
                    requests:\n      - name: gpu\n        exactly: {deviceClassName: gpu.nvidia.com}\n";
    let job = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: dra, namespace: default}\nspec:\n  \
               template:\n    spec:\n      restartPolicy: Never\n      resourceClaims:\n      - \
               name: gpu\n        resourceClaimTemplateName: gpu\n      containers:\n      - name: \
               main\n        image: x\n        resources: {claims: [{name: gpu}]}\n";
    let out = run(gpu_guard()
        .args(["mutate", "-f", "-"])
        .write_stdin(format!("{job}---\n{template}")))
    .expect_code(0);
    let documents = yaml_documents(&out.stdout);
    assert_eq!(documents.len(), 2);
    assert_device_job_spec(&documents[0]["spec"], &["main"]);
}

#[test]
fn a_policy_file_is_read_within_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.yaml");
    std::fs::write(
        &huge,
        format!(
            "apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\n# {}\n",
            "x".repeat(2 << 20)
        ),
    )
    .unwrap();
    let out = run(gpu_guard().arg("policy").arg("check").arg(&huge)).expect_code(2);
    assert!(
        out.stderr
            .contains("larger than 1024 KiB, the limit of a policy file"),
        "{}",
        out.stderr
    );
    // Aliases expanding past serde_norway's limit, and deep nesting: refused, not followed.
    let bomb = dir.path().join("bomb.yaml");
    let mut text = String::from(
        "apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\ndevices:\n  names: &a0 [a, a, a, a, a, a, a, a, a, a]\n",
    );
    text.push_str("  prefixes: &a1 [*a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0]\n");
    std::fs::write(&bomb, text).unwrap();
    let out = run(gpu_guard().arg("policy").arg("check").arg(&bomb)).expect_code(1);
    assert!(out.stderr.contains("devices.prefixes[0]"), "{}", out.stderr);
    let deep = dir.path().join("deep.yaml");
    std::fs::write(
        &deep,
        format!(
            "apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\ndevices:\n  names:\n  {}x\n",
            "- ".repeat(100_000)
        ),
    )
    .unwrap();
    let out = run(gpu_guard().arg("policy").arg("check").arg(&deep)).expect_code(1);
    assert!(out.stderr.contains("devices.names[0]"), "{}", out.stderr);
}

// === manifests as they come: block scalars at the end of a document ===

#[test]
fn block_scalars_at_the_end_of_a_document_keep_their_line_breaks_exactly() {
    // A ConfigMap of scripts ending in a literal block before `---`, a GPU Job whose last
    // field is a folded command, and a last ConfigMap ending in `|+` with no final newline:
    // the shapes of embedded scripts in real repositories. libyaml (here serde_norway's
    // copy of it, as kubectl's go-yaml) reads "exit 0" without a line break at the very end.
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: scripts\ndata:\n  \
                 entry.sh: |\n    #!/bin/sh\n    exec python train.py\n---\n\
                 apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: train\nspec:\n  template:\n    \
                 spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        \
                 image: registry.example/train:1.0\n        resources:\n          limits:\n            \
                 nvidia.com/gpu: 1\n        args:\n        - >\n          python train.py\n          \
                 --epochs 3\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: tail\ndata:\n  \
                 keep.sh: |+\n    echo done\n    exit 0";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scripts.yaml");
    std::fs::write(&path, text).unwrap();
    let inputs = yaml_documents(text);
    assert_eq!(inputs[2]["data"]["keep.sh"], "echo done\nexit 0");

    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    let outputs = yaml_documents(&out.stdout);
    assert_eq!(outputs.len(), 3, "{}", out.stdout);
    assert_same_document(&outputs[0], &inputs[0], "the ConfigMap before ---");
    assert_same_document(&outputs[2], &inputs[2], "the last ConfigMap");
    let args = &outputs[1]["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(args, &json!(["python train.py --epochs 3\n"]));
    assert!(outputs[1]["spec"]["podFailurePolicy"].is_object());

    // Only the Job changes, so the diff touches the Job alone.
    let out = run(gpu_guard().args(["mutate", "--diff", "-f"]).arg(&path)).expect_code(1);
    assert!(!out.stdout.contains("exit 0"), "{}", out.stdout);
    let without_job = dir.path().join("config-maps.yaml");
    let config_maps = text.replace(
        &text[text.find("---\napiVersion: batch/v1").unwrap()..text.rfind("---\n").unwrap()],
        "",
    );
    std::fs::write(&without_job, &config_maps).unwrap();
    let out = run(gpu_guard()
        .args(["mutate", "--diff", "-f"])
        .arg(&without_job))
    .expect_code(0);
    assert_eq!(
        out.stdout, "",
        "no diff for documents gpu-guard does not mutate"
    );
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&without_job)).expect_code(0);
    assert_eq!(yaml_documents(&out.stdout), yaml_documents(&config_maps));
}

#[test]
fn a_tab_is_reported_on_the_line_it_is_on() {
    // A GPU Job whose env entry was indented with a tab on line 24, after a plain scalar
    // (which the YAML parser reports where it began, line 23).
    let mut lines: Vec<String> = read(&fixture("gpu-job.yaml"))
        .lines()
        .map(str::to_owned)
        .collect();
    lines.extend(
        [
            "          env:",
            "          - name: EPOCHS",
            "            value: \"3\"",
            "          - name: DATA_DIR",
            "            value: /data",
            "\t          - name: LOG_LEVEL",
        ]
        .map(str::to_owned),
    );
    assert_eq!(lines[23], "\t          - name: LOG_LEVEL");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    for command in ["mutate", "check"] {
        let out = run(gpu_guard().arg(command).arg("-f").arg(&path)).expect_code(2);
        assert!(
            out.stderr.contains(
                "job.yaml: document 0, line 24: a tab character at column 1: YAML \
                 indentation must use spaces"
            ),
            "{command}: {}",
            out.stderr
        );
    }
}

#[test]
fn a_key_defined_twice_makes_the_document_unreadable_with_both_lines_named() {
    // A GPU Job with `containers` written twice (a merge gone wrong): kubectl's strict
    // decoding reports it and kustomize refuses it; reading on would keep the second list
    // silently. The document is unreadable, written through as it came, and the next is
    // still mutated.
    let broken = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: twice\nspec:\n  \
                  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      \
                  - name: main\n        image: registry.example/train:1.0\n        \
                  resources:\n          limits:\n            nvidia.com/gpu: 1\n      \
                  containers:\n      - name: sidecar\n        image: registry.example/log:1\n";
    let text = format!("{broken}---\n{}", read(&fixture("gpu-job.yaml")));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.yaml");
    std::fs::write(&path, &text).unwrap();
    let expected = "jobs.yaml: document 0, line 15: spec.template.spec: mapping key \
                    \"containers\" already defined at line 9";

    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(2);
    assert!(out.stderr.contains(expected), "{}", out.stderr);
    assert!(out.stdout.starts_with(broken), "{}", out.stdout);
    let outputs = yaml_documents(&out.stdout[broken.len()..]);
    assert_eq!(name_of(&outputs[0]), "train");
    assert_device_job_spec(&outputs[0]["spec"], &["main"]);

    let out = run(gpu_guard().arg("check").arg("-f").arg(&path)).expect_code(2);
    assert!(out.stderr.contains(expected), "{}", out.stderr);
}

#[test]
fn a_field_that_does_not_decode_is_named_with_its_line() {
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  \
                epochs: \"3\"\n---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: train\n\
                spec:\n  backoffLimit: 2\n  activeDeadlineSeconds: abc\n  template:\n    spec:\n      \
                restartPolicy: Never\n      containers:\n      - name: main\n        \
                image: registry.example/train:1.0\n        resources:\n          limits:\n            \
                nvidia.com/gpu: 1\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: batch/v1\n  \
                kind: Job\n  metadata:\n    name: listed\n  spec:\n    parallelism: two\n    \
                template:\n      spec:\n        containers: []\n";
    assert_eq!(
        text.lines().nth(13),
        Some("  activeDeadlineSeconds: abc"),
        "line 14"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.yaml");
    std::fs::write(&path, text).unwrap();
    let job = "spec.activeDeadlineSeconds (line 14): expected a whole number, found the string \
               \"abc\"";
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(2);
    assert!(out.stderr.contains(job), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("spec.parallelism (line 33): expected a whole number"),
        "{}",
        out.stderr
    );
    let out = run(gpu_guard().arg("check").arg("-f").arg(&path)).expect_code(2);
    assert!(out.stderr.contains(job), "{}", out.stderr);
}

#[test]
fn a_misspelt_field_is_named_with_the_field_meant() {
    let text = read(&fixture("gpu-job.yaml"))
        .replace(
            "  backoffLimit: 3\n",
            "  backoffLimit: 3\n  podFailurePolicyy:\n    rules: []\n",
        )
        .replace("          command:", "          comand:")
        + "---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: notebook\n  labels:\n    \
           podFailurePolicyy: a-label-is-not-a-field\nspec:\n  replicas: 1\n  selector:\n    \
           matchLabels: {app: notebook}\n  template:\n    metadata:\n      labels: {app: notebook}\n    \
           spec:\n      containers:\n      - name: lab\n        image: jupyter:1\n        \
           resources:\n          limts:\n            nvidia.com/gpu: 1\n";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("workloads.yaml");
    std::fs::write(&path, &text).unwrap();
    let unknown = [
        "job/train: unknown field \"spec.podFailurePolicyy\", did you mean \"podFailurePolicy\"?",
        "job/train: unknown field \"spec.template.spec.containers[0].comand\", did you mean \
         \"command\"?",
        "deployment/notebook: unknown field \
         \"spec.template.spec.containers[0].resources.limts\", did you mean \"limits\"?",
    ];
    // Warnings: the output is what the engine makes of the manifest, as kubectl would send
    // it (kubectl refuses or drops the field, not gpu-guard).
    let out = run(gpu_guard().arg("mutate").arg("-f").arg(&path)).expect_code(0);
    for warning in unknown {
        assert!(out.stderr.contains(warning), "{warning}\n{}", out.stderr);
    }
    assert_eq!(
        out.stderr.matches("unknown field").count(),
        3,
        "labels are a map: {}",
        out.stderr
    );
    let outputs = yaml_documents(&out.stdout);
    assert_eq!(
        outputs[0]["spec"]["podFailurePolicyy"],
        json!({"rules": []})
    );
    assert!(outputs[0]["spec"]["podFailurePolicy"].is_object());

    let out = run(gpu_guard().args(["check", "-o", "json", "-f"]).arg(&path)).expect_code(0);
    let report = json_output(&out.stdout);
    let warnings: Vec<&str> = report["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|warning| warning.contains("unknown field"))
        .collect();
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(
        warnings[0].contains("(document 0) Job train: unknown field \"spec.podFailurePolicyy\""),
        "{warnings:?}"
    );
}

#[test]
fn a_key_defined_twice_in_json_is_refused_too() {
    let text = "{\n  \"apiVersion\": \"batch/v1\",\n  \"kind\": \"Job\",\n  \"metadata\": {\"name\": \
                \"twice\"},\n  \"spec\": {\n    \"backoffLimit\": 6,\n    \"backoffLimit\": 0\n  }\n}\n";
    let out = run(gpu_guard().args(["mutate", "-f", "-"]).write_stdin(text)).expect_code(2);
    assert!(
        out.stderr.contains(
            "-: document 0, line 7: spec: mapping key \"backoffLimit\" already defined at line 6"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, text, "written through as it came");
}

#[test]
fn simulate_prints_a_json_list_even_on_a_usage_error() {
    let file = "tests/fixtures/simulate/gpu-job.yaml";
    let bad = run(gpu_guard().args(["simulate", "-o", "json", "--exit-code", "x", "-f", file]))
        .expect_code(2);
    assert_eq!(bad.stdout, "[]\n");
    assert!(bad.stderr.contains("--exit-code"), "{}", bad.stderr);
    // A bad input is exit 2 too, with the list of what could be simulated.
    let unknown = run(gpu_guard().args([
        "simulate",
        "-o",
        "json",
        "--container",
        "nope",
        "--exit-code",
        "1",
        "-f",
        file,
    ]))
    .expect_code(2);
    assert_eq!(unknown.stdout, "[]\n");
    assert!(
        unknown
            .stderr
            .contains("has no container or init container"),
        "{}",
        unknown.stderr
    );
}
