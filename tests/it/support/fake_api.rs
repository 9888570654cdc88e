//! One fake API server on a loopback port, over plain HTTP, for the real kube client, watcher,
//! reflectors and event recorder.
//!
//! It serves what kube asks of the collections the caches read (Nodes, Pods, Namespaces,
//! PriorityClasses): the list (`GET <collection>?limit=500`, with `labelSelector` applied) as a
//! `*List` carrying `metadata.resourceVersion`, and the watch
//! (`?watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=N`) as a stream of
//! newline-delimited watch events. It applies and records the writes the controller sends:
//! node merge patches with their resourceVersion precondition, pod status patches, evictions,
//! Events, Leases; a write with `dryRun=All` is answered and recorded, not applied. A test changes objects silently ([`Fake::set`], [`Fake::remove`]: the next
//! list shows it) or with a watch event ([`Fake::put`], [`Fake::event`]); sends `410 Gone`;
//! holds lists or watches unanswered; ends the watch streams; delays or refuses writes, and
//! delays watch events, through [`State`]; and reads the log of requests.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

pub const NODES: &str = "/api/v1/nodes";
pub const PODS: &str = "/api/v1/pods";
pub const NAMESPACES: &str = "/api/v1/namespaces";
pub const CLASSES: &str = "/apis/scheduling.k8s.io/v1/priorityclasses";
pub const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/gpu-guard/leases";
pub const CLAIM_TEMPLATES: &str = "/apis/resource.k8s.io/v1/resourceclaimtemplates";
pub const CLAIMS: &str = "/apis/resource.k8s.io/v1/resourceclaims";
pub const DEVICE_CLASSES: &str = "/apis/resource.k8s.io/v1/deviceclasses";
pub const RESOURCE_SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
pub const DAEMONSETS: &str = "/apis/apps/v1/daemonsets";
pub const JOBS: &str = "/apis/batch/v1/jobs";
pub const JOBSETS: &str = "/apis/jobset.x-k8s.io/v1alpha2/jobsets";

/// The collections served: path, kind, apiVersion.
const COLLECTIONS: [(&str, &str, &str); 11] = [
    (NODES, "Node", "v1"),
    (PODS, "Pod", "v1"),
    (NAMESPACES, "Namespace", "v1"),
    (CLASSES, "PriorityClass", "scheduling.k8s.io/v1"),
    (
        CLAIM_TEMPLATES,
        "ResourceClaimTemplate",
        "resource.k8s.io/v1",
    ),
    (CLAIMS, "ResourceClaim", "resource.k8s.io/v1"),
    (DEVICE_CLASSES, "DeviceClass", "resource.k8s.io/v1"),
    (RESOURCE_SLICES, "ResourceSlice", "resource.k8s.io/v1"),
    (DAEMONSETS, "DaemonSet", "apps/v1"),
    (JOBS, "Job", "batch/v1"),
    (JOBSETS, "JobSet", "jobset.x-k8s.io/v1alpha2"),
];

// === the log ===

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: Method,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    pub authorization: Option<String>,
    pub body: Value,
    /// When the request arrived (before any delay the fake holds it for).
    pub received: Instant,
    /// When its answer was sent; `None` while it is held (or for a watch, once open).
    pub answered: Option<Instant>,
    /// Tells the requests apart, to record the answer of this one.
    seq: u64,
}

impl Logged {
    pub fn is_watch(&self) -> bool {
        self.param("watch") == Some("true")
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    pub fn is_write(&self) -> bool {
        !matches!(self.method, Method::GET)
    }

    pub fn is_event(&self) -> bool {
        self.path.starts_with("/apis/events.k8s.io/")
    }
}

// === the state ===

pub struct Collection {
    kind: &'static str,
    api_version: &'static str,
    /// By `namespace/name` (namespaced) or `name`.
    pub objects: BTreeMap<String, Value>,
    watchers: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Lists are answered while true.
    lists_open: watch::Sender<bool>,
    /// Watches are answered while true.
    watches_open: watch::Sender<bool>,
}

impl Collection {
    fn new(kind: &'static str, api_version: &'static str) -> Self {
        Self {
            kind,
            api_version,
            objects: BTreeMap::new(),
            watchers: Vec::new(),
            lists_open: watch::Sender::new(true),
            watches_open: watch::Sender::new(true),
        }
    }

