//! The cluster caches against a fake API server on a loopback port: the real kube client,
//! watcher and reflector code paths, over plain HTTP.
//!
//! The fake (`tests/support/fake_api.rs`, shared with the controller tests) answers what kube's
//! watcher asks: the list (`GET <collection>?limit=500`) with a `*List` carrying
//! `metadata.resourceVersion`, and the watch
//! (`?watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=N`) as a stream of
//! newline-delimited watch events that a test pushes. A test can hold lists or watches
//! unanswered, end the watch streams, and read the log of requests.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use gpu_guard_core::devices::Lookup;
use gpu_guard_core::guard::{ClusterView, KnownNode};
use gpu_guard_runtime::cluster::{self, CacheStatus, ClusterCache, ClusterError};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use support::fake_api::{CLAIM_TEMPLATES, CLAIMS, CLASSES, DEVICE_CLASSES, Fake, NODES};
use support::{DEADLINE, eventually};

// ---------------------------------------------------------------------------------------------
// Objects and helpers

fn priority_class(name: &str, value: i32, global_default: bool) -> Value {
    json!({
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "annotations": {"meta.helm.sh/release-name": "infra"},
            "managedFields": [{"manager": "helm", "operation": "Update", "apiVersion": "scheduling.k8s.io/v1"}],
        },
        "value": value,
        "globalDefault": global_default,
        "description": "a long description nobody needs in the cache",
        "preemptionPolicy": "PreemptLowerPriority",
    })
}

fn gpu_node(name: &str, gpus: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "labels": {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1"}],
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "providerID": format!("fake://{name}"),
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": gpus},
            "allocatable": {"cpu": "63", "memory": "500Gi", "nvidia.com/gpu": gpus},
            "conditions": [{"type": "Ready", "status": "True"}],
            "images": [{"names": ["registry.example/cuda:12"], "sizeBytes": 1_000_000_000u64}],
            "nodeInfo": {"architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "c",
                         "kernelVersion": "k", "kubeProxyVersion": "", "kubeletVersion": "v1.36.0",
                         "machineID": "m", "operatingSystem": "linux", "osImage": "o",
                         "systemUUID": "s"},
        },
    })
}

fn node_object(cache: &ClusterCache, name: &str) -> Option<Arc<Node>> {
    match cache.node(name)? {
        KnownNode::Object(node) => Some(node),
        KnownNode::ListedGpuNode => panic!("the cache lists no nodes by name only"),
    }
}

fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref()?.get(key).cloned()
}

fn gpus(node: &Node) -> Option<String> {
    let capacity = node.status.as_ref()?.capacity.as_ref()?;
    Some(capacity.get("nvidia.com/gpu")?.0.clone())
}

fn status(cache: &ClusterCache, resource: &str) -> CacheStatus {
    cache
        .status()
        .into_iter()
        .find(|status| status.resource == resource)
        .expect("a status for each resource")
}

