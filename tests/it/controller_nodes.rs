//! The node half of the controller against the fake API server (`tests/support`): when a
//! degraded GPU node is tainted and untainted, the exact patches and Events, conflicts, taints
//! that are not gpu-guard's, the safety valve, stale owner annotations, and dry run.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use gpu_guard_controller::metrics::ControllerMetrics;
use gpu_guard_controller::reconcile::{PassReport, Reconciler};
use gpu_guard_core::wellknown::{
    DEGRADED_OWNER_ANNOTATION, DEGRADED_TAINT_KEY, IGNORE_VANISHED_ANNOTATION,
};
use hyper::Method;
use serde_json::{Value, json};
use support::controller::{
    TAINT_TIME, World, at, gpu_node, has_our_taint, pod_world, policy, push_taint,
};
use support::fake_api::{Logged, NODES, PODS, RESOURCE_SLICES};

#[tokio::test]
async fn a_degraded_node_is_tainted_after_its_time_and_untainted_after_recovery() {
    let mut world = World::start(
        policy(|_| {}),
        vec![
            (NODES, gpu_node("gpu-1", 8, 7)),
            (NODES, gpu_node("gpu-2", 8, 8)),
            (
                NODES,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1"},
                       "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}}),
            ),
        ],
    )
    .await;

    // Degraded, not for long enough yet: nothing sent.
    let report = world.pass(0).await;
    assert_eq!(report, PassReport::default());
    let report = world.pass(119).await;
    assert_eq!(report, PassReport::default());
    assert!(world.fake.writes().is_empty(), "{:?}", world.fake.writes());
    assert_eq!(world.metrics.degraded_nodes.get(), 1);
    assert_eq!(world.metrics.gpu_nodes.get(), 2);

    // 120 s: the taint, with the node's other taint kept and its resourceVersion as a
    // precondition.
    let version = world.fake.object(NODES, "gpu-1")["metadata"]["resourceVersion"].clone();
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    let writes = world.fake.writes();
    // Then gpu-guard's Node condition (tests/it/controller_conditions.rs).
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[1].path, "/api/v1/nodes/gpu-1/status");
    assert_eq!(writes[0].method, Method::PATCH);
    assert_eq!(writes[0].path, "/api/v1/nodes/gpu-1");
    assert_eq!(
        writes[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        writes[0].body,
        json!({
            "metadata": {"resourceVersion": version,
                         "annotations": {DEGRADED_OWNER_ANNOTATION: format!("{TAINT_TIME};nvidia.com_gpu:NoSchedule")}},
            "spec": {"taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": DEGRADED_TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"},
            ]},
        })
    );
    let events = world.fake.events();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1].0, "DeviceDegradedConditionSet");
    assert_eq!(events[0].0, "DeviceDegraded");
    assert_eq!(events[0].1, "gpu-1");
    assert_eq!(
        events[0].2,
        "tainted gpu-guard.io/device-degraded=nvidia.com_gpu:NoSchedule: 1 of 8 nvidia.com/gpu \
         unusable (allocatable 7) since 2027-01-15T08:00:00Z (threshold held 120 s)"
    );
    let event = world
        .fake
        .requests()
        .into_iter()
        .find(Logged::is_event)
        .expect("an event");
    assert_eq!(
        event.path,
        "/apis/events.k8s.io/v1/namespaces/default/events"
    );
    assert_eq!(event.body["regarding"]["kind"], "Node");
    assert_eq!(event.body["type"], "Warning");
    assert_eq!(event.body["reportingController"], "gpu-guard.io/controller");
    assert_eq!(event.body["reportingInstance"], "test-1");
    assert_eq!(world.metrics.taints_added.get(), 1);
    assert_eq!(world.metrics.tainted_nodes.get(), 1);

    // Tainted and still degraded: nothing more.
    world.node_cached("gpu-1", has_our_taint).await;
    world.fake.clear_requests();
    world.pass(300).await;
    assert!(world.fake.writes().is_empty());

    // The device comes back: the taint stays for healthyForSeconds.
    world.heal("gpu-1").await;
    world.pass(400).await;
    world.pass(999).await;
    assert!(world.fake.writes().is_empty());

    let version = world.fake.object(NODES, "gpu-1")["metadata"]["resourceVersion"].clone();
    let report = world.pass(1000).await;
    assert_eq!(report.untainted, ["gpu-1"]);
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[1].path, "/api/v1/nodes/gpu-1/status");
    assert_eq!(
        writes[0].body,
        json!({
            "metadata": {"resourceVersion": version, "annotations": {DEGRADED_OWNER_ANNOTATION: null}},
            "spec": {"taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            ]},
        })
    );
    let node = world.fake.object(NODES, "gpu-1");
    assert!(!has_our_taint(&node));
    assert_eq!(node["metadata"].get("annotations"), Some(&json!({})));
    let reasons: Vec<String> = world.fake.events().into_iter().map(|e| e.0).collect();
    assert_eq!(
        reasons,
        ["DeviceRecovered", "DeviceDegradedConditionRemoved"]
    );
    assert_eq!(world.metrics.taints_removed.get(), 1);
    world
        .node_cached("gpu-1", |node| !has_our_taint(node))
        .await;
    world.pass(1001).await;
    assert_eq!(world.metrics.tainted_nodes.get(), 0);
    assert_eq!(world.metrics.degraded_nodes.get(), 0);
}

