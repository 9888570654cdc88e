//! The pod half of the controller against the fake API server (`tests/support`): which pods
//! are marked and evicted, the exact condition patches and evictions, what the caches list,
//! the eviction rate limit and PodDisruptionBudget refusals.

use crate::support;

use gpu_guard_controller::reconcile::PassReport;
use gpu_guard_core::wellknown::DEGRADED_TAINT_KEY;
use hyper::Method;
use serde_json::{Value, json};
use support::controller::{
    TAINT_TIME, World, gpu_node, has_our_taint, namespace, pod, pod_world, policy,
};
use support::eventually;
use support::fake_api::{Logged, NAMESPACES, NODES, PODS, status};

/// The mark of pod `ml/<name>` (its uid as `support::controller::pod` makes it).
fn condition(name: &str, reason: &str, message: &str, time: &str) -> Value {
    json!({"metadata": {"uid": format!("uid-ml-{name}")}, "status": {"conditions": [{
        "type": "gpu-guard.io/DeviceFailure",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": time,
    }]}})
}

const SICK_MESSAGE: &str = "nvidia.com/gpu device GPU-1234 allocated to container trainer is \
                            reported Unhealthy by the kubelet; gpu-guard marks the pod so its \
                            failure is retried";

const DEGRADED_MESSAGE: &str = "node gpu-1 is tainted gpu-guard.io/device-degraded=nvidia.com_gpu \
                                by gpu-guard: its nvidia.com/gpu devices are degraded; gpu-guard \
                                marks the pod so its failure is retried";