/// A fake with three PriorityClasses and one GPU node, and a cache on it, synced and watching.
async fn synced_cache() -> (Fake, ClusterCache) {
    let fake = Fake::start().await;
    fake.set(CLASSES, priority_class("batch", 500, false));
    fake.set(CLASSES, priority_class("stale", 1, false));
    fake.set(NODES, gpu_node("gpu-1", "8"));
    let cache = ClusterCache::start(fake.client());
    assert!(cache.wait_synced(DEADLINE).await, "the cache did not sync");
    eventually("both watches open", || {
        fake.open_watches(CLASSES) == 1 && fake.open_watches(NODES) == 1
    })
    .await;
    (fake, cache)
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn every_call_of_the_caches_is_allowed_by_their_rbac_rules() {
    let (fake, cache) = synced_cache().await;
    let requests = fake.requests();
    // Lists and watches of each cache: PriorityClasses, Nodes and the DRA kinds.
    assert!(
        requests.len() >= 2 * cluster::RBAC_RULES.len(),
        "{requests:?}"
    );
    for request in &requests {
        assert!(
            crate::controller::allowed_by(request, &cluster::RBAC_RULES),
            "{} {} is not in cluster::RBAC_RULES",
            request.method,
            request.path
        );
    }
    drop(cache);
}

#[tokio::test]
async fn synced_only_after_both_lists_then_answers_from_the_cache() {
    let fake = Fake::start().await;
    fake.set(CLASSES, priority_class("batch", 500, false));
    fake.set(CLASSES, priority_class("high-default", 1000, true));
    fake.set(CLASSES, priority_class("low-default", 100, true));
    fake.set(NODES, gpu_node("gpu-1", "8"));
    fake.hold_lists(CLASSES, true);
    fake.hold_lists(NODES, true);

    let cache = ClusterCache::start(fake.client());
    eventually("both lists requested", || {
        fake.lists(CLASSES).len() == 1 && fake.lists(NODES).len() == 1
    })
    .await;
    assert!(!cache.synced());
    assert!(!cache.wait_synced(Duration::from_millis(50)).await);
    assert!(
        cache
            .status()
            .iter()
            .filter(|status| ["priorityclasses", "nodes"].contains(&status.resource))
            .all(|status| !status.synced)
    );
    // Built-in classes are known without a list; nothing else is.
    assert_eq!(
        cache.priority_class("system-node-critical"),
        Some(2_000_001_000)
    );
    assert_eq!(cache.priority_class("batch"), None);
    assert!(cache.node("gpu-1").is_none());

    // PriorityClasses listed, Nodes not yet: not synced.
    fake.hold_lists(CLASSES, false);
    eventually("the PriorityClass cache synced", || {
        status(&cache, "priorityclasses").synced
    })
    .await;
    assert!(!cache.synced());
    assert!(!status(&cache, "nodes").synced);
    assert_eq!(cache.priority_class("batch"), Some(500));

    fake.hold_lists(NODES, false);
    assert!(cache.wait_synced(DEADLINE).await);
    assert!(cache.synced());

    // What kube asked: a paged list, then a watch from the list's resourceVersion.
    let list = &fake.lists(CLASSES)[0];
    assert_eq!(list.param("limit"), Some("500"));
    assert_eq!(list.param("resourceVersion"), None);
    eventually("both watches requested", || {
        fake.watches(CLASSES).len() == 1 && fake.watches(NODES).len() == 1
    })
    .await;
    let watch = &fake.watches(CLASSES)[0];
    assert_eq!(watch.param("allowWatchBookmarks"), Some("true"));
    assert_eq!(watch.param("timeoutSeconds"), Some("290"));
    assert_eq!(watch.param("resourceVersion"), Some("5"));

    // PriorityClasses: from the store, built-ins as a fallback, the lowest of two defaults.
    assert_eq!(cache.priority_class("batch"), Some(500));
    assert_eq!(cache.priority_class("high-default"), Some(1000));
    assert_eq!(
        cache.priority_class("system-cluster-critical"),
        Some(2_000_000_000)
    );
    assert_eq!(cache.priority_class("no-such-class"), None);
    assert_eq!(cache.priority_class(""), None);
    assert_eq!(
        cache.global_default_priority_class(),
        Some(("low-default".to_owned(), 100))
    );

    // Nodes: labels, taints and capacity kept; the rest dropped.
    let node = node_object(&cache, "gpu-1").expect("gpu-1 is cached");
    assert_eq!(node.metadata.name.as_deref(), Some("gpu-1"));
    assert_eq!(
        label(&node, "nvidia.com/gpu.present").as_deref(),
        Some("true")
    );
    assert_eq!(gpus(&node).as_deref(), Some("8"));
    let taints = node
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.clone())
        .expect("taints kept");
    assert_eq!(taints.len(), 1);
    assert_eq!(taints[0].key, "nvidia.com/gpu");
    assert_eq!(taints[0].effect, "NoSchedule");
    assert_eq!(node.metadata.annotations, None);
    assert_eq!(node.metadata.managed_fields, None);
    assert_eq!(node.metadata.uid, None);
    let spec = node.spec.as_ref().expect("spec");
    assert_eq!(spec.pod_cidr, None);
    assert_eq!(spec.provider_id, None);
    let node_status = node.status.as_ref().expect("status");
    assert_eq!(node_status.allocatable, None);
    assert_eq!(node_status.conditions, None);
    assert_eq!(node_status.images, None);
    assert_eq!(node_status.node_info, None);
    assert!(cache.node("no-such-node").is_none());

    let classes = status(&cache, "priorityclasses");
    assert!(classes.synced);
    assert_eq!(classes.objects, 3);
    assert!(classes.since_last_event.is_some());
    assert_eq!(classes.watch_errors, 0);
    let nodes = status(&cache, "nodes");
    assert!(nodes.synced);
    assert_eq!(nodes.objects, 1);
    assert_eq!(
        cache
            .status()
            .iter()
            .map(|status| status.resource)
            .collect::<Vec<_>>(),
        [
            "priorityclasses",
            "nodes",
            "resourceclaimtemplates",
            "resourceclaims",
            "deviceclasses",
            "jobs",
            "jobsets"
        ]
    );
}

