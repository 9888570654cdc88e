//! The corpus: manifests written in the shapes of real upstream examples (`tests/corpus/<source>/`),
//! each run through the real `gpu-guard mutate` and `gpu-guard check` with the default policy.
//!
//! Every file carries its expectations in its leading comment block (the format is in
//! docs/DEVELOPMENT.md#the-corpus):
//!
//! ```yaml
//! # follows: kubernetes-sigs/jobset examples/simple/max-restarts.yaml @ 7d3cf3e
//! # expect exit: mutate=0 check=0
//! # expect mutate: jobset/bounded-gpu-gang mutated "podFailurePolicy (4 rules)"
//! # expect check: jobset/bounded-gpu-gang allowed
//! ```
//!
//! For each file the test asserts: both exit codes; per object, what `mutate` did (mutated,
//! unchanged, skipped, not handled, failed) with a fragment of why, and the summary's counts;
//! that every object it mutated passes the API server's rules and JobSet's webhook rules
//! (`gpu_guard_core::api_rules`), keeps every field gpu-guard does not own, and that none of the rules it
//! added takes an exit code or pod condition away from a rule the user wrote; that a second
//! `mutate` changes nothing; that every object it did not mutate comes out with the same content,
//! read by an independent YAML reader (serde_norway); and the guard's verdict per object. Every
//! failing file is reported, with every difference, in one run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpu_guard_core::api_rules::job::check_job;
use gpu_guard_core::api_rules::jobset::check_jobset_spec;
use gpu_guard_core::field::FieldPath;
use gpu_guard_core::jobset::JobSetSpec;
use gpu_guard_core::mutate::template_as_job;
use k8s_openapi::api::batch::v1::{Job, JobTemplateSpec};
use serde::Deserialize;
use serde_json::Value;

/// The corpus must not shrink below this, so the test cannot pass by finding nothing.
const MINIMUM_FILES: usize = 100;

const MUTATE_OUTCOMES: [&str; 5] = ["mutated", "unchanged", "skipped", "not handled", "failed"];
const CHECK_VERDICTS: [&str; 8] = [
    "allowed",
    "exempt",
    "unjudged",
    "denied",
    "warned",
    "audited",
    "error",
    "not judged",
];

// === the expectation header ===

/// What one file expects, from its leading comment block.
#[derive(Debug, Default, PartialEq)]
struct Expectations {
    /// `repository path @ version` of each upstream file it follows.
    follows: Vec<String>,
    exit_mutate: Option<i32>,
    exit_check: Option<i32>,
    mutate: Vec<ObjectExpectation>,
    check: Vec<ObjectExpectation>,
}

/// `job/train mutated "podFailurePolicy"`: an object (lower-case kind, as `mutate` names it),
/// the outcomes accepted (alternatives written `a|b`), fragments its messages must contain.
#[derive(Debug, PartialEq)]
struct ObjectExpectation {
    object: String,
    outcomes: Vec<String>,
    fragments: Vec<String>,
}

/// Reads the expectations of a file's leading comment block (the lines before the first line
/// that is neither blank, a comment, nor `---`). Every malformed line is an error.
fn parse_header(text: &str) -> Result<Expectations, Vec<String>> {
    let mut expectations = Expectations::default();
    let mut errors = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if !(line.is_empty() || line.starts_with('#') || line == "---") {
            break;
        }
        let line_no = number + 1;
        if let Some(rest) = line.strip_prefix("# follows:") {
            let rest = rest.trim();
            match rest.split_once(" @ ") {
                Some((what, version))
                    if what.split_whitespace().count() >= 2 && !version.trim().is_empty() =>
                {
                    expectations.follows.push(rest.to_owned());
                }
                _ => errors.push(format!(
                    "line {line_no}: `# follows:` must read `OWNER/REPO PATH @ VERSION`, not `{rest}`"
                )),
            }
        } else if let Some(rest) = line.strip_prefix("# expect exit:") {
            if expectations.exit_mutate.is_some() {
                errors.push(format!("line {line_no}: a second `# expect exit:` line"));
            }
            match parse_exit(rest) {
                Ok((mutate, check)) => {
                    expectations.exit_mutate = Some(mutate);
                    expectations.exit_check = Some(check);
                }
                Err(error) => errors.push(format!("line {line_no}: {error}")),
            }
        } else if let Some(rest) = line.strip_prefix("# expect mutate:") {
            match parse_object(rest, &MUTATE_OUTCOMES) {
                Ok(expectation) => expectations.mutate.push(expectation),
                Err(error) => errors.push(format!("line {line_no}: {error}")),
            }
        } else if let Some(rest) = line.strip_prefix("# expect check:") {
            match parse_object(rest, &CHECK_VERDICTS) {
                Ok(expectation)
                    if expectation.outcomes == ["not judged"]
                        && !expectation.fragments.is_empty() =>
                {
                    errors.push(format!(
                        "line {line_no}: an object the guard does not judge has no message to match"
                    ));
                }
                Ok(expectation) => expectations.check.push(expectation),
                Err(error) => errors.push(format!("line {line_no}: {error}")),
            }
        } else if line.starts_with("# expect") {
            errors.push(format!(
                "line {line_no}: unknown expectation `{line}` (known: `# expect exit:`, \
                 `# expect mutate:`, `# expect check:`)"
            ));
        }
    }
    if expectations.follows.is_empty() {
        errors.push("no `# follows: OWNER/REPO PATH @ VERSION` line".to_owned());
    }
    if expectations.exit_mutate.is_none() {
        errors.push("no `# expect exit: mutate=N check=N` line".to_owned());
    }
    if expectations.mutate.is_empty() || expectations.check.is_empty() {
        errors.push("no `# expect mutate:` or no `# expect check:` line".to_owned());
    }
    if errors.is_empty() {
        Ok(expectations)
    } else {
        Err(errors)
    }
}