#[tokio::test]
async fn pods_hit_by_a_device_failure_are_marked_and_evicted() {
    let mut world =
        World::start(policy(|p| p.controller.pods.evict_pods = true), pod_world()).await;

    // t=0: the node is not tainted yet; only the pod with the unhealthy GPU is hit.
    let report = world.pass(0).await;
    assert_eq!(report.marked, ["ml/sick"]);
    assert_eq!(report.evicted, ["ml/sick"]);
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0].method, Method::PATCH);
    assert_eq!(writes[0].path, "/api/v1/namespaces/ml/pods/sick/status");
    assert_eq!(
        writes[0].content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    assert_eq!(
        writes[0].body,
        condition(
            "sick",
            "UnhealthyDevice",
            SICK_MESSAGE,
            "2027-01-15T08:00:00Z"
        )
    );
    assert_eq!(writes[1].method, Method::POST);
    assert_eq!(writes[1].path, "/api/v1/namespaces/ml/pods/sick/eviction");
    assert_eq!(
        writes[1].body,
        json!({"apiVersion": "policy/v1", "kind": "Eviction",
               "metadata": {"name": "sick", "namespace": "ml"},
               "deleteOptions": {"preconditions": {"uid": "uid-ml-sick"}}})
    );
    // The pod's other conditions stay (the API server merges by type).
    let sick = world.fake.object(PODS, "ml/sick");
    assert_eq!(sick["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(
        sick["status"]["conditions"][1]["type"],
        "gpu-guard.io/DeviceFailure"
    );
    // The mark's Event is published by a task of its own: the two may arrive in either order.
    let mut events: Vec<(String, String)> = world
        .fake
        .events()
        .into_iter()
        .map(|(reason, name, _)| (reason, name))
        .collect();
    events.sort();
    assert_eq!(
        events,
        [
            ("DeviceFailureMarked".to_owned(), "sick".to_owned()),
            ("Evicted".to_owned(), "sick".to_owned())
        ]
    );
    let pod_event = world
        .fake
        .requests()
        .into_iter()
        .find(Logged::is_event)
        .expect("an event");
    assert_eq!(
        pod_event.path,
        "/apis/events.k8s.io/v1/namespaces/ml/events"
    );

    // t=120: the node is tainted; the GPU pod on it is marked and evicted, the CPU pod is not;
    // the pod already handled is not touched again.
    world.pod_cached("sick", |pod| pod.marked).await;
    world.fake.clear_requests();
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert_eq!(report.marked, ["ml/on-degraded"]);
    assert_eq!(report.evicted, ["ml/on-degraded"]);
    let writes: Vec<(Method, String, Value)> = world
        .fake
        .writes()
        .into_iter()
        // gpu-guard's Node condition: tests/it/controller_conditions.rs.
        .filter(|w| w.path != "/api/v1/nodes/gpu-1/status")
        .map(|w| (w.method, w.path, w.body))
        .collect();
    assert_eq!(writes.len(), 3, "{writes:?}");
    assert_eq!(writes[0].1, "/api/v1/nodes/gpu-1");
    assert_eq!(
        writes[1],
        (
            Method::PATCH,
            "/api/v1/namespaces/ml/pods/on-degraded/status".to_owned(),
            condition(
                "on-degraded",
                "NodeDeviceDegraded",
                DEGRADED_MESSAGE,
                TAINT_TIME
            )
        )
    );
    assert_eq!(
        writes[2].1,
        "/api/v1/namespaces/ml/pods/on-degraded/eviction"
    );

    world.pod_cached("on-degraded", |pod| pod.marked).await;
    world.fake.clear_requests();
    let report = world.pass(130).await;
    assert_eq!(report, PassReport::default());
    assert!(world.fake.writes().is_empty());
    assert_eq!(world.metrics.pods_marked.get(), 2);
    assert_eq!(world.metrics.pods_evicted.get(), 2);
    assert_eq!(world.metrics.reconcile_errors.get(), 0);
}

#[tokio::test]
async fn by_default_pods_are_marked_not_evicted() {
    let mut world = World::start(policy(|_| {}), pod_world()).await;
    let report = world.pass(0).await;
    assert_eq!(report.marked, ["ml/sick"]);
    assert!(report.evicted.is_empty());
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 1);
    assert!(writes[0].path.ends_with("/status"));
    // Only opted-in namespaces are listed and watched.
    let namespace_reads: Vec<Logged> = world
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == NAMESPACES)
        .collect();
    assert!(!namespace_reads.is_empty());
    assert!(namespace_reads.iter().all(|r| {
        r.query.get("labelSelector").map(String::as_str) == Some("gpu-guard.io%2Fenabled%3Dtrue")
    }));
    // Only pods bound to a node and not finished are listed and watched.
    let pod_reads: Vec<Logged> = world
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == PODS)
        .collect();
    assert!(!pod_reads.is_empty());
    assert!(pod_reads.iter().all(|r| {
        r.query.get("fieldSelector").map(|s| percent_decoded(s))
            == Some("spec.nodeName!=,status.phase!=Succeeded".to_owned())
    }));
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("ASCII");
            out.push(u8::from_str_radix(hex, 16).expect("hex"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("UTF-8")
}

/// Pods `ml/a` and `ml/b`, hit by a device failure on `gpu-1`, to be evicted (not marked) at
/// one eviction a minute.
/// How many evictions the fake received.
fn evictions_sent(world: &World) -> usize {
    world
        .fake
        .writes()
        .iter()
        .filter(|w| w.path.ends_with("/eviction"))
        .count()
}

/// How many evictions of pod `ml/<name>` the fake received.
fn evictions_of(world: &World, name: &str) -> usize {
    world
        .fake
        .writes()
        .iter()
        .filter(|w| w.path == format!("/api/v1/namespaces/ml/pods/{name}/eviction"))
        .count()
}

async fn two_pods_to_evict() -> World {
    let objects = vec![
        (NODES, gpu_node("gpu-1", 8, 8)),
        (NAMESPACES, namespace("ml", true)),
        (PODS, pod("ml", "a", "gpu-1", true, true)),
        (PODS, pod("ml", "b", "gpu-1", true, true)),
    ];
    World::start(
        policy(|p| {
            p.controller.pods.evict_pods = true;
            p.controller.pods.mark_pods = false;
            p.controller.pods.evictions_per_minute = 1;
        }),
        objects,
    )
    .await
}

#[tokio::test]
async fn evictions_are_rate_limited_and_a_pdb_refusal_waits() {
    let mut world = two_pods_to_evict().await;
    let report = world.pass(0).await;
    assert_eq!(report.evicted, ["ml/a"]);
    assert_eq!(report.evictions_deferred, ["ml/b"]);
    // Nothing else is marked: markPods is off.
    assert!(report.marked.is_empty());
    // 30 s later the bucket holds half a token: still deferred.
    let report = world.pass(30).await;
    assert_eq!(report.evictions_deferred, ["ml/b"]);
    // A minute later a token is there, but a PodDisruptionBudget refuses (429): not an error.
    world.fake.lock().eviction_refused.insert("b".to_owned());
    let report = world.pass(60).await;
    assert_eq!(report.evictions_deferred, ["ml/b"]);
    assert!(report.errors.is_empty());
    assert_eq!(world.metrics.reconcile_errors.get(), 0);
    // The budget allows it later.
    world.fake.lock().eviction_refused.clear();
    let report = world.pass(120).await;
    assert_eq!(report.evicted, ["ml/b"]);
    let evictions = evictions_sent(&world);
    assert_eq!(evictions, 3);
    assert_eq!(world.metrics.pods_evicted.get(), 2);
    assert_eq!(world.metrics.evictions_deferred.get(), 3);
}

#[tokio::test]
async fn a_throttled_eviction_is_retried_on_the_next_pass_not_backed_off_like_a_budget_refusal() {
    let mut world = two_pods_to_evict().await;
    // API Priority and Fairness answers 429 without a disruption budget cause.
    world.fake.lock().eviction_status = Some(429);
    let report = world.pass(0).await;
    assert!(report.evicted.is_empty());
    assert_eq!(report.evictions_deferred, ["ml/a", "ml/b"]);
    assert!(report.errors.is_empty(), "{report:?}");
    // One second later, well within a budget refusal's 10 s backoff, both are tried again:
    // their tokens were given back.
    world.fake.lock().eviction_status = None;
    let report = world.pass(1).await;
    assert_eq!(report.evicted, ["ml/a"]);
    let evictions = evictions_sent(&world);
    assert_eq!(evictions, 3, "a and b throttled, then a evicted");
}

#[tokio::test]
async fn a_pod_a_budget_refuses_waits_on_its_own_and_does_not_starve_the_others() {
    let mut world = two_pods_to_evict().await;
    world.fake.lock().eviction_refused.insert("a".to_owned());
    // a is refused: its token goes back, and b (after it) is evicted in the same pass.
    let report = world.pass(0).await;
    assert_eq!(report.evicted, ["ml/b"]);
    assert_eq!(report.evictions_deferred, ["ml/a"]);
    assert!(report.errors.is_empty(), "{report:?}");
    // a waits for its backoff (10 s), without asking the API server.
    let report = world.pass(5).await;
    assert_eq!(report.evictions_deferred, ["ml/a"]);
    assert_eq!(evictions_of(&world, "a"), 1);
    // Refused again: it waits twice as long.
    world.pass(70).await;
    assert_eq!(evictions_of(&world, "a"), 2);
    world.pass(85).await;
    assert_eq!(evictions_of(&world, "a"), 2);
    // The budget allows it.
    world.fake.lock().eviction_refused.clear();
    let report = world.pass(90).await;
    assert_eq!(report.evicted, ["ml/a"]);
    assert_eq!(evictions_of(&world, "a"), 3);
    assert_eq!(evictions_of(&world, "b"), 1);
}

#[tokio::test]
async fn pods_nothing_would_recreate_elsewhere_are_marked_not_evicted() {
    let owned_by = |mut pod: Value, owner: Value| {
        pod["metadata"]["ownerReferences"] = owner;
        pod
    };
    let mut tolerating = pod("ml", "tolerating", "gpu-1", true, false);
    tolerating["spec"]["tolerations"] =
        json!([{"key": DEGRADED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]);
    let objects = vec![
        (NODES, gpu_node("gpu-1", 8, 7)),
        (NAMESPACES, namespace("ml", true)),
        (PODS, pod("ml", "job", "gpu-1", true, false)),
        (PODS, tolerating),
        (
            PODS,
            owned_by(
                pod("ml", "daemon", "gpu-1", true, false),
                json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d",
                        "uid": "uid-d", "controller": true}]),
            ),
        ),
        (
            PODS,
            owned_by(pod("ml", "bare", "gpu-1", true, false), json!(null)),
        ),
        // A static pod's mirror, as the kubelet creates it (here with a Job-like owner, so
        // only the annotation, kept by the cache, tells it apart).
        (PODS, {
            let mut mirror = pod("ml", "static", "gpu-1", true, false);
            mirror["metadata"]["annotations"] =
                json!({"kubernetes.io/config.mirror": "5e1f", "other": "dropped"});
            mirror
        }),
    ];
    let mut world = World::start(policy(|p| p.controller.pods.evict_pods = true), objects).await;
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert_eq!(
        report.marked,
        [
            "ml/bare",
            "ml/daemon",
            "ml/job",
            "ml/static",
            "ml/tolerating"
        ]
    );
    assert_eq!(report.evicted, ["ml/job"]);
}