#[tokio::test]
async fn watch_events_change_what_the_view_answers() {
    let (fake, cache) = synced_cache().await;
    assert_eq!(cache.global_default_priority_class(), None);

    // PriorityClasses
    fake.event(CLASSES, "ADDED", priority_class("urgent", 900, false));
    eventually("urgent added", || {
        cache.priority_class("urgent") == Some(900)
    })
    .await;

    fake.event(CLASSES, "MODIFIED", priority_class("batch", 600, true));
    eventually("batch modified into the default", || {
        cache.global_default_priority_class() == Some(("batch".to_owned(), 600))
    })
    .await;
    assert_eq!(cache.priority_class("batch"), Some(600));

    fake.event(CLASSES, "ADDED", priority_class("cheap-default", 10, true));
    eventually("the lower default wins", || {
        cache.global_default_priority_class() == Some(("cheap-default".to_owned(), 10))
    })
    .await;

    fake.event(
        CLASSES,
        "DELETED",
        priority_class("cheap-default", 10, true),
    );
    eventually("cheap-default deleted", || {
        cache.priority_class("cheap-default").is_none()
    })
    .await;
    assert_eq!(
        cache.global_default_priority_class(),
        Some(("batch".to_owned(), 600))
    );

    // A class named like a built-in: the cluster's object wins while it exists.
    fake.event(
        CLASSES,
        "ADDED",
        priority_class("system-node-critical", 7, false),
    );
    eventually("a cluster object shadows the built-in", || {
        cache.priority_class("system-node-critical") == Some(7)
    })
    .await;
    fake.event(
        CLASSES,
        "DELETED",
        priority_class("system-node-critical", 7, false),
    );
    eventually("back to the built-in", || {
        cache.priority_class("system-node-critical") == Some(2_000_001_000)
    })
    .await;

    // Nodes
    fake.event(NODES, "ADDED", gpu_node("gpu-2", "4"));
    eventually("gpu-2 added", || node_object(&cache, "gpu-2").is_some()).await;
    assert_eq!(
        gpus(&node_object(&cache, "gpu-2").expect("gpu-2")).as_deref(),
        Some("4")
    );

    let mut drained = gpu_node("gpu-1", "8");
    drained["metadata"]["labels"]["nvidia.com/gpu.present"] = json!("false");
    drained["spec"]["taints"] = json!([]);
    fake.event(NODES, "MODIFIED", drained);
    eventually("gpu-1 modified", || {
        node_object(&cache, "gpu-1")
            .is_some_and(|node| label(&node, "nvidia.com/gpu.present").as_deref() == Some("false"))
    })
    .await;
    let node = node_object(&cache, "gpu-1").expect("gpu-1");
    assert_eq!(
        node.spec.as_ref().and_then(|spec| spec.taints.clone()),
        Some(vec![])
    );

    fake.event(NODES, "DELETED", gpu_node("gpu-2", "4"));
    eventually("gpu-2 deleted", || cache.node("gpu-2").is_none()).await;

    assert_eq!(status(&cache, "priorityclasses").objects, 3);
    assert_eq!(status(&cache, "nodes").objects, 1);
    assert!(cache.synced());
    // Events came over the one watch per resource, with no relist.
    assert_eq!(fake.lists(CLASSES).len(), 1);
    assert_eq!(fake.watches(CLASSES).len(), 1);
    assert_eq!(fake.watches(NODES).len(), 1);
    assert_eq!(status(&cache, "priorityclasses").watch_errors, 0);
}

