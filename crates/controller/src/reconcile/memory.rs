//! The device-failure memory, written: each device failure of a pod (what
//! [`gpu_guard_core::health::pod::device_failure`] calls one) is recorded in its workload's
//! annotation ([`MEMORY_ANNOTATION`], with the label [`MEMORY_LABEL`]), and a workload past its
//! budget (`controller.deviceRetries`) has its free retries ended: its running and new pods get
//! `gpu-guard.io/DeviceRetriesExhausted=True` (through the [`super::marker::Marker`]).
//!
//! A failure is recorded from the pod's own watch event (the event path,
//! [`super::marker::mark_from_events`]): a JobSet's gang restart deletes the failed pod with
//! its child Job moments later, and a pass might never see it. The passes record what the
//! event path missed (a failed write, a controller that restarted: it sees a plain Job's
//! failed pods again, and the memory itself says which it holds already).
//!
//! The write is a read-modify-write of the workload's metadata: a JSON merge patch that carries
//! the `metadata.resourceVersion` it read, so a concurrent change (the Job controller's status
//! writes, the other path recording another pod) is refused with 409 Conflict, and the memory
//! is read again ([`MAX_ATTEMPTS`] times at most). A workload that is gone (404; so is a JobSet
//! where the JobSet API is not served) has nothing to record into.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Api, Client};
use serde_json::json;

use super::WriteError;
use super::events::{
    REASON_MEMORY_UNREADABLE, REASON_RECORDED, REASON_RETRIES_EXHAUSTED, publish_related,
};
use crate::lease::Leadership;
use crate::metrics::{ControllerMetrics, kind_label};
use gpu_guard_core::health::pod::{PodFacts, retries_exhausted_message};
use gpu_guard_core::memory::{
    DeviceFailure, MEMORY_ANNOTATION, MEMORY_LABEL, Memory, WorkloadKind, WorkloadRef,
    workload_pods,
};
use gpu_guard_core::policy::{DeviceRetries, Policy};

/// How many times a record is read and written again after a 409 Conflict: a Job's status
/// changes with every pod, so a conflict or two is ordinary; more means a busy object, and the
/// next pass tries again.
pub const MAX_ATTEMPTS: usize = 5;

/// How long a workload's standing is kept once none of its pods is cached: a JobSet between
/// its gang restart's deletion and its new pods has none for a while.
const STANDING_KEPT_FOR: SignedDuration = SignedDuration::from_hours(1);

/// What the memory of a workload says, as last read or written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// Device failures on record.
    pub total: u32,
    /// Its budget of free retries.
    pub budget: u32,
    /// More on record than the budget (and budgets are on).
    pub exhausted: bool,
}

/// What became of a pod's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded now; the workload's standing after it.
    New(Standing),
    /// On record already; the workload's standing.
    Known(Standing),
    /// Nothing to record into: the workload is gone, the JobSet API is not served, or its
    /// annotation is not gpu-guard's.
    Nowhere,
    /// This process recorded it already (or is recording it).
    Done,
}

impl Recorded {
    /// The workload's standing, when it was read.
    pub fn standing(self) -> Option<Standing> {
        match self {
            Self::New(standing) | Self::Known(standing) => Some(standing),
            Self::Nowhere | Self::Done => None,
        }
    }
}

/// Records device failures in workloads' memories, and knows the workloads' standings.
pub struct FailureMemory {
    client: Client,
    recorder: Recorder,
    retries: DeviceRetries,
    dry_run: bool,
    metrics: Arc<ControllerMetrics>,
    leadership: Arc<OnceLock<Leadership>>,
    /// Pods (by uid) whose failure this process recorded or found on record, or is recording:
    /// a pod is read and written for once, not on every pass.
    recorded: Mutex<HashSet<String>>,
    /// The standing of each workload read since it was last forgotten, and when.
    standings: Mutex<HashMap<WorkloadRef, (Standing, Timestamp)>>,
    /// Workloads whose exhaustion has been reported (Event, metric): once each.
    reported: Mutex<HashSet<WorkloadRef>>,
    /// Every device failure seen, by node, for the suspect-node rule.
    seen: SeenFailures,
}

