//! PURE: is a GPU node degraded, and what should happen to its taint? No IO, no clock: the
//! time and the node's history are arguments, so every edge is a table test.
//!
//! A node is judged per device resource (`policy.devices`): unusable devices are
//! `status.capacity - status.allocatable` (the device plugin takes an unhealthy device out of
//! allocatable). A node missing either field for a resource, or with a quantity that is not a
//! whole number, is not judged for it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use crate::policy::Policy;
use crate::rules::names::label_value_errors;

/// The key of the taint gpu-guard puts on degraded nodes.
pub const TAINT_KEY: &str = "gpu-guard.io/device-degraded";
/// The node annotation that marks the taint as gpu-guard's own. Its value records the time the
/// taint was added and the exact taint, `<RFC 3339 time>;<value>:<effect>`
/// (`2027-01-15T08:02:00Z;nvidia.com_gpu:NoSchedule`). A `gpu-guard.io/device-degraded` taint
/// is gpu-guard's only when its value and effect are those recorded; any other taint with the
/// key was put there by someone else, and gpu-guard never removes it.
pub const OWNER_ANNOTATION: &str = "gpu-guard.io/device-degraded-since";

/// One device resource of a node, as its status reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCount {
    pub resource: String,
    pub capacity: u64,
    pub allocatable: u64,
}

impl DeviceCount {
    /// Devices the node has but cannot hand out.
    pub fn unusable(&self) -> u64 {
        self.capacity.saturating_sub(self.allocatable)
    }
}

/// What the controller remembers of a node between passes (in memory; rebuilt conservatively
/// after a restart: an empty history only delays decisions by the configured times).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeHistory {
    /// Since when the threshold has been reached without a break.
    pub degraded_since: Option<Timestamp>,
    /// Since when a node gpu-guard tainted has been below the threshold.
    pub healthy_since: Option<Timestamp>,
    /// Dry run: the controller acts as if it had added its taint (it did not).
    pub assumed_tainted: bool,
}

/// What should happen to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No device resource to judge (no capacity and allocatable for one): not a GPU node.
    NotJudged,
    /// Below the threshold and not tainted by gpu-guard.
    Healthy,
    /// The threshold is reached, not for long enough yet.
    Degrading { taint_at: Timestamp },
    /// The threshold has held for `degradedForSeconds`: add the taint.
    Taint,
    /// Tainted by gpu-guard and still degraded.
    Tainted,
    /// Tainted by gpu-guard and healthy again, not for long enough yet.
    Recovering { untaint_at: Timestamp },
    /// Healthy for `healthyForSeconds`: remove gpu-guard's taint.
    Untaint,
    /// Someone else put a `gpu-guard.io/device-degraded` taint on the node: it is theirs, and
    /// gpu-guard neither adds nor removes one here.
    ForeignTaint,
}

/// A node's verdict: the decision, what was seen, and the history to keep for the next pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    /// Every judged device resource, by name.
    pub devices: Vec<DeviceCount>,
    /// The resources at or past the threshold.
    pub degraded: Vec<DeviceCount>,
    pub history: NodeHistory,
}

impl Verdict {
    /// Whether the node has at least one device resource to judge.
    pub fn is_gpu_node(&self) -> bool {
        !self.devices.is_empty()
    }

    /// What was seen, for Events and the log: `2 of 8 nvidia.com/gpu unusable (allocatable 6)`.
    pub fn describe_degraded(&self) -> String {
        describe(&self.degraded)
    }
}

