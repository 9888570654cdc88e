//! The pod half of a pass: judge device pods of the opted-in namespaces ([`verdict`]) against
//! the node states of the last node pass, and apply the decisions: add the
//! `gpu-guard.io/DeviceFailure` condition (through the [`super::marker::Marker`]), evict
//! (through the token bucket, each refused pod backing off on its own).

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::events::EventType;

use super::Caches;
use super::events::{REASON_EVICTED, REASON_FORCE_DELETED, REASON_STUCK};
use super::memory::Recorded;
use super::pods::PodCache;
use super::throttle::Backoff;
use super::{PassReport, Reconciler, Stop, Write, WriteError};
use gpu_guard_core::health::pod::stuck::{Stuck, stuck_message, stuck_verdict};
use gpu_guard_core::health::pod::{Action, Cause, PodFacts, verdict};

impl Reconciler {
    /// Judges and acts on `pods` (device pods' facts, sorted) of the `opted_in` namespaces, at
    /// `now`, against the node states of the last node pass; a pod's ResourceClaims count as
    /// the devices of the drivers that allocated them (`caches.claims`); the peers of a gang
    /// pod hit by a device failure are found in `caches.pods`. `Err(Stop)` when leadership ran
    /// out.
    pub(super) async fn pods_pass(
        &mut self,
        pods: Vec<Arc<PodFacts>>,
        caches: &Caches,
        opted_in: &HashSet<String>,
        now: Timestamp,
        report: &mut PassReport,
    ) -> Result<(), Stop> {
        for pod in pods {
            if !opted_in.contains(&pod.namespace) {
                continue;
            }
            let pod = caches.claims.resolve(pod, &self.policy);
            self.judge_stuck(&pod, now, report).await?;
            self.record_failure(&pod, &caches.pods, now, report).await?;
            let node_state = pod
                .node
                .as_ref()
                .and_then(|node| self.node_states.get(node));
            let action = verdict(&pod, node_state, &self.policy);
            let mut marked_now = false;
            if let Action::Act {
                cause, mark: true, ..
            } = &action
            {
                let marked = self.marker.mark(&pod, cause, now).await;
                if self.settle(Write::Mark(&pod.id()), marked, report)? == Some(true) {
                    report.marked.push(pod.id());
                    marked_now = true;
                }
            }
            self.mark_peers(&pod, marked_now, &caches.pods, now, report)
                .await?;
            let Action::Act { cause, evict, .. } = action else {
                continue;
            };
            let uid = pod.uid.clone();
            let id = pod.id();
            if evict && !self.evicted.contains(&uid) {
                if self.backoff.get(&uid).is_some_and(|b| now < b.next) {
                    // A PodDisruptionBudget refused it lately: its turn comes later, without
                    // taking a token from the other pods.
                    report.evictions_deferred.push(id);
                    continue;
                }
                if let Err(error) = self.ensure_leading() {
                    tracing::debug!(%error);
                    return Err(Stop);
                }
                if !self.bucket.take(now) {
                    self.metrics.evictions_deferred.inc();
                    tracing::info!(pod = %id, "eviction rate limit reached; evicting on a later pass");
                    report.evictions_deferred.push(id);
                    continue;
                }
                let evicted = self.evict(&pod, &cause).await;
                let evicted = self
                    .settle(Write::Evict(&id), evicted, report)
                    // The eviction did not happen: the token goes back.
                    .inspect_err(|_| self.bucket.refund())?;
                match evicted {
                    Some(Evicted::Yes) => {
                        self.backoff.remove(&uid);
                        self.evicted.insert(uid);
                        self.metrics.pods_evicted.inc();
                        report.evicted.push(id);
                    }
                    Some(Evicted::Failed(reason)) => {
                        report.errors.push(format!("evict {id}: {reason}"));
                        self.metrics.reconcile_errors.inc();
                        self.refuse(uid, id, now, report);
                    }
                    // Refused (a PodDisruptionBudget), or failed: the token goes back to the
                    // other pods, and this one waits, longer after each refusal, so that one
                    // stuck pod cannot spend the budget of every pass.
                    Some(Evicted::BudgetRefused) | None => self.refuse(uid, id, now, report),
                    Some(Evicted::Replaced) => self.bucket.refund(),
                    Some(Evicted::Throttled) => {
                        // The API server is busy, not the budget: the token goes back and
                        // the pod is tried again on the next pass, with no backoff of its own.
                        self.bucket.refund();
                        self.metrics.evictions_deferred.inc();
                        report.evictions_deferred.push(id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Marks the running peers of `pod` when they are due ([`PodFacts::peers_due`]): all of them
    /// when this pass has just marked it (`marked_now`), otherwise (a failed peer mark to
    /// retry, another leader's mark, a failure that became real since the mark) those created by
    /// the time of its mark; pods created later are replacements. Each peer is marked once.
    async fn mark_peers(
        &mut self,
        pod: &PodFacts,
        marked_now: bool,
        cache: &PodCache,
        now: Timestamp,
        report: &mut PassReport,
    ) -> Result<(), Stop> {
        let marked = marked_now || self.marker.has_marked(&pod.uid);
        if !self.policy.controller.pods.mark_pods || !pod.peers_due(marked) {
            return Ok(());
        }
        let since = if marked_now {
            None
        } else {
            match pod.marked_at {
                Some(at) => Some(at),
                // Marked by this replica earlier this term (a dry run never shows the mark):
                // its peers were marked then.
                None => return Ok(()),
            }
        };
        let peers = cache.peers(pod, since);
        if peers.is_empty() {
            return Ok(());
        }
        for (peer, marked) in self.marker.mark_peers(pod, peers, now).await {
            if self.settle(Write::Mark(&peer), marked, report)? == Some(true) {
                report.peers_marked.push(peer);
            }
        }
        Ok(())
    }

    /// Records the pod's device failure when this process has not (the event path missed it,
    /// or the controller restarted: the memory says whether it is on record), and ends the
    /// free retries of a workload found past its budget; gives the condition to a pod of a
    /// workload known past its budget that lacks it (a new pod, or a mark that failed).
    async fn record_failure(
        &mut self,
        pod: &PodFacts,
        cache: &PodCache,
        now: Timestamp,
        report: &mut PassReport,
    ) -> Result<(), Stop> {
        let memory = self.marker.memory().clone();
        let workload = pod.workload();
        if memory.wants(pod) {
            let recorded = memory.record(pod, now).await;
            let Some(recorded) = self.settle(Write::Record(&pod.id()), recorded, report)? else {
                return Ok(());
            };
            if matches!(recorded, Recorded::New(_)) {
                report.recorded.push(pod.id());
            }
            if let (Some(standing), Some(workload)) = (recorded.standing(), &workload)
                && standing.exhausted
            {
                let marks = self
                    .marker
                    .end_free_retries(cache, workload, standing, now)
                    .await;
                for (id, marked) in marks {
                    if self.settle(Write::Mark(&id), marked, report)? == Some(true) {
                        report.retries_exhausted.push(id);
                    }
                }
            }
        }
        let Some(workload) = workload.filter(|workload| pod.needs_retries_exhausted(workload))
        else {
            return Ok(());
        };
        let Some(standing) = memory.standing(&workload).filter(|s| s.exhausted) else {
            return Ok(());
        };
        let marked = self
            .marker
            .mark_exhausted(pod, &workload, standing, now)
            .await;
        if self.settle(Write::Mark(&pod.id()), marked, report)? == Some(true) {
            report.retries_exhausted.push(pod.id());
        }
        Ok(())
    }

    /// An eviction that did not happen and will not by retrying at once: its token goes back,
    /// and the pod backs off on its own.
    fn refuse(&mut self, uid: String, id: String, now: Timestamp, report: &mut PassReport) {
        self.bucket.refund();
        let backoff = Backoff::after_refusal(self.backoff.get(&uid), now);
        self.backoff.insert(uid, backoff);
        self.metrics.evictions_deferred.inc();
        report.evictions_deferred.push(id);
    }

    /// Forgets what was remembered of pods that are gone: `present` are every cached pod.
    pub(super) fn forget_pods_gone(&mut self, present: &[Arc<PodFacts>], now: Timestamp) {
        self.marker.memory().retain(present, now);
        let uids: HashSet<&str> = present.iter().map(|pod| pod.uid.as_str()).collect();
        self.marker.retain(&uids);
        self.evicted.retain(|uid| uids.contains(uid.as_str()));
        self.backoff.retain(|uid, _| uids.contains(uid.as_str()));
        self.stuck.retain(|uid| uids.contains(uid.as_str()));
        self.force_deleted.retain(|uid| uids.contains(uid.as_str()));
        self.count_stuck();
    }

    fn count_stuck(&self) {
        self.metrics
            .stuck_pods
            .set(i64::try_from(self.stuck.len()).unwrap_or(i64::MAX));
    }

    /// Whether the pod is stuck Terminating on a NotReady or unreachable node
    /// ([`stuck_verdict`], against the readiness of the last node pass): reported once (an
    /// Event, the gauge), and, when `controller.stuckPods.forceDelete` is on, force-deleted
    /// within `deletionsPerMinute`. `Err(Stop)` when leadership ran out.
    async fn judge_stuck(
        &mut self,
        pod: &PodFacts,
        now: Timestamp,
        report: &mut PassReport,
    ) -> Result<(), Stop> {
        let unready = pod.node.as_ref().and_then(|node| self.unready.get(node));
        let (since, force_delete) = match stuck_verdict(pod, unready, &self.policy, now) {
            Stuck::Yes {
                since,
                force_delete,
                ..
            } => (since, force_delete),
            Stuck::No | Stuck::Waiting { .. } => {
                if self.stuck.remove(&pod.uid) {
                    self.count_stuck();
                }
                return Ok(());
            }
        };
        let id = pod.id();
        if !self.stuck.contains(&pod.uid) {
            if self.ensure_leading().is_err() {
                return Err(Stop);
            }
            self.stuck.insert(pod.uid.clone());
            self.count_stuck();
            let note = stuck_message(pod, since, force_delete);
            tracing::warn!(pod = %id, "{note}");
            self.event(
                &pod.object_ref(),
                EventType::Warning,
                REASON_STUCK,
                "Report",
                note,
            )
            .await;
            report.stuck.push(id.clone());
        }
        if !force_delete || self.force_deleted.contains(&pod.uid) {
            return Ok(());
        }
        if self.ensure_leading().is_err() {
            return Err(Stop);
        }
        if !self.deletion_bucket.take(now) {
            tracing::info!(pod = %id, "force deletion rate limit reached; deleting on a later pass");
            report.deletions_deferred.push(id);
            return Ok(());
        }
        let deleted = self.force_delete(pod, since).await;
        let deleted = self
            .settle(Write::ForceDelete(&id), deleted, report)
            .inspect_err(|_| self.deletion_bucket.refund())?;
        match deleted {
            Some(true) => {
                self.force_deleted.insert(pod.uid.clone());
                self.metrics.pods_force_deleted.inc();
                report.force_deleted.push(id);
            }
            // Gone already, or replaced by a pod of the same name: nothing was deleted.
            Some(false) => {
                self.force_deleted.insert(pod.uid.clone());
                self.deletion_bucket.refund();
            }
            None => self.deletion_bucket.refund(),
        }
        Ok(())
    }

    /// Deletes the pod with `gracePeriodSeconds: 0` and its uid as a precondition (only the
    /// pod the cache knows; in a dry run with `dryRun=All`). `Ok(false)`: it is gone already
    /// (404), or another pod took its name (the uid precondition failed, 409).
    async fn force_delete(&self, pod: &PodFacts, since: Timestamp) -> Result<bool, WriteError> {
        self.ensure_leading()?;
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let params = DeleteParams {
            dry_run: self.dry_run(),
            grace_period_seconds: Some(0),
            preconditions: (!pod.uid.is_empty()).then(|| kube::api::Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let id = pod.id();
        match api.delete(&pod.name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {
                tracing::info!(pod = %id, "not force-deleted: the pod is gone already");
                return Ok(false);
            }
            Err(error) if super::marker::replaced(&error) => {
                tracing::info!(pod = %id, uid = %pod.uid,
                    "not force-deleted: the pod was replaced by another of the same name ({error})");
                return Ok(false);
            }
            Err(error) => return Err(error.into()),
        }
        let node = pod.node.as_deref().unwrap_or("(none)");
        let done = if self.dry_run() {
            "dry run: would force-delete"
        } else {
            "force-deleted"
        };
        let note = format!(
            "{done} (gracePeriodSeconds 0, controller.stuckPods.forceDelete): Terminating on              node {node}, NotReady or unreachable, since {since}; its Job can now replace it"
        );
        tracing::warn!(pod = %id, "{note}");
        self.event(
            &pod.object_ref(),
            EventType::Warning,
            REASON_FORCE_DELETED,
            "Delete",
            note,
        )
        .await;
        Ok(true)
    }

    /// Evicts the pod, or says why it was not: a 429 answer is a PodDisruptionBudget's refusal
    /// or the API server's throttling ([`eviction_refusal`]).
    async fn evict(&self, pod: &PodFacts, cause: &Cause) -> Result<Evicted, WriteError> {
        self.ensure_leading()?;
        let (namespace, name) = (&pod.namespace, &pod.name);
        let id = pod.id();
        let note = {
            let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
            // Only the pod the cache knows: one recreated under its name since is refused (409,
            // the UID precondition; kubernetes v1.36 `pkg/registry/core/pod/storage/eviction.go`
            // checks it before deleting).
            let eviction = Eviction {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(namespace.clone()),
                    ..ObjectMeta::default()
                },
                delete_options: (!pod.uid.is_empty()).then(|| DeleteOptions {
                    preconditions: Some(Preconditions {
                        uid: Some(pod.uid.clone()),
                        ..Preconditions::default()
                    }),
                    ..DeleteOptions::default()
                }),
            };
            // In a dry run too, with dryRun=All: the API server checks the
            // PodDisruptionBudgets and deletes nothing.
            let params = PostParams {
                dry_run: self.dry_run(),
                ..PostParams::default()
            };
            match api
                .create_subresource::<Eviction, kube::core::Status>(
                    "eviction", name, &params, &eviction,
                )
                .await
            {
                // The eviction subresource answers some refusals as the result of a
                // successful create (HTTP 201): a pod with more than one PodDisruptionBudget
                // gets `Status{status: Failure, code: 500}` (kubernetes v1.36
                // `pkg/registry/core/pod/storage/eviction.go`). Nothing was evicted.
                Ok(answer) if answer.is_failure() || answer.code >= 400 => {
                    let reason = format!(
                        "the eviction was refused ({}): {}",
                        answer.code, answer.message
                    );
                    tracing::warn!(pod = %id, %reason, "eviction refused; retrying after a backoff");
                    return Ok(Evicted::Failed(reason));
                }
                Ok(_) if self.dry_run() => format!("dry run: would evict: {}", cause.message()),
                Ok(_) => format!(
                    "evicted so its Job recreates it on a healthy node: {}",
                    cause.message()
                ),
                Err(kube::Error::Api(status)) if status.code == 429 => {
                    let refusal = eviction_refusal(&status);
                    if refusal == Evicted::BudgetRefused {
                        tracing::info!(pod = %id, message = %status.message,
                            "eviction refused for now by a PodDisruptionBudget; retrying after a backoff");
                    } else {
                        tracing::info!(pod = %id, message = %status.message,
                            "eviction throttled by the API server (429 without a disruption budget cause); retrying on the next pass");
                    }
                    return Ok(refusal);
                }
                Err(error) if super::marker::replaced(&error) => {
                    tracing::info!(pod = %id, uid = %pod.uid,
                        "not evicted: the pod was replaced by another of the same name ({error})");
                    return Ok(Evicted::Replaced);
                }
                // Forbidden (a budget whose disruptionsAllowed is below zero answers 403, and
                // so does a denying admission webhook), a server error: the pod backs off.
                Err(kube::Error::Api(status)) => {
                    let reason = format!(
                        "the eviction was refused ({} {}): {}",
                        status.code, status.reason, status.message
                    );
                    tracing::warn!(pod = %id, %reason, "eviction refused; retrying after a backoff");
                    return Ok(Evicted::Failed(reason));
                }
                Err(error) => return Err(error.into()),
            }
        };
        tracing::info!(pod = %id, "{note}");
        self.event(
            &pod.object_ref(),
            EventType::Warning,
            REASON_EVICTED,
            "Evict",
            note,
        )
        .await;
        Ok(Evicted::Yes)
    }
}

/// What became of an eviction that reached the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Evicted {
    Yes,
    /// Refused for another reason (a 403, a webhook's denial, a server error, a `Failure`
    /// Status in a 201 answer): the pod backs off on its own; the reason is reported.
    Failed(String),
    /// A PodDisruptionBudget refused it (429 with a `DisruptionBudget` cause): the pod backs
    /// off on its own.
    BudgetRefused,
    /// The pod the cache knows is gone: another was created under its name (the UID
    /// precondition failed). Nothing to do for it; the new pod is judged on its own.
    Replaced,
    /// The API server throttled the request (a 429 without that cause: API Priority and
    /// Fairness, max-in-flight): tried again on the next pass.
    Throttled,
}

/// What a 429 answer to an eviction means. The eviction subresource refuses for a
/// PodDisruptionBudget with `NewTooManyRequests` and a cause of type `DisruptionBudget`
/// (`policyv1.DisruptionBudgetCause`; a cause's type is `reason` in JSON), both when the budget
/// allows no disruption and while the budget is still being processed (kubernetes
/// `pkg/registry/core/pod/storage/eviction.go`, `checkAndDecrement` and
/// `createTooManyRequestsError`). Any other 429 (API Priority and Fairness, which sends no such
/// cause) is throttling.
fn eviction_refusal(status: &kube::core::Status) -> Evicted {
    let budget = status
        .details
        .iter()
        .flat_map(|details| &details.causes)
        .any(|cause| cause.reason == "DisruptionBudget");
    if budget {
        Evicted::BudgetRefused
    } else {
        Evicted::Throttled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: serde_json::Value) -> kube::core::Status {
        serde_json::from_value(body).expect("a Status")
    }

    #[test]
    fn a_429_is_a_budget_refusal_only_when_its_status_says_so() {
        let budget = answer(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
            "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget train needs 4 healthy pods and has 4 currently"}]},
        }));
        assert_eq!(eviction_refusal(&budget), Evicted::BudgetRefused);
        let processing = answer(serde_json::json!({
            "code": 429, "reason": "TooManyRequests",
            "details": {"retryAfterSeconds": 10, "causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget train is still being processed by the server."}]},
        }));
        assert_eq!(eviction_refusal(&processing), Evicted::BudgetRefused);
        // API Priority and Fairness: no such cause.
        let throttled = answer(serde_json::json!({
            "code": 429, "reason": "TooManyRequests",
            "message": "Too many requests, please try again later.",
            "details": {"retryAfterSeconds": 1},
        }));
        assert_eq!(eviction_refusal(&throttled), Evicted::Throttled);
        // A body that is not a Status (kube reconstructs one): throttling too.
        let plain = kube::core::Status::failure("Too many requests", "Failed to parse error data")
            .with_code(429);
        assert_eq!(eviction_refusal(&plain), Evicted::Throttled);
    }
}
