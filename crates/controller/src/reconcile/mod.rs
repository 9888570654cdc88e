//! The reconciler: it judges cached nodes and pods with the pure decisions
//! ([`gpu_guard_core::health::node::node_verdict`], [`gpu_guard_core::health::pod::verdict`]) and
//! applies them: taint patches, pod condition patches, evictions, Events, metrics.
//!
//! Work follows what changed: a full pass ([`Reconciler::pass`]: every node, every device pod)
//! on each resync; a node pass after Node, Namespace or ResourceSlice events
//! ([`Reconciler::pass_nodes`]: every node, then only the pods whose node changed state); a pod
//! pass after pod events ([`Reconciler::pass_pods`]: only the pods that changed). A pod to
//! mark is marked from its own watch event ([`marker::mark_from_events`]), independent of the
//! passes.
//!
//! This module owns the [`Reconciler`] (what it remembers between passes, the leadership check
//! before every write, what a new term of leadership keeps), the [`PassReport`], the order of a
//! pass, and what becomes of a failed write ([`WriteError`]). The parts:
//! - [`caches`], [`pods`]: the Node, opted-in Namespace, ResourceSlice and ResourceClaim
//!   reflectors, and the device pods' facts;
//! - `node_pass`, `pod_pass`: the two halves of a pass and their writes;
//! - [`marker`]: the pod condition, from passes and from watch events;
//! - [`memory`]: each device failure recorded in its workload's memory, and the free retries
//!   of a workload past its budget ended;
//! - [`throttle`]: the eviction token bucket and the per-pod eviction backoff;
//! - [`events`]: Event reasons and publishing.
//!
//! A pass reads the caches only; it calls the API server only to change something (or to read
//! a node again after a conflict, or every node before the first taint of a term). Nodes it
//! wrote or read that way are judged instead of the cached ones until the cache catches up. In a dry run it changes nothing: its node patches, pod
//! status patches and evictions are sent with `dryRun=All` (so RBAC, admission and
//! PodDisruptionBudgets are exercised, and nothing is stored); Events, logs and metrics say
//! what it would have done.

mod caches;
mod events;
pub(crate) mod marker;
pub mod memory;
mod node_pass;
mod pod_pass;
mod pods;
mod suspect;
mod throttle;

pub use caches::{Caches, OptedIn};
pub use pods::{ClaimDrivers, PodCache};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use super::lease::Leadership;
use super::metrics::ControllerMetrics;
use gpu_guard_core::health::node::NodeHistory;
use gpu_guard_core::health::pod::NodeState;
use gpu_guard_core::health::pod::stuck::Unready;
use gpu_guard_core::policy::Policy;
use gpu_guard_core::wellknown::EVENT_REPORTER;
use marker::Marker;
use throttle::{Backoff, TokenBucket};

/// Why a write of a pass did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// This replica's leadership has run out: the pass stops, nothing more is written.
    #[error("not the leader any more: stopping the pass")]
    NotLeading,
    /// The API server refused it or did not answer: retried on the next pass.
    #[error("{0}")]
    Api(#[from] kube::Error),
}

/// The pass stops: this replica's leadership ran out ([`PassReport::stopped`]).
#[derive(Debug)]
struct Stop;

