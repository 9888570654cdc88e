//! Marking pods: the `gpu-guard.io/DeviceFailure=True` condition, added by one [`Marker`] that
//! both the passes and the event path use, so a pod is marked once per term of leadership.
//!
//! The event path ([`mark_from_events`]) marks a pod from its own watch event, as soon as the
//! kubelet reports one of its devices unhealthy: before, and independent of, any node work (a
//! pass may be waiting on node patches, each up to [`super::super::WRITE_TIMEOUT`]), with its
//! own short timeout ([`MARK_TIMEOUT`]). The mark is still best effort: the kubelet often reports
//! the device health change in the same status write that marks the pod Failed, and the Job
//! controller, which batches pod events for about a second, may count the failure before the
//! condition lands. The device-error exit codes of the podFailurePolicy are the reliable signal;
//! the condition is the second one (docs/controller.md, "When the mark arrives").
//!
//! Several pods are often hit at once: NVIDIA's device plugin marks every device of a node
//! unhealthy together on some errors (NVIDIA/k8s-device-plugin v0.20.0 `internal/rm/health.go`:
//! a failed wait for NVML events, or an Xid whose device UUID cannot be read). So the event path marks up to [`MARK_CONCURRENCY`] pods at a
//! time, and a mark never waits for its Event: the `DeviceFailureMarked` Event goes to a
//! bounded queue ([`EVENT_QUEUE_CAPACITY`]) that a task of its own publishes; an Event that
//! finds the queue full is dropped and counted (`gpu_guard_controller_events_dropped_total`),
//! never waited for.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Api, Client};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;

use super::WriteError;
use super::caches::OptedIn;
use super::events::{REASON_EXHAUSTED_MARKED, REASON_MARKED, REASON_PEER_MARKED, publish};
use super::memory::{FailureMemory, Standing};
use super::pods::PodCache;
use crate::lease::Leadership;
use crate::metrics::ControllerMetrics;
use gpu_guard_core::health::pod::{self, Cause, PodFacts};
use gpu_guard_core::memory::WorkloadRef;
use gpu_guard_core::policy::Policy;
use gpu_guard_core::wellknown::{
    DEVICE_FAILURE_CONDITION, DEVICE_RETRIES_EXHAUSTED_CONDITION, PEER_DEVICE_FAILURE_CONDITION,
};

/// The read and write timeout of a mark: short, so a slow API server does not hold up the
/// marks behind it (the next pass retries a mark that timed out).
pub const MARK_TIMEOUT: Duration = Duration::from_secs(2);

/// How many pods the event path marks at once: the GPUs of a common node (8), so a node whose
/// every device failed together is marked in the time of one patch, while a burst across many
/// nodes cannot open hundreds of requests to the API server at once.
pub const MARK_CONCURRENCY: usize = 8;

/// How many `DeviceFailureMarked` Events may wait to be published; past that an Event is
/// dropped and counted, and the mark it reports is made all the same.
pub const EVENT_QUEUE_CAPACITY: usize = 256;

/// Adds the condition; remembers, for the current term of leadership, which pods it marked.
pub struct Marker {
    client: Client,
    dry_run: bool,
    metrics: Arc<ControllerMetrics>,
    /// `None` (never set): act without an election. Shared with the Event task.
    leadership: Arc<OnceLock<Leadership>>,
    /// The `DeviceFailureMarked` Events, published off the mark path.
    events: EventQueue,
    /// The pods (by uid) marked, or being marked, this term: the cache may lag behind our own
    /// change.
    claimed: Mutex<HashSet<String>>,
    /// The pods (by uid) marked, or being marked, as peers this term.
    peers_claimed: Mutex<HashSet<String>>,
    /// The pods (by uid) given `gpu-guard.io/DeviceRetriesExhausted`, or being given it,
    /// this term.
    exhausted_claimed: Mutex<HashSet<String>>,
    /// Records device failures; shared with the passes.
    memory: Arc<FailureMemory>,
}

