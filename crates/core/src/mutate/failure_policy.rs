//! The injected podFailurePolicy: which rules, in which order, merged with the Job's own.
//!
//! Rules come in the policy's order: pod-condition rules first (`DisruptionTarget`,
//! `gpu-guard.io/DeviceFailure`, and in a gang Job `gpu-guard.io/PeerDeviceFailure`), then one exit-code rule per exit-code setting and device
//! container, each naming the container: the Job controller also reads the exit codes of native
//! sidecars, which exit 137/143 at every shutdown, so a rule without `containerName` could match
//! them. When the per-container rules do not fit in the API server's 20-rule limit, the
//! exit-code rules fall back to one rule per setting without `containerName` (safe because the
//! policy never lets `Ignore` match 137 or 143), with a warning; when even that does not fit,
//! no podFailurePolicy is injected, with a warning.
//!
//! In `Merge` mode the Job's own rules keep their order after the injected ones, and a device
//! rule the Job already handles is left out: the Job's own rule wins for that condition or exit
//! code, so mutating twice changes nothing the second time.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::{
    PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};

use super::{Change, Draft, JobRole, workload::DeviceContainers};
use crate::api_rules::job::{MAX_RULES, exit_codes_match};
use crate::policy::{
    ExistingPolicy, ExitCodeRule, OnFailureRestartPolicy, PodFailurePolicySettings,
    PodReplacementPolicy, RuleAction,
};

/// Adds the podFailurePolicy (and the restart and replacement policies it needs) to a draft.
pub(super) fn apply(
    draft: &mut Draft,
    devices: &DeviceContainers,
    settings: &PodFailurePolicySettings,
) {
    if !settings.enabled {
        return;
    }
    if restart_policy_allows_injection(draft, settings) {
        inject_rules(draft, devices, settings);
    }

    let spec = draft.spec();
    let current = spec.pod_replacement_policy.as_deref();
    let required = spec.pod_failure_policy.is_some() && current.is_some();
    let wanted = settings.pod_replacement_policy == PodReplacementPolicy::Failed || required;
    if wanted && current != Some("Failed") {
        draft.apply(Change::SetPodReplacementPolicy("Failed".to_owned()));
    }
}

/// A podFailurePolicy needs `restartPolicy: Never`.
fn restart_policy_allows_injection(draft: &mut Draft, settings: &PodFailurePolicySettings) -> bool {
    let restart_policy = draft
        .spec()
        .template
        .spec
        .as_ref()
        .and_then(|pod| pod.restart_policy.clone());
    match restart_policy.as_deref() {
        Some("Never") => true,
        None | Some("") if draft.role == JobRole::JobSetReplica => {
            draft.apply(Change::SetRestartPolicy("Never".to_owned()));
            draft.note_change(
                "restartPolicy was empty, which JobSet turns into OnFailure: set to Never so \
                 that a device failure fails the child Job and restarts the gang",
            );
            true
        }
        Some("OnFailure") => match settings.on_failure_restart_policy {
            OnFailureRestartPolicy::Skip => {
                draft.warn(
                    "restartPolicy OnFailure: no podFailurePolicy added, device errors count \
                     as failures; use restartPolicy Never",
                );
                false
            }
            OnFailureRestartPolicy::ConvertToNever => {
                draft.apply(Change::SetRestartPolicy("Never".to_owned()));
                draft.note_change(
                    "restartPolicy changed from OnFailure to Never: failed pods are replaced, \
                     not restarted in place",
                );
                true
            }
        },
        None | Some("") => {
            draft.warn(
                "restartPolicy is not set, and a Job needs Never (or OnFailure): no \
                 podFailurePolicy added",
            );
            false
        }
        Some(other) => {
            draft.warn(format!(
                "restartPolicy {other:?} is not valid for a Job (use Never): no podFailurePolicy \
                 added"
            ));
            false
        }
    }
}

