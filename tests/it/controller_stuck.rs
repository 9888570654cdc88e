//! Pods of protected Jobs stuck Terminating on a NotReady or unreachable node, against the
//! fake API server: reported once (Event, gauge) after `controller.stuckPods.afterSeconds`,
//! never on a Ready node nor when not Terminating or not protected; force-deleted only when
//! enabled, within `deletionsPerMinute`, with `dryRun=All` in a dry run.

use crate::support;

use hyper::Method;
use serde_json::{Value, json};
use support::controller::{World, gpu_node, namespace, pod, policy};
use support::fake_api::{NAMESPACES, NODES, PODS};

/// A GPU node whose kubelet stopped reporting at `08:00:00`: Ready `Unknown` and the
/// unreachable taint, as the node lifecycle controller leaves it.
fn unreachable_node(name: &str) -> Value {
    let mut node = gpu_node(name, 8, 8);
    node["status"]["conditions"] = json!([{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": "2027-01-15T07:59:10Z", "lastTransitionTime": "2027-01-15T08:00:00Z",
    }]);
    node["spec"]["taints"].as_array_mut().expect("taints").push(
        json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                     "timeAdded": "2027-01-15T08:00:05Z"}),
    );
    node
}

fn ready_node(name: &str) -> Value {
    let mut node = gpu_node(name, 8, 8);
    node["status"]["conditions"] = json!([{"type": "Ready", "status": "True",
        "lastTransitionTime": "2027-01-01T00:00:00Z"}]);
    node
}

/// A Job's GPU pod on `node`, Terminating since `deleted` (its deletionTimestamp) when given.
fn job_pod(name: &str, node: &str, deleted: Option<&str>) -> Value {
    let mut pod = pod("ml", name, node, true, false);
    if let Some(deleted) = deleted {
        pod["metadata"]["deletionTimestamp"] = json!(deleted);
        pod["metadata"]["deletionGracePeriodSeconds"] = json!(30);
    }
    pod
}

fn deletes(world: &World) -> Vec<support::fake_api::Logged> {
    world
        .fake
        .writes()
        .into_iter()
        .filter(|write| write.method == Method::DELETE)
        .collect()
}

const DELETED: &str = "2027-01-15T08:00:30Z";

fn world_objects(stuck: usize) -> Vec<(&'static str, Value)> {
    let mut objects = vec![
        (NODES, unreachable_node("gpu-1")),
        (NODES, ready_node("gpu-2")),
        (NAMESPACES, namespace("ml", true)),
        (NAMESPACES, namespace("other", false)),
        // Running on the unreachable node, not Terminating.
        (PODS, job_pod("running", "gpu-1", None)),
        // Terminating on a Ready node: the kubelet will finish it.
        (PODS, job_pod("on-ready", "gpu-2", Some(DELETED))),
    ];
    // Terminating on the unreachable node, but not a Job's.
    let mut replica = job_pod("not-a-job", "gpu-1", Some(DELETED));
    replica["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
        "kind": "ReplicaSet", "name": "serve", "uid": "uid-serve", "controller": true}]);
    objects.push((PODS, replica));
    // Its namespace did not opt in.
    let mut elsewhere = job_pod("elsewhere", "gpu-1", Some(DELETED));
    elsewhere["metadata"]["namespace"] = json!("other");
    objects.push((PODS, elsewhere));
    for index in 0..stuck {
        objects.push((
            PODS,
            job_pod(&format!("stuck-{index}"), "gpu-1", Some(DELETED)),
        ));
    }
    objects
}

#[tokio::test]
async fn a_stuck_pod_is_reported_once_and_left_alone_by_default() {
    let mut world = World::start(policy(|_| {}), world_objects(1)).await;
    // Deleted at 08:00:30, the node gone since 08:00:00: stuck from 08:05:30 (330 s).
    let report = world.pass(0).await;
    assert!(report.stuck.is_empty());
    let report = world.pass(329).await;
    assert!(report.stuck.is_empty(), "{report:?}");
    assert!(world.fake.events().is_empty());

    let report = world.pass(330).await;
    assert_eq!(report.stuck, ["ml/stuck-0"]);
    assert!(report.force_deleted.is_empty());
    assert!(deletes(&world).is_empty());
    let events = world.fake.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "StuckTerminating");
    assert_eq!(events[0].1, "stuck-0");
    assert_eq!(
        events[0].2,
        "pod ml/stuck-0 has been Terminating on node gpu-1, which is NotReady or unreachable, \
         since 2027-01-15T08:00:30Z; its Job cannot replace it until it is gone: taint the \
         node node.kubernetes.io/out-of-service if it is down (the pod garbage collector then \
         deletes the pod), or enable controller.stuckPods.forceDelete"
    );
    assert_eq!(world.metrics.stuck_pods.get(), 1);
    assert_eq!(world.metrics.pods_force_deleted.get(), 0);

    // Reported once.
    world.fake.clear_requests();
    let report = world.pass(400).await;
    assert!(report.stuck.is_empty());
    assert!(world.fake.events().is_empty());
    assert_eq!(world.metrics.stuck_pods.get(), 1);

    // The node comes back: no longer stuck, the gauge drops.
    world.fake.put(NODES, ready_node("gpu-1"));
    world
        .node_cached("gpu-1", |node| {
            node["status"]["conditions"][0]["status"] == "True"
        })
        .await;
    world.pass(410).await;
    assert_eq!(world.metrics.stuck_pods.get(), 0);
}

