//! The reconciler: caches of Nodes, Pods and opted-in Namespaces (kube reflectors), and a pass
//! that judges every node and pod with the pure decisions ([`node_verdict`], [`pod_verdict`])
//! and applies them: taint patches, pod condition patches, evictions, Events, metrics.
//!
//! A pass reads the caches only; it calls the API server only to change something (or to read
//! a node again after a conflict). In a dry run it changes nothing: Events, logs and metrics
//! say what it would have done.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, PodSpec, PodStatus};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::lease::Leadership;
use super::metrics::ControllerMetrics;
use super::node::{
    self, Decision, NodeHistory, Ownership, TAINT_KEY, Verdict, node_verdict, ownership,
};
use super::pod::{self, Action, Cause, NodeState, pod_verdict};
use super::{EVENT_REPORTER, NAMESPACE_OPT_IN_LABEL};
use crate::policy::Policy;

/// Event reasons.
pub const REASON_DEGRADED: &str = "DeviceDegraded";
pub const REASON_RECOVERED: &str = "DeviceRecovered";
pub const REASON_SAFETY_VALVE: &str = "SafetyValve";
pub const REASON_MARKED: &str = "DeviceFailureMarked";
pub const REASON_EVICTED: &str = "Evicted";

/// The pods the controller caches.
pub const POD_FIELD_SELECTOR: &str = "spec.nodeName!=,status.phase!=Succeeded";

/// Attempts of a node taint patch that meets a conflict (someone else changed the node).
const NODE_PATCH_ATTEMPTS: usize = 3;

/// The first wait before evicting again a pod whose eviction a PodDisruptionBudget refused;
/// doubled on each further refusal, up to [`EVICTION_BACKOFF_MAX`].
pub const EVICTION_BACKOFF: Duration = Duration::from_secs(10);
pub const EVICTION_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The most bytes of an Event note the API server accepts.
pub const EVENT_NOTE_MAX_BYTES: usize = 1024;

/// The error a write meets when this replica's leadership has run out: the pass stops.
#[derive(Debug, thiserror::Error)]
#[error("not the leader any more: stopping the pass")]
pub struct NotLeading;

fn not_leading(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Service(source) if source.is::<NotLeading>())
}

/// The Node, Pod and opted-in Namespace caches.
pub struct Caches {
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub namespaces: Store<Namespace>,
    /// Notified on every watch event, so a pass can follow a change at once.
    pub changed: Arc<Notify>,
    tasks: Vec<AbortHandle>,
}

impl Caches {
    /// Starts the three reflectors on the current Tokio runtime.
    pub fn start(client: &Client) -> Caches {
        let changed = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        let nodes = reflect(
            "nodes",
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            slim_node,
            &changed,
            &mut tasks,
        );
        // Pods bound to a node and not finished (as kube-scheduler selects assigned pods, but
        // keeping Failed pods: they may still need the condition).
        let pods = reflect(
            "pods",
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(POD_FIELD_SELECTOR),
            slim_pod,
            &changed,
            &mut tasks,
        );
        let namespaces = reflect(
            "namespaces",
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default().labels(&format!("{NAMESPACE_OPT_IN_LABEL}=true")),
            slim_namespace,
            &changed,
            &mut tasks,
        );
        Caches {
            nodes,
            pods,
            namespaces,
            changed,
            tasks,
        }
    }

    /// Waits until the three caches have listed, at most `timeout`.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let all = async {
            self.nodes.wait_until_ready().await.is_ok()
                && self.pods.wait_until_ready().await.is_ok()
                && self.namespaces.wait_until_ready().await.is_ok()
        };
        tokio::time::timeout(timeout, all).await.unwrap_or(false)
    }

    /// Stops the watches.
    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for Caches {
    fn drop(&mut self) {
        self.stop();
    }
}

