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

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use super::WriteError;
use super::caches::OptedIn;
use super::events::{REASON_MARKED, publish};
use super::pods::PodCache;
use crate::controller::lease::Leadership;
use crate::controller::metrics::ControllerMetrics;
use crate::controller::pod::{self, Cause, PodFacts};
use crate::policy::Policy;
use crate::wellknown::DEVICE_FAILURE_CONDITION;

/// The read and write timeout of a mark: short, so a slow API server does not hold up the
/// marks behind it (the next pass retries a mark that timed out).
pub const MARK_TIMEOUT: Duration = Duration::from_secs(2);

/// Adds the condition; remembers, for the current term of leadership, which pods it marked.
pub struct Marker {
    client: Client,
    recorder: Recorder,
    dry_run: bool,
    metrics: Arc<ControllerMetrics>,
    /// `None` (never set): act without an election.
    leadership: OnceLock<Leadership>,
    /// The pods (by uid) marked, or being marked, this term: the cache may lag behind our own
    /// change.
    claimed: Mutex<HashSet<String>>,
}

impl Marker {
    /// A marker writing through a client made from `config` with [`MARK_TIMEOUT`].
    pub fn new(
        config: kube::Config,
        recorder: Recorder,
        dry_run: bool,
        metrics: Arc<ControllerMetrics>,
    ) -> Result<Self, kube::Error> {
        let mut config = crate::controller::write_config(config);
        config.read_timeout = Some(MARK_TIMEOUT);
        config.write_timeout = Some(MARK_TIMEOUT);
        Ok(Self {
            client: Client::try_from(config)?,
            recorder,
            dry_run,
            metrics,
            leadership: OnceLock::new(),
            claimed: Mutex::new(HashSet::new()),
        })
    }

    /// Marks only while `leadership` lasts (set once).
    pub fn set_leadership(&self, leadership: Leadership) {
        let _ = self.leadership.set(leadership);
    }

    /// Whether this replica may write now.
    pub fn leading(&self) -> bool {
        self.leadership.get().is_none_or(Leadership::leads)
    }

    /// Forgets which pods were marked (a new term: another replica may have acted).
    pub fn reset(&self) {
        self.claimed().clear();
    }

    /// Forgets the pods (by uid) not in `present`.
    pub fn retain(&self, present: &HashSet<&str>) {
        self.claimed().retain(|uid| present.contains(uid.as_str()));
    }

    /// Adds the condition to the pod's status (a strategic merge patch: the API server merges
    /// conditions by type) and reports it in an Event. `Ok(false)`: marked already this term
    /// (or being marked by the other path).
    pub async fn mark(
        &self,
        pod: &PodFacts,
        cause: &Cause,
        now: Timestamp,
    ) -> Result<bool, WriteError> {
        if !self.leading() {
            return Err(WriteError::NotLeading);
        }
        if !self.claimed().insert(pod.uid.clone()) {
            return Ok(false);
        }
        let written = self.patch(pod, cause, now).await;
        if written.is_err() {
            self.claimed().remove(&pod.uid);
        }
        written?;
        self.metrics.pods_marked.inc();
        let note = cause.message();
        let id = pod.id();
        let prefix = if self.dry_run {
            tracing::info!(pod = %id, reason = cause.reason(),
                "dry run: would add the condition {}=True: {note}", DEVICE_FAILURE_CONDITION);
            "dry run: would mark: "
        } else {
            tracing::info!(pod = %id, reason = cause.reason(),
                "added the condition {}=True: {note}", DEVICE_FAILURE_CONDITION);
            ""
        };
        if self.leading() {
            publish(
                &self.recorder,
                &pod.object_ref(),
                EventType::Warning,
                REASON_MARKED,
                "Mark",
                format!("{prefix}{note}"),
            )
            .await;
        }
        Ok(true)
    }

    async fn patch(&self, pod: &PodFacts, cause: &Cause, now: Timestamp) -> Result<(), WriteError> {
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        // In a dry run too, with dryRun=All: checked by the API server, not stored.
        let params = if self.dry_run {
            PatchParams::default().dry_run()
        } else {
            PatchParams::default()
        };
        api.patch_status(
            &pod.name,
            &params,
            &Patch::Strategic(pod::condition_patch(cause, now)),
        )
        .await?;
        Ok(())
    }

    fn claimed(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.claimed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The event path: marks each pod the pod cache sends (a device reported unhealthy, not marked
/// yet) as it comes, once the opted-in namespaces are known. A pod that is gone, no longer
/// needs the mark, or is not in an opted-in namespace is skipped; a failed mark is logged and
/// left to the next pass. Runs until the sender is dropped.
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
    while let Some(sent) = urgent.recv().await {
        if !marker.leading() || !opted_in.contains(&sent.namespace) {
            continue;
        }
        // The latest facts: the pod may have changed or gone since it was sent.
        let Some(current) = pods.get(&sent.namespace, &sent.name) else {
            continue;
        };
        if !current.needs_mark_now(&policy) {
            continue;
        }
        let Some(cause) = current.unhealthy.clone() else {
            continue;
        };
        match marker.mark(&current, &cause, Timestamp::now()).await {
            Ok(_) | Err(WriteError::NotLeading) => {}
            Err(WriteError::Api(error)) => {
                marker.metrics.reconcile_errors.inc();
                tracing::warn!(pod = %current.id(), %error,
                    "cannot mark the pod; retrying on the next pass");
            }
        }
    }
}
