//! The reconciler: one pass judges every cached node and pod with the pure decisions
//! ([`crate::controller::node::node_verdict`], [`crate::controller::pod::pod_verdict`]) and
//! applies them: taint patches, pod condition patches, evictions, Events, metrics.
//!
//! This module owns the [`Reconciler`] (what it remembers between passes, the leadership check
//! before every write), the [`PassReport`], the order of a pass, and what becomes of a failed
//! write ([`WriteError`]). The parts:
//! - [`caches`]: the Node, Pod and opted-in Namespace reflectors a pass reads;
//! - `node_pass`, `pod_pass`: the two halves of a pass and their writes;
//! - [`throttle`]: the eviction token bucket and the per-pod eviction backoff;
//! - [`events`]: Event reasons and publishing.
//!
//! A pass reads the caches only; it calls the API server only to change something (or to read
//! a node again after a conflict). In a dry run it changes nothing: its node patches, pod
//! status patches and evictions are sent with `dryRun=All` (so RBAC, admission and
//! PodDisruptionBudgets are exercised, and nothing is stored); Events, logs and metrics say
//! what it would have done.

pub mod caches;
pub mod events;
mod node_pass;
mod pod_pass;
pub mod throttle;

pub use caches::Caches;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use super::lease::Leadership;
use super::metrics::ControllerMetrics;
use super::node::NodeHistory;
use crate::policy::Policy;
use crate::wellknown::EVENT_REPORTER;
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
        }
    }
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
    /// The first pass has said whether DRA-only GPU nodes go unjudged (once per process).
    dra_hint_logged: bool,
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
            dra_hint_logged: false,
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

    /// One pass over every node and pod of the caches, at `now`: the nodes first, so the pods
    /// are judged against the taints this pass added.
    pub async fn pass(&mut self, caches: &Caches, now: Timestamp) -> PassReport {
        let mut report = PassReport::default();
        self.metrics.passes.inc();
        let done = match self.nodes_pass(caches, now, &mut report).await {
            Ok(node_states) => self.pods_pass(caches, &node_states, now, &mut report).await,
            Err(stop) => Err(stop),
        };
        report.stopped = done.is_err();
        report
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
            Write::ClearAnnotation(node) | Write::Taint(node) | Write::Untaint(node) => {
                tracing::warn!(node = %node, %error, "cannot {doing}; retrying on the next pass");
                node
            }
            Write::Mark(pod) | Write::Evict(pod) => {
                tracing::warn!(pod = %pod, %error, "cannot {doing}; retrying on the next pass");
                pod
            }
        };
        report
            .errors
            .push(format!("{} {object}: {error}", write.label()));
        Ok(None)
    }

    /// The node histories (for tests and debugging).
    pub fn histories(&self) -> &HashMap<String, NodeHistory> {
        &self.histories
    }
}