/// ` mutate=0 check=1`.
fn parse_exit(text: &str) -> Result<(i32, i32), String> {
    let mut mutate = None;
    let mut check = None;
    for word in text.split_whitespace() {
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| format!("`{word}` is not KEY=CODE"))?;
        let code: i32 = value
            .parse()
            .map_err(|_| format!("`{value}` is not an exit code"))?;
        match key {
            "mutate" if mutate.is_none() => mutate = Some(code),
            "check" if check.is_none() => check = Some(code),
            _ => return Err(format!("unknown or repeated key `{key}` (mutate, check)")),
        }
    }
    match (mutate, check) {
        (Some(mutate), Some(check)) => Ok((mutate, check)),
        _ => Err("`# expect exit:` needs both mutate=N and check=N".to_owned()),
    }
}

/// ` kind/name outcome[|outcome] ["fragment" ...]`.
fn parse_object(text: &str, vocabulary: &[&str]) -> Result<ObjectExpectation, String> {
    let text = text.trim();
    let (object, rest) = text
        .split_once(' ')
        .ok_or_else(|| format!("`{text}` needs `KIND/NAME OUTCOME`"))?;
    if !object.contains('/') || object.chars().any(char::is_uppercase) {
        return Err(format!(
            "`{object}` must be KIND/NAME with the kind in lower case (as mutate prints it)"
        ));
    }
    let (outcome_text, fragment_text) = match rest.find('"') {
        Some(start) => (&rest[..start], &rest[start..]),
        None => (rest, ""),
    };
    let outcome_text = outcome_text.trim();
    let outcomes: Vec<String> = outcome_text
        .split('|')
        .map(|outcome| outcome.trim().to_owned())
        .collect();
    for outcome in &outcomes {
        if !vocabulary.contains(&outcome.as_str()) {
            return Err(format!(
                "unknown outcome `{outcome}` for {object} (known: {})",
                vocabulary.join(", ")
            ));
        }
    }
    let mut fragments = Vec::new();
    let mut rest = fragment_text.trim();
    while !rest.is_empty() {
        let inner = rest
            .strip_prefix('"')
            .ok_or_else(|| format!("`{rest}`: fragments are \"quoted\""))?;
        let end = inner
            .find('"')
            .ok_or_else(|| format!("`{rest}`: a fragment is not closed"))?;
        if end == 0 {
            return Err("an empty fragment matches anything".to_owned());
        }
        fragments.push(inner[..end].to_owned());
        rest = inner[end + 1..].trim_start();
    }
    Ok(ObjectExpectation {
        object: object.to_owned(),
        outcomes,
        fragments,
    })
}

// === running the binary ===

struct Output {
    stdout: String,
    stderr: String,
    code: Option<i32>,
}

/// The binary with the default policy: nothing inherited from the environment of the run.
fn gpu_guard(args: &[&str], stdin: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-guard"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("GPU_GUARD_") {
            command.env_remove(key);
        }
    }
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("the gpu-guard binary runs");
    let pipe = child.stdin.take();
    // Written from another thread while this one drains stdout and stderr, so that neither
    // side can wait on a full pipe.
    let output = std::thread::scope(|scope| {
        if let (Some(mut pipe), Some(input)) = (pipe, stdin) {
            scope.spawn(move || pipe.write_all(input.as_bytes()).expect("stdin is written"));
        }
        child
            .wait_with_output()
            .expect("the gpu-guard binary finishes")
    });
    Output {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        code: output.status.code(),
    }
}

