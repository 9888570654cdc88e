//! The cases of JobSet's `failure_policy_test.go` (kubernetes-sigs/jobset v0.12.0) that one
//! failed child Job expresses, re-expressed as tables.

use super::*;
use serde_json::{Value, json};

const RJ1: &str = "test-replicated-job-1";
const RJ2: &str = "test-replicated-job-2";
const BACKOFF: &str = "BackoffLimitExceeded";
const DEADLINE: &str = "DeadlineExceeded";

fn rule(fields: Value) -> JobSetFailurePolicyRule {
    serde_json::from_value(fields).unwrap()
}

fn failed<'a>(replicated_job: &'a str, reason: &'a str, message: &'a str) -> FailedJob<'a> {
    FailedJob {
        name: "test-job",
        replicated_job,
        reason,
        message,
    }
}

#[test]
fn the_upstream_rule_is_applicable_table() {
    let cases = [
        (
            "any replicated Job, any reason",
            json!({}),
            failed(RJ1, BACKOFF, ""),
            true,
        ),
        (
            "any replicated Job, the reason named",
            json!({"onJobFailureReasons": [BACKOFF]}),
            failed(RJ1, BACKOFF, ""),
            true,
        ),
        (
            "any replicated Job, another reason",
            json!({"onJobFailureReasons": [BACKOFF]}),
            failed(RJ1, DEADLINE, ""),
            false,
        ),
        (
            "the replicated Job named, any reason",
            json!({"targetReplicatedJobs": [RJ1]}),
            failed(RJ1, DEADLINE, ""),
            true,
        ),
        (
            "the replicated Job and the reason named",
            json!({"targetReplicatedJobs": [RJ1], "onJobFailureReasons": [BACKOFF]}),
            failed(RJ1, BACKOFF, ""),
            true,
        ),
        (
            "the replicated Job named, another reason",
            json!({"targetReplicatedJobs": [RJ1], "onJobFailureReasons": [BACKOFF]}),
            failed(RJ1, DEADLINE, ""),
            false,
        ),
        (
            "another replicated Job, any reason",
            json!({"targetReplicatedJobs": [RJ1]}),
            failed(RJ2, BACKOFF, ""),
            false,
        ),
        (
            "another replicated Job, the reason named",
            json!({"targetReplicatedJobs": [RJ1], "onJobFailureReasons": [BACKOFF]}),
            failed(RJ2, BACKOFF, ""),
            false,
        ),
        (
            "another replicated Job, another reason",
            json!({"targetReplicatedJobs": [RJ1], "onJobFailureReasons": [BACKOFF]}),
            failed(RJ2, DEADLINE, ""),
            false,
        ),
        (
            "the message pattern matches",
            json!({"onJobFailureMessagePatterns": ["^job failed because.*"]}),
            failed(RJ1, "", "job failed because of a bug"),
            true,
        ),
        (
            "the message pattern does not match",
            json!({"onJobFailureMessagePatterns": ["^job failed because.*"]}),
            failed(RJ1, "", "another error message"),
            false,
        ),
        (
            "reason and message pattern both match",
            json!({"onJobFailureReasons": [BACKOFF], "onJobFailureMessagePatterns": [".*bug.*"]}),
            failed(RJ1, BACKOFF, "job failed because of a bug"),
            true,
        ),
        (
            "the reason matches, the message pattern does not",
            json!({"onJobFailureReasons": [BACKOFF], "onJobFailureMessagePatterns": [".*bug.*"]}),
            failed(RJ1, BACKOFF, "job failed due to something else"),
            false,
        ),
        // Beyond the table: a pattern is searched, not anchored, as Go's MatchString does; a
        // pattern that does not compile is skipped; a Job without its replicated Job never
        // matches.
        (
            "a pattern is found anywhere in the message",
            json!({"onJobFailureMessagePatterns": ["rule at index 1$"]}),
            failed(
                RJ1,
                "PodFailurePolicy",
                "Container c for pod ns/p failed with exit code 3 matching FailJob rule at index 1",
            ),
            true,
        ),
        (
            "an invalid pattern is skipped, the next one tried",
            json!({"onJobFailureMessagePatterns": ["(", "bug"]}),
            failed(RJ1, "", "a bug"),
            true,
        ),
        (
            "no replicated Job label",
            json!({}),
            failed("", BACKOFF, ""),
            false,
        ),
    ];
    for (case, fields, job, applies) in cases {
        assert_eq!(rule_applies(&rule(fields), &job), applies, "{case}");
    }
}

fn spec(failure_policy: Value) -> JobSetSpec {
    serde_json::from_value(json!({"replicatedJobs": [], "failurePolicy": failure_policy})).unwrap()
}

#[test]
fn the_first_applicable_rule_wins_else_restart_jobset() {
    let rules = json!([
        {"name": "r1", "action": "FailJobSet", "onJobFailureReasons": [BACKOFF]},
        {"name": "r2", "action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": [DEADLINE]},
        {"name": "r3", "action": "FailJobSet", "onJobFailureReasons": ["FailedIndexes"]}
    ]);
    let spec = spec(json!({"maxRestarts": 3, "rules": rules}));
    for (reason, rule) in [
        (BACKOFF, Some(0)),
        (DEADLINE, Some(1)),
        ("FailedIndexes", Some(2)),
        ("PodFailurePolicy", None),
    ] {
        let outcome = step(&spec, &failed(RJ1, reason, ""), 0, false);
        assert_eq!(outcome.rule.map(|(index, _)| index), rule, "{reason}");
    }
    // Without rules, or when none applies: RestartJobSet, the default.
    let none = step(&spec, &failed(RJ1, "PodFailurePolicy", ""), 0, false);
    assert_eq!(none.action, Some(Action::RestartJobSet));
    let unmatched =
        spec_with_rules(json!([{"action": "FailJobSet", "targetReplicatedJobs": ["x"]}]));
    assert_eq!(
        step(&unmatched, &failed(RJ1, BACKOFF, ""), 0, false).action,
        Some(Action::RestartJobSet)
    );
}

