//! The list/watch stand-in of the scale benchmark (`perf/scale/run.sh`): a large synthetic GPU
//! cluster served over plain HTTP, for gpu-guard's kube client, watchers and reflectors.
//!
//! `scale-standin --listen 127.0.0.1:18080 --nodes 1000` serves `--nodes` GPU nodes (8
//! `nvidia.com/gpu` each), `--gpu-pods-per-node` running pods that hold one GPU and
//! `--other-pods-per-node` running pods that hold none on every node, spread over `--namespaces`
//! namespaces (every second one labelled `gpu-guard.io/enabled: "true"`). Every object is healthy:
//! gpu-guard should make no write. Objects are about the size of real ones (a Pod about 3.3 KB of
//! JSON, a Node about 5 KB; the sizes are printed at start) and are rendered on the fly from one
//! template per kind, so the stand-in stays small at 150,000 pods.
//!
//! What it serves, as the API server does:
//! - lists of Nodes, Pods, Namespaces, PriorityClasses, DaemonSets and the `resource.k8s.io/v1`
//!   collections (empty), paginated with `limit` and an opaque `continue` token, with
//!   `metadata.resourceVersion` and (without selectors) `metadata.remainingItemCount`;
//!   `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`) and `fieldSelector` (`=`, `==`, `!=` on
//!   the fields the API server supports for the kind, a 400 otherwise) applied;
//! - watches (`watch=true`): newline-delimited events, a BOOKMARK every `--bookmark-seconds`
//!   when asked for (`allowWatchBookmarks=true`), ended after `timeoutSeconds`;
//! - with `--pod-updates-per-second R`, MODIFIED events for random pods (the container restart
//!   count goes up, with a new resourceVersion) on every open pod watch, and in later lists;
//! - single Nodes, Pods and Namespaces by name, and plausible answers to the writes gpu-guard may
//!   make (node and pod patches, evictions, Events, Leases), each logged to stderr;
//! - `GET /stand-in/stats`: counts of lists, watches, gets and writes (the script reports writes);
//!   `POST /stand-in/churn?per-second=R` changes the churn rate.
//!
//! Any other path is answered 404 and logged to stderr. Events between a list and the watch that
//! follows it are not replayed (churn only: a quiet cluster has none).
//!
//! Built by `cargo build --release -p gpu-guard-perf --bin scale-standin`; `cargo test` does not
//! build it.

use std::borrow::Cow;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use clap::Parser;
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A list/watch stand-in of a large GPU cluster, over plain HTTP.
#[derive(Debug, Parser)]
#[command(name = "scale-standin")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:18080")]
    listen: SocketAddr,
    /// GPU nodes in the cluster.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Running pods on every node that each hold one nvidia.com/gpu.
    #[arg(long, default_value_t = 8)]
    gpu_pods_per_node: usize,
    /// Running pods on every node that hold no device.
    #[arg(long, default_value_t = 22)]
    other_pods_per_node: usize,
    /// Namespaces the pods are spread over; every second one is opted in to gpu-guard.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    namespaces: u64,
    /// MODIFIED events per second for random pods (0: a quiet cluster).
    #[arg(long, default_value_t = 0.0)]
    pod_updates_per_second: f64,
    /// Seconds between BOOKMARK events on a watch that asked for them.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    bookmark_seconds: u64,
}

/// Every listed object that was never modified carries this resourceVersion; the cluster's
/// resourceVersion starts above it and goes up with every modification.
const BASE_RV: u64 = 100;
const START_RV: u64 = 1_000_000;
/// Bytes rendered before a list response hands a chunk to the connection.
const CHUNK: usize = 256 * 1024;

// === templates ===

/// A value substituted into a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    Name,
    Namespace,
    Node,
    Uid,
    Rv,
    Restarts,
    /// A PriorityClass's value.
    Value,
    Owner,
    OwnerUid,
    PodIp,
    HostIp,
    Gpu,
    Container,
}

impl Var {
    fn parse(name: &str) -> Option<Var> {
        Some(match name {
            "NAME" => Var::Name,
            "NAMESPACE" => Var::Namespace,
            "NODE" => Var::Node,
            "UID" => Var::Uid,
            "RV" => Var::Rv,
            "RESTARTS" => Var::Restarts,
            "VALUE" => Var::Value,
            "OWNER" => Var::Owner,
            "OWNERUID" => Var::OwnerUid,
            "PODIP" => Var::PodIp,
            "HOSTIP" => Var::HostIp,
            "GPU" => Var::Gpu,
            "CONTAINER" => Var::Container,
            _ => return None,
        })
    }
}

#[derive(Debug)]
enum Part {
    Literal(String),
    Var(Var),
}

/// An object's compact JSON split at its placeholders: `"@@NAME@@"` inside a string and
/// `"##RESTARTS##"` for a bare number (the quotes go).
#[derive(Debug)]
struct Template {
    parts: Vec<Part>,
}

impl Template {
    fn new(value: &Value) -> Template {
        let text = value
            .to_string()
            .replace("\"##", "@@")
            .replace("##\"", "@@");
        let mut parts = Vec::new();
        for (at, piece) in text.split("@@").enumerate() {
            if at % 2 == 0 {
                parts.push(Part::Literal(piece.to_owned()));
            } else {
                match Var::parse(piece) {
                    Some(var) => parts.push(Part::Var(var)),
                    // Not a placeholder: keep the text as it was.
                    None => parts.push(Part::Literal(format!("@@{piece}@@"))),
                }
            }
        }
        Template { parts }
    }

