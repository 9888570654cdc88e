//! PURE: gpu-guard's Node condition ([`DEVICE_DEGRADED_NODE_CONDITION`]), the signal node repair
//! systems read (they act on conditions, not taints). It follows gpu-guard's taint: present,
//! status `"True"`, while the node holds the taint; gone when it does not. Its `reason` says
//! why the node is tainted ([`Degradation`]; today [`REASON_UNUSABLE_DEVICES`]), its `message`
//! which resource, how many devices and since when.
//!
//! It is written to the `nodes/status` subresource with a strategic merge patch: `NodeStatus.
//! conditions` merges by `type` (k8s.io/api `core/v1/types.go`, `patchMergeKey=type`,
//! `listType=map`), so the conditions of the kubelet and of Node Problem Detector are never
//! touched, and removal is the `$patch: delete` directive for gpu-guard's type alone.

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::NodeVerdict;
use crate::wellknown::{DEGRADED_TAINT_KEY, DEVICE_DEGRADED_NODE_CONDITION};

/// The condition's `reason` on a node tainted because devices of a resource are unusable
/// (capacity minus allocatable at the threshold, or its device plugin down).
pub const REASON_UNUSABLE_DEVICES: &str = "UnusableDevices";
/// The condition's `reason` on a node tainted suspect: device failures of several pods on it,
/// though its device plugin reports every device healthy.
pub const REASON_SUSPECT_NODE: &str = "SuspectNode";

/// When the condition's message says the node was tainted: since the condition it carries
/// turned `"True"`, or else since the taint its owner annotation records, or else `now` (the
/// taint is being added).
pub fn tainted_since(current: Option<&NodeCondition>, node: &Node, now: Timestamp) -> Timestamp {
    current
        .filter(|current| current.status == "True")
        .and_then(|current| current.last_transition_time.as_ref())
        .map(|time| time.0)
        .or_else(|| super::tainted_since(node))
        .unwrap_or(now)
}

/// Why gpu-guard holds its taint on a node, as the condition says it: a CamelCase `reason`
/// and a human `message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Degradation {
    pub reason: String,
    pub message: String,
}

impl Degradation {
    /// The condition of a node whose taint gpu-guard holds for its devices (`verdict`),
    /// tainted since `tainted_since`: what is unusable, and since when; while the node
    /// recovers (nothing degraded any more, the taint held for `healthyForSeconds`), that it
    /// is healthy again since when. The time is the taint's, which a restart does not change
    /// (the owner annotation records it), so the message changes only with what is seen.
    pub fn unusable_devices(verdict: &NodeVerdict, tainted_since: Timestamp) -> Degradation {
        let message = if verdict.degraded.is_empty() {
            let since = verdict
                .history
                .healthy_since
                .map_or_else(String::new, |since| format!(" since {since}"));
            format!(
                "devices healthy again{since}; gpu-guard removes its {DEGRADED_TAINT_KEY} taint \
                 and this condition after controller.nodeHealth.healthyForSeconds"
            )
        } else {
            format!(
                "{}; gpu-guard tainted the node {DEGRADED_TAINT_KEY} since {tainted_since}",
                verdict.describe_degraded()
            )
        };
        Degradation {
            reason: REASON_UNUSABLE_DEVICES.to_owned(),
            message,
        }
    }
}

impl Degradation {
    /// The condition of a node gpu-guard holds tainted suspect: the pods whose device failures
    /// made it so, the last failure, and when it is released if nothing else fails on it.
    pub fn suspect(pods: &[String], last: Timestamp, release_at: Timestamp) -> Degradation {
        Degradation {
            reason: REASON_SUSPECT_NODE.to_owned(),
            message: format!(
                "device failures of {} pods on this node, its device plugin reporting every \
                 device healthy: {}; the last at {last}; gpu-guard removes its \
                 {DEGRADED_TAINT_KEY} taint at {release_at} unless another fails",
                pods.len(),
                pods.join(", ")
            ),
        }
    }
}

/// What to do with the node's condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConditionAction {
    /// It is as it should be (present and saying this, or absent).
    Nothing,
    /// Add it, or rewrite it: it is missing, not `"True"`, or says something else.
    Set(Degradation),
    /// Remove it: the node does not hold gpu-guard's taint.
    Remove,
}

/// The condition a node should carry: none unless it holds gpu-guard's taint (`holds_taint`);
/// otherwise `why` (today [`Degradation::unusable_devices`]), except while it recovers
/// (`recovering`: nothing degraded, the taint held for `healthyForSeconds`): then the condition
/// it carries stays as it is, so recovery writes nothing until the taint goes.
pub fn wanted_condition(
    current: Option<&NodeCondition>,
    holds_taint: bool,
    recovering: bool,
    why: Degradation,
) -> Option<Degradation> {
    if !holds_taint {
        return None;
    }
    match current {
        Some(current) if recovering && current.status == "True" => Some(Degradation {
            reason: current.reason.clone().unwrap_or_default(),
            message: current.message.clone().unwrap_or_default(),
        }),
        _ => Some(why),
    }
}