#[tokio::test]
async fn a_dropped_watch_resumes_from_the_last_resource_version() {
    let (fake, cache) = synced_cache().await;
    let last = fake.event(CLASSES, "ADDED", priority_class("urgent", 900, false));
    eventually("urgent added", || {
        cache.priority_class("urgent") == Some(900)
    })
    .await;

    // The API server ends the watch and does not answer the next one for now.
    fake.hold_watches(CLASSES, true);
    fake.end_watches(CLASSES);
    eventually("a second watch request", || {
        fake.watches(CLASSES).len() == 2
    })
    .await;

    // kube re-watches from the resourceVersion of the last event it saw; no relist.
    assert_eq!(
        fake.watches(CLASSES)[1].param("resourceVersion"),
        Some(last.as_str())
    );
    assert_eq!(fake.lists(CLASSES).len(), 1);

    // While the watch is down, the last known state serves, and the view stays synced.
    assert!(cache.synced());
    assert!(status(&cache, "priorityclasses").synced);
    assert_eq!(cache.priority_class("urgent"), Some(900));
    assert_eq!(cache.priority_class("batch"), Some(500));
    assert!(node_object(&cache, "gpu-1").is_some());

    // The watch is answered: new events apply.
    fake.hold_watches(CLASSES, false);
    eventually("the resumed watch is open", || {
        fake.open_watches(CLASSES) == 1
    })
    .await;
    fake.event(CLASSES, "MODIFIED", priority_class("urgent", 950, false));
    eventually("urgent modified after the resume", || {
        cache.priority_class("urgent") == Some(950)
    })
    .await;
    fake.event(CLASSES, "DELETED", priority_class("stale", 1, false));
    eventually("stale deleted after the resume", || {
        cache.priority_class("stale").is_none()
    })
    .await;
    assert!(cache.synced());
    assert_eq!(fake.lists(CLASSES).len(), 1);
    // A clean end of the stream is not an error.
    assert_eq!(status(&cache, "priorityclasses").watch_errors, 0);
}

#[tokio::test]
async fn a_gone_watch_relists_and_the_list_replaces_the_cache() {
    let (fake, cache) = synced_cache().await;

    // While the watch is out of the API server's window, "stale" goes and "fresh" comes; the
    // cache hears of neither until it lists again.
    fake.remove(CLASSES, "stale");
    fake.set(CLASSES, priority_class("fresh", 700, true));
    fake.error_event(CLASSES, 410);

    eventually("a relist after 410 Gone", || {
        // The last known state serves throughout, still synced.
        assert!(cache.synced());
        assert_eq!(cache.priority_class("batch"), Some(500));
        fake.lists(CLASSES).len() == 2
    })
    .await;
    eventually("the relist replaced the cache", || {
        cache.priority_class("fresh") == Some(700) && cache.priority_class("stale").is_none()
    })
    .await;
    assert!(cache.synced());
    assert_eq!(
        cache.global_default_priority_class(),
        Some(("fresh".to_owned(), 700))
    );
    let classes = status(&cache, "priorityclasses");
    assert_eq!(classes.objects, 2);
    assert_eq!(classes.watch_errors, 1);
    // The relist is a plain list, not a resumed watch; the Node watch was not disturbed.
    assert_eq!(fake.lists(CLASSES)[1].param("resourceVersion"), None);
    assert_eq!(fake.lists(NODES).len(), 1);

    // A new watch follows the relist, and its events apply.
    eventually("a new watch", || fake.open_watches(CLASSES) == 1).await;
    fake.event(CLASSES, "ADDED", priority_class("later", 5, false));
    eventually("later added", || cache.priority_class("later") == Some(5)).await;
}

#[tokio::test]
async fn stop_ends_the_watches() {
    let (fake, cache) = synced_cache().await;
    let clone = cache.clone();
    cache.stop();
    eventually("the watch connections closed", || {
        fake.open_watches(CLASSES) == 0 && fake.open_watches(NODES) == 0
    })
    .await;
    // The last state still answers.
    assert!(clone.synced());
    assert_eq!(clone.priority_class("batch"), Some(500));
}

#[tokio::test]
async fn dropping_the_last_clone_ends_the_watches() {
    let (fake, cache) = synced_cache().await;
    let clone = cache.clone();
    drop(cache);
    assert_eq!(clone.priority_class("batch"), Some(500));
    drop(clone);
    eventually("the watch connections closed", || {
        fake.open_watches(CLASSES) == 0 && fake.open_watches(NODES) == 0
    })
    .await;
}

