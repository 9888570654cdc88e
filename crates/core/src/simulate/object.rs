//! PURE: one workload object (a Job, a CronJob's Job template, a JobSet, a Trainer runtime's
//! JobSet template) and one pod failure, through [`super::job`] and [`super::jobset`]: the
//! outcome at each level, and the story in lines a person reads.

use std::fmt::Write as _;

use k8s_openapi::api::batch::v1::{JobSpec, PodFailurePolicyRule};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition, PodSpec,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::Value;

use super::job::{self, History, Step};
use super::jobset::{self, FailedJob};
use crate::decode::{self, JsonError};
use crate::jobset::{JobSetSpec, default_rule_name};
use crate::mutate::object::MutableKind;

/// The pod failure to simulate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failure {
    /// Containers (or init containers) that terminated, with their exit codes.
    pub exits: Vec<(String, i32)>,
    /// Pod conditions with status `True`.
    pub conditions: Vec<String>,
    /// For a JobSet: the replicated Job whose pod fails (default: the first).
    pub replicated_job: Option<String>,
    /// For an Indexed Job: the failing pod's completion index (default 0).
    pub index: Option<i32>,
    /// Pod failures counted so far (and, with `backoffLimitPerIndex`, of this index).
    pub failed_so_far: i32,
    /// JobSet restarts done so far that count against `maxRestarts`.
    pub restarts_so_far: i32,
    /// JobSet's `RestartJob` feature gate (alpha, off by default in v0.12.0) is on.
    pub restart_job_gate: bool,
}

/// Why an object cannot be simulated as asked.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("the object does not decode as a {kind}: {source}")]
    Decode {
        kind: &'static str,
        #[source]
        source: JsonError,
    },
    #[error("{what} has no pod template spec")]
    NoPodSpec { what: String },
    #[error(
        "{what} has no container or init container {name:?} (it has: {known}); name one of \
         them with --container"
    )]
    UnknownContainer {
        what: String,
        name: String,
        known: String,
    },
    #[error("{what} has no replicated Job {name:?} (it has: {known})")]
    UnknownReplicatedJob {
        what: String,
        name: String,
        known: String,
    },
    #[error("{what} has no replicated Job")]
    NoReplicatedJob { what: String },
}

/// The Job level of a simulation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobResult {
    pub rule_index: Option<usize>,
    pub action: Option<&'static str>,
    pub counted: bool,
    pub job_failed: bool,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// The JobSet level of a simulation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSetResult {
    /// The rule's name (as JobSet's webhook defaults it); null when none applied.
    pub rule: Option<String>,
    pub rule_index: Option<usize>,
    /// Null when the child Job did not fail (the JobSet is not involved).
    pub action: Option<&'static str>,
    pub restarts_left: Option<i32>,
    pub job_set_failed: bool,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// One simulated workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Simulation {
    pub kind: &'static str,
    pub namespace: Option<String>,
    pub name: String,
    pub job: JobResult,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_set: Option<JobSetResult>,
    /// The story, a line a step.
    pub story: Vec<String>,
}

/// Simulates `failure` on `raw`, a workload of a kind `simulate` reads; `None` for any other
/// object.
pub fn simulate(raw: &Value, failure: &Failure) -> Option<Result<Simulation, SimulateError>> {
    let kind = MutableKind::of(raw)?;
    Some(simulate_kind(raw, kind, failure))
}

