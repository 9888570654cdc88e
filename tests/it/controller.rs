//! The controller as a whole against the fake API server (`tests/support`): the RBAC rules it
//! publishes allow every call it makes, two running replicas (election, admin port, metrics,
//! Lease release on shutdown), and the command's failure without a kubeconfig.
//!
//! The node, pod and leadership behaviour is tested in `controller_nodes.rs`,
//! `controller_pods.rs` and `controller_lease.rs`.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gpu_guard_controller::run::{self, ControllerOptions, LeaderElection};
use gpu_guard_controller::{LEASE_RULES, RBAC_RULES};
use gpu_guard_runtime::cluster::RbacRule;
use hyper::Method;
use serde_json::json;
use support::controller::{
    World, at, gpu_node, has_our_taint, lease_spec, lock, namespace, pod, pod_world, policy,
};
use support::fake_api::{DAEMONSETS, Fake, Logged, NAMESPACES, NODES, PODS};
use support::{DEADLINE, eventually};

/// The RBAC `(group, resource, verb)` a request needs.
pub(crate) fn rbac_need(request: &Logged) -> (String, String, &'static str) {
    let path = request.path.trim_start_matches('/');
    let (group, rest) = if let Some(rest) = path.strip_prefix("api/v1/") {
        ("", rest)
    } else {
        let rest = path.strip_prefix("apis/").expect("an API path");
        let mut parts = rest.splitn(3, '/');
        let group = parts.next().expect("group");
        let _version = parts.next();
        (group, parts.next().unwrap_or_default())
    };
    let mut segments: Vec<&str> = rest.split('/').collect();
    if segments.len() > 2 && segments[0] == "namespaces" {
        segments.drain(..2);
    }
    let resource = match segments.as_slice() {
        [resource, _, subresource] => format!("{resource}/{subresource}"),
        [resource, ..] => (*resource).to_owned(),
        [] => unreachable!("split yields one segment at least"),
    };
    let named = segments.len() > 1;
    let verb = match (&request.method, named) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if request.query.get("watch").map(String::as_str) == Some("true") => {
            "watch"
        }
        (&Method::GET, false) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        (method, _) => panic!("unexpected method {method}"),
    };
    (group.to_owned(), resource, verb)
}

/// Whether one of `rules` allows the request.
pub(crate) fn allowed_by(request: &Logged, rules: &[RbacRule]) -> bool {
    let (group, resource, verb) = rbac_need(request);
    let name = named_object(request);
    rules
        .iter()
        .any(|rule| rule.allows(&group, &resource, verb, name))
}

/// The name of the object a request names (`…/leases/<name>`), if any.
fn named_object(request: &Logged) -> Option<&str> {
    let path = request.path.trim_start_matches('/');
    let rest = match path.strip_prefix("api/v1/") {
        Some(rest) => rest,
        None => path.strip_prefix("apis/")?.splitn(3, '/').nth(2)?,
    };
    let mut segments: Vec<&str> = rest.split('/').collect();
    if segments.len() > 2 && segments[0] == "namespaces" {
        segments.drain(..2);
    }
    segments.get(1).copied()
}

/// Every request the fake received is allowed by the controller's published RBAC rules: the
/// ClusterRole's, or the namespaced Role's (Leases, only the controller's own for get/update).
fn assert_rbac_allows(requests: &[Logged]) {
    assert!(!requests.is_empty());
    for request in requests {
        let (group, resource, verb) = rbac_need(request);
        let cluster_wide = allowed_by(request, &RBAC_RULES);
        let in_namespace =
            request.path.contains("/namespaces/gpu-guard/") && allowed_by(request, &LEASE_RULES);
        assert!(
            cluster_wide || in_namespace,
            "{verb} {group}/{resource} ({} {}) is not in controller::RBAC_RULES or LEASE_RULES",
            request.method,
            request.path
        );
    }
}