#[tokio::test]
async fn client_from_a_kubeconfig_file() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = Fake::start().await;
    fake.set(CLASSES, priority_class("batch", 500, false));
    fake.set(NODES, gpu_node("gpu-1", "8"));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: other\n  cluster:\n    server: http://127.0.0.1:1\n\
             - name: fake\n  cluster:\n    server: {}\n\
             contexts:\n\
             - name: other\n  context:\n    cluster: other\n    user: guard\n\
             - name: fake\n  context:\n    cluster: fake\n    user: guard\n\
             current-context: fake\n\
             users:\n\
             - name: guard\n  user:\n    token: secret-token\n",
            fake.url()
        ),
    )
    .expect("write kubeconfig");

    let client = match cluster::client(Some(&path)).await {
        Ok(client) => client,
        Err(error) => panic!("client from {}: {error}", path.display()),
    };
    let cache = ClusterCache::start(client);
    assert!(cache.wait_synced(DEADLINE).await);
    assert_eq!(cache.priority_class("batch"), Some(500));
    assert!(cache.node("gpu-1").is_some());
    // The current context's cluster and user were used.
    let requests = fake.requests();
    assert!(!requests.is_empty());
    assert!(
        requests
            .iter()
            .all(|request| request.authorization.as_deref() == Some("Bearer secret-token")),
        "{requests:?}"
    );
}

#[tokio::test]
async fn kubeconfig_errors_name_the_file() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("temp dir");

    let missing = dir.path().join("missing-kubeconfig");
    let Err(error) = cluster::client(Some(&missing)).await else {
        panic!("a client from a missing file");
    };
    assert!(
        matches!(error, ClusterError::KubeconfigRead { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(&missing.display().to_string()),
        "{message}"
    );
    assert!(message.contains("--kubeconfig"), "{message}");

    let broken = dir.path().join("broken-kubeconfig");
    std::fs::write(&broken, "clusters: [\n  - name: {\n").expect("write");
    let Err(error) = cluster::client(Some(&broken)).await else {
        panic!("a client from broken YAML");
    };
    assert!(
        matches!(error, ClusterError::KubeconfigInvalid { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains(&broken.display().to_string()), "{message}");
    assert!(message.contains("parse"), "{message}");

    let no_context = dir.path().join("no-context-kubeconfig");
    std::fs::write(
        &no_context,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n",
    )
    .expect("write");
    let Err(error) = cluster::client(Some(&no_context)).await else {
        panic!("a client without a current context");
    };
    let message = error.to_string();
    assert!(
        message.contains(&no_context.display().to_string()),
        "{message}"
    );
    assert!(message.contains("current context"), "{message}");

    let no_server = dir.path().join("no-server-kubeconfig");
    std::fs::write(
        &no_server,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user: {}\n",
    )
    .expect("write");
    let Err(error) = cluster::client(Some(&no_server)).await else {
        panic!("a client without a server URL");
    };
    let message = error.to_string();
    assert!(
        message.contains(&no_server.display().to_string()),
        "{message}"
    );
    assert!(message.contains("cluster url is missing"), "{message}");
}

/// A kubeconfig file naming the fake API server.
pub(crate) fn kubeconfig_for(fake: &Fake, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: u\n\
             current-context: fake\nusers:\n- name: u\n  user:\n    token: t\n",
            fake.url()
        ),
    )
    .expect("write kubeconfig");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reads_classes_and_nodes_from_the_cluster() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = Fake::start().await;
    fake.set(CLASSES, priority_class("batch", 500, false));
    fake.set(NODES, gpu_node("gpu-1", "8"));
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = kubeconfig_for(&fake, dir.path());
    let manifest = dir.path().join("app.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: pinned, namespace: ml}\n\
         spec:\n  template:\n    spec:\n      priorityClassName: batch\n      nodeName: gpu-1\n\
         \x20     containers: [{name: app, image: app}]\n\
         ---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: typo, namespace: ml}\n\
         spec:\n  template:\n    spec:\n      priorityClassName: bacth\n\
         \x20     tolerations: [{key: nvidia.com/gpu, operator: Exists}]\n\
         \x20     containers: [{name: app, image: app}]\n\
         ---\n\
         apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: shipped}\nvalue: 5000\n\
         ---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: charted, namespace: ml}\n\
         spec:\n  template:\n    spec:\n      priorityClassName: shipped\n\
         \x20     tolerations: [{key: nvidia.com/gpu, operator: Exists}]\n\
         \x20     containers: [{name: app, image: app}]\n",
    )
    .expect("write manifest");
    let args = [
        "gpu-guard".to_owned(),
        "check".to_owned(),
        "--kubeconfig".to_owned(),
        kubeconfig.display().to_string(),
        "-f".to_owned(),
        manifest.display().to_string(),
    ];
    // `check` runs its own runtime: call it off this one.
    let report = tokio::task::spawn_blocking(move || support::run_in_process(args))
        .await
        .expect("check ran");
    assert_eq!(report.exit_code, 1, "{}\n{}", report.stdout, report.stderr);
    let lines: Vec<&str> = report.stdout.lines().collect();
    assert!(
        lines[0].ends_with("Deployment ml/pinned: DENIED"),
        "{}",
        report.stdout
    );
    assert!(
        lines[1].contains("its priority is 500 (PriorityClass \"batch\")")
            && lines[1].contains("names the GPU node gpu-1 (capacity nvidia.com/gpu: 8)"),
        "{}",
        lines[1]
    );
    // From a cluster, an unknown class is a finding, not "unjudged".
    assert!(
        lines[2].ends_with("Deployment ml/typo: DENIED"),
        "{}",
        report.stdout
    );
    assert!(
        lines[3].contains("names no PriorityClass the cluster has"),
        "{}",
        lines[3]
    );
    // A class shipped with the manifests counts, over the cluster's.
    assert!(
        lines[4]
            .ends_with("Deployment ml/charted: allowed (targets GPU nodes; priority 5000 >= 1000)"),
        "{}",
        report.stdout
    );
    assert!(fake.lists(CLASSES).len() == 1 && fake.lists(NODES).len() == 1);
}

// ---------------------------------------------------------------------------------------------
// DRA: ResourceClaimTemplates, ResourceClaims and DeviceClasses

/// NVIDIA's quickstart template (`tests/fixtures/dra/`) in `resource.k8s.io/v1`, with the fields
/// an API server adds.
fn claim_template(namespace: &str, name: &str, class: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": namespace, "name": name, "uid": "7d1c", "generation": 1,
                     "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": class, "count": 2,
             "allocationMode": "ExactCount",
             "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'H100'"}}]}}]}}}
    })
}