    fn render(&self, out: &mut String, mut var: impl FnMut(Var, &mut String)) {
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Var(v) => var(*v, out),
            }
        }
    }
}

// === the cluster ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Nodes,
    Pods,
    Namespaces,
    PriorityClasses,
    DaemonSets,
    ResourceSlices,
    ResourceClaims,
    ResourceClaimTemplates,
    DeviceClasses,
}

/// Collection path, kind, apiVersion.
const KINDS: [(Kind, &str, &str, &str); 9] = [
    (Kind::Nodes, "/api/v1/nodes", "Node", "v1"),
    (Kind::Pods, "/api/v1/pods", "Pod", "v1"),
    (Kind::Namespaces, "/api/v1/namespaces", "Namespace", "v1"),
    (
        Kind::PriorityClasses,
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        "PriorityClass",
        "scheduling.k8s.io/v1",
    ),
    (
        Kind::DaemonSets,
        "/apis/apps/v1/daemonsets",
        "DaemonSet",
        "apps/v1",
    ),
    (
        Kind::ResourceSlices,
        "/apis/resource.k8s.io/v1/resourceslices",
        "ResourceSlice",
        "resource.k8s.io/v1",
    ),
    (
        Kind::ResourceClaims,
        "/apis/resource.k8s.io/v1/resourceclaims",
        "ResourceClaim",
        "resource.k8s.io/v1",
    ),
    (
        Kind::ResourceClaimTemplates,
        "/apis/resource.k8s.io/v1/resourceclaimtemplates",
        "ResourceClaimTemplate",
        "resource.k8s.io/v1",
    ),
    (
        Kind::DeviceClasses,
        "/apis/resource.k8s.io/v1/deviceclasses",
        "DeviceClass",
        "resource.k8s.io/v1",
    ),
];

const PRIORITY_CLASSES: [(&str, i64); 3] = [
    ("system-cluster-critical", 2_000_000_000),
    ("system-node-critical", 2_000_001_000),
    ("training-high", 100_000),
];

/// A pod modified by churn: its resourceVersion and restart count.
#[derive(Debug, Clone, Copy)]
struct Modified {
    rv: u64,
    restarts: u64,
}

struct Cluster {
    nodes: usize,
    gpu_per_node: usize,
    pods_per_node: usize,
    namespaces: u64,
    rv: AtomicU64,
    /// Pods changed by churn, by index (a quiet cluster keeps this empty).
    modified: Mutex<std::collections::HashMap<usize, Modified>>,
    changes: broadcast::Sender<(usize, Modified)>,
    gpu_pod: Template,
    other_pod: Template,
    node: Template,
    namespace: Template,
    enabled_namespace: Template,
    priority_class: Template,
    bookmark_every: Duration,
    /// Pod MODIFIED events per second (`f64` bits), changed by `POST /stand-in/churn`.
    churn_rate: AtomicU64,
    lists: AtomicU64,
    watches: AtomicU64,
    gets: AtomicU64,
    writes: AtomicU64,
}

/// The fields of a pod that selectors and templates read.
struct PodAt {
    node: usize,
    gpu: bool,
    namespace: u64,
}

