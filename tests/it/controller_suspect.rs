//! Suspect nodes against the fake API server: device failures (exit code 74) of three pods of
//! different Jobs on one node its device plugin reports healthy taint it
//! `gpu-guard.io/device-degraded=suspect:NoSchedule`, with its record, the Node condition
//! (reason `SuspectNode`), an Event and the metrics; fewer pods, or failures spread over more
//! than the window, do not; the safety valve counts suspect and degraded nodes together; the
//! taint goes after the quiet period, on time across a controller restart that forgot every
//! pod; a dry run sends its writes with `dryRun=All`.

use std::sync::Arc;

use crate::support;

use gpu_guard_controller::metrics::ControllerMetrics;
use gpu_guard_controller::reconcile::Reconciler;
use gpu_guard_core::policy::Policy;
use gpu_guard_core::wellknown::{
    DEGRADED_OWNER_ANNOTATION, DEGRADED_TAINT_KEY, SUSPECT_ANNOTATION,
};
use serde_json::{Value, json};
use support::controller::{World, at, gpu_node, namespace, our_condition, policy};
use support::fake_api::{Logged, NAMESPACES, NODES, PODS};

/// The quiet period of the default policy.
const QUIET: i64 = 6 * 3600;

/// A pod of the Job `job` on `node` that failed with exit code 74 in its GPU container,
/// `seconds` after the tests' epoch.
fn failed_pod(name: &str, job: &str, node: &str, seconds: i64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "labels": {"batch.kubernetes.io/job-name": job, "job-name": job,
                                "batch.kubernetes.io/controller-uid": format!("uid-{job}")},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                          "uid": format!("uid-{job}"), "controller": true}]},
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "containers": [{"name": "trainer", "image": "cuda",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "trainer", "image": "cuda", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 74, "reason": "Error",
                                     "finishedAt": at(seconds).to_string()}}}]},
    })
}

/// Five healthy GPU nodes, the opted-in namespace `ml`, and `pods`.
async fn world(edit: impl FnOnce(&mut Policy), pods: Vec<Value>) -> World {
    let mut objects = vec![(NAMESPACES, namespace("ml", true))];
    for node in ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"] {
        objects.push((NODES, gpu_node(node, 8, 8)));
    }
    objects.extend(pods.into_iter().map(|pod| (PODS, pod)));
    let world = World::start(policy(edit), objects).await;
    for name in ["a", "b", "c"] {
        world
            .pod_cached(name, |pod| pod.device_failure.is_some())
            .await;
    }
    world
}

/// Three pods of different Jobs failed on gpu-1 at 08:00, 08:10 and 08:20.
fn three_on_gpu_1() -> Vec<Value> {
    vec![
        failed_pod("a", "job-a", "gpu-1", 0),
        failed_pod("b", "job-b", "gpu-1", 600),
        failed_pod("c", "job-c", "gpu-1", 1200),
    ]
}

fn node_writes(world: &World) -> Vec<Logged> {
    world
        .fake
        .writes()
        .into_iter()
        .filter(|write| write.path.starts_with("/api/v1/nodes/"))
        .collect()
}

fn our_taints(node: &Value) -> Vec<Value> {
    node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|taint| taint["key"] == DEGRADED_TAINT_KEY)
        .cloned()
        .collect()
}

fn events_of(fake: &support::fake_api::Fake, reason: &str) -> usize {
    fake.events()
        .iter()
        .filter(|event| event.0 == reason)
        .count()
}

fn reasons(world: &World) -> Vec<String> {
    world.fake.events().into_iter().map(|e| e.0).collect()
}

const MESSAGE: &str = "device failures of 3 pods on this node, its device plugin reporting \
                       every device healthy: a, b, c; the last at 2027-01-15T08:20:00Z; gpu-guard \
                       removes its gpu-guard.io/device-degraded taint at 2027-01-15T14:20:00Z \
                       unless another fails";

