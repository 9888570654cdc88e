//! gpu-guard's Node condition (`gpu-guard.io/DeviceDegraded`) against the fake API server: set
//! with the taint and removed with it, the exact `nodes/status` patches, the kubelet's
//! conditions untouched, and convergence (a deleted condition, a failed write, a restart, a
//! taint removed by a person); a dry run sends it with `dryRun=All`, once.

use crate::support;

use gpu_guard_controller::reconcile::Reconciler;
use gpu_guard_core::wellknown::{DEGRADED_OWNER_ANNOTATION, DEVICE_DEGRADED_NODE_CONDITION};
use hyper::Method;
use serde_json::{Value, json};
use support::controller::{TAINT_TIME, World, gpu_node, has_our_taint, our_condition, policy};
use support::fake_api::{Logged, NODES};

/// A GPU node as the kubelet reports it: Ready, and a condition of Node Problem Detector.
fn reporting_node(name: &str, capacity: u32, allocatable: u32) -> Value {
    let mut node = gpu_node(name, capacity, allocatable);
    node["status"]["conditions"] = json!([
        {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "lastHeartbeatTime": "2027-01-15T07:59:50Z", "lastTransitionTime": "2027-01-01T00:00:00Z"},
        {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock"},
    ]);
    node
}

fn status_writes(world: &World) -> Vec<Logged> {
    world
        .fake
        .writes()
        .into_iter()
        .filter(|write| write.path.ends_with("/status"))
        .collect()
}

fn other_conditions(node: &Value) -> Vec<Value> {
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|condition| condition["type"] != DEVICE_DEGRADED_NODE_CONDITION)
        .cloned()
        .collect()
}

/// Someone deletes gpu-guard's condition from the node (a watch event), and the cache shows it.
async fn delete_condition(world: &World, name: &str) {
    let mut node = world.fake.object(NODES, name);
    node["status"]["conditions"] = json!(other_conditions(&node));
    world.fake.put(NODES, node);
    world
        .node_cached(name, |node| our_condition(node).is_none())
        .await;
}

const MESSAGE: &str = "1 of 8 nvidia.com/gpu unusable (allocatable 7); gpu-guard tainted the node \
                       gpu-guard.io/device-degraded since 2027-01-15T08:02:00Z";