impl Cluster {
    fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Nodes => self.nodes,
            Kind::Pods => self.nodes * self.pods_per_node,
            Kind::Namespaces => usize::try_from(self.namespaces).unwrap_or(usize::MAX),
            Kind::PriorityClasses => PRIORITY_CLASSES.len(),
            Kind::DaemonSets
            | Kind::ResourceSlices
            | Kind::ResourceClaims
            | Kind::ResourceClaimTemplates
            | Kind::DeviceClasses => 0,
        }
    }

    fn pod_at(&self, index: usize) -> PodAt {
        PodAt {
            node: index / self.pods_per_node,
            gpu: index % self.pods_per_node < self.gpu_per_node,
            namespace: index as u64 % self.namespaces,
        }
    }

    fn pod_state(&self, index: usize) -> Modified {
        let modified = self.modified.lock().unwrap_or_else(|e| e.into_inner());
        modified.get(&index).copied().unwrap_or(Modified {
            rv: BASE_RV,
            restarts: 0,
        })
    }

    /// The value of `field` for the field selector, `None` when the API server does not
    /// support selecting on it for this kind.
    fn field(&self, kind: Kind, index: usize, field: &str) -> Option<Cow<'static, str>> {
        match (kind, field) {
            (Kind::Pods, "metadata.name") => Some(pod_name(index, self.pod_at(index).gpu).into()),
            (Kind::Pods, "metadata.namespace") => {
                Some(namespace_name(self.pod_at(index).namespace).into())
            }
            (Kind::Pods, "spec.nodeName") => Some(node_name(self.pod_at(index).node).into()),
            (Kind::Pods, "status.phase") => Some("Running".into()),
            (Kind::Pods, "spec.restartPolicy") => Some(
                if self.pod_at(index).gpu {
                    "Never"
                } else {
                    "Always"
                }
                .into(),
            ),
            (Kind::Pods, "spec.schedulerName") => Some("default-scheduler".into()),
            (Kind::Pods, "spec.serviceAccountName") => Some("default".into()),
            (Kind::Nodes, "metadata.name") => Some(node_name(index).into()),
            (Kind::Nodes, "spec.unschedulable") => Some("false".into()),
            (Kind::Namespaces, "metadata.name") => Some(namespace_name(index as u64).into()),
            (Kind::Namespaces, "status.phase") => Some("Active".into()),
            (Kind::PriorityClasses, "metadata.name") => {
                Some(PRIORITY_CLASSES.get(index).map_or("", |c| c.0).into())
            }
            (_, "metadata.name" | "metadata.namespace") => Some("".into()),
            _ => None,
        }
    }

    fn label(&self, kind: Kind, index: usize, key: &str) -> Option<String> {
        match kind {
            Kind::Pods => {
                let pod = self.pod_at(index);
                let owner = owner_name(index, pod.gpu);
                match (pod.gpu, key) {
                    (true, "app.kubernetes.io/name") => Some("trainer".into()),
                    (true, "batch.kubernetes.io/job-name" | "job-name") => Some(owner),
                    (true, "batch.kubernetes.io/controller-uid" | "controller-uid") => {
                        Some(owner_uid(index, true))
                    }
                    (false, "app") => Some(owner),
                    (false, "pod-template-hash") => Some("7d4b9c8f5d".into()),
                    _ => None,
                }
            }
            Kind::Nodes => match key {
                "kubernetes.io/hostname" => Some(node_name(index)),
                "kubernetes.io/os" => Some("linux".into()),
                "nvidia.com/gpu.present" => Some("true".into()),
                "node.kubernetes.io/instance-type" => Some("p5.48xlarge".into()),
                _ => None,
            },
            Kind::Namespaces => match key {
                "kubernetes.io/metadata.name" => Some(namespace_name(index as u64)),
                "gpu-guard.io/enabled" if index.is_multiple_of(2) => Some("true".into()),
                _ => None,
            },
            _ => None,
        }
    }

    fn matches(&self, kind: Kind, index: usize, selectors: &Selectors) -> bool {
        selectors.fields.iter().all(|s| {
            let value = self.field(kind, index, &s.key);
            s.holds(value.as_deref())
        }) && selectors.labels.iter().all(|s| {
            let value = self.label(kind, index, &s.key);
            s.holds(value.as_deref())
        })
    }

    /// Appends object `index` of `kind` as compact JSON.
    fn render(&self, kind: Kind, index: usize, out: &mut String) {
        match kind {
            Kind::Pods => self.render_pod(index, self.pod_state(index), out),
            Kind::Nodes => self.node.render(out, |var, out| match var {
                Var::Name | Var::Node => out.push_str(&node_name(index)),
                Var::Uid => out.push_str(&uid(1, index)),
                Var::Rv => push_number(out, BASE_RV),
                Var::HostIp => push_ip(out, 0, index),
                _ => {}
            }),
            Kind::Namespaces => {
                // Every second namespace is opted in.
                let template = if index.is_multiple_of(2) {
                    &self.enabled_namespace
                } else {
                    &self.namespace
                };
                template.render(out, |var, out| match var {
                    Var::Name => out.push_str(&namespace_name(index as u64)),
                    Var::Uid => out.push_str(&uid(3, index)),
                    Var::Rv => push_number(out, BASE_RV),
                    _ => {}
                });
            }
            Kind::PriorityClasses => {
                let (name, value) = PRIORITY_CLASSES.get(index).copied().unwrap_or(("", 0));
                self.priority_class.render(out, |var, out| match var {
                    Var::Name => out.push_str(name),
                    Var::Uid => out.push_str(&uid(4, index)),
                    Var::Rv => push_number(out, BASE_RV),
                    Var::Value => {
                        let _ = write!(out, "{value}");
                    }
                    _ => {}
                });
            }
            _ => out.push_str("{}"),
        }
    }

    fn render_pod(&self, index: usize, state: Modified, out: &mut String) {
        let pod = self.pod_at(index);
        let template = if pod.gpu {
            &self.gpu_pod
        } else {
            &self.other_pod
        };
        template.render(out, |var, out| match var {
            Var::Name => out.push_str(&pod_name(index, pod.gpu)),
            Var::Namespace => out.push_str(&namespace_name(pod.namespace)),
            Var::Node => out.push_str(&node_name(pod.node)),
            Var::Uid => out.push_str(&uid(2, index)),
            Var::Rv => push_number(out, state.rv),
            Var::Restarts => push_number(out, state.restarts),
            Var::Owner => out.push_str(&owner_name(index, pod.gpu)),
            Var::OwnerUid => out.push_str(&owner_uid(index, pod.gpu)),
            Var::PodIp => push_ip(out, 128, index),
            Var::HostIp => push_ip(out, 0, pod.node),
            Var::Gpu => {
                let _ = write!(
                    out,
                    "GPU-{:08x}-5d1e-4c3b-9a7f-{:012x}",
                    pod.node,
                    index % self.pods_per_node
                );
            }
            Var::Container => {
                let _ = write!(out, "{:016x}{:048x}", index, index * 7919);
            }
            Var::Value => {}
        });
    }

    fn kind_of(&self, kind: Kind) -> (&'static str, &'static str) {
        KINDS
            .iter()
            .find(|k| k.0 == kind)
            .map_or(("", ""), |k| (k.2, k.3))
    }
}

fn push_number(out: &mut String, n: u64) {
    let _ = write!(out, "{n}");
}

fn push_ip(out: &mut String, base: usize, index: usize) {
    let _ = write!(
        out,
        "10.{}.{}.{}",
        (base + index / 65536) % 256,
        (index / 256) % 256,
        index % 256
    );
}