    /// Sends a watch event line to the open watches, forgetting the closed ones.
    fn send(&mut self, event: &Value) {
        self.send_line(event_line(event));
    }

    fn send_line(&mut self, line: Bytes) {
        self.watchers
            .retain(|watcher| watcher.send(line.clone()).is_ok());
    }
}

fn event_line(event: &Value) -> Bytes {
    let mut line = serde_json::to_vec(event).expect("event JSON");
    line.push(b'\n');
    Bytes::from(line)
}

/// A watch event held back: when it is due, the collection, the line.
type Delayed = (tokio::time::Instant, String, Bytes);

impl Collection {
    /// Whether some watch is open (a dry-run write takes them away: its events go nowhere).
    fn watched(&self) -> bool {
        !self.watchers.is_empty()
    }
}

/// What the fake holds; a test changes the knobs through [`Fake::lock`].
pub struct State {
    resource_version: u64,
    pub collections: BTreeMap<&'static str, Collection>,
    pub leases: BTreeMap<String, Value>,
    pub requests: Vec<Logged>,
    /// The next node patches answered 409 after `conflict_change` is applied to the node.
    pub node_conflicts: usize,
    /// The next patches of a namespaced object (a Job, a JobSet) answered 409 after someone
    /// else changed the object (its resourceVersion moves on).
    pub object_conflicts: usize,
    pub conflict_change: Option<fn(&mut Value)>,
    /// The status evictions are answered with (201 by default; 429: throttled, as API Priority
    /// and Fairness answers).
    pub eviction_status: Option<u16>,
    /// Lease requests are answered 500 while true.
    pub leases_failing: bool,
    /// Pods (by name) whose eviction a PodDisruptionBudget refuses (429).
    pub eviction_refused: BTreeSet<String>,
    /// Pods (by name) whose eviction is answered with this HTTP status and body instead: a
    /// 403 of a budget whose disruptionsAllowed is negative, the 201 with a `Failure` Status
    /// of a pod with two budgets.
    pub eviction_answers: BTreeMap<String, (u16, Value)>,
    /// Lease requests are held this long before they are answered (a hung API server).
    pub lease_delay: Option<Duration>,
    /// Pod status patches are held this long before they are applied.
    pub status_delay: Option<Duration>,
    /// Node patches are held this long before they are applied (a slow API server).
    pub node_patch_delay: Option<Duration>,
    /// Event writes are held this long before they are answered (a slow Event endpoint).
    pub event_delay: Option<Duration>,
    /// The next node status patches answered 500.
    pub node_status_failures: usize,
    /// Numbers the requests ([`Logged`]).
    next_seq: u64,
    /// Watch events reach the open watches this long after the change they report (a watch
    /// that lags the writes, as under load): in order, each no sooner than its delay.
    pub watch_delay: Option<Duration>,
    /// The queue of held watch events ([`State::watch_delay`]), drained by a task of the fake.
    delayed: Option<mpsc::UnboundedSender<Delayed>>,
}

/// What a dry-run write must leave as it was.
pub struct Kept {
    resource_version: u64,
    objects: BTreeMap<&'static str, BTreeMap<String, Value>>,
    watchers: BTreeMap<&'static str, Vec<mpsc::UnboundedSender<Bytes>>>,
    leases: BTreeMap<String, Value>,
}

impl State {
    /// Keeps the objects, the resourceVersion and the Leases, and takes the watchers away, so
    /// a dry-run write is answered as it would be and changes nothing, unseen.
    fn take_for_dry_run(&mut self) -> Kept {
        Kept {
            resource_version: self.resource_version,
            objects: self
                .collections
                .iter()
                .map(|(path, collection)| (*path, collection.objects.clone()))
                .collect(),
            watchers: self
                .collections
                .iter_mut()
                .map(|(path, collection)| (*path, std::mem::take(&mut collection.watchers)))
                .collect(),
            leases: self.leases.clone(),
        }
    }