#[tokio::test]
async fn the_condition_is_set_with_the_taint_and_removed_with_it() {
    let mut world = World::start(
        policy(|_| {}),
        vec![
            (NODES, reporting_node("gpu-1", 8, 7)),
            (NODES, reporting_node("gpu-2", 8, 8)),
        ],
    )
    .await;
    let kubelets = other_conditions(&world.fake.object(NODES, "gpu-1"));

    // Degraded, not tainted yet: no condition either.
    world.pass(0).await;
    assert!(world.fake.writes().is_empty());

    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert_eq!(report.conditions_set, ["gpu-1"]);
    let writes = status_writes(&world);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].method, Method::PATCH);
    assert_eq!(writes[0].path, "/api/v1/nodes/gpu-1/status");
    assert_eq!(
        writes[0].content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    assert_eq!(
        writes[0].body,
        json!({"status": {"conditions": [{
            "type": "gpu-guard.io/DeviceDegraded", "status": "True", "reason": "UnusableDevices",
            "message": MESSAGE,
            "lastTransitionTime": TAINT_TIME, "lastHeartbeatTime": TAINT_TIME,
        }]}})
    );
    let node = world.fake.object(NODES, "gpu-1");
    assert_eq!(
        our_condition(&node).expect("the condition")["status"],
        "True"
    );
    assert_eq!(
        other_conditions(&node),
        kubelets,
        "the kubelet's conditions stay"
    );
    let reasons: Vec<String> = world.fake.events().into_iter().map(|e| e.0).collect();
    assert_eq!(reasons, ["DeviceDegraded", "DeviceDegradedConditionSet"]);
    let note = &world.fake.events()[1].2;
    assert_eq!(
        note,
        &format!(
            "set the node condition gpu-guard.io/DeviceDegraded=True, reason UnusableDevices: \
             {MESSAGE}"
        )
    );
    assert_eq!(world.metrics.node_conditions_set.get(), 1);
    assert!(our_condition(&world.fake.object(NODES, "gpu-2")).is_none());

    // Tainted and still degraded, and recovering: nothing more is written.
    world
        .node_cached("gpu-1", |node| our_condition(node).is_some())
        .await;
    world.fake.clear_requests();
    world.pass(300).await;
    world.heal("gpu-1").await;
    world.pass(400).await;
    world.pass(999).await;
    assert!(world.fake.writes().is_empty(), "{:?}", world.fake.writes());

    // The taint goes after healthyForSeconds: the condition with it, alone.
    let report = world.pass(1000).await;
    assert_eq!(report.untainted, ["gpu-1"]);
    assert_eq!(report.conditions_removed, ["gpu-1"]);
    let writes = status_writes(&world);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0].body,
        json!({"status": {"conditions": [
            {"type": "gpu-guard.io/DeviceDegraded", "$patch": "delete"}]}})
    );
    let node = world.fake.object(NODES, "gpu-1");
    assert!(our_condition(&node).is_none());
    assert!(!has_our_taint(&node));
    assert_eq!(other_conditions(&node), kubelets);
    let reasons: Vec<String> = world.fake.events().into_iter().map(|e| e.0).collect();
    assert_eq!(
        reasons,
        ["DeviceRecovered", "DeviceDegradedConditionRemoved"]
    );
    assert_eq!(world.metrics.node_conditions_removed.get(), 1);

    // Nothing more once the cache shows it.
    world
        .node_cached("gpu-1", |node| our_condition(node).is_none())
        .await;
    world.fake.clear_requests();
    world.pass(1001).await;
    assert!(world.fake.writes().is_empty());
}

#[tokio::test]
async fn the_condition_converges_like_the_taint() {
    let mut world =
        World::start(policy(|_| {}), vec![(NODES, reporting_node("gpu-1", 8, 6))]).await;
    world.pass(0).await;

    // The status write fails: the taint stays, the error is reported, the next pass sets it.
    world.fake.lock().node_status_failures = 1;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert!(report.conditions_set.is_empty());
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(
        report.errors[0].starts_with("condition gpu-1: "),
        "{:?}",
        report.errors
    );
    assert!(our_condition(&world.fake.object(NODES, "gpu-1")).is_none());
    let report = world.pass(130).await;
    assert_eq!(report.conditions_set, ["gpu-1"]);
    let set = our_condition(&world.fake.object(NODES, "gpu-1")).expect("the condition");
    assert_eq!(set["lastTransitionTime"], "2027-01-15T08:02:10Z");

    // Someone deletes it (a watch event): it comes back on the next pass.
    delete_condition(&world, "gpu-1").await;
    let report = world.pass(200).await;
    assert_eq!(report.conditions_set, ["gpu-1"]);
    assert!(our_condition(&world.fake.object(NODES, "gpu-1")).is_some());

    // A controller restart with the taint and without the condition: set on the first pass.
    delete_condition(&world, "gpu-1").await;
    world.reconciler = Reconciler::new(
        world.fake.config(),
        policy(|_| {}),
        Some("test-2".to_owned()),
        world.metrics.clone(),
    )
    .expect("reconciler");
    let report = world.pass(300).await;
    assert!(report.tainted.is_empty(), "tainted already: {report:?}");
    assert_eq!(report.conditions_set, ["gpu-1"]);
    let condition = our_condition(&world.fake.object(NODES, "gpu-1")).expect("the condition");
    // Degraded since the taint, as its owner annotation records.
    assert_eq!(
        condition["message"],
        "2 of 8 nvidia.com/gpu unusable (allocatable 6); gpu-guard tainted the node \
         gpu-guard.io/device-degraded since 2027-01-15T08:02:00Z"
    );

    // A person removes the taint (not gpu-guard): the condition goes on the next pass, and the
    // node is tainted again only after degradedForSeconds.
    world
        .node_cached("gpu-1", |node| our_condition(node).is_some())
        .await;
    let mut node = world.fake.object(NODES, "gpu-1");
    node["spec"]["taints"] =
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]);
    world.fake.put(NODES, node);
    world
        .node_cached("gpu-1", |node| !has_our_taint(node))
        .await;
    world.fake.clear_requests();
    let report = world.pass(310).await;
    assert_eq!(report.conditions_removed, ["gpu-1"]);
    assert!(report.tainted.is_empty());
    let node = world.fake.object(NODES, "gpu-1");
    assert!(our_condition(&node).is_none());
    assert!(
        node["metadata"]["annotations"]
            .get(DEGRADED_OWNER_ANNOTATION)
            .is_none()
    );
}