fn node_name(index: usize) -> String {
    format!("gpu-node-{index:05}")
}

fn namespace_name(index: u64) -> String {
    format!("team-{index:03}")
}

/// Pod names carry the pod's index second: `train-000042-x7k2p`.
fn pod_name(index: usize, gpu: bool) -> String {
    let suffix = (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    format!(
        "{}-{index:06}-{suffix:06x}",
        if gpu { "train" } else { "web" }
    )
}

/// Pods belong to owners (a Job for GPU pods, a ReplicaSet for the others) in blocks of 64
/// consecutive indexes, so a Job spans a few nodes.
fn owner_name(index: usize, gpu: bool) -> String {
    if gpu {
        format!("train-job-{:05}", index / 64)
    } else {
        format!("web-{:05}-7d4b9c8f5d", index / 64)
    }
}

fn owner_uid(index: usize, gpu: bool) -> String {
    uid(if gpu { 9 } else { 8 }, index / 64)
}

fn uid(tag: u32, index: usize) -> String {
    format!("{tag:08x}-0000-4000-8000-{index:012x}")
}

fn index_in(name: &str, at: usize) -> Option<usize> {
    name.split('-').nth(at)?.parse().ok()
}

// === selectors ===

#[derive(Debug)]
enum Op {
    Equal,
    NotEqual,
    Exists,
    NotExists,
}

#[derive(Debug)]
struct Requirement {
    key: String,
    op: Op,
    value: String,
}

impl Requirement {
    fn holds(&self, actual: Option<&str>) -> bool {
        match self.op {
            Op::Equal => actual == Some(self.value.as_str()),
            // A missing label counts as different, as the API server's selectors have it.
            Op::NotEqual => actual != Some(self.value.as_str()),
            Op::Exists => actual.is_some(),
            Op::NotExists => actual.is_none(),
        }
    }
}

#[derive(Debug, Default)]
struct Selectors {
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

impl Selectors {
    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

fn parse_selector(text: &str, labels: bool) -> Result<Vec<Requirement>, String> {
    if text.contains('(') {
        return Err(format!("set-based selector not supported here: {text}"));
    }
    let mut requirements = Vec::new();
    for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let requirement = if let Some((key, value)) = term.split_once("!=") {
            Requirement {
                key: key.trim().to_owned(),
                op: Op::NotEqual,
                value: value.trim().to_owned(),
            }
        } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
            Requirement {
                key: key.trim().to_owned(),
                op: Op::Equal,
                value: value.trim().to_owned(),
            }
        } else if labels && let Some(key) = term.strip_prefix('!') {
            Requirement {
                key: key.trim().to_owned(),
                op: Op::NotExists,
                value: String::new(),
            }
        } else if labels {
            Requirement {
                key: term.to_owned(),
                op: Op::Exists,
                value: String::new(),
            }
        } else {
            return Err(format!("invalid field selector term: {term}"));
        };
        requirements.push(requirement);
    }
    Ok(requirements)
}

// === HTTP ===

/// A response body fed by a channel: list pages rendered in chunks, and watch streams.
struct ChannelBody {
    chunks: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

fn streamed(chunks: mpsc::Receiver<Bytes>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::new(ChannelBody { chunks }),
    )
        .into_response()
}

fn json_response(code: StatusCode, body: String) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    json_response(
        code,
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code.as_u16(),
        })
        .to_string(),
    )
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        let hex = bytes
            .get(at + 1..at + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (byte, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                at += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                at += 1;
            }
            _ => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_param(uri: &Uri, name: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(key) == name).then(|| percent_decode(value))
    })
}

async fn handle(
    State(cluster): State<Arc<Cluster>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let path = uri.path().trim_end_matches('/');
    if method == Method::GET {
        if path == "/stand-in/stats" {
            return json_response(
                StatusCode::OK,
                json!({
                    "lists": cluster.lists.load(Ordering::Relaxed),
                    "watches": cluster.watches.load(Ordering::Relaxed),
                    "gets": cluster.gets.load(Ordering::Relaxed),
                    "writes": cluster.writes.load(Ordering::Relaxed),
                })
                .to_string(),
            );
        }
        if let Some(&(kind, ..)) = KINDS.iter().find(|k| k.1 == path) {
            return collection(&cluster, kind, &uri);
        }
        if let Some(response) = get_one(&cluster, path) {
            cluster.gets.fetch_add(1, Ordering::Relaxed);
            return response;
        }
        eprintln!("scale-standin: unknown path: GET {uri}");
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "not served by the stand-in",
        );
    }
    if method == Method::POST && path == "/stand-in/churn" {
        let rate = query_param(&uri, "per-second").and_then(|r| r.parse::<f64>().ok());
        return match rate.filter(|r| r.is_finite() && *r >= 0.0) {
            Some(rate) => {
                cluster.churn_rate.store(rate.to_bits(), Ordering::Relaxed);
                eprintln!("scale-standin: {rate} pod updates per second");
                json_response(StatusCode::OK, json!({"perSecond": rate}).to_string())
            }
            None => status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "per-second: a number of pod updates per second, 0 or more",
            ),
        };
    }
    write(&cluster, &method, &uri, &body)
}

