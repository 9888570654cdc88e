//! The controller against a fake API server on a loopback port: the real kube client, watcher,
//! reflectors and event recorder, over plain HTTP.
//!
//! The fake serves list and watch of Nodes, Pods and Namespaces (with the label selector the
//! controller uses), applies and records the writes the controller sends (node merge patches
//! with their resourceVersion precondition, pod status patches, evictions, Events, Leases), and
//! sends the changes to the open watches, as an API server does. Tests drive the reconciler's
//! passes with their own clock and assert the exact bodies sent.

mod support;
use support::{FakeBody, json_response};

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_guard::controller::RBAC_RULES;
use gpu_guard::controller::lease::{Elector, Leadership, LeaseLock};
use gpu_guard::controller::metrics::ControllerMetrics;
use gpu_guard::controller::node::{OWNER_ANNOTATION, TAINT_KEY};
use gpu_guard::controller::reconcile::{Caches, PassReport, Reconciler};
use gpu_guard::controller::run::{self, ControllerOptions as Options, LeaderElection};
use gpu_guard::policy::Policy;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const NODES: &str = "/api/v1/nodes";
const PODS: &str = "/api/v1/pods";
const NAMESPACES: &str = "/api/v1/namespaces";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/gpu-guard/leases";

const DEADLINE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The fake API server

/// One request the fake received.
#[derive(Clone, Debug)]
struct Logged {
    method: Method,
    path: String,
    query: BTreeMap<String, String>,
    content_type: Option<String>,
    body: Value,
}

impl Logged {
    fn is_write(&self) -> bool {
        !matches!(self.method, Method::GET)
    }

    fn is_event(&self) -> bool {
        self.path.starts_with("/apis/events.k8s.io/")
    }
}

#[derive(Default)]
struct Collection {
    /// By `namespace/name` (namespaced) or `name`.
    objects: BTreeMap<String, Value>,
    watchers: Vec<mpsc::UnboundedSender<Bytes>>,
}

#[derive(Default)]
struct State {
    resource_version: u64,
    collections: BTreeMap<&'static str, Collection>,
    leases: BTreeMap<String, Value>,
    requests: Vec<Logged>,
    /// The next node patches answered 409 after `conflict_change` is applied to the node.
    node_conflicts: usize,
    conflict_change: Option<fn(&mut Value)>,
    /// The status evictions are answered with (201 by default).
    eviction_status: Option<u16>,
    /// Lease requests are answered 500 while true.
    leases_failing: bool,
    /// Pods (by name) whose eviction a PodDisruptionBudget refuses (429).
    eviction_refused: BTreeSet<String>,
    /// Lease requests are held this long before they are answered (a hung API server).
    lease_delay: Option<Duration>,
    /// Pod status patches are held this long before they are applied.
    status_delay: Option<Duration>,
}

#[derive(Clone)]
struct Fake {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

fn key_of(object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().expect("a name");
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "reason": reason, "message": message, "code": code})
}