#[tokio::test]
async fn the_published_rbac_rules_allow_every_call_the_controller_makes() {
    let mut world =
        World::start(policy(|p| p.controller.pods.evict_pods = true), pod_world()).await;
    // A conflict, so the node is read too.
    world.fake.conflict_once(|node| {
        node["metadata"]["labels"]["touched"] = json!("yes");
    });
    world.pass(0).await;
    world.pass(120).await;
    let requests = world.fake.requests();
    let kinds: std::collections::BTreeSet<(String, String, &str)> =
        requests.iter().map(rbac_need).collect();
    for needed in [
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "pods", "list"),
        ("", "pods/status", "patch"),
        ("", "pods/eviction", "create"),
        ("", "namespaces", "watch"),
        ("events.k8s.io", "events", "create"),
    ] {
        assert!(
            kinds.contains(&(needed.0.to_owned(), needed.1.to_owned(), needed.2)),
            "{needed:?} not exercised: {kinds:?}"
        );
    }
    assert_rbac_allows(&requests);

    // Leases.
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let now = Instant::now();
    assert!(a.try_acquire_or_renew(at(0), now).await.expect("acquire"));
    assert_eq!(lock_name(&fake), gpu_guard_core::wellknown::LEASE_NAME);
    assert!(a.try_acquire_or_renew(at(1), now).await.expect("renew"));
    a.release(at(2)).await.expect("release");
    assert_rbac_allows(&fake.requests());
}