// === reading manifests independently ===

/// Every non-empty document of a YAML stream, by serde_norway (not gpu-guard's own reader).
fn documents(text: &str) -> Result<Vec<Value>, String> {
    let mut values = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = Value::deserialize(document).map_err(|e| e.to_string())?;
        if !value.is_null() {
            values.push(value);
        }
    }
    Ok(values)
}

/// The objects of the documents, the items of `List` documents flattened.
fn objects(documents: &[Value]) -> Vec<&Value> {
    let mut objects = Vec::new();
    for document in documents {
        let is_list = document
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|kind| kind.ends_with("List"));
        match document.get("items").and_then(Value::as_array) {
            Some(items) if is_list => objects.extend(items.iter()),
            _ => objects.push(document),
        }
    }
    objects
}

fn kind_of(object: &Value) -> &str {
    object.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// `job/train`: how `mutate` names an object, and how the header does.
fn object_key(object: &Value) -> String {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    format!("{}/{name}", kind_of(object).to_lowercase())
}

/// Serialized with key order, so that a reordering counts as a change.
fn exact(value: &Value) -> String {
    serde_json::to_string_pretty(value).expect("JSON values serialize")
}

// === the checks of one file ===

/// Everything that differs from what a file expects.
fn check_file(path: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => return vec![format!("cannot read the file: {error}")],
    };
    let expected = match parse_header(&text) {
        Ok(expected) => expected,
        Err(errors) => {
            return errors
                .into_iter()
                .map(|e| format!("expectation header: {e}"))
                .collect();
        }
    };
    let input_documents = match documents(&text) {
        Ok(documents) => documents,
        Err(error) => return vec![format!("serde_norway cannot read the input: {error}")],
    };
    let inputs = objects(&input_documents);
    let keys: Vec<String> = inputs.iter().map(|object| object_key(object)).collect();
    let unique: BTreeSet<&String> = keys.iter().collect();
    if unique.len() != keys.len() {
        problems.push(format!(
            "two objects share a kind and name ({keys:?}): the header could not tell them apart"
        ));
    }
    for (what, listed) in [("mutate", &expected.mutate), ("check", &expected.check)] {
        let named: Vec<&String> = listed.iter().map(|e| &e.object).collect();
        if named != keys.iter().collect::<Vec<_>>() {
            problems.push(format!(
                "the `# expect {what}:` lines name {named:?}, but the file's objects are, in \
                 order, {keys:?}"
            ));
        }
    }
    if !problems.is_empty() {
        return problems;
    }

    let file = path.to_string_lossy().into_owned();
    let mutated = gpu_guard(&["mutate", "-f", &file], None);
    if mutated.code != expected.exit_mutate {
        problems.push(format!(
            "mutate exited {:?}, expected {:?}\n{}",
            mutated.code,
            expected.exit_mutate,
            indent(&mutated.stderr)
        ));
    }
    let output_documents = match documents(&mutated.stdout) {
        Ok(documents) => documents,
        Err(error) => {
            problems.push(format!("serde_norway cannot read mutate's output: {error}"));
            return problems;
        }
    };
    let outputs = objects(&output_documents);
    if outputs.len() != inputs.len() {
        problems.push(format!(
            "mutate wrote {} object(s) for {} in the input",
            outputs.len(),
            inputs.len()
        ));
        return problems;
    }

    // What mutate did to each object, from its stderr and its output.
    let mut mutated_count = 0;
    for (index, expectation) in expected.mutate.iter().enumerate() {
        let (input, output) = (inputs[index], outputs[index]);
        let lines = object_lines(&mutated.stderr, &file, &expectation.object);
        let changed = exact(input) != exact(output);
        let outcome = mutate_outcome(&lines, changed);
        if outcome == "mutated" {
            mutated_count += 1;
        }
        let messages = lines.join("\n");
        if !expectation.outcomes.contains(&outcome) {
            problems.push(format!(
                "mutate: {} was {outcome}, expected {}{}",
                expectation.object,
                expectation.outcomes.join("|"),
                if messages.is_empty() {
                    " (no message names it)".to_owned()
                } else {
                    format!("\n{}", indent(&messages))
                }
            ));
        } else {
            for fragment in &expectation.fragments {
                if !messages.contains(fragment.as_str()) {
                    problems.push(format!(
                        "mutate: no message about {} contains \"{fragment}\"\n{}",
                        expectation.object,
                        indent(&messages)
                    ));
                }
            }
        }
        if outcome == "mutated" {
            problems.extend(
                api_rule_problems(output)
                    .into_iter()
                    .chain(shadowing_problems(input, output))
                    .chain(kept_content_problems(input, output))
                    .map(|p| format!("mutate: {}: {p}", expectation.object)),
            );
        } else if changed {
            problems.push(format!(
                "mutate: {} was not mutated but its content changed (read by serde_norway): {}",
                expectation.object,
                value_difference(input, output, String::new())
            ));
        }
    }
    problems.extend(summary_problems(
        &mutated.stderr,
        inputs.len(),
        mutated_count,
    ));

    // A second mutate changes nothing.
    let again = gpu_guard(&["mutate", "-f", "-"], Some(&mutated.stdout));
    if again.stdout != mutated.stdout {
        problems.push(format!(
            "a second mutate changed the output\n{}",
            indent(&first_difference(&mutated.stdout, &again.stdout))
        ));
    }

    // The guard's verdicts.
    let checked = gpu_guard(&["check", "-f", &file, "-o", "json"], None);
    if checked.code != expected.exit_check {
        problems.push(format!(
            "check exited {:?}, expected {:?}\n{}",
            checked.code,
            expected.exit_check,
            indent(&checked.stdout)
        ));
    }
    match serde_json::from_str::<Value>(&checked.stdout) {
        Ok(report) => problems.extend(verdict_problems(&report, &expected.check)),
        Err(error) => problems.push(format!(
            "check -o json printed no JSON ({error})\n{}",
            indent(&checked.stdout)
        )),
    }
    problems
}