    fn restore_after_dry_run(&mut self, kept: Kept) {
        self.resource_version = kept.resource_version;
        self.leases = kept.leases;
        for (path, objects) in kept.objects {
            if let Some(collection) = self.collections.get_mut(path) {
                collection.objects = objects;
            }
        }
        for (path, watchers) in kept.watchers {
            if let Some(collection) = self.collections.get_mut(path) {
                collection.watchers = watchers;
            }
        }
    }

    /// Stores `object` with the next resourceVersion, silently; returns it as stored.
    fn store(&mut self, path: &str, mut object: Value) -> Value {
        self.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        let collection = self.collections.get_mut(path).expect("collection");
        collection.objects.insert(key_of(&object), object.clone());
        object
    }

    /// Applies a watch event of `type_` (`ADDED`, `MODIFIED`, `DELETED`; `None`: ADDED or
    /// MODIFIED, whichever is true) and sends it to the open watches; returns the object.
    fn apply(&mut self, path: &str, type_: Option<&str>, object: Value) -> Value {
        let known = self.collections[path]
            .objects
            .contains_key(&key_of(&object));
        let type_ = type_.unwrap_or(if known { "MODIFIED" } else { "ADDED" });
        let object = self.store(path, object);
        let collection = self.collections.get_mut(path).expect("collection");
        if type_ == "DELETED" {
            collection.objects.remove(&key_of(&object));
        }
        let event = json!({"type": type_, "object": object});
        match (self.watch_delay, &self.delayed) {
            (Some(delay), Some(queue)) if collection.watched() => {
                let due = tokio::time::Instant::now() + delay;
                let _ = queue.send((due, path.to_owned(), event_line(&event)));
            }
            _ => collection.send(&event),
        }
        object
    }
}

fn key_of(object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().expect("a name");
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "reason": reason, "message": message, "code": code})
}

// === the server ===

#[derive(Clone)]
pub struct Fake {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Fake {
    pub async fn start() -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let state = State {
            resource_version: 1,
            collections: COLLECTIONS
                .iter()
                .map(|(path, kind, api_version)| (*path, Collection::new(kind, api_version)))
                .collect(),
            leases: BTreeMap::new(),
            requests: Vec::new(),
            node_conflicts: 0,
            object_conflicts: 0,
            conflict_change: None,
            eviction_status: None,
            leases_failing: false,
            eviction_refused: BTreeSet::new(),
            eviction_answers: BTreeMap::new(),
            lease_delay: None,
            status_delay: None,
            node_status_failures: 0,
            node_patch_delay: None,
            event_delay: None,
            next_seq: 0,
            watch_delay: None,
            delayed: None,
        };
        let fake = Fake {
            addr,
            state: Arc::new(Mutex::new(state)),
        };
        // Held watch events go out in order, each when it is due.
        let (queue, mut held) = mpsc::unbounded_channel::<Delayed>();
        fake.lock().delayed = Some(queue);
        let state = fake.state.clone();
        tokio::spawn(async move {
            while let Some((due, path, line)) = held.recv().await {
                tokio::time::sleep_until(due).await;
                let mut state = state.lock().expect("fake state");
                if let Some(collection) = state.collections.get_mut(path.as_str()) {
                    collection.send_line(line);
                }
            }
        });
        let server = fake.clone();
        serve(listener, move |request| server.clone().handle(request));
        fake
    }