#[tokio::test]
async fn pods_are_not_marked_for_their_node_during_its_recovery() {
    let mut world = World::start(policy(|_| {}), pod_world()).await;
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert_eq!(report.marked, ["ml/on-degraded"]);
    // The node heals; it keeps the taint for healthyForSeconds. A pod with a healthy GPU that
    // comes to it meanwhile is not marked.
    world.node_cached("gpu-1", has_our_taint).await;
    world.heal("gpu-1").await;
    world
        .fake
        .put(PODS, pod("ml", "late", "gpu-1", true, false));
    world.pod_cached("late", |_| true).await;
    let report = world.pass(200).await;
    assert!(report.marked.is_empty(), "{report:?}");
    assert!(report.untainted.is_empty());
}

#[tokio::test]
async fn only_device_pods_are_cached_and_a_relist_forgets_the_pods_deleted_meanwhile() {
    let world = World::start(policy(|_| {}), pod_world()).await;
    let cached: Vec<String> = world
        .caches
        .pods
        .snapshot()
        .iter()
        .map(|pod| pod.id())
        .collect();
    // The CPU pod is not kept: nothing about it is ever decided.
    assert_eq!(
        cached,
        [
            "ml/fine",
            "ml/on-degraded",
            "ml/sick",
            "other/sick-elsewhere"
        ]
    );
    // A pod deleted while the watch is down (no DELETED event reaches the controller): the
    // relist after `410 Gone` forgets it, and keeps the others.
    world.fake.remove(PODS, "ml/fine");
    world.fake.error_event(PODS, 410);
    eventually("the relist forgets ml/fine", || {
        world.caches.pods.get("ml", "fine").is_none()
    })
    .await;
    assert_eq!(world.caches.pods.len(), 3);
    assert!(world.caches.pods.get("ml", "sick").is_some());
}