/// The lines of `stderr` about one object of `file` (`FILE (document N) KIND/NAME: ...`),
/// with their `warning: ` or `error: ` prefix.
fn object_lines(stderr: &str, file: &str, object: &str) -> Vec<String> {
    let marker = format!(") {object}: ");
    stderr
        .lines()
        .filter(|line| {
            let message = line
                .strip_prefix("warning: ")
                .or_else(|| line.strip_prefix("error: "))
                .unwrap_or(line);
            message.starts_with(file) && message.contains(&marker)
        })
        .map(str::to_owned)
        .collect()
}

/// What `mutate` did to an object: its note (the unprefixed line), an error that wrote it
/// through, or, when it names nothing of the kind, whether the object changed.
fn mutate_outcome(lines: &[String], changed: bool) -> String {
    let note = lines
        .iter()
        .find(|line| !line.starts_with("warning: ") && !line.starts_with("error: "))
        .and_then(|line| line.split_once(": "))
        .map(|(_, note)| note.trim_start());
    let written_through = lines
        .iter()
        .any(|line| line.starts_with("error: ") && line.contains("written through unchanged"));
    let outcome = match note {
        _ if written_through => "failed",
        Some(note) if note.starts_with("skipped") => "skipped",
        Some(note) if note.starts_with("unchanged") => "unchanged",
        Some(note) if note.starts_with("not handled") => "not handled",
        Some(_) if changed => "mutated",
        None if changed => "changed without a note naming it",
        _ => "not handled",
    };
    outcome.to_owned()
}

/// The `summary:` line counts every object, and as many mutated as were.
fn summary_problems(stderr: &str, objects: usize, mutated: usize) -> Vec<String> {
    let Some(summary) = stderr.lines().find_map(|l| l.strip_prefix("summary: ")) else {
        return vec!["mutate printed no `summary:` line".to_owned()];
    };
    let mut problems = Vec::new();
    let total = summary
        .split_once(" object(s)")
        .and_then(|(count, _)| count.parse::<usize>().ok());
    if total != Some(objects) {
        problems.push(format!(
            "the summary counts {total:?} objects, the file has {objects}: `{summary}`"
        ));
    }
    let counted = summary
        .split_once("object(s): ")
        .map_or("", |(_, outcomes)| outcomes)
        .split(", ")
        .find_map(|part| {
            let (count, rest) = part.split_once(' ')?;
            if rest.starts_with("mutated (") {
                count.parse::<usize>().ok()
            } else {
                None
            }
        })
        .unwrap_or(0);
    if counted != mutated {
        problems.push(format!(
            "the summary counts {counted} mutated, {mutated} object(s) changed: `{summary}`"
        ));
    }
    problems
}