/// A write of a pass, naming its object, for the log and the report when it fails.
#[derive(Clone, Copy, Debug)]
enum Write<'a> {
    /// Clear the stale owner annotation of the node.
    ClearAnnotation(&'a str),
    Taint(&'a str),
    Untaint(&'a str),
    /// Mark the pod (`namespace/name`).
    Mark(&'a str),
    Evict(&'a str),
    /// Add or rewrite gpu-guard's Node condition, and remove it.
    SetCondition(&'a str),
    RemoveCondition(&'a str),
    /// Force-delete a stuck pod (`namespace/name`).
    ForceDelete(&'a str),
    /// Record the pod's (`namespace/name`) device failure in its workload's memory.
    Record(&'a str),
}

impl Write<'_> {
    /// What the write does, in the log: "cannot {doing}".
    fn doing(self) -> &'static str {
        match self {
            Write::ClearAnnotation(_) => "clear the stale owner annotation",
            Write::Taint(_) => "taint the node",
            Write::Untaint(_) => "untaint the node",
            Write::Mark(_) => "mark the pod",
            Write::Evict(_) => "evict the pod",
            Write::SetCondition(_) => "set the node condition",
            Write::RemoveCondition(_) => "remove the node condition",
            Write::ForceDelete(_) => "force-delete the stuck pod",
            Write::Record(_) => "record the pod's device failure",
        }
    }

    /// The word that starts its line in [`PassReport::errors`].
    fn label(self) -> &'static str {
        match self {
            Write::ClearAnnotation(_) => "annotation",
            Write::Taint(_) => "taint",
            Write::Untaint(_) => "untaint",
            Write::Mark(_) => "mark",
            Write::Evict(_) => "evict",
            Write::SetCondition(_) => "condition",
            Write::RemoveCondition(_) => "uncondition",
            Write::ForceDelete(_) => "force-delete",
            Write::Record(_) => "record",
        }
    }
}

/// What one pass did (or, in a dry run, would have done), as the loop logs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub tainted: Vec<String>,
    pub untainted: Vec<String>,
    pub valve_held: Vec<String>,
    /// `namespace/name`.
    pub marked: Vec<String>,
    /// Given `gpu-guard.io/PeerDeviceFailure` as peers of a gang pod hit by a device failure.
    pub peers_marked: Vec<String>,
    pub evicted: Vec<String>,
    pub evictions_deferred: Vec<String>,
    /// Pods (`namespace/name`) whose device failure was recorded in their workload's memory.
    pub recorded: Vec<String>,
    /// Given `gpu-guard.io/DeviceRetriesExhausted`: pods of a workload past its budget.
    pub retries_exhausted: Vec<String>,
    pub errors: Vec<String>,
    /// Nodes whose `gpu-guard.io/DeviceDegraded` condition was added or rewritten, and removed.
    pub conditions_set: Vec<String>,
    pub conditions_removed: Vec<String>,
    /// Pods (`namespace/name`) found stuck Terminating on a NotReady or unreachable node
    /// (each once), force-deleted, and whose force deletion waits for the rate limit.
    pub stuck: Vec<String>,
    pub force_deleted: Vec<String>,
    pub deletions_deferred: Vec<String>,
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
    /// Adds the pod condition, for the passes and the event path; remembers what it marked.
    marker: Arc<Marker>,
    /// Pods (by uid) evicted already: the cache may lag behind our own change.
    evicted: HashSet<String>,
    /// The degraded resources of the nodes holding gpu-guard's taint, from the last node pass:
    /// what the pods are judged against between node passes.
    node_states: HashMap<String, NodeState>,
    /// The opted-in namespaces at the last node pass (a change re-judges every pod).
    opted_in: HashSet<String>,
    /// Pods (by uid) whose eviction a PodDisruptionBudget refused: each waits on its own.
    backoff: HashMap<String, Backoff>,
    bucket: TokenBucket,
    /// The first pass has said whether DRA-only GPU nodes go unjudged (once per process).
    dra_hint_logged: bool,
    /// Nodes as this replica last wrote or read them from the API server, newer than the
    /// node cache (which lags its own writes): judged instead of the cached node until the
    /// cache catches up ([`node_pass::Written`]). Locked only between awaits.
    written: std::sync::Mutex<HashMap<String, node_pass::Written>>,
    /// The nodes are to be read fresh from the API server before this term's first taint: the
    /// cache may not show yet what another leader did.
    fresh_read_due: bool,
    /// Dry run: by node, the Node condition this term would have left on it (`None`: would
    /// have removed it); nothing was stored, so these stand in for the node's own.
    assumed_conditions: HashMap<String, Option<k8s_openapi::api::core::v1::NodeCondition>>,
    /// The nodes that are NotReady or unreachable at the last node pass, and those whose
    /// readiness changed then (their pods are judged again).
    unready: HashMap<String, Unready>,
    unready_changed: HashSet<String>,
    /// Stuck pods (by uid) reported this term (one Event each), and those force-deleted.
    stuck: HashSet<String>,
    force_deleted: HashSet<String>,
    /// The force deletion token bucket (`controller.stuckPods.deletionsPerMinute`).
    deletion_bucket: TokenBucket,
    /// Dry run: the nodes this term would have tainted suspect, and their records; nothing was
    /// stored, so these stand in for the nodes' own.
    assumed_suspect: HashMap<String, gpu_guard_core::memory::suspect::SuspectRecord>,
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
        let config_for_marker = config.clone();
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
        let deletion_policy = policy.controller.stuck_pods.clone();
        let marker = Arc::new(Marker::new(
            config_for_marker,
            recorder.clone(),
            &policy,
            metrics.clone(),
        )?);
        Ok(Self {
            client,
            policy,
            leadership: None,
            recorder,
            metrics,
            histories: HashMap::new(),
            valve_reported: HashSet::new(),
            marker,
            evicted: HashSet::new(),
            node_states: HashMap::new(),
            opted_in: HashSet::new(),
            backoff: HashMap::new(),
            bucket,
            dra_hint_logged: false,
            written: std::sync::Mutex::default(),
            fresh_read_due: true,
            assumed_conditions: HashMap::new(),
            unready: HashMap::new(),
            unready_changed: HashSet::new(),
            stuck: HashSet::new(),
            force_deleted: HashSet::new(),
            deletion_bucket: TokenBucket::per_minute(deletion_policy.deletions_per_minute),
            assumed_suspect: HashMap::new(),
        })
    }

    /// Acts only while `leadership` lasts: it is checked before every write, and a pass stops
    /// when it has run out.
    pub fn set_leadership(&mut self, leadership: Leadership) {
        self.marker.set_leadership(leadership.clone());
        self.leadership = Some(leadership);
    }

    /// The marker, for the event path ([`marker::mark_from_events`]).
    pub fn marker(&self) -> Arc<Marker> {
        self.marker.clone()
    }

    /// A new term: leadership was gained or lost, at `now`. Another replica may have acted
    /// meanwhile, so what this replica did is forgotten (marked and evicted pods, eviction
    /// backoffs, safety-valve reports, the taints a dry run only assumed), the nodes are read
    /// fresh from the API server before the term's first taint (its cache may lag the other
    /// leader's writes), and the gauges only the leader reports are zeroed. What was observed is kept: the node histories (since
    /// when each node has been degraded or healthy, which devices it had), which a replica
    /// standing by keeps up too ([`Reconciler::observe`]), so a new leader does not restart
    /// the `degradedForSeconds` and `healthyForSeconds` clocks. Under an election the eviction
    /// budget starts empty and refills at `evictionsPerMinute`: a change of leader never allows
    /// a second burst on top of the previous leader's (without an election, there is no other
    /// leader, and it starts full).
    pub fn new_term(&mut self, now: Timestamp) {
        for history in self.histories.values_mut() {
            history.assumed_tainted = false;
        }
        self.valve_reported.clear();
        self.fresh_read_due = true;
        self.marker.reset();
        self.evicted.clear();
        self.backoff.clear();
        self.bucket = self.term_bucket(self.policy.controller.pods.evictions_per_minute, now);
        self.metrics.gpu_nodes.set(0);
        self.metrics.tainted_nodes.set(0);
        self.metrics.degraded_nodes.set(0);
        // Stuck pods are reported again by the new term; deletions share the rule of
        // evictions: no second burst on a change of leader.
        self.assumed_conditions.clear();
        self.assumed_suspect.clear();
        self.metrics.suspect_nodes.set(0);
        self.stuck.clear();
        self.force_deleted.clear();
        self.deletion_bucket =
            self.term_bucket(self.policy.controller.stuck_pods.deletions_per_minute, now);
        self.metrics.stuck_pods.set(0);
    }

    /// A rate limit's bucket at the start of a term at `now`: empty under an election (a
    /// change of leader adds no burst to the previous leader's), full without one.
    fn term_bucket(&self, per_minute: u32, now: Timestamp) -> TokenBucket {
        if self.leadership.is_some() {
            TokenBucket::empty(per_minute, now)
        } else {
            TokenBucket::per_minute(per_minute)
        }
    }

    fn dry_run(&self) -> bool {
        self.policy.controller.dry_run
    }

    /// The parameters of every patch: `dryRun=All` in a dry run, so the API server runs RBAC,
    /// admission and validation on it and stores nothing.
    fn patch_params(&self) -> kube::api::PatchParams {
        let params = kube::api::PatchParams::default();
        if self.dry_run() {
            params.dry_run()
        } else {
            params
        }
    }

    /// Ok when this replica may write now; otherwise [`WriteError::NotLeading`].
    fn ensure_leading(&self) -> Result<(), WriteError> {
        match &self.leadership {
            Some(leadership) if !leadership.leads_at(Instant::now()) => Err(WriteError::NotLeading),
            _ => Ok(()),
        }
    }

    /// A full pass over every node and device pod of the caches, at `now`: the nodes first, so
    /// the pods are judged against the taints this pass added. Forgets what it remembered of
    /// pods that are gone.
    pub async fn pass(&mut self, caches: &Caches, now: Timestamp) -> PassReport {
        self.nodes_then_pods(caches, now, true).await
    }

    /// After Node, Namespace or ResourceSlice events: every node, then the pods whose node
    /// changed state (tainted, untainted, degraded for other resources), every pod when the
    /// opted-in namespaces changed, and the pods that changed.
    pub async fn pass_nodes(&mut self, caches: &Caches, now: Timestamp) -> PassReport {
        self.nodes_then_pods(caches, now, false).await
    }

    /// Every node, then the pods that need judging after it: all of them when `full` (and what
    /// was remembered of pods that are gone is forgotten), otherwise those a change concerns.
    async fn nodes_then_pods(&mut self, caches: &Caches, now: Timestamp, full: bool) -> PassReport {
        let mut report = PassReport::default();
        self.metrics.passes.inc();
        let node_states = match self.nodes_pass(caches, now, &mut report).await {
            Ok(node_states) => node_states,
            Err(Stop) => {
                report.stopped = true;
                return report;
            }
        };
        let opted_in = caches.namespaces.names();
        // The dirty pods are judged either way.
        let mut pods = caches.pods.take_dirty();
        let everyone = full || opted_in != self.opted_in;
        let changed: HashSet<&String> = changed_keys(&self.node_states, &node_states)
            .chain(self.unready_changed.iter())
            .collect();
        if everyone {
            pods = caches.pods.snapshot();
        } else if !changed.is_empty() {
            pods.extend(
                caches
                    .pods
                    .snapshot()
                    .into_iter()
                    .filter(|pod| pod.node.as_ref().is_some_and(|node| changed.contains(node))),
            );
            pods::sort(&mut pods);
            pods.dedup_by(|a, b| a.namespace == b.namespace && a.name == b.name);
        }
        if full {
            self.forget_pods_gone(&pods, now);
        }
        self.node_states = node_states;
        report.stopped = self
            .pods_pass(pods, caches, &opted_in, now, &mut report)
            .await
            .is_err();
        self.opted_in = opted_in;
        report
    }

    /// After pod events: only the device pods that changed, against the node states of the
    /// last node pass.
    pub async fn pass_pods(&mut self, caches: &Caches, now: Timestamp) -> PassReport {
        let mut report = PassReport::default();
        let pods = caches.pods.take_dirty();
        if pods.is_empty() {
            return report;
        }
        let opted_in = caches.namespaces.names();
        report.stopped = self
            .pods_pass(pods, caches, &opted_in, now, &mut report)
            .await
            .is_err();
        report
    }

    /// Standing by: judges every node and keeps its history, changing nothing, so that the
    /// clocks run on when this replica becomes the leader ([`Reconciler::new_term`]).
    pub fn observe(&mut self, caches: &Caches, now: Timestamp) {
        // What a standby sees of device failures counts when it leads.
        self.note_failures(caches, now);
        for (node, verdict) in self.judge_nodes(caches, now).0 {
            if let Some(name) = node.metadata.name.clone() {
                self.histories.insert(name, verdict.history);
            }
        }
    }

    /// What became of a write: `Ok(Some(answer))` when it was made; `Ok(None)` when it failed
    /// and the pass goes on (counted, logged, reported; retried on the next pass);
    /// `Err(Stop)` when leadership ran out.
    fn settle<T>(
        &self,
        write: Write<'_>,
        result: Result<T, WriteError>,
        report: &mut PassReport,
    ) -> Result<Option<T>, Stop> {
        let error = match result {
            Ok(answer) => return Ok(Some(answer)),
            Err(WriteError::NotLeading) => return Err(Stop),
            Err(WriteError::Api(error)) => error,
        };
        self.metrics.reconcile_errors.inc();
        let doing = write.doing();
        let object = match write {
            Write::ClearAnnotation(node)
            | Write::Taint(node)
            | Write::Untaint(node)
            | Write::SetCondition(node)
            | Write::RemoveCondition(node) => {
                tracing::warn!(node = %node, %error, "cannot {doing}; retrying on the next pass");
                node
            }
            Write::Mark(pod) | Write::Evict(pod) | Write::ForceDelete(pod) | Write::Record(pod) => {
                tracing::warn!(pod = %pod, %error, "cannot {doing}; retrying on the next pass");
                pod
            }
        };
        report
            .errors
            .push(format!("{} {object}: {error}", write.label()));
        Ok(None)
    }
}

/// The keys whose value differs between `old` and `new`, or that are in only one of them.
fn changed_keys<'a, V: PartialEq>(
    old: &'a HashMap<String, V>,
    new: &'a HashMap<String, V>,
) -> impl Iterator<Item = &'a String> {
    new.iter()
        .filter(|(key, value)| old.get(*key) != Some(*value))
        .map(|(key, _)| key)
        .chain(old.keys().filter(|key| !new.contains_key(*key)))
}