#[tokio::test]
async fn no_execute_when_configured() {
    let mut world = World::start(
        policy(|p| p.controller.node_health.no_execute = true),
        vec![(NODES, gpu_node("gpu-1", 4, 1))],
    )
    .await;
    world.pass(0).await;
    world.pass(120).await;
    let writes = world.fake.writes();
    assert_eq!(
        writes[0].body["spec"]["taints"][1],
        json!({"key": DEGRADED_TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoExecute"})
    );
}

#[tokio::test]
async fn no_execute_falls_back_to_no_schedule_while_the_device_plugin_is_down() {
    // Allocatable 0 of 4: the kubelet has marked every device of a stopped plugin unhealthy.
    // NoExecute would evict the device plugin's pod, and nothing would bring it back.
    let mut world = World::start(
        policy(|p| p.controller.node_health.no_execute = true),
        vec![(NODES, gpu_node("gpu-1", 4, 0))],
    )
    .await;
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    let writes = world.fake.writes();
    assert_eq!(
        writes[0].body["spec"]["taints"][1],
        json!({"key": DEGRADED_TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"})
    );
    let events = world.fake.events();
    assert_eq!(
        events[0].2,
        "tainted gpu-guard.io/device-degraded=nvidia.com_gpu:NoSchedule: nvidia.com/gpu device \
         plugin down (4 seen, none allocatable) since 2027-01-15T08:00:00Z (threshold held 120 s); \
         NoSchedule, not NoExecute: the device plugin is down, and NoExecute would evict the \
         DaemonSet pods that bring it back"
    );

    // Later the kubelet drops the capacity to 0 too: still degraded, never untainted.
    world.node_cached("gpu-1", has_our_taint).await;
    let mut gone = world.fake.object(NODES, "gpu-1");
    gone["status"]["capacity"]["nvidia.com/gpu"] = json!("0");
    world.fake.put(NODES, gone);
    world
        .node_cached("gpu-1", |node| {
            node["status"]["capacity"]["nvidia.com/gpu"] == "0"
        })
        .await;
    world.fake.clear_requests();
    let report = world.pass(5000).await;
    assert_eq!(report, PassReport::default());
    assert!(world.fake.writes().is_empty(), "{:?}", world.fake.writes());
    assert_eq!(world.metrics.degraded_nodes.get(), 1);
    assert_eq!(world.metrics.tainted_nodes.get(), 1);
}

#[tokio::test]
async fn a_taint_gpu_guard_did_not_add_is_never_removed() {
    let mut foreign = gpu_node("gpu-1", 8, 8);
    foreign["spec"]["taints"]
        .as_array_mut()
        .expect("taints")
        .push(json!({"key": DEGRADED_TAINT_KEY, "value": "manual", "effect": "NoSchedule"}));
    let mut world = World::start(policy(|_| {}), vec![(NODES, foreign)]).await;
    for seconds in [0, 1000, 100_000] {
        world.pass(seconds).await;
    }
    assert!(world.fake.writes().is_empty(), "{:?}", world.fake.writes());
    assert_eq!(world.metrics.tainted_nodes.get(), 0);
}

#[tokio::test]
async fn a_conflict_rereads_the_node_and_keeps_the_taint_added_meanwhile() {
    let mut world = World::start(policy(|_| {}), vec![(NODES, gpu_node("gpu-1", 8, 6))]).await;
    world.fake.conflict_once(|node| {
        push_taint(node, json!({"key": "maintenance", "effect": "NoSchedule"}));
    });
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert!(report.errors.is_empty(), "{report:?}");
    let requests: Vec<(Method, String)> = world
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/api/v1/nodes/"))
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(
        requests,
        [
            (Method::PATCH, "/api/v1/nodes/gpu-1".to_owned()),
            (Method::GET, "/api/v1/nodes/gpu-1".to_owned()),
            (Method::PATCH, "/api/v1/nodes/gpu-1".to_owned()),
            (Method::PATCH, "/api/v1/nodes/gpu-1/status".to_owned()),
        ]
    );
    let node = world.fake.object(NODES, "gpu-1");
    assert_eq!(
        node["spec"]["taints"],
        json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "maintenance", "effect": "NoSchedule"},
            {"key": DEGRADED_TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"},
        ])
    );
}

#[tokio::test]
async fn a_node_someone_else_tainted_meanwhile_is_not_tainted_again() {
    let mut world = World::start(policy(|_| {}), vec![(NODES, gpu_node("gpu-1", 8, 6))]).await;
    world.fake.conflict_once(|node| {
        push_taint(
            node,
            json!({"key": DEGRADED_TAINT_KEY, "value": "by-hand", "effect": "NoSchedule"}),
        );
    });
    world.pass(0).await;
    let report = world.pass(120).await;
    assert!(report.tainted.is_empty(), "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    // One refused patch, one read, and no second patch.
    let node_writes = world
        .fake
        .writes()
        .iter()
        .filter(|w| w.path == "/api/v1/nodes/gpu-1")
        .count();
    assert_eq!(node_writes, 1);
    assert!(world.fake.events().is_empty());
    assert_eq!(world.metrics.taints_added.get(), 0);
}

#[tokio::test]
async fn the_safety_valve_stops_tainting_and_reports_once() {
    // 12 GPU nodes, 10 %: one node may be tainted; three are degraded.
    let mut objects: Vec<(&'static str, Value)> = (1..=9)
        .map(|i| (NODES, gpu_node(&format!("gpu-{i:02}"), 8, 8)))
        .collect();
    for i in 10..=12 {
        objects.push((NODES, gpu_node(&format!("gpu-{i:02}"), 8, 5)));
    }
    let mut world = World::start(policy(|_| {}), objects).await;
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-10"]);
    assert_eq!(report.valve_held, ["gpu-11", "gpu-12"]);
    // The taint and gpu-guard's Node condition.
    assert_eq!(world.fake.writes().len(), 2);
    let events = world.fake.events();
    let reasons: Vec<(&str, &str)> = events
        .iter()
        .map(|(reason, node, _)| (reason.as_str(), node.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("DeviceDegraded", "gpu-10"),
            ("DeviceDegradedConditionSet", "gpu-10"),
            ("SafetyValve", "gpu-11"),
            ("SafetyValve", "gpu-12")
        ]
    );
    assert!(
        events[2]
            .2
            .contains("1 of 12 GPU nodes are tainted already"),
        "{}",
        events[2].2
    );
    assert_eq!(world.metrics.safety_valve_trips.get(), 2);

    // Still held on the next pass, but reported once per episode.
    world.node_cached("gpu-10", has_our_taint).await;
    world.fake.clear_requests();
    let report = world.pass(200).await;
    assert_eq!(report.valve_held, ["gpu-11", "gpu-12"]);
    assert!(world.fake.requests().iter().all(|r| !r.is_write()));
    assert_eq!(world.metrics.safety_valve_trips.get(), 2);
}

#[tokio::test]
async fn a_stale_owner_annotation_is_cleared_and_only_gpu_guards_exact_taint_is_removed() {
    let recorded = format!("{TAINT_TIME};nvidia.com_gpu:NoSchedule");
    // gpu-1: someone removed gpu-guard's taint by hand; the annotation stayed.
    let mut stale = gpu_node("gpu-1", 8, 8);
    stale["metadata"]["annotations"] = json!({DEGRADED_OWNER_ANNOTATION: recorded});
    // gpu-2: gpu-guard's taint next to someone's NoExecute taint with the same key.
    let mut both = gpu_node("gpu-2", 8, 8);
    both["metadata"]["annotations"] = json!({DEGRADED_OWNER_ANNOTATION: recorded});
    let taints = both["spec"]["taints"].as_array_mut().expect("taints");
    taints.push(
        json!({"key": DEGRADED_TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"}),
    );
    taints.push(json!({"key": DEGRADED_TAINT_KEY, "value": "by-hand", "effect": "NoExecute"}));
    let mut world = World::start(policy(|_| {}), vec![(NODES, stale), (NODES, both)]).await;

    let version = world.fake.object(NODES, "gpu-1")["metadata"]["resourceVersion"].clone();
    world.pass(0).await;
    let writes = world.fake.writes();
    // And gpu-2, which holds gpu-guard's taint, gets its Node condition.
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0].path, "/api/v1/nodes/gpu-1");
    assert_eq!(writes[1].path, "/api/v1/nodes/gpu-2/status");
    assert_eq!(
        writes[0].body,
        json!({"metadata": {"resourceVersion": version, "annotations": {DEGRADED_OWNER_ANNOTATION: null}}})
    );
    assert_eq!(
        world.fake.object(NODES, "gpu-1")["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    );
    assert_eq!(world.metrics.tainted_nodes.get(), 1);

    // A taint with the key added by hand later is someone else's: never removed.
    world
        .node_cached("gpu-1", |node| {
            node["metadata"]["annotations"][DEGRADED_OWNER_ANNOTATION].is_null()
        })
        .await;
    let mut manual = world.fake.object(NODES, "gpu-1");
    manual["spec"]["taints"]
        .as_array_mut()
        .expect("taints")
        .push(
            json!({"key": DEGRADED_TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"}),
        );
    world.fake.put(NODES, manual);
    world.node_cached("gpu-1", has_our_taint).await;
    world.fake.clear_requests();

    // gpu-2 recovers: only gpu-guard's taint is removed, the NoExecute one stays.
    world.pass(100).await;
    let report = world.pass(700).await;
    assert_eq!(report.untainted, ["gpu-2"]);
    let writes = world.fake.writes();
    // The taint, then gpu-guard's Node condition.
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0].path, "/api/v1/nodes/gpu-2");
    assert_eq!(writes[1].path, "/api/v1/nodes/gpu-2/status");
    assert_eq!(
        writes[0].body["spec"]["taints"],
        json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": DEGRADED_TAINT_KEY, "value": "by-hand", "effect": "NoExecute"},
        ])
    );
    assert!(has_our_taint(&world.fake.object(NODES, "gpu-1")));
}

#[tokio::test]
async fn dry_run_changes_nothing_but_events_logs_and_metrics_say_what_it_would_do() {
    let mut world = World::start(
        policy(|p| {
            p.controller.dry_run = true;
            p.controller.pods.evict_pods = true;
        }),
        pod_world(),
    )
    .await;
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    // The pod on the node that would be tainted counts as hit, as it would without dry run.
    assert_eq!(report.marked, ["ml/on-degraded"]);
    assert_eq!(report.evicted, ["ml/on-degraded"]);

    // Every PATCH and eviction was sent with dryRun=All (RBAC, admission, PDBs exercised),
    // and nothing was stored.
    let writes = world.fake.writes();
    let sent: Vec<(Method, &str)> = writes
        .iter()
        .map(|w| (w.method.clone(), w.path.as_str()))
        .collect();
    assert_eq!(
        sent,
        [
            (Method::PATCH, "/api/v1/namespaces/ml/pods/sick/status"),
            (Method::POST, "/api/v1/namespaces/ml/pods/sick/eviction"),
            (Method::PATCH, "/api/v1/nodes/gpu-1"),
            (Method::PATCH, "/api/v1/nodes/gpu-1/status"),
            (
                Method::PATCH,
                "/api/v1/namespaces/ml/pods/on-degraded/status"
            ),
            (
                Method::POST,
                "/api/v1/namespaces/ml/pods/on-degraded/eviction"
            ),
        ]
    );
    for write in &writes {
        assert_eq!(write.param("dryRun"), Some("All"), "{write:?}");
    }
    let eviction = writes.iter().find(|w| w.method == Method::POST).unwrap();
    assert_eq!(eviction.body["kind"], "Eviction");
    assert!(!has_our_taint(&world.fake.object(NODES, "gpu-1")));
    assert_eq!(
        world.fake.object(PODS, "ml/sick")["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}]),
        "a dry-run status patch is not stored"
    );
    let events = world.fake.events();
    let reasons: Vec<(&str, &str)> = events
        .iter()
        .map(|(reason, name, _)| (reason.as_str(), name.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("DeviceFailureMarked", "sick"),
            ("Evicted", "sick"),
            ("DeviceDegraded", "gpu-1"),
            ("DeviceDegradedConditionSet", "gpu-1"),
            ("DeviceFailureMarked", "on-degraded"),
            ("Evicted", "on-degraded"),
        ]
    );
    assert!(
        events
            .iter()
            .all(|(_, _, note)| note.starts_with("dry run: would")),
        "{events:?}"
    );
    assert_eq!(world.metrics.dry_run.get(), 1);
    assert_eq!(world.metrics.taints_added.get(), 1);
    assert_eq!(world.metrics.tainted_nodes.get(), 1);
    assert_eq!(world.metrics.pods_marked.get(), 2);
    assert_eq!(world.metrics.pods_evicted.get(), 2);

    // Later passes do not repeat themselves; recovery is simulated too (the taint was only
    // assumed: there is nothing to send for its removal).
    world.fake.clear_requests();
    let report = world.pass(200).await;
    assert_eq!(report, PassReport::default());
    world.heal("gpu-1").await;
    world.pass(300).await;
    let report = world.pass(900).await;
    assert_eq!(report.untainted, ["gpu-1"]);
    assert!(world.fake.writes().is_empty(), "{:?}", world.fake.writes());
    let reasons: Vec<String> = world.fake.events().into_iter().map(|e| e.0).collect();
    assert_eq!(
        reasons[reasons.len() - 2..],
        ["DeviceRecovered", "DeviceDegradedConditionRemoved"]
    );
}

/// A node whose GPUs only a DRA driver serves: no device resource in its status.
fn dra_only_node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
           "status": {"capacity": {"cpu": "96"}, "allocatable": {"cpu": "95"}}})
}

/// A node whose GPUs come from a DRA driver (NVIDIA's `gpu.nvidia.com`: no extended resource in
/// its status): one of the 8 devices its ResourceSlice publishes is tainted by the driver, so
/// it is judged degraded like a device-plugin node with 7 of 8 allocatable, and tainted.
#[tokio::test]
async fn a_node_whose_dra_driver_taints_a_gpu_is_tainted() {
    let devices: Vec<Value> = (0..8)
        .map(|index| {
            let mut device = json!({"name": format!("gpu-{index}")});
            if index == 3 {
                device["taints"] = json!([{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79",
                                           "effect": "NoExecute"}]);
            }
            device
        })
        .collect();
    let mut world = World::start(
        policy(|_| {}),
        vec![
            (NODES, dra_only_node("dra-1")),
            (
                RESOURCE_SLICES,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                       "metadata": {"name": "dra-1-gpu.nvidia.com-x7k2p"},
                       "spec": {"driver": "gpu.nvidia.com", "nodeName": "dra-1",
                                "pool": {"name": "dra-1", "generation": 1,
                                         "resourceSliceCount": 1},
                                "devices": devices}}),
            ),
        ],
    )
    .await;
    let report = world.pass(0).await;
    assert_eq!(report, PassReport::default());
    assert_eq!(world.metrics.gpu_nodes.get(), 1);
    assert_eq!(world.metrics.degraded_nodes.get(), 1);
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["dra-1"]);
    let writes = world.fake.writes();
    // The taint, then gpu-guard's Node condition.
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(
        writes[0].body["spec"]["taints"][0],
        json!({"key": DEGRADED_TAINT_KEY, "value": "dra_gpu.nvidia.com", "effect": "NoSchedule"})
    );
}