/// The guard's verdict per object, from `check -o json`.
fn verdict_problems(report: &Value, expected: &[ObjectExpectation]) -> Vec<String> {
    let mut findings: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for finding in report
        .get("findings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = finding.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = finding.get("name").and_then(Value::as_str).unwrap_or("");
        findings
            .entry(format!("{}/{name}", kind.to_lowercase()))
            .or_default()
            .push(finding);
    }
    let mut problems = Vec::new();
    for expectation in expected {
        let found = findings.remove(&expectation.object).unwrap_or_default();
        let verdict = match found.as_slice() {
            [] => "not judged".to_owned(),
            [finding] => finding
                .get("verdict")
                .and_then(Value::as_str)
                .unwrap_or("<no verdict>")
                .to_owned(),
            _ => {
                problems.push(format!(
                    "check: {} has {} findings",
                    expectation.object,
                    found.len()
                ));
                continue;
            }
        };
        let json = found.first().map(|f| f.to_string()).unwrap_or_default();
        let text = found.first().map(|f| finding_text(f)).unwrap_or_default();
        if !expectation.outcomes.contains(&verdict) {
            problems.push(format!(
                "check: {} was {verdict}, expected {}\n{}",
                expectation.object,
                expectation.outcomes.join("|"),
                indent(&json)
            ));
            continue;
        }
        for fragment in &expectation.fragments {
            if !text.contains(fragment.as_str()) {
                problems.push(format!(
                    "check: the finding of {} does not contain \"{fragment}\"\n{}",
                    expectation.object,
                    indent(&text)
                ));
            }
        }
    }
    for (object, _) in findings {
        problems.push(format!(
            "check: a finding for {object}, which the file does not have"
        ));
    }
    problems
}

/// What a finding says in words: its message, each reason (`field: what`) and what mutate
/// would change.
fn finding_text(finding: &Value) -> String {
    let text = |key: &str| finding.get(key).and_then(Value::as_str).unwrap_or("");
    let mut lines = vec![text("message").to_owned()];
    for reason in finding
        .get("reasons")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let part = |key: &str| reason.get(key).and_then(Value::as_str).unwrap_or("");
        lines.push(format!("{}: {}", part("field"), part("what")));
    }
    lines.push(text("mutation").to_owned());
    lines.join("\n")
}

// === the API rules on what gpu-guard mutated ===

/// Every violation of the API server's rules (Jobs, CronJob jobTemplates) and JobSet's webhook
/// rules (JobSets, Trainer runtimes' JobSet template) in a mutated object.
fn api_rule_problems(object: &Value) -> Vec<String> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    let violations = match (group, kind_of(object)) {
        ("batch", "Job") => decode::<Job>(object, "").map(|job| check_job(&job)),
        ("batch", "CronJob") => decode::<JobTemplateSpec>(object, "/spec/jobTemplate")
            .map(|template| check_job(&template_as_job(&template))),
        ("jobset.x-k8s.io", "JobSet") => decode::<JobSetSpec>(object, "/spec")
            .map(|spec| check_jobset_spec(&spec, &FieldPath::new(["spec"]))),
        ("trainer.kubeflow.org", "TrainingRuntime" | "ClusterTrainingRuntime") => {
            decode::<JobSetSpec>(object, "/spec/template/spec")
                .map(|spec| check_jobset_spec(&spec, &FieldPath::new(["spec", "template", "spec"])))
        }
        (_, kind) => Err(format!(
            "gpu-guard changed a {api_version} {kind}, a kind it does not mutate"
        )),
    };
    match violations {
        Ok(violations) => violations
            .iter()
            .map(|v| format!("the output breaks an API rule: {v}"))
            .collect(),
        Err(error) => vec![error],
    }
}

fn decode<T: serde::de::DeserializeOwned>(object: &Value, pointer: &str) -> Result<T, String> {
    let value = object
        .pointer(pointer)
        .cloned()
        .ok_or_else(|| format!("the output has no {pointer}"))?;
    serde_json::from_value(value).map_err(|e| format!("the output's {pointer} cannot be read: {e}"))
}

/// A mutated object keeps everything gpu-guard does not own, as it was (an embedded script in a
/// command, labels, fields newer than gpu-guard): the input and the output, without the fields
/// gpu-guard writes (docs/mutation.md), are the same.
fn kept_content_problems(input: &Value, output: &Value) -> Vec<String> {
    let (mut before, mut after) = (input.clone(), output.clone());
    without_owned_fields(&mut before);
    without_owned_fields(&mut after);
    if exact(&before) == exact(&after) {
        Vec::new()
    } else {
        vec![format!(
            "a field gpu-guard does not own changed: {}",
            value_difference(&before, &after, String::new())
        )]
    }
}