impl Fake {
    async fn start() -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let mut state = State {
            resource_version: 1,
            ..State::default()
        };
        for path in [NODES, PODS, NAMESPACES] {
            state.collections.insert(path, Collection::default());
        }
        let fake = Fake {
            addr,
            state: Arc::new(Mutex::new(state)),
        };
        let server = fake.clone();
        support::serve(listener, move |request| server.clone().handle(request));
        fake
    }

    fn config(&self) -> kube::Config {
        let _ = rustls::crypto::ring::default_provider().install_default();
        kube::Config::new(format!("http://{}", self.addr).parse().expect("URL"))
    }

    fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("kube client")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake state")
    }

    async fn handle(self, request: Request<Incoming>) -> Result<Response<FakeBody>, Infallible> {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let query: BTreeMap<String, String> = request
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| match pair.split_once('=') {
                Some((key, value)) => (key.to_owned(), value.to_owned()),
                None => (pair.to_owned(), String::new()),
            })
            .collect();
        let content_type = request
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let bytes = axum::body::to_bytes(axum::body::Body::new(request.into_body()), usize::MAX)
            .await
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let logged = Logged {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            content_type,
            body: body.clone(),
        };
        let delay = {
            let mut state = self.lock();
            state.requests.push(logged);
            if path.starts_with("/apis/coordination.k8s.io/") {
                state.lease_delay
            } else if method == Method::PATCH && path.ends_with("/status") {
                state.status_delay
            } else {
                None
            }
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let mut state = self.lock();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let response = match (&method, segments.as_slice()) {
            (&Method::GET, _) if state.collections.contains_key(path.as_str()) => {
                let watch = query.get("watch").map(String::as_str) == Some("true");
                let selector = query
                    .get("labelSelector")
                    .map(|s| s.replace("%2F", "/").replace("%3D", "="));
                return Ok(list_or_watch(&mut state, &path, watch, selector.as_deref()));
            }
            (&Method::GET, ["api", "v1", "nodes", name]) => {
                match state.collections[NODES].objects.get(*name) {
                    Some(node) => (StatusCode::OK, node.clone()),
                    None => (StatusCode::NOT_FOUND, status(404, "NotFound", "no node")),
                }
            }
            (&Method::PATCH, ["api", "v1", "nodes", name]) => patch_node(&mut state, name, body),
            (&Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
                patch_pod_status(&mut state, &format!("{ns}/{name}"), &body)
            }
            (&Method::POST, ["api", "v1", "namespaces", _, "pods", pod, "eviction"]) => {
                let refused = state.eviction_refused.contains(*pod);
                match state.eviction_status {
                    _ if refused => (
                        StatusCode::TOO_MANY_REQUESTS,
                        status(
                            429,
                            "TooManyRequests",
                            "Cannot evict pod as it would violate the pod's disruption budget.",
                        ),
                    ),
                    Some(429) => (
                        StatusCode::TOO_MANY_REQUESTS,
                        status(
                            429,
                            "TooManyRequests",
                            "Cannot evict pod as it would violate the pod's disruption budget.",
                        ),
                    ),
                    _ => (
                        StatusCode::CREATED,
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Success", "code": 201}),
                    ),
                }
            }
            (&Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", _, "events"]) => {
                (StatusCode::CREATED, body)
            }
            (&Method::PATCH, ["apis", "events.k8s.io", "v1", "namespaces", _, "events", _]) => {
                (StatusCode::OK, body)
            }
            (_, ["apis", "coordination.k8s.io", ..]) if state.leases_failing => (
                StatusCode::INTERNAL_SERVER_ERROR,
                status(500, "InternalError", "etcd is unhappy"),
            ),
            (
                _,
                [
                    "apis",
                    "coordination.k8s.io",
                    "v1",
                    "namespaces",
                    _,
                    "leases",
                    rest @ ..,
                ],
            ) => lease(&mut state, &method, rest.first().copied(), body),
            _ => (StatusCode::NOT_FOUND, status(404, "NotFound", "not served")),
        };
        Ok(json_response(response.0, &response.1))
    }

    /// Puts `object` into the collection and tells the open watches (ADDED or MODIFIED).
    fn put(&self, path: &'static str, object: Value) {
        let mut state = self.lock();
        store(&mut state, path, object);
    }

    fn requests(&self) -> Vec<Logged> {
        self.lock().requests.clone()
    }

    /// The writes received, Events left out.
    fn writes(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|request| request.is_write() && !request.is_event())
            .collect()
    }

    /// The Events created or patched: (reason, regarding name, note).
    fn events(&self) -> Vec<(String, String, String)> {
        self.requests()
            .into_iter()
            .filter(|request| request.is_event() && request.method == Method::POST)
            .map(|request| {
                (
                    request.body["reason"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    request.body["regarding"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    request.body["note"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    fn clear_requests(&self) {
        self.lock().requests.clear();
    }

    fn object(&self, path: &'static str, key: &str) -> Value {
        self.lock().collections[path].objects[key].clone()
    }

    fn open_watches(&self) -> usize {
        let state = self.lock();
        state
            .collections
            .values()
            .map(|c| c.watchers.iter().filter(|w| !w.is_closed()).count())
            .sum()
    }
}

fn store(state: &mut State, path: &'static str, mut object: Value) -> Value {
    state.resource_version += 1;
    object["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
    let key = key_of(&object);
    let collection = state.collections.get_mut(path).expect("collection");
    let kind = if collection.objects.contains_key(&key) {
        "MODIFIED"
    } else {
        "ADDED"
    };
    collection.objects.insert(key, object.clone());
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("JSON");
    line.push(b'\n');
    let line = Bytes::from(line);
    collection
        .watchers
        .retain(|watcher| watcher.send(line.clone()).is_ok());
    object
}

fn list_or_watch(
    state: &mut State,
    path: &str,
    watch: bool,
    selector: Option<&str>,
) -> Response<FakeBody> {
    let resource_version = state.resource_version;
    let collection = state.collections.get_mut(path).expect("collection");
    if watch {
        let (sender, receiver) = mpsc::unbounded_channel();
        collection.watchers.push(sender);
        return Response::builder()
            .header("content-type", "application/json")
            .body(FakeBody::Stream(receiver))
            .expect("response");
    }
    let items: Vec<&Value> = collection
        .objects
        .values()
        .filter(|object| {
            selector.is_none_or(|selector| {
                let (key, value) = selector.split_once('=').expect("key=value selector");
                object["metadata"]["labels"][key].as_str() == Some(value)
            })
        })
        .collect();
    let kind = match path {
        NODES => "NodeList",
        PODS => "PodList",
        _ => "NamespaceList",
    };
    json_response(
        StatusCode::OK,
        &json!({"kind": kind, "apiVersion": "v1",
                "metadata": {"resourceVersion": resource_version.to_string()},
                "items": items}),
    )
}

/// A JSON merge patch with the resourceVersion precondition, as the API server applies it.
fn patch_node(state: &mut State, name: &str, patch: Value) -> (StatusCode, Value) {
    if state.node_conflicts > 0 {
        state.node_conflicts -= 1;
        if let Some(change) = state.conflict_change {
            let mut node = state.collections[NODES].objects[name].clone();
            change(&mut node);
            store(state, NODES, node);
        }
    }
    let Some(mut node) = state.collections[NODES].objects.get(name).cloned() else {
        return (StatusCode::NOT_FOUND, status(404, "NotFound", "no node"));
    };
    let wanted = patch["metadata"]["resourceVersion"].as_str();
    if wanted.is_some_and(|wanted| Some(wanted) != node["metadata"]["resourceVersion"].as_str()) {
        return (
            StatusCode::CONFLICT,
            status(
                409,
                "Conflict",
                "Operation cannot be fulfilled on nodes: the object has been modified",
            ),
        );
    }
    json_patch::merge(&mut node, &patch);
    (StatusCode::OK, store(state, NODES, node))
}

/// A strategic merge patch of status.conditions (merge key `type`).
fn patch_pod_status(state: &mut State, key: &str, patch: &Value) -> (StatusCode, Value) {
    let Some(mut pod) = state.collections[PODS].objects.get(key).cloned() else {
        return (StatusCode::NOT_FOUND, status(404, "NotFound", "no pod"));
    };
    let conditions = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut merged: Vec<Value> = conditions;
    for condition in patch["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        merged.retain(|existing| existing["type"] != condition["type"]);
        merged.push(condition.clone());
    }
    pod["status"]["conditions"] = json!(merged);
    (StatusCode::OK, store(state, PODS, pod))
}

/// Leases: GET, POST (create), PUT (replace with the resourceVersion precondition).
fn lease(
    state: &mut State,
    method: &Method,
    name: Option<&str>,
    mut body: Value,
) -> (StatusCode, Value) {
    match (method, name) {
        (&Method::GET, Some(name)) => match state.leases.get(name) {
            Some(lease) => (StatusCode::OK, lease.clone()),
            None => (StatusCode::NOT_FOUND, status(404, "NotFound", "no lease")),
        },
        (&Method::POST, None) => {
            let name = body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if state.leases.contains_key(&name) {
                return (
                    StatusCode::CONFLICT,
                    status(409, "AlreadyExists", "leases already exists"),
                );
            }
            state.resource_version += 1;
            body["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
            state.leases.insert(name, body.clone());
            (StatusCode::CREATED, body)
        }
        (&Method::PUT, Some(name)) => {
            let current = state.leases.get(name).cloned().unwrap_or(Value::Null);
            if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                return (
                    StatusCode::CONFLICT,
                    status(409, "Conflict", "the object has been modified"),
                );
            }
            state.resource_version += 1;
            body["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
            state.leases.insert(name.to_owned(), body.clone());
            (StatusCode::OK, body)
        }
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            status(405, "MethodNotAllowed", ""),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Objects and helpers

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("time")
}

/// A GPU node with `capacity` GPUs of which `allocatable` can be handed out, carrying the
/// GPU-node taint the cluster operator put there.
fn gpu_node(name: &str, capacity: u32, allocatable: u32) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"),
                     "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "64", "nvidia.com/gpu": capacity.to_string()},
            "allocatable": {"cpu": "63", "nvidia.com/gpu": allocatable.to_string()},
        },
    })
}

fn namespace(name: &str, opted_in: bool) -> Value {
    let labels = if opted_in {
        json!({"gpu-guard.io/enabled": "true", "kubernetes.io/metadata.name": name})
    } else {
        json!({"kubernetes.io/metadata.name": name})
    };
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

/// A running pod on `node`; `gpu`: it limits one nvidia.com/gpu; `unhealthy`: its GPU is
/// reported Unhealthy.
fn pod(namespace: &str, name: &str, node: &str, gpu: bool, unhealthy: bool) -> Value {
    let resources = if gpu {
        json!({"limits": {"nvidia.com/gpu": "1"}})
    } else {
        json!({"requests": {"cpu": "1"}})
    };
    let health = if unhealthy { "Unhealthy" } else { "Healthy" };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}"),
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                          "uid": "uid-train", "controller": true}]},
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "containers": [{"name": "trainer", "image": "cuda", "resources": resources}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{
                "name": "trainer", "image": "cuda", "imageID": "", "ready": true,
                "restartCount": 0,
                "allocatedResourcesStatus": if gpu {
                    json!([{"name": "nvidia.com/gpu",
                            "resources": [{"resourceID": "GPU-1234", "health": health}]}])
                } else {
                    json!([])
                },
            }],
        },
    })
}