fn collection(cluster: &Arc<Cluster>, kind: Kind, uri: &Uri) -> Response {
    let mut selectors = Selectors::default();
    if let Some(text) = query_param(uri, "labelSelector") {
        match parse_selector(&text, true) {
            Ok(labels) => selectors.labels = labels,
            Err(message) => return status(StatusCode::BAD_REQUEST, "BadRequest", &message),
        }
    }
    if let Some(text) = query_param(uri, "fieldSelector") {
        match parse_selector(&text, false) {
            Ok(fields) => selectors.fields = fields,
            Err(message) => return status(StatusCode::BAD_REQUEST, "BadRequest", &message),
        }
        if let Some(unknown) = selectors
            .fields
            .iter()
            .find(|s| cluster.field(kind, 0, &s.key).is_none())
        {
            let (kind_name, _) = cluster.kind_of(kind);
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!(
                    "field label not supported: {} (for {kind_name})",
                    unknown.key
                ),
            );
        }
    }
    let watching = matches!(
        query_param(uri, "watch").as_deref(),
        Some("true" | "1" | "")
    );
    if watching {
        cluster.watches.fetch_add(1, Ordering::Relaxed);
        let timeout = query_param(uri, "timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(1800);
        let bookmarks = query_param(uri, "allowWatchBookmarks").as_deref() == Some("true");
        return watch(cluster, kind, selectors, timeout, bookmarks);
    }
    cluster.lists.fetch_add(1, Ordering::Relaxed);
    let limit = query_param(uri, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|&l| l > 0);
    let (start, rv) = match query_param(uri, "continue").filter(|c| !c.is_empty()) {
        Some(token) => match decode_continue(&token) {
            Some(position) => position,
            None => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "invalid continue token",
                );
            }
        },
        None => (0, cluster.rv.load(Ordering::Relaxed)),
    };
    list(cluster, kind, selectors, start, rv, limit)
}

fn decode_continue(token: &str) -> Option<(usize, u64)> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(token).ok()?).ok()?;
    let (start, rv) = text.split_once('/')?;
    Some((start.parse().ok()?, rv.parse().ok()?))
}