impl Marker {
    /// A marker writing through a client made from `config` with [`MARK_TIMEOUT`].
    /// Device failures are recorded through a client with the usual write timeouts (a
    /// record reads before it writes, and is not on the mark's clock), by `policy`'s budget.
    pub fn new(
        config: kube::Config,
        recorder: Recorder,
        policy: &Policy,
        metrics: Arc<ControllerMetrics>,
    ) -> Result<Self, kube::Error> {
        let dry_run = policy.controller.dry_run;
        let mut config = crate::write_config(config);
        let memory_client = Client::try_from(config.clone())?;
        config.read_timeout = Some(MARK_TIMEOUT);
        config.write_timeout = Some(MARK_TIMEOUT);
        let leadership = Arc::new(OnceLock::new());
        let memory = Arc::new(FailureMemory::new(
            memory_client,
            recorder.clone(),
            policy,
            metrics.clone(),
            leadership.clone(),
        ));
        Ok(Self {
            memory,
            exhausted_claimed: Mutex::new(HashSet::new()),
            client: Client::try_from(config)?,
            dry_run,
            events: EventQueue::new(EVENT_QUEUE_CAPACITY, recorder, leadership.clone()),
            metrics,
            leadership,
            claimed: Mutex::new(HashSet::new()),
            peers_claimed: Mutex::new(HashSet::new()),
        })
    }

    /// Marks only while `leadership` lasts (set once).
    pub fn set_leadership(&self, leadership: Leadership) {
        let _ = self.leadership.set(leadership);
    }

    /// Whether this replica may write now.
    pub fn leading(&self) -> bool {
        leading(&self.leadership)
    }

    /// Forgets which pods were marked (a new term: another replica may have acted).
    pub fn reset(&self) {
        self.claimed().clear();
        lock(&self.peers_claimed).clear();
        lock(&self.exhausted_claimed).clear();
    }

    /// Forgets the pods (by uid) not in `present`.
    pub fn retain(&self, present: &HashSet<&str>) {
        self.claimed().retain(|uid| present.contains(uid.as_str()));
        lock(&self.peers_claimed).retain(|uid| present.contains(uid.as_str()));
        lock(&self.exhausted_claimed).retain(|uid| present.contains(uid.as_str()));
    }

    /// The device-failure memory.
    pub fn memory(&self) -> &Arc<FailureMemory> {
        &self.memory
    }

    /// Adds `gpu-guard.io/DeviceRetriesExhausted=True` to `pod`, one of `workload`'s, and
    /// queues its Event, as [`Marker::mark`] does. `Ok(false)`: given it already this term.
    pub async fn mark_exhausted(
        &self,
        pod: &PodFacts,
        workload: &WorkloadRef,
        standing: Standing,
        now: Timestamp,
    ) -> Result<bool, WriteError> {
        let message = pod::retries_exhausted_message(workload, standing.total, standing.budget);
        self.write_condition(
            pod,
            ConditionWrite {
                claims: &self.exhausted_claimed,
                patch: pod::retries_exhausted_patch(&pod.uid, &message, now),
                condition: DEVICE_RETRIES_EXHAUSTED_CONDITION,
                event_reason: REASON_EXHAUSTED_MARKED,
                counter: &self.metrics.pods_marked_exhausted,
                note: message,
                why: pod::REASON_RETRY_BUDGET_EXHAUSTED,
            },
        )
        .await
    }

    /// Ends the free retries of `workload`, past its budget: every cached pod of it still
    /// running or pending that lacks the condition gets it, up to [`MARK_CONCURRENCY`] at a
    /// time. Returns each pod's `namespace/name` with what became of its mark.
    pub async fn end_free_retries(
        self: &Arc<Self>,
        cache: &PodCache,
        workload: &WorkloadRef,
        standing: Standing,
        now: Timestamp,
    ) -> Vec<(String, Result<bool, WriteError>)> {
        mark_each(cache.of_workload(workload), |pod| {
            let (marker, workload) = (self.clone(), workload.clone());
            async move { marker.mark_exhausted(&pod, &workload, standing, now).await }
        })
        .await
    }