/// The name of the one Lease in the fake.
fn lock_name(fake: &Fake) -> String {
    let state = fake.lock();
    let names: Vec<&String> = state.leases.keys().collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].rsplit('/').next().expect("a name").to_owned()
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let response = reqwest::get(format!("http://{addr}{path}"))
        .await
        .expect("admin request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

#[tokio::test]
async fn the_running_controller_leads_acts_serves_metrics_and_releases_its_lease() {
    let fake = Fake::start().await;
    fake.put(NODES, gpu_node("gpu-1", 8, 0));
    fake.put(NAMESPACES, namespace("ml", true));
    fake.put(PODS, pod("ml", "sick", "gpu-1", true, true));
    let options = |identity: &str| ControllerOptions {
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        leader_election: Some(LeaderElection {
            namespace: "gpu-guard".to_owned(),
            name: "gpu-guard-controller".to_owned(),
            identity: identity.to_owned(),
            duration: Duration::from_secs(3),
        }),
        identity: Some(identity.to_owned()),
    };
    let first = run::start(fake.config(), policy(|_| {}), options("replica-a"))
        .await
        .expect("start");
    eventually("the first replica leads", || {
        first.metrics.leader.get() == 1
    })
    .await;
    let second = run::start(fake.config(), policy(|_| {}), options("replica-b"))
        .await
        .expect("start");

    // The leader marks the pod; the other replica, ready too, does nothing.
    eventually("the pod marked", || first.metrics.pods_marked.get() == 1).await;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, body) = get(second.admin_addr, "/readyz").await;
        if status == 200 {
            assert_eq!(body, "ready\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second replica never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(second.metrics.leader.get(), 0);
    assert_eq!(second.metrics.passes.get(), 0);
    let (status, body) = get(first.admin_addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, metrics) = get(first.admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("gpu_guard_controller_pods_marked_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_guard_controller_leader 1"),
        "{metrics}"
    );
    let marks = fake
        .writes()
        .iter()
        .filter(|w| w.path.ends_with("/status"))
        .count();
    assert_eq!(marks, 1);

    // The leader stops: it releases the Lease and the other replica takes over at once.
    first.shutdown().await;
    assert_eq!(lease_spec(&fake).get("holderIdentity"), None);
    eventually("the second replica leads", || {
        second.metrics.leader.get() == 1
    })
    .await;
    second.shutdown().await;
}

#[tokio::test]
async fn the_leader_renews_its_lease_every_retry_period() {
    let fake = Fake::start().await;
    let options = ControllerOptions {
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        leader_election: Some(LeaderElection {
            namespace: "gpu-guard".to_owned(),
            name: "gpu-guard-controller".to_owned(),
            identity: "replica-a".to_owned(),
            // Renew deadline 2 s, retry period 400 ms.
            duration: Duration::from_secs(3),
        }),
        identity: Some("replica-a".to_owned()),
    };
    let running = run::start(fake.config(), policy(|_| {}), options)
        .await
        .expect("start");
    eventually("leading", || running.metrics.leader.get() == 1).await;
    let renewals = || {
        fake.requests()
            .iter()
            .filter(|r| r.method == Method::PUT && r.path.contains("/leases/"))
            .count()
    };
    let before = renewals();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let within_deadline = renewals() - before;
    // Every 400 ms: about five renewals within the 2 s deadline (two at a third of the lease,
    // as before; at least three leaves room for a loaded machine).
    assert!(
        (3..=6).contains(&within_deadline),
        "{within_deadline} renewals in 2 s"
    );
    running.shutdown().await;
}

/// The event-to-write path of the mark: a pod whose GPU the kubelet reports unhealthy is
/// marked from its own watch event, while the loop is held up in a node write (the taint patch
/// of another node, held 4 s by a slow API server) and without waiting for the debounce.
#[tokio::test]
async fn a_pod_is_marked_from_its_watch_event_while_a_node_write_hangs() {
    let fake = Fake::start().await;
    fake.put(NODES, gpu_node("gpu-1", 8, 7));
    fake.put(NODES, gpu_node("gpu-2", 8, 8));
    fake.put(NAMESPACES, namespace("ml", true));
    fake.put(PODS, pod("ml", "train-0", "gpu-2", true, false));
    fake.put(PODS, pod("ml", "cpu-0", "gpu-2", false, false));
    fake.lock().node_patch_delay = Some(Duration::from_secs(4));
    let policy = policy(|p| {
        p.controller.node_health.degraded_for_seconds = 0;
        p.controller.node_health.max_tainted_percent = 100;
        p.controller.resync_seconds = 3600;
    });
    let running = run::start(fake.config(), policy, without_election())
        .await
        .expect("start");
    let taint_sent = || {
        fake.requests()
            .iter()
            .any(|r| r.method == Method::PATCH && r.path == "/api/v1/nodes/gpu-1")
    };
    eventually("the taint patch of gpu-1 is sent (and held)", taint_sent).await;
    // The fake sends a change only to the watches open then: wait for the pod watch, not only
    // for its list.
    eventually("the pod watch open", || fake.open_watches(PODS) > 0).await;
    let reported = Instant::now();
    fake.put(PODS, pod("ml", "train-0", "gpu-2", true, true));
    let marked = || {
        fake.requests()
            .iter()
            .any(|r| r.path == "/api/v1/namespaces/ml/pods/train-0/status")
    };
    eventually("train-0 is marked", marked).await;
    let latency = reported.elapsed();
    // The taint patch is applied only when its 4 s are up: the mark did not wait for it.
    assert!(
        !has_our_taint(&fake.object(NODES, "gpu-1")),
        "the mark came after the node write ({latency:?})"
    );
    eprintln!("event-to-write latency of the mark: {latency:?}");
    let patch = fake
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v1/namespaces/ml/pods/train-0/status")
        .expect("the mark");
    assert_eq!(
        patch.body["status"]["conditions"][0]["reason"],
        "UnhealthyDevice"
    );
    // The one GPU pod is cached and counted (once the held pass is over); the CPU pod is not.
    eventually("one device pod counted", || {
        running.metrics.device_pods.get() == 1
    })
    .await;
    running.shutdown().await;
}

/// Eight pods of one node hit at once (NVIDIA's device plugin marks every device of a node
/// unhealthy together on some errors), with status patches that take 50 ms each and an Event
/// endpoint that takes 400 ms per Event: the marks go out together, not one patch and one Event
/// after the other. Serially, the eighth patch would arrive after seven Events were answered.
#[tokio::test]
async fn eight_pods_hit_at_once_are_marked_together_without_waiting_for_their_events() {
    let fake = Fake::start().await;
    fake.put(NODES, gpu_node("gpu-1", 8, 8));
    fake.put(NAMESPACES, namespace("ml", true));
    let names: Vec<String> = (0..8).map(|i| format!("train-{i}")).collect();
    for name in &names {
        fake.put(PODS, pod("ml", name, "gpu-1", true, false));
    }
    let policy = policy(|p| p.controller.resync_seconds = 3600);
    let running = run::start(fake.config(), policy, without_election())
        .await
        .expect("start");
    eventually("eight device pods cached", || {
        running.metrics.device_pods.get() == 8
    })
    .await;
    // The fake sends a change only to the watches open then: wait for the pod watch, not only
    // for its list.
    eventually("the pod watch open", || fake.open_watches(PODS) > 0).await;
    {
        let mut state = fake.lock();
        state.status_delay = Some(Duration::from_millis(50));
        state.event_delay = Some(Duration::from_millis(400));
    }
    for name in &names {
        fake.put(PODS, pod("ml", name, "gpu-1", true, true));
    }
    let is_mark = |r: &Logged| r.method == Method::PATCH && r.path.ends_with("/status");
    let is_event_post = |r: &Logged| r.is_event() && r.method == Method::POST;
    eventually("eight marks answered and an Event answered", || {
        let requests = fake.requests();
        requests
            .iter()
            .filter(|r| is_mark(r) && r.answered.is_some())
            .count()
            == 8
            && requests
                .iter()
                .any(|r| is_event_post(r) && r.answered.is_some())
    })
    .await;
    let requests = fake.requests();
    let marks: Vec<&Logged> = requests.iter().filter(|r| is_mark(r)).collect();
    let marked: std::collections::BTreeSet<&str> = marks
        .iter()
        .map(|r| r.path.split('/').nth(6).expect("a pod name"))
        .collect();
    assert_eq!(marked.len(), 8, "each pod marked once: {marked:?}");
    let first_event_answered = requests
        .iter()
        .filter(|r| is_event_post(r))
        .filter_map(|r| r.answered)
        .min()
        .expect("an Event answered");
    let last_mark_sent = marks.iter().map(|r| r.received).max().expect("marks");
    assert!(
        last_mark_sent < first_event_answered,
        "the eighth mark arrived {:?} after the first Event was answered",
        last_mark_sent - first_event_answered
    );
    // The patches overlap: one arrived while an earlier one was still being answered.
    let overlapping = marks.iter().any(|a| {
        marks
            .iter()
            .any(|b| a.received < b.received && b.received < a.answered.expect("answered"))
    });
    assert!(overlapping, "the marks were sent one after the other");
    // Nothing is lost: every mark is told of in an Event, once the slow endpoint has taken them.
    eventually("eight Events published", || {
        fake.events()
            .iter()
            .filter(|(reason, _, _)| reason == "DeviceFailureMarked")
            .count()
            == 8
    })
    .await;
    assert_eq!(running.metrics.pods_marked.get(), 8);
    assert_eq!(running.metrics.events_dropped.get(), 0);
    running.shutdown().await;
}

/// A torchrun gang as one Indexed Job: when rank 2's GPU is reported unhealthy, the event path
/// marks its pod and then, without waiting for a pass, its three running peers (they fail a
/// little later, of the collective's error, and must carry the condition by then). A gang pod
/// of another Job on the same node is not touched.
#[tokio::test]
async fn the_peers_of_a_gang_pod_are_marked_from_its_watch_event() {
    let rank = |job: &str, index: u32, node: &str, unhealthy: bool| {
        let name = format!("{job}-{index}");
        let mut pod = pod("ml", &name, node, true, unhealthy);
        pod["metadata"]["creationTimestamp"] = json!("2027-01-15T07:00:00Z");
        pod["metadata"]["labels"] =
            json!({"batch.kubernetes.io/controller-uid": format!("uid-{job}")});
        pod["metadata"]["annotations"] = json!({"gpu-guard.io/gang": "true",
            "batch.kubernetes.io/job-completion-index": index.to_string()});
        pod
    };
    let fake = Fake::start().await;
    fake.put(NAMESPACES, namespace("ml", true));
    for index in 0..4 {
        let node = format!("gpu-{index}");
        fake.put(NODES, gpu_node(&node, 8, 8));
        fake.put(PODS, rank("train", index, &node, false));
    }
    fake.put(PODS, rank("other", 0, "gpu-2", false));
    let policy = policy(|p| p.controller.resync_seconds = 3600);
    let running = run::start(fake.config(), policy, without_election())
        .await
        .expect("start");
    eventually("five device pods cached", || {
        running.metrics.device_pods.get() == 5
    })
    .await;
    // The fake sends a change only to the watches open then: wait for the pod watch, not only
    // for its list.
    eventually("the pod watch open", || fake.open_watches(PODS) > 0).await;
    let reported = Instant::now();
    fake.put(PODS, rank("train", 2, "gpu-2", true));
    let conditions = |name: &str| -> Vec<String> {
        fake.object(PODS, &format!("ml/{name}"))["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["type"].as_str().map(str::to_owned))
            .collect()
    };
    eventually("the three peers marked", || {
        ["train-0", "train-1", "train-3"]
            .iter()
            .all(|peer| conditions(peer).contains(&"gpu-guard.io/PeerDeviceFailure".to_owned()))
    })
    .await;
    assert_eq!(
        conditions("train-2"),
        ["Ready", "gpu-guard.io/DeviceFailure"]
    );
    assert_eq!(conditions("other-0"), ["Ready"]);
    // Marked from the watch event: a pass over the changed pods would start a second after the
    // event, the resync is an hour away.
    let requests = fake.requests();
    let mark_of = |name: &str| {
        requests
            .iter()
            .find(|r| r.path == format!("/api/v1/namespaces/ml/pods/{name}/status"))
            .map(|r| r.received)
            .expect("a mark")
    };
    for peer in ["train-0", "train-1", "train-3"] {
        assert!(
            mark_of(peer) > mark_of("train-2"),
            "{peer} before the failed pod"
        );
        let latency = mark_of(peer) - reported;
        assert!(
            latency < Duration::from_millis(900),
            "{peer} after {latency:?}"
        );
        eprintln!("event-to-write latency of the peer mark of {peer}: {latency:?}");
    }
    // Counted once each mark is answered (the fake stores a patch before it answers).
    eventually("three peer marks counted", || {
        running.metrics.peers_marked.get() == 3
    })
    .await;
    assert_eq!(running.metrics.pods_marked.get(), 1);
    eventually("three PeerDeviceFailureMarked Events", || {
        fake.events()
            .iter()
            .filter(|(reason, _, _)| reason == "PeerDeviceFailureMarked")
            .count()
            == 3
    })
    .await;
    running.shutdown().await;
}

/// One replica, no election, the admin port on any free port.
fn without_election() -> ControllerOptions {
    ControllerOptions {
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        leader_election: None,
        identity: Some("test-1".to_owned()),
    }
}

/// A DaemonSet in `gpu-operator` whose pod template is `template`.
fn daemonset(name: &str, template: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
           "metadata": {"namespace": "gpu-operator", "name": name},
           "spec": {"selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": template}}})
}