/// What to do with the condition, given the one the node carries (`current`) and the one it
/// should carry (`wanted`: `None` when the node does not hold gpu-guard's taint).
pub fn condition_action(
    current: Option<&NodeCondition>,
    wanted: Option<Degradation>,
) -> ConditionAction {
    match (current, wanted) {
        (None, None) => ConditionAction::Nothing,
        (Some(_), None) => ConditionAction::Remove,
        (Some(current), Some(wanted))
            if current.status == "True"
                && current.reason.as_deref() == Some(wanted.reason.as_str())
                && current.message.as_deref() == Some(wanted.message.as_str()) =>
        {
            ConditionAction::Nothing
        }
        (_, Some(wanted)) => ConditionAction::Set(wanted),
    }
}

/// gpu-guard's condition on the node, if it has one (whatever its status).
pub fn degraded_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|condition| condition.type_ == DEVICE_DEGRADED_NODE_CONDITION)
}

/// The condition to write at `now`. Its `lastTransitionTime` stays the current one's while the
/// status stays `"True"` (a new message is no transition); `lastHeartbeatTime` is when
/// gpu-guard wrote it.
pub fn degraded_condition_value(
    current: Option<&NodeCondition>,
    why: &Degradation,
    now: Timestamp,
) -> NodeCondition {
    let transition = current
        .filter(|current| current.status == "True")
        .and_then(|current| current.last_transition_time.clone())
        .unwrap_or(Time(now));
    NodeCondition {
        type_: DEVICE_DEGRADED_NODE_CONDITION.to_owned(),
        status: "True".to_owned(),
        reason: Some(why.reason.clone()),
        message: Some(why.message.clone()),
        last_transition_time: Some(transition),
        last_heartbeat_time: Some(Time(now)),
    }
}

/// The strategic merge patch of `nodes/{name}/status` that adds or rewrites the condition.
pub fn set_condition_patch(
    current: Option<&NodeCondition>,
    why: &Degradation,
    now: Timestamp,
) -> Value {
    json!({"status": {"conditions": [degraded_condition_value(current, why, now)]}})
}

