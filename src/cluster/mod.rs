//! kube-rs reflectors for PriorityClasses and Nodes behind a read-only
//! [`ClusterView`].
//!
//! # What is cached
//!
//! [`ClusterCache::start`] runs two reflectors, each a Tokio task that lists once and then
//! watches:
//! - `scheduling.k8s.io/v1` PriorityClasses, slimmed to name, `value` and `globalDefault`;
//! - `core/v1` Nodes, slimmed to name, labels, `spec.taints` and `status.capacity` (managed
//!   fields, annotations, images, conditions, the rest of the status and the spec are dropped
//!   on arrival, so a large cluster costs little memory).
//!
//! The guard asks the cache, never the API server: **no API call happens in the request path**.
//! Lookups read an in-memory map behind a lock held for a hash lookup (or, for the global
//! default PriorityClass, a scan of the few classes a cluster has).
//!
//! # Keeping up
//!
//! A watch that drops (API server restart, network blip, load balancer timeout) is resumed by
//! kube's watcher from the last resourceVersion it saw; a watch the API server no longer can
//! resume (`410 Gone`) leads to a fresh list that replaces the store's contents at once. Errors
//! are logged (`tracing::warn!`) and retried with kube's default backoff (0.8 s doubling up to
//! 30 s, with jitter). Meanwhile the cache keeps answering from the last known state, and
//! [`ClusterView::synced`] stays true: it turns true once
//! both caches have had their first complete list, and never turns false again.
//! [`ClusterCache::status`] tells, per resource, whether it has listed, how many objects it
//! holds, how long ago its last event came, and how many watch errors it has seen.
//!
//! # RBAC
//!
//! The service account needs `get`, `list` and `watch` on `priorityclasses`
//! (`scheduling.k8s.io`) and on `nodes` (core, `""`), cluster-wide; nothing more:
//!
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: ClusterRole
//! metadata:
//!   name: gpu-guard
//! rules:
//!   - apiGroups: ["scheduling.k8s.io"]
//!     resources: ["priorityclasses"]
//!     verbs: ["get", "list", "watch"]
//!   - apiGroups: [""]
//!     resources: ["nodes"]
//!     verbs: ["get", "list", "watch"]
//! ```
//!
//! A missing permission shows as a `403` watch error in the log (with this hint), and the cache
//! never syncs.
//!
//! # Clients
//!
//! [`client`] builds the Kubernetes client from `--kubeconfig` or inferred (`KUBECONFIG`,
//! `~/.kube/config`, in-cluster), with [`ClusterError`] messages that say how to fix what is
//! wrong; [`config_source`] and [`config_available`] tell whether a cluster is configured at all.

mod client;

pub use client::{ClusterError, ConfigSource, client, config, config_available, config_source};

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::task::AbortHandle;

use crate::guard::{BUILT_IN_PRIORITY_CLASSES, ClusterView, KnownNode};

/// What the caches read, as RBAC rules: `(API group, resource, verbs)`. The installation's
/// ClusterRole is generated from this ([`crate::deploy`]).
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

/// The cluster as the guard sees it: reflector caches of PriorityClasses and Nodes, kept up to
/// date by background tasks (see the [module docs](crate::cluster)).
///
/// Cheap to clone: clones share the caches. The tasks stop on [`ClusterCache::stop`] or when
/// the last clone is dropped; the caches then keep their last state.
#[derive(Clone)]
pub struct ClusterCache {
    inner: Arc<Inner>,
}

/// How one cache is doing, for metrics and the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheStatus {
    /// `"priorityclasses"` ([`PRIORITY_CLASSES`]) or `"nodes"` ([`NODES`]).
    pub resource: &'static str,
    /// Whether the cache has had its first complete list (stays true afterwards).
    pub synced: bool,
    /// How many objects it holds.
    pub objects: usize,
    /// Time since the last event (a listed object, the end of a list, an added, modified or
    /// deleted object); `None` before the first. Watch bookmarks do not count, so on a quiet
    /// cluster this grows even though the watch is healthy.
    pub since_last_event: Option<Duration>,
    /// Watch errors seen so far (failed lists or watches, error events such as `410 Gone`);
    /// each is retried with backoff.
    pub watch_errors: u64,
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