#[tokio::test]
async fn three_pods_failing_on_a_healthy_node_make_it_suspect_until_a_quiet_period_passes() {
    let mut pods = three_on_gpu_1();
    // Two pods on gpu-2; three on gpu-3, but over more than the hour.
    pods.push(failed_pod("d", "job-d", "gpu-2", 300));
    pods.push(failed_pod("e", "job-e", "gpu-2", 900));
    pods.push(failed_pod("f", "job-f", "gpu-3", -7200));
    pods.push(failed_pod("g", "job-g", "gpu-3", 600));
    pods.push(failed_pod("h", "job-h", "gpu-3", 1200));
    let mut world = world(|_| {}, pods).await;

    let report = world.pass(1300).await;
    assert_eq!(report.tainted, ["gpu-1"], "{report:?}");
    assert_eq!(report.conditions_set, ["gpu-1"]);
    let node = world.fake.object(NODES, "gpu-1");
    assert_eq!(
        our_taints(&node),
        [json!({"key": DEGRADED_TAINT_KEY, "value": "suspect", "effect": "NoSchedule"})]
    );
    assert_eq!(
        node["metadata"]["annotations"][SUSPECT_ANNOTATION],
        "2027-01-15T08:20:00Z;a,b,c"
    );
    assert_eq!(
        node["metadata"]["annotations"][DEGRADED_OWNER_ANNOTATION],
        format!("{};suspect:NoSchedule", at(1300))
    );
    let condition = our_condition(&node).expect("the condition");
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["reason"], "SuspectNode");
    assert_eq!(condition["message"], MESSAGE);
    assert_eq!(
        reasons(&world),
        ["DeviceSuspect", "DeviceDegradedConditionSet"]
    );
    assert!(
        world.fake.events()[0]
            .2
            .starts_with("tainted gpu-guard.io/device-degraded=suspect:NoSchedule: device failures of 3 different pods within 3600 s (a, b, c)"),
        "{:?}",
        world.fake.events()[0]
    );
    assert_eq!(world.metrics.suspect_taints_added.get(), 1);
    assert_eq!(world.metrics.taints_added.get(), 1);
    assert_eq!(world.metrics.suspect_nodes.get(), 1);
    assert_eq!(world.metrics.tainted_nodes.get(), 1);
    for other in ["gpu-2", "gpu-3"] {
        let node = world.fake.object(NODES, other);
        assert!(our_taints(&node).is_empty(), "{other}: {node}");
        assert!(our_condition(&node).is_none(), "{other}");
    }

    // Held, beyond healthyForSeconds (a degraded node's clock): nothing is written.
    world
        .node_cached("gpu-1", |node| our_condition(node).is_some())
        .await;
    world.fake.clear_requests();
    world.pass(1300 + 3600).await;
    assert!(node_writes(&world).is_empty(), "{:?}", node_writes(&world));

    // The pods are deleted (TTL cleanup, a JobSet's gang restart) and the controller restarts:
    // it knows only the node's record.
    for name in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        let pod = world.fake.object(PODS, &format!("ml/{name}"));
        world.fake.event(PODS, "DELETED", pod);
    }
    support::eventually("the pods gone from the cache", || {
        world.caches.pods.snapshot().is_empty()
    })
    .await;
    let metrics = Arc::new(ControllerMetrics::default());
    world.reconciler = Reconciler::new(
        world.fake.config(),
        policy(|_| {}),
        Some("test-2".to_owned()),
        metrics.clone(),
    )
    .expect("reconciler");
    world.metrics = metrics;
    world.fake.clear_requests();
    let report = world.pass(1200 + QUIET - 1).await;
    assert!(report.untainted.is_empty(), "{report:?}");
    assert!(node_writes(&world).is_empty(), "{:?}", node_writes(&world));
    assert_eq!(world.metrics.suspect_nodes.get(), 1);
    assert_eq!(world.metrics.tainted_nodes.get(), 1);

    // The quiet period is over: the taint, its annotations and the condition go.
    let report = world.pass(1200 + QUIET).await;
    assert_eq!(report.untainted, ["gpu-1"], "{report:?}");
    assert_eq!(report.conditions_removed, ["gpu-1"]);
    let node = world.fake.object(NODES, "gpu-1");
    assert!(our_taints(&node).is_empty(), "{node}");
    assert_eq!(
        node["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    );
    assert!(node["metadata"]["annotations"][SUSPECT_ANNOTATION].is_null());
    assert!(node["metadata"]["annotations"][DEGRADED_OWNER_ANNOTATION].is_null());
    assert!(our_condition(&node).is_none());
    let released: Vec<(String, String, String)> = world
        .fake
        .events()
        .into_iter()
        .filter(|event| event.0 == "DeviceSuspectReleased")
        .collect();
    assert_eq!(released.len(), 1, "{:?}", world.fake.events());
    assert_eq!(
        released[0].2,
        "removed the gpu-guard.io/device-degraded taint: suspect, and no device failure on the \
         node since 2027-01-15T08:20:00Z for controller.nodeHealth.suspect.quietSeconds (21600 s)"
    );
    assert_eq!(world.metrics.suspect_nodes.get(), 0);
    assert_eq!(world.metrics.taints_removed.get(), 1);
}

#[tokio::test]
async fn a_later_failure_on_a_suspect_node_moves_its_release() {
    let mut world = world(|_| {}, three_on_gpu_1()).await;
    assert_eq!(world.pass(1300).await.tainted, ["gpu-1"]);
    world
        .node_cached("gpu-1", |node| {
            !node["metadata"]["annotations"][SUSPECT_ANNOTATION].is_null()
        })
        .await;
    // A pod that was running there when it was tainted fails two hours later.
    world
        .fake
        .put(PODS, failed_pod("late", "job-late", "gpu-1", 7200));
    world
        .pod_cached("late", |pod| pod.device_failure.is_some())
        .await;
    world.pass(7300).await;
    let node = world.fake.object(NODES, "gpu-1");
    assert_eq!(
        node["metadata"]["annotations"][SUSPECT_ANNOTATION],
        "2027-01-15T10:00:00Z;a,b,c,late"
    );
    world
        .node_cached("gpu-1", |node| {
            node["metadata"]["annotations"][SUSPECT_ANNOTATION]
                .as_str()
                .is_some_and(|record| record.ends_with("late"))
        })
        .await;
    // The first failures' quiet period is over, the late one's is not.
    assert!(world.pass(1200 + QUIET).await.untainted.is_empty());
    assert_eq!(world.pass(7200 + QUIET).await.untainted, ["gpu-1"]);
}

#[tokio::test]
async fn suspect_and_degraded_nodes_count_together_against_the_safety_valve() {
    // Five GPU nodes, 20 %: one node may be tainted.
    let mut world = world(
        |p| p.controller.node_health.max_tainted_percent = 20,
        three_on_gpu_1(),
    )
    .await;
    let mut degraded = world.fake.object(NODES, "gpu-5");
    degraded["status"]["allocatable"]["nvidia.com/gpu"] = json!("7");
    world.fake.put(NODES, degraded);
    world
        .node_cached("gpu-5", |node| {
            node["status"]["allocatable"]["nvidia.com/gpu"] == "7"
        })
        .await;
    // Degraded from 08:15, tainted at 08:17 (degradedForSeconds); gpu-1's third pod fails
    // at 08:20.
    world.pass(900).await;
    let report = world.pass(1020).await;
    assert_eq!(report.tainted, ["gpu-5"], "{report:?}");
    assert!(report.valve_held.is_empty(), "{report:?}");
    let report = world.pass(1300).await;
    assert!(report.tainted.is_empty(), "{report:?}");
    assert_eq!(report.valve_held, ["gpu-1"], "{report:?}");
    assert!(our_taints(&world.fake.object(NODES, "gpu-1")).is_empty());
    let valve: Vec<String> = world
        .fake
        .events()
        .into_iter()
        .filter(|event| event.0 == "SafetyValve")
        .map(|event| event.2)
        .collect();
    assert_eq!(
        valve,
        [
            "suspect: device failures of 3 pods (a, b, c); not tainted: 1 of 5 GPU nodes are \
          tainted already, the most controller.nodeHealth.maxTaintedPercent (20 %) allows"
        ]
    );
    assert_eq!(world.metrics.safety_valve_trips.get(), 1);
    assert_eq!(world.metrics.suspect_taints_added.get(), 0);
}

#[tokio::test]
async fn a_dry_run_sends_the_suspect_taint_with_dry_run_all_and_stores_nothing() {
    let mut world = world(|p| p.controller.dry_run = true, three_on_gpu_1()).await;
    let report = world.pass(1300).await;
    assert_eq!(report.tainted, ["gpu-1"], "{report:?}");
    let writes = node_writes(&world);
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert!(
        writes
            .iter()
            .all(|write| write.param("dryRun") == Some("All")),
        "{writes:?}"
    );
    assert_eq!(writes[0].path, "/api/v1/nodes/gpu-1");
    assert_eq!(
        writes[0].body["metadata"]["annotations"][SUSPECT_ANNOTATION],
        "2027-01-15T08:20:00Z;a,b,c"
    );
    assert_eq!(writes[1].path, "/api/v1/nodes/gpu-1/status");
    let node = world.fake.object(NODES, "gpu-1");
    assert!(our_taints(&node).is_empty());
    assert!(our_condition(&node).is_none());
    assert!(
        world.fake.events()[0]
            .2
            .starts_with("dry run: would taint gpu-guard.io/device-degraded=suspect:NoSchedule"),
        "{:?}",
        world.fake.events()
    );
    assert_eq!(world.metrics.suspect_nodes.get(), 1);

    // Assumed tainted: nothing is sent again until its quiet period is over, then its removal
    // is only reported (nothing was stored to remove).
    world.fake.clear_requests();
    world.pass(1400).await;
    assert!(node_writes(&world).is_empty(), "{:?}", node_writes(&world));
    let report = world.pass(1200 + QUIET).await;
    assert_eq!(report.untainted, ["gpu-1"], "{report:?}");
    assert!(
        node_writes(&world)
            .iter()
            .all(|write| write.param("dryRun") == Some("All")),
        "{:?}",
        node_writes(&world)
    );
    assert_eq!(world.metrics.suspect_nodes.get(), 0);
}

/// A pod of the JobSet `jobset` on `node`: running, or failed with exit code 74 just now.
fn jobset_pod(name: &str, jobset: &str, node: &str, failed: bool) -> Value {
    let job = format!("{jobset}-workers-0");
    let mut pod = failed_pod(name, &job, node, 0);
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = json!(jobset);
    if failed {
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] =
            json!(k8s_openapi::jiff::Timestamp::now().to_string());
    } else {
        pod["status"] = json!({"phase": "Running", "containerStatuses": [{
            "name": "trainer", "image": "cuda", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {"startedAt": "2027-01-15T08:00:00Z"}}}]});
    }
    pod
}