fn inject_rules(
    draft: &mut Draft,
    devices: &DeviceContainers,
    settings: &PodFailurePolicySettings,
) {
    if !devices.device_sidecars.is_empty() {
        draft.warn(format!(
            "native sidecar(s) {} use a device; exit-code rules never match sidecars",
            devices.device_sidecars.join(", ")
        ));
    }
    // In a gang a device failure must fail the whole child Job, never only its index.
    let per_index =
        draft.spec().backoff_limit_per_index.is_some() && draft.role == JobRole::Standalone;
    let existing = draft.spec().pod_failure_policy.clone();
    let mode = if existing.is_some() {
        settings.existing_policy
    } else {
        ExistingPolicy::Replace
    };
    let kept: &[PodFailurePolicyRule] = match (&existing, mode) {
        (Some(_), ExistingPolicy::Keep) => return,
        (Some(policy), ExistingPolicy::Merge) => &policy.rules,
        _ => &[],
    };

    let Some(rules) = choose_rules(draft, devices, settings, per_index, kept) else {
        return;
    };

    match (existing, mode) {
        (Some(_), ExistingPolicy::Merge) => {
            if !rules.is_empty() {
                draft.apply(Change::PrependRules(rules));
            }
        }
        (Some(policy), _) if policy.rules == rules => {}
        _ => draft.apply(Change::SetPodFailurePolicy(PodFailurePolicy { rules })),
    }
}

/// The device rules to add, within the rule limit, with their warnings given to the draft;
/// `None` when even the smallest set does not fit (a warning says so).
///
/// First choice: one exit-code rule per device container. When that does not fit, one shared
/// rule per exit-code setting (no `containerName`) holding the codes no container handles
/// itself, plus per-container rules for codes some containers handle and others do not (so a
/// Job's own per-container rule is never overridden by a shared one). When those per-container
/// rules do not fit, they are dropped with a warning. Every choice is stable: mutating the
/// result again chooses to add nothing.
fn choose_rules(
    draft: &mut Draft,
    devices: &DeviceContainers,
    settings: &PodFailurePolicySettings,
    per_index: bool,
    kept: &[PodFailurePolicyRule],
) -> Option<Vec<PodFailurePolicyRule>> {
    let fits = |rules: &[PodFailurePolicyRule]| kept.len() + rules.len() <= MAX_RULES;
    let mut notes = Vec::new();
    let mut rules = condition_rules(settings, draft, kept, &mut notes);
    for setting in &settings.exit_code_rules {
        for target in &devices.targets {
            rules.extend(exit_code_rule(
                setting,
                Some(target),
                settings,
                RuleShape {
                    role: draft.role,
                    per_index,
                },
                kept,
                &BTreeSet::new(),
                &mut notes,
            ));
        }
    }
    if fits(&rules) {
        for note in notes {
            draft.warn(note);
        }
        return Some(rules);
    }
    let needed = kept.len() + rules.len();

    let mut notes = Vec::new();
    let mut rules = condition_rules(settings, draft, kept, &mut notes);
    let mut partial = Vec::new();
    for setting in &settings.exit_code_rules {
        let shared = exit_code_rule(
            setting,
            None,
            settings,
            RuleShape {
                role: draft.role,
                per_index,
            },
            kept,
            &BTreeSet::new(),
            &mut notes,
        );
        let covered: BTreeSet<i32> = shared
            .as_ref()
            .and_then(|rule| rule.on_exit_codes.as_ref())
            .map(|codes| codes.values.iter().copied().collect())
            .unwrap_or_default();
        rules.extend(shared);
        for target in &devices.targets {
            partial.extend(exit_code_rule(
                setting,
                Some(target),
                settings,
                RuleShape {
                    role: draft.role,
                    per_index,
                },
                kept,
                &covered,
                &mut notes,
            ));
        }
    }
    if !fits(&rules) {
        draft.warn(format!(
            "no podFailurePolicy added: the Job's {} rules and the {} device rules exceed the \
             limit of {MAX_RULES}",
            kept.len(),
            rules.len()
        ));
        return None;
    }
    draft.note_change(format!(
        "{} device containers would need {needed} rules (limit {MAX_RULES}): exit-code rules \
         match every container, without containerName",
        devices.targets.len()
    ));
    for note in dedup(notes) {
        draft.warn(note);
    }
    let mut with_partial = rules.clone();
    with_partial.extend(partial.iter().cloned());
    if fits(&with_partial) {
        return Some(with_partial);
    }
    draft.note_change(format!(
        "{} per-container exit-code rules left out for lack of room (limit {MAX_RULES})",
        partial.len()
    ));
    Some(rules)
}

fn dedup(notes: Vec<String>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    notes
        .into_iter()
        .filter(|note| seen.insert(note.clone()))
        .collect()
}