/// Removes what gpu-guard writes: the `gpu-guard.io/mutated` annotation; in each Job spec
/// (of a Job, a CronJob's jobTemplate, each replicated Job) `podFailurePolicy`,
/// `podReplacementPolicy` and `activeDeadlineSeconds`, its pod template's `gpu-guard.io/gang`
/// annotation, and in its pod template `restartPolicy`,
/// `terminationGracePeriodSeconds`, `tolerations` and each container's `restartPolicy` and
/// `restartPolicyRules`; a JobSet's `failurePolicy`. Nulls are removed too (gpu-guard may fill
/// a null parent it writes into).
fn without_owned_fields(object: &mut Value) {
    without_mutated_annotation(object);
    if let Some(spec) = jobset_spec_pointer(object)
        .and_then(|base| object.pointer_mut(base))
        .and_then(Value::as_object_mut)
    {
        spec.remove("failurePolicy");
    }
    for pointer in job_spec_pointers(object) {
        // The Job template's own metadata (a CronJob's jobTemplate, a replicated Job's
        // template) carries the annotation too, so the Jobs made from it do.
        if let Some(template) = pointer
            .strip_suffix("/spec")
            .and_then(|template| object.pointer_mut(template))
            .filter(|_| pointer != "/spec")
        {
            without_mutated_annotation(template);
        }
        let Some(spec) = object.pointer_mut(&pointer).and_then(Value::as_object_mut) else {
            continue;
        };
        // A gang Job's pods are annotated for the controller.
        if let Some(template) = spec.get_mut("template") {
            without_annotation(template, "gpu-guard.io/gang");
        }
        for field in [
            "podFailurePolicy",
            "podReplacementPolicy",
            "activeDeadlineSeconds",
        ] {
            spec.remove(field);
        }
        let Some(pod) = spec
            .get_mut("template")
            .and_then(|template| template.get_mut("spec"))
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        for field in [
            "restartPolicy",
            "terminationGracePeriodSeconds",
            "tolerations",
        ] {
            pod.remove(field);
        }
        for list in ["containers", "initContainers"] {
            for container in pod
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
                .filter_map(Value::as_object_mut)
            {
                container.remove("restartPolicy");
                container.remove("restartPolicyRules");
            }
        }
    }
    remove_nulls(object);
}

/// Removes `metadata.annotations["gpu-guard.io/mutated"]` of `object`, and the annotations and
/// metadata it leaves empty.
fn without_mutated_annotation(object: &mut Value) {
    without_annotation(object, "gpu-guard.io/mutated");
}

/// Removes `metadata.annotations[key]` of `object`, and the annotations and metadata it leaves
/// empty.
fn without_annotation(object: &mut Value, key: &str) {
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(annotations) = metadata
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(key);
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
    if metadata.is_empty()
        && let Some(fields) = object.as_object_mut()
    {
        fields.remove("metadata");
    }
}

fn remove_nulls(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            fields.retain(|_, field| !field.is_null());
            fields.values_mut().for_each(remove_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(remove_nulls),
        _ => {}
    }
}

/// Where the pod failure policies of an object are: `spec.podFailurePolicy.rules` of a Job, of
/// a CronJob's jobTemplate, of each replicated Job of a JobSet or a Trainer runtime.
fn rule_lists(object: &Value) -> Vec<String> {
    job_spec_pointers(object)
        .into_iter()
        .map(|spec| format!("{spec}/podFailurePolicy/rules"))
        .collect()
}

/// Where an object's JobSet spec is: `spec` of a JobSet, `spec.template.spec` of a Trainer
/// runtime.
fn jobset_spec_pointer(object: &Value) -> Option<&'static str> {
    match kind_of(object) {
        "JobSet" => Some("/spec"),
        "TrainingRuntime" | "ClusterTrainingRuntime" => Some("/spec/template/spec"),
        _ => None,
    }
}

/// Where an object's Job specs are: a Job's `spec`, a CronJob's jobTemplate, each replicated
/// Job of a JobSet or a Trainer runtime.
fn job_spec_pointers(object: &Value) -> Vec<String> {
    if let Some(base) = jobset_spec_pointer(object) {
        let count = object
            .pointer(&format!("{base}/replicatedJobs"))
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        return (0..count)
            .map(|i| format!("{base}/replicatedJobs/{i}/template/spec"))
            .collect();
    }
    match kind_of(object) {
        "CronJob" => vec!["/spec/jobTemplate/spec".to_owned()],
        "Job" => vec!["/spec".to_owned()],
        _ => Vec::new(),
    }
}