fn reflect<K>(
    resource: &'static str,
    api: Api<K>,
    config: watcher::Config,
    slim: fn(&mut K),
    changed: &Arc<Notify>,
    tasks: &mut Vec<AbortHandle>,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync,
    K: 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff().modify(slim));
    tasks.push(tokio::spawn(follow(resource, stream, changed.clone())).abort_handle());
    store
}

/// Drives a reflector stream: wakes the loop on each event, logs errors (kube's default backoff
/// retries them). Polled through [`WatchStreamExt`]'s supertrait, as in [`crate::cluster`].
async fn follow<S, K>(resource: &'static str, stream: S, changed: Arc<Notify>)
where
    S: WatchStreamExt<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = pin!(stream);
    while let Some(item) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        match item {
            Ok(_) => changed.notify_one(),
            Err(error) => tracing::warn!(
                resource,
                %error,
                "controller cache: watch error; retrying with backoff"
            ),
        }
    }
}

/// Keeps what node decisions read: name, resourceVersion, annotations, taints, capacity and
/// allocatable.
fn slim_node(node: &mut Node) {
    let full = std::mem::take(node);
    *node = Node {
        metadata: ObjectMeta {
            name: full.metadata.name,
            uid: full.metadata.uid,
            resource_version: full.metadata.resource_version,
            annotations: full.metadata.annotations,
            ..ObjectMeta::default()
        },
        spec: full.spec.map(|spec| k8s_openapi::api::core::v1::NodeSpec {
            taints: spec.taints,
            ..Default::default()
        }),
        status: full
            .status
            .map(|status| k8s_openapi::api::core::v1::NodeStatus {
                capacity: status.capacity,
                allocatable: status.allocatable,
                ..Default::default()
            }),
    };
}

/// Keeps what pod decisions read: identity, deletion, owner references, node, tolerations,
/// containers' resources, phase, conditions and container statuses (allocatedResourcesStatus).
fn slim_pod(pod: &mut Pod) {
    let full = std::mem::take(pod);
    let slim_containers = |containers: Vec<k8s_openapi::api::core::v1::Container>| {
        containers
            .into_iter()
            .map(|c| k8s_openapi::api::core::v1::Container {
                name: c.name,
                resources: c.resources,
                ..Default::default()
            })
            .collect::<Vec<_>>()
    };
    *pod = Pod {
        metadata: ObjectMeta {
            name: full.metadata.name,
            namespace: full.metadata.namespace,
            uid: full.metadata.uid,
            deletion_timestamp: full.metadata.deletion_timestamp,
            owner_references: full.metadata.owner_references,
            ..ObjectMeta::default()
        },
        spec: full.spec.map(|spec| PodSpec {
            node_name: spec.node_name,
            tolerations: spec.tolerations,
            containers: slim_containers(spec.containers),
            init_containers: spec.init_containers.map(slim_containers),
            ..PodSpec::default()
        }),
        status: full.status.map(|status| PodStatus {
            phase: status.phase,
            conditions: status.conditions,
            container_statuses: status.container_statuses,
            init_container_statuses: status.init_container_statuses,
            ..PodStatus::default()
        }),
    };
}

fn slim_namespace(namespace: &mut Namespace) {
    let full = std::mem::take(namespace);
    *namespace = Namespace {
        metadata: ObjectMeta {
            name: full.metadata.name,
            labels: full.metadata.labels,
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
}

/// A token bucket: `per_minute` tokens, refilled continuously.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    capacity: f64,
    tokens: f64,
    last: Option<Timestamp>,
}

impl TokenBucket {
    pub fn per_minute(per_minute: u32) -> Self {
        let capacity = f64::from(per_minute.max(1));
        Self {
            capacity,
            tokens: capacity,
            last: None,
        }
    }

    /// Takes a token if one is there at `now`.
    pub fn take(&mut self, now: Timestamp) -> bool {
        if let Some(last) = self.last {
            let elapsed = now.duration_since(last).as_secs_f64().max(0.0);
            self.tokens = (self.tokens + elapsed * self.capacity / 60.0).min(self.capacity);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Gives back a token taken for an eviction that did not happen.
    pub fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.capacity);
    }
}

/// When a pod whose eviction was refused may be tried again, and how often it was refused.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    next: Timestamp,
    refusals: u32,
}