/// 20 GPU nodes, `maxTaintedPercent: 10` (at most 2 tainted), and the nodes `degraded`
/// (numbers) with 5 of 8 GPUs allocatable.
fn fleet(degraded: &[u32]) -> Vec<(&'static str, Value)> {
    (1..=20)
        .map(|i| {
            let allocatable = if degraded.contains(&i) { 5 } else { 8 };
            (NODES, gpu_node(&format!("gpu-{i:02}"), 8, allocatable))
        })
        .collect()
}

fn tainted_in_fake(world: &World) -> Vec<String> {
    (1..=20)
        .map(|i| format!("gpu-{i:02}"))
        .filter(|name| has_our_taint(&world.fake.object(NODES, name)))
        .collect()
}

/// The watch lags the controller's own writes (events arrive a second late): the pass after a
/// wave of taints must count them although the cache does not show them yet.
#[tokio::test]
async fn the_safety_valve_holds_while_the_watch_lags_the_controllers_own_taints() {
    let mut world = World::start(policy(|_| {}), fleet(&[16, 17, 18, 19, 20])).await;
    world.pass(0).await;
    world.fake.lock().watch_delay = Some(Duration::from_millis(1500));
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-16", "gpu-17"]);
    assert_eq!(report.valve_held, ["gpu-18", "gpu-19", "gpu-20"]);
    // At once, and again a little later: the cache still shows none of the two taints.
    for seconds in [121, 122] {
        assert!(
            !world.caches.nodes.state().iter().any(|node| node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|taints| taints.iter().any(|t| t.key == DEGRADED_TAINT_KEY))),
            "the watch was meant to lag"
        );
        let report = world.pass(seconds).await;
        assert!(report.tainted.is_empty(), "{report:?}");
        assert_eq!(report.valve_held, ["gpu-18", "gpu-19", "gpu-20"]);
        assert!(report.errors.is_empty(), "{report:?}");
        assert_eq!(world.metrics.tainted_nodes.get(), 2);
    }
    assert_eq!(tainted_in_fake(&world), ["gpu-16", "gpu-17"]);
    // One patch per tainted node (and one of its Node condition): nothing was sent on a
    // stale resourceVersion.
    assert_eq!(world.fake.writes().len(), 4, "{:?}", world.fake.writes());
    let conditions = world
        .fake
        .writes()
        .iter()
        .filter(|w| w.path.ends_with("/status"))
        .count();
    assert_eq!(conditions, 2);
    world.node_cached("gpu-17", has_our_taint).await;
    let report = world.pass(200).await;
    assert!(report.tainted.is_empty(), "{report:?}");
    assert_eq!(tainted_in_fake(&world), ["gpu-16", "gpu-17"]);
    assert_eq!(world.metrics.tainted_nodes.get(), 2);
}