/// The strategic merge patch of `nodes/{name}/status` that removes the condition, and only it.
pub fn remove_condition_patch() -> Value {
    json!({"status": {"conditions": [
        {"type": DEVICE_DEGRADED_NODE_CONDITION, "$patch": "delete"},
    ]}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::node::{DeviceCount, NodeHistory, TaintDecision};
    use k8s_openapi::api::core::v1::NodeStatus;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn verdict(unusable: u64, history: NodeHistory) -> NodeVerdict {
        let device = DeviceCount {
            resource: "nvidia.com/gpu".to_owned(),
            capacity: 8,
            allocatable: 8 - unusable,
        };
        NodeVerdict {
            decision: TaintDecision::Tainted,
            devices: vec![device.clone()],
            degraded: if unusable > 0 { vec![device] } else { vec![] },
            plugin_down: vec![],
            forgotten: vec![],
            history,
        }
    }

    fn condition(status: &str, why: &Degradation) -> NodeCondition {
        NodeCondition {
            status: status.to_owned(),
            ..degraded_condition_value(None, why, at(0))
        }
    }

    #[test]
    fn the_message_says_what_is_unusable_and_since_when() {
        let degraded = verdict(
            2,
            NodeHistory {
                degraded_since: Some(at(0)),
                ..NodeHistory::default()
            },
        );
        assert_eq!(
            Degradation::unusable_devices(&degraded, at(120)),
            Degradation {
                reason: "UnusableDevices".to_owned(),
                message: "2 of 8 nvidia.com/gpu unusable (allocatable 6); gpu-guard tainted \
                          the node gpu-guard.io/device-degraded since 2027-01-15T08:02:00Z"
                    .to_owned(),
            }
        );
        let recovering = verdict(
            0,
            NodeHistory {
                healthy_since: Some(at(60)),
                ..NodeHistory::default()
            },
        );
        assert_eq!(
            Degradation::unusable_devices(&recovering, at(0)).message,
            "devices healthy again since 2027-01-15T08:01:00Z; gpu-guard removes its \
             gpu-guard.io/device-degraded taint and this condition after \
             controller.nodeHealth.healthyForSeconds"
        );
    }

    #[test]
    fn the_condition_follows_the_taint() {
        let why = Degradation {
            reason: REASON_UNUSABLE_DEVICES.to_owned(),
            message: "1 of 8 nvidia.com/gpu unusable".to_owned(),
        };
        let other = Degradation {
            message: "2 of 8 nvidia.com/gpu unusable".to_owned(),
            ..why.clone()
        };
        let suspect = Degradation {
            reason: "SuspectNode".to_owned(),
            ..why.clone()
        };
        let set = |w: &Degradation| ConditionAction::Set(w.clone());
        let cases: [(Option<NodeCondition>, Option<Degradation>, ConditionAction); 8] = [
            // Not tainted, no condition: nothing.
            (None, None, ConditionAction::Nothing),
            // Tainted without the condition (a restart, a failed write, deleted by someone).
            (None, Some(why.clone()), set(&why)),
            // Tainted, the condition says it: nothing.
            (
                Some(condition("True", &why)),
                Some(why.clone()),
                ConditionAction::Nothing,
            ),
            // It says something else: rewritten.
            (
                Some(condition("True", &why)),
                Some(other.clone()),
                set(&other),
            ),
            (
                Some(condition("True", &why)),
                Some(suspect.clone()),
                set(&suspect),
            ),
            // Someone set it False while the taint is held: True again.
            (Some(condition("False", &why)), Some(why.clone()), set(&why)),
            // The taint is gone (removed by gpu-guard or by a person): the condition goes.
            (Some(condition("True", &why)), None, ConditionAction::Remove),
            (
                Some(condition("False", &why)),
                None,
                ConditionAction::Remove,
            ),
        ];
        for (current, wanted, expected) in cases {
            assert_eq!(
                condition_action(current.as_ref(), wanted.clone()),
                expected,
                "{current:?} {wanted:?}"
            );
        }
    }

    #[test]
    fn a_recovering_node_keeps_its_condition_as_it_is() {
        let why = Degradation {
            reason: REASON_UNUSABLE_DEVICES.to_owned(),
            message: "1 of 8 nvidia.com/gpu unusable".to_owned(),
        };
        let healthy = Degradation {
            message: "devices healthy again".to_owned(),
            ..why.clone()
        };
        let current = condition("True", &why);
        let wanted = |current: Option<&NodeCondition>, holds, recovering| {
            condition_action(
                current,
                wanted_condition(current, holds, recovering, healthy.clone()),
            )
        };
        assert_eq!(wanted(Some(&current), true, true), ConditionAction::Nothing);
        // Missing while it recovers (a restart): set, saying so.
        assert_eq!(
            wanted(None, true, true),
            ConditionAction::Set(healthy.clone())
        );
        assert_eq!(
            wanted(Some(&condition("False", &why)), true, true),
            ConditionAction::Set(healthy.clone())
        );
        // Still degraded: what it says now.
        assert_eq!(
            wanted(Some(&current), true, false),
            ConditionAction::Set(healthy.clone())
        );
        assert_eq!(wanted(Some(&current), false, true), ConditionAction::Remove);
    }

    #[test]
    fn a_rewrite_keeps_the_transition_time_while_true() {
        let why = Degradation {
            reason: REASON_UNUSABLE_DEVICES.to_owned(),
            message: "m".to_owned(),
        };
        let current = condition("True", &why);
        let rewritten = degraded_condition_value(Some(&current), &why, at(90));
        assert_eq!(rewritten.last_transition_time, Some(Time(at(0))));
        assert_eq!(rewritten.last_heartbeat_time, Some(Time(at(90))));
        let flipped = degraded_condition_value(Some(&condition("False", &why)), &why, at(90));
        assert_eq!(flipped.last_transition_time, Some(Time(at(90))));
        assert_eq!(
            set_condition_patch(None, &why, at(0)),
            json!({"status": {"conditions": [{
                "type": "gpu-guard.io/DeviceDegraded", "status": "True",
                "reason": "UnusableDevices", "message": "m",
                "lastTransitionTime": "2027-01-15T08:00:00Z",
                "lastHeartbeatTime": "2027-01-15T08:00:00Z",
            }]}})
        );
        assert_eq!(
            remove_condition_patch(),
            json!({"status": {"conditions": [
                {"type": "gpu-guard.io/DeviceDegraded", "$patch": "delete"}]}})
        );
    }

    #[test]
    fn only_gpu_guards_condition_is_read() {
        let ready = NodeCondition {
            type_: "Ready".to_owned(),
            status: "True".to_owned(),
            ..NodeCondition::default()
        };
        let mut node = Node {
            status: Some(NodeStatus {
                conditions: Some(vec![ready]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        };
        assert_eq!(degraded_condition(&node), None);
        let ours = NodeCondition {
            type_: DEVICE_DEGRADED_NODE_CONDITION.to_owned(),
            status: "True".to_owned(),
            ..NodeCondition::default()
        };
        node.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(ours.clone());
        assert_eq!(degraded_condition(&node), Some(&ours));
    }
}