/// The pod-condition rules the Job does not already handle (with the rule for the peers of a
/// device failure in a gang Job: [`super::peers`]).
fn condition_rules(
    settings: &PodFailurePolicySettings,
    draft: &Draft,
    kept: &[PodFailurePolicyRule],
    notes: &mut Vec<String>,
) -> Vec<PodFailurePolicyRule> {
    let role = draft.role;
    let mut rules = Vec::new();
    for condition in super::peers::condition_rules(settings, draft.gang).iter() {
        let status = condition.status.as_str();
        let handled_by = kept.iter().find(|rule| {
            rule.on_pod_conditions.iter().flatten().any(|pattern| {
                pattern.type_ == condition.condition_type
                    && pattern.status.as_deref().unwrap_or("True") == status
            })
        });
        let action = role.action(condition.action);
        if let Some(rule) = handled_by {
            if rule.action != action.as_str() {
                notes.push(format!(
                    "the Job's own {} rule handles {}={}; gpu-guard's {} rule is not added",
                    rule.action,
                    condition.condition_type,
                    status,
                    action.as_str()
                ));
            }
            continue;
        }
        rules.push(PodFailurePolicyRule {
            action: action.as_str().to_owned(),
            on_exit_codes: None,
            on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                type_: condition.condition_type.clone(),
                status: Some(status.to_owned()),
            }]),
        });
    }
    rules
}

/// What decides a rule's action besides the policy: the Job's role, and whether it is an
/// Indexed Job with `backoffLimitPerIndex` (standalone only).
#[derive(Clone, Copy)]
struct RuleShape {
    role: JobRole,
    per_index: bool,
}

/// The exit-code rule of one setting for one container (`None`: every container), without
/// the codes in `exclude` and those the Job's own rules already handle for that container
/// (for `None`: for any container). `None` when no code is left.
fn exit_code_rule(
    setting: &ExitCodeRule,
    container: Option<&str>,
    settings: &PodFailurePolicySettings,
    shape: RuleShape,
    kept: &[PodFailurePolicyRule],
    exclude: &BTreeSet<i32>,
    notes: &mut Vec<String>,
) -> Option<PodFailurePolicyRule> {
    let action = match shape.role.action(setting.action) {
        RuleAction::FailJob if shape.per_index && settings.fail_index_for_per_index_jobs => {
            RuleAction::FailIndex
        }
        action => action,
    };
    let mut codes: BTreeSet<i32> = setting
        .codes
        .iter()
        .copied()
        .filter(|code| !exclude.contains(code))
        .collect();
    for rule in kept {
        let Some(requirement) = &rule.on_exit_codes else {
            continue;
        };
        let applies = match (container, requirement.container_name.as_deref()) {
            (_, None) => true,
            (Some(target), Some(named)) => target == named,
            // A rule for every container must respect every container's own rules.
            (None, Some(_)) => true,
        };
        if !applies {
            continue;
        }
        // `NotIn` decides every code it does not list ("fail on any error"): the device codes
        // it covers are the Job's to decide, as with `In`.
        let taken: Vec<i32> = codes
            .iter()
            .copied()
            .filter(|&code| exit_codes_match(requirement, code))
            .collect();
        for code in &taken {
            codes.remove(code);
        }
        // In a gang the action alone does not say what happens: the JobSet's rules read the
        // index of the matching rule, and the Job's own rule is not one of gpu-guard's.
        let differs = rule.action != action.as_str() || shape.role == JobRole::JobSetReplica;
        if !taken.is_empty() && differs {
            let effect = match shape.role {
                JobRole::Standalone => "they are not retried as device failures",
                JobRole::JobSetReplica => "they do not restart the gang as device failures",
            };
            // What matters first: admission warnings are cut at 120 characters.
            notes.push(format!(
                "exit code(s) {taken:?}{} are left to the Job's own {} rule ({} {:?}): {effect}",
                requirement
                    .container_name
                    .as_deref()
                    .map(|c| format!(" of {c}"))
                    .unwrap_or_default(),
                rule.action,
                requirement.operator,
                requirement.values,
            ));
        }
    }
    if codes.is_empty() {
        return None;
    }
    Some(PodFailurePolicyRule {
        action: action.as_str().to_owned(),
        on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
            container_name: container.map(str::to_owned),
            operator: "In".to_owned(),
            values: codes.into_iter().collect(),
        }),
        on_pod_conditions: None,
    })
}
