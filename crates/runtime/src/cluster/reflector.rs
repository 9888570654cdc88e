//! The one reflector helper of both components: the webhook's [`super::ClusterCache`] and the
//! controller's `gpu_guard_controller::reconcile::Caches` start every cache with
//! [`Reflected::start`], or, for a cache that keeps its own form of each object (the
//! controller's pod cache), with [`follow`].
//!
//! A reflector is two Tokio tasks: one drives kube's watcher (list once, then watch; kube's
//! default backoff retries every error) into a [`Store`], slimming each object on arrival; the
//! other waits for the store's first complete list and makes it readable without awaiting
//! ([`Reflected::synced`]). The driving task counts events and watch errors ([`CacheStatus`]),
//! wakes an optional [`Notify`] on every event, and logs errors, with a hint when the API
//! server answers `403 Forbidden` (a missing RBAC rule).

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// How one cache is doing, for metrics and the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheStatus {
    /// `"priorityclasses"` ([`super::PRIORITY_CLASSES`]) or `"nodes"` ([`super::NODES`]).
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

/// What to reflect: the resource, how to watch it, what to keep of each object.
pub struct Watch<K> {
    /// Names the cache in the log: `"cluster cache"` (the webhook's) or `"controller cache"`.
    pub cache: &'static str,
    /// The plural resource name (`"nodes"`), in [`CacheStatus`] and the log.
    pub resource: &'static str,
    pub api: Api<K>,
    /// Label and field selectors.
    pub config: watcher::Config,
    /// Drops what the cache does not need, before the object is stored.
    pub slim: fn(&mut K),
    /// Notified on every watch event, so a reader can follow a change at once.
    pub changed: Option<Arc<Notify>>,
    /// An API the cluster may not serve (`resource.k8s.io/v1` before Kubernetes 1.34, or
    /// disabled): a list answered `404 Not Found` counts as synced and empty, so a cluster
    /// without it is not kept waiting. The watcher keeps retrying, and fills the cache once
    /// the API is served.
    pub optional: bool,
}