    /// Whether this replica marked the pod (by uid) this term, or is marking it: in a dry run
    /// the cache never shows the mark.
    pub fn has_marked(&self, uid: &str) -> bool {
        self.claimed().contains(uid)
    }

    /// Adds the condition to the pod's status (a strategic merge patch: the API server merges
    /// conditions by type) and queues an Event reporting it (published later, by a task of its
    /// own: the mark does not wait for it). `Ok(false)`: marked already this term (or being
    /// marked by the other path).
    pub async fn mark(
        &self,
        pod: &PodFacts,
        cause: &Cause,
        now: Timestamp,
    ) -> Result<bool, WriteError> {
        self.write_condition(
            pod,
            ConditionWrite {
                claims: &self.claimed,
                patch: pod::condition_patch(&pod.uid, cause, now),
                condition: DEVICE_FAILURE_CONDITION,
                event_reason: REASON_MARKED,
                counter: &self.metrics.pods_marked,
                note: cause.message(),
                why: cause.reason(),
            },
        )
        .await
    }

    /// Adds `gpu-guard.io/PeerDeviceFailure=True` to `peer`, a running pod of the gang of
    /// `failed`, and queues its Event, as [`Marker::mark`] does. `Ok(false)`: marked as a peer
    /// already this term, or replaced by another pod of its name.
    pub async fn mark_peer(
        &self,
        peer: &PodFacts,
        failed: &PodFacts,
        now: Timestamp,
    ) -> Result<bool, WriteError> {
        self.write_condition(
            peer,
            ConditionWrite {
                claims: &self.peers_claimed,
                patch: pod::peer_condition_patch(&peer.uid, failed, now),
                condition: PEER_DEVICE_FAILURE_CONDITION,
                event_reason: REASON_PEER_MARKED,
                counter: &self.metrics.peers_marked,
                note: pod::peer_message(failed),
                why: pod::REASON_PEER_DEVICE_FAILURE,
            },
        )
        .await
    }

    /// One condition on one pod, once per term: claimed first (the cache lags behind our own
    /// writes), released when the write fails; counted, logged and told in an Event when made.
    async fn write_condition(
        &self,
        pod: &PodFacts,
        write: ConditionWrite<'_>,
    ) -> Result<bool, WriteError> {
        if !self.leading() {
            return Err(WriteError::NotLeading);
        }
        if !lock(write.claims).insert(pod.uid.clone()) {
            return Ok(false);
        }
        let written = self.send(pod, write.patch).await;
        if written.is_err() {
            lock(write.claims).remove(&pod.uid);
        }
        match written {
            Err(WriteError::Api(error)) if replaced(&error) => {
                // The cache lags: the pod it knows is gone, and another took its name. The
                // new pod is judged on its own, from its own watch event.
                tracing::info!(pod = %pod.id(), uid = %pod.uid, condition = write.condition,
                    "not marked: the pod was replaced by another of the same name ({error})");
                return Ok(false);
            }
            written => written?,
        }
        write.counter.inc();
        let (id, note, condition) = (pod.id(), write.note, write.condition);
        let prefix = if self.dry_run {
            tracing::info!(pod = %id, reason = write.why,
                "dry run: would add the condition {condition}=True: {note}");
            "dry run: would mark: "
        } else {
            tracing::info!(pod = %id, reason = write.why,
                "added the condition {condition}=True: {note}");
            ""
        };
        self.events.send(
            PendingEvent {
                regarding: pod.object_ref(),
                reason: write.event_reason,
                note: format!("{prefix}{note}"),
            },
            &self.metrics,
        );
        Ok(true)
    }