fn describe(devices: &[DeviceCount]) -> String {
    devices
        .iter()
        .map(|device| {
            format!(
                "{} of {} {} unusable (allocatable {})",
                device.unusable(),
                device.capacity,
                device.resource,
                device.allocatable
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Judges one node. `history` is what the previous pass returned (empty at first).
pub fn node_verdict(
    node: &Node,
    policy: &Policy,
    now: Timestamp,
    history: &NodeHistory,
) -> Verdict {
    let devices = device_counts(node, policy);
    let degraded: Vec<DeviceCount> = devices
        .iter()
        .filter(|device| threshold_reached(device, policy))
        .cloned()
        .collect();
    let ownership = ownership(node);
    let owned = ownership == Ownership::Ours || history.assumed_tainted;
    let health = &policy.controller.node_health;
    let mut next = NodeHistory {
        assumed_tainted: history.assumed_tainted,
        ..NodeHistory::default()
    };
    let decision = if ownership == Ownership::Foreign {
        Decision::ForeignTaint
    } else if !degraded.is_empty() {
        // After a restart the history is empty: a node gpu-guard tainted has been degraded at
        // least since its taint was added (the owner annotation).
        let since = history
            .degraded_since
            .or_else(|| {
                let restarted = history.healthy_since.is_none();
                (restarted && ownership == Ownership::Ours)
                    .then(|| tainted_since(node))
                    .flatten()
            })
            .unwrap_or(now);
        next.degraded_since = Some(since);
        let taint_at = later(since, health.degraded_for_seconds);
        if owned {
            Decision::Tainted
        } else if now >= taint_at {
            Decision::Taint
        } else {
            Decision::Degrading { taint_at }
        }
    } else if owned {
        let since = history.healthy_since.unwrap_or(now);
        next.healthy_since = Some(since);
        let untaint_at = later(since, health.healthy_for_seconds);
        if now >= untaint_at {
            Decision::Untaint
        } else {
            Decision::Recovering { untaint_at }
        }
    } else if devices.is_empty() {
        Decision::NotJudged
    } else {
        Decision::Healthy
    };
    Verdict {
        decision,
        devices,
        degraded,
        history: next,
    }
}

/// `seconds` after `since`, saturating at the end of time (never a panic: an owner annotation
/// near year 9999 or a huge setting must not kill the loop).
pub fn later(since: Timestamp, seconds: u64) -> Timestamp {
    i64::try_from(seconds)
        .ok()
        .and_then(|seconds| since.checked_add(SignedDuration::from_secs(seconds)).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Whether one resource's unusable devices reach the policy's threshold.
pub fn threshold_reached(device: &DeviceCount, policy: &Policy) -> bool {
    let unusable = device.unusable();
    if unusable == 0 {
        return false;
    }
    let threshold = &policy.controller.node_health.unusable_devices;
    let by_count = threshold
        .count
        .is_some_and(|count| unusable >= u64::from(count));
    let by_percent = threshold.percent.is_some_and(|percent| {
        device.capacity > 0
            && u128::from(unusable) * 100 >= u128::from(percent) * u128::from(device.capacity)
    });
    by_count || by_percent
}

/// The node's device resources with a whole-number capacity and allocatable, by name.
pub fn device_counts(node: &Node, policy: &Policy) -> Vec<DeviceCount> {
    let Some(status) = &node.status else {
        return Vec::new();
    };
    let (Some(capacity), Some(allocatable)) = (&status.capacity, &status.allocatable) else {
        return Vec::new();
    };
    capacity
        .iter()
        .filter(|(resource, _)| policy.devices.is_device_resource(resource))
        .filter_map(|(resource, quantity)| {
            let capacity = parse_count(&quantity.0)?;
            let allocatable = parse_count(&allocatable.get(resource)?.0)?;
            (capacity > 0).then(|| DeviceCount {
                resource: resource.clone(),
                capacity,
                allocatable,
            })
        })
        .collect()
}

/// A device count: a whole number, optionally with a decimal suffix (`8`, `1k`). Anything else
/// (fractions, `500m`, garbage) is unknown.
pub fn parse_count(quantity: &str) -> Option<u64> {
    let quantity = quantity.trim();
    let (digits, factor) = match quantity.strip_suffix('k') {
        Some(digits) => (digits, 1000),
        None => (quantity, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(factor)
}

/// What the owner annotation records: when gpu-guard added its taint, and which taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRecord {
    pub since: Timestamp,
    pub value: String,
    pub effect: String,
}

impl OwnerRecord {
    /// The annotation value: `<RFC 3339 time>;<value>:<effect>`.
    pub fn annotation(taint: &Taint, since: Timestamp) -> String {
        format!(
            "{since};{}:{}",
            taint.value.as_deref().unwrap_or_default(),
            taint.effect
        )
    }

    fn parse(text: &str) -> Option<Self> {
        let (since, taint) = text.split_once(';')?;
        let (value, effect) = taint.rsplit_once(':')?;
        Some(Self {
            since: since.parse().ok()?,
            value: value.to_owned(),
            effect: effect.to_owned(),
        })
    }

    /// Whether `taint` is exactly the one recorded (key, value and effect).
    pub fn matches(&self, taint: &Taint) -> bool {
        taint.key == TAINT_KEY
            && taint.value.as_deref().unwrap_or_default() == self.value
            && taint.effect == self.effect
    }
}

fn annotation(node: &Node) -> Option<&String> {
    node.metadata.annotations.as_ref()?.get(OWNER_ANNOTATION)
}

/// The node's owner annotation, if it has one that parses.
pub fn owner_record(node: &Node) -> Option<OwnerRecord> {
    OwnerRecord::parse(annotation(node)?)
}

/// gpu-guard's own taint on the node: the one its owner annotation records.
fn our_taint(node: &Node) -> Option<&Taint> {
    let record = owner_record(node)?;
    taints(node).iter().find(|taint| record.matches(taint))
}

/// When gpu-guard tainted the node, from its owner annotation (only while its taint is there).
pub fn tainted_since(node: &Node) -> Option<Timestamp> {
    our_taint(node)?;
    owner_record(node).map(|record| record.since)
}

/// Whether the node carries the owner annotation without the taint it records (someone removed
/// the taint, or the annotation does not parse): the annotation is to be removed, alone.
pub fn stale_annotation(node: &Node) -> bool {
    annotation(node).is_some() && our_taint(node).is_none()
}

/// Who owns the node's `gpu-guard.io/device-degraded` taint, if it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    None,
    Ours,
    Foreign,
}

/// Whether the node carries gpu-guard's taint (the exact taint its owner annotation records),
/// someone else's taint with that key, or none.
pub fn ownership(node: &Node) -> Ownership {
    if our_taint(node).is_some() {
        Ownership::Ours
    } else if taints(node).iter().any(|taint| taint.key == TAINT_KEY) {
        Ownership::Foreign
    } else {
        Ownership::None
    }
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|spec| spec.taints.as_deref())
        .unwrap_or_default()
}

/// The taint value for a resource: its name with `/` written `_` (a taint value is a label
/// value, which cannot hold `/`), or, when that is not a valid label value (too long), the
/// name after the `/`.
pub fn taint_value(resource: &str) -> String {
    let encoded = resource.replace('/', "_");
    if label_value_errors(&encoded).is_empty() {
        encoded
    } else {
        resource
            .rsplit_once('/')
            .map_or(resource, |(_, name)| name)
            .to_owned()
    }
}

/// The taint gpu-guard adds for `resource`.
pub fn degraded_taint(resource: &str, no_execute: bool) -> Taint {
    Taint {
        key: TAINT_KEY.to_owned(),
        value: Some(taint_value(resource)),
        effect: if no_execute {
            "NoExecute"
        } else {
            "NoSchedule"
        }
        .to_owned(),
        time_added: None,
    }
}

/// The JSON merge patch that adds gpu-guard's taint: the node's whole taint list (the list has
/// no merge key, so a patch replaces it) with the new taint appended, the owner annotation, and
/// the node's `resourceVersion`, so that a concurrent change of the node makes the API server
/// answer 409 Conflict instead of losing the other writer's taints.
pub fn add_taint_patch(node: &Node, taint: &Taint, now: Timestamp) -> Value {
    let mut list: Vec<Taint> = taints(node).to_vec();
    list.push(taint.clone());
    json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": {OWNER_ANNOTATION: OwnerRecord::annotation(taint, now)},
        },
        "spec": {"taints": list},
    })
}

/// The JSON merge patch that removes gpu-guard's taint (exactly the one its owner annotation
/// records: another taint with the same key, someone else's, stays) and its owner annotation,
/// with the node's `resourceVersion` (see [`add_taint_patch`]).
pub fn remove_taint_patch(node: &Node) -> Value {
    let record = owner_record(node);
    let list: Vec<&Taint> = taints(node)
        .iter()
        .filter(|existing| !record.as_ref().is_some_and(|r| r.matches(existing)))
        .collect();
    json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": {OWNER_ANNOTATION: null},
        },
        "spec": {"taints": list},
    })
}

