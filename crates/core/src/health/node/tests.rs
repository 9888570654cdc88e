//! Table tests of the node verdicts, ownership and taint patches ([`super`]).

use std::collections::BTreeMap;

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
        allocatable: allocatable.and_then(|a| quantities(&[("cpu", "63"), ("nvidia.com/gpu", a)])),
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
                DEGRADED_OWNER_ANNOTATION.to_owned(),
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
        ..NodeHistory::default()
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
    TaintDecision,
    Option<i64>,
    Option<i64>,
);

#[test]
fn decisions_over_time_with_hysteresis() {
    use TaintDecision::*;
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
            "allocatable gone from a node gpu-guard tainted: its plugin is down, still tainted",
            ours(node(Some("8"), None)),
            history(None, None),
            0,
            Tainted,
            Some(0),
            None,
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
    assert_eq!(verdict.decision, TaintDecision::Tainted);
    assert!(verdict.history.assumed_tainted);
    let healthy = node(Some("8"), Some("8"));
    let verdict = node_verdict(&healthy, &policy(), at(200), &before);
    assert_eq!(
        verdict.decision,
        TaintDecision::Recovering {
            untaint_at: at(800)
        }
    );
}

#[test]
fn only_configured_device_resources_are_judged() {
    let mut node = node(Some("8"), Some("8"));
    let status = node.status.as_mut().unwrap();
    status
        .capacity
        .as_mut()
        .unwrap()
        .extend(quantities(&[("example.com/fpga", "4"), ("nvidia.com/mig-1g.5gb", "7")]).unwrap());
    status
        .allocatable
        .as_mut()
        .unwrap()
        .extend(quantities(&[("example.com/fpga", "0"), ("nvidia.com/mig-1g.5gb", "5")]).unwrap());
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
                "annotations": {DEGRADED_OWNER_ANNOTATION: "2027-01-15T08:00:00Z;nvidia.com_gpu:NoSchedule"},
            },
            "spec": {"taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": DEGRADED_TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"},
            ]},
        })
    );
    let tainted = ours(node);
    assert_eq!(
        remove_taint_patch(&tainted),
        json!({
            "metadata": {"resourceVersion": "7", "annotations": {DEGRADED_OWNER_ANNOTATION: null}},
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

fn annotated(mut node: Node, value: &str) -> Node {
    node.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(DEGRADED_OWNER_ANNOTATION.to_owned(), value.to_owned());
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
        json!({"metadata": {"resourceVersion": "7", "annotations": {DEGRADED_OWNER_ANNOTATION: null}}})
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
        json!([{"key": DEGRADED_TAINT_KEY, "value": "by-hand", "effect": "NoExecute"}])
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
        TaintDecision::Degrading {
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
    assert_eq!(verdict.decision, TaintDecision::Untaint);
    let verdict = node_verdict(&healthy, &policy, at(0), &since_end);
    assert_eq!(
        verdict.decision,
        TaintDecision::Recovering {
            untaint_at: Timestamp::MAX
        }
    );
    let verdict = node_verdict(&end, &policy, at(0), &NodeHistory::default());
    assert_eq!(verdict.decision, TaintDecision::Tainted);
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

/// A ResourceSlice of `driver` for `node`, in pool `pool` at `generation`, with devices
/// `gpu-0..` of which those listed in `tainted` carry a taint of that effect (the shape of the
/// NVIDIA DRA driver's slices: one pool per node, named after it).
fn slice(
    node: &str,
    driver: &str,
    generation: i64,
    devices: usize,
    tainted: &[(usize, &str)],
) -> ResourceSlice {
    let devices: Vec<serde_json::Value> = (0..devices)
        .map(|index| {
            let mut device = json!({"name": format!("gpu-{index}"),
                "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}}});
            if let Some((_, effect)) = tainted.iter().find(|(at, _)| *at == index) {
                device["taints"] =
                    json!([{"key": "gpu.nvidia.com/xid", "value": "79", "effect": effect}]);
            }
            device
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{driver}-{generation}")},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .unwrap()
}

#[test]
fn dra_devices_count_per_driver_with_tainted_ones_unusable() {
    let policy = Policy::embedded();
    let count = |resource: &str, capacity, allocatable| DeviceCount {
        resource: resource.to_owned(),
        capacity,
        allocatable,
    };
    let cases: Vec<(&str, Vec<ResourceSlice>, Vec<DeviceCount>)> = vec![
        ("no slices", vec![], vec![]),
        (
            "8 GPUs, one tainted NoExecute, one NoSchedule, one only PreferNoSchedule",
            vec![slice(
                "n1",
                "gpu.nvidia.com",
                1,
                8,
                &[(0, "NoExecute"), (1, "NoSchedule"), (2, "PreferNoSchedule")],
            )],
            vec![count("dra/gpu.nvidia.com", 8, 6)],
        ),
        (
            "a stale generation of the pool does not count",
            vec![
                slice("n1", "gpu.nvidia.com", 1, 8, &[(0, "NoExecute")]),
                slice("n1", "gpu.nvidia.com", 2, 7, &[]),
            ],
            vec![count("dra/gpu.nvidia.com", 7, 7)],
        ),
        (
            "another node's slices and unlisted drivers do not count",
            vec![
                slice("n2", "gpu.nvidia.com", 1, 8, &[(0, "NoExecute")]),
                slice("n1", "nic.example.com", 1, 2, &[(0, "NoExecute")]),
                slice("n1", "gpu.amd.com", 1, 4, &[(3, "NoSchedule")]),
            ],
            vec![count("dra/gpu.amd.com", 4, 3)],
        ),
    ];
    for (case, slices, expected) in cases {
        assert_eq!(
            dra_device_counts("n1", &slices, &policy),
            expected,
            "{case}"
        );
    }
}

#[test]
fn a_node_whose_dra_gpus_are_tainted_is_judged_like_a_device_plugin_node() {
    let mut policy = Policy::embedded();
    policy.controller.node_health.unusable_devices.count = Some(1);
    policy.controller.node_health.unusable_devices.percent = None;
    let cpu_node = node(None, None);
    let slices = [slice("n1", "gpu.nvidia.com", 1, 8, &[(5, "NoExecute")])];
    let dra = dra_device_counts("n1", &slices, &policy);
    let verdict = node_verdict_with(&cpu_node, dra, &policy, at(0), &NodeHistory::default());
    assert!(verdict.is_gpu_node());
    assert_eq!(
        verdict.degraded,
        [DeviceCount {
            resource: "dra/gpu.nvidia.com".to_owned(),
            capacity: 8,
            allocatable: 7,
        }]
    );
    assert!(matches!(verdict.decision, TaintDecision::Degrading { .. }));
    // The taint's value is a valid label value.
    assert_eq!(taint_value("dra/gpu.nvidia.com"), "dra_gpu.nvidia.com");
    // Without DRA devices the same node is not a GPU node.
    let plain = node_verdict(&cpu_node, &policy, at(0), &NodeHistory::default());
    assert_eq!(plain.decision, TaintDecision::NotJudged);
}

fn seen(resources: &[(&str, u64)]) -> NodeHistory {
    NodeHistory {
        seen: resources
            .iter()
            .map(|(resource, count)| ((*resource).to_owned(), *count))
            .collect(),
        ..NodeHistory::default()
    }
}

/// (name, node, DRA counts, history, now, decision, plugin down, what the Event says)
type PluginRow = (
    &'static str,
    Node,
    Vec<DeviceCount>,
    NodeHistory,
    i64,
    TaintDecision,
    &'static [&'static str],
    &'static str,
);

#[test]
fn a_node_whose_device_plugin_is_gone_is_never_healthy() {
    use TaintDecision::*;
    let mut policy = policy();
    // A threshold two devices could never reach: plugin down degrades whatever it is.
    policy.controller.node_health.unusable_devices.count = Some(4);
    let gpus = [("nvidia.com/gpu", 8)];
    let tainted_since = |mut history: NodeHistory| {
        history.degraded_since = Some(at(0));
        history
    };
    let dra = |capacity, allocatable| DeviceCount {
        resource: "dra/gpu.nvidia.com".to_owned(),
        capacity,
        allocatable,
    };
    let stale = annotated(
        node(Some("0"), Some("0")),
        "2027-01-15T08:00:00Z;nvidia.com_gpu:NoSchedule",
    );
    let table: Vec<PluginRow> = vec![
        (
            "allocatable 0 of 2: plugin down, degraded below the count threshold",
            node(Some("2"), Some("0")),
            vec![],
            NodeHistory::default(),
            0,
            Degrading { taint_at: at(120) },
            &["nvidia.com/gpu"],
            "nvidia.com/gpu device plugin down (2 seen, none allocatable)",
        ),
        (
            "capacity dropped to 0 after 8 were seen",
            node(Some("0"), Some("0")),
            vec![],
            seen(&gpus),
            0,
            Degrading { taint_at: at(120) },
            &["nvidia.com/gpu"],
            "nvidia.com/gpu device plugin down (8 seen, none allocatable)",
        ),
        (
            "the resource vanished from capacity and allocatable",
            node(None, None),
            vec![],
            seen(&gpus),
            0,
            Degrading { taint_at: at(120) },
            &["nvidia.com/gpu"],
            "nvidia.com/gpu device plugin down (8 seen, none allocatable)",
        ),
        (
            "allocatable gone, capacity kept",
            node(Some("8"), None),
            vec![],
            seen(&gpus),
            0,
            Degrading { taint_at: at(120) },
            &["nvidia.com/gpu"],
            "nvidia.com/gpu device plugin down (8 seen, none allocatable)",
        ),
        (
            "tainted, plugin gone: stays tainted (no untaint, plugin back, taint again loop)",
            ours(node(Some("0"), Some("0"))),
            vec![],
            tainted_since(seen(&gpus)),
            5000,
            Tainted,
            &["nvidia.com/gpu"],
            "nvidia.com/gpu device plugin down (8 seen, none allocatable)",
        ),
        (
            "after a restart, a tainted node whose capacity is 0 stays tainted",
            ours(node(Some("0"), Some("0"))),
            vec![],
            NodeHistory::default(),
            5000,
            Tainted,
            &["nvidia.com/gpu"],
            "nvidia.com/gpu device plugin down (gone from the node)",
        ),
        (
            "after a restart, a tainted node without the resource at all stays tainted",
            ours(node(None, None)),
            vec![],
            NodeHistory::default(),
            5000,
            Tainted,
            &["nvidia.com_gpu"],
            "nvidia.com_gpu device plugin down (gone from the node)",
        ),
        (
            "never seen with devices: not a GPU node",
            node(Some("0"), Some("0")),
            vec![],
            NodeHistory::default(),
            0,
            NotJudged,
            &[],
            "",
        ),
        (
            "the plugin is back: healthy",
            node(Some("8"), Some("8")),
            vec![],
            seen(&gpus),
            0,
            Healthy,
            &[],
            "",
        ),
        (
            "someone removed gpu-guard's taint by hand: the vanished resource is forgotten",
            stale,
            vec![],
            seen(&gpus),
            0,
            NotJudged,
            &[],
            "",
        ),
        (
            "a DRA driver that taints all its GPUs is running: degraded, not plugin down",
            node(None, None),
            vec![dra(8, 0)],
            NodeHistory::default(),
            0,
            Degrading { taint_at: at(120) },
            &[],
            "8 of 8 dra/gpu.nvidia.com unusable (allocatable 0)",
        ),
        (
            "a DRA driver whose slices vanished after they were seen: plugin down",
            node(None, None),
            vec![],
            seen(&[("dra/gpu.nvidia.com", 8)]),
            0,
            Degrading { taint_at: at(120) },
            &["dra/gpu.nvidia.com"],
            "dra/gpu.nvidia.com device plugin down (8 seen, none allocatable)",
        ),
    ];
    for (name, node, dra, history, now, decision, down, described) in table {
        let verdict = node_verdict_with(&node, dra, &policy, at(now), &history);
        assert_eq!(verdict.decision, decision, "{name}");
        assert_eq!(verdict.plugin_down, down, "{name}");
        assert_eq!(verdict.describe_degraded(), described, "{name}");
        assert_eq!(verdict.is_gpu_node(), decision != NotJudged, "{name}");
    }
}

#[test]
fn after_a_restart_the_tainted_resource_is_found_by_its_taint_value() {
    // A node gpu-guard tainted for its DRA GPUs, which are still there (one tainted by the
    // driver): not plugin down, still tainted for the degradation.
    let dra_tainted = with_taint(
        node(None, None),
        degraded_taint("dra/gpu.nvidia.com", false),
        true,
    );
    let dra = vec![DeviceCount {
        resource: "dra/gpu.nvidia.com".to_owned(),
        capacity: 8,
        allocatable: 7,
    }];
    let verdict = node_verdict_with(
        &dra_tainted,
        dra,
        &policy(),
        at(10),
        &NodeHistory::default(),
    );
    assert_eq!(verdict.decision, TaintDecision::Tainted);
    assert!(verdict.plugin_down.is_empty(), "{verdict:?}");
    assert_eq!(
        verdict.history.seen,
        seen(&[("dra/gpu.nvidia.com", 8)]).seen
    );

    // Tainted while the resource was gone from the node altogether: remembered by its taint
    // value; when the plugin is back the alias is forgotten and the node recovers.
    let gone = ours(node(None, None));
    let first = node_verdict(&gone, &policy(), at(10), &NodeHistory::default());
    assert_eq!(first.plugin_down, ["nvidia.com_gpu"]);
    let back = ours(node(Some("8"), Some("8")));
    let second = node_verdict(&back, &policy(), at(20), &first.history);
    assert!(second.plugin_down.is_empty());
    assert_eq!(
        second.decision,
        TaintDecision::Recovering {
            untaint_at: at(620)
        }
    );
    assert_eq!(second.history.seen, seen(&[("nvidia.com/gpu", 8)]).seen);
}

#[test]
fn the_devices_seen_are_remembered_at_their_most() {
    let first = node_verdict(
        &node(Some("8"), Some("8")),
        &policy(),
        at(0),
        &NodeHistory::default(),
    );
    assert_eq!(first.history.seen, seen(&[("nvidia.com/gpu", 8)]).seen);
    // Fewer devices later (capacity 6): the most seen stays 8.
    let second = node_verdict(
        &node(Some("6"), Some("6")),
        &policy(),
        at(1),
        &first.history,
    );
    assert_eq!(second.history.seen, seen(&[("nvidia.com/gpu", 8)]).seen);
    // Gone: still remembered, so the next pass judges it plugin down too.
    let third = node_verdict(&node(None, None), &policy(), at(2), &second.history);
    assert_eq!(third.history.seen, seen(&[("nvidia.com/gpu", 8)]).seen);
    assert_eq!(third.plugin_down, ["nvidia.com/gpu"]);
}

#[test]
fn a_cluster_whose_gpus_only_dra_serves_is_reported_when_nothing_is_judged() {
    let policy = Policy::embedded();
    let slices = [
        slice("n1", "gpu.example.com", 1, 8, &[]),
        slice("n2", "gpu.example.com", 1, 8, &[]),
        slice("n2", "net.example.com", 1, 2, &[]),
    ];
    assert_eq!(
        unjudged_dra_hint(0, &slices, &policy).as_deref(),
        Some(
            "no node is judged (no device resource in any node's capacity), but nodes publish \
             DRA ResourceSlices: gpu.example.com (2 nodes, not in devices.drivers), \
             net.example.com (1 nodes, not in devices.drivers). DRA GPUs are judged only for \
             the drivers listed in the policy's devices.drivers: add a GPU driver there to have \
             its nodes judged"
        )
    );
    // Some node judged, or no slice: nothing to say.
    assert_eq!(unjudged_dra_hint(1, &slices, &policy), None);
    assert_eq!(unjudged_dra_hint(0, &[], &policy), None);
    // A listed driver whose slices publish no device.
    let empty = [slice("n1", "gpu.nvidia.com", 1, 0, &[])];
    assert!(
        unjudged_dra_hint(0, &empty, &policy)
            .unwrap()
            .contains("gpu.nvidia.com (1 nodes, in devices.drivers, no device)")
    );
}

#[test]
fn a_taint_removed_by_hand_starts_a_new_episode() {
    let policy = policy();
    let degraded = node(Some("8"), Some("7"));
    // Tainted at 120 s after a degradation since 0; the next judgment records the taint.
    let tainted = node_verdict(
        &ours(degraded.clone()),
        &policy,
        at(130),
        &history(Some(0), None),
    );
    assert_eq!(tainted.decision, TaintDecision::Tainted);
    assert!(tainted.history.held_taint);

    // Taint and annotation gone, not by gpu-guard: the clock starts again.
    let removed = node_verdict(&degraded, &policy, at(140), &tainted.history);
    assert_eq!(
        removed.decision,
        TaintDecision::Degrading { taint_at: at(260) }
    );
    assert_eq!(removed.history.degraded_since, Some(at(140)));
    assert!(!removed.history.held_taint);
    let later = node_verdict(&degraded, &policy, at(259), &removed.history);
    assert_eq!(
        later.decision,
        TaintDecision::Degrading { taint_at: at(260) }
    );
    assert_eq!(
        node_verdict(&degraded, &policy, at(260), &later.history).decision,
        TaintDecision::Taint
    );

    // The taint alone removed (its annotation left behind): the same.
    let mut stale = ours(degraded.clone());
    stale.spec = Some(NodeSpec::default());
    assert!(removed_by_hand(&stale, &tainted.history));
    let removed = node_verdict(&stale, &policy, at(140), &tainted.history);
    assert_eq!(removed.history.degraded_since, Some(at(140)));

    // Never tainted: nothing was removed, the episode goes on.
    let never = history(Some(0), None);
    assert!(!removed_by_hand(&degraded, &never));
    assert_eq!(
        node_verdict(&degraded, &policy, at(140), &never).decision,
        TaintDecision::Taint
    );
}

#[test]
fn vendors_of_extended_dra_and_remembered_resources() {
    for (a, b, same) in [
        ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb", true),
        ("nvidia.com/gpu", "dra/gpu.nvidia.com", true),
        ("dra/gpu.nvidia.com", "nvidia.com/mig-3g.40gb", true),
        ("nvidia.com_gpu", "nvidia.com/mig-1g.10gb", true),
        ("dra_gpu.nvidia.com", "nvidia.com/gpu", true),
        ("amd.com/gpu", "dra/gpu.amd.com", true),
        ("nvidia.com/gpu", "amd.com/gpu", false),
        // A suffix that is not a subdomain is another vendor.
        ("dra/gpu.notnvidia.com", "nvidia.com/gpu", false),
        ("dra/gpu.nvidia.com", "dra/gpu.amd.com", false),
    ] {
        assert_eq!(same_vendor(a, b), same, "{a} / {b}");
    }
}

/// A node moved from the device plugin to NVIDIA's DRA driver: the plugin stops, the driver's
/// slices appear (a resource of the same vendor, new to the node): replaced, never down.
#[test]
fn a_dra_driver_replacing_the_device_plugin_ends_plugin_down_at_once() {
    let policy = policy();
    let start = node_verdict(
        &node(Some("8"), Some("8")),
        &policy,
        at(0),
        &NodeHistory::default(),
    );
    let stopped = node_verdict(&node(Some("8"), Some("0")), &policy, at(10), &start.history);
    assert_eq!(stopped.plugin_down, ["nvidia.com/gpu"]);
    let dra = vec![DeviceCount {
        resource: "dra/gpu.nvidia.com".to_owned(),
        capacity: 8,
        allocatable: 8,
    }];
    let moved = node_verdict_with(
        &node(Some("8"), Some("0")),
        dra.clone(),
        &policy,
        at(20),
        &stopped.history,
    );
    assert_eq!(moved.decision, TaintDecision::Healthy);
    assert!(moved.plugin_down.is_empty());
    assert_eq!(moved.forgotten.len(), 1, "{:?}", moved.forgotten);
    assert_eq!(moved.forgotten[0].0, "nvidia.com/gpu");
    // Still replaced while the kubelet keeps the stopped resource, and forgotten once it is 0:
    // no second report.
    let later = node_verdict_with(
        &node(Some("8"), Some("0")),
        dra.clone(),
        &policy,
        at(200),
        &moved.history,
    );
    assert_eq!(later.decision, TaintDecision::Healthy);
    assert!(later.forgotten.is_empty());
    // A new episode (the taint removed by hand) keeps it replaced.
    let removed = NodeHistory {
        held_taint: true,
        ..later.history.clone()
    };
    let after_removal = node_verdict_with(
        &node(Some("8"), Some("0")),
        dra.clone(),
        &policy,
        at(210),
        &removed,
    );
    assert_eq!(after_removal.decision, TaintDecision::Healthy);
    assert!(after_removal.plugin_down.is_empty());
    let zero = node_verdict_with(
        &node(Some("0"), Some("0")),
        dra,
        &policy,
        at(400),
        &later.history,
    );
    assert_eq!(zero.decision, TaintDecision::Healthy);
    assert!(zero.forgotten.is_empty());
    assert!(!zero.history.seen.contains_key("nvidia.com/gpu"));

    // A stopped plugin with no newcomer stays down; so does one whose siblings were there
    // before (a mixed-strategy node whose full GPUs all failed).
    let mixed = |gpu: &str| {
        let mut node = node(Some("2"), Some(gpu));
        let status = node.status.as_mut().unwrap();
        for quantities in [&mut status.capacity, &mut status.allocatable] {
            quantities.as_mut().unwrap().insert(
                "nvidia.com/mig-1g.10gb".to_owned(),
                Quantity("42".to_owned()),
            );
        }
        node
    };
    let before = node_verdict(&mixed("2"), &policy, at(0), &NodeHistory::default());
    let failed = node_verdict(&mixed("0"), &policy, at(10), &before.history);
    assert_eq!(failed.plugin_down, ["nvidia.com/gpu"]);
    assert!(failed.forgotten.is_empty());
}

/// A slice of partitionable devices in pool `pool` of node n1: each `(name, counter sets,
/// tainted)`.
fn partitioned(pool: &str, devices: &[(&str, &[&str], bool)]) -> ResourceSlice {
    let devices: Vec<serde_json::Value> = devices
        .iter()
        .map(|(name, sets, tainted)| {
            let mut device = json!({"name": name, "consumesCounters": sets
                .iter()
                .map(|set| json!({"counterSet": set, "counters": {"memory": {"value": "10Gi"}}}))
                .collect::<Vec<_>>()});
            if *tainted {
                device["taints"] = json!([{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]);
            }
            device
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("n1-{pool}")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
                 "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .unwrap()
}

#[test]
fn dra_partitions_count_as_their_physical_gpu() {
    let policy = Policy::embedded();
    let gpus = |slices: &[ResourceSlice]| {
        let counts = dra_device_counts("n1", slices, &policy);
        assert_eq!(counts.len(), 1, "{counts:?}");
        (counts[0].capacity, counts[0].allocatable)
    };
    let two = ["gpu-0-counter-set"];
    let one = ["gpu-1-counter-set"];
    // Whole GPUs and partitions on one counter set each: 2 GPUs; one MIG device tainted makes
    // its GPU unusable.
    let slice = partitioned(
        "n1",
        &[
            ("gpu-0", &two, false),
            ("gpu-0-mig-1g10gb-19-0", &two, true),
            ("gpu-0-mig-1g10gb-19-1", &two, false),
            ("gpu-1", &one, false),
            ("gpu-1-mig-3g40gb-9-0", &one, false),
        ],
    );
    assert_eq!(gpus(std::slice::from_ref(&slice)), (2, 1));
    // Devices that consume no counter set (GPUs without MIG) count one each.
    let plain = partitioned("n1", &[("gpu-0", &[], false), ("gpu-1", &[], true)]);
    assert_eq!(gpus(&[plain]), (2, 1));
    // A counter set name is the pool's own: the same name in two pools is two GPUs.
    let other_pool = partitioned("n1-b", &[("gpu-0", &two, false)]);
    assert_eq!(gpus(&[slice.clone(), other_pool]), (3, 2));
    // A device consuming two counter sets ties them into one.
    let bridged = partitioned(
        "n1",
        &[
            ("a", &["s1"], false),
            ("b", &["s2"], true),
            ("ab", &["s1", "s2"], false),
            ("c", &["s3"], false),
        ],
    );
    assert_eq!(gpus(&[bridged]), (2, 1));
}
