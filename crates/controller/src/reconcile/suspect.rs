//! Suspect nodes, in the node pass: device failures of several different pods on a node its
//! device plugin reports healthy ([`gpu_guard_core::memory::suspect::verdict`]) taint it as a
//! degraded node is tainted (the same key, value `suspect`, always `NoSchedule`), within the
//! same safety valve; it is released after `suspect.quietSeconds` without another failure.
//!
//! The failures come from [`super::memory::SeenFailures`]: the cached pods', those the event
//! path saw deleted as they failed, and those on record in the workloads' memories. What the
//! release needs (the last failure, the pods) is kept on the node
//! ([`gpu_guard_core::wellknown::SUSPECT_ANNOTATION`]), so a restarted controller, or a new
//! leader, which sees none of the deleted pods, still releases it on time and not before.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::events::EventType;

use super::events::{REASON_SUSPECT, node_ref};
use super::{Caches, Reconciler, WriteError};
use gpu_guard_core::health::node::condition::Degradation;
use gpu_guard_core::health::node::{
    self, NodeVerdict, Ownership, TaintDecision, holds_suspect_taint, suspect_record,
};
use gpu_guard_core::memory::suspect::{SuspectRecord, SuspectRule, SuspectVerdict, verdict};
use gpu_guard_core::wellknown::{DEGRADED_TAINT_KEY, SUSPECT_ANNOTATION, SUSPECT_TAINT_VALUE};

/// What the suspect rule asks of a node this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum SuspectStep {
    /// Nothing: the rule does not concern the node.
    None,
    /// Taint it suspect, recording this.
    Taint(SuspectRecord),
    /// It holds the suspect taint and stays suspect; `rewrite`: its record on the node is
    /// older than this one (a later failure moved the release) or missing.
    Keep {
        record: SuspectRecord,
        rewrite: bool,
    },
    /// It holds the suspect taint and its quiet period is over: remove it.
    Release { quiet_since: Option<Timestamp> },
}

impl SuspectStep {
    /// The Node condition of a node tainted suspect, if this step keeps or adds the taint.
    pub(super) fn condition(&self, rule: &SuspectRule) -> Option<Degradation> {
        match self {
            SuspectStep::Taint(record) | SuspectStep::Keep { record, .. } => {
                Some(Degradation::suspect(
                    &record.pods,
                    record.last,
                    record
                        .last
                        .checked_add(seconds(rule.quiet_seconds))
                        .unwrap_or(Timestamp::MAX),
                ))
            }
            SuspectStep::None | SuspectStep::Release { .. } => None,
        }
    }
}

fn seconds(value: u64) -> SignedDuration {
    SignedDuration::from_secs(i64::try_from(value).unwrap_or(i64::MAX))
}

impl Reconciler {
    /// The rule of the policy.
    pub(super) fn suspect_rule(&self) -> SuspectRule {
        let suspect = &self.policy.controller.node_health.suspect;
        SuspectRule {
            pods: usize::try_from(suspect.pods).unwrap_or(usize::MAX),
            window_seconds: suspect.window_seconds,
            quiet_seconds: suspect.quiet_seconds,
        }
    }

    /// Notes the device failures of the cached pods, and forgets those too old to count for
    /// any node (older than the window and the quiet period).
    pub(super) fn note_failures(&self, caches: &Caches, now: Timestamp) {
        let seen = self.marker.memory().seen();
        for pod in caches.pods.snapshot() {
            if let Some(failure) = pod.device_failure.as_deref() {
                seen.note(failure);
            }
        }
        let rule = self.suspect_rule();
        let kept = rule.window_seconds.max(rule.quiet_seconds);
        seen.forget_before(now.checked_sub(seconds(kept)).unwrap_or(Timestamp::MIN));
    }

    /// Whether gpu-guard holds the suspect taint on the node (in a dry run: would).
    pub(super) fn is_suspect(&self, node: &Node, verdict: &NodeVerdict) -> bool {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        (node::ownership(node) == Ownership::Ours && holds_suspect_taint(node))
            || (verdict.history.assumed_tainted && self.assumed_suspect.contains_key(name))
    }