/// Polls `check` until it holds, failing the test after [`DEADLINE`].
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The RBAC `(group, resource, verb)` a request needs.
fn rbac_need(request: &Logged) -> (String, String, &'static str) {
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

/// Every request the fake received is allowed by the controller's published RBAC rules.
fn assert_rbac_allows(requests: &[Logged]) {
    assert!(!requests.is_empty());
    for request in requests {
        let (group, resource, verb) = rbac_need(request);
        assert!(
            RBAC_RULES
                .iter()
                .any(|(g, r, verbs)| *g == group && *r == resource && verbs.contains(&verb)),
            "{verb} {group}/{resource} ({} {}) is not in controller::RBAC_RULES",
            request.method,
            request.path
        );
    }
}

struct World {
    fake: Fake,
    caches: Caches,
    reconciler: Reconciler,
    metrics: Arc<ControllerMetrics>,
}

impl World {
    /// The fake with `objects`, and a reconciler with synced caches on it.
    async fn start(policy: Policy, objects: Vec<(&'static str, Value)>) -> World {
        let fake = Fake::start().await;
        for (path, object) in objects {
            fake.put(path, object);
        }
        let client = fake.client();
        let caches = Caches::start(&client);
        assert!(caches.wait_synced(DEADLINE).await, "caches did not sync");
        eventually("three watches open", || fake.open_watches() == 3).await;
        let metrics = Arc::new(ControllerMetrics::default());
        let reconciler = Reconciler::new(
            fake.config(),
            policy,
            Some("test-1".to_owned()),
            metrics.clone(),
        )
        .expect("reconciler");
        World {
            fake,
            caches,
            reconciler,
            metrics,
        }
    }

    async fn pass(&mut self, seconds: i64) -> PassReport {
        self.reconciler.pass(&self.caches, at(seconds)).await
    }

    /// Waits until the node cache shows `check` true of the node.
    async fn node_cached(&self, name: &str, check: impl Fn(&Value) -> bool) {
        eventually(&format!("node {name} updated in the cache"), || {
            self.caches
                .nodes
                .state()
                .iter()
                .find(|node| node.metadata.name.as_deref() == Some(name))
                .is_some_and(|node| check(&serde_json::to_value(&**node).expect("JSON")))
        })
        .await;
    }

    async fn pod_cached(&self, name: &str, check: impl Fn(&Value) -> bool) {
        eventually(&format!("pod {name} updated in the cache"), || {
            self.caches
                .pods
                .state()
                .iter()
                .find(|pod| pod.metadata.name.as_deref() == Some(name))
                .is_some_and(|pod| check(&serde_json::to_value(&**pod).expect("JSON")))
        })
        .await;
    }
}

fn has_our_taint(node: &Value) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|taints| taints.iter().any(|taint| taint["key"] == TAINT_KEY))
}

