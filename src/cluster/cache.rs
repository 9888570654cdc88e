//! The webhook's view of the cluster: PriorityClass and Node reflectors (started with the
//! shared [`super::reflector`] helper) behind the read-only [`ClusterView`] the guard asks.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::task::AbortHandle;

use super::reflector::{CacheStatus, Reflected, Watch};
use crate::guard::{BUILT_IN_PRIORITY_CLASSES, ClusterView, KnownNode};

/// What the caches read, as RBAC rules: `(API group, resource, verbs)`. The installation's
/// ClusterRole is generated from this ([`crate::install`]).
pub const RBAC_RULES: [(&str, &str, &[&str]); 2] = [
    (
        "scheduling.k8s.io",
        PRIORITY_CLASSES,
        &["get", "list", "watch"],
    ),
    ("", NODES, &["get", "list", "watch"]),
];

/// The `resource` of the PriorityClass cache in [`CacheStatus`].
pub const PRIORITY_CLASSES: &str = "priorityclasses";
/// The `resource` of the Node cache in [`CacheStatus`].
pub const NODES: &str = "nodes";

/// How the log names these caches.
const CACHE: &str = "cluster cache";

/// The cluster as the guard sees it: reflector caches of PriorityClasses and Nodes, kept up to
/// date by background tasks.
///
/// # What is cached
///
/// [`ClusterCache::start`] runs two reflectors, each a Tokio task that lists once and then
/// watches:
/// - `scheduling.k8s.io/v1` PriorityClasses, slimmed to name, `value` and `globalDefault`;
/// - `core/v1` Nodes, slimmed to name, labels, `spec.taints` and `status.capacity` (managed
///   fields, annotations, images, conditions, the rest of the status and the spec are dropped
///   on arrival, so a large cluster costs little memory).
///
/// The guard asks the cache, never the API server: **no API call happens in the request path**.
/// Lookups read an in-memory map behind a lock held for a hash lookup (or, for the global
/// default PriorityClass, a scan of the few classes a cluster has).
///
/// # Keeping up
///
/// A watch that drops (API server restart, network blip, load balancer timeout) is resumed by
/// kube's watcher from the last resourceVersion it saw; a watch the API server no longer can
/// resume (`410 Gone`) leads to a fresh list that replaces the store's contents at once. Errors
/// are logged (`tracing::warn!`) and retried with kube's default backoff (0.8 s doubling up to
/// 30 s, with jitter). Meanwhile the cache keeps answering from the last known state, and
/// [`ClusterView::synced`] stays true: it turns true once
/// both caches have had their first complete list, and never turns false again.
/// [`ClusterCache::status`] tells, per resource, whether it has listed, how many objects it
/// holds, how long ago its last event came, and how many watch errors it has seen.
///
/// # RBAC
///
/// The service account needs `get`, `list` and `watch` on `priorityclasses`
/// (`scheduling.k8s.io`) and on `nodes` (core, `""`), cluster-wide; nothing more:
///
/// ```yaml
/// apiVersion: rbac.authorization.k8s.io/v1
/// kind: ClusterRole
/// metadata:
///   name: gpu-guard
/// rules:
///   - apiGroups: ["scheduling.k8s.io"]
///     resources: ["priorityclasses"]
///     verbs: ["get", "list", "watch"]
///   - apiGroups: [""]
///     resources: ["nodes"]
///     verbs: ["get", "list", "watch"]
/// ```
///
/// A missing permission shows as a `403` watch error in the log (with this hint), and the cache
/// never syncs.
///
///
/// # Sharing
///
/// Cheap to clone: clones share the caches. The tasks stop on [`ClusterCache::stop`] or when
/// the last clone is dropped; the caches then keep their last state.
#[derive(Clone)]
pub struct ClusterCache {
    inner: Arc<Inner>,
}

struct Inner {
    classes: Reflected<PriorityClass>,
    nodes: Reflected<Node>,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        abort_all(&self.tasks);
    }
}

fn abort_all(tasks: &Mutex<Vec<AbortHandle>>) {
    let tasks = std::mem::take(&mut *tasks.lock().unwrap_or_else(PoisonError::into_inner));
    for task in tasks {
        task.abort();
    }
}

