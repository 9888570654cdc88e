//! What every request shares: the policy, the guard's view of the cluster, metrics and the
//! readiness flags; and what the admin port reports of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use std::time::Instant;

use super::BODY_TIMEOUT;
use super::metrics::Metrics;
use super::tls::CertificateStore;
use gpu_guard_core::guard::{ClusterView, StaticView};
use gpu_guard_core::memory::avoid::{Memories, NoMemories};
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
    /// When a workload's unreadable memory was last logged.
    pub unreadable_memories: LogLimiter,
}

/// Says whether a line about a key is due: the first in [`LogLimiter::EVERY`] for that key.
#[derive(Debug, Default)]
pub struct LogLimiter {
    last: Mutex<HashMap<String, Instant>>,
}

impl LogLimiter {
    pub const EVERY: Duration = Duration::from_secs(60);
    /// Keys remembered at most; older ones are forgotten first.
    const KEYS: usize = 1024;

    /// Whether nothing about `key` was logged in the last [`LogLimiter::EVERY`]; if so, the
    /// line is counted as logged now.
    pub fn first_in_a_while(&self, key: &str) -> bool {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last
            .get(key)
            .is_some_and(|at| now.duration_since(*at) < Self::EVERY)
        {
            return false;
        }
        if last.len() >= Self::KEYS {
            last.retain(|_, at| now.duration_since(*at) < Self::EVERY);
        }
        if last.len() < Self::KEYS {
            last.insert(key.to_owned(), now);
        }
        true
    }
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
            unreadable_memories: LogLimiter::default(),
        })
    }
}

impl AppState {
    /// Where a Pod CREATE reads its workload's device failures: the cluster caches, or none
    /// (`serve --no-cluster`: every pod passes unchanged).
    pub fn memories(&self) -> &dyn Memories {
        match &self.cluster {
            Some(cluster) => cluster,
            None => &NoMemories,
        }
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
                "waiting for the cluster caches to sync (PriorityClasses, Nodes, the DRA objects, \
                 and the Jobs and JobSets with device failures on record)",
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