#[tokio::test]
async fn a_pod_event_is_judged_on_its_own_without_a_full_pass() {
    let mut world = World::start(policy(|_| {}), pod_world()).await;
    let report = world.pass(0).await;
    assert_eq!(report.marked, ["ml/sick"]);
    world.pod_cached("sick", |pod| pod.marked).await;
    // The kubelet reports the GPU of `fine` unhealthy: a pod pass judges the pods that changed.
    world.fake.put(PODS, pod("ml", "fine", "gpu-2", true, true));
    world
        .pod_cached("fine", |pod| pod.unhealthy.is_some())
        .await;
    world.fake.clear_requests();
    let passes = world.metrics.passes.get();
    let report = world
        .reconciler
        .pass_pods(&world.caches, support::controller::at(5))
        .await;
    assert_eq!(report.marked, ["ml/fine"]);
    assert!(
        report.tainted.is_empty() && report.errors.is_empty(),
        "{report:?}"
    );
    assert_eq!(world.metrics.passes.get(), passes, "not a full pass");
    let writes: Vec<String> = world
        .fake
        .writes()
        .into_iter()
        .filter(|w| !w.is_event())
        .map(|w| w.path)
        .collect();
    assert_eq!(writes, ["/api/v1/namespaces/ml/pods/fine/status"]);
    // Nothing changed since: the next pod pass has nothing to do.
    world.fake.clear_requests();
    world.pod_cached("fine", |pod| pod.marked).await;
    let report = world
        .reconciler
        .pass_pods(&world.caches, support::controller::at(6))
        .await;
    assert_eq!(report, PassReport::default());
    assert!(world.fake.writes().is_empty());
}

