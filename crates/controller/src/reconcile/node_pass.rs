//! The node half of a pass: judge every cached node ([`node_verdict`]), keep each node's
//! history, and apply the decisions: add or remove gpu-guard's taint (within the safety valve),
//! clear a stale owner annotation, report the node gauges. Hands the pod half the nodes whose
//! degradation their pods answer for.
//!
//! The node cache lags the controller's own writes (a watch event arrives some time after the
//! write it reports). A pass judges each node as this replica last wrote or read it when that
//! is newer than the cached node ([`Written`]), as upstream controllers keep expectations of
//! their own writes (kubernetes `pkg/controller/controller_utils.go` `ControllerExpectations`,
//! v1.36): otherwise the next pass would count the taints of the previous one as missing, and
//! the safety valve would let more through than `maxTaintedPercent`.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch};
use kube::runtime::events::EventType;
use serde_json::Value;

use super::events::{
    REASON_CONDITION_REMOVED, REASON_CONDITION_SET, REASON_DEGRADED, REASON_RECOVERED,
    REASON_SAFETY_VALVE, REASON_SUSPECT_RELEASED, node_ref,
};
use super::suspect::SuspectStep;
use super::{Caches, PassReport, Reconciler, Stop, Write, WriteError};
use gpu_guard_core::health::node::condition::{
    self, ConditionAction, Degradation, condition_action, degraded_condition, wanted_condition,
};
use gpu_guard_core::health::node::{
    self, NodeHistory, NodeVerdict, Ownership, TaintDecision, node_verdict_with, ownership,
};
use gpu_guard_core::health::pod::NodeState;
use gpu_guard_core::health::pod::stuck::{Unready, node_unready};
use gpu_guard_core::wellknown::{
    DEGRADED_OWNER_ANNOTATION, DEGRADED_TAINT_KEY, DEVICE_DEGRADED_NODE_CONDITION,
    SUSPECT_TAINT_VALUE,
};

/// Attempts of a node taint patch that meets a conflict (someone else changed the node).
const NODE_PATCH_ATTEMPTS: usize = 3;

/// How long a node as written is preferred to a cache that does not show the write: kubernetes
/// `ExpectationsTimeout` (`pkg/controller/controller_utils.go`, v1.36: 5 minutes), the bound
/// upstream controllers put on waiting for their own writes to come back through a watch. A
/// watch that delivers nothing for that long is relisted anyway.
const WRITTEN_TIMEOUT: Duration = Duration::from_secs(300);

/// A node as this replica wrote it (the API server's answer to its patch) or read it (after a
/// conflict, or the fresh read of a new term), slimmed as the cache slims it.
pub(super) struct Written {
    node: Arc<Node>,
    at: Instant,
}

impl Written {
    /// Whether `cached` is older than this node: the cache has not caught up yet.
    fn newer_than(&self, cached: &Node, now: Instant) -> bool {
        if now.duration_since(self.at) >= WRITTEN_TIMEOUT {
            return false;
        }
        let (Some(written), Some(cached)) = (
            self.node.metadata.resource_version.as_deref(),
            cached.metadata.resource_version.as_deref(),
        ) else {
            return false;
        };
        match compare_resource_versions(cached, written) {
            Some(order) => order == Ordering::Less,
            // Not comparable (an API server older than v1.35): the cache has caught up when
            // it shows this very version.
            None => cached != written,
        }
    }
}