    /// Stops serving the collection at `path` (its lists answer `404`), as an API server that
    /// does not serve that API (`resource.k8s.io/v1` before Kubernetes 1.34).
    pub fn unserve(&self, path: &str) {
        self.lock().collections.remove(path);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn config(&self) -> kube::Config {
        let _ = rustls::crypto::ring::default_provider().install_default();
        kube::Config::new(self.url().parse().expect("URL"))
    }

    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("kube client")
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
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
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header("content-type");
        let authorization = header("authorization");
        let bytes = axum::body::to_bytes(axum::body::Body::new(request.into_body()), usize::MAX)
            .await
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let mut logged = Logged {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            content_type,
            authorization,
            body: body.clone(),
            received: Instant::now(),
            answered: None,
            seq: 0,
        };
        let watch = logged.is_watch();
        let collection_read = method == Method::GET;

        // A held list or watch, or a delayed write, waits here (outside the lock).
        let (gate, delay, seq) = {
            let mut state = self.lock();
            let seq = state.next_seq;
            state.next_seq += 1;
            logged.seq = seq;
            state.requests.push(logged);
            let (gate, delay) = match state.collections.get(path.as_str()) {
                Some(collection) if collection_read => {
                    let gate = if watch {
                        &collection.watches_open
                    } else {
                        &collection.lists_open
                    };
                    (Some(gate.subscribe()), None)
                }
                _ if path.starts_with("/apis/coordination.k8s.io/") => (None, state.lease_delay),
                _ if path.starts_with("/apis/events.k8s.io/") => (None, state.event_delay),
                _ if method == Method::PATCH && path.ends_with("/status") => {
                    (None, state.status_delay)
                }
                _ if method == Method::PATCH && path.starts_with("/api/v1/nodes/") => {
                    (None, state.node_patch_delay)
                }
                _ => (None, None),
            };
            (gate, delay, seq)
        };
        if let Some(mut gate) = gate {
            let _ = gate.wait_for(|open| *open).await;
        }
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }

        let mut state = self.lock();
        // `dryRun=All`: answered as the write would be, and nothing kept (no watch event).
        // A DELETE carries it in its DeleteOptions body (`dryRun: ["All"]`), as kube sends it.
        let dry_run = (query.get("dryRun").map(String::as_str) == Some("All")
            || (method == Method::DELETE && body["dryRun"] == json!(["All"])))
            && method != Method::GET;
        let before = dry_run.then(|| state.take_for_dry_run());
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let response = match (&method, segments.as_slice()) {
            (&Method::GET, _) if state.collections.contains_key(path.as_str()) => {
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
            (&Method::GET, ["apis", group, version, "namespaces", ns, plural, name])
                if state
                    .collections
                    .contains_key(format!("/apis/{group}/{version}/{plural}").as_str()) =>
            {
                let path = format!("/apis/{group}/{version}/{plural}");
                match state.collections[path.as_str()]
                    .objects
                    .get(&format!("{ns}/{name}"))
                {
                    Some(object) => (StatusCode::OK, object.clone()),
                    None => (StatusCode::NOT_FOUND, status(404, "NotFound", "not found")),
                }
            }
            (&Method::PATCH, ["apis", group, version, "namespaces", ns, plural, name])
                if state
                    .collections
                    .contains_key(format!("/apis/{group}/{version}/{plural}").as_str()) =>
            {
                let path = format!("/apis/{group}/{version}/{plural}");
                patch_object(&mut state, &path, &format!("{ns}/{name}"), body)
            }
            (&Method::PATCH, ["api", "v1", "nodes", name, "status"]) => {
                patch_node_status(&mut state, name, &body)
            }
            (&Method::DELETE, ["api", "v1", "namespaces", ns, "pods", name]) => {
                delete_pod(&mut state, &format!("{ns}/{name}"), &body)
            }
            (&Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
                patch_pod_status(&mut state, &format!("{ns}/{name}"), &body)
            }
            (&Method::POST, ["api", "v1", "namespaces", ns, "pods", pod, "eviction"]) => {
                let refused = state.eviction_refused.contains(*pod);
                let canned = state.eviction_answers.get(*pod).cloned();
                let wanted = body["deleteOptions"]["preconditions"]["uid"].as_str();
                let current = state.collections[PODS]
                    .objects
                    .get(&format!("{ns}/{pod}"))
                    .and_then(|object| object["metadata"]["uid"].as_str());
                match state.eviction_status {
                    // As the eviction subresource checks a UID precondition before deleting
                    // (k8s.io/apiserver `rest.BeforeDelete`: 409 Conflict).
                    _ if wanted.is_some() && current.is_some() && wanted != current => (
                        StatusCode::CONFLICT,
                        status(
                            409,
                            "Conflict",
                            &format!(
                                "Operation cannot be fulfilled on Pod \"{pod}\": the UID in the \
                                 precondition ({}) does not match the UID in record ({}). The \
                                 object might have been deleted and then recreated",
                                wanted.unwrap_or_default(),
                                current.unwrap_or_default()
                            ),
                        ),
                    ),
                    _ if canned.is_some() => {
                        let (code, body) = canned.unwrap_or_default();
                        (StatusCode::from_u16(code).expect("an HTTP status"), body)
                    }
                    // As the eviction subresource refuses for a PodDisruptionBudget.
                    _ if refused => {
                        let mut refusal = status(
                            429,
                            "TooManyRequests",
                            "Cannot evict pod as it would violate the pod's disruption budget.",
                        );
                        refusal["details"] = json!({"causes": [{"reason": "DisruptionBudget",
                            "message": "The disruption budget train needs 2 healthy pods and has 2 currently"}]});
                        (StatusCode::TOO_MANY_REQUESTS, refusal)
                    }
                    // As API Priority and Fairness throttles: no disruption budget cause.
                    Some(429) => (
                        StatusCode::TOO_MANY_REQUESTS,
                        status(
                            429,
                            "TooManyRequests",
                            "Too many requests, please try again later.",
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
        if let Some(before) = before {
            state.restore_after_dry_run(before);
        }
        if let Some(logged) = state.requests.iter_mut().rev().find(|r| r.seq == seq) {
            logged.answered = Some(Instant::now());
        }
        Ok(json_response(response.0, &response.1))
    }

    // === objects ===

    /// Puts `object` into the collection silently (the next list shows it); returns its
    /// resourceVersion.
    pub fn set(&self, path: &str, object: Value) -> String {
        let object = self.lock().store(path, object);
        object["metadata"]["resourceVersion"]
            .as_str()
            .expect("resourceVersion")
            .to_owned()
    }

    /// Takes `name` out of the collection, silently.
    pub fn remove(&self, path: &str, name: &str) {
        let mut state = self.lock();
        state.resource_version += 1;
        state
            .collections
            .get_mut(path)
            .expect("collection")
            .objects
            .remove(name);
    }

    /// Puts `object` into the collection and tells the open watches (ADDED or MODIFIED).
    pub fn put(&self, path: &str, object: Value) {
        self.lock().apply(path, None, object);
    }

    /// Applies an ADDED, MODIFIED or DELETED event to the collection and sends it to the open
    /// watches; returns the event's resourceVersion.
    pub fn event(&self, path: &str, type_: &str, object: Value) -> String {
        let object = self.lock().apply(path, Some(type_), object);
        object["metadata"]["resourceVersion"]
            .as_str()
            .expect("resourceVersion")
            .to_owned()
    }

    /// Sends an ERROR event with `code` (410: the resourceVersion is too old) to the open watches.
    pub fn error_event(&self, path: &str, code: u16) {
        let mut state = self.lock();
        let collection = state.collections.get_mut(path).expect("collection");
        collection.send(&json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version", "reason": "Expired", "code": code}}));
    }

    /// The next node patch meets a 409 Conflict: `change` (someone else's write) is applied to
    /// the node first.
    pub fn conflict_once(&self, change: fn(&mut Value)) {
        let mut state = self.lock();
        state.node_conflicts = 1;
        state.conflict_change = Some(change);
    }

    pub fn object(&self, path: &str, key: &str) -> Value {
        self.lock().collections[path].objects[key].clone()
    }

    // === lists and watches ===

    /// Ends the open watch streams (cleanly, as an API server does on its watch timeout).
    pub fn end_watches(&self, path: &str) {
        self.lock()
            .collections
            .get_mut(path)
            .expect("collection")
            .watchers
            .clear();
    }

    pub fn hold_lists(&self, path: &str, hold: bool) {
        self.lock().collections[path].lists_open.send_replace(!hold);
    }

    pub fn hold_watches(&self, path: &str, hold: bool) {
        self.lock().collections[path]
            .watches_open
            .send_replace(!hold);
    }

    /// Watch streams of `path` still read by a client.
    pub fn open_watches(&self, path: &str) -> usize {
        self.lock().collections[path]
            .watchers
            .iter()
            .filter(|watcher| !watcher.is_closed())
            .count()
    }

    /// Watch streams of every collection still read by a client.
    pub fn open_watches_total(&self) -> usize {
        COLLECTIONS
            .iter()
            .map(|(path, _, _)| self.open_watches(path))
            .sum()
    }

    // === the log ===

    pub fn requests(&self) -> Vec<Logged> {
        self.lock().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.lock().requests.clear();
    }

    pub fn lists(&self, path: &str) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|request| request.path == path && !request.is_watch())
            .collect()
    }

    pub fn watches(&self, path: &str) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|request| request.path == path && request.is_watch())
            .collect()
    }

    /// The writes received, Events left out.
    pub fn writes(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|request| request.is_write() && !request.is_event())
            .collect()
    }

    /// The Events created: (reason, regarding name, note).
    pub fn events(&self) -> Vec<(String, String, String)> {
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
    json_response(
        StatusCode::OK,
        &json!({"kind": format!("{}List", collection.kind),
                "apiVersion": collection.api_version,
                "metadata": {"resourceVersion": resource_version.to_string()},
                "items": items}),
    )
}

// === writes ===

/// A JSON merge patch with the resourceVersion precondition, as the API server applies it.
fn patch_node(state: &mut State, name: &str, patch: Value) -> (StatusCode, Value) {
    if state.node_conflicts > 0 {
        state.node_conflicts -= 1;
        if let Some(change) = state.conflict_change {
            let mut node = state.collections[NODES].objects[name].clone();
            change(&mut node);
            state.apply(NODES, None, node);
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
    (StatusCode::OK, state.apply(NODES, None, node))
}

/// A strategic merge patch of a node's status.conditions, as the API server applies it to
/// `nodes/{name}/status`: merged by `type` (k8s.io/api `NodeStatus.conditions`,
/// `patchMergeKey=type`), an element `{"type": T, "$patch": "delete"}` removes the condition of
/// type T; the node's other conditions stay.
fn patch_node_status(state: &mut State, name: &str, patch: &Value) -> (StatusCode, Value) {
    if state.node_status_failures > 0 {
        state.node_status_failures -= 1;
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            status(500, "InternalError", "etcd is unhappy"),
        );
    }
    let Some(mut node) = state.collections[NODES].objects.get(name).cloned() else {
        return (StatusCode::NOT_FOUND, status(404, "NotFound", "no node"));
    };
    merge_conditions(&mut node, patch);
    (StatusCode::OK, state.apply(NODES, None, node))
}

/// Merges the patch's `status.conditions` into the object's as a strategic merge patch does
/// (merge key `type`): a condition of a new type is appended, one of a known type merged into
/// it, and `{"type": T, "$patch": "delete"}` removes the condition of type T.
fn merge_conditions(object: &mut Value, patch: &Value) {
    let mut merged: Vec<Value> = object["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for condition in patch["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let at = merged.iter().position(|c| c["type"] == condition["type"]);
        match (at, condition.get("$patch").and_then(Value::as_str)) {
            (Some(at), Some("delete")) => {
                merged.remove(at);
            }
            (None, Some("delete")) => {}
            (Some(at), _) => json_patch::merge(&mut merged[at], condition),
            (None, _) => merged.push(condition.clone()),
        }
    }
    object["status"]["conditions"] = json!(merged);
}

/// A pod DELETE with its options (`gracePeriodSeconds`, a uid precondition): with grace period
/// 0 the pod is gone at once (a DELETED watch event), as a force deletion removes it; a uid
/// that is not the pod's is refused as the API server refuses it (409 Conflict).
fn delete_pod(state: &mut State, key: &str, options: &Value) -> (StatusCode, Value) {
    let Some(pod) = state.collections[PODS].objects.get(key).cloned() else {
        return (
            StatusCode::NOT_FOUND,
            status(404, "NotFound", "pods not found"),
        );
    };
    let current = pod["metadata"]["uid"].as_str().unwrap_or_default();
    if let Some(wanted) = options["preconditions"]["uid"].as_str()
        && wanted != current
    {
        return (
            StatusCode::CONFLICT,
            status(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on Pod \"{key}\": Precondition failed: UID in                      precondition: {wanted}, UID in object meta: {current}"
                ),
            ),
        );
    }
    if options["gracePeriodSeconds"] == json!(0) {
        (StatusCode::OK, state.apply(PODS, Some("DELETED"), pod))
    } else {
        let mut deleting = pod;
        deleting["metadata"]["deletionTimestamp"] = json!("2027-01-15T08:00:00Z");
        (StatusCode::OK, state.apply(PODS, None, deleting))
    }
}

/// A JSON merge patch of a namespaced object of the collection at `path`, with the
/// resourceVersion precondition, as the API server applies it.
fn patch_object(state: &mut State, path: &str, key: &str, patch: Value) -> (StatusCode, Value) {
    let collection = COLLECTIONS
        .iter()
        .find(|(known, _, _)| *known == path)
        .map(|(known, _, _)| *known)
        .expect("a served collection");
    let Some(mut object) = state.collections[collection].objects.get(key).cloned() else {
        return (StatusCode::NOT_FOUND, status(404, "NotFound", "not found"));
    };
    if state.object_conflicts > 0 {
        state.object_conflicts -= 1;
        // Someone else's write (the Job controller's status update) moves it on.
        object = state.apply(collection, None, object);
    }
    let wanted = patch["metadata"]["resourceVersion"].as_str();
    if wanted.is_some_and(|wanted| Some(wanted) != object["metadata"]["resourceVersion"].as_str()) {
        return (
            StatusCode::CONFLICT,
            status(
                409,
                "Conflict",
                "Operation cannot be fulfilled: the object has been modified; please apply your \
                 changes to the latest version and try again",
            ),
        );
    }
    json_patch::merge(&mut object, &patch);
    (StatusCode::OK, state.apply(collection, None, object))
}

/// A strategic merge patch of status.conditions (merge key `type`). A `metadata.uid` in the
/// patch that is not the pod's is refused as the API server refuses it: `metadata.uid` is
/// immutable (422 Invalid, k8s.io/apimachinery `ValidateObjectMetaUpdate`).
fn patch_pod_status(state: &mut State, key: &str, patch: &Value) -> (StatusCode, Value) {
    let Some(mut pod) = state.collections[PODS].objects.get(key).cloned() else {
        return (StatusCode::NOT_FOUND, status(404, "NotFound", "no pod"));
    };
    if let Some(uid) = patch["metadata"]["uid"].as_str()
        && pod["metadata"]["uid"].as_str() != Some(uid)
    {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let mut invalid = status(
            422,
            "Invalid",
            &format!(
                "Pod \"{name}\" is invalid: metadata.uid: Invalid value: \"{uid}\": field is immutable"
            ),
        );
        invalid["details"] = json!({"name": name, "kind": "Pod", "causes": [
            {"reason": "FieldValueInvalid", "message": "Invalid value: \"...\": field is immutable",
             "field": "metadata.uid"}]});
        return (StatusCode::UNPROCESSABLE_ENTITY, invalid);
    }
    merge_conditions(&mut pod, patch);
    (StatusCode::OK, state.apply(PODS, None, pod))
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

// === HTTP plumbing ===

/// A JSON response with `status`.
pub fn json_response(status: StatusCode, body: &Value) -> Response<FakeBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(FakeBody::Full(Some(Bytes::from(
            serde_json::to_vec(body).expect("JSON"),
        ))))
        .expect("response")
}

/// A whole body, or a stream of watch event lines that ends when the fake drops its sender.
pub enum FakeBody {
    Full(Option<Bytes>),
    Stream(mpsc::UnboundedReceiver<Bytes>),
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            FakeBody::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            FakeBody::Stream(lines) => lines
                .poll_recv(cx)
                .map(|line| line.map(|line| Ok(Frame::data(line)))),
        }
    }
}

/// Serves HTTP/1.1 on `listener` for ever, each request answered by `handle`.
fn serve<F, R>(listener: TcpListener, handle: F)
where
    F: Fn(Request<Incoming>) -> R + Clone + Send + Sync + 'static,
    R: Future<Output = Result<Response<FakeBody>, Infallible>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(handle);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}