/// What one pass did (or, in a dry run, would have done), for tests and the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub tainted: Vec<String>,
    pub untainted: Vec<String>,
    pub valve_held: Vec<String>,
    /// `namespace/name`.
    pub marked: Vec<String>,
    pub evicted: Vec<String>,
    pub evictions_deferred: Vec<String>,
    pub errors: Vec<String>,
    /// The pass stopped early: this replica's leadership ran out.
    pub stopped: bool,
}

/// Applies the decisions. Owned by one task: passes never overlap.
pub struct Reconciler {
    /// For every write, with [`super::write_config`]: timeouts, and no retry of 429 answers (a
    /// PodDisruptionBudget's refusal would otherwise be retried 15 times with growing delays,
    /// holding up the pass past the leader's deadline).
    client: Client,
    policy: Policy,
    /// `None`: act without an election. Otherwise checked before every write.
    leadership: Option<Leadership>,
    recorder: Recorder,
    metrics: Arc<ControllerMetrics>,
    histories: HashMap<String, NodeHistory>,
    /// Nodes whose safety-valve trip has been reported (once per episode).
    valve_reported: HashSet<String>,
    /// Pods (by uid) marked or evicted already: the cache may lag behind our own change.
    marked: HashSet<String>,
    evicted: HashSet<String>,
    /// Pods (by uid) whose eviction a PodDisruptionBudget refused: each waits on its own.
    backoff: HashMap<String, Backoff>,
    bucket: TokenBucket,
}