fn device_class(name: &str, extended_resource: &str, created: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}],
                 "extendedResourceName": extended_resource}
    })
}

#[tokio::test]
async fn dra_claims_resolve_from_the_cache_and_follow_the_watch() {
    let fake = Fake::start().await;
    fake.set(
        CLAIM_TEMPLATES,
        claim_template("ml", "two-gpus", "gpu.nvidia.com"),
    );
    fake.set(
        CLAIMS,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"namespace": "ml", "name": "shared"},
               "spec": {"devices": {"requests": [{"name": "r", "firstAvailable": [
                   {"name": "big", "deviceClassName": "gpu.nvidia.com"},
                   {"name": "small", "deviceClassName": "mig.nvidia.com"}]}]}},
               "status": {"allocation": {"devices": {"results": []}}}}),
    );
    fake.set(
        DEVICE_CLASSES,
        device_class("old-gpus", "example.com/gpu", "2026-01-01T00:00:00Z"),
    );
    fake.set(
        DEVICE_CLASSES,
        device_class("gpu.nvidia.com", "example.com/gpu", "2026-06-01T00:00:00Z"),
    );
    let cache = ClusterCache::start(fake.client());
    assert!(cache.wait_synced(DEADLINE).await, "the cache did not sync");
    for resource in ["resourceclaimtemplates", "resourceclaims", "deviceclasses"] {
        assert!(status(&cache, resource).synced, "{resource}");
    }
    let dra = cache.dra();
    let Lookup::Found(devices) = dra.claim_template("ml", "two-gpus") else {
        panic!("the template is cached");
    };
    assert_eq!(devices.requests.len(), 1);
    assert_eq!(devices.requests[0].name, "gpu");
    assert_eq!(
        devices.requests[0].classes,
        [(None, "gpu.nvidia.com".to_owned())]
    );
    let Lookup::Found(shared) = dra.claim("ml", "shared") else {
        panic!("the claim is cached");
    };
    assert_eq!(shared.requests[0].classes.len(), 2);
    // Namespaced: the same name elsewhere does not exist.
    assert_eq!(dra.claim_template("other", "two-gpus"), Lookup::Missing);
    // Two classes map one extended resource: the newer wins, as in the API server.
    assert_eq!(
        dra.class_of_extended_resource("example.com/gpu").as_deref(),
        Some("gpu.nvidia.com")
    );
    assert_eq!(dra.class_of_extended_resource("example.com/nic"), None);

    // A template created later is seen once its watch event arrives.
    eventually("the template watch is open", || {
        fake.open_watches(CLAIM_TEMPLATES) == 1
    })
    .await;
    fake.event(
        CLAIM_TEMPLATES,
        "ADDED",
        claim_template("ml", "later", "gpu.amd.com"),
    );
    eventually("the new template is cached", || {
        matches!(cache.dra().claim_template("ml", "later"), Lookup::Found(_))
    })
    .await;
}