/// A change of leader in a wave: replica A taints 2 nodes, then replica B takes over while its
/// cache shows none of them yet, and would taint three nodes of its own before meeting A's.
#[tokio::test]
async fn a_new_leader_counts_the_taints_of_the_previous_one_its_cache_has_not_seen() {
    let mut world = World::start(policy(|_| {}), fleet(&[19, 20])).await;
    let mut b = Reconciler::new(
        world.fake.config(),
        policy(|_| {}),
        Some("test-2".to_owned()),
        Arc::new(ControllerMetrics::default()),
    )
    .expect("reconciler");
    world.pass(0).await;
    b.observe(&world.caches, at(0));
    // gpu-16..18 degrade 10 s later; both replicas watch.
    let degrade: Vec<Value> = (16..=18)
        .map(|i| {
            let mut node = world.fake.object(NODES, &format!("gpu-{i}"));
            node["status"]["allocatable"]["nvidia.com/gpu"] = json!("5");
            node
        })
        .collect();
    for node in degrade {
        world.fake.put(NODES, node);
    }
    world
        .node_cached("gpu-18", |node| {
            node["status"]["allocatable"]["nvidia.com/gpu"] == "5"
        })
        .await;
    world.pass(10).await;
    b.observe(&world.caches, at(10));

    world.fake.lock().watch_delay = Some(Duration::from_millis(1500));
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-19", "gpu-20"]);

    // B leads now (A is gone), its cache a second behind A's writes.
    b.new_term(at(130));
    let report = b.pass(&world.caches, at(130)).await;
    assert!(report.tainted.is_empty(), "{report:?}");
    assert_eq!(report.valve_held, ["gpu-16", "gpu-17", "gpu-18"]);
    assert_eq!(tainted_in_fake(&world), ["gpu-19", "gpu-20"]);
}