#[tokio::test]
async fn a_node_pass_judges_the_pods_of_a_node_that_changed_state_and_of_a_namespace_that_opted_in()
{
    let mut world = World::start(policy(|_| {}), pod_world()).await;
    let report = world.pass(0).await;
    assert_eq!(report.marked, ["ml/sick"]);
    world.pod_cached("sick", |pod| pod.marked).await;
    // t=120, after a node event: gpu-1 is tainted, and the pod on it is marked although the pod
    // itself did not change.
    let report = world
        .reconciler
        .pass_nodes(&world.caches, support::controller::at(120))
        .await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert_eq!(report.marked, ["ml/on-degraded"]);
    // Namespace `other` opts in: its pod, unchanged since it was listed, is judged too.
    world.fake.put(NAMESPACES, namespace("other", true));
    eventually("other opted in", || {
        world.caches.namespaces.contains("other")
    })
    .await;
    let report = world
        .reconciler
        .pass_nodes(&world.caches, support::controller::at(130))
        .await;
    assert_eq!(report.marked, ["other/sick-elsewhere"]);
    // Nothing changed since: a node pass marks nothing more.
    world.pod_cached("sick-elsewhere", |pod| pod.marked).await;
    let report = world
        .reconciler
        .pass_nodes(&world.caches, support::controller::at(140))
        .await;
    assert!(report.marked.is_empty(), "{report:?}");
}

#[tokio::test]
async fn an_eviction_refused_in_a_successful_answer_is_not_counted_as_done() {
    // A pod covered by two PodDisruptionBudgets: the eviction subresource answers 201 with a
    // `Failure` Status (kubernetes v1.36 pkg/registry/core/pod/storage/eviction.go).
    let mut world = two_pods_to_evict().await;
    world.fake.lock().eviction_answers.insert(
        "a".to_owned(),
        (
            201,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "This pod has more than one PodDisruptionBudget, which the eviction \
                            subresource does not support.",
                "code": 500}),
        ),
    );
    // One eviction a minute: the refused pod gives its token back to b, next in line.
    let report = world.pass(0).await;
    assert_eq!(report.evicted, ["ml/b"], "{report:?}");
    assert_eq!(report.evictions_deferred, ["ml/a"]);
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert!(
        report.errors[0].contains("ml/a")
            && report.errors[0].contains("more than one PodDisruptionBudget"),
        "{report:?}"
    );
    assert_eq!(world.metrics.pods_evicted.get(), 1);
    // Only b's eviction is told of in an Event.
    let evicted_events: Vec<String> = world
        .fake
        .events()
        .into_iter()
        .filter(|(reason, _, _)| reason == "Evicted")
        .map(|(_, object, _)| object)
        .collect();
    assert_eq!(evicted_events, ["b"]);
    // a is not remembered as evicted: once the budgets allow it, it is tried again.
    world.fake.lock().eviction_answers.clear();
    let report = world.pass(61).await;
    assert_eq!(report.evicted, ["ml/a"], "{report:?}");
}

#[tokio::test]
async fn a_forbidden_eviction_backs_off_and_leaves_the_budget_to_the_other_pods() {
    // A budget whose disruptionsAllowed is negative answers 403; one minute of passes every 15 s
    // with the default budget must not be spent on the one stuck pod.
    let objects = vec![
        (NODES, gpu_node("gpu-1", 8, 8)),
        (NAMESPACES, namespace("ml", true)),
        (PODS, pod("ml", "a", "gpu-1", true, true)),
        (PODS, pod("ml", "b", "gpu-1", true, true)),
    ];
    let mut world = World::start(
        policy(|p| {
            p.controller.pods.evict_pods = true;
            p.controller.pods.mark_pods = false;
        }),
        objects,
    )
    .await;
    world.fake.lock().eviction_answers.insert(
        "a".to_owned(),
        (
            403,
            status(
                403,
                "Forbidden",
                "poddisruptionbudgets.policy \"train\" is forbidden: pdb disruptions allowed is negative",
            ),
        ),
    );
    let report = world.pass(0).await;
    assert_eq!(report.evicted, ["ml/b"]);
    assert!(report.errors[0].contains("403 Forbidden"), "{report:?}");
    for second in [15, 30, 45, 60] {
        world.pass(second).await;
    }
    // Backed off 10 s, then 20 s, then 40 s: tried at 0, 15 and 45, not at every pass.
    assert_eq!(evictions_of(&world, "a"), 3);
    // The tokens its refusals gave back are there for a pod that comes later.
    world.fake.put(PODS, pod("ml", "c", "gpu-1", true, true));
    world.pod_cached("c", |_| true).await;
    let report = world.pass(61).await;
    assert_eq!(report.evicted, ["ml/c"], "{report:?}");
    assert_eq!(report.evictions_deferred, ["ml/a"]);
}

