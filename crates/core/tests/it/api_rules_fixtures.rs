//! The API-rules checker against what a real kube-apiserver v1.36 said about the same Jobs
//! (`tests/fixtures/apiserver-cases/`, `tests/fixtures/apiserver-validation-errors.txt`):
//! the valid Job passes, and each rejected Job yields exactly the server's error lines, with
//! the same field paths, messages and order.

use std::path::Path;

use gpu_guard_core::api_rules::job::check_job;
use k8s_openapi::api::batch::v1::Job;

const CASES: &str = "tests/fixtures/apiserver-cases";

fn load(name: &str) -> Job {
    let text = std::fs::read_to_string(Path::new(CASES).join(name)).expect("fixture exists");
    serde_norway::from_str(&text).expect("fixture decodes as a Job")
}

/// The error lines kubectl printed for one case: either the text after `is invalid: ` on the
/// line itself, or the `* ` lines that follow it.
fn server_errors(case: &str) -> Vec<String> {
    let transcript = std::fs::read_to_string("tests/fixtures/apiserver-validation-errors.txt")
        .expect("transcript exists");
    let marker = format!("--- kubectl create --dry-run=server -f {case}.yaml");
    let mut lines = transcript
        .lines()
        .skip_while(|line| *line != marker)
        .skip(1);
    let first = lines.next().expect("the case is in the transcript");
    let (_, inline) = first
        .split_once(" is invalid: ")
        .expect("the server rejected the case");
    if !inline.trim().is_empty() {
        return vec![inline.to_owned()];
    }
    lines
        .take_while(|line| line.starts_with("* "))
        .map(|line| line[2..].to_owned())
        .collect()
}

#[test]
fn the_valid_job_passes() {
    assert_eq!(check_job(&load("02-job-valid-pfp.yaml")), vec![]);
}

#[test]
fn every_rejected_job_yields_the_servers_errors() {
    let mut cases: Vec<String> = std::fs::read_dir(CASES)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("invalid-"))
        .collect();
    cases.sort();
    assert_eq!(cases.len(), 12, "every rejected case is checked");
    for file in cases {
        let case = file.trim_end_matches(".yaml");
        let expected = server_errors(case);
        assert!(
            !expected.is_empty(),
            "{case}: no errors found in the transcript"
        );
        let found: Vec<String> = check_job(&load(&file))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(found, expected, "{case}");
    }
}