#[tokio::test]
async fn stuck_pods_are_force_deleted_when_enabled_at_the_rate_allowed() {
    let mut world = World::start(
        policy(|p| {
            p.controller.stuck_pods.force_delete = true;
            p.controller.stuck_pods.deletions_per_minute = 2;
        }),
        world_objects(3),
    )
    .await;
    world.pass(0).await;
    assert!(deletes(&world).is_empty());

    // Three stuck, two tokens: two deleted, one deferred.
    let report = world.pass(330).await;
    assert_eq!(report.stuck, ["ml/stuck-0", "ml/stuck-1", "ml/stuck-2"]);
    assert_eq!(report.force_deleted, ["ml/stuck-0", "ml/stuck-1"]);
    assert_eq!(report.deletions_deferred, ["ml/stuck-2"]);
    let sent = deletes(&world);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0].path, "/api/v1/namespaces/ml/pods/stuck-0");
    assert_eq!(sent[0].body["gracePeriodSeconds"], 0);
    assert_eq!(sent[0].body["preconditions"]["uid"], "uid-ml-stuck-0");
    assert_eq!(sent[0].body.get("dryRun"), None);
    for write in &sent {
        assert!(
            crate::controller::allowed_by(write, &gpu_guard_controller::RBAC_RULES),
            "{write:?} not allowed by the controller's RBAC rules"
        );
    }
    {
        let pods = &world.fake.lock().collections[PODS].objects;
        assert!(!pods.contains_key("ml/stuck-0"), "force-deleted");
        assert!(pods.contains_key("ml/stuck-2"), "waits for a token");
    }
    assert_eq!(world.metrics.pods_force_deleted.get(), 2);
    let reasons: Vec<String> = world.fake.events().into_iter().map(|e| e.0).collect();
    assert_eq!(
        reasons.iter().filter(|r| *r == "ForceDeleted").count(),
        2,
        "{reasons:?}"
    );

    // The bucket refills at 2 a minute: one token after 30 s, not before.
    world.fake.clear_requests();
    let report = world.pass(340).await;
    assert_eq!(report.deletions_deferred, ["ml/stuck-2"]);
    assert!(deletes(&world).is_empty());
    let report = world.pass(361).await;
    assert_eq!(report.force_deleted, ["ml/stuck-2"]);
    assert!(report.stuck.is_empty(), "reported once: {report:?}");
    // The others were never touched.
    let state = world.fake.lock();
    for left in [
        "ml/running",
        "ml/on-ready",
        "ml/not-a-job",
        "other/elsewhere",
    ] {
        assert!(state.collections[PODS].objects.contains_key(left), "{left}");
    }
}

#[tokio::test]
async fn a_dry_run_force_deletes_with_dry_run_all_once() {
    let mut world = World::start(
        policy(|p| {
            p.controller.dry_run = true;
            p.controller.stuck_pods.force_delete = true;
        }),
        world_objects(1),
    )
    .await;
    let report = world.pass(330).await;
    assert_eq!(report.force_deleted, ["ml/stuck-0"]);
    let sent = deletes(&world);
    assert_eq!(sent.len(), 1, "{sent:?}");
    // kube sends it in the DeleteOptions body, which the API server honours like the query.
    assert_eq!(sent[0].body["dryRun"], json!(["All"]));
    assert!(
        world.fake.lock().collections[PODS]
            .objects
            .contains_key("ml/stuck-0")
    );
    let notes: Vec<String> = world.fake.events().into_iter().map(|e| e.2).collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("dry run: would force-delete")),
        "{notes:?}"
    );
    world.fake.clear_requests();
    let report = world.pass(400).await;
    assert!(report.force_deleted.is_empty());
    assert!(deletes(&world).is_empty());
}