/// The rules gpu-guard added never decide what a rule the user wrote decided: the Job
/// controller takes the first matching rule, so an added rule placed before a user's rule
/// must not match any exit code (of the same container) or pod condition that the user's rule
/// matches (docs/mutation.md: "A device rule the Job already handles is not added").
fn shadowing_problems(input: &Value, output: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for pointer in rule_lists(output) {
        let before: Vec<&Value> = input
            .pointer(&pointer)
            .and_then(Value::as_array)
            .map(|rules| rules.iter().collect())
            .unwrap_or_default();
        let Some(after) = output.pointer(&pointer).and_then(Value::as_array) else {
            continue;
        };
        for (added_at, added) in after.iter().enumerate() {
            if before.contains(&added) {
                continue;
            }
            for (user_at, user) in after.iter().enumerate().skip(added_at + 1) {
                if !before.contains(&user) {
                    continue;
                }
                if let Some(what) = overlap(added, user) {
                    problems.push(format!(
                        "{pointer}/{added_at} (added) takes {what} from the user's own rule \
                         {pointer}/{user_at}: {user}"
                    ));
                }
            }
        }
    }
    problems
}

/// What two pod failure policy rules both match, if anything.
fn overlap(first: &Value, second: &Value) -> Option<String> {
    if let (Some(a), Some(b)) = (first.get("onExitCodes"), second.get("onExitCodes")) {
        let (x, y) = (a.get("containerName"), b.get("containerName"));
        if let (Some(x), Some(y)) = (x.and_then(Value::as_str), y.and_then(Value::as_str))
            && x != y
        {
            return None;
        }
        let matches = |rule: &Value, code: i64| {
            let listed = rule
                .get("values")
                .and_then(Value::as_array)
                .is_some_and(|values| values.iter().any(|v| v.as_i64() == Some(code)));
            match rule.get("operator").and_then(Value::as_str) {
                Some("In") => listed,
                Some("NotIn") => !listed,
                _ => false,
            }
        };
        return (1..=255)
            .find(|&code| matches(a, code) && matches(b, code))
            .map(|code| format!("exit code {code}"));
    }
    let patterns = |rule: &Value| -> Vec<(String, String)> {
        rule.get("onPodConditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|pattern| {
                let field = |name: &str, default: &str| {
                    pattern
                        .get(name)
                        .and_then(Value::as_str)
                        .unwrap_or(default)
                        .to_owned()
                };
                (field("type", ""), field("status", "True"))
            })
            .collect()
    };
    let theirs = patterns(second);
    patterns(first)
        .into_iter()
        .find(|pattern| theirs.contains(pattern))
        .map(|(kind, status)| format!("pod condition {kind}={status}"))
}

// === reporting ===