/// The most device failures kept per node for the suspect-node rule: far more than any
/// `suspect.pods` worth setting; past it the oldest go.
const SEEN_PER_NODE: usize = 64;

/// The device failures this process has seen, by node: from the pods it caches, from the pods
/// deleted as they failed (a JobSet's gang restart; its event path records them), and from the
/// workloads' memories it reads. Kept after the pods are gone, until they are too old to count
/// ([`SeenFailures::forget_before`]).
#[derive(Default)]
pub struct SeenFailures {
    by_node: Mutex<HashMap<String, Vec<DeviceFailure>>>,
    /// By node, when a person removed its suspect taint: failures until then no longer count.
    cleared: Mutex<HashMap<String, Timestamp>>,
}

impl SeenFailures {
    /// Keeps `failure` (once per node and pod; a later time for the same pod replaces it).
    pub fn note(&self, failure: &DeviceFailure) {
        let Some(at) = failure.at else {
            return;
        };
        let cleared = lock(&self.cleared).get(&failure.node).copied();
        if failure.node.is_empty() || cleared.is_some_and(|cleared| at <= cleared) {
            return;
        }
        let mut seen = lock(&self.by_node);
        let on_node = seen.entry(failure.node.clone()).or_default();
        match on_node.iter_mut().find(|known| known.pod == failure.pod) {
            Some(known) if known.at < failure.at => *known = failure.clone(),
            Some(_) => {}
            None => {
                on_node.push(failure.clone());
                if on_node.len() > SEEN_PER_NODE {
                    on_node.sort_by_key(|known| known.at);
                    on_node.remove(0);
                }
            }
        }
    }

    /// The failures seen on `node`.
    pub fn on_node(&self, node: &str) -> Vec<DeviceFailure> {
        lock(&self.by_node).get(node).cloned().unwrap_or_default()
    }

    /// A person removed the node's suspect taint at `now`: the failures seen on it until then
    /// are forgotten, and are not counted again when seen again (the pods still cached).
    pub fn clear_node(&self, node: &str, now: Timestamp) {
        lock(&self.by_node).remove(node);
        lock(&self.cleared).insert(node.to_owned(), now);
    }