/// A pod deleted and recreated under the same name while the cache still holds the old one
/// (its watch lags): the mark carries the old pod's uid and the eviction a UID precondition, so
/// the API server refuses both, and the new pod (healthy) is neither marked nor evicted. Not an
/// error: the new pod is judged on its own once the cache has it.
#[tokio::test]
async fn a_pod_recreated_under_the_same_name_is_not_marked_or_evicted_from_a_stale_cache() {
    let objects = vec![
        (NODES, gpu_node("gpu-1", 8, 8)),
        (NAMESPACES, namespace("ml", true)),
        (PODS, pod("ml", "train-0", "gpu-1", true, true)),
    ];
    let mut world = World::start(policy(|p| p.controller.pods.evict_pods = true), objects).await;
    // The new pod, silently (no watch event reaches the cache).
    let mut recreated = pod("ml", "train-0", "gpu-1", true, false);
    recreated["metadata"]["uid"] = json!("uid-ml-train-0-new");
    world.fake.set(PODS, recreated);
    let report = world.pass(0).await;
    assert!(report.marked.is_empty(), "{report:?}");
    assert!(report.evicted.is_empty(), "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0].body["metadata"]["uid"], "uid-ml-train-0");
    assert_eq!(
        writes[1].body["deleteOptions"]["preconditions"]["uid"],
        "uid-ml-train-0"
    );
    let current = world.fake.object(PODS, "ml/train-0");
    assert_eq!(current["metadata"]["uid"], "uid-ml-train-0-new");
    assert_eq!(
        current["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}]),
        "the new pod was marked"
    );
    assert_eq!(world.metrics.pods_marked.get(), 0);
    assert_eq!(world.metrics.pods_evicted.get(), 0);
    assert_eq!(world.metrics.reconcile_errors.get(), 0);
    assert!(world.fake.events().is_empty());
    // Once the cache has the new pod (healthy, on a healthy node), nothing is done to it; the
    // old pod's eviction token was given back.
    world.fake.put(PODS, world.fake.object(PODS, "ml/train-0"));
    world
        .pod_cached("train-0", |pod| pod.uid == "uid-ml-train-0-new")
        .await;
    world.fake.clear_requests();
    let report = world.pass(15).await;
    assert_eq!(report, PassReport::default());
    assert!(world.fake.writes().is_empty());
}

/// A rank of the 4-rank Indexed Job `job` (uid `uid-<job>`), annotated a gang by the mutation,
/// created at `created`.
fn rank(job: &str, index: u32, name: &str, node: &str, unhealthy: bool, created: &str) -> Value {
    let mut pod = pod("ml", name, node, true, unhealthy);
    pod["metadata"]["creationTimestamp"] = json!(created);
    pod["metadata"]["labels"] = json!({
        "batch.kubernetes.io/controller-uid": format!("uid-{job}"),
        "batch.kubernetes.io/job-name": job,
    });
    pod["metadata"]["annotations"] = json!({
        "gpu-guard.io/gang": "true",
        "batch.kubernetes.io/job-completion-index": index.to_string(),
    });
    pod["metadata"]["ownerReferences"][0]["name"] = json!(job);
    pod["metadata"]["ownerReferences"][0]["uid"] = json!(format!("uid-{job}"));
    pod
}

const PEER_MESSAGE: &str = "pod train-2 of the same gang, on node gpu-3, was hit by a device \
                            failure; gpu-guard marks this peer so its failure, which follows \
                            from it, is retried";

/// A torchrun gang as one Indexed Job (4 ranks on 4 nodes); rank 2's GPU fails. Its pod gets
/// `DeviceFailure`, its three running peers `PeerDeviceFailure` in the same pass, before they
/// fail of the collective's error. A pod of another gang on rank 2's node, a rank of an earlier
/// attempt that has failed already, and a replacement created after the mark get nothing.
#[tokio::test]
async fn the_running_peers_of_a_gang_pod_hit_by_a_device_failure_are_marked() {
    const BEFORE: &str = "2027-01-15T07:00:00Z";
    let mut old_rank = rank(
        "train",
        1,
        "train-1-old",
        "gpu-2",
        false,
        "2027-01-15T06:00:00Z",
    );
    old_rank["status"]["phase"] = json!("Failed");
    let mut objects = vec![
        (NAMESPACES, namespace("ml", true)),
        (PODS, rank("other", 0, "other-0", "gpu-3", false, BEFORE)),
        (PODS, old_rank),
    ];
    for index in 0..4 {
        let node = format!("gpu-{}", index + 1);
        objects.push((NODES, gpu_node(&node, 8, 8)));
        let name = format!("train-{index}");
        objects.push((PODS, rank("train", index, &name, &node, index == 2, BEFORE)));
    }
    let mut world = World::start(policy(|_| {}), objects).await;

    let report = world.pass(0).await;
    assert_eq!(report.marked, ["ml/train-2"]);
    assert_eq!(
        report.peers_marked,
        ["ml/train-0", "ml/train-1", "ml/train-3"]
    );
    assert!(report.errors.is_empty(), "{report:?}");
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 4, "{writes:?}");
    assert_eq!(writes[0].path, "/api/v1/namespaces/ml/pods/train-2/status");
    let mut peer_paths: Vec<&str> = writes[1..].iter().map(|w| w.path.as_str()).collect();
    peer_paths.sort();
    assert_eq!(
        peer_paths,
        [
            "/api/v1/namespaces/ml/pods/train-0/status",
            "/api/v1/namespaces/ml/pods/train-1/status",
            "/api/v1/namespaces/ml/pods/train-3/status",
        ]
    );
    let to_train_0 = writes
        .iter()
        .find(|w| w.path.ends_with("/train-0/status"))
        .expect("train-0's mark");
    assert_eq!(
        to_train_0.content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    assert_eq!(
        to_train_0.body,
        json!({"metadata": {"uid": "uid-ml-train-0"}, "status": {"conditions": [{
            "type": "gpu-guard.io/PeerDeviceFailure",
            "status": "True",
            "reason": "PeerDeviceFailure",
            "message": PEER_MESSAGE,
            "lastTransitionTime": "2027-01-15T08:00:00Z",
        }]}})
    );
    // The peers keep their other conditions and are not given DeviceFailure.
    let types = |name: &str| -> Vec<String> {
        world.fake.object(PODS, &format!("ml/{name}"))["status"]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .map(|c| c["type"].as_str().expect("a type").to_owned())
            .collect()
    };
    assert_eq!(types("train-2"), ["Ready", "gpu-guard.io/DeviceFailure"]);
    for peer in ["train-0", "train-1", "train-3"] {
        assert_eq!(
            types(peer),
            ["Ready", "gpu-guard.io/PeerDeviceFailure"],
            "{peer}"
        );
    }
    for untouched in ["other-0", "train-1-old"] {
        assert_eq!(types(untouched), ["Ready"], "{untouched}");
    }
    assert_eq!(world.metrics.pods_marked.get(), 1);
    assert_eq!(world.metrics.peers_marked.get(), 3);
    eventually("four Events", || world.fake.events().len() == 4).await;
    let mut events: Vec<(String, String, String)> = world.fake.events();
    events.sort();
    assert_eq!(events[0].0, "DeviceFailureMarked");
    assert_eq!(events[0].1, "train-2");
    for (event, peer) in events[1..].iter().zip(["train-0", "train-1", "train-3"]) {
        assert_eq!(
            (event.0.as_str(), event.1.as_str()),
            ("PeerDeviceFailureMarked", peer)
        );
        assert_eq!(event.2, PEER_MESSAGE);
    }

    // Rank 2 fails and is replaced; rank 3 fails too and its replacement (a new index-3 pod,
    // created after the mark) starts. Later passes mark nothing more: the replacements did not
    // run beside the failed pod.
    world.pod_cached("train-3", |pod| pod.peer_marked).await;
    let mut failed = world.fake.object(PODS, "ml/train-2");
    failed["status"]["phase"] = json!("Failed");
    world.fake.put(PODS, failed);
    let mut failed = world.fake.object(PODS, "ml/train-3");
    failed["status"]["phase"] = json!("Failed");
    world.fake.put(PODS, failed);
    let after = "2027-01-15T08:00:30Z";
    world
        .fake
        .put(PODS, rank("train", 2, "train-2-b", "gpu-1", false, after));
    world
        .fake
        .put(PODS, rank("train", 3, "train-3-b", "gpu-4", false, after));
    world.pod_cached("train-3-b", |_| true).await;
    world
        .pod_cached("train-2", |pod| pod.phase.as_deref() == Some("Failed"))
        .await;
    world.fake.clear_requests();
    let report = world.pass(60).await;
    assert_eq!(report, PassReport::default());
    assert!(world.fake.writes().is_empty());
}

/// A gang pod marked only because its node is degraded, running on a healthy GPU, leaves its
/// peers alone; once it fails, the peers that ran beside it are marked. A pod not annotated a
/// gang (its Job did not get the peer rule) never has its peers marked.
#[tokio::test]
async fn peers_are_marked_only_once_a_gang_pods_failure_is_real() {
    const BEFORE: &str = "2027-01-15T07:00:00Z";
    let mut plain = pod("ml", "solo-0", "gpu-1", true, false);
    plain["metadata"]["labels"] = json!({"batch.kubernetes.io/controller-uid": "uid-solo"});
    let objects = vec![
        (NODES, gpu_node("gpu-1", 8, 7)),
        (NODES, gpu_node("gpu-2", 8, 8)),
        (NAMESPACES, namespace("ml", true)),
        (PODS, rank("train", 0, "train-0", "gpu-1", false, BEFORE)),
        (PODS, rank("train", 1, "train-1", "gpu-2", false, BEFORE)),
        (PODS, plain),
        (PODS, {
            let mut peer = pod("ml", "solo-1", "gpu-2", true, false);
            peer["metadata"]["labels"] = json!({"batch.kubernetes.io/controller-uid": "uid-solo"});
            peer
        }),
    ];
    let mut world = World::start(policy(|_| {}), objects).await;
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert_eq!(report.marked, ["ml/solo-0", "ml/train-0"]);
    assert!(report.peers_marked.is_empty(), "{report:?}");

    world.pod_cached("train-0", |pod| pod.marked).await;
    for name in ["train-0", "solo-0"] {
        let mut failed = world.fake.object(PODS, &format!("ml/{name}"));
        failed["status"]["phase"] = json!("Failed");
        world.fake.put(PODS, failed);
        world
            .pod_cached(name, |pod| pod.phase.as_deref() == Some("Failed"))
            .await;
    }
    let report = world.pass(135).await;
    assert_eq!(report.peers_marked, ["ml/train-1"], "{report:?}");
    assert!(report.marked.is_empty());
    let solo_1 = world.fake.object(PODS, "ml/solo-1");
    assert_eq!(
        solo_1["status"]["conditions"].as_array().map(Vec::len),
        Some(1)
    );
}

/// In a dry run the peers are marked as they would be: each status patch sent with
/// `dryRun=All`, nothing stored, Events saying "dry run: would mark", the metric counting; a
/// later pass does not send them again although the cache never shows the marks.
#[tokio::test]
async fn in_a_dry_run_peer_marks_are_sent_with_dry_run_and_not_repeated() {
    const BEFORE: &str = "2027-01-15T07:00:00Z";
    let mut objects = vec![(NAMESPACES, namespace("ml", true))];
    for index in 0..3 {
        let node = format!("gpu-{}", index + 1);
        objects.push((NODES, gpu_node(&node, 8, 8)));
        let name = format!("train-{index}");
        objects.push((PODS, rank("train", index, &name, &node, index == 0, BEFORE)));
    }
    let mut world = World::start(policy(|p| p.controller.dry_run = true), objects).await;
    let report = world.pass(0).await;
    assert_eq!(report.marked, ["ml/train-0"]);
    assert_eq!(report.peers_marked, ["ml/train-1", "ml/train-2"]);
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 3, "{writes:?}");
    for write in &writes {
        assert_eq!(write.param("dryRun"), Some("All"), "{write:?}");
    }
    for name in ["train-1", "train-2"] {
        assert_eq!(
            world.fake.object(PODS, &format!("ml/{name}"))["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}]),
            "a dry-run status patch is not stored"
        );
    }
    eventually("three Events", || world.fake.events().len() == 3).await;
    let events = world.fake.events();
    assert!(
        events
            .iter()
            .all(|(_, _, note)| note.starts_with("dry run: would mark: ")),
        "{events:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|(reason, _, _)| reason == "PeerDeviceFailureMarked")
            .count(),
        2
    );
    assert_eq!(world.metrics.peers_marked.get(), 2);

    world.fake.clear_requests();
    let report = world.pass(15).await;
    assert_eq!(report, PassReport::default());
    assert!(world.fake.writes().is_empty());
}
