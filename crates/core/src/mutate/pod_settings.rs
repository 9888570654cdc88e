//! Pod-level settings of a device Job: the termination grace window and the node-readiness
//! tolerations.

use k8s_openapi::api::core::v1::Toleration;

use super::{Change, Draft};
use crate::policy::{GraceWindow, ReadinessTolerations};

/// The grace period a pod gets when its spec does not say (the API server's default).
pub const DEFAULT_GRACE_SECONDS: i64 = 30;
/// The taint the node lifecycle controller puts on a node whose kubelet reports NotReady.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// The taint the node lifecycle controller puts on a node that stops reporting.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// Raises a grace period below the window's minimum (time to checkpoint) and lowers one above
/// its maximum (a failed pod must release its devices soon).
pub(super) fn apply_grace_window(draft: &mut Draft, window: &GraceWindow) {
    if !window.enabled {
        return;
    }
    let current = draft
        .spec()
        .template
        .spec
        .as_ref()
        .and_then(|pod| pod.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    if current < window.minimum_seconds {
        draft.apply(Change::SetTerminationGracePeriod(window.minimum_seconds));
        draft.note_change(format!(
            "terminationGracePeriodSeconds raised from {current} to {} to leave time to checkpoint",
            window.minimum_seconds
        ));
    } else if current > window.maximum_seconds {
        draft.apply(Change::SetTerminationGracePeriod(window.maximum_seconds));
        draft.note_change(format!(
            "terminationGracePeriodSeconds lowered from {current} to {} to free devices sooner",
            window.maximum_seconds
        ));
    }
}

/// Makes sure the pod tolerates the not-ready and unreachable taints for at least the configured
/// seconds: adds a toleration when none covers the taint, raises `tolerationSeconds` of the ones
/// that name it, never lowers one, and never touches a toleration without `tolerationSeconds`
/// (it already tolerates the taint for ever).
pub(super) fn apply_readiness_tolerations(draft: &mut Draft, settings: &ReadinessTolerations) {
    if !settings.enabled {
        return;
    }
    for (taint, seconds) in [
        (NOT_READY_TAINT, settings.not_ready_seconds),
        (UNREACHABLE_TAINT, settings.unreachable_seconds),
    ] {
        let tolerations = draft
            .spec()
            .template
            .spec
            .as_ref()
            .and_then(|pod| pod.tolerations.clone())
            .unwrap_or_default();
        let covering: Vec<(usize, &Toleration)> = tolerations
            .iter()
            .enumerate()
            .filter(|(_, toleration)| tolerates_no_execute(toleration, taint))
            .collect();
        if covering.is_empty() {
            draft.apply(Change::AddToleration(Toleration {
                key: Some(taint.to_owned()),
                operator: Some("Exists".to_owned()),
                effect: Some("NoExecute".to_owned()),
                toleration_seconds: Some(seconds),
                value: None,
            }));
            continue;
        }
        for (index, toleration) in covering {
            let Some(current) = toleration.toleration_seconds else {
                continue;
            };
            if current >= seconds {
                continue;
            }
            if toleration.key.as_deref() == Some(taint) {
                draft.apply(Change::SetTolerationSeconds { index, seconds });
            } else {
                draft.warn(format!(
                    "tolerations[{index}] tolerates every NoExecute taint for {current}s; \
                     gpu-guard leaves it (wanted {seconds}s for {taint})"
                ));
            }
        }
    }
}

/// Whether a toleration matches the `NoExecute` taint `key` (with an empty value, as the node
/// lifecycle controller sets it).
fn tolerates_no_execute(toleration: &Toleration, key: &str) -> bool {
    let effect_matches = matches!(toleration.effect.as_deref(), None | Some("" | "NoExecute"));
    let key_matches = match toleration.key.as_deref() {
        None | Some("") => toleration.operator.as_deref() == Some("Exists"),
        Some(named) => {
            named == key
                && match toleration.operator.as_deref() {
                    Some("Exists") => true,
                    None | Some("Equal") => toleration.value.as_deref().unwrap_or("").is_empty(),
                    Some(_) => false,
                }
        }
    };
    effect_matches && key_matches
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn toleration(value: serde_json::Value) -> Toleration {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn which_tolerations_cover_the_not_ready_taint() {
        let cases = [
            (
                json!({"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute"}),
                true,
            ),
            (json!({"key": NOT_READY_TAINT, "operator": "Exists"}), true),
            (
                json!({"key": NOT_READY_TAINT, "operator": "Equal", "value": ""}),
                true,
            ),
            (
                json!({"key": NOT_READY_TAINT, "operator": "Equal", "value": "x"}),
                false,
            ),
            (
                json!({"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoSchedule"}),
                false,
            ),
            (json!({"operator": "Exists"}), true),
            (
                json!({"key": UNREACHABLE_TAINT, "operator": "Exists"}),
                false,
            ),
            (
                json!({"key": "nvidia.com/gpu", "operator": "Exists"}),
                false,
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(
                tolerates_no_execute(&toleration(value.clone()), NOT_READY_TAINT),
                expected,
                "{value}"
            );
        }
    }
}