impl Reconciler {
    /// `policy.controller.dry_run` decides whether anything is changed. `instance` names this
    /// replica in Events (`reportingInstance`). Makes its client from `config` with
    /// [`super::write_config`].
    pub fn new(
        config: kube::Config,
        policy: Policy,
        instance: Option<String>,
        metrics: Arc<ControllerMetrics>,
    ) -> Result<Self, kube::Error> {
        let client = Client::try_from(super::write_config(config))?;
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: EVENT_REPORTER.to_owned(),
                instance,
            },
        );
        metrics.dry_run.set(i64::from(policy.controller.dry_run));
        let bucket = TokenBucket::per_minute(policy.controller.pods.evictions_per_minute);
        Ok(Self {
            client,
            policy,
            leadership: None,
            recorder,
            metrics,
            histories: HashMap::new(),
            valve_reported: HashSet::new(),
            marked: HashSet::new(),
            evicted: HashSet::new(),
            backoff: HashMap::new(),
            bucket,
        })
    }

    /// Acts only while `leadership` lasts: it is checked before every write, and a pass stops
    /// when it has run out.
    pub fn set_leadership(&mut self, leadership: Leadership) {
        self.leadership = Some(leadership);
    }

    /// Forgets everything remembered between passes (node histories, marked and evicted pods,
    /// eviction backoffs, the token bucket), and zeroes the gauges only the leader reports. Called
    /// when leadership is gained (another replica acted meanwhile) and lost (the new leader
    /// reports them).
    pub fn reset(&mut self) {
        self.histories.clear();
        self.valve_reported.clear();
        self.marked.clear();
        self.evicted.clear();
        self.backoff.clear();
        self.bucket = TokenBucket::per_minute(self.policy.controller.pods.evictions_per_minute);
        self.metrics.gpu_nodes.set(0);
        self.metrics.tainted_nodes.set(0);
        self.metrics.degraded_nodes.set(0);
    }

    fn dry_run(&self) -> bool {
        self.policy.controller.dry_run
    }

    /// Ok when this replica may write now; otherwise the [`NotLeading`] error.
    fn ensure_leading(&self) -> Result<(), kube::Error> {
        match &self.leadership {
            Some(leadership) if !leadership.leads_at(Instant::now()) => {
                Err(kube::Error::Service(Box::new(NotLeading)))
            }
            _ => Ok(()),
        }
    }

    /// One pass over every node and pod of the caches, at `now`.
    pub async fn pass(&mut self, caches: &Caches, now: Timestamp) -> PassReport {
        let mut report = PassReport::default();
        self.metrics.passes.inc();
        let mut nodes = caches.nodes.state();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

        let mut verdicts: Vec<(Arc<Node>, Verdict)> = Vec::with_capacity(nodes.len());
        for node in nodes {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            let history = self.histories.get(&name).cloned().unwrap_or_default();
            let verdict = node_verdict(&node, &self.policy, now, &history);
            verdicts.push((node, verdict));
        }
        let present: HashSet<String> = verdicts
            .iter()
            .filter_map(|(node, _)| node.metadata.name.clone())
            .collect();
        self.histories.retain(|name, _| present.contains(name));
        self.valve_reported.retain(|name| present.contains(name));

        let gpu_nodes = verdicts.iter().filter(|(_, v)| v.is_gpu_node()).count();
        let mut tainted = verdicts
            .iter()
            .filter(|(node, verdict)| {
                ownership(node) == Ownership::Ours || verdict.history.assumed_tainted
            })
            .count();
        let mut node_states: HashMap<String, NodeState> = HashMap::new();

        for (node, mut verdict) in verdicts {
            let name = node.metadata.name.clone().unwrap_or_default();
            let mut holds_taint =
                ownership(&node) == Ownership::Ours || verdict.history.assumed_tainted;
            if node::stale_annotation(&node) {
                match self.clear_stale_annotation(&node).await {
                    Ok(()) => {}
                    Err(error) if not_leading(&error) => {
                        report.stopped = true;
                        return report;
                    }
                    Err(error) => {
                        self.metrics.reconcile_errors.inc();
                        tracing::warn!(node = %name, %error, "cannot clear the stale owner annotation; retrying on the next pass");
                        report.errors.push(format!("annotation {name}: {error}"));
                    }
                }
            }
            match verdict.decision {
                Decision::Taint if !self.policy.controller.node_health.enabled => {
                    tracing::debug!(node = %name, seen = %verdict.describe_degraded(),
                        "node degraded; tainting is disabled (controller.nodeHealth.enabled)");
                }
                Decision::Taint if !node::may_taint(gpu_nodes, tainted, &self.policy) => {
                    report.valve_held.push(name.clone());
                    if self.valve_reported.insert(name.clone()) {
                        self.metrics.safety_valve_trips.inc();
                        let note = format!(
                            "{}; not tainted: {tainted} of {gpu_nodes} GPU nodes are tainted \
                             already, the most controller.nodeHealth.maxTaintedPercent ({} %) \
                             allows",
                            verdict.describe_degraded(),
                            self.policy.controller.node_health.max_tainted_percent
                        );
                        tracing::warn!(node = %name, "safety valve: {note}");
                        self.event(
                            &node_ref(&node),
                            EventType::Warning,
                            REASON_SAFETY_VALVE,
                            "Taint",
                            note,
                        )
                        .await;
                    }
                }
                Decision::Taint => match self.add_taint(&node, &verdict, now).await {
                    Ok(false) => {}
                    Ok(true) => {
                        self.valve_reported.remove(&name);
                        tainted += 1;
                        holds_taint = true;
                        verdict.history.assumed_tainted = self.dry_run();
                        self.metrics.taints_added.inc();
                        report.tainted.push(name.clone());
                    }
                    Err(error) if not_leading(&error) => {
                        report.stopped = true;
                        return report;
                    }
                    Err(error) => {
                        self.metrics.reconcile_errors.inc();
                        tracing::warn!(node = %name, %error, "cannot taint the node; retrying on the next pass");
                        report.errors.push(format!("taint {name}: {error}"));
                    }
                },
                Decision::Untaint => match self.remove_taint(&node, &verdict).await {
                    Ok(false) => {
                        holds_taint = false;
                        verdict.history = NodeHistory::default();
                    }
                    Ok(true) => {
                        tainted = tainted.saturating_sub(1);
                        holds_taint = false;
                        verdict.history = NodeHistory::default();
                        self.metrics.taints_removed.inc();
                        report.untainted.push(name.clone());
                    }
                    Err(error) if not_leading(&error) => {
                        report.stopped = true;
                        return report;
                    }
                    Err(error) => {
                        self.metrics.reconcile_errors.inc();
                        tracing::warn!(node = %name, %error, "cannot untaint the node; retrying on the next pass");
                        report.errors.push(format!("untaint {name}: {error}"));
                    }
                },
                Decision::Degrading { taint_at } => {
                    if self
                        .histories
                        .get(&name)
                        .is_none_or(|h| h.degraded_since.is_none())
                    {
                        tracing::info!(node = %name, seen = %verdict.describe_degraded(),
                            %taint_at, "node degraded; tainted if it stays so");
                    }
                }
                Decision::ForeignTaint
                | Decision::Healthy
                | Decision::NotJudged
                | Decision::Tainted
                | Decision::Recovering { .. } => {}
            }
            if !matches!(verdict.decision, Decision::Taint) {
                self.valve_reported.remove(&name);
            }
            // Pods are marked for their node only while it holds gpu-guard's taint and is still
            // degraded for a resource they use: not during the recovery window.
            if holds_taint && !verdict.degraded.is_empty() {
                let degraded: BTreeSet<String> = verdict
                    .degraded
                    .iter()
                    .map(|d| d.resource.clone())
                    .collect();
                node_states.insert(name.clone(), NodeState { degraded });
            }
            self.histories.insert(name, verdict.history);
        }
        self.metrics
            .gpu_nodes
            .set(i64::try_from(gpu_nodes).unwrap_or(i64::MAX));
        self.metrics
            .tainted_nodes
            .set(i64::try_from(tainted).unwrap_or(i64::MAX));
        let degraded = self
            .histories
            .values()
            .filter(|h| h.degraded_since.is_some())
            .count();
        self.metrics
            .degraded_nodes
            .set(i64::try_from(degraded).unwrap_or(i64::MAX));

        self.pods_pass(caches, &node_states, now, &mut report).await;
        report
    }

    /// Removes the owner annotation of a node whose taint is gone (someone removed it by hand):
    /// only the annotation, so a later taint with the same key is not taken for gpu-guard's.
    async fn clear_stale_annotation(&self, node: &Node) -> Result<(), kube::Error> {
        let name = node.metadata.name.clone().unwrap_or_default();
        if self.dry_run() {
            tracing::info!(node = %name, "dry run: would remove the stale owner annotation {}", node::OWNER_ANNOTATION);
            return Ok(());
        }
        let patched = self
            .patch_node(node, |current| {
                node::stale_annotation(current).then(|| node::clear_annotation_patch(current))
            })
            .await?;
        if patched {
            tracing::info!(node = %name, "gpu-guard's taint was removed by someone else; removed its stale owner annotation {}", node::OWNER_ANNOTATION);
        }
        Ok(())
    }

    async fn pods_pass(
        &mut self,
        caches: &Caches,
        node_states: &HashMap<String, NodeState>,
        now: Timestamp,
        report: &mut PassReport,
    ) {
        let opted_in: HashSet<String> = caches
            .namespaces
            .state()
            .iter()
            .filter(|ns| {
                ns.metadata
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(NAMESPACE_OPT_IN_LABEL))
                    .is_some_and(|value| value == "true")
            })
            .filter_map(|ns| ns.metadata.name.clone())
            .collect();
        let mut pods = caches.pods.state();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        let uids: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        self.marked.retain(|uid| uids.contains(uid));
        self.evicted.retain(|uid| uids.contains(uid));
        self.backoff.retain(|uid, _| uids.contains(uid));

        for pod in pods {
            let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name)
            else {
                continue;
            };
            if !opted_in.contains(namespace) {
                continue;
            }
            let node_state = pod
                .spec
                .as_ref()
                .and_then(|spec| spec.node_name.as_ref())
                .and_then(|node| node_states.get(node));
            let Action::Act { cause, mark, evict } = pod_verdict(&pod, node_state, &self.policy)
            else {
                continue;
            };
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let id = format!("{namespace}/{name}");
            if mark && !self.marked.contains(&uid) {
                match self.mark(&pod, &cause, now).await {
                    Ok(()) => {
                        self.marked.insert(uid.clone());
                        self.metrics.pods_marked.inc();
                        report.marked.push(id.clone());
                    }
                    Err(error) if not_leading(&error) => {
                        report.stopped = true;
                        return;
                    }
                    Err(error) => {
                        self.metrics.reconcile_errors.inc();
                        tracing::warn!(pod = %id, %error, "cannot mark the pod; retrying on the next pass");
                        report.errors.push(format!("mark {id}: {error}"));
                    }
                }
            }
            if evict && !self.evicted.contains(&uid) {
                if self.backoff.get(&uid).is_some_and(|b| now < b.next) {
                    // A PodDisruptionBudget refused it lately: its turn comes later, without
                    // taking a token from the other pods.
                    report.evictions_deferred.push(id);
                    continue;
                }
                if let Err(error) = self.ensure_leading() {
                    tracing::debug!(%error);
                    report.stopped = true;
                    return;
                }
                if !self.bucket.take(now) {
                    self.metrics.evictions_deferred.inc();
                    tracing::info!(pod = %id, "eviction rate limit reached; evicting on a later pass");
                    report.evictions_deferred.push(id);
                    continue;
                }
                match self.evict(&pod, &cause).await {
                    Ok(true) => {
                        self.backoff.remove(&uid);
                        self.evicted.insert(uid);
                        self.metrics.pods_evicted.inc();
                        report.evicted.push(id);
                    }
                    Ok(false) => {
                        // Refused (a PodDisruptionBudget): the token goes back to the other
                        // pods, and this one waits, longer after each refusal.
                        self.bucket.refund();
                        let refusals = self.backoff.get(&uid).map_or(0, |b| b.refusals);
                        let wait = EVICTION_BACKOFF
                            .saturating_mul(2u32.saturating_pow(refusals.min(16)))
                            .min(EVICTION_BACKOFF_MAX);
                        let next = now.checked_add(wait).unwrap_or(Timestamp::MAX);
                        self.backoff.insert(
                            uid,
                            Backoff {
                                next,
                                refusals: refusals.saturating_add(1),
                            },
                        );
                        self.metrics.evictions_deferred.inc();
                        report.evictions_deferred.push(id);
                    }
                    Err(error) if not_leading(&error) => {
                        self.bucket.refund();
                        report.stopped = true;
                        return;
                    }
                    Err(error) => {
                        self.metrics.reconcile_errors.inc();
                        tracing::warn!(pod = %id, %error, "cannot evict the pod; retrying on the next pass");
                        report.errors.push(format!("evict {id}: {error}"));
                    }
                }
            }
        }
    }

    /// `Ok(false)`: nothing was tainted (someone else tainted the node meanwhile).
    async fn add_taint(
        &self,
        node: &Node,
        verdict: &Verdict,
        now: Timestamp,
    ) -> Result<bool, kube::Error> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let Some(first) = verdict.degraded.first() else {
            return Ok(false);
        };
        let health = &self.policy.controller.node_health;
        let taint = node::degraded_taint(&first.resource, health.no_execute);
        let since = verdict.history.degraded_since.unwrap_or(now);
        let rendered = format!(
            "{}={}:{}",
            taint.key,
            taint.value.as_deref().unwrap_or_default(),
            taint.effect
        );
        let seen = format!(
            "{} since {since} (threshold held {} s)",
            verdict.describe_degraded(),
            now.duration_since(since).as_secs()
        );
        if self.dry_run() {
            let note = format!("dry run: would taint {rendered}: {seen}");
            tracing::info!(node = %name, "{note}");
            self.event(
                &node_ref(node),
                EventType::Warning,
                REASON_DEGRADED,
                "Taint",
                note,
            )
            .await;
            return Ok(true);
        }
        let patched = self
            .patch_node(node, |current| {
                (node::ownership(current) == Ownership::None)
                    .then(|| node::add_taint_patch(current, &taint, now))
            })
            .await?;
        if !patched {
            tracing::info!(node = %name, "the node carries a {TAINT_KEY} taint already; not tainted again");
            return Ok(false);
        }
        let note = format!("tainted {rendered}: {seen}");
        tracing::warn!(node = %name, "{note}");
        self.event(
            &node_ref(node),
            EventType::Warning,
            REASON_DEGRADED,
            "Taint",
            note,
        )
        .await;
        Ok(true)
    }

    /// `Ok(false)`: nothing to remove any more.
    async fn remove_taint(&self, node: &Node, verdict: &Verdict) -> Result<bool, kube::Error> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let since = verdict
            .history
            .healthy_since
            .map_or_else(String::new, |since| format!(" since {since}"));
        if self.dry_run() {
            let note =
                format!("dry run: would remove the {TAINT_KEY} taint: devices healthy{since}");
            tracing::info!(node = %name, "{note}");
            self.event(
                &node_ref(node),
                EventType::Normal,
                REASON_RECOVERED,
                "Untaint",
                note,
            )
            .await;
            return Ok(true);
        }
        let patched = self
            .patch_node(node, |current| {
                (node::ownership(current) == Ownership::Ours)
                    .then(|| node::remove_taint_patch(current))
            })
            .await?;
        if !patched {
            tracing::info!(node = %name, "gpu-guard's taint is gone already");
            return Ok(false);
        }
        let note = format!("removed the {TAINT_KEY} taint: devices healthy{since}");
        tracing::info!(node = %name, "{note}");
        self.event(
            &node_ref(node),
            EventType::Normal,
            REASON_RECOVERED,
            "Untaint",
            note,
        )
        .await;
        Ok(true)
    }

    /// Sends the patch `build` makes from the node, with its resourceVersion; on a conflict,
    /// reads the node again and rebuilds the patch (`None`: nothing to do any more).
    /// `Ok(false)`: the node no longer needs the change (someone else made it meanwhile).
    async fn patch_node(
        &self,
        node: &Node,
        build: impl Fn(&Node) -> Option<Value>,
    ) -> Result<bool, kube::Error> {
        let api = Api::<Node>::all(self.client.clone());
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut current = node.clone();
        let mut attempt = 1;
        loop {
            let Some(patch) = build(&current) else {
                return Ok(false);
            };
            self.ensure_leading()?;
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(status))
                    if status.is_conflict() && attempt < NODE_PATCH_ATTEMPTS =>
                {
                    tracing::debug!(node = %name, attempt, "node changed meanwhile; reading it again");
                    current = api.get(&name).await?;
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn mark(&self, pod: &Pod, cause: &Cause, now: Timestamp) -> Result<(), kube::Error> {
        self.ensure_leading()?;
        let (namespace, name) = pod_names(pod);
        let note = cause.message();
        if self.dry_run() {
            tracing::info!(pod = %format!("{namespace}/{name}"), reason = cause.reason(),
                "dry run: would add the condition {}=True: {note}", crate::policy::DEVICE_FAILURE_CONDITION);
        } else {
            let api = Api::<Pod>::namespaced(self.client.clone(), &namespace);
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(pod::condition_patch(cause, now)),
            )
            .await?;
            tracing::info!(pod = %format!("{namespace}/{name}"), reason = cause.reason(),
                "added the condition {}=True: {note}", crate::policy::DEVICE_FAILURE_CONDITION);
        }
        let prefix = if self.dry_run() {
            "dry run: would mark: "
        } else {
            ""
        };
        self.event(
            &pod_ref(pod),
            EventType::Warning,
            REASON_MARKED,
            "Mark",
            format!("{prefix}{note}"),
        )
        .await;
        Ok(())
    }

    /// Evicts the pod. `Ok(false)`: refused for now (429: a PodDisruptionBudget).
    async fn evict(&self, pod: &Pod, cause: &Cause) -> Result<bool, kube::Error> {
        self.ensure_leading()?;
        let (namespace, name) = pod_names(pod);
        let id = format!("{namespace}/{name}");
        if self.dry_run() {
            let note = format!("dry run: would evict: {}", cause.message());
            tracing::info!(pod = %id, "{note}");
            self.event(
                &pod_ref(pod),
                EventType::Warning,
                REASON_EVICTED,
                "Evict",
                note,
            )
            .await;
            return Ok(true);
        }
        let api = Api::<Pod>::namespaced(self.client.clone(), &namespace);
        let eviction = Eviction {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            delete_options: None,
        };
        match api
            .create_subresource::<Eviction, kube::core::Status>(
                "eviction",
                &name,
                &PostParams::default(),
                &eviction,
            )
            .await
        {
            Ok(_) => {
                let note = format!(
                    "evicted so its Job recreates it on a healthy node: {}",
                    cause.message()
                );
                tracing::info!(pod = %id, "{note}");
                self.event(
                    &pod_ref(pod),
                    EventType::Warning,
                    REASON_EVICTED,
                    "Evict",
                    note,
                )
                .await;
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 429 => {
                tracing::info!(pod = %id, message = %status.message,
                    "eviction refused for now (a PodDisruptionBudget); retrying on a later pass");
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Publishes an Event; a failure is logged, never fatal.
    async fn event(
        &self,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if self.ensure_leading().is_err() {
            return;
        }
        let note = truncate_note(note);
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(%error, reason, "cannot publish an Event");
        }
    }

    /// The node histories (for tests and debugging).
    pub fn histories(&self) -> &HashMap<String, NodeHistory> {
        &self.histories
    }
}

/// The API server refuses Event notes over [`EVENT_NOTE_MAX_BYTES`] bytes: the note is cut at
/// a character boundary within it.
pub fn truncate_note(mut note: String) -> String {
    if note.len() > EVENT_NOTE_MAX_BYTES {
        let mut end = EVENT_NOTE_MAX_BYTES;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}

fn pod_names(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

fn node_ref(node: &Node) -> k8s_openapi::api::core::v1::ObjectReference {
    let mut reference = node.object_ref(&());
    // Events on cluster-scoped objects go to the default namespace (as kubelet's do).
    reference.namespace = None;
    reference
}

fn pod_ref(pod: &Pod) -> k8s_openapi::api::core::v1::ObjectReference {
    pod.object_ref(&())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_are_cut_to_1024_bytes_at_a_character_boundary() {
        assert_eq!(truncate_note("short".to_owned()), "short");
        let ascii = "a".repeat(2000);
        assert_eq!(truncate_note(ascii).len(), EVENT_NOTE_MAX_BYTES);
        // 'é' is two bytes: 1023 bytes of 'a' and one 'é' would end at byte 1025.
        let note = format!("{}é", "a".repeat(1023));
        let cut = truncate_note(note);
        assert_eq!(cut.len(), 1023);
        assert!(cut.chars().all(|c| c == 'a'));
        // 1000 characters of 'é' are 2000 bytes: the old limit of 1000 characters was too long.
        assert_eq!(truncate_note("é".repeat(1000)).len(), EVENT_NOTE_MAX_BYTES);
    }

    #[test]
    fn a_refunded_token_is_available_again() {
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut bucket = TokenBucket::per_minute(1);
        assert!(bucket.take(at(0)));
        assert!(!bucket.take(at(1)));
        bucket.refund();
        assert!(bucket.take(at(1)));
        bucket.refund();
        bucket.refund();
        assert!(bucket.take(at(1)));
        assert!(!bucket.take(at(1)), "a refund never exceeds the capacity");
    }
}
