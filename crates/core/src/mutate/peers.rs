//! Gangs in a single Job: the ranks of one program (torchrun, MPI) run as the pods of one Job,
//! most often an Indexed Job whose parallelism equals its completions. When one rank's GPU
//! fails, only its pod gets `gpu-guard.io/DeviceFailure`; the other ranks fail a little later
//! of the collective's error (an NCCL timeout, a torchrun rendezvous failure), with ordinary
//! exit codes that count against `backoffLimit`. So such a Job gets a rule for
//! `gpu-guard.io/PeerDeviceFailure`, right after the DeviceFailure rule and with its action, and
//! its pod template the annotation `gpu-guard.io/gang: "true"`, by which the controller (which
//! sees pods, not Jobs) knows to mark the running peers of a marked pod.
//!
//! A JobSet's replicated Jobs never get it: there a device failure fails the child Job and the
//! JobSet restarts the whole gang.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;

use super::{Change, Draft, JobRole};
use crate::policy::{ConditionStatus, PodConditionRule, PodFailurePolicySettings};
use crate::wellknown::{DEVICE_FAILURE_CONDITION, GANG_KEY, PEER_DEVICE_FAILURE_CONDITION};

/// Whether the pods of a Job are a gang: the Job, or its pod template, says so with
/// `gpu-guard.io/gang: "true"`, or it is an Indexed Job whose parallelism equals its
/// completions, above 1 (every index runs at once: the shape of torchrun and MPI Jobs). A
/// `"false"` anywhere (an Indexed Job of independent shards) wins over both.
pub fn is_gang(job: &Job) -> bool {
    let template = job
        .spec
        .as_ref()
        .and_then(|spec| spec.template.metadata.as_ref())
        .and_then(|metadata| metadata.annotations.as_ref());
    let said: Vec<&str> = [
        job.metadata.labels.as_ref(),
        job.metadata.annotations.as_ref(),
        template,
    ]
    .into_iter()
    .filter_map(|map| map.and_then(|map| map.get(GANG_KEY)).map(String::as_str))
    .collect();
    if said.contains(&"false") {
        return false;
    }
    if said.contains(&"true") {
        return true;
    }
    let Some(spec) = &job.spec else {
        return false;
    };
    // The API server defaults parallelism to 1; an Indexed Job must set completions.
    let parallelism = spec.parallelism.unwrap_or(1);
    spec.completion_mode.as_deref() == Some("Indexed")
        && parallelism > 1
        && spec.completions == Some(parallelism)
}

/// The pod-condition rules to inject for a Job: the policy's, with the PeerDeviceFailure rule
/// after the DeviceFailure rule (same status and action) when `gang` (a standalone gang Job and
/// `gangPeers` on) and the policy does not name the condition itself. No DeviceFailure rule, no
/// peer rule: peers are treated as the device failure is.
pub(super) fn condition_rules(
    settings: &PodFailurePolicySettings,
    gang: bool,
) -> Cow<'_, [PodConditionRule]> {
    let rules = &settings.pod_condition_rules;
    let named = |condition: &str| {
        rules.iter().position(|rule| {
            rule.condition_type == condition && rule.status == ConditionStatus::True
        })
    };
    if !gang || named(PEER_DEVICE_FAILURE_CONDITION).is_some() {
        return Cow::Borrowed(rules);
    }
    let Some(at) = named(DEVICE_FAILURE_CONDITION) else {
        return Cow::Borrowed(rules);
    };
    let mut with_peers = rules.clone();
    with_peers.insert(
        at + 1,
        PodConditionRule {
            condition_type: PEER_DEVICE_FAILURE_CONDITION.to_owned(),
            ..rules[at].clone()
        },
    );
    Cow::Owned(with_peers)
}

/// Whether the engine treats the Job as a gang whose peers the controller marks.
pub(super) fn applies(job: &Job, role: JobRole, settings: &PodFailurePolicySettings) -> bool {
    role == JobRole::Standalone && settings.gang_peers && is_gang(job)
}

/// Annotates the pod template of a gang Job whose podFailurePolicy (gpu-guard's rule or the
/// Job's own) has a rule for `PeerDeviceFailure=True`: marking peers whose failure no rule reads
/// would change nothing.
pub(super) fn annotate(draft: &mut Draft) {
    if !draft.gang {
        return;
    }
    let spec = draft.spec();
    let handled = spec.pod_failure_policy.iter().any(|policy| {
        policy.rules.iter().any(|rule| {
            rule.on_pod_conditions.iter().flatten().any(|pattern| {
                pattern.type_ == PEER_DEVICE_FAILURE_CONDITION
                    && pattern.status.as_deref().unwrap_or("True") == "True"
            })
        })
    });
    let annotated = spec
        .template
        .metadata
        .as_ref()
        .and_then(|metadata| metadata.annotations.as_ref())
        .and_then(|annotations: &BTreeMap<String, String>| annotations.get(GANG_KEY))
        .is_some_and(|value| value == "true");
    if handled && !annotated {
        draft.apply(Change::SetTemplateAnnotation {
            key: GANG_KEY.to_owned(),
            value: "true".to_owned(),
        });
    }
}