#[tokio::test]
async fn a_cluster_without_the_dra_api_syncs_with_no_claims() {
    let fake = Fake::start().await;
    fake.set(CLASSES, priority_class("batch", 500, false));
    for path in [CLAIM_TEMPLATES, CLAIMS, DEVICE_CLASSES] {
        fake.unserve(path);
    }
    let cache = ClusterCache::start(fake.client());
    assert!(
        cache.wait_synced(DEADLINE).await,
        "a cluster that does not serve resource.k8s.io/v1 must not keep the webhook unready"
    );
    assert_eq!(
        cache.dra().claim_template("ml", "two-gpus"),
        Lookup::Missing
    );
    assert_eq!(cache.priority_class("batch"), Some(500));
}

#[tokio::test]
async fn until_the_dra_caches_sync_a_claim_is_not_known_and_the_cache_is_not_ready() {
    let fake = Fake::start().await;
    fake.set(
        CLAIM_TEMPLATES,
        claim_template("ml", "two-gpus", "gpu.nvidia.com"),
    );
    fake.hold_lists(CLAIM_TEMPLATES, true);
    let cache = ClusterCache::start(fake.client());
    eventually("the template list is requested", || {
        fake.lists(CLAIM_TEMPLATES).len() == 1
    })
    .await;
    assert!(!cache.wait_synced(Duration::from_millis(200)).await);
    assert!(!cache.synced());
    assert_eq!(
        cache.dra().claim_template("ml", "two-gpus"),
        Lookup::Unknown
    );
    fake.hold_lists(CLAIM_TEMPLATES, false);
    assert!(cache.wait_synced(DEADLINE).await);
    assert!(matches!(
        cache.dra().claim_template("ml", "two-gpus"),
        Lookup::Found(_)
    ));
}

#[tokio::test]
async fn mutate_resolves_claims_from_the_cluster_with_a_kubeconfig() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = Fake::start().await;
    fake.set(
        CLAIM_TEMPLATES,
        claim_template("gpu-test1", "double-gpu", "gpu.nvidia.com"),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = kubeconfig_for(&fake, dir.path());
    // NVIDIA's quickstart as a Job (tests/fixtures/dra/), without its template: the cluster has it.
    let fixture = format!(
        "{}/tests/fixtures/dra/job-with-claim-template.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let (documents, _) =
        gpu_guard_manifest::parse(&std::fs::read_to_string(&fixture).unwrap(), &fixture);
    let manifest = dir.path().join("job.yaml");
    std::fs::write(&manifest, documents[0].value.to_string()).unwrap();
    let run = |with_cluster: bool| {
        let mut args = vec!["gpu-guard".to_owned(), "mutate".to_owned()];
        if with_cluster {
            args.extend(["--kubeconfig".to_owned(), kubeconfig.display().to_string()]);
        }
        args.extend(["-f".to_owned(), manifest.display().to_string()]);
        // `mutate` runs its own runtime: call it off this one.
        tokio::task::spawn_blocking(move || support::run_in_process(args))
    };
    let report = run(true).await.expect("mutate ran");
    assert_eq!(report.exit_code, 0, "{}", report.stderr);
    assert!(
        report.stdout.contains("containerName: ctr0"),
        "{}",
        report.stdout
    );
    let offline = run(false).await.expect("mutate ran");
    assert_eq!(offline.exit_code, 0, "{}", offline.stderr);
    assert!(
        !offline.stdout.contains("podFailurePolicy"),
        "{}",
        offline.stdout
    );
    assert!(
        offline.stderr.contains("is not known"),
        "{}",
        offline.stderr
    );
}
