//! `gpu-guard simulate` on real-shaped manifests: JobSet's own failure-policy examples
//! (tests/fixtures/jobset) and a GPU Job before and after gpu-guard.

use serde_json::Value;

use crate::support::run_in_process;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn simulate(args: &[&str]) -> (Value, String, i32) {
    let ran = run_in_process(
        ["gpu-guard", "simulate", "-o", "json"]
            .iter()
            .chain(args)
            .copied(),
    );
    let json = serde_json::from_str(&ran.stdout).unwrap_or(Value::Null);
    (json, ran.stderr, ran.exit_code)
}

#[test]
fn host_maintenance_restarts_without_counting_and_a_leader_crash_counts() {
    let file = format!("{FIXTURES}/jobset/host-maintenance-event-model.yaml");
    // The leader is evicted for host maintenance: its Job fails by its FailJob rule, and the
    // JobSet's first rule restarts it without counting, even with maxRestarts 0.
    let (json, stderr, code) = simulate(&[
        "-f",
        &file,
        "--replicated-job",
        "leader",
        "--condition",
        "DisruptionTarget",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let result = &json[0];
    assert_eq!(result["kind"], "JobSet");
    assert_eq!(result["job"]["action"], "FailJob");
    assert_eq!(result["job"]["reason"], "PodFailurePolicy");
    assert_eq!(
        result["job"]["message"],
        "Pod default/host-maintenance-event-model-leader-0-0-xxxxx has condition DisruptionTarget \
         matching FailJob rule at index 0"
    );
    assert_eq!(result["jobSet"]["rule"], "failurePolicyRule0");
    assert_eq!(
        result["jobSet"]["action"],
        "RestartJobSetAndIgnoreMaxRestarts"
    );
    assert_eq!(result["jobSet"]["jobSetFailed"], false);
    // The leader crashes: backoffLimit 0 fails its Job, the second rule restarts the JobSet,
    // and with maxRestarts 0 that fails it.
    let (json, _, _) = simulate(&[
        "-f",
        &file,
        "--replicated-job",
        "leader",
        "--container",
        "leader",
        "--exit-code",
        "2",
    ]);
    let result = &json[0];
    assert_eq!(result["job"]["reason"], "BackoffLimitExceeded");
    assert_eq!(result["jobSet"]["rule"], "failurePolicyRule1");
    assert_eq!(result["jobSet"]["jobSetFailed"], true);
    assert_eq!(result["jobSet"]["reason"], "ReachedMaxRestarts");
}

#[test]
fn as_mutated_shows_what_gpu_guard_changes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(
        &file,
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: train, namespace: ml}\nspec:\n  \
         template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: \
         trainer\n        image: trainer:1\n        resources: {limits: {nvidia.com/gpu: \"8\"}}\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let device = ["--container", "trainer", "--exit-code", "74"];
    let (written, _, _) = simulate(&[&["-f", file][..], &device].concat());
    assert_eq!(written[0]["job"]["counted"], true);
    let (admitted, _, _) = simulate(&[&["-f", file, "--as-mutated"][..], &device].concat());
    assert_eq!(admitted[0]["job"]["counted"], false);
    assert_eq!(admitted[0]["job"]["action"], "Ignore");
    // The text output tells the same story.
    let ran = run_in_process([
        "gpu-guard",
        "simulate",
        "-f",
        file,
        "--as-mutated",
        "--container",
        "trainer",
        "--exit-code",
        "74",
    ]);
    assert!(ran.stdout.contains("matches: Ignore"), "{}", ran.stdout);
    assert!(
        ran.stdout.contains("not counted: the pod is replaced"),
        "{}",
        ran.stdout
    );
}

#[test]
fn bad_input_is_exit_2_with_a_message() {
    let file = format!("{FIXTURES}/jobset/host-maintenance-event-model.yaml");
    let (_, stderr, code) = simulate(&["-f", &file, "--replicated-job", "nope"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("has no replicated Job \"nope\" (it has: leader, workers)"),
        "{stderr}"
    );
    let (_, stderr, code) = simulate(&["-f", &file, "--container", "leader"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("go in pairs"), "{stderr}");
}

/// Every `$ gpu-guard simulate ...` example of the docs prints what the page shows: the pages
/// use the command's output where they describe outcomes.
#[test]
fn the_examples_in_the_docs_are_what_it_prints() {
    for (page, expected) in [
        ("simulate.md", 6),
        ("mutation.md", 4),
        ("gang.md", 2),
        ("controller.md", 2),
    ] {
        let path = format!("{}/docs/{page}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let mut examples = 0;
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            let Some(command) = line.strip_prefix("$ ") else {
                continue;
            };
            let mut shown = String::new();
            while let Some(next) = lines.peek() {
                if next.is_empty() || next.starts_with("```") || next.starts_with("$ ") {
                    break;
                }
                shown.push_str(lines.next().unwrap());
                shown.push('\n');
            }
            let ran = run_in_process(command.split_whitespace());
            assert_eq!(ran.exit_code, 0, "{page}: {command}: {}", ran.stderr);
            assert_eq!(ran.stdout, shown, "docs/{page} is stale for: {command}");
            examples += 1;
        }
        assert_eq!(examples, expected, "the examples of docs/{page}");
    }
}