fn spec_with_rules(rules: Value) -> JobSetSpec {
    spec(json!({"maxRestarts": 1, "rules": rules}))
}

#[test]
fn the_upstream_apply_action_table() {
    let job = failed(RJ1, BACKOFF, "");
    // FailJobSet.
    let fail = spec_with_rules(json!([{"name": "stop", "action": "FailJobSet"}]));
    assert_eq!(
        step(&fail, &job, 0, false).step,
        Step::Failed {
            reason: "FailJobSetFailurePolicyAction",
            message: "applying FailJobSet failure policy action (first failed job: test-job)"
                .to_owned()
        }
    );
    // RestartJobSet below maxRestarts counts; the condition names the rule, or the default.
    let restart =
        spec(json!({"maxRestarts": 3, "rules": [{"name": "again", "action": "RestartJobSet"}]}));
    assert_eq!(
        step(&restart, &job, 1, false).step,
        Step::Restarted {
            counted: true,
            restarts_left: 1,
            condition_reason: "FailurePolicy_again".to_owned()
        }
    );
    let default = spec(json!({"maxRestarts": 3}));
    assert_eq!(
        step(&default, &job, 0, false).step,
        Step::Restarted {
            counted: true,
            restarts_left: 2,
            condition_reason: "DefaultFailurePolicy".to_owned()
        }
    );
    // At maxRestarts the JobSet fails.
    assert_eq!(
        step(&restart, &job, 3, false).step,
        Step::Failed {
            reason: "ReachedMaxRestarts",
            message:
                "jobset failed due to reaching max number of restarts (first failed job: test-job)"
                    .to_owned()
        }
    );
    // RestartJobSetAndIgnoreMaxRestarts does not count, even at the limit.
    let ignore =
        spec_with_rules(json!([{"name": "host", "action": "RestartJobSetAndIgnoreMaxRestarts"}]));
    assert!(matches!(
        step(&ignore, &job, 5, false).step,
        Step::Restarted { counted: false, .. }
    ));
    // RestartJob needs a gate that v0.12.0 leaves off.
    let one = spec_with_rules(json!([{"name": "one", "action": "RestartJob"}]));
    assert!(matches!(step(&one, &job, 0, false).step, Step::Refused(_)));
}

#[test]
fn without_a_failure_policy_the_jobset_fails() {
    let spec: JobSetSpec = serde_json::from_value(json!({"replicatedJobs": []})).unwrap();
    let outcome = step(&spec, &failed(RJ1, BACKOFF, ""), 0, false);
    assert_eq!(outcome.action, None);
    assert_eq!(
        outcome.step,
        Step::Failed {
            reason: "FailedJobs",
            message: "jobset failed due to one or more job failures (first failed job: test-job)"
                .to_owned()
        }
    );
    // A failure policy without maxRestarts allows no restart.
    let bare = super::tests::spec(json!({}));
    assert!(matches!(
        step(&bare, &failed(RJ1, BACKOFF, ""), 0, false).step,
        Step::Failed {
            reason: "ReachedMaxRestarts",
            ..
        }
    ));
}

#[test]
fn with_the_restart_job_gate_only_the_failed_job_is_recreated() {
    let job = failed(RJ1, BACKOFF, "");
    // Counted restarts (the JobSet's and its Jobs') below maxRestarts: the Job is recreated,
    // and the restart counts.
    let one = spec(json!({"maxRestarts": 5, "rules": [{"name": "one", "action": "RestartJob"}]}));
    assert_eq!(
        step(&one, &job, 0, true).step,
        Step::JobRestarted {
            counted: true,
            restarts_left: 4
        }
    );
    // At maxRestarts, counting a Job's earlier restart: the JobSet fails.
    let two = spec(json!({"maxRestarts": 2, "rules": [{"name": "one", "action": "RestartJob"}]}));
    assert!(matches!(
        step(&two, &job, 2, true).step,
        Step::Failed {
            reason: "ReachedMaxRestarts",
            ..
        }
    ));
    // RestartJobSet at the combined limit fails too.
    let all =
        spec(json!({"maxRestarts": 2, "rules": [{"name": "all", "action": "RestartJobSet"}]}));
    assert!(matches!(
        step(&all, &job, 2, true).step,
        Step::Failed {
            reason: "ReachedMaxRestarts",
            ..
        }
    ));
    // RestartJobAndIgnoreMaxRestarts does not count, even at the limit.
    let free = spec(
        json!({"maxRestarts": 1, "rules": [{"name": "free", "action": "RestartJobAndIgnoreMaxRestarts"}]}),
    );
    assert_eq!(
        step(&free, &job, 1, true).step,
        Step::JobRestarted {
            counted: false,
            restarts_left: 0
        }
    );
}