/// Three JobSets' pods fail on gpu-1 and are deleted at once by their gang restarts: no pass
/// ever sees them cached, yet the running controller, from their watch events, taints gpu-1
/// suspect at its next node pass.
#[tokio::test]
async fn failures_of_pods_deleted_by_gang_restarts_still_count() {
    use gpu_guard_controller::run::{self, ControllerOptions};
    let fake = support::fake_api::Fake::start().await;
    for node in ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"] {
        fake.put(NODES, gpu_node(node, 8, 8));
    }
    fake.put(NAMESPACES, namespace("ml", true));
    for jobset in ["llm", "vision", "speech"] {
        fake.put(
            support::fake_api::JOBSETS,
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                   "metadata": {"name": jobset, "namespace": "ml", "uid": format!("uid-{jobset}")},
                   "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1,
                                                "template": {"spec": {"parallelism": 1}}}]}}),
        );
    }
    let options = ControllerOptions {
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        leader_election: None,
        identity: Some("test-1".to_owned()),
    };
    let running = run::start(
        fake.config(),
        policy(|p| p.controller.resync_seconds = 3600),
        options,
    )
    .await
    .expect("start");
    support::eventually("the pod watch open", || fake.open_watches(PODS) > 0).await;
    // Any node event brings a node pass: waits for the one after this touch.
    let node_pass = |touch: &'static str| {
        let fake = fake.clone();
        let passes = running.metrics.passes.clone();
        async move {
            let before = passes.get();
            let mut other = fake.object(NODES, "gpu-5");
            other["metadata"]["labels"]["touched"] = json!(touch);
            fake.put(NODES, other);
            support::eventually("a node pass", || passes.get() > before).await;
        }
    };
    for (index, jobset) in ["llm", "vision", "speech"].into_iter().enumerate() {
        let name = format!("{jobset}-workers-0-0-a");
        fake.put(PODS, jobset_pod(&name, jobset, "gpu-1", false));
        support::eventually("the pod cached", || running.metrics.device_pods.get() == 1).await;
        let failed = jobset_pod(&name, jobset, "gpu-1", true);
        fake.put(PODS, failed.clone());
        fake.event(PODS, "DELETED", failed);
        support::eventually("the pod gone", || running.metrics.device_pods.get() == 0).await;
        support::eventually("its failure recorded", || {
            events_of(&fake, "DeviceFailureRecorded") > index
        })
        .await;
        if index == 1 {
            node_pass("two").await;
            assert!(
                our_taints(&fake.object(NODES, "gpu-1")).is_empty(),
                "two pods do not make it suspect"
            );
        }
    }
    node_pass("three").await;
    support::eventually("gpu-1 tainted suspect", || {
        our_taints(&fake.object(NODES, "gpu-1"))
            == [json!({"key": DEGRADED_TAINT_KEY, "value": "suspect", "effect": "NoSchedule"})]
    })
    .await;
    let record = fake.object(NODES, "gpu-1")["metadata"]["annotations"][SUSPECT_ANNOTATION].clone();
    assert!(
        record.as_str().is_some_and(|record| record
            .ends_with(";llm-workers-0-0-a,speech-workers-0-0-a,vision-workers-0-0-a")),
        "{record}"
    );
    assert_eq!(running.metrics.suspect_taints_added.get(), 1);
    assert!(our_taints(&fake.object(NODES, "gpu-2")).is_empty());
}