/// The JSON merge patch that removes only a stale owner annotation (see [`stale_annotation`]),
/// with the node's `resourceVersion`.
pub fn clear_annotation_patch(node: &Node) -> Value {
    json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": {OWNER_ANNOTATION: null},
        },
    })
}

/// The device resources gpu-guard's taint on the node stands for: those of the node whose
/// [`taint_value`] is the taint's value. Empty when the node carries no taint of gpu-guard's.
pub fn tainted_resources(node: &Node, policy: &Policy) -> Vec<String> {
    let Some(taint) = our_taint(node) else {
        return Vec::new();
    };
    let values: Vec<&str> = taint.value.as_deref().into_iter().collect();
    let resources: BTreeMap<&String, ()> = node
        .status
        .iter()
        .flat_map(|status| status.capacity.iter().flatten())
        .filter(|(resource, _)| policy.devices.is_device_resource(resource))
        .filter(|(resource, _)| values.contains(&taint_value(resource).as_str()))
        .map(|(resource, _)| (resource, ()))
        .collect();
    resources.into_keys().cloned().collect()
}

/// The safety valve: how many GPU nodes gpu-guard may hold tainted at once. `maxTaintedPercent`
/// of the GPU nodes, rounded down, but at least one (a small cluster must still be protected);
/// none when the percentage is 0.
pub fn taint_limit(gpu_nodes: usize, policy: &Policy) -> usize {
    let percent = u128::from(policy.controller.node_health.max_tainted_percent);
    if percent == 0 {
        return 0;
    }
    let limit = (gpu_nodes as u128).saturating_mul(percent) / 100;
    usize::try_from(limit).unwrap_or(usize::MAX).max(1)
}