/// One reflector's store and what its tasks report.
pub struct Reflected<K: Resource<DynamicType = ()> + Clone + 'static> {
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
    /// Set when an optional API answered `404`: synced, empty.
    not_served: std::sync::atomic::AtomicBool,
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
    /// Starts the reflector's tasks (pushed onto `tasks`, for the owner to abort) on the
    /// current Tokio runtime and returns its store.
    pub fn start(watch: Watch<K>, tasks: &mut Vec<AbortHandle>) -> Self {
        let Watch {
            cache,
            resource,
            api,
            config,
            slim,
            changed,
            optional,
        } = watch;
        let (store, writer) = reflector::store::<K>();
        let activity = Arc::new(Activity::default());
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        let ready_tx = Arc::new(ready_tx);

        let stream =
            reflector::reflector(writer, watcher(api, config).default_backoff().modify(slim));
        let follower = Follower {
            cache,
            resource,
            activity: activity.clone(),
            changed,
            not_served: optional.then(|| ready_tx.clone()),
        };
        tasks.push(tokio::spawn(follower.follow(stream, drop)).abort_handle());

        // The store's own readiness (its first complete list), made readable without awaiting.
        let reader = store.clone();
        tasks.push(
            tokio::spawn(async move {
                if reader.wait_until_ready().await.is_ok() {
                    ready_tx.send_replace(true);
                    tracing::info!(resource, objects = reader.len(), "{cache} synced");
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

    /// The store (cheap to clone: clones read the same cache).
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Whether the first complete list has come (stays true afterwards), or an optional API
    /// is not served.
    pub fn synced(&self) -> bool {
        *self.ready.borrow()
    }

    /// The cached object `name` in `namespace` (namespaced resources).
    pub fn get_namespaced(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Becomes true with the first complete list.
    pub fn ready(&self) -> tokio::sync::watch::Receiver<bool> {
        self.ready.clone()
    }

    /// Waits for the first complete list. False when the tasks were stopped before it came.
    pub async fn wait_synced(&self) -> bool {
        let mut ready = self.ready.clone();
        ready.wait_for(|ready| *ready).await.is_ok()
    }

    /// The cached object named `name` (cluster-scoped resources).
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name))
    }

    pub fn status(&self) -> CacheStatus {
        CacheStatus {
            resource: self.resource,
            synced: self.synced(),
            objects: self.store.len(),
            since_last_event: self.activity.since_last_event(),
            watch_errors: self.activity.watch_errors.load(Ordering::Relaxed),
        }
    }
}

/// Drives a watch of `api` whose events go to `apply` instead of kube's [`Store`]: for a cache
/// that keeps its own form of each object, or only some objects (the controller's pod cache
/// keeps the few facts of device pods and drops the rest as they arrive). `apply` sees every
/// event, `Init`, `InitApply` and `InitDone` of each (re)list included, in order; errors are
/// counted, logged and retried with kube's default backoff, as for [`Reflected`].
pub fn follow<K>(
    cache: &'static str,
    resource: &'static str,
    api: Api<K>,
    config: watcher::Config,
    apply: impl FnMut(watcher::Event<K>) + Send + 'static,
    tasks: &mut Vec<AbortHandle>,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + 'static,
{
    let follower = Follower {
        cache,
        resource,
        activity: Arc::new(Activity::default()),
        changed: None,
        not_served: None,
    };
    let stream = watcher(api, config).default_backoff();
    tasks.push(tokio::spawn(follower.follow(stream, apply)).abort_handle());
}

/// What the driving task records and whom it wakes.
struct Follower {
    cache: &'static str,
    resource: &'static str,
    activity: Arc<Activity>,
    changed: Option<Arc<Notify>>,
    /// For an optional API: marks the cache synced when the API is not served.
    not_served: Option<Arc<tokio::sync::watch::Sender<bool>>>,
}

impl Follower {
    /// Drives a watch stream for as long as the task lives: hands each event to `apply`,
    /// records it, wakes the reader, logs errors.
    ///
    /// The stream is polled through [`WatchStreamExt`]'s supertrait (`futures::Stream`), which
    /// spares this crate a direct `futures` dependency.
    async fn follow<S, K>(self, stream: S, mut apply: impl FnMut(watcher::Event<K>))
    where
        S: WatchStreamExt<Item = Result<watcher::Event<K>, watcher::Error>>,
    {
        let Follower {
            cache,
            resource,
            activity,
            changed,
            not_served,
        } = self;
        let mut stream = pin!(stream);
        while let Some(item) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
            match item {
                Ok(event) => {
                    activity.event();
                    if let Some(changed) = &changed {
                        changed.notify_one();
                    }
                    match event {
                        watcher::Event::Init => tracing::debug!(resource, "{cache} listing"),
                        watcher::Event::InitDone => tracing::debug!(resource, "{cache} listed"),
                        _ => {}
                    }
                    apply(event);
                }
                Err(error) => {
                    activity.watch_errors.fetch_add(1, Ordering::Relaxed);
                    if let Some(ready) = &not_served
                        && not_found(&error)
                    {
                        if !activity.not_served.swap(true, Ordering::Relaxed) {
                            ready.send_replace(true);
                            tracing::info!(
                                resource,
                                "{cache}: the API server does not serve {resource}; treated as \
                                 empty (retrying in the background)"
                            );
                        }
                        continue;
                    }
                    if forbidden(&error) {
                        tracing::warn!(
                            resource,
                            %error,
                            "{cache}: forbidden; the service account needs get, list and \
                             watch on {resource}. Retrying with backoff"
                        );
                    } else {
                        tracing::warn!(
                            resource,
                            %error,
                            "{cache}: watch error; retrying with backoff, serving the last \
                             known state meanwhile"
                        );
                    }
                }
            }
        }
        // kube's default backoff never gives up, so this is not expected.
        tracing::warn!(
            resource,
            "{cache}: the watch stream ended; serving the last known state, no longer updated"
        );
    }
}

/// Whether the API server does not serve the resource (`404` on the list).
fn not_found(error: &watcher::Error) -> bool {
    matches!(
        error,
        watcher::Error::InitialListFailed(kube::Error::Api(status)) if status.code == 404
    )
}

/// Whether the API server refused the list or watch (`403`): a missing RBAC rule.
fn forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.is_forbidden(),
        watcher::Error::WatchError(status) => status.is_forbidden(),
        _ => false,
    }
}