/// A list page rendered on a task in chunks of [`CHUNK`] bytes: the items first, the list's
/// metadata (with the continue token, known once the page is full) at the end.
fn list(
    cluster: &Arc<Cluster>,
    kind: Kind,
    selectors: Selectors,
    start: usize,
    rv: u64,
    limit: Option<usize>,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let cluster = Arc::clone(cluster);
    tokio::spawn(async move {
        let (kind_name, api_version) = cluster.kind_of(kind);
        let total = cluster.count(kind);
        let mut out = String::with_capacity(CHUNK + 16 * 1024);
        let _ = write!(
            out,
            r#"{{"kind":"{kind_name}List","apiVersion":"{api_version}","items":["#
        );
        let mut taken = 0;
        let mut next = None;
        let mut index = start;
        while index < total {
            if cluster.matches(kind, index, &selectors) {
                if limit.is_some_and(|l| taken == l) {
                    next = Some(index);
                    break;
                }
                if taken > 0 {
                    out.push(',');
                }
                cluster.render(kind, index, &mut out);
                taken += 1;
                if out.len() >= CHUNK {
                    let chunk =
                        std::mem::replace(&mut out, String::with_capacity(CHUNK + 16 * 1024));
                    if tx.send(Bytes::from(chunk)).await.is_err() {
                        return;
                    }
                }
            }
            index += 1;
        }
        let _ = write!(out, r#"],"metadata":{{"resourceVersion":"{rv}""#);
        if let Some(next) = next {
            let token = URL_SAFE_NO_PAD.encode(format!("{next}/{rv}"));
            let _ = write!(out, r#","continue":"{token}""#);
            if selectors.is_empty() {
                let _ = write!(out, r#","remainingItemCount":{}"#, total - next);
            }
        }
        out.push_str("}}");
        let _ = tx.send(Bytes::from(out)).await;
    });
    streamed(rx)
}

fn watch(
    cluster: &Arc<Cluster>,
    kind: Kind,
    selectors: Selectors,
    timeout: u64,
    bookmarks: bool,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut changes = cluster.changes.subscribe();
    let cluster = Arc::clone(cluster);
    tokio::spawn(async move {
        let (kind_name, api_version) = cluster.kind_of(kind);
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let mut bookmark = tokio::time::interval_at(
            tokio::time::Instant::now() + cluster.bookmark_every,
            cluster.bookmark_every,
        );
        loop {
            let line = tokio::select! {
                () = &mut deadline => return,
                () = tx.closed() => return,
                _ = bookmark.tick(), if bookmarks => format!(
                    r#"{{"type":"BOOKMARK","object":{{"kind":"{kind_name}","apiVersion":"{api_version}","metadata":{{"resourceVersion":"{}"}}}}}}"#,
                    cluster.rv.load(Ordering::Relaxed)
                ) + "\n",
                change = changes.recv() => match change {
                    Ok((index, state)) if kind == Kind::Pods && cluster.matches(kind, index, &selectors) => {
                        let mut line = String::with_capacity(4096);
                        line.push_str(r#"{"type":"MODIFIED","object":"#);
                        cluster.render_pod(index, state, &mut line);
                        line.push_str("}\n");
                        line
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            if tx.send(Bytes::from(line)).await.is_err() {
                return;
            }
        }
    });
    streamed(rx)
}

fn get_one(cluster: &Cluster, path: &str) -> Option<Response> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut out = String::with_capacity(8192);
    match segments.as_slice() {
        ["api", "v1", "nodes", name] => {
            let index =
                index_in(name, 2).filter(|&i| i < cluster.nodes && node_name(i) == *name)?;
            cluster.render(Kind::Nodes, index, &mut out);
        }
        ["api", "v1", "namespaces", name] => {
            let index = index_in(name, 1).filter(|&i| {
                i < cluster.count(Kind::Namespaces) && namespace_name(i as u64) == *name
            })?;
            cluster.render(Kind::Namespaces, index, &mut out);
        }
        ["api", "v1", "namespaces", namespace, "pods", name, ..] => {
            let index = index_in(name, 1).filter(|&i| {
                i < cluster.count(Kind::Pods)
                    && pod_name(i, cluster.pod_at(i).gpu) == *name
                    && namespace_name(cluster.pod_at(i).namespace) == *namespace
            })?;
            cluster.render(Kind::Pods, index, &mut out);
        }
        _ => return None,
    }
    Some(json_response(StatusCode::OK, out))
}

/// Writes are answered so that nothing blocks, and logged: a healthy cluster should see none.
fn write(cluster: &Cluster, method: &Method, uri: &Uri, body: &Bytes) -> Response {
    let count = cluster.writes.fetch_add(1, Ordering::Relaxed) + 1;
    eprintln!(
        "scale-standin: write #{count}: {method} {uri} ({} bytes)",
        body.len()
    );
    let path = uri.path().trim_end_matches('/');
    if path.ends_with("/eviction") {
        return json_response(
            StatusCode::CREATED,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
                .to_string(),
        );
    }
    if *method == Method::PATCH || *method == Method::PUT {
        // The object as it is (a patch is not applied: the stand-in's objects are generated).
        let trimmed = path.trim_end_matches("/status");
        if let Some(response) = get_one(cluster, trimmed) {
            return response;
        }
    }
    if *method == Method::DELETE {
        return json_response(
            StatusCode::OK,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200})
                .to_string(),
        );
    }
    // Events, Leases and anything else: the object sent, with a resourceVersion.
    let mut object: Value = serde_json::from_slice(body).unwrap_or_else(|_| json!({}));
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert(
            "resourceVersion".into(),
            Value::String(cluster.rv.fetch_add(1, Ordering::Relaxed).to_string()),
        );
    }
    let code = if *method == Method::POST {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    json_response(code, object.to_string())
}

/// Modifies random pods at the churn rate: a new resourceVersion and one more restart each.
async fn churn(cluster: Arc<Cluster>) {
    let pods = cluster.count(Kind::Pods);
    if pods == 0 {
        return;
    }
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    let mut credit = 0.0;
    // xorshift64: the stand-in needs spread, not quality.
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    loop {
        ticks.tick().await;
        let rate = f64::from_bits(cluster.churn_rate.load(Ordering::Relaxed));
        if rate <= 0.0 {
            credit = 0.0;
            continue;
        }
        credit += rate / 100.0;
        while credit >= 1.0 {
            credit -= 1.0;
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let index = usize::try_from(state % pods as u64).unwrap_or(0);
            let rv = cluster.rv.fetch_add(1, Ordering::Relaxed) + 1;
            let changed = {
                let mut modified = cluster.modified.lock().unwrap_or_else(|e| e.into_inner());
                let entry = modified.entry(index).or_insert(Modified {
                    rv: BASE_RV,
                    restarts: 0,
                });
                entry.rv = rv;
                entry.restarts += 1;
                *entry
            };
            // No receiver (no pod watch open) is fine.
            let _ = cluster.changes.send((index, changed));
        }
    }
}

// === the objects ===

fn managed_fields(manager: &str, subresource: Option<&str>, fields: Value) -> Value {
    let mut entry = json!({
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-11-30T08:00:05Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    });
    if let Some(subresource) = subresource {
        entry["subresource"] = json!(subresource);
    }
    entry
}

fn pod_template(gpu: bool) -> Template {
    let (image, container) = if gpu {
        ("nvcr.io/nvidia/pytorch:25.01-py3", "trainer")
    } else {
        ("registry.example.com/platform/web-frontend:3.14.2", "web")
    };
    let mut resources = json!({
        "limits": {"cpu": "8", "memory": "64Gi"},
        "requests": {"cpu": "8", "memory": "64Gi"},
    });
    let mut tolerations = vec![
        json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
        json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
    ];
    let labels;
    let owner;
    if gpu {
        resources["limits"]["nvidia.com/gpu"] = json!("1");
        resources["requests"]["nvidia.com/gpu"] = json!("1");
        tolerations
            .push(json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}));
        labels = json!({
            "app.kubernetes.io/name": "trainer",
            "batch.kubernetes.io/controller-uid": "@@OWNERUID@@",
            "batch.kubernetes.io/job-name": "@@OWNER@@",
            "controller-uid": "@@OWNERUID@@",
            "job-name": "@@OWNER@@",
        });
        owner = json!({"apiVersion": "batch/v1", "kind": "Job", "name": "@@OWNER@@", "uid": "@@OWNERUID@@", "controller": true, "blockOwnerDeletion": true});
    } else {
        resources = json!({
            "limits": {"cpu": "2", "memory": "4Gi"},
            "requests": {"cpu": "500m", "memory": "1Gi"},
        });
        labels = json!({"app": "@@OWNER@@", "pod-template-hash": "7d4b9c8f5d"});
        owner = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "@@OWNER@@", "uid": "@@OWNERUID@@", "controller": true, "blockOwnerDeletion": true});
    }
    let mut container_status = json!({
        "name": container,
        "state": {"running": {"startedAt": "2026-11-30T08:00:41Z"}},
        "lastState": {},
        "ready": true,
        "restartCount": "##RESTARTS##",
        "image": image,
        "imageID": format!("{}@sha256:4f2a9c1e8b7d6a5f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a09", image.split(':').next().unwrap_or(image)),
        "containerID": "containerd://@@CONTAINER@@",
        "started": true,
        "allocatedResources": resources["requests"].clone(),
    });
    if gpu {
        container_status["allocatedResourcesStatus"] = json!([
            {"name": "nvidia.com/gpu", "resources": [{"resourceID": "@@GPU@@", "health": "Healthy"}]},
        ]);
    }
    let command = if gpu {
        json!([
            "torchrun",
            "--nproc-per-node=1",
            "train.py",
            "--config",
            "/etc/train/config.yaml"
        ])
    } else {
        json!(["/web-frontend", "--listen=:8080"])
    };
    let env = if gpu {
        json!([
            {"name": "NCCL_DEBUG", "value": "WARN"},
            {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
            {"name": "TORCH_DISTRIBUTED_DEBUG", "value": "OFF"},
        ])
    } else {
        json!([
            {"name": "LISTEN_ADDR", "value": ":8080"},
            {"name": "LOG_LEVEL", "value": "info"},
        ])
    };
    let condition = |kind: &str| json!({"type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-30T08:00:42Z"});
    let value = json!({
        "metadata": {
            "name": "@@NAME@@",
            "generateName": "@@OWNER@@-",
            "namespace": "@@NAMESPACE@@",
            "uid": "@@UID@@",
            "resourceVersion": "@@RV@@",
            "creationTimestamp": "2026-11-30T08:00:00Z",
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/default-container": container},
            "ownerReferences": [owner],
        },
        "spec": {
            "volumes": [
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                {"name": "kube-api-access-9xk2p", "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                ], "defaultMode": 420}},
            ],
            "containers": [{
                "name": container,
                "image": image,
                "command": command,
                "env": env,
                "resources": resources,
                "volumeMounts": [
                    {"name": "dshm", "mountPath": "/dev/shm"},
                    {"name": "kube-api-access-9xk2p", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": if gpu { "Never" } else { "Always" },
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": "@@NODE@@",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": tolerations,
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                condition("PodReadyToStartContainers"),
                condition("Initialized"),
                condition("Ready"),
                condition("ContainersReady"),
                condition("PodScheduled"),
            ],
            "hostIP": "@@HOSTIP@@",
            "hostIPs": [{"ip": "@@HOSTIP@@"}],
            "podIP": "@@PODIP@@",
            "podIPs": [{"ip": "@@PODIP@@"}],
            "startTime": "2026-11-30T08:00:01Z",
            "containerStatuses": [container_status],
            "qosClass": if gpu { "Guaranteed" } else { "Burstable" },
        },
    });
    Template::new(&value)
}

fn node_template() -> Template {
    let images: Vec<Value> = [
        ("nvcr.io/nvidia/pytorch", "25.01-py3", 10_412_634_112_u64),
        ("nvcr.io/nvidia/k8s-device-plugin", "v0.17.0", 192_774_515),
        ("nvcr.io/nvidia/k8s/dcgm-exporter", "4.1.1-4.0.4-ubuntu22.04", 511_403_212),
        ("nvcr.io/nvidia/gpu-operator", "v25.3.0", 220_381_224),
        ("nvcr.io/nvidia/cloud-native/k8s-driver-manager", "v0.8.0", 283_133_180),
        ("nvcr.io/nvidia/k8s/container-toolkit", "v1.17.5-ubuntu20.04", 187_431_944),
        ("registry.k8s.io/kube-proxy", "v1.36.0", 30_211_412),
        ("registry.example.com/platform/web-frontend", "3.14.2", 88_120_332),
        ("docker.io/calico/node", "v3.29.1", 146_321_771),
        ("registry.k8s.io/pause", "3.10", 320_368),
    ]
    .iter()
    .map(|(name, tag, size)| {
        json!({
            "names": [
                format!("{name}@sha256:9a7b3c1d5e6f40718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"),
                format!("{name}:{tag}"),
            ],
            "sizeBytes": size,
        })
    })
    .collect();
    let condition = |kind: &str, status: &str, reason: &str, message: &str| json!({"type": kind, "status": status, "lastHeartbeatTime": "2026-11-30T09:12:31Z", "lastTransitionTime": "2026-11-29T22:04:10Z", "reason": reason, "message": message});
    let resources = json!({
        "cpu": "192",
        "ephemeral-storage": "7500000000Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": "2113433164Ki",
        "nvidia.com/gpu": "8",
        "pods": "110",
    });
    let value = json!({
        "metadata": {
            "name": "@@NAME@@",
            "uid": "@@UID@@",
            "resourceVersion": "@@RV@@",
            "creationTimestamp": "2026-11-29T22:03:55Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/instance-type": "p5.48xlarge",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": "@@NAME@@",
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/cuda.driver-version.full": "570.124.06",
                "topology.kubernetes.io/region": "us-east-1",
                "topology.kubernetes.io/zone": "us-east-1a",
            },
            "annotations": {
                "csi.volume.kubernetes.io/nodeid": "{\"ebs.csi.aws.com\":\"i-0a1b2c3d4e5f60718\"}",
                "node.alpha.kubernetes.io/ttl": "0",
                "nvidia.com/gpu-driver-upgrade-enabled": "true",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [
                managed_fields("kubelet", None, json!({"f:metadata": {"f:annotations": {}, "f:labels": {}}, "f:spec": {"f:providerID": {}}})),
                managed_fields("kubelet", Some("status"), json!({"f:status": {"f:allocatable": {}, "f:capacity": {}, "f:conditions": {}, "f:images": {}, "f:nodeInfo": {}}})),
            ],
        },
        "spec": {
            "podCIDR": "10.244.0.0/24",
            "podCIDRs": ["10.244.0.0/24"],
            "providerID": "aws:///us-east-1a/i-0a1b2c3d4e5f60718",
        },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "@@HOSTIP@@"},
                {"type": "InternalDNS", "address": "@@NAME@@.ec2.internal"},
                {"type": "Hostname", "address": "@@NAME@@"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "ec2a1b2c3d4e5f60718293a4b5c6d7e8",
                "systemUUID": "ec2a1b2c-3d4e-5f60-7182-93a4b5c6d7e8",
                "bootID": "5c0f6a2e-8d41-4b7a-9e3c-1f2a3b4c5d6e",
                "kernelVersion": "6.8.0-1021-aws",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://2.0.2",
                "kubeletVersion": "v1.36.0",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "swap": {},
            },
            "images": images,
            "runtimeHandlers": [
                {"name": "nvidia", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
                {"name": "runc", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
            ],
            "features": {"supplementalGroupsPolicy": true},
        },
    });
    Template::new(&value)
}

/// The metadata of a cluster-scoped object made when the cluster was.
fn cluster_object_metadata() -> Value {
    json!({
        "name": "@@NAME@@",
        "uid": "@@UID@@",
        "resourceVersion": "@@RV@@",
        "creationTimestamp": "2026-11-29T22:00:00Z",
    })
}

fn namespace_template(enabled: bool) -> Template {
    let mut metadata = cluster_object_metadata();
    metadata["labels"] = json!({"kubernetes.io/metadata.name": "@@NAME@@"});
    if enabled {
        metadata["labels"]["gpu-guard.io/enabled"] = json!("true");
    }
    Template::new(&json!({
        "metadata": metadata,
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }))
}

fn priority_class_template() -> Template {
    Template::new(&json!({
        "metadata": cluster_object_metadata(),
        "value": "##VALUE##",
        "globalDefault": false,
        "preemptionPolicy": "PreemptLowerPriority",
    }))
}

fn with_kind(kind: &str, api_version: &str, template: Template) -> Template {
    // Every object of a list carries its kind and apiVersion, as the API server's do.
    let mut parts = vec![Part::Literal(format!(
        r#"{{"kind":"{kind}","apiVersion":"{api_version}","#
    ))];
    let mut rest = template.parts.into_iter();
    if let Some(Part::Literal(first)) = rest.next() {
        parts.push(Part::Literal(first.trim_start_matches('{').to_owned()));
    }
    parts.extend(rest);
    Template { parts }
}

fn main() {
    let args = Args::parse();
    let pods_per_node = args.gpu_pods_per_node + args.other_pods_per_node;
    if pods_per_node == 0 || args.gpu_pods_per_node > 8 {
        eprintln!(
            "scale-standin: need at least one pod per node and at most 8 GPU pods per node (8 GPUs)"
        );
        std::process::exit(2);
    }
    let cluster = Arc::new(Cluster {
        nodes: args.nodes,
        gpu_per_node: args.gpu_pods_per_node,
        pods_per_node,
        namespaces: args.namespaces,
        rv: AtomicU64::new(START_RV),
        modified: Mutex::default(),
        changes: broadcast::channel(4096).0,
        gpu_pod: with_kind("Pod", "v1", pod_template(true)),
        other_pod: with_kind("Pod", "v1", pod_template(false)),
        node: with_kind("Node", "v1", node_template()),
        namespace: with_kind("Namespace", "v1", namespace_template(false)),
        enabled_namespace: with_kind("Namespace", "v1", namespace_template(true)),
        priority_class: with_kind(
            "PriorityClass",
            "scheduling.k8s.io/v1",
            priority_class_template(),
        ),
        bookmark_every: Duration::from_secs(args.bookmark_seconds),
        churn_rate: AtomicU64::new(args.pod_updates_per_second.to_bits()),
        lists: AtomicU64::new(0),
        watches: AtomicU64::new(0),
        gets: AtomicU64::new(0),
        writes: AtomicU64::new(0),
    });
    let size = |kind: Kind, index: usize| {
        let mut out = String::new();
        cluster.render(kind, index, &mut out);
        out.len()
    };
    eprintln!(
        "scale-standin: {} nodes ({} bytes each), {} pods ({} bytes with a GPU, {} without), {} namespaces",
        args.nodes,
        size(Kind::Nodes, 0),
        cluster.count(Kind::Pods),
        size(Kind::Pods, 0),
        size(Kind::Pods, pods_per_node - 1),
        args.namespaces,
    );
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("scale-standin: cannot start the runtime: {error}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("scale-standin: cannot listen on {}: {error}", args.listen);
                std::process::exit(1);
            }
        };
        eprintln!("scale-standin: listening on http://{}", args.listen);
        tokio::spawn(churn(Arc::clone(&cluster)));
        let app = Router::new().fallback(handle).with_state(cluster);
        if let Err(error) = axum::serve(listener, app).await {
            eprintln!("scale-standin: {error}");
            std::process::exit(1);
        }
    });
}