/// A person removes the suspect taint (`kubectl taint`, which leaves the annotations): the
/// annotations go, and the failures that made the node suspect do not taint it again; new
/// ones do.
#[tokio::test]
async fn a_suspect_taint_removed_by_hand_is_not_put_back_for_the_same_failures() {
    let mut world = world(|_| {}, three_on_gpu_1()).await;
    assert_eq!(world.pass(1300).await.tainted, ["gpu-1"]);
    let mut node = world.fake.object(NODES, "gpu-1");
    node["spec"]["taints"] =
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]);
    world.fake.put(NODES, node);
    world
        .node_cached("gpu-1", |node| our_taints(node).is_empty())
        .await;
    let report = world.pass(1400).await;
    assert!(report.tainted.is_empty(), "{report:?}");
    world
        .node_cached("gpu-1", |node| {
            node["metadata"]["annotations"][DEGRADED_OWNER_ANNOTATION].is_null()
        })
        .await;
    let node = world.fake.object(NODES, "gpu-1");
    assert!(
        node["metadata"]["annotations"][SUSPECT_ANNOTATION].is_null(),
        "{node}"
    );
    assert!(world.pass(1500).await.tainted.is_empty());
    assert!(our_taints(&world.fake.object(NODES, "gpu-1")).is_empty());

    // Three new failures after the removal make it suspect again.
    for (name, seconds) in [("x", 1600), ("y", 1700), ("z", 1800)] {
        world.fake.put(
            PODS,
            failed_pod(name, &format!("job-{name}"), "gpu-1", seconds),
        );
        world
            .pod_cached(name, |pod| pod.device_failure.is_some())
            .await;
    }
    assert_eq!(world.pass(1900).await.tainted, ["gpu-1"]);
    assert_eq!(
        world.fake.object(NODES, "gpu-1")["metadata"]["annotations"][SUSPECT_ANNOTATION],
        "2027-01-15T08:30:00Z;x,y,z"
    );
}