    /// Marks `peers` as peers of `failed`, up to [`MARK_CONCURRENCY`] at a time (a gang of 64
    /// nodes has 63 peers, and they fail soon after `failed`). Returns each peer's
    /// `namespace/name` with what became of its mark, in the order of `peers`.
    pub async fn mark_peers(
        self: &Arc<Self>,
        failed: &PodFacts,
        peers: Vec<Arc<PodFacts>>,
        now: Timestamp,
    ) -> Vec<(String, Result<bool, WriteError>)> {
        let failed = Arc::new(failed.clone());
        mark_each(peers, |peer| {
            let (marker, failed) = (self.clone(), failed.clone());
            async move { marker.mark_peer(&peer, &failed, now).await }
        })
        .await
    }

    /// Sends a strategic merge patch of the pod's status.
    async fn send(&self, pod: &PodFacts, patch: serde_json::Value) -> Result<(), WriteError> {
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        // In a dry run too, with dryRun=All: checked by the API server, not stored.
        let params = if self.dry_run {
            PatchParams::default().dry_run()
        } else {
            PatchParams::default()
        };
        api.patch_status(&pod.name, &params, &Patch::Strategic(patch))
            .await?;
        Ok(())
    }

    fn claimed(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        lock(&self.claimed)
    }
}