    /// What the suspect rule asks of the node at `now`. A node becomes suspect only while
    /// its device plugin reports it healthy and gpu-guard does not hold it tainted; one held
    /// suspect is released when its quiet period is over and it is not degraded (a degraded
    /// node keeps the taint until it is healthy too, so it is never untainted while its
    /// devices are unusable).
    pub(super) fn suspect_step(
        &self,
        node: &Node,
        verdict: &NodeVerdict,
        now: Timestamp,
    ) -> SuspectStep {
        let Some(name) = node.metadata.name.as_deref() else {
            return SuspectStep::None;
        };
        let rule = self.suspect_rule();
        let mut failures = self.marker.memory().seen().on_node(name);
        if self.is_suspect(node, verdict) {
            let recorded = self
                .assumed_suspect
                .get(name)
                .cloned()
                .filter(|_| verdict.history.assumed_tainted)
                .or_else(|| suspect_record(node));
            if let Some(recorded) = &recorded {
                failures.extend(recorded.failures(name));
            }
            return match verdict_of(name, &failures, true, now, &rule) {
                SuspectVerdict::Suspect { pods, release_at } => {
                    let record = SuspectRecord::of(&pods, release_at, &rule);
                    let rewrite = recorded.is_none_or(|known| known.last < record.last);
                    SuspectStep::Keep { record, rewrite }
                }
                SuspectVerdict::Clear if !verdict.degraded.is_empty() => SuspectStep::None,
                SuspectVerdict::Clear => SuspectStep::Release {
                    quiet_since: recorded.map(|known| known.last),
                },
            };
        }
        let health = &self.policy.controller.node_health;
        if !health.enabled || !health.suspect.enabled || verdict.decision != TaintDecision::Healthy
        {
            return SuspectStep::None;
        }
        match verdict_of(name, &failures, false, now, &rule) {
            SuspectVerdict::Suspect { pods, release_at } => {
                SuspectStep::Taint(SuspectRecord::of(&pods, release_at, &rule))
            }
            SuspectVerdict::Clear => SuspectStep::None,
        }
    }

    /// Adds the suspect taint and its record. `Ok(false)`: the node carries a
    /// `gpu-guard.io/device-degraded` taint already.
    pub(super) async fn add_suspect_taint(
        &mut self,
        node: &Node,
        record: &SuspectRecord,
        now: Timestamp,
    ) -> Result<bool, WriteError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let patched = self
            .patch_node(node, |current| {
                (node::ownership(current) == Ownership::None)
                    .then(|| node::add_suspect_taint_patch(current, record, now))
            })
            .await?;
        if !patched {
            tracing::info!(node = %name, "the node carries a {DEGRADED_TAINT_KEY} taint already; not tainted suspect");
            return Ok(false);
        }
        let rule = self.suspect_rule();
        let seen = format!(
            "device failures of {} different pods within {} s ({}), the last at {}, and no \
             unusable device; released after {} s without another",
            record.pods.len(),
            rule.window_seconds,
            record.pods.join(", "),
            record.last,
            rule.quiet_seconds
        );
        let rendered = format!("{DEGRADED_TAINT_KEY}={SUSPECT_TAINT_VALUE}:NoSchedule");
        let note = if self.dry_run() {
            self.assumed_suspect.insert(name.clone(), record.clone());
            format!("dry run: would taint {rendered}: {seen}")
        } else {
            format!("tainted {rendered}: {seen}")
        };
        tracing::warn!(node = %name, "{note}");
        self.event(
            &node_ref(node),
            EventType::Warning,
            REASON_SUSPECT,
            "Taint",
            note,
        )
        .await;
        Ok(true)
    }

    /// Rewrites the record of a node held suspect (a later failure moved its release).
    pub(super) async fn rewrite_suspect_record(
        &mut self,
        node: &Node,
        record: &SuspectRecord,
    ) -> Result<(), WriteError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        if self.dry_run() && self.assumed_suspect.contains_key(&name) {
            // Only assumed: the node carries no record to rewrite.
            self.assumed_suspect.insert(name, record.clone());
            return Ok(());
        }
        self.patch_node(node, |current| {
            (node::ownership(current) == Ownership::Ours && holds_suspect_taint(current))
                .then(|| node::suspect_record_patch(current, record))
        })
        .await?;
        tracing::info!(node = %name, record = %record.annotation(),
            "another device failure on the suspect node: {SUSPECT_ANNOTATION} rewritten, its release moved");
        Ok(())
    }
}

/// [`verdict`] with the failures as a slice.
fn verdict_of(
    name: &str,
    failures: &[gpu_guard_core::memory::DeviceFailure],
    suspect_now: bool,
    now: Timestamp,
    rule: &SuspectRule,
) -> SuspectVerdict {
    verdict(name, failures.iter(), suspect_now, now, rule)
}