fn simulate_kind(
    raw: &Value,
    kind: MutableKind,
    failure: &Failure,
) -> Result<Simulation, SimulateError> {
    let part = |pointer: &str| raw.pointer(pointer).cloned().unwrap_or(Value::Null);
    let decode_error = |source| SimulateError::Decode {
        kind: kind.api_name(),
        source,
    };
    let metadata: ObjectMeta = decode::from_json_value(&part("/metadata")).map_err(decode_error)?;
    let name = metadata.name.clone().unwrap_or_default();
    let namespace = metadata.namespace.clone();
    // A manifest without a namespace is created in the client's, usually `default`.
    let pod_namespace = Some(namespace.as_deref().unwrap_or("default"));
    let what = format!(
        "{} {}",
        kind.api_name(),
        qualified(namespace.as_deref(), &name)
    );
    let jobset_root = match kind {
        MutableKind::Job => None,
        MutableKind::CronJob => None,
        MutableKind::JobSet => Some("/spec"),
        MutableKind::TrainingRuntime | MutableKind::ClusterTrainingRuntime => {
            Some("/spec/template/spec")
        }
    };
    let mut story = Vec::new();
    let Some(root) = jobset_root else {
        let pointer = if kind == MutableKind::CronJob {
            "/spec/jobTemplate/spec"
        } else {
            "/spec"
        };
        let spec: JobSpec = decode::from_json_value(&part(pointer)).map_err(decode_error)?;
        let pod_name = pod_name(&name, &spec, failure);
        let (job, _) = job_level(&spec, &what, pod_namespace, &pod_name, failure, &mut story)?;
        return Ok(Simulation {
            kind: kind.info().kind,
            namespace,
            name,
            job,
            job_set: None,
            story,
        });
    };
    let spec: JobSetSpec = decode::from_json_value(&part(root)).map_err(decode_error)?;
    let known = || {
        spec.replicated_jobs
            .iter()
            .map(|rj| rj.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let replicated = match &failure.replicated_job {
        Some(wanted) => spec
            .replicated_jobs
            .iter()
            .find(|rj| rj.name == *wanted)
            .ok_or_else(|| SimulateError::UnknownReplicatedJob {
                what: what.clone(),
                name: wanted.clone(),
                known: known(),
            })?,
        None => spec
            .replicated_jobs
            .first()
            .ok_or_else(|| SimulateError::NoReplicatedJob { what: what.clone() })?,
    };
    // A runtime's JobSet takes the TrainJob's name; the child Jobs are `<jobset>-<rj>-<i>`.
    let jobset_name = if jobset_root == Some("/spec") {
        name.clone()
    } else {
        "<trainjob>".to_owned()
    };
    let child = format!("{jobset_name}-{}-0", replicated.name);
    let mut job_spec = replicated.template.spec.clone().unwrap_or_default();
    // JobSet's defaulting webhook (v0.12.0 `jobset_webhook.go` `Default`): child Jobs are
    // Indexed and their pods restart OnFailure unless the template says otherwise.
    job_spec
        .completion_mode
        .get_or_insert_with(|| "Indexed".to_owned());
    if let Some(pod) = &mut job_spec.template.spec
        && pod.restart_policy.as_deref().unwrap_or_default().is_empty()
    {
        pod.restart_policy = Some("OnFailure".to_owned());
    }
    let child_what = format!("replicated Job {}, child Job {child}", replicated.name);
    story.push(child_what.clone());
    let pod_name = pod_name(&child, &job_spec, failure);
    let (job, failed_with) = job_level(
        &job_spec,
        &child_what,
        pod_namespace,
        &pod_name,
        failure,
        &mut story,
    )?;
    let job_set = match failed_with {
        None => {
            story.push("the JobSet is not involved: its child Job goes on".to_owned());
            JobSetResult {
                rule: None,
                rule_index: None,
                action: None,
                restarts_left: None,
                job_set_failed: false,
                reason: None,
                message: None,
            }
        }
        Some((reason, message)) => {
            let mut spec = spec.clone();
            if let Some(policy) = &mut spec.failure_policy {
                for (index, rule) in policy.rules.iter_mut().enumerate() {
                    if rule.name.is_empty() {
                        rule.name = default_rule_name(index);
                    }
                }
            }
            let failed = FailedJob {
                name: &child,
                replicated_job: &replicated.name,
                reason: &reason,
                message: &message,
            };
            let outcome = jobset::step(
                &spec,
                &failed,
                failure.restarts_so_far,
                failure.restart_job_gate,
            );
            jobset_story(&spec, &outcome, &mut story);
            let (failed, restarts_left, reason, message) = match &outcome.step {
                jobset::Step::Failed { reason, message } => (
                    true,
                    Some(0),
                    Some((*reason).to_owned()),
                    Some(message.clone()),
                ),
                jobset::Step::Restarted { restarts_left, .. }
                | jobset::Step::JobRestarted { restarts_left, .. } => {
                    (false, Some(*restarts_left), None, None)
                }
                jobset::Step::Refused(_) => (false, None, None, None),
            };
            JobSetResult {
                rule: outcome.rule.as_ref().map(|(_, name)| name.clone()),
                rule_index: outcome.rule.as_ref().map(|(index, _)| *index),
                action: Some(outcome.action.map_or("none", jobset::Action::as_str)),
                restarts_left,
                job_set_failed: failed,
                reason,
                message,
            }
        }
    };
    Ok(Simulation {
        kind: kind.info().kind,
        namespace,
        name,
        job,
        job_set: Some(job_set),
        story,
    })
}

/// The Job level: the result, and the child Job's failure reason and message when it failed.
fn job_level(
    spec: &JobSpec,
    what: &str,
    namespace: Option<&str>,
    pod_name: &str,
    failure: &Failure,
    story: &mut Vec<String>,
) -> Result<(JobResult, Option<(String, String)>), SimulateError> {
    let pod_spec = spec
        .template
        .spec
        .as_ref()
        .ok_or_else(|| SimulateError::NoPodSpec {
            what: what.to_owned(),
        })?;
    let pod = failed_pod(pod_spec, namespace, pod_name, failure, what)?;
    story.push(format!(
        "pod {} fails: {}",
        qualified(namespace, pod_name),
        describe_failure(failure)
    ));
    let history = History {
        failed: failure.failed_so_far,
        index_failed: failure.failed_so_far,
        failed_indexes: 0,
    };
    let (matched, step) = job::step(spec, &pod, history);
    match &matched.rule {
        _ if job::restarts_in_place(spec, &pod) => {}
        Some(rule) => story.push(format!(
            "podFailurePolicy rule {} ({}) matches: {}",
            rule.index,
            spec.pod_failure_policy
                .as_ref()
                .and_then(|policy| policy.rules.get(rule.index))
                .map(describe_rule)
                .unwrap_or_default(),
            rule.action.as_str()
        )),
        None if spec.pod_failure_policy.is_some() => {
            story.push("no podFailurePolicy rule matches: the failure counts".to_owned())
        }
        None => story.push("no podFailurePolicy: the failure counts".to_owned()),
    }
    let mut failed_with = None;
    match &step {
        Step::Replaced => story.push("not counted: the pod is replaced".to_owned()),
        Step::RestartedInPlace {
            restarts,
            backoff_limit,
        } => story.push(format!(
            "restartPolicy OnFailure: the container restarts in the same pod; {restarts} \
             restart(s) counted, the Job fails when they reach backoffLimit {backoff_limit}"
        )),
        Step::Counted {
            failed,
            backoff_limit,
        } => story.push(format!(
            "counted: {failed} failure(s) of the {backoff_limit} backoffLimit allows; the pod is \
             replaced"
        )),
        Step::IndexCounted {
            failed,
            backoff_limit_per_index,
        } => story.push(format!(
            "counted against its index: {failed} of the {backoff_limit_per_index} \
             backoffLimitPerIndex allows; the index is retried"
        )),
        Step::IndexFailed {
            failed_indexes,
            max_failed_indexes,
        } => {
            let mut line = format!("the index fails ({failed_indexes} failed index(es)");
            if let Some(max) = max_failed_indexes {
                let _ = write!(line, " of the {max} maxFailedIndexes allows");
            }
            line.push_str(
                "); the Job goes on, and fails with FailedIndexes when its other indexes finish",
            );
            story.push(line);
        }
        Step::JobFailed { reason, message } => {
            if job::restarts_in_place(spec, &pod) {
                story.push(
                    "restartPolicy OnFailure: the container's restarts reach backoffLimit"
                        .to_owned(),
                );
            }
            story.push(format!("the Job fails: {reason}: {message}"));
            failed_with = Some(((*reason).to_owned(), message.clone()));
        }
    }
    let result = JobResult {
        rule_index: matched.rule.as_ref().map(|rule| rule.index),
        action: matched.rule.as_ref().map(|rule| rule.action.as_str()),
        counted: matched.counted,
        job_failed: failed_with.is_some(),
        reason: failed_with.as_ref().map(|(reason, _)| reason.clone()),
        message: failed_with.as_ref().map(|(_, message)| message.clone()),
    };
    Ok((result, failed_with))
}

fn jobset_story(spec: &JobSetSpec, outcome: &jobset::Outcome, story: &mut Vec<String>) {
    let max = spec
        .failure_policy
        .as_ref()
        .and_then(|policy| policy.max_restarts)
        .unwrap_or(0);
    match (&outcome.rule, spec.failure_policy.is_some()) {
        (Some((index, name)), _) => story.push(format!(
            "JobSet failurePolicy rule {index} ({name}) applies: {}",
            outcome
                .action
                .map_or("an unknown action", jobset::Action::as_str)
        )),
        (None, true) => story
            .push("no JobSet failurePolicy rule applies: RestartJobSet, the default".to_owned()),
        (None, false) => story.push("the JobSet has no failurePolicy".to_owned()),
    }
    match &outcome.step {
        jobset::Step::Failed { reason, message } => {
            story.push(format!("the JobSet fails: {reason}: {message}"));
        }
        jobset::Step::Restarted {
            counted: true,
            restarts_left,
            ..
        } => story.push(format!(
            "every child Job is recreated; the restart counts: {restarts_left} of \
             maxRestarts {max} left"
        )),
        jobset::Step::Restarted { counted: false, .. } => story.push(
            "every child Job is recreated; the restart does not count against maxRestarts"
                .to_owned(),
        ),
        jobset::Step::JobRestarted {
            counted: true,
            restarts_left,
        } => story.push(format!(
            "only the failed child Job is recreated; the restart counts: {restarts_left} of \
             maxRestarts {max} left"
        )),
        jobset::Step::JobRestarted { counted: false, .. } => story.push(
            "only the failed child Job is recreated; the restart does not count against \
             maxRestarts"
                .to_owned(),
        ),
        jobset::Step::Refused(why) => story.push(why.clone()),
    }
}

/// The name of the failing pod: the Job controller adds a random suffix (`xxxxx` here), and an
/// Indexed Job's pods carry their index before it.
fn pod_name(job: &str, spec: &JobSpec, failure: &Failure) -> String {
    if spec.completion_mode.as_deref() == Some("Indexed") {
        format!("{job}-{}-xxxxx", failure.index.unwrap_or(0))
    } else {
        format!("{job}-xxxxx")
    }
}

/// The failed pod the Job controller would look at: each named container terminated with its
/// code (in the init container statuses when it is an init container), the conditions `True`.
fn failed_pod(
    spec: &PodSpec,
    namespace: Option<&str>,
    name: &str,
    failure: &Failure,
    what: &str,
) -> Result<Pod, SimulateError> {
    let init: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    let regular: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    let mut containers = Vec::new();
    let mut init_containers = Vec::new();
    for (container, code) in &failure.exits {
        let status = ContainerStatus {
            name: container.clone(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: *code,
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        };
        if regular.contains(&container.as_str()) {
            containers.push(status);
        } else if init.contains(&container.as_str()) {
            init_containers.push(status);
        } else {
            return Err(SimulateError::UnknownContainer {
                what: what.to_owned(),
                name: container.clone(),
                known: regular
                    .iter()
                    .chain(&init)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: namespace.map(str::to_owned),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some("Failed".to_owned()),
            container_statuses: Some(containers),
            init_container_statuses: Some(init_containers),
            conditions: Some(
                failure
                    .conditions
                    .iter()
                    .map(|type_| PodCondition {
                        type_: type_.clone(),
                        status: "True".to_owned(),
                        ..PodCondition::default()
                    })
                    .collect(),
            ),
            ..PodStatus::default()
        }),
    })
}

/// A podFailurePolicy rule's requirement in a few words.
fn describe_rule(rule: &PodFailurePolicyRule) -> String {
    if let Some(codes) = &rule.on_exit_codes {
        let values: Vec<String> = codes.values.iter().map(i32::to_string).collect();
        let mut text = format!("onExitCodes {} [{}]", codes.operator, values.join(", "));
        if let Some(container) = &codes.container_name {
            let _ = write!(text, " in container {container}");
        }
        return text;
    }
    let patterns: Vec<String> = rule
        .on_pod_conditions
        .iter()
        .flatten()
        .map(|pattern| {
            format!(
                "{}={}",
                pattern.type_,
                pattern.status.as_deref().unwrap_or("True")
            )
        })
        .collect();
    format!("onPodConditions {}", patterns.join(", "))
}

fn describe_failure(failure: &Failure) -> String {
    let mut parts: Vec<String> = failure
        .exits
        .iter()
        .map(|(container, code)| format!("container {container} exits with {code}"))
        .collect();
    parts.extend(
        failure
            .conditions
            .iter()
            .map(|condition| format!("condition {condition}=True")),
    );
    if parts.is_empty() {
        "no container exit code and no condition given".to_owned()
    } else {
        parts.join(", ")
    }
}

fn qualified(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests;