/// Runs `mark` on each of `pods`, up to [`MARK_CONCURRENCY`] at a time. Returns each pod's
/// `namespace/name` with what became of its mark, in the order of `pods`.
async fn mark_each<F, Fut>(
    pods: Vec<Arc<PodFacts>>,
    mark: F,
) -> Vec<(String, Result<bool, WriteError>)>
where
    F: Fn(Arc<PodFacts>) -> Fut,
    Fut: std::future::Future<Output = Result<bool, WriteError>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(MARK_CONCURRENCY));
    let mut marking = JoinSet::new();
    for (at, pod) in pods.into_iter().enumerate() {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let id = pod.id();
        let marked = mark(pod);
        marking.spawn(async move {
            let marked = marked.await;
            drop(slot);
            (at, id, marked)
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = marking.join_next().await {
        match joined {
            Ok(result) => results.push(result),
            Err(error) => tracing::warn!(%error, "a mark did not finish"),
        }
    }
    results.sort_by_key(|(at, _, _)| *at);
    results
        .into_iter()
        .map(|(_, id, marked)| (id, marked))
        .collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One condition write of [`Marker::write_condition`].
struct ConditionWrite<'a> {
    /// The pods (by uid) written this term.
    claims: &'a Mutex<HashSet<String>>,
    patch: serde_json::Value,
    /// Its type, for the log.
    condition: &'static str,
    event_reason: &'static str,
    counter: &'a prometheus_client::metrics::counter::Counter,
    /// The Event's note.
    note: String,
    /// The condition's reason, for the log.
    why: &'static str,
}

/// Whether the API server refused a write for a pod's uid: the pod was deleted and another
/// created under its name since the cache saw it. A status patch whose `metadata.uid` differs
/// is invalid (422, the field `metadata.uid` is immutable: k8s.io/apimachinery
/// `ValidateObjectMetaUpdate`); an eviction whose `deleteOptions.preconditions.uid` differs is a
/// conflict (409: "the UID in the precondition ... does not match the UID in record", k8s.io/apiserver
/// `pkg/registry/rest/delete.go` `BeforeDelete`).
pub(super) fn replaced(error: &kube::Error) -> bool {
    let kube::Error::Api(status) = error else {
        return false;
    };
    let names_uid = status.message.contains("metadata.uid")
        || status
            .details
            .iter()
            .flat_map(|details| &details.causes)
            .any(|cause| cause.field == "metadata.uid");
    match status.code {
        422 => names_uid,
        409 => {
            status.message.contains("UID in precondition")
                || status.message.contains("UID in record")
        }
        _ => false,
    }
}

/// Whether a replica under `leadership` (unset: no election) may write now.
fn leading(leadership: &OnceLock<Leadership>) -> bool {
    leadership.get().is_none_or(Leadership::leads)
}

/// Records `failed`'s device failure from its watch event; a workload found past its budget
/// has its free retries ended. A failed write is logged and left to the next pass.
async fn record_and_end_free_retries(marker: &Arc<Marker>, pods: &PodCache, failed: &PodFacts) {
    let now = Timestamp::now();
    let recorded = match marker.memory.record(failed, now).await {
        Ok(recorded) => recorded,
        Err(WriteError::NotLeading) => return,
        Err(WriteError::Api(error)) => {
            marker.metrics.reconcile_errors.inc();
            tracing::warn!(pod = %failed.id(), %error,
                "cannot record the device failure; retrying on the next pass");
            return;
        }
    };
    let (Some(standing), Some(workload)) = (recorded.standing(), failed.workload()) else {
        return;
    };
    if !standing.exhausted {
        return;
    }
    for (pod, marked) in marker
        .end_free_retries(pods, &workload, standing, now)
        .await
    {
        if let Err(WriteError::Api(error)) = marked {
            marker.metrics.reconcile_errors.inc();
            tracing::warn!(pod = %pod, %error,
                "cannot end the pod's free retries; retrying on the next pass");
        }
    }
}

/// An Event waiting to be published.
#[derive(Debug)]
struct PendingEvent {
    regarding: ObjectReference,
    reason: &'static str,
    note: String,
}

/// The `DeviceFailureMarked` Events on their way out: a bounded queue, and the task that
/// publishes them one after the other, started with the first Event (it needs the runtime the
/// marks run on). The task ends when the queue's [`Marker`] is dropped, once it has published
/// what was queued.
struct EventQueue {
    sender: mpsc::Sender<PendingEvent>,
    /// What the task takes when it starts.
    idle: Mutex<Option<(mpsc::Receiver<PendingEvent>, Recorder)>>,
    leadership: Arc<OnceLock<Leadership>>,
}

impl EventQueue {
    fn new(capacity: usize, recorder: Recorder, leadership: Arc<OnceLock<Leadership>>) -> Self {
        let (sender, receiver) = mpsc::channel(capacity);
        Self {
            sender,
            idle: Mutex::new(Some((receiver, recorder))),
            leadership,
        }
    }

    /// Queues `event` without waiting; a full queue drops it and counts it.
    fn send(&self, event: PendingEvent, metrics: &ControllerMetrics) {
        self.start();
        if let Err(refused) = self.sender.try_send(event) {
            metrics.events_dropped.inc();
            let regarding = match &refused {
                mpsc::error::TrySendError::Full(event)
                | mpsc::error::TrySendError::Closed(event) => event.regarding.name.clone(),
            };
            tracing::warn!(
                pod = regarding.as_deref().unwrap_or_default(),
                "the Event queue is full: the pod's Event is dropped (the pod is marked)"
            );
        }
    }

    /// Starts the publishing task, once.
    fn start(&self) {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some((mut receiver, recorder)) = idle else {
            return;
        };
        let leadership = self.leadership.clone();
        tokio::spawn(async move {
            while let Some(event) = receiver.recv().await {
                // Not once leadership has run out: the new leader reports from now on.
                if !leading(&leadership) {
                    continue;
                }
                publish(
                    &recorder,
                    &event.regarding,
                    EventType::Warning,
                    event.reason,
                    "Mark",
                    event.note,
                )
                .await;
            }
        });
    }
}

/// The event path: records the device failure of each pod the pod cache sends as failed of one
/// (from the facts sent: the pod may be deleted already, [`super::memory`]), ending the free
/// retries of a workload found past its budget; and marks each pod the pod cache sends (a
/// device reported unhealthy, not marked yet) as it comes, once the opted-in namespaces are known, up to [`MARK_CONCURRENCY`] at a
/// time, then, for a gang pod, its running peers ([`PodFacts::peers_due`]; a gang pod marked
/// before whose failure became real since is sent for its peers alone). A pod that is gone, no
/// longer needs the mark, or is not in an opted-in namespace is skipped; a failed mark is
/// logged and left to the next pass. Runs until the sender is
/// dropped, then waits for the marks under way.
pub async fn mark_from_events(
    marker: Arc<Marker>,
    mut urgent: mpsc::UnboundedReceiver<Arc<PodFacts>>,
    pods: PodCache,
    opted_in: OptedIn,
    mut namespaces_synced: watch::Receiver<bool>,
    policy: Policy,
) {
    if namespaces_synced.wait_for(|synced| *synced).await.is_err() {
        return;
    }
    let slots = Arc::new(Semaphore::new(MARK_CONCURRENCY));
    let mut marking = JoinSet::new();
    while let Some(sent) = urgent.recv().await {
        while marking.try_join_next().is_some() {}
        if !marker.leading() || !opted_in.contains(&sent.namespace) {
            continue;
        }
        if marker.memory.wants(&sent) {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break;
            };
            // From the facts sent, not the cache's: a JobSet's gang restart deletes the
            // failed pod at once.
            let (marker, pods, failed) = (marker.clone(), pods.clone(), sent.clone());
            marking.spawn(async move {
                record_and_end_free_retries(&marker, &pods, &failed).await;
                drop(slot);
            });
        }
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        // The latest facts: the pod may have changed or gone since it was sent (or while this
        // waited for a slot).
        let Some(current) = pods.get(&sent.namespace, &sent.name) else {
            continue;
        };
        let cause = current
            .unhealthy
            .clone()
            .filter(|_| current.needs_mark_now(&policy));
        let peers_due = policy.controller.pods.mark_pods && current.peers_due(cause.is_some());
        if cause.is_none() && !peers_due {
            continue;
        }
        let (marker, pods) = (marker.clone(), pods.clone());
        marking.spawn(async move {
            let now = Timestamp::now();
            // Leadership is checked again by the mark itself, right before its patch.
            let marked_now = match &cause {
                None => false,
                Some(cause) => match marker.mark(&current, cause, now).await {
                    Ok(marked) => marked,
                    Err(WriteError::NotLeading) => false,
                    Err(WriteError::Api(error)) => {
                        marker.metrics.reconcile_errors.inc();
                        tracing::warn!(pod = %current.id(), %error,
                            "cannot mark the pod; retrying on the next pass");
                        false
                    }
                },
            };
            if peers_due && (marked_now || current.marked) {
                // Marked just now: every running peer ran beside it. Marked earlier (its
                // failure became real since): the peers that were there at the mark.
                let since = (!marked_now).then_some(current.marked_at).flatten();
                if marked_now || since.is_some() {
                    let peers = pods.peers(&current, since);
                    for (peer, marked) in marker.mark_peers(&current, peers, now).await {
                        if let Err(WriteError::Api(error)) = marked {
                            marker.metrics.reconcile_errors.inc();
                            tracing::warn!(pod = %peer, %error,
                                "cannot mark the peer; retrying on the next pass");
                        }
                    }
                }
            }
            drop(slot);
        });
    }
    while marking.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str) -> PendingEvent {
        PendingEvent {
            regarding: ObjectReference {
                name: Some(name.to_owned()),
                ..ObjectReference::default()
            },
            reason: REASON_MARKED,
            note: "marked".to_owned(),
        }
    }

    /// A full queue drops the Event and counts it, without waiting: the mark that queued it is
    /// not held up by a slow Event endpoint.
    #[tokio::test]
    async fn a_full_event_queue_drops_and_counts_instead_of_waiting() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Nothing listens there: the task, once it runs, fails to publish and goes on.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = Client::try_from(config).expect("a client");
        let recorder = Recorder::new(
            client,
            kube::runtime::events::Reporter {
                controller: "test".to_owned(),
                instance: None,
            },
        );
        let metrics = ControllerMetrics::default();
        let queue = EventQueue::new(2, recorder, Arc::new(OnceLock::new()));
        // The publishing task has not run yet (this test's runtime has one thread and has not
        // yielded): the third Event finds the queue full.
        for name in ["a", "b", "c"] {
            queue.send(event(name), &metrics);
        }
        assert_eq!(metrics.events_dropped.get(), 1);
        assert!(
            queue.idle.lock().expect("lock").is_none(),
            "the task started"
        );
    }
}