fn policy(edit: impl FnOnce(&mut Policy)) -> Policy {
    let mut policy = Policy::default();
    policy.controller.node_health.degraded_for_seconds = 120;
    policy.controller.node_health.healthy_for_seconds = 600;
    edit(&mut policy);
    policy
}

const TAINT_TIME: &str = "2027-01-15T08:02:00Z";

// ---------------------------------------------------------------------------------------------
// Node health

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
    assert_eq!(writes.len(), 1, "{writes:?}");
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
                         "annotations": {OWNER_ANNOTATION: format!("{TAINT_TIME};nvidia.com_gpu:NoSchedule")}},
            "spec": {"taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"},
            ]},
        })
    );
    let events = world.fake.events();
    assert_eq!(events.len(), 1, "{events:?}");
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
    let mut healed = world.fake.object(NODES, "gpu-1");
    healed["status"]["allocatable"]["nvidia.com/gpu"] = json!("8");
    world.fake.put(NODES, healed);
    world
        .node_cached("gpu-1", |node| {
            node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        })
        .await;
    world.pass(400).await;
    world.pass(999).await;
    assert!(world.fake.writes().is_empty());

    let version = world.fake.object(NODES, "gpu-1")["metadata"]["resourceVersion"].clone();
    let report = world.pass(1000).await;
    assert_eq!(report.untainted, ["gpu-1"]);
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0].body,
        json!({
            "metadata": {"resourceVersion": version, "annotations": {OWNER_ANNOTATION: null}},
            "spec": {"taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            ]},
        })
    );
    let node = world.fake.object(NODES, "gpu-1");
    assert!(!has_our_taint(&node));
    assert_eq!(node["metadata"].get("annotations"), Some(&json!({})));
    let reasons: Vec<String> = world.fake.events().into_iter().map(|e| e.0).collect();
    assert_eq!(reasons, ["DeviceRecovered"]);
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
        vec![(NODES, gpu_node("gpu-1", 4, 0))],
    )
    .await;
    world.pass(0).await;
    world.pass(120).await;
    let writes = world.fake.writes();
    assert_eq!(
        writes[0].body["spec"]["taints"][1],
        json!({"key": TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoExecute"})
    );
}

#[tokio::test]
async fn a_taint_gpu_guard_did_not_add_is_never_removed() {
    let mut foreign = gpu_node("gpu-1", 8, 8);
    foreign["spec"]["taints"]
        .as_array_mut()
        .expect("taints")
        .push(json!({"key": TAINT_KEY, "value": "manual", "effect": "NoSchedule"}));
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
    {
        let mut state = world.fake.lock();
        state.node_conflicts = 1;
        state.conflict_change = Some(|node| {
            node["spec"]["taints"]
                .as_array_mut()
                .expect("taints")
                .push(json!({"key": "maintenance", "effect": "NoSchedule"}));
        });
    }
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
        ]
    );
    let node = world.fake.object(NODES, "gpu-1");
    assert_eq!(
        node["spec"]["taints"],
        json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "maintenance", "effect": "NoSchedule"},
            {"key": TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"},
        ])
    );
}

