//! In-place restart rules for retriable software errors (`mutation.restartRules`): a device
//! container that exits with one of the policy's codes is restarted by the kubelet where it
//! is, keeping its pod and its devices, instead of failing the pod and queueing for new
//! devices. The pod does not fail, so neither the podFailurePolicy nor `backoffLimit` sees that
//! exit (KEP-5307, container restart rules, beta and on by default since Kubernetes 1.35;
//! crash-loop backoff still applies).
//!
//! What is added, to each regular device container of a pod whose `restartPolicy` is `Never`
//! (the rules are what make a container restart under `Never`; `OnFailure` restarts every
//! failure already):
//! - `restartPolicy: Never` on the container when it has none (rules need an explicit one);
//! - one rule `{action, exitCodes: {operator: In, values}}` appended after the container's
//!   own rules, holding the policy's codes that reach it: a code that one of the container's
//!   own rules matches first stays with that rule, and a code that the Job's podFailurePolicy
//!   names for the container (an `In` rule with its name or without one) stays with the
//!   podFailurePolicy. So a restart rule never hides an exit code a podFailurePolicy rule
//!   names, and a second pass adds nothing.
//!
//! Never changed: the container's own rules (a rule of the user's that catches a device code,
//! like any `NotIn` rule, is reported, not removed), a container with `restartPolicy` `Always`
//! or `OnFailure` (reported: it restarts on device codes too), a container at the API's limit
//! of 20 rules (reported), init containers and sidecars.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    Container, ContainerRestartRule, ContainerRestartRuleOnExitCodes,
};

use super::{Change, Draft, workload::DeviceContainers};
use crate::api_rules::container::{MAX_RESTART_RULES, rule_matches};
use crate::api_rules::job::exit_codes_match;
use crate::policy::RestartRuleSettings;

/// Adds the restart rules the policy asks for to a draft.
pub(super) fn apply(draft: &mut Draft, devices: &DeviceContainers, settings: &RestartRuleSettings) {
    if !settings.enabled {
        return;
    }
    let (changes, warnings) = plan(draft, devices, settings);
    for warning in warnings {
        draft.warn(warning);
    }
    for change in changes {
        draft.apply(change);
    }
}

/// The changes and warnings for the draft's pod template, computed before any is applied.
fn plan(
    draft: &Draft,
    devices: &DeviceContainers,
    settings: &RestartRuleSettings,
) -> (Vec<Change>, Vec<String>) {
    let mut changes = Vec::new();
    let mut warnings = Vec::new();
    let spec = draft.spec();
    let Some(pod) = spec.template.spec.as_ref() else {
        return (changes, warnings);
    };
    if pod.restart_policy.as_deref() != Some("Never") {
        warnings.push(format!(
            "restartPolicy {:?}: no restart rules added (they restart a container in place \
             only under Never)",
            pod.restart_policy.as_deref().unwrap_or("")
        ));
        return (changes, warnings);
    }
    let failure_rules = spec
        .pod_failure_policy
        .as_ref()
        .map(|policy| policy.rules.as_slice())
        .unwrap_or_default();
    let wanted: BTreeSet<i32> = settings.exit_codes.iter().copied().collect();
    for (index, container) in pod.containers.iter().enumerate() {
        if !devices.targets.contains(&container.name) {
            continue;
        }
        // The codes a podFailurePolicy rule decides for this container (a `NotIn` rule every
        // code it does not list): a restart rule must leave them to it. A container's exit
        // code is its process's exit status, 0 to 255.
        let for_container: Vec<_> = failure_rules
            .iter()
            .filter_map(|rule| rule.on_exit_codes.as_ref())
            .filter(|codes| {
                codes
                    .container_name
                    .as_deref()
                    .is_none_or(|name| name == container.name)
            })
            .collect();
        let protected: BTreeSet<i32> = (1..=255)
            .filter(|&code| {
                for_container
                    .iter()
                    .any(|codes| exit_codes_match(codes, code))
            })
            .collect();
        let own = container
            .restart_policy_rules
            .as_deref()
            .unwrap_or_default();
        report_hidden_codes(container, own, &protected, &mut warnings);
        match container.restart_policy.as_deref() {
            None | Some("Never") => {}
            Some(policy @ ("Always" | "OnFailure")) => {
                warnings.push(format!(
                    "container {} has restartPolicy {policy}: the kubelet restarts it in place on \
                     every failure, device exit codes too, so the podFailurePolicy never sees \
                     them; no restart rules added",
                    container.name
                ));
                continue;
            }
            // An invalid value: the API server reports it, the rules checker too.
            Some(_) => continue,
        }
        let left_to_failure_policy: Vec<i32> = wanted.intersection(&protected).copied().collect();
        if !left_to_failure_policy.is_empty() {
            warnings.push(format!(
                "container {}: the Job's podFailurePolicy names exit code(s) \
                 {left_to_failure_policy:?}; they are left to it, not restarted in place",
                container.name
            ));
        }
        let codes: Vec<i32> = wanted
            .iter()
            .copied()
            .filter(|code| !protected.contains(code))
            .filter(|&code| !own.iter().any(|rule| rule_matches(rule, code)))
            .collect();
        if codes.is_empty() {
            continue;
        }
        if own.len() >= MAX_RESTART_RULES {
            warnings.push(format!(
                "container {} has {} restart rules, the API server's limit: no rule added for \
                 exit code(s) {codes:?}",
                container.name,
                own.len()
            ));
            continue;
        }
        if container.restart_policy.is_none() {
            changes.push(Change::SetContainerRestartPolicy {
                index,
                container: container.name.clone(),
                value: "Never".to_owned(),
            });
        }
        changes.push(Change::AddContainerRestartRule {
            index,
            container: container.name.clone(),
            rule: ContainerRestartRule {
                action: settings.action.as_str().to_owned(),
                exit_codes: Some(ContainerRestartRuleOnExitCodes {
                    operator: "In".to_owned(),
                    values: Some(codes),
                }),
            },
        });
    }
    (changes, warnings)
}

/// Warns about the container's own rules that restart it on a code the podFailurePolicy names
/// for it (a `NotIn` rule does so for every code it does not list): the kubelet acts on the
/// first matching rule, so the podFailurePolicy never sees those exits. They are the user's and
/// stay as they are.
fn report_hidden_codes(
    container: &Container,
    own: &[ContainerRestartRule],
    protected: &BTreeSet<i32>,
    warnings: &mut Vec<String>,
) {
    for (position, rule) in own.iter().enumerate() {
        let hidden: Vec<i32> = protected
            .iter()
            .copied()
            .filter(|&code| own.iter().position(|r| rule_matches(r, code)) == Some(position))
            .collect();
        if hidden.is_empty() {
            continue;
        }
        let operator = rule
            .exit_codes
            .as_ref()
            .map(|codes| codes.operator.as_str())
            .unwrap_or_default();
        warnings.push(format!(
            "container {}: its restartPolicyRules[{position}] ({operator}) restarts it in place \
             on exit code(s) {hidden:?}, which the podFailurePolicy names: the pod never fails \
             with them, so those rules never fire",
            container.name
        ));
    }
}
