//! What every request shares: the policy, the guard's view of the cluster, metrics and the
//! readiness flags; and what the admin port reports of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::BODY_TIMEOUT;
use super::metrics::Metrics;
use super::tls::CertificateStore;
use gpu_guard_core::guard::{ClusterView, StaticView};
use gpu_guard_core::policy::Policy;
use gpu_guard_runtime::cluster::ClusterCache;
use gpu_guard_runtime::process::AdminProbes;

/// Where the guard's view of the cluster comes from.
#[derive(Debug)]
pub enum ClusterSource {
    /// The policy file's offline facts (`serve --no-cluster`, or no cluster configured).
    Offline(StaticView),
    /// Reflector caches of a cluster; `/readyz` waits for them to sync.
    Cache(ClusterCache),
}

impl ClusterSource {
    /// The policy's offline facts.
    pub fn offline(policy: &Policy) -> Self {
        Self::Offline(StaticView::from_policy(&policy.guard.offline))
    }
}

/// Shared by every request.
pub struct AppState {
    pub policy: Policy,
    /// What the guard knows of the cluster: the reflector caches, or the policy's offline facts.
    pub view: Arc<dyn ClusterView>,
    /// The caches behind `view` when there is a cluster (for their metrics).
    pub cluster: Option<ClusterCache>,
    pub body_timeout: Duration,
    pub ready: AtomicBool,
    pub draining: AtomicBool,
    pub metrics: Metrics,
    pub certificates: Option<Arc<CertificateStore>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("policy", &self.policy)
            .field("view_synced", &self.view.synced())
            .field("ready", &self.ready)
            .field("draining", &self.draining)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// State for a [`super::webhook_router`] served without TLS (or driven in process with
    /// `tower::ServiceExt::oneshot`): ready at once, with the policy's offline cluster facts.
    pub fn new(policy: Policy) -> Arc<Self> {
        let view = Arc::new(StaticView::from_policy(&policy.guard.offline));
        Arc::new(Self {
            policy,
            view,
            cluster: None,
            body_timeout: BODY_TIMEOUT,
            ready: AtomicBool::new(true),
            draining: AtomicBool::new(false),
            metrics: Metrics::default(),
            certificates: None,
        })
    }
}

impl AdminProbes for AppState {
    fn readiness(&self) -> Result<(), &'static str> {
        if self.draining.load(Ordering::Relaxed) {
            Err("draining")
        } else if !self.ready.load(Ordering::Relaxed) {
            Err("starting")
        } else if !self.view.synced() {
            Err(
                "waiting for the cluster caches to sync (PriorityClasses, Nodes and the DRA objects)",
            )
        } else {
            Ok(())
        }
    }

    fn metrics(&self) -> String {
        if let Some(cluster) = &self.cluster {
            self.metrics.observe_caches(&cluster.status());
        }
        self.metrics
            .observe_log(gpu_guard_runtime::process::dropped_log_lines());
        self.metrics.encode()
    }
}