/// Whether one more node may be tainted while `tainted` of `gpu_nodes` are.
pub fn may_taint(gpu_nodes: usize, tainted: usize, policy: &Policy) -> bool {
    tainted < taint_limit(gpu_nodes, policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                .collect(),
        )
    }

    fn node_status(capacity: Option<&str>, allocatable: Option<&str>) -> Option<NodeStatus> {
        Some(NodeStatus {
            capacity: capacity.and_then(|c| quantities(&[("cpu", "64"), ("nvidia.com/gpu", c)])),
            allocatable: allocatable
                .and_then(|a| quantities(&[("cpu", "63"), ("nvidia.com/gpu", a)])),
            ..NodeStatus::default()
        })
    }

    /// A node with `capacity`/`allocatable` GPUs (None: the field is missing).
    fn node(capacity: Option<&str>, allocatable: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("gpu-1".to_owned()),
                resource_version: Some("7".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec::default()),
            status: node_status(capacity, allocatable),
        }
    }

    fn with_taint(mut node: Node, taint: Taint, ours: bool) -> Node {
        node.spec
            .get_or_insert_with(NodeSpec::default)
            .taints
            .get_or_insert_with(Vec::new)
            .push(taint);
        if ours {
            node.metadata.annotations = Some(
                [(
                    OWNER_ANNOTATION.to_owned(),
                    OwnerRecord::annotation(
                        node.spec
                            .as_ref()
                            .unwrap()
                            .taints
                            .as_ref()
                            .unwrap()
                            .last()
                            .unwrap(),
                        at(0),
                    ),
                )]
                .into_iter()
                .collect(),
            );
        }
        node
    }

    fn ours(node: Node) -> Node {
        with_taint(node, degraded_taint("nvidia.com/gpu", false), true)
    }

    fn policy() -> Policy {
        let mut policy = Policy::default();
        policy.controller.node_health.degraded_for_seconds = 120;
        policy.controller.node_health.healthy_for_seconds = 600;
        policy
    }

    fn history(degraded: Option<i64>, healthy: Option<i64>) -> NodeHistory {
        NodeHistory {
            degraded_since: degraded.map(at),
            healthy_since: healthy.map(at),
            assumed_tainted: false,
        }
    }

    #[test]
    fn counts_parse_whole_numbers_only() {
        for (text, expected) in [
            ("8", Some(8)),
            (" 8 ", Some(8)),
            ("0", Some(0)),
            ("1k", Some(1000)),
            ("", None),
            ("8.5", None),
            ("500m", None),
            ("-1", None),
            ("1Ki", None),
            ("eight", None),
            ("99999999999999999999999", None),
        ] {
            assert_eq!(parse_count(text), expected, "{text:?}");
        }
    }

    #[test]
    fn thresholds_by_count_and_percent() {
        // (capacity, allocatable, count, percent, degraded)
        let table = [
            (8, 8, Some(1), None, false),
            (8, 7, Some(1), None, true),
            (8, 7, Some(2), None, false),
            (8, 6, Some(2), None, true),
            (8, 9, Some(1), None, false), // allocatable above capacity: nothing unusable
            (8, 6, None, Some(25), true), // exactly 25 %
            (8, 7, None, Some(25), false), // 12.5 %
            (8, 7, Some(3), Some(10), true), // either bound is enough
            (8, 7, Some(1), Some(50), true),
            (8, 8, None, Some(1), false), // zero unusable never degrades
            (1, 0, None, Some(100), true),
        ];
        for (capacity, allocatable, count, percent, expected) in table {
            let mut policy = policy();
            policy.controller.node_health.unusable_devices.count = count;
            policy.controller.node_health.unusable_devices.percent = percent;
            let device = DeviceCount {
                resource: "nvidia.com/gpu".to_owned(),
                capacity,
                allocatable,
            };
            assert_eq!(
                threshold_reached(&device, &policy),
                expected,
                "{capacity}/{allocatable} count {count:?} percent {percent:?}"
            );
        }
    }

    /// (name, node, history, now, decision, next degraded_since, next healthy_since)
    type Row = (
        &'static str,
        Node,
        NodeHistory,
        i64,
        Decision,
        Option<i64>,
        Option<i64>,
    );

    #[test]
    fn decisions_over_time_with_hysteresis() {
        use Decision::*;
        let degraded = node(Some("8"), Some("7"));
        let healthy = node(Some("8"), Some("8"));
        // (node, history, now, decision, next degraded_since, next healthy_since)
        let table: Vec<Row> = vec![
            (
                "healthy",
                healthy.clone(),
                history(None, None),
                0,
                Healthy,
                None,
                None,
            ),
            (
                "first seen degraded",
                degraded.clone(),
                history(None, None),
                0,
                Degrading { taint_at: at(120) },
                Some(0),
                None,
            ),
            (
                "degraded 119 s",
                degraded.clone(),
                history(Some(0), None),
                119,
                Degrading { taint_at: at(120) },
                Some(0),
                None,
            ),
            (
                "degraded 120 s: taint",
                degraded.clone(),
                history(Some(0), None),
                120,
                Taint,
                Some(0),
                None,
            ),
            (
                "a dip below the threshold restarts the clock",
                healthy.clone(),
                history(Some(0), None),
                100,
                Healthy,
                None,
                None,
            ),
            (
                "tainted and degraded",
                ours(degraded.clone()),
                history(Some(0), None),
                500,
                Tainted,
                Some(0),
                None,
            ),
            (
                "after a restart a tainted degraded node is degraded since its taint",
                ours(degraded.clone()),
                history(None, None),
                5000,
                Tainted,
                Some(0),
                None,
            ),
            (
                "tainted, healthy again",
                ours(healthy.clone()),
                history(Some(0), None),
                500,
                Recovering {
                    untaint_at: at(1100),
                },
                None,
                Some(500),
            ),
            (
                "tainted, healthy 599 s",
                ours(healthy.clone()),
                history(None, Some(500)),
                1099,
                Recovering {
                    untaint_at: at(1100),
                },
                None,
                Some(500),
            ),
            (
                "tainted, healthy 600 s: untaint",
                ours(healthy.clone()),
                history(None, Some(500)),
                1100,
                Untaint,
                None,
                Some(500),
            ),
            (
                "degraded again while recovering: the recovery clock restarts",
                ours(degraded.clone()),
                history(None, Some(500)),
                1000,
                Tainted,
                Some(1000),
                None,
            ),
            (
                "after a restart (no history) a tainted healthy node waits the full time",
                ours(healthy.clone()),
                history(None, None),
                5000,
                Recovering {
                    untaint_at: at(5600),
                },
                None,
                Some(5000),
            ),
            (
                "someone else's taint with gpu-guard's key is left alone",
                with_taint(
                    healthy.clone(),
                    degraded_taint("nvidia.com/gpu", false),
                    false,
                ),
                history(None, Some(0)),
                9999,
                ForeignTaint,
                None,
                None,
            ),
            (
                "someone else's taint on a degraded node: not tainted again",
                with_taint(
                    degraded.clone(),
                    degraded_taint("nvidia.com/gpu", false),
                    false,
                ),
                history(Some(0), None),
                9999,
                ForeignTaint,
                None,
                None,
            ),
            (
                "other taints do not make the node gpu-guard's",
                with_taint(
                    healthy.clone(),
                    super::Taint {
                        key: "nvidia.com/gpu".to_owned(),
                        value: Some("present".to_owned()),
                        effect: "NoSchedule".to_owned(),
                        time_added: None,
                    },
                    false,
                ),
                history(None, None),
                0,
                Healthy,
                None,
                None,
            ),
            (
                "no capacity: not judged",
                node(None, Some("7")),
                history(None, None),
                0,
                NotJudged,
                None,
                None,
            ),
            (
                "no allocatable: not judged",
                node(Some("8"), None),
                history(Some(0), None),
                500,
                NotJudged,
                None,
                None,
            ),
            (
                "unparsable capacity: not judged",
                node(Some("lots"), Some("7")),
                history(None, None),
                0,
                NotJudged,
                None,
                None,
            ),
            (
                "zero capacity: not judged",
                node(Some("0"), Some("0")),
                history(None, None),
                0,
                NotJudged,
                None,
                None,
            ),
            (
                "missing fields on a node gpu-guard tainted count as healthy",
                ours(node(Some("8"), None)),
                history(None, None),
                0,
                Recovering {
                    untaint_at: at(600),
                },
                None,
                Some(0),
            ),
        ];
        for (name, node, before, now, decision, degraded_since, healthy_since) in table {
            let verdict = node_verdict(&node, &policy(), at(now), &before);
            assert_eq!(verdict.decision, decision, "{name}");
            assert_eq!(
                verdict.history.degraded_since,
                degraded_since.map(at),
                "{name}"
            );
            assert_eq!(
                verdict.history.healthy_since,
                healthy_since.map(at),
                "{name}"
            );
        }
    }

    #[test]
    fn dry_run_assumes_its_own_taint() {
        let mut before = history(Some(0), None);
        before.assumed_tainted = true;
        let degraded = node(Some("8"), Some("7"));
        let verdict = node_verdict(&degraded, &policy(), at(200), &before);
        assert_eq!(verdict.decision, Decision::Tainted);
        assert!(verdict.history.assumed_tainted);
        let healthy = node(Some("8"), Some("8"));
        let verdict = node_verdict(&healthy, &policy(), at(200), &before);
        assert_eq!(
            verdict.decision,
            Decision::Recovering {
                untaint_at: at(800)
            }
        );
    }

    #[test]
    fn only_configured_device_resources_are_judged() {
        let mut node = node(Some("8"), Some("8"));
        let status = node.status.as_mut().unwrap();
        status.capacity.as_mut().unwrap().extend(
            quantities(&[("example.com/fpga", "4"), ("nvidia.com/mig-1g.5gb", "7")]).unwrap(),
        );
        status.allocatable.as_mut().unwrap().extend(
            quantities(&[("example.com/fpga", "0"), ("nvidia.com/mig-1g.5gb", "5")]).unwrap(),
        );
        let verdict = node_verdict(&node, &policy(), at(0), &NodeHistory::default());
        let judged: Vec<&str> = verdict
            .devices
            .iter()
            .map(|d| d.resource.as_str())
            .collect();
        assert_eq!(judged, ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb"]);
        assert_eq!(
            verdict.describe_degraded(),
            "2 of 7 nvidia.com/mig-1g.5gb unusable (allocatable 5)"
        );
    }

    #[test]
    fn the_safety_valve() {
        // (gpu nodes, tainted now, percent, may taint one more)
        for (gpu_nodes, tainted, percent, expected) in [
            (100, 9, 10, true),
            (100, 10, 10, false),
            (105, 10, 10, false), // 10.5 rounds down
            (110, 10, 10, true),
            (5, 0, 10, true), // at least one node
            (5, 1, 10, false),
            (1, 0, 10, true),
            (20, 0, 0, false), // 0 % closes the valve
            (20, 19, 100, true),
            (20, 20, 100, false),
        ] {
            let mut policy = policy();
            policy.controller.node_health.max_tainted_percent = percent;
            assert_eq!(
                may_taint(gpu_nodes, tainted, &policy),
                expected,
                "{tainted} of {gpu_nodes} tainted, {percent} %"
            );
        }
    }

    #[test]
    fn taint_values_are_label_values() {
        assert_eq!(taint_value("nvidia.com/gpu"), "nvidia.com_gpu");
        assert_eq!(
            taint_value("nvidia.com/mig-1g.5gb"),
            "nvidia.com_mig-1g.5gb"
        );
        let long = format!("{}.example.com/gpu", "a".repeat(60));
        assert_eq!(taint_value(&long), "gpu");
        assert!(label_value_errors(&taint_value("amd.com/gpu")).is_empty());
    }

    #[test]
    fn patches_keep_other_taints_and_carry_the_resource_version() {
        let other = Taint {
            key: "nvidia.com/gpu".to_owned(),
            value: Some("present".to_owned()),
            effect: "NoSchedule".to_owned(),
            time_added: None,
        };
        let node = with_taint(node(Some("8"), Some("7")), other, false);
        let patch = add_taint_patch(&node, &degraded_taint("nvidia.com/gpu", false), at(0));
        assert_eq!(
            patch,
            json!({
                "metadata": {
                    "resourceVersion": "7",
                    "annotations": {OWNER_ANNOTATION: "2027-01-15T08:00:00Z;nvidia.com_gpu:NoSchedule"},
                },
                "spec": {"taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                    {"key": TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"},
                ]},
            })
        );
        let tainted = ours(node);
        assert_eq!(
            remove_taint_patch(&tainted),
            json!({
                "metadata": {"resourceVersion": "7", "annotations": {OWNER_ANNOTATION: null}},
                "spec": {"taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                ]},
            })
        );
        assert_eq!(
            degraded_taint("amd.com/gpu", true).effect,
            "NoExecute".to_owned()
        );
    }

    #[test]
    fn tainted_resources_come_from_gpu_guards_taint_only() {
        let degraded = node(Some("8"), Some("7"));
        assert_eq!(
            tainted_resources(&ours(degraded.clone()), &policy()),
            ["nvidia.com/gpu"]
        );
        assert!(tainted_resources(&degraded, &policy()).is_empty());
        let foreign = with_taint(degraded, degraded_taint("nvidia.com/gpu", false), false);
        assert!(tainted_resources(&foreign, &policy()).is_empty());
    }

    fn annotated(mut node: Node, value: &str) -> Node {
        node.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(OWNER_ANNOTATION.to_owned(), value.to_owned());
        node
    }

    #[test]
    fn a_taint_is_ours_only_when_it_is_exactly_the_one_recorded() {
        let degraded = node(Some("8"), Some("7"));
        let recorded = "2027-01-15T08:00:00Z;nvidia.com_gpu:NoSchedule";
        let mut manual = degraded_taint("nvidia.com/gpu", true);
        manual.value = Some("by-hand".to_owned());
        // The annotation alone (the taint removed by hand): stale, no taint of ours.
        let stale = annotated(degraded.clone(), recorded);
        assert_eq!(ownership(&stale), Ownership::None);
        assert!(stale_annotation(&stale));
        assert_eq!(tainted_since(&stale), None);
        assert_eq!(
            clear_annotation_patch(&stale),
            json!({"metadata": {"resourceVersion": "7", "annotations": {OWNER_ANNOTATION: null}}})
        );
        // A later manual taint with the key but another value or effect: someone else's.
        let foreign = with_taint(stale.clone(), manual.clone(), false);
        assert_eq!(ownership(&foreign), Ownership::Foreign);
        assert!(stale_annotation(&foreign));
        let mut other_effect = degraded_taint("nvidia.com/gpu", true);
        other_effect.effect = "NoExecute".to_owned();
        assert_eq!(
            ownership(&with_taint(stale.clone(), other_effect, false)),
            Ownership::Foreign
        );
        // An annotation that does not parse (the old format) owns nothing.
        let old = with_taint(
            annotated(degraded.clone(), "2027-01-15T08:00:00Z"),
            degraded_taint("nvidia.com/gpu", false),
            false,
        );
        assert_eq!(ownership(&old), Ownership::Foreign);
        assert!(stale_annotation(&old));
        // Ours next to someone's NoExecute taint with the same key: only ours is removed.
        let both = with_taint(
            with_taint(
                degraded.clone(),
                degraded_taint("nvidia.com/gpu", false),
                false,
            ),
            manual.clone(),
            false,
        );
        let both = annotated(both, recorded);
        assert_eq!(ownership(&both), Ownership::Ours);
        assert!(!stale_annotation(&both));
        assert_eq!(tainted_since(&both), Some(at(0)));
        assert_eq!(
            remove_taint_patch(&both)["spec"]["taints"],
            json!([{"key": TAINT_KEY, "value": "by-hand", "effect": "NoExecute"}])
        );
    }

    #[test]
    fn time_arithmetic_never_overflows() {
        let mut policy = policy();
        policy.controller.node_health.degraded_for_seconds = u64::MAX;
        policy.controller.node_health.healthy_for_seconds = u64::MAX / 2;
        let degraded = node(Some("8"), Some("7"));
        let verdict = node_verdict(&degraded, &policy, at(0), &NodeHistory::default());
        assert_eq!(
            verdict.decision,
            Decision::Degrading {
                taint_at: Timestamp::MAX
            }
        );
        // An owner annotation near the end of time (year 9999).
        let mut end = with_taint(degraded, degraded_taint("nvidia.com/gpu", false), false);
        end = annotated(
            end,
            &format!("{};nvidia.com_gpu:NoSchedule", Timestamp::MAX),
        );
        let healthy = {
            let mut node = end.clone();
            node.status = node_status(Some("8"), Some("8"));
            node
        };
        let since_end = NodeHistory {
            healthy_since: Some(Timestamp::MAX),
            ..NodeHistory::default()
        };
        let verdict = node_verdict(&healthy, &policy, Timestamp::MAX, &since_end);
        // `healthy_since + healthyForSeconds` saturates at the end of time: no panic.
        assert_eq!(verdict.decision, Decision::Untaint);
        let verdict = node_verdict(&healthy, &policy, at(0), &since_end);
        assert_eq!(
            verdict.decision,
            Decision::Recovering {
                untaint_at: Timestamp::MAX
            }
        );
        let verdict = node_verdict(&end, &policy, at(0), &NodeHistory::default());
        assert_eq!(verdict.decision, Decision::Tainted);
        assert_eq!(later(Timestamp::MAX, 1), Timestamp::MAX);
        assert_eq!(later(at(0), 60), at(60));
        // Percentages of huge counts.
        policy.controller.node_health.unusable_devices.percent = Some(50);
        policy.controller.node_health.unusable_devices.count = None;
        let huge = DeviceCount {
            resource: "nvidia.com/gpu".to_owned(),
            capacity: u64::MAX,
            allocatable: 0,
        };
        assert!(threshold_reached(&huge, &policy));
        policy.controller.node_health.max_tainted_percent = 100;
        assert_eq!(taint_limit(usize::MAX, &policy), usize::MAX);
    }
}