fn indent(text: &str) -> String {
    text.lines()
        .map(|line| format!("    | {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where two values first differ (a JSON pointer), and how.
fn value_difference(input: &Value, output: &Value, at: String) -> String {
    match (input, output) {
        (Value::Object(a), Value::Object(b)) => {
            let (keys_a, keys_b): (Vec<&String>, Vec<&String>) =
                (a.keys().collect(), b.keys().collect());
            if keys_a != keys_b {
                return format!("{at}: keys {keys_a:?} became {keys_b:?}");
            }
            a.iter()
                .find(|(key, value)| exact(value) != exact(&b[key.as_str()]))
                .map(|(key, value)| {
                    value_difference(value, &b[key.as_str()], format!("{at}/{key}"))
                })
                .unwrap_or_default()
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find(|(_, (x, y))| exact(x) != exact(y))
            .map(|(i, (x, y))| value_difference(x, y, format!("{at}/{i}")))
            .unwrap_or_default(),
        _ => format!("{at}: {input} became {output}"),
    }
}

/// The first line where two texts differ, with its number.
fn first_difference(first: &str, second: &str) -> String {
    let (mut a, mut b) = (first.lines(), second.lines());
    let mut number = 1;
    loop {
        match (a.next(), b.next()) {
            (None, None) => return "the texts differ only in line endings".to_owned(),
            (x, y) if x != y => {
                return format!("line {number}: {x:?} became {y:?}");
            }
            _ => number += 1,
        }
    }
}

/// Every manifest under `tests/corpus/`, sorted.
fn corpus_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files = Vec::new();
    let mut pending = vec![root];
    while let Some(directory) = pending.pop() {
        let entries = std::fs::read_dir(&directory)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", directory.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .extension()
                .is_some_and(|extension| extension == "yaml" || extension == "yml")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_corpus_file_gets_what_its_header_expects() {
    let files = corpus_files();
    let next = AtomicUsize::new(0);
    let failures: Mutex<Vec<(PathBuf, Vec<String>)>> = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(path) = files.get(index) else { break };
                    let problems = check_file(path);
                    if !problems.is_empty() {
                        failures
                            .lock()
                            .expect("no worker panics holding the lock")
                            .push((path.clone(), problems));
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().expect("the workers are done");
    failures.sort();
    let too_few = files.len() < MINIMUM_FILES;
    if failures.is_empty() && !too_few {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut report = String::new();
    if too_few {
        let _ = writeln!(
            report,
            "the corpus has {} files, fewer than {MINIMUM_FILES}: tests/corpus/ lost files",
            files.len()
        );
    }
    let _ = writeln!(
        report,
        "{} of {} corpus files differ from their expectations:",
        failures.len(),
        files.len()
    );
    for (path, _) in &failures {
        let _ = writeln!(
            report,
            "  {}",
            path.strip_prefix(root).unwrap_or(path).display()
        );
    }
    for (path, problems) in &failures {
        let _ = writeln!(
            report,
            "\n=== {}",
            path.strip_prefix(root).unwrap_or(path).display()
        );
        for problem in problems {
            let _ = writeln!(report, "- {problem}");
        }
    }
    panic!("{report}");
}

#[test]
fn a_malformed_or_missing_header_is_refused_with_the_line_at_fault() {
    let good = "# follows: kubernetes-sigs/jobset examples/simple/max-restarts.yaml @ 7d3cf3e\n\
                # expect exit: mutate=0 check=1\n\
                # expect mutate: job/train mutated \"podFailurePolicy (\" \"60\"\n\
                # expect check: job/train allowed|exempt\n\
                apiVersion: batch/v1\n\
                # expect mutate: job/ignored-after-the-header unchanged\n";
    let parsed = parse_header(good).expect("a well-formed header");
    assert_eq!(parsed.exit_mutate, Some(0));
    assert_eq!(parsed.exit_check, Some(1));
    assert_eq!(
        parsed.mutate,
        vec![ObjectExpectation {
            object: "job/train".to_owned(),
            outcomes: vec!["mutated".to_owned()],
            fragments: vec!["podFailurePolicy (".to_owned(), "60".to_owned()],
        }]
    );
    assert_eq!(parsed.check[0].outcomes, ["allowed", "exempt"]);

    let cases = [
        ("", "no `# follows:"),
        ("# follows: somewhere\n", "`# follows:` must read"),
        (
            "# follows: a/b c @ v1\n# expect mutate: job/x mutated\n# expect check: job/x allowed\n",
            "no `# expect exit:",
        ),
        (
            "# follows: a/b c @ v1\n# expect exit: mutate=0\n",
            "needs both mutate=N and check=N",
        ),
        (
            "# follows: a/b c @ v1\n# expect exit: mutate=0 check=0\n# expect mutate: job/x changed\n",
            "unknown outcome `changed`",
        ),
        (
            "# follows: a/b c @ v1\n# expect exit: mutate=0 check=0\n# expect mutate: Job/x mutated\n",
            "lower case",
        ),
        (
            "# follows: a/b c @ v1\n# expect exit: mutate=0 check=0\n# expect mutate: job/x mutated \"open\n",
            "not closed",
        ),
        (
            "# follows: a/b c @ v1\n# expect exit: mutate=0 check=0\n# expect check: pytorchjob/x not judged \"why\"\n",
            "no message to match",
        ),
        (
            "# follows: a/b c @ v1\n# expect exit: mutate=0 check=0\n# expect mutated: job/x mutated\n",
            "unknown expectation",
        ),
    ];
    for (header, wanted) in cases {
        let errors = parse_header(header).expect_err(header);
        assert!(
            errors.iter().any(|e| e.contains(wanted)),
            "{header:?}: expected an error containing {wanted:?}, got {errors:?}"
        );
    }
}

#[test]
fn an_added_rule_that_takes_a_users_exit_code_is_found() {
    let user = serde_json::json!({"action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "NotIn", "values": [0]}});
    let device = serde_json::json!({"action": "Ignore",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [74, 75, 138]}});
    let other_container = serde_json::json!({"action": "Ignore",
        "onExitCodes": {"containerName": "sidecar", "operator": "In", "values": [74]}});
    let condition = serde_json::json!({"action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]});
    let user_condition = serde_json::json!({"action": "Count",
        "onPodConditions": [{"type": "DisruptionTarget"}]});
    assert_eq!(overlap(&device, &user).as_deref(), Some("exit code 74"));
    assert_eq!(overlap(&other_container, &user), None);
    assert_eq!(overlap(&condition, &user), None);
    assert_eq!(
        overlap(&condition, &user_condition).as_deref(),
        Some("pod condition DisruptionTarget=True")
    );
    let job = |rules: Vec<Value>| serde_json::json!({"kind": "Job", "spec": {"podFailurePolicy": {"rules": rules}}});
    let input = job(vec![user.clone()]);
    assert_eq!(
        shadowing_problems(&input, &job(vec![condition.clone(), device, user.clone()])).len(),
        1
    );
    assert!(shadowing_problems(&input, &job(vec![condition, user])).is_empty());
}