#[tokio::test]
async fn at_start_the_gpu_daemonsets_that_do_not_tolerate_the_taint_are_counted() {
    let fake = Fake::start().await;
    let containers = json!([{"name": "c", "image": "i"}]);
    // NVIDIA's device plugin manifest: tolerates only nvidia.com/gpu.
    fake.put(
        DAEMONSETS,
        daemonset(
            "nvidia-device-plugin",
            json!({"containers": containers, "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}),
        ),
    );
    fake.put(
        DAEMONSETS,
        daemonset(
            "dcgm-exporter",
            json!({"containers": containers,
                   "nodeSelector": {"nvidia.com/gpu.present": "true"},
                   "tolerations": [{"key": "gpu-guard.io/device-degraded", "operator": "Exists"}]}),
        ),
    );
    fake.put(
        DAEMONSETS,
        daemonset("kube-proxy", json!({"containers": containers})),
    );
    let running = run::start(fake.config(), policy(|_| {}), without_election())
        .await
        .expect("start");
    eventually("the DaemonSets checked", || {
        running.metrics.daemonsets_not_tolerating.get() == 1
    })
    .await;
    let (status, metrics) = get(running.admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("gpu_guard_controller_daemonsets_not_tolerating 1"),
        "{metrics}"
    );
    // Listed once, not watched.
    assert_eq!(fake.lists(DAEMONSETS).len(), 1);
    assert!(fake.watches(DAEMONSETS).is_empty());
    assert_rbac_allows(&fake.requests());
    running.shutdown().await;

    // An API server that refuses the list: -1, and the controller runs on.
    let refusing = Fake::start().await;
    refusing.unserve(DAEMONSETS);
    let running = run::start(refusing.config(), policy(|_| {}), without_election())
        .await
        .expect("start");
    eventually("the failed list reported", || {
        running.metrics.daemonsets_not_tolerating.get() == -1
    })
    .await;
    eventually("caches synced", || running.metrics.caches_synced.get() == 1).await;
    running.shutdown().await;
}

#[test]
fn the_command_fails_clearly_without_a_usable_kubeconfig() {
    let report = support::run_in_process([
        "gpu-guard",
        "controller",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--log-level",
        "off",
    ]);
    assert_eq!(report.exit_code, 1);
    assert!(
        report.stderr.contains("/nonexistent/kubeconfig") && report.stderr.contains("--kubeconfig"),
        "{}",
        report.stderr
    );
}