/// One reflector's store and what its tasks report.
struct Reflected<K: Resource<DynamicType = ()> + Clone + 'static> {
    resource: &'static str,
    store: Store<K>,
    /// Set to true (once) by a task waiting on the store's readiness.
    ready: tokio::sync::watch::Receiver<bool>,
    activity: Arc<Activity>,
}

#[derive(Default)]
struct Activity {
    last_event: Mutex<Option<Instant>>,
    watch_errors: AtomicU64,
}

impl Activity {
    fn event(&self) {
        *self
            .last_event
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    fn since_last_event(&self) -> Option<Duration> {
        self.last_event
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|at| at.elapsed())
    }
}

impl<K> Reflected<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    /// Starts the reflector's tasks (pushed onto `tasks`) and returns its store.
    fn start(
        resource: &'static str,
        api: Api<K>,
        slim: fn(&mut K),
        tasks: &mut Vec<AbortHandle>,
    ) -> Self {
        let (store, writer) = reflector::store::<K>();
        let activity = Arc::new(Activity::default());
        let (ready_tx, ready) = tokio::sync::watch::channel(false);

        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default())
                .default_backoff()
                .modify(slim),
        );
        tasks.push(tokio::spawn(follow(resource, stream, activity.clone())).abort_handle());

        // The store's own readiness (its first complete list), made readable without awaiting.
        // This task is the store's only waiter.
        let reader = store.clone();
        tasks.push(
            tokio::spawn(async move {
                if reader.wait_until_ready().await.is_ok() {
                    ready_tx.send_replace(true);
                    tracing::info!(resource, objects = reader.len(), "cluster cache synced");
                }
            })
            .abort_handle(),
        );

        Self {
            resource,
            store,
            ready,
            activity,
        }
    }

    fn synced(&self) -> bool {
        *self.ready.borrow()
    }

    async fn wait_synced(&self) -> bool {
        let mut ready = self.ready.clone();
        ready.wait_for(|ready| *ready).await.is_ok()
    }

    fn get(&self, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name))
    }

    fn status(&self) -> CacheStatus {
        CacheStatus {
            resource: self.resource,
            synced: self.synced(),
            objects: self.store.len(),
            since_last_event: self.activity.since_last_event(),
            watch_errors: self.activity.watch_errors.load(Ordering::Relaxed),
        }
    }
}

/// Drives a reflector stream for as long as the task lives: records events, logs errors.
///
/// The stream is polled through [`WatchStreamExt`]'s supertrait (`futures::Stream`), which
/// spares this crate a direct `futures` dependency.
async fn follow<S, K>(resource: &'static str, stream: S, activity: Arc<Activity>)
where
    S: WatchStreamExt<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = pin!(stream);
    while let Some(item) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
        match item {
            Ok(event) => {
                activity.event();
                match event {
                    watcher::Event::Init => tracing::debug!(resource, "cluster cache listing"),
                    watcher::Event::InitDone => tracing::debug!(resource, "cluster cache listed"),
                    _ => {}
                }
            }
            Err(error) => {
                activity.watch_errors.fetch_add(1, Ordering::Relaxed);
                if forbidden(&error) {
                    tracing::warn!(
                        resource,
                        %error,
                        "cluster cache: forbidden; the service account needs get, list and \
                         watch on {resource}. Retrying with backoff"
                    );
                } else {
                    tracing::warn!(
                        resource,
                        %error,
                        "cluster cache: watch error; retrying with backoff, serving the last \
                         known state meanwhile"
                    );
                }
            }
        }
    }
    // kube's default backoff never gives up, so this is not expected.
    tracing::warn!(
        resource,
        "cluster cache: the watch stream ended; serving the last known state, no longer updated"
    );
}

fn forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.is_forbidden(),
        watcher::Error::WatchError(status) => status.is_forbidden(),
        _ => false,
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

/// Keeps a Node's name, labels, taints and capacity.
fn slim_node(node: &mut Node) {
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
            PRIORITY_CLASSES,
            Api::<PriorityClass>::all(client.clone()),
            slim_priority_class,
            &mut tasks,
        );
        let nodes = Reflected::start(NODES, Api::<Node>::all(client), slim_node, &mut tasks);
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
            .store
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