#[tokio::test]
async fn a_node_someone_else_tainted_meanwhile_is_not_tainted_again() {
    let mut world = World::start(policy(|_| {}), vec![(NODES, gpu_node("gpu-1", 8, 6))]).await;
    {
        let mut state = world.fake.lock();
        state.node_conflicts = 1;
        state.conflict_change = Some(|node| {
            node["spec"]["taints"]
                .as_array_mut()
                .expect("taints")
                .push(json!({"key": TAINT_KEY, "value": "by-hand", "effect": "NoSchedule"}));
        });
    }
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
    assert_eq!(world.fake.writes().len(), 1);
    let events = world.fake.events();
    let reasons: Vec<(&str, &str)> = events
        .iter()
        .map(|(reason, node, _)| (reason.as_str(), node.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("DeviceDegraded", "gpu-10"),
            ("SafetyValve", "gpu-11"),
            ("SafetyValve", "gpu-12")
        ]
    );
    assert!(
        events[1]
            .2
            .contains("1 of 12 GPU nodes are tainted already"),
        "{}",
        events[1].2
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

// ---------------------------------------------------------------------------------------------
// Pods

fn pod_world() -> Vec<(&'static str, Value)> {
    vec![
        (NODES, gpu_node("gpu-1", 8, 7)),
        (NODES, gpu_node("gpu-2", 8, 8)),
        (NAMESPACES, namespace("ml", true)),
        (NAMESPACES, namespace("other", false)),
        // Its GPU is reported Unhealthy.
        (PODS, pod("ml", "sick", "gpu-2", true, true)),
        // On the degraded node, with a healthy GPU.
        (PODS, pod("ml", "on-degraded", "gpu-1", true, false)),
        // Healthy, on a healthy node.
        (PODS, pod("ml", "fine", "gpu-2", true, false)),
        // On the degraded node without a GPU.
        (PODS, pod("ml", "cpu-only", "gpu-1", false, false)),
        // Its namespace did not opt in.
        (PODS, pod("other", "sick-elsewhere", "gpu-2", true, true)),
    ]
}

fn condition(reason: &str, message: &str, time: &str) -> Value {
    json!({"status": {"conditions": [{
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
        condition("UnhealthyDevice", SICK_MESSAGE, "2027-01-15T08:00:00Z")
    );
    assert_eq!(writes[1].method, Method::POST);
    assert_eq!(writes[1].path, "/api/v1/namespaces/ml/pods/sick/eviction");
    assert_eq!(
        writes[1].body,
        json!({"apiVersion": "policy/v1", "kind": "Eviction",
               "metadata": {"name": "sick", "namespace": "ml"}})
    );
    // The pod's other conditions stay (the API server merges by type).
    let sick = world.fake.object(PODS, "ml/sick");
    assert_eq!(sick["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(
        sick["status"]["conditions"][1]["type"],
        "gpu-guard.io/DeviceFailure"
    );
    let events: Vec<(String, String)> = world
        .fake
        .events()
        .into_iter()
        .map(|(reason, name, _)| (reason, name))
        .collect();
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
    world
        .pod_cached("sick", |pod| {
            pod["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.len() == 2)
        })
        .await;
    world.fake.clear_requests();
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert_eq!(report.marked, ["ml/on-degraded"]);
    assert_eq!(report.evicted, ["ml/on-degraded"]);
    let writes: Vec<(Method, String, Value)> = world
        .fake
        .writes()
        .into_iter()
        .map(|w| (w.method, w.path, w.body))
        .collect();
    assert_eq!(writes.len(), 3, "{writes:?}");
    assert_eq!(writes[0].1, "/api/v1/nodes/gpu-1");
    assert_eq!(
        writes[1],
        (
            Method::PATCH,
            "/api/v1/namespaces/ml/pods/on-degraded/status".to_owned(),
            condition("NodeDeviceDegraded", DEGRADED_MESSAGE, TAINT_TIME)
        )
    );
    assert_eq!(
        writes[2].1,
        "/api/v1/namespaces/ml/pods/on-degraded/eviction"
    );

    world
        .pod_cached("on-degraded", |pod| {
            pod["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.len() == 2)
        })
        .await;
    world.fake.clear_requests();
    let report = world.pass(130).await;
    assert_eq!(report, PassReport::default());
    assert!(world.fake.writes().is_empty());
    assert_eq!(world.metrics.pods_marked.get(), 2);
    assert_eq!(world.metrics.pods_evicted.get(), 2);
    assert_eq!(world.metrics.reconcile_errors.get(), 0);
}

#[tokio::test]
async fn the_published_rbac_rules_allow_every_call_the_controller_makes() {
    let mut world =
        World::start(policy(|p| p.controller.pods.evict_pods = true), pod_world()).await;
    {
        // A conflict, so the node is read too.
        let mut state = world.fake.lock();
        state.node_conflicts = 1;
        state.conflict_change = Some(|node| {
            node["metadata"]["labels"]["touched"] = json!("yes");
        });
    }
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
    assert!(a.try_acquire_or_renew(at(1), now).await.expect("renew"));
    a.release(at(2)).await.expect("release");
    assert_rbac_allows(&fake.requests());
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
    world.fake.lock().eviction_status = Some(429);
    let report = world.pass(60).await;
    assert_eq!(report.evictions_deferred, ["ml/b"]);
    assert!(report.errors.is_empty());
    assert_eq!(world.metrics.reconcile_errors.get(), 0);
    // The budget allows it later.
    world.fake.lock().eviction_status = None;
    let report = world.pass(120).await;
    assert_eq!(report.evicted, ["ml/b"]);
    let evictions = world
        .fake
        .writes()
        .iter()
        .filter(|w| w.path.ends_with("/eviction"))
        .count();
    assert_eq!(evictions, 3);
    assert_eq!(world.metrics.pods_evicted.get(), 2);
    assert_eq!(world.metrics.evictions_deferred.get(), 3);
}

#[tokio::test]
async fn a_pod_a_budget_refuses_waits_on_its_own_and_does_not_starve_the_others() {
    let mut world = two_pods_to_evict().await;
    world.fake.lock().eviction_refused.insert("a".to_owned());
    let evictions_of = |world: &World, name: &str| {
        world
            .fake
            .writes()
            .iter()
            .filter(|w| w.path == format!("/api/v1/namespaces/ml/pods/{name}/eviction"))
            .count()
    };
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
        json!([{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]);
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
    ];
    let mut world = World::start(policy(|p| p.controller.pods.evict_pods = true), objects).await;
    world.pass(0).await;
    let report = world.pass(120).await;
    assert_eq!(report.tainted, ["gpu-1"]);
    assert_eq!(
        report.marked,
        ["ml/bare", "ml/daemon", "ml/job", "ml/tolerating"]
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
    let mut healed = world.fake.object(NODES, "gpu-1");
    healed["status"]["allocatable"]["nvidia.com/gpu"] = json!("8");
    world.fake.put(NODES, healed);
    world
        .node_cached("gpu-1", |node| {
            node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        })
        .await;
    world
        .fake
        .put(PODS, pod("ml", "late", "gpu-1", true, false));
    world.pod_cached("late", |_| true).await;
    let report = world.pass(200).await;
    assert!(report.marked.is_empty(), "{report:?}");
    assert!(report.untainted.is_empty());
}

#[tokio::test]
async fn a_stale_owner_annotation_is_cleared_and_only_gpu_guards_exact_taint_is_removed() {
    let recorded = format!("{TAINT_TIME};nvidia.com_gpu:NoSchedule");
    // gpu-1: someone removed gpu-guard's taint by hand; the annotation stayed.
    let mut stale = gpu_node("gpu-1", 8, 8);
    stale["metadata"]["annotations"] = json!({OWNER_ANNOTATION: recorded});
    // gpu-2: gpu-guard's taint next to someone's NoExecute taint with the same key.
    let mut both = gpu_node("gpu-2", 8, 8);
    both["metadata"]["annotations"] = json!({OWNER_ANNOTATION: recorded});
    let taints = both["spec"]["taints"].as_array_mut().expect("taints");
    taints.push(json!({"key": TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"}));
    taints.push(json!({"key": TAINT_KEY, "value": "by-hand", "effect": "NoExecute"}));
    let mut world = World::start(policy(|_| {}), vec![(NODES, stale), (NODES, both)]).await;

    let version = world.fake.object(NODES, "gpu-1")["metadata"]["resourceVersion"].clone();
    world.pass(0).await;
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].path, "/api/v1/nodes/gpu-1");
    assert_eq!(
        writes[0].body,
        json!({"metadata": {"resourceVersion": version, "annotations": {OWNER_ANNOTATION: null}}})
    );
    assert_eq!(
        world.fake.object(NODES, "gpu-1")["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    );
    assert_eq!(world.metrics.tainted_nodes.get(), 1);

    // A taint with the key added by hand later is someone else's: never removed.
    world
        .node_cached("gpu-1", |node| node["metadata"]["annotations"] == json!({}))
        .await;
    let mut manual = world.fake.object(NODES, "gpu-1");
    manual["spec"]["taints"]
        .as_array_mut()
        .expect("taints")
        .push(json!({"key": TAINT_KEY, "value": "nvidia.com_gpu", "effect": "NoSchedule"}));
    world.fake.put(NODES, manual);
    world.node_cached("gpu-1", has_our_taint).await;
    world.fake.clear_requests();

    // gpu-2 recovers: only gpu-guard's taint is removed, the NoExecute one stays.
    world.pass(100).await;
    let report = world.pass(700).await;
    assert_eq!(report.untainted, ["gpu-2"]);
    let writes = world.fake.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].path, "/api/v1/nodes/gpu-2");
    assert_eq!(
        writes[0].body["spec"]["taints"],
        json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": TAINT_KEY, "value": "by-hand", "effect": "NoExecute"},
        ])
    );
    assert!(has_our_taint(&world.fake.object(NODES, "gpu-1")));
}

#[tokio::test]
async fn a_pass_that_outlasts_leadership_stops_writing() {
    let objects = vec![
        (NODES, gpu_node("gpu-1", 8, 8)),
        (NAMESPACES, namespace("ml", true)),
        (PODS, pod("ml", "a", "gpu-1", true, true)),
        (PODS, pod("ml", "b", "gpu-1", true, true)),
    ];
    let mut world = World::start(policy(|p| p.controller.pods.evict_pods = true), objects).await;
    let leadership = Leadership::default();
    world.reconciler.set_leadership(leadership.clone());
    // Not leading: nothing is written at all.
    let report = world.pass(0).await;
    assert!(report.stopped);
    assert!(world.fake.requests().iter().all(|r| !r.is_write()));
    // Leading for 1 s; the first write takes 1.5 s: nothing is written after it.
    world.fake.lock().status_delay = Some(Duration::from_millis(1500));
    leadership.set(Some(Instant::now() + Duration::from_secs(1)));
    let report = world.pass(1).await;
    assert!(report.stopped, "{report:?}");
    assert_eq!(report.marked, ["ml/a"]);
    assert!(report.evicted.is_empty());
    let writes: Vec<String> = world
        .fake
        .requests()
        .into_iter()
        .filter(Logged::is_write)
        .map(|w| w.path)
        .collect();
    assert_eq!(writes, ["/api/v1/namespaces/ml/pods/a/status"]);
}

#[tokio::test]
async fn what_a_leader_remembered_is_forgotten_when_leadership_changes_hands() {
    let mut world = World::start(policy(|_| {}), pod_world()).await;
    world.pass(0).await;
    assert!(world.reconciler.histories().contains_key("gpu-1"));
    assert_eq!(world.metrics.degraded_nodes.get(), 1);
    assert_eq!(world.metrics.gpu_nodes.get(), 2);
    world.reconciler.reset();
    assert!(world.reconciler.histories().is_empty());
    assert_eq!(world.metrics.degraded_nodes.get(), 0);
    assert_eq!(world.metrics.gpu_nodes.get(), 0);
    assert_eq!(world.metrics.tainted_nodes.get(), 0);
    // The degradation clock starts again: not tainted at 120 s.
    let report = world.pass(120).await;
    assert!(report.tainted.is_empty(), "{report:?}");
    let report = world.pass(240).await;
    assert_eq!(report.tainted, ["gpu-1"]);
}

// ---------------------------------------------------------------------------------------------
// Dry run

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

    // No PATCH, no eviction: only Events were written.
    assert!(world.fake.writes().is_empty(), "{:?}", world.fake.writes());
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

    // Later passes do not repeat themselves; recovery is simulated too.
    let report = world.pass(200).await;
    assert_eq!(report, PassReport::default());
    let mut healed = world.fake.object(NODES, "gpu-1");
    healed["status"]["allocatable"]["nvidia.com/gpu"] = json!("8");
    world.fake.put(NODES, healed);
    world
        .node_cached("gpu-1", |node| {
            node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        })
        .await;
    world.pass(300).await;
    let report = world.pass(900).await;
    assert_eq!(report.untainted, ["gpu-1"]);
    assert!(world.fake.writes().is_empty());
    assert_eq!(
        world.fake.events().last().expect("an event").0,
        "DeviceRecovered"
    );
}

// ---------------------------------------------------------------------------------------------
// Leader election

fn lock(fake: &Fake, identity: &str) -> LeaseLock {
    LeaseLock::new(
        fake.client(),
        "gpu-guard",
        "gpu-guard-controller",
        identity,
        Duration::from_secs(15),
    )
}

fn lease_spec(fake: &Fake) -> Value {
    fake.lock().leases["gpu-guard-controller"]["spec"].clone()
}

/// `seconds` after `t0` on the local monotonic clock.
fn mono(t0: Instant, seconds: u64) -> Instant {
    t0 + Duration::from_secs(seconds)
}

#[tokio::test]
async fn the_lease_is_acquired_renewed_blocked_taken_over_and_released() {
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let mut b = lock(&fake, "replica-b");
    let t0 = Instant::now();

    // No Lease: created, held by a.
    assert!(
        a.try_acquire_or_renew(at(0), mono(t0, 0))
            .await
            .expect("acquire")
    );
    let created = fake
        .requests()
        .into_iter()
        .find(|r| r.method == Method::POST)
        .expect("a create");
    assert_eq!(created.path, LEASES);
    assert_eq!(
        created.body["spec"],
        json!({"holderIdentity": "replica-a", "leaseDurationSeconds": 15,
               "acquireTime": "2027-01-15T08:00:00.000000Z",
               "renewTime": "2027-01-15T08:00:00.000000Z", "leaseTransitions": 0})
    );

    // b is blocked while a renews.
    assert!(
        !b.try_acquire_or_renew(at(10), mono(t0, 10))
            .await
            .expect("try")
    );
    assert!(
        a.try_acquire_or_renew(at(10), mono(t0, 10))
            .await
            .expect("renew")
    );
    let spec = lease_spec(&fake);
    assert_eq!(spec["holderIdentity"], "replica-a");
    assert_eq!(spec["renewTime"], "2027-01-15T08:00:10.000000Z");
    assert_eq!(spec["acquireTime"], "2027-01-15T08:00:00.000000Z");
    // b sees the renewal at 25 s on its clock: the lease runs 15 s from then.
    assert!(
        !b.try_acquire_or_renew(at(25), mono(t0, 25))
            .await
            .expect("try")
    );
    assert!(
        !b.try_acquire_or_renew(at(40), mono(t0, 40))
            .await
            .expect("try at the edge")
    );

    // a stops renewing: once the record has not changed for the lease duration, b takes over.
    assert!(
        b.try_acquire_or_renew(at(41), mono(t0, 41))
            .await
            .expect("take over")
    );
    let spec = lease_spec(&fake);
    assert_eq!(spec["holderIdentity"], "replica-b");
    assert_eq!(spec["leaseTransitions"], 1);
    assert_eq!(spec["acquireTime"], "2027-01-15T08:00:41.000000Z");
    assert!(
        !a.try_acquire_or_renew(at(42), mono(t0, 42))
            .await
            .expect("a is out")
    );
    // Every update carried the resourceVersion it read.
    let puts: Vec<Logged> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::PUT)
        .collect();
    assert_eq!(puts.len(), 2);
    assert!(
        puts.iter()
            .all(|p| p.body["metadata"]["resourceVersion"].is_string())
    );

    // b releases: the holder is cleared and a gets it at once.
    a.release(at(43))
        .await
        .expect("a releases nothing it does not hold");
    assert_eq!(lease_spec(&fake)["holderIdentity"], "replica-b");
    b.release(at(43)).await.expect("release");
    assert_eq!(lease_spec(&fake).get("holderIdentity"), None);
    assert!(
        a.try_acquire_or_renew(at(44), mono(t0, 44))
            .await
            .expect("acquire after release")
    );
    assert_eq!(lease_spec(&fake)["leaseTransitions"], 2);
}

#[tokio::test]
async fn expiry_does_not_depend_on_the_holders_wall_clock() {
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let mut b = lock(&fake, "replica-b");
    let t0 = Instant::now();
    // a's clock is 26 years behind, but a keeps renewing: b never takes over.
    let behind = |seconds: i64| Timestamp::from_second(1_000_000_000 + seconds).expect("time");
    for i in 0..6 {
        assert!(
            a.try_acquire_or_renew(behind(i * 10), mono(t0, (i * 10) as u64))
                .await
                .expect("renew")
        );
        assert!(
            !b.try_acquire_or_renew(at(i * 10 + 5), mono(t0, (i * 10 + 5) as u64))
                .await
                .expect("try"),
            "taken over at round {i}"
        );
    }
    assert_eq!(lease_spec(&fake)["holderIdentity"], "replica-a");

    // a's clock is 70 years ahead, and a stops renewing: b takes over after a lease duration
    // of its own clock, although the renewTime is in the future.
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let mut b = lock(&fake, "replica-b");
    let ahead = Timestamp::from_second(4_000_000_000).expect("time");
    assert!(
        a.try_acquire_or_renew(ahead, mono(t0, 0))
            .await
            .expect("acquire")
    );
    assert!(
        !b.try_acquire_or_renew(at(1), mono(t0, 1))
            .await
            .expect("try")
    );
    assert!(
        !b.try_acquire_or_renew(at(16), mono(t0, 16))
            .await
            .expect("try")
    );
    assert!(
        b.try_acquire_or_renew(at(17), mono(t0, 17))
            .await
            .expect("take over")
    );
    assert_eq!(lease_spec(&fake)["holderIdentity"], "replica-b");
}

#[tokio::test]
async fn a_hung_renewal_stops_the_leader_within_its_deadline() {
    let fake = Fake::start().await;
    let lock = LeaseLock::new(
        fake.client(),
        "gpu-guard",
        "gpu-guard-controller",
        "replica-a",
        Duration::from_millis(900),
    );
    let mut elector = Elector::new(lock);
    let started = Instant::now();
    assert!(elector.round().await);
    let until = elector.leading_until().expect("a deadline");
    assert!(until <= Instant::now() + Duration::from_millis(600));
    // The API server stops answering (the request is held for a minute).
    fake.lock().lease_delay = Some(Duration::from_secs(60));
    let renewing = Instant::now();
    assert!(
        !elector.round().await,
        "a hung renewal keeps the replica leading"
    );
    // The round gave up at the leader's deadline: two thirds of the lease after the last
    // successful renewal was sent, well before another replica could take over.
    let now = Instant::now();
    assert!(now >= until, "gave up before the deadline");
    assert!(
        now < started + Duration::from_millis(900),
        "still waiting {:?} after the renewal was sent",
        now - renewing
    );
}

#[tokio::test]
async fn a_leader_that_cannot_renew_stops_before_its_lease_expires() {
    let fake = Fake::start().await;
    let lock = LeaseLock::new(
        fake.client(),
        "gpu-guard",
        "gpu-guard-controller",
        "replica-a",
        Duration::from_millis(600),
    );
    let mut elector = Elector::new(lock);
    assert!(elector.round().await);
    fake.lock().leases_failing = true;
    // Within two thirds of the lease: still leading, though the renewal failed.
    assert!(elector.round().await);
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(!elector.round().await);
    // The API server answers again: leading again (the lease is still ours).
    fake.lock().leases_failing = false;
    assert!(elector.round().await);
}

#[tokio::test]
async fn of_two_replicas_racing_only_one_wins() {
    let fake = Fake::start().await;
    let mut a = lock(&fake, "replica-a");
    let mut b = lock(&fake, "replica-b");
    let now = Instant::now();
    // Both find no Lease; both create; the API server lets one create succeed.
    let (won_a, won_b) = tokio::join!(
        a.try_acquire_or_renew(at(0), now),
        b.try_acquire_or_renew(at(0), now)
    );
    let (won_a, won_b) = (won_a.expect("a"), won_b.expect("b"));
    assert!(won_a ^ won_b, "a: {won_a}, b: {won_b}");
    let (holder, other) = if won_a {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    assert!(
        holder
            .try_acquire_or_renew(at(1), now)
            .await
            .expect("renew")
    );
    assert!(
        !other
            .try_acquire_or_renew(at(5), now)
            .await
            .expect("blocked")
    );
}

// ---------------------------------------------------------------------------------------------
// The running controller

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
    let options = |identity: &str| Options {
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

// ---------------------------------------------------------------------------------------------
// The command

#[test]
fn the_command_fails_clearly_without_a_usable_kubeconfig() {
    use clap::Parser;
    let cli = gpu_guard::cli::Cli::parse_from([
        "gpu-guard",
        "controller",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--log-level",
        "off",
    ]);
    let report = gpu_guard::cli::run(&cli);
    assert_eq!(report.exit_code, 1);
    assert!(
        report.stderr.contains("/nonexistent/kubeconfig") && report.stderr.contains("--kubeconfig"),
        "{}",
        report.stderr
    );
}