/// A conflict whose re-read shows gpu-guard's own taint (another replica's): the node counts
/// as tainted for the safety valve.
#[tokio::test]
async fn a_reread_that_finds_gpu_guards_taint_counts_for_the_safety_valve() {
    let mut world = World::start(policy(|_| {}), fleet(&[18, 19, 20])).await;
    world.pass(0).await;
    world.fake.conflict_once(|node| {
        push_taint(
            node,
            json!({"key": DEGRADED_TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"}),
        );
        node["metadata"]["annotations"] = json!({
            DEGRADED_OWNER_ANNOTATION: format!("{TAINT_TIME};nvidia.com_gpu:NoSchedule")
        });
    });
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-19"]);
    assert_eq!(report.valve_held, ["gpu-20"]);
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(tainted_in_fake(&world), ["gpu-18", "gpu-19"]);
    assert_eq!(world.metrics.tainted_nodes.get(), 2);
}

/// Someone removes gpu-guard's taint by hand (on gpu-1 the taint alone, as `kubectl taint
/// node gpu-1 gpu-guard.io/device-degraded-` does; on gpu-2 the annotation too): a new episode.
/// Still degraded, each node is tainted again only after `degradedForSeconds` of it.
#[tokio::test]
async fn a_taint_removed_by_hand_starts_a_new_episode() {
    let mut world = World::start(
        policy(|p| p.controller.node_health.max_tainted_percent = 100),
        vec![
            (NODES, gpu_node("gpu-1", 8, 7)),
            (NODES, gpu_node("gpu-2", 8, 7)),
        ],
    )
    .await;
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1", "gpu-2"]);
    world.node_cached("gpu-1", has_our_taint).await;
    world.node_cached("gpu-2", has_our_taint).await;
    world.pass(130).await;

    for (name, annotation_too) in [("gpu-1", false), ("gpu-2", true)] {
        let mut node = world.fake.object(NODES, name);
        node["spec"]["taints"]
            .as_array_mut()
            .expect("taints")
            .retain(|taint| taint["key"] != DEGRADED_TAINT_KEY);
        if annotation_too {
            node["metadata"]["annotations"] = json!({});
        }
        world.fake.put(NODES, node);
        world.node_cached(name, |node| !has_our_taint(node)).await;
    }
    world.fake.clear_requests();
    let report = world.pass(140).await;
    assert!(report.tainted.is_empty(), "{report:?}");
    // Only gpu-1's annotation, left behind, is removed, and both nodes' Node conditions.
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 3, "{writes:?}");
    assert_eq!(writes[0].path, "/api/v1/nodes/gpu-1");
    assert!(writes[0].body.get("spec").is_none(), "{writes:?}");
    assert_eq!(writes[1].path, "/api/v1/nodes/gpu-1/status");
    assert_eq!(writes[2].path, "/api/v1/nodes/gpu-2/status");
    assert_eq!(world.metrics.tainted_nodes.get(), 0);
    assert_eq!(world.metrics.degraded_nodes.get(), 2);

    for seconds in [141, 200, 259] {
        let report = world.pass(seconds).await;
        assert!(report.tainted.is_empty(), "at {seconds} s: {report:?}");
    }
    assert_eq!(world.fake.writes().len(), 3);
    // degradedForSeconds into the new episode (its clock started at 140 s, the pass that saw
    // the taint gone), both nodes still degraded: tainted again, and not at 259 s above.
    let report = world.pass(260).await;
    assert_eq!(report.tainted, ["gpu-1", "gpu-2"]);
}

/// Sets the node's device resources to `resources` (name, capacity, allocatable) as the kubelet
/// reports them, and waits until the cache shows it.
async fn report_devices(world: &World, name: &str, resources: &[(&str, &str, &str)]) {
    let mut node = world.fake.object(NODES, name);
    for (resource, capacity, allocatable) in resources {
        node["status"]["capacity"][resource] = json!(capacity);
        node["status"]["allocatable"][resource] = json!(allocatable);
    }
    world.fake.put(NODES, node);
    let expected: Vec<(String, String, String)> = resources
        .iter()
        .map(|(r, c, a)| ((*r).to_owned(), (*c).to_owned(), (*a).to_owned()))
        .collect();
    world
        .node_cached(name, move |node| {
            expected.iter().all(|(resource, capacity, allocatable)| {
                node["status"]["capacity"][resource] == *capacity
                    && node["status"]["allocatable"][resource] == *allocatable
            })
        })
        .await;
}

/// A MIG reconfiguration under the mixed strategy: the device plugin stops (the kubelet marks
/// its 8 `nvidia.com/gpu` unhealthy, allocatable 0), comes back serving
/// `nvidia.com/mig-1g.10gb` only, and 5 minutes later the kubelet drops `nvidia.com/gpu` to
/// capacity 0, where it stays. The node is never tainted, and the safety valve (1 node of 10)
/// is left for a real failure elsewhere.
#[tokio::test]
async fn a_resource_a_mig_reconfiguration_removes_never_taints_its_node() {
    let objects: Vec<(&'static str, Value)> = (1..=10)
        .map(|i| (NODES, gpu_node(&format!("gpu-{i:02}"), 8, 8)))
        .collect();
    let mut world = World::start(policy(|_| {}), objects).await;
    world.pass(0).await;

    report_devices(&world, "gpu-01", &[("nvidia.com/gpu", "8", "0")]).await;
    let report = world.pass(10).await;
    assert_eq!(report, PassReport::default());
    assert_eq!(world.metrics.degraded_nodes.get(), 1, "plugin down");

    report_devices(
        &world,
        "gpu-01",
        &[
            ("nvidia.com/gpu", "8", "0"),
            ("nvidia.com/mig-1g.10gb", "56", "56"),
        ],
    )
    .await;
    world.pass(40).await;
    assert_eq!(world.metrics.degraded_nodes.get(), 0);
    assert_eq!(world.metrics.vanished_forgotten.get(), 1);
    for seconds in [130, 200, 310] {
        let report = world.pass(seconds).await;
        assert!(report.tainted.is_empty(), "at {seconds} s: {report:?}");
    }
    report_devices(
        &world,
        "gpu-01",
        &[
            ("nvidia.com/gpu", "0", "0"),
            ("nvidia.com/mig-1g.10gb", "56", "56"),
        ],
    )
    .await;
    for seconds in [320, 1000, 10_000] {
        let report = world.pass(seconds).await;
        assert!(report.tainted.is_empty(), "at {seconds} s: {report:?}");
    }
    assert!(world.fake.writes().is_empty(), "{:?}", world.fake.writes());
    assert_eq!(world.metrics.degraded_nodes.get(), 0);

    // A real failure elsewhere is tainted: the valve was not spent on gpu-01.
    report_devices(&world, "gpu-02", &[("nvidia.com/gpu", "8", "7")]).await;
    world.pass(10_010).await;
    let report = world.pass(10_130).await;
    assert_eq!(report.tainted, ["gpu-02"]);
    assert!(report.valve_held.is_empty(), "{report:?}");
}

/// The device plugin is uninstalled for good: the node is tainted as "plugin down", and the
/// kubelet keeps the resource at capacity 0 for ever. An hour after it went to 0 it is
/// forgotten and the node recovers. A node annotated
/// `gpu-guard.io/ignore-vanished-resources: "true"` is never tainted for it.
#[tokio::test]
async fn a_resource_gone_for_good_is_forgotten_after_an_hour_or_at_once_when_opted_out() {
    let mut opted_out = gpu_node("gpu-2", 8, 8);
    opted_out["metadata"]["annotations"] = json!({IGNORE_VANISHED_ANNOTATION: "true"});
    let mut world = World::start(
        policy(|p| p.controller.node_health.max_tainted_percent = 100),
        vec![(NODES, gpu_node("gpu-1", 8, 8)), (NODES, opted_out)],
    )
    .await;
    world.pass(0).await;
    for name in ["gpu-1", "gpu-2"] {
        report_devices(&world, name, &[("nvidia.com/gpu", "8", "0")]).await;
    }
    world.pass(10).await;
    let report = world.pass(130).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    for name in ["gpu-1", "gpu-2"] {
        report_devices(&world, name, &[("nvidia.com/gpu", "0", "0")]).await;
    }
    world.node_cached("gpu-1", has_our_taint).await;
    let report = world.pass(310).await;
    assert!(report.untainted.is_empty(), "{report:?}");
    let report = world.pass(310 + 3599).await;
    assert!(report.untainted.is_empty(), "{report:?}");
    assert_eq!(world.metrics.degraded_nodes.get(), 1);
    // Gone for an hour: forgotten; healthy from then on, untainted healthyForSeconds later.
    world.pass(310 + 3600).await;
    assert_eq!(world.metrics.degraded_nodes.get(), 0);
    let report = world.pass(310 + 3600 + 600).await;
    assert_eq!(report.untainted, ["gpu-1"]);
    assert!(!has_our_taint(&world.fake.object(NODES, "gpu-2")));
    // gpu-2's stopped plugin, then gpu-1's resource after the hour.
    assert_eq!(world.metrics.vanished_forgotten.get(), 2);
}

/// Partitionable devices (KEP 4815), as NVIDIA's DRA driver publishes them: each GPU and each
/// of its MIG devices is a device, all consuming the GPU's counter set `gpu-<minor>-counter-set`
/// (defined in a slice of its own: a slice holds devices or counter sets). GPU 0 (with 2 MIG
/// devices) has an Xid: the driver taints it and its partitions. GPU 1 (7 MIG devices) is
/// fine. That is 1 of 2 GPUs, 50 %, not 3 of 10 devices.
#[tokio::test]
async fn dra_partitions_count_as_the_gpu_they_are_carved_from() {
    let taint =
        json!([{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]);
    let consumes = |gpu: u32| {
        json!([{"counterSet": format!("gpu-{gpu}-counter-set"),
                                       "counters": {"multiprocessors": {"value": "14"}}}])
    };
    let mut devices = Vec::new();
    for (gpu, partitions) in [(0u32, 2u32), (1, 7)] {
        let mut whole = json!({"name": format!("gpu-{gpu}"), "consumesCounters": consumes(gpu)});
        if gpu == 0 {
            whole["taints"] = taint.clone();
        }
        devices.push(whole);
        for index in 0..partitions {
            let mut partition = json!({"name": format!("gpu-{gpu}-mig-1g10gb-19-{index}"),
                                       "consumesCounters": consumes(gpu)});
            if gpu == 0 {
                partition["taints"] = taint.clone();
            }
            devices.push(partition);
        }
    }
    let pool = json!({"name": "dra-1", "generation": 1, "resourceSliceCount": 2});
    let mut world = World::start(
        policy(|p| {
            p.controller.node_health.unusable_devices.count = None;
            p.controller.node_health.unusable_devices.percent = Some(50);
        }),
        vec![
            (NODES, dra_only_node("dra-1")),
            (
                RESOURCE_SLICES,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                       "metadata": {"name": "dra-1-gpu.nvidia.com-counters"},
                       "spec": {"driver": "gpu.nvidia.com", "nodeName": "dra-1", "pool": pool,
                                "sharedCounters": [
                                    {"name": "gpu-0-counter-set",
                                     "counters": {"multiprocessors": {"value": "98"}}},
                                    {"name": "gpu-1-counter-set",
                                     "counters": {"multiprocessors": {"value": "98"}}}]}}),
            ),
            (
                RESOURCE_SLICES,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                       "metadata": {"name": "dra-1-gpu.nvidia.com-devices"},
                       "spec": {"driver": "gpu.nvidia.com", "nodeName": "dra-1", "pool": pool,
                                "devices": devices}}),
            ),
        ],
    )
    .await;
    world.pass(0).await;
    assert_eq!(world.metrics.degraded_nodes.get(), 1);
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["dra-1"]);
    let events = world.fake.events();
    assert_eq!(
        events[0].2,
        "tainted gpu-guard.io/device-degraded=dra_gpu.nvidia.com:NoSchedule: 1 of 2 \
         dra/gpu.nvidia.com unusable (allocatable 1) since 2027-01-15T08:00:00Z (threshold held \
         120 s)"
    );
}