/// Keeps a PriorityClass's name, value and globalDefault.
fn slim_priority_class(class: &mut PriorityClass) {
    let full = std::mem::take(class);
    *class = PriorityClass {
        metadata: ObjectMeta {
            name: full.metadata.name,
            ..ObjectMeta::default()
        },
        value: full.value,
        global_default: full.global_default,
        ..PriorityClass::default()
    };
}

/// Keeps a Node's name, labels, taints and capacity: what the guard reads.
fn keep_node_labels_taints_capacity(node: &mut Node) {
    let full = std::mem::take(node);
    *node = Node {
        metadata: ObjectMeta {
            name: full.metadata.name,
            labels: full.metadata.labels,
            ..ObjectMeta::default()
        },
        spec: full
            .spec
            .and_then(|spec| spec.taints)
            .map(|taints| NodeSpec {
                taints: Some(taints),
                ..NodeSpec::default()
            }),
        status: full
            .status
            .and_then(|status| status.capacity)
            .map(|capacity| NodeStatus {
                capacity: Some(capacity),
                ..NodeStatus::default()
            }),
    };
}

impl ClusterCache {
    /// Starts the PriorityClass and Node reflectors on the current Tokio runtime and returns at
    /// once: the cache is not synced until both have listed (see
    /// [`ClusterCache::wait_synced`]).
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    pub fn start(client: Client) -> ClusterCache {
        let mut tasks = Vec::with_capacity(4);
        let classes = Reflected::start(
            Watch {
                cache: CACHE,
                resource: PRIORITY_CLASSES,
                api: Api::<PriorityClass>::all(client.clone()),
                config: watcher::Config::default(),
                slim: slim_priority_class,
                changed: None,
            },
            &mut tasks,
        );
        let nodes = Reflected::start(
            Watch {
                cache: CACHE,
                resource: NODES,
                api: Api::<Node>::all(client),
                config: watcher::Config::default(),
                slim: keep_node_labels_taints_capacity,
                changed: None,
            },
            &mut tasks,
        );
        ClusterCache {
            inner: Arc::new(Inner {
                classes,
                nodes,
                tasks: Mutex::new(tasks),
            }),
        }
    }

    /// Waits until both caches have listed, at most `timeout`. Returns whether they have (false
    /// on timeout, or when the cache was stopped before it synced).
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let both = async {
            let classes = self.inner.classes.wait_synced().await;
            let nodes = self.inner.nodes.wait_synced().await;
            classes && nodes
        };
        tokio::time::timeout(timeout, both).await.unwrap_or(false)
    }

    /// How each cache is doing: PriorityClasses first, then Nodes.
    pub fn status(&self) -> Vec<CacheStatus> {
        vec![self.inner.classes.status(), self.inner.nodes.status()]
    }

    /// Stops the background tasks (for every clone). The caches keep answering from their last
    /// state; a cache stopped before it synced never syncs.
    pub fn stop(&self) {
        abort_all(&self.inner.tasks);
    }
}

impl fmt::Debug for ClusterCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCache")
            .field("status", &self.status())
            .finish()
    }
}

impl ClusterView for ClusterCache {
    fn synced(&self) -> bool {
        self.inner.classes.synced() && self.inner.nodes.synced()
    }

    fn priority_class(&self, name: &str) -> Option<i32> {
        self.inner
            .classes
            .get(name)
            .and_then(|class| class.value)
            .or_else(|| {
                BUILT_IN_PRIORITY_CLASSES
                    .iter()
                    .find(|(built_in, _)| *built_in == name)
                    .map(|(_, value)| *value)
            })
    }

    fn global_default_priority_class(&self) -> Option<(String, i32)> {
        // Like the API server's Priority admission plugin: with several defaults, the lowest
        // value wins (ties: the first name, so the answer does not depend on map order).
        self.inner
            .classes
            .store()
            .state()
            .iter()
            .filter(|class| class.global_default == Some(true))
            .filter_map(|class| Some((class.metadata.name.clone()?, class.value?)))
            .min_by(|(a_name, a_value), (b_name, b_value)| {
                a_value.cmp(b_value).then_with(|| a_name.cmp(b_name))
            })
    }

    fn node(&self, name: &str) -> Option<KnownNode> {
        self.inner.nodes.get(name).map(KnownNode::Object)
    }
}