    /// Forgets the failures before `cutoff` (too old to count any more), and the removals by
    /// hand before it (what they cleared is too old anyway).
    pub fn forget_before(&self, cutoff: Timestamp) {
        let mut seen = lock(&self.by_node);
        for on_node in seen.values_mut() {
            on_node.retain(|failure| failure.at.is_some_and(|at| at >= cutoff));
        }
        seen.retain(|_, on_node| !on_node.is_empty());
        lock(&self.cleared).retain(|_, cleared| *cleared >= cutoff);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The API of a workload kind (JobSet: `jobset.x-k8s.io/v1alpha2`, the version the webhook
/// mutates).
fn api_resource(kind: WorkloadKind) -> ApiResource {
    match kind {
        WorkloadKind::Job => ApiResource::erase::<Job>(&()),
        WorkloadKind::JobSet => ApiResource {
            group: gpu_guard_core::jobset::GROUP.to_owned(),
            version: "v1alpha2".to_owned(),
            api_version: gpu_guard_core::jobset::API_VERSION.to_owned(),
            kind: "JobSet".to_owned(),
            plural: "jobsets".to_owned(),
        },
    }
}

impl FailureMemory {
    /// Writes through `client`, by `policy`'s budget and dry run, while `leadership` (unset: no
    /// election) lasts.
    pub fn new(
        client: Client,
        recorder: Recorder,
        policy: &Policy,
        metrics: Arc<ControllerMetrics>,
        leadership: Arc<OnceLock<Leadership>>,
    ) -> Self {
        Self {
            client,
            recorder,
            retries: policy.controller.device_retries.clone(),
            dry_run: policy.controller.dry_run,
            metrics,
            leadership,
            recorded: Mutex::default(),
            standings: Mutex::default(),
            reported: Mutex::default(),
            seen: SeenFailures::default(),
        }
    }

    fn leading(&self) -> bool {
        self.leadership.get().is_none_or(Leadership::leads)
    }

    /// The device failures seen, by node.
    pub fn seen(&self) -> &SeenFailures {
        &self.seen
    }

    /// Whether the pod has a device failure this process has not recorded yet.
    pub fn wants(&self, pod: &PodFacts) -> bool {
        pod.device_failure.is_some()
            && pod.workload.is_some()
            && !lock(&self.recorded).contains(&pod.uid)
    }

    /// The workload's standing, as last read or written.
    pub fn standing(&self, workload: &WorkloadRef) -> Option<Standing> {
        lock(&self.standings)
            .get(workload)
            .map(|(standing, _)| *standing)
    }

    /// Forgets the pods (by uid) not in `present`, and the standings of workloads none of
    /// whose pods is cached, last read over [`STANDING_KEPT_FOR`] ago.
    pub fn retain(&self, present: &[Arc<PodFacts>], now: Timestamp) {
        let uids: HashSet<&str> = present.iter().map(|pod| pod.uid.as_str()).collect();
        lock(&self.recorded).retain(|uid| uids.contains(uid.as_str()));
        if lock(&self.standings).is_empty() {
            // The common case: nothing to forget, and no set of every pod's workload to build.
            return;
        }
        let workloads: HashSet<WorkloadRef> =
            present.iter().filter_map(|pod| pod.workload()).collect();
        lock(&self.standings).retain(|workload, (_, read)| {
            workloads.contains(workload) || now.duration_since(*read) < STANDING_KEPT_FOR
        });
        let standings = lock(&self.standings);
        lock(&self.reported).retain(|workload| standings.contains_key(workload));
    }

    /// Records the pod's device failure in its workload's memory, once per process. The pod
    /// may be gone from the cache already: its facts carry the failure.
    pub async fn record(&self, pod: &PodFacts, now: Timestamp) -> Result<Recorded, WriteError> {
        if let Some(failure) = pod.device_failure.as_deref() {
            self.seen.note(failure);
        }
        let (Some(failure), Some(workload)) = (pod.device_failure.as_deref(), pod.workload())
        else {
            return Ok(Recorded::Nowhere);
        };
        if !self.leading() {
            return Err(WriteError::NotLeading);
        }
        if !lock(&self.recorded).insert(pod.uid.clone()) {
            return Ok(Recorded::Done);
        }
        let recorded = self.record_into(pod, &workload, failure).await;
        if recorded.is_err() {
            lock(&self.recorded).remove(&pod.uid);
        }
        let recorded = recorded?;
        if let Some(standing) = recorded.standing() {
            self.know(&workload, standing, now).await;
        }
        Ok(recorded)
    }

    /// The read-modify-write of the workload's memory.
    async fn record_into(
        &self,
        pod: &PodFacts,
        workload: &WorkloadRef,
        failure: &DeviceFailure,
    ) -> Result<Recorded, WriteError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &workload.namespace,
            &api_resource(workload.kind),
        );
        let mut last_conflict = None;
        for _ in 0..MAX_ATTEMPTS {
            let Some(object) = api.get_opt(&workload.name).await? else {
                tracing::debug!(%workload, pod = %failure.pod,
                    "not recorded: the workload is gone (or its API is not served)");
                return Ok(Recorded::Nowhere);
            };
            let reference = object_ref(workload, &object);
            let annotation = object
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(MEMORY_ANNOTATION));
            let mut memory = match Memory::of_annotation(annotation.map(String::as_str)) {
                Ok(memory) => memory,
                Err(error) => {
                    // Someone else's annotation: never overwritten.
                    tracing::warn!(%workload, %error, "device failure not recorded");
                    self.event(
                        &reference,
                        None,
                        EventType::Warning,
                        REASON_MEMORY_UNREADABLE,
                        error.to_string(),
                    )
                    .await;
                    return Ok(Recorded::Nowhere);
                }
            };
            // What the workload failed of before (on nodes whose pods are gone) counts too.
            for known in &memory.failures {
                self.seen.note(known);
            }
            let pods = workload_pods(workload.kind, &object.data);
            let new = memory.record(failure.clone());
            let standing = Standing {
                total: memory.total,
                budget: self.retries.budget(pods),
                exhausted: self.retries.exhausted(memory.total, pods),
            };
            if !new {
                return Ok(Recorded::Known(standing));
            }
            if !self.leading() {
                return Err(WriteError::NotLeading);
            }
            // The resourceVersion makes the merge patch conditional: 409 if the object changed
            // since it was read. The API server applies a patch to the stored object and then
            // stores the result as an update, whose resourceVersion (the one the patch set) is
            // the precondition (k8s.io/apiserver `pkg/endpoints/handlers/patch.go`, through
            // `GuaranteedUpdate`; kubernetes/kubernetes#63104, #63146).
            let patch = json!({"metadata": {
                "resourceVersion": object.metadata.resource_version,
                "annotations": {MEMORY_ANNOTATION: memory.to_annotation()},
                "labels": {MEMORY_LABEL: "true"},
            }});
            let params = if self.dry_run {
                PatchParams::default().dry_run()
            } else {
                PatchParams::default()
            };
            match api
                .patch(&workload.name, &params, &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.metrics
                        .failures_recorded
                        .get_or_create(&kind_label(workload.kind))
                        .inc();
                    let prefix = if self.dry_run {
                        "dry run: would record: "
                    } else {
                        ""
                    };
                    let note = format!(
                        "{prefix}pod {} failed of a device on node {}: {}; {} device failures \
                         on record, budget {}",
                        failure.pod, failure.node, failure.cause, standing.total, standing.budget
                    );
                    tracing::info!(%workload, "{note}");
                    let related = Some(pod.object_ref());
                    self.event(
                        &reference,
                        related,
                        EventType::Warning,
                        REASON_RECORDED,
                        note,
                    )
                    .await;
                    return Ok(Recorded::New(standing));
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    tracing::debug!(%workload, "the workload changed meanwhile: reading it again");
                    last_conflict = Some(kube::Error::Api(status));
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    return Ok(Recorded::Nowhere);
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(WriteError::Api(last_conflict.unwrap_or_else(|| {
            kube::Error::Service("no attempt made".into())
        })))
    }

    /// Remembers the workload's standing; the first time it is found exhausted, says so (an
    /// Event on the workload, a metric).
    async fn know(&self, workload: &WorkloadRef, standing: Standing, now: Timestamp) {
        lock(&self.standings).insert(workload.clone(), (standing, now));
        if !standing.exhausted || !lock(&self.reported).insert(workload.clone()) {
            return;
        }
        self.metrics
            .retries_exhausted
            .get_or_create(&kind_label(workload.kind))
            .inc();
        let message = retries_exhausted_message(workload, standing.total, standing.budget);
        tracing::info!(%workload, "{message}");
        let reference = ObjectReference {
            api_version: Some(api_resource(workload.kind).api_version),
            kind: Some(workload.kind.as_str().to_owned()),
            namespace: Some(workload.namespace.clone()),
            name: Some(workload.name.clone()),
            ..ObjectReference::default()
        };
        self.event(
            &reference,
            None,
            EventType::Warning,
            REASON_RETRIES_EXHAUSTED,
            message,
        )
        .await;
    }

    async fn event(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        if !self.leading() {
            return;
        }
        publish_related(
            &self.recorder,
            regarding,
            related,
            type_,
            reason,
            "Record",
            note,
        )
        .await;
    }
}

/// What an Event about the workload regards.
fn object_ref(workload: &WorkloadRef, object: &DynamicObject) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_resource(workload.kind).api_version),
        kind: Some(workload.kind.as_str().to_owned()),
        namespace: Some(workload.namespace.clone()),
        name: Some(workload.name.clone()),
        uid: object.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}