#[tokio::test]
async fn a_dry_run_sends_the_condition_with_dry_run_all_and_stores_nothing() {
    let mut world = World::start(
        policy(|p| p.controller.dry_run = true),
        vec![(NODES, reporting_node("gpu-1", 8, 7))],
    )
    .await;
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert_eq!(report.conditions_set, ["gpu-1"]);
    let writes = status_writes(&world);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].param("dryRun"), Some("All"));
    assert!(our_condition(&world.fake.object(NODES, "gpu-1")).is_none());
    let notes: Vec<String> = world.fake.events().into_iter().map(|e| e.2).collect();
    assert!(
        notes[1].starts_with("dry run: would set the node condition"),
        "{notes:?}"
    );

    // What a dry run would have set stands: not sent again.
    world.fake.clear_requests();
    let report = world.pass(130).await;
    assert!(report.conditions_set.is_empty());
    assert!(status_writes(&world).is_empty());

    // Recovered past healthyForSeconds: the assumed condition goes with the assumed taint,
    // nothing sent.
    world.heal("gpu-1").await;
    world.pass(200).await;
    let report = world.pass(800).await;
    assert_eq!(report.untainted, ["gpu-1"]);
    assert_eq!(report.conditions_removed, ["gpu-1"]);
    assert!(
        status_writes(&world).is_empty(),
        "{:?}",
        status_writes(&world)
    );
    let notes: Vec<String> = world.fake.events().into_iter().map(|e| e.2).collect();
    assert!(
        notes
            .iter()
            .any(|note| note.starts_with("dry run: would remove the node condition")),
        "{notes:?}"
    );
}

#[tokio::test]
async fn a_dry_run_removes_a_stale_condition_with_dry_run_all_once() {
    // gpu-guard's condition without its taint (left from before, the taint removed by hand).
    let mut node = reporting_node("gpu-1", 8, 8);
    node["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
        .push(
            json!({"type": DEVICE_DEGRADED_NODE_CONDITION, "status": "True",
                     "reason": "UnusableDevices", "message": "1 of 8 nvidia.com/gpu unusable"}),
        );
    let mut world =
        World::start(policy(|p| p.controller.dry_run = true), vec![(NODES, node)]).await;
    let report = world.pass(0).await;
    assert_eq!(report.conditions_removed, ["gpu-1"]);
    let writes = status_writes(&world);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].param("dryRun"), Some("All"));
    assert_eq!(
        writes[0].body,
        json!({"status": {"conditions": [
            {"type": "gpu-guard.io/DeviceDegraded", "$patch": "delete"}]}})
    );
    assert!(our_condition(&world.fake.object(NODES, "gpu-1")).is_some());
    // What the dry run would have done stands: not sent again.
    world.fake.clear_requests();
    let report = world.pass(15).await;
    assert!(report.conditions_removed.is_empty());
    assert!(status_writes(&world).is_empty());
}