/// Orders two resourceVersions of the same resource: comparable since Kubernetes v1.35
/// (KEP-5504, stable; k8s.io/apimachinery `pkg/util/resourceversion` `CompareResourceVersion`,
/// v0.35): positive integers without leading zeros, compared as numbers of any length. `None`
/// when either is not of that form.
fn compare_resource_versions(a: &str, b: &str) -> Option<Ordering> {
    let valid = |version: &str| {
        !version.is_empty()
            && !version.starts_with('0')
            && version.bytes().all(|byte| byte.is_ascii_digit())
    };
    (valid(a) && valid(b)).then(|| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

impl Reconciler {
    /// Judges every node of the caches at `now` against its history, forgets the histories of
    /// nodes that are gone, and returns the verdicts (sorted by name) and how many are GPU
    /// nodes. Changes nothing.
    pub(super) fn judge_nodes(
        &mut self,
        caches: &Caches,
        now: Timestamp,
    ) -> (Vec<(Arc<Node>, NodeVerdict)>, usize) {
        let mut nodes = self.freshest(caches.nodes.state());
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

        let mut verdicts: Vec<(Arc<Node>, NodeVerdict)> = Vec::with_capacity(nodes.len());
        // The ResourceSlices of each node, read once per pass.
        let slices = caches.slices.state();
        let mut slices_by_node: HashMap<&str, Vec<&ResourceSlice>> = HashMap::new();
        for slice in &slices {
            if let Some(node) = slice.spec.node_name.as_deref() {
                slices_by_node.entry(node).or_default().push(slice.as_ref());
            }
        }
        for node in nodes {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            let history = self.histories.get(name).cloned().unwrap_or_default();
            let dra = node::dra_device_counts(
                name,
                slices_by_node.get(name).into_iter().flatten().copied(),
                &self.policy,
            );
            let verdict = node_verdict_with(&node, dra, &self.policy, now, &history);
            verdicts.push((node, verdict));
        }
        let present: HashSet<&str> = verdicts
            .iter()
            .filter_map(|(node, _)| node.metadata.name.as_deref())
            .collect();
        self.histories
            .retain(|name, _| present.contains(name.as_str()));
        self.valve_reported
            .retain(|name| present.contains(name.as_str()));

        let gpu_nodes = verdicts.iter().filter(|(_, v)| v.is_gpu_node()).count();
        if !self.dra_hint_logged {
            self.dra_hint_logged = true;
            if let Some(hint) =
                node::unjudged_dra_hint(gpu_nodes, slices.iter().map(AsRef::as_ref), &self.policy)
            {
                tracing::warn!("{hint}");
            }
        }
        (verdicts, gpu_nodes)
    }

    /// Judges and acts on every node of the caches, at `now`. Returns, by node name, the
    /// degraded resources of the nodes holding gpu-guard's taint; `Err(Stop)` when leadership
    /// ran out (the gauges are then left as they were).
    pub(super) async fn nodes_pass(
        &mut self,
        caches: &Caches,
        now: Timestamp,
        report: &mut PassReport,
    ) -> Result<HashMap<String, NodeState>, Stop> {
        self.note_failures(caches, now);
        let (mut verdicts, mut gpu_nodes) = self.judge_nodes(caches, now);
        // The first taint of a term counts what the API server holds, not what the cache has
        // seen so far: another leader may have tainted nodes moments ago.
        let mut may_add = true;
        if self.fresh_read_due
            && self.policy.controller.node_health.enabled
            && verdicts.iter().any(|(node, verdict)| {
                verdict.decision == TaintDecision::Taint
                    || matches!(self.suspect_step(node, verdict, now), SuspectStep::Taint(_))
            })
        {
            match self.read_nodes().await {
                Ok(()) => {
                    self.fresh_read_due = false;
                    (verdicts, gpu_nodes) = self.judge_nodes(caches, now);
                }
                Err(error) => {
                    may_add = false;
                    self.metrics.reconcile_errors.inc();
                    tracing::warn!(%error, "cannot read the nodes; no taint is added until they \
                        are read (the cache may not show another leader's taints yet)");
                    report.errors.push(format!("nodes: {error}"));
                }
            }
        }
        let mut tainted = verdicts
            .iter()
            .filter(|(node, verdict)| {
                ownership(node) == Ownership::Ours || verdict.history.assumed_tainted
            })
            .count();
        let mut node_states: HashMap<String, NodeState> = HashMap::new();
        self.note_readiness(&verdicts);
        let mut suspect_held = 0_usize;

        for (node, mut verdict) in verdicts {
            let name = node.metadata.name.clone().unwrap_or_default();
            let mut holds_taint =
                ownership(&node) == Ownership::Ours || verdict.history.assumed_tainted;
            for (resource, why) in &verdict.forgotten {
                self.metrics.vanished_forgotten.inc();
                tracing::info!(node = %name, %resource, "{why}: no longer judged device plugin down");
            }
            if node::stale_annotation(&node) {
                // A person removed a suspect taint: their word that the node is fine. The
                // failures that made it suspect do not make it so again.
                if node::owner_record(&node)
                    .is_some_and(|record| record.value == SUSPECT_TAINT_VALUE)
                {
                    self.marker.memory().seen().clear_node(&name, now);
                }
                let cleared = self.clear_stale_annotation(&node).await;
                self.settle(Write::ClearAnnotation(&name), cleared, report)?;
            }
            // The suspect rule decides for a node it taints or holds tainted.
            let was_suspect = self.is_suspect(&node, &verdict);
            let step = self.suspect_step(&node, &verdict, now);
            match &step {
                SuspectStep::Taint(_) => verdict.decision = TaintDecision::Taint,
                SuspectStep::Keep { record, rewrite } => {
                    verdict.decision = TaintDecision::Tainted;
                    if *rewrite {
                        let rewritten = self.rewrite_suspect_record(&node, record).await;
                        self.settle(Write::Taint(&name), rewritten, report)?;
                    }
                }
                SuspectStep::Release { .. } => verdict.decision = TaintDecision::Untaint,
                SuspectStep::None => {}
            }
            let mut suspect_added = false;
            match verdict.decision {
                TaintDecision::Taint if !self.policy.controller.node_health.enabled => {
                    tracing::debug!(node = %name, seen = %verdict.describe_degraded(),
                        "node degraded; tainting is disabled (controller.nodeHealth.enabled)");
                }
                TaintDecision::Taint if !may_add => {}
                TaintDecision::Taint if !node::may_taint(gpu_nodes, tainted, &self.policy) => {
                    report.valve_held.push(name.clone());
                    if self.valve_reported.insert(name.clone()) {
                        self.metrics.safety_valve_trips.inc();
                        let seen = match &step {
                            SuspectStep::Taint(record) => format!(
                                "suspect: device failures of {} pods ({})",
                                record.pods.len(),
                                record.pods.join(", ")
                            ),
                            _ => verdict.describe_degraded(),
                        };
                        let note = format!(
                            "{seen}; not tainted: {tainted} of {gpu_nodes} GPU nodes are tainted \
                             already, the most controller.nodeHealth.maxTaintedPercent ({} %) \
                             allows",
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
                TaintDecision::Taint => {
                    let added = match &step {
                        SuspectStep::Taint(record) => {
                            self.add_suspect_taint(&node, record, now).await
                        }
                        _ => self.add_taint(&node, &verdict, now).await,
                    };
                    match self.settle(Write::Taint(&name), added, report)? {
                        Some(true) => {
                            if matches!(step, SuspectStep::Taint(_)) {
                                suspect_added = true;
                                self.metrics.suspect_taints_added.inc();
                            }
                            self.valve_reported.remove(&name);
                            tainted += 1;
                            holds_taint = true;
                            verdict.history.assumed_tainted = self.dry_run();
                            verdict.history.held_taint = !self.dry_run();
                            self.metrics.taints_added.inc();
                            report.tainted.push(name.clone());
                        }
                        // Read again after a conflict: it holds gpu-guard's taint already (this
                        // replica's write the cache has not shown yet, or another leader's).
                        Some(false) if self.written_ownership(&name) == Some(Ownership::Ours) => {
                            tainted += 1;
                            holds_taint = true;
                            verdict.history.held_taint = true;
                        }
                        Some(false) | None => {}
                    }
                }
                TaintDecision::Untaint => {
                    let removed = self.remove_taint(&node, &verdict, &step).await;
                    match self.settle(Write::Untaint(&name), removed, report)? {
                        Some(false) => {
                            holds_taint = false;
                            verdict.history = forget_episode(verdict.history);
                            self.assumed_suspect.remove(&name);
                        }
                        Some(true) => {
                            tainted = tainted.saturating_sub(1);
                            holds_taint = false;
                            verdict.history = forget_episode(verdict.history);
                            self.assumed_suspect.remove(&name);
                            self.metrics.taints_removed.inc();
                            report.untainted.push(name.clone());
                        }
                        None => {}
                    }
                }
                TaintDecision::Degrading { taint_at } => {
                    if self
                        .histories
                        .get(&name)
                        .is_none_or(|h| h.degraded_since.is_none())
                    {
                        tracing::info!(node = %name, seen = %verdict.describe_degraded(),
                            %taint_at, "node degraded; tainted if it stays so");
                    }
                }
                TaintDecision::ForeignTaint
                | TaintDecision::Healthy
                | TaintDecision::NotJudged
                | TaintDecision::Tainted
                | TaintDecision::Recovering { .. } => {}
            }
            if !matches!(verdict.decision, TaintDecision::Taint) {
                self.valve_reported.remove(&name);
            }
            let suspect_now = match &step {
                SuspectStep::Taint(_) => suspect_added,
                SuspectStep::Keep { .. } => true,
                SuspectStep::None => was_suspect && holds_taint,
                SuspectStep::Release { .. } => false,
            };
            if suspect_now {
                suspect_held += 1;
            }
            let suspect_condition = step.condition(&self.suspect_rule());
            self.converge_condition(&node, &verdict, holds_taint, suspect_condition, now, report)
                .await?;
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
        self.metrics
            .suspect_nodes
            .set(i64::try_from(suspect_held).unwrap_or(i64::MAX));
        let degraded = self
            .histories
            .values()
            .filter(|h| h.degraded_since.is_some())
            .count();
        self.metrics
            .degraded_nodes
            .set(i64::try_from(degraded).unwrap_or(i64::MAX));
        Ok(node_states)
    }

    /// Keeps which nodes are NotReady or unreachable ([`node_unready`]), for the stuck pods,
    /// and which of them changed since the last node pass (their pods are judged again).
    fn note_readiness(&mut self, verdicts: &[(Arc<Node>, NodeVerdict)]) {
        let unready: HashMap<String, Unready> = verdicts
            .iter()
            .filter_map(|(node, _)| {
                let name = node.metadata.name.clone()?;
                node_unready(node).map(|unready| (name, unready))
            })
            .collect();
        self.unready_changed = super::changed_keys(&self.unready, &unready)
            .cloned()
            .collect();
        self.unready = unready;
    }

    /// Brings gpu-guard's Node condition in line with its taint ([`wanted_condition`]): set
    /// while the node holds the taint (`holds_taint`, after this pass's decision), removed
    /// otherwise, whoever removed the taint. A failed write is retried on the next pass.
    async fn converge_condition(
        &mut self,
        node: &Node,
        verdict: &NodeVerdict,
        holds_taint: bool,
        suspect: Option<Degradation>,
        now: Timestamp,
        report: &mut PassReport,
    ) -> Result<(), Stop> {
        let name = node.metadata.name.clone().unwrap_or_default();
        // A dry run stores nothing: what it would have done stands in for the node's condition.
        let current = match self.assumed_conditions.get(&name) {
            Some(assumed) => assumed.clone(),
            None => degraded_condition(node).cloned(),
        };
        let since = condition::tainted_since(current.as_ref(), node, now);
        // A suspect node's condition says why it is suspect, whatever its devices say.
        let (why, recovering) = match suspect {
            Some(why) => (why, false),
            None => (
                Degradation::unusable_devices(verdict, since),
                verdict.degraded.is_empty(),
            ),
        };
        let wanted = wanted_condition(current.as_ref(), holds_taint, recovering, why);
        match condition_action(current.as_ref(), wanted) {
            ConditionAction::Nothing => {}
            ConditionAction::Set(why) => {
                let set = self.set_condition(node, current.as_ref(), &why, now).await;
                if self
                    .settle(Write::SetCondition(&name), set, report)?
                    .is_some()
                {
                    self.metrics.node_conditions_set.inc();
                    report.conditions_set.push(name);
                }
            }
            ConditionAction::Remove => {
                let removed = if degraded_condition(node).is_none() {
                    // Only assumed (a dry run set none): nothing to send.
                    self.assumed_conditions.insert(name.clone(), None);
                    self.condition_removed(node, "dry run: would remove").await;
                    Ok(())
                } else {
                    self.remove_condition(node).await
                };
                if self
                    .settle(Write::RemoveCondition(&name), removed, report)?
                    .is_some()
                {
                    self.metrics.node_conditions_removed.inc();
                    report.conditions_removed.push(name);
                }
            }
        }
        Ok(())
    }

    /// Adds or rewrites the condition (`nodes/status`, a strategic merge patch that touches no
    /// other condition), with its Event.
    async fn set_condition(
        &mut self,
        node: &Node,
        current: Option<&NodeCondition>,
        why: &Degradation,
        now: Timestamp,
    ) -> Result<(), WriteError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let patch = condition::set_condition_patch(current, why, now);
        self.patch_node_status(&name, &patch).await?;
        let done = if self.dry_run() {
            let value = condition::degraded_condition_value(current, why, now);
            self.assumed_conditions.insert(name.clone(), Some(value));
            "dry run: would set"
        } else {
            "set"
        };
        let note = format!(
            "{done} the node condition {DEVICE_DEGRADED_NODE_CONDITION}=True, reason {}: {}",
            why.reason, why.message
        );
        tracing::info!(node = %name, "{note}");
        self.event(
            &node_ref(node),
            EventType::Warning,
            REASON_CONDITION_SET,
            "SetCondition",
            note,
        )
        .await;
        Ok(())
    }

    /// Removes the condition, alone (`$patch: delete` for its type), with its Event.
    async fn remove_condition(&mut self, node: &Node) -> Result<(), WriteError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.patch_node_status(&name, &condition::remove_condition_patch())
            .await?;
        let done = if self.dry_run() {
            self.assumed_conditions.insert(name.clone(), None);
            "dry run: would remove"
        } else {
            "removed"
        };
        self.condition_removed(node, done).await;
        Ok(())
    }

    async fn condition_removed(&self, node: &Node, done: &str) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let note = format!(
            "{done} the node condition {DEVICE_DEGRADED_NODE_CONDITION}: the node does not hold              gpu-guard's {DEGRADED_TAINT_KEY} taint"
        );
        tracing::info!(node = %name, "{note}");
        self.event(
            &node_ref(node),
            EventType::Normal,
            REASON_CONDITION_REMOVED,
            "RemoveCondition",
            note,
        )
        .await;
    }

    /// Sends a strategic merge patch of `nodes/{name}/status` (in a dry run with `dryRun=All`).
    /// No resourceVersion precondition: the conditions merge by type, so a concurrent writer
    /// of another condition (the kubelet every few seconds) loses nothing, and a stale
    /// decision is corrected on the next pass.
    async fn patch_node_status(&self, name: &str, patch: &Value) -> Result<(), WriteError> {
        self.ensure_leading()?;
        let api = Api::<Node>::all(self.client.clone());
        let written = api
            .patch_status(name, &self.patch_params(), &Patch::Strategic(patch))
            .await?;
        if !self.dry_run() {
            self.remember(written);
        }
        Ok(())
    }

    /// Removes the owner annotation of a node whose taint is gone (someone removed it by hand):
    /// only the annotation, so a later taint with the same key is not taken for gpu-guard's.
    async fn clear_stale_annotation(&self, node: &Node) -> Result<(), WriteError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let patched = self
            .patch_node(node, |current| {
                node::stale_annotation(current).then(|| node::clear_annotation_patch(current))
            })
            .await?;
        if patched && self.dry_run() {
            tracing::info!(node = %name, "dry run: would remove the stale owner annotation {} (sent with dryRun=All)", DEGRADED_OWNER_ANNOTATION);
        } else if patched {
            tracing::info!(node = %name, "gpu-guard's taint was removed by someone else; removed its stale owner annotation {}", DEGRADED_OWNER_ANNOTATION);
        }
        Ok(())
    }

    /// `Ok(false)`: nothing was tainted (someone else tainted the node meanwhile).
    async fn add_taint(
        &self,
        node: &Node,
        verdict: &NodeVerdict,
        now: Timestamp,
    ) -> Result<bool, WriteError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let Some(first) = verdict.degraded.first() else {
            return Ok(false);
        };
        let health = &self.policy.controller.node_health;
        // NoExecute would evict the device plugin's own pod (and the DCGM exporter's) unless
        // they tolerate the taint: while the plugin is down, nothing would bring it back.
        let no_execute = health.no_execute && !verdict.is_plugin_down();
        let taint = node::degraded_taint(&first.resource, no_execute);
        let since = verdict.history.degraded_since.unwrap_or(now);
        let rendered = format!(
            "{}={}:{}",
            taint.key,
            taint.value.as_deref().unwrap_or_default(),
            taint.effect
        );
        let fallback = if health.no_execute && !no_execute {
            "; NoSchedule, not NoExecute: the device plugin is down, and NoExecute would evict \
             the DaemonSet pods that bring it back"
        } else {
            ""
        };
        let seen = format!(
            "{} since {since} (threshold held {} s){fallback}",
            verdict.describe_degraded(),
            now.duration_since(since).as_secs()
        );
        // In a dry run too: sent with dryRun=All, so RBAC, admission and the resourceVersion
        // precondition are exercised, and nothing is stored.
        let patched = self
            .patch_node(node, |current| {
                (node::ownership(current) == Ownership::None)
                    .then(|| node::add_taint_patch(current, &taint, now))
            })
            .await?;
        if !patched {
            tracing::info!(node = %name, "the node carries a {DEGRADED_TAINT_KEY} taint already; not tainted again");
            return Ok(false);
        }
        let note = if self.dry_run() {
            let note = format!("dry run: would taint {rendered}: {seen}");
            tracing::info!(node = %name, "{note}");
            note
        } else {
            let note = format!("tainted {rendered}: {seen}");
            tracing::warn!(node = %name, "{note}");
            note
        };
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
    async fn remove_taint(
        &self,
        node: &Node,
        verdict: &NodeVerdict,
        step: &SuspectStep,
    ) -> Result<bool, WriteError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let (since, reason) = match step {
            SuspectStep::Release { quiet_since } => (
                format!(
                    ": suspect, and no device failure on the node{} for \
                     controller.nodeHealth.suspect.quietSeconds ({} s)",
                    quiet_since.map_or_else(String::new, |since| format!(" since {since}")),
                    self.policy.controller.node_health.suspect.quiet_seconds
                ),
                REASON_SUSPECT_RELEASED,
            ),
            _ => (
                format!(
                    ": devices healthy{}",
                    verdict
                        .history
                        .healthy_since
                        .map_or_else(String::new, |since| format!(" since {since}"))
                ),
                REASON_RECOVERED,
            ),
        };
        let note = if self.dry_run() && node::ownership(node) != Ownership::Ours {
            // The taint was only assumed (a dry run added none): nothing to send.
            format!("dry run: would remove the {DEGRADED_TAINT_KEY} taint{since}")
        } else {
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
            let done = if self.dry_run() {
                "dry run: would remove"
            } else {
                "removed"
            };
            format!("{done} the {DEGRADED_TAINT_KEY} taint{since}")
        };
        tracing::info!(node = %name, "{note}");
        self.event(&node_ref(node), EventType::Normal, reason, "Untaint", note)
            .await;
        Ok(true)
    }

    /// Sends the patch `build` makes from the node (in a dry run with `dryRun=All`: the API
    /// server checks it and stores nothing), with its resourceVersion; on a conflict,
    /// reads the node again and rebuilds the patch (`None`: nothing to do any more).
    /// `Ok(false)`: the node no longer needs the change (someone else made it meanwhile).
    pub(super) async fn patch_node(
        &self,
        node: &Node,
        build: impl Fn(&Node) -> Option<Value>,
    ) -> Result<bool, WriteError> {
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
                .patch(&name, &self.patch_params(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => {
                    // A dry run's answer is what would have been stored: nothing was.
                    if !self.dry_run() {
                        self.remember(written);
                    }
                    return Ok(true);
                }
                Err(kube::Error::Api(status))
                    if status.is_conflict() && attempt < NODE_PATCH_ATTEMPTS =>
                {
                    tracing::debug!(node = %name, attempt, "node changed meanwhile; reading it again");
                    current = api.get(&name).await?;
                    self.remember(current.clone());
                    attempt += 1;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
}

impl Reconciler {
    /// Keeps `node`, as just written or read from the API server, to be judged instead of the
    /// cached node until the cache shows it (or something newer).
    fn remember(&self, mut node: Node) {
        let Some(name) = node.metadata.name.clone() else {
            return;
        };
        super::caches::keep_node_taints_devices_and_owner(&mut node);
        let written = Written {
            node: Arc::new(node),
            at: Instant::now(),
        };
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, written);
    }

    /// Who owns the node's taint by what this replica last wrote or read of it.
    fn written_ownership(&self, name: &str) -> Option<Ownership> {
        let written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        written.get(name).map(|written| ownership(&written.node))
    }

    /// The cached nodes, each replaced by what this replica wrote or read of it when that is
    /// newer. What the cache has caught up with, and the nodes it no longer holds, are
    /// forgotten.
    fn freshest(&self, cached: Vec<Arc<Node>>) -> Vec<Arc<Node>> {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if written.is_empty() {
            return cached;
        }
        let now = Instant::now();
        let mut fresh = Vec::with_capacity(cached.len());
        let mut kept = HashMap::new();
        for node in cached {
            let name = node.metadata.name.clone().unwrap_or_default();
            match written.remove(&name) {
                Some(newer) if newer.newer_than(&node, now) => {
                    fresh.push(newer.node.clone());
                    kept.insert(name, newer);
                }
                _ => fresh.push(node),
            }
        }
        *written = kept;
        fresh
    }

    /// Reads every node from the API server (a consistent read, in pages of 500 as the
    /// reflectors list), to be judged instead of the cached nodes where newer.
    async fn read_nodes(&self) -> Result<(), kube::Error> {
        let api = Api::<Node>::all(self.client.clone());
        let mut params = ListParams::default().limit(500);
        loop {
            let page = api.list(&params).await?;
            for node in page.items {
                self.remember(node);
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(()),
            }
        }
    }
}

/// The history of a node whose taint is gone: a new episode starts, but what is known of its
/// device resources stays: those seen on it (a plugin that vanishes later is still "plugin
/// down"), since when each has been gone, and those replaced by others.
fn forget_episode(history: NodeHistory) -> NodeHistory {
    NodeHistory {
        seen: history.seen,
        vanished_since: history.vanished_since,
        replaced: history.replaced,
        ..NodeHistory::default()
    }
}
