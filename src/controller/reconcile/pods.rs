//! The controller's pod cache: the [`PodFacts`] of every device pod, and nothing of the others.
//!
//! Pods are watched cluster-wide (bound to a node, not succeeded: [`POD_FIELD_SELECTOR`]);
//! each arriving Pod is reduced to its facts at once, and kept only when it is a device pod
//! ([`PodFacts::is_device_pod`]). So the cache costs what the device pods cost: in a cluster of
//! 150,000 pods of which 40,000 use GPUs, a few hundred bytes for each of the 40,000. Kube's
//! reflector store is not used: it keeps the whole object, and a second copy of every object
//! during a relist. Here a relist updates the live map in place and, when it is done, drops the
//! pods it did not list (deleted while the watch was down).
//!
//! Two things follow a change:
//! - a device pod whose facts changed becomes *dirty*: the reconciler judges the dirty pods
//!   alone ([`PodCache::take_dirty`]), instead of a full pass for every pod event;
//! - a pod that should be marked now (a device reported unhealthy, not marked yet:
//!   [`PodFacts::needs_mark_now`]) is sent at once to the marker task
//!   ([`super::marker`]), before and independent of any node work.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;

use crate::controller::pod::PodFacts;
use crate::policy::Policy;

/// The pods the controller watches: bound to a node and not succeeded (as kube-scheduler
/// selects assigned pods, but keeping Failed pods: they may still need the condition).
pub const POD_FIELD_SELECTOR: &str = "spec.nodeName!=,status.phase!=Succeeded";

/// A pod's key: `(namespace, name)`.
pub type PodKey = (String, String);

/// The device pods' facts, shared by the watch task that fills it and its readers.
#[derive(Clone)]
pub struct PodCache {
    shared: Arc<Shared>,
}

struct Shared {
    pods: RwLock<HashMap<PodKey, Arc<PodFacts>>>,
    /// Device pods whose facts changed since the reconciler last took them.
    dirty: Mutex<HashSet<PodKey>>,
    /// Woken when a pod becomes dirty.
    dirtied: Notify,
    /// True once the first list is complete.
    ready: tokio::sync::watch::Sender<bool>,
}

impl PodCache {
    /// Starts the pod watch on the current Tokio runtime (its task pushed onto `tasks`). Pods
    /// to mark at once go to `urgent`.
    pub fn start(
        client: &Client,
        policy: Policy,
        urgent: Option<mpsc::UnboundedSender<Arc<PodFacts>>>,
        tasks: &mut Vec<AbortHandle>,
    ) -> PodCache {
        let cache = PodCache {
            shared: Arc::new(Shared {
                pods: RwLock::new(HashMap::new()),
                dirty: Mutex::new(HashSet::new()),
                dirtied: Notify::new(),
                ready: tokio::sync::watch::Sender::new(false),
            }),
        };
        let mut filler = Filler {
            cache: cache.clone(),
            policy,
            urgent,
            relisted: None,
        };
        crate::cluster::reflector::follow(
            "controller cache",
            "pods",
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(POD_FIELD_SELECTOR),
            move |event| filler.apply(event),
            tasks,
        );
        cache
    }

    /// The cached device pod `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<PodFacts>> {
        self.read()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every cached device pod, sorted by namespace and name.
    pub fn snapshot(&self) -> Vec<Arc<PodFacts>> {
        let mut pods: Vec<Arc<PodFacts>> = self.read().values().cloned().collect();
        sort(&mut pods);
        pods
    }

    /// How many device pods are cached.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether no device pod is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device pods that changed since the last call (those still cached), sorted; the
    /// dirty set is emptied.
    pub fn take_dirty(&self) -> Vec<Arc<PodFacts>> {
        let keys = std::mem::take(
            &mut *self
                .shared
                .dirty
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let pods = self.read();
        let mut dirty: Vec<Arc<PodFacts>> = keys
            .iter()
            .filter_map(|key| pods.get(key).cloned())
            .collect();
        drop(pods);
        sort(&mut dirty);
        dirty
    }

    /// Forgets the dirty set (a full pass judges every pod anyway).
    pub fn clear_dirty(&self) {
        self.shared
            .dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Waits until a pod becomes dirty (at once if one did since the last wait).
    pub async fn dirtied(&self) {
        self.shared.dirtied.notified().await;
    }

    /// Whether the first list is complete.
    pub fn synced(&self) -> bool {
        *self.shared.ready.borrow()
    }

    /// Waits for the first complete list.
    pub async fn wait_synced(&self) -> bool {
        let mut ready = self.shared.ready.subscribe();
        ready.wait_for(|ready| *ready).await.is_ok()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<PodKey, Arc<PodFacts>>> {
        self.shared
            .pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<PodKey, Arc<PodFacts>>> {
        self.shared
            .pods
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) fn sort(pods: &mut [Arc<PodFacts>]) {
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
}

/// The watch task's side of the cache: applies each watch event.
struct Filler {
    cache: PodCache,
    policy: Policy,
    urgent: Option<mpsc::UnboundedSender<Arc<PodFacts>>>,
    /// During a relist: the pods it listed so far.
    relisted: Option<HashSet<PodKey>>,
}

impl Filler {
    fn apply(&mut self, event: watcher::Event<Pod>) {
        match event {
            watcher::Event::Init => self.relisted = Some(HashSet::new()),
            watcher::Event::InitApply(pod) => {
                let key = self.upsert(&pod);
                if let (Some(relisted), Some(key)) = (&mut self.relisted, key) {
                    relisted.insert(key);
                }
            }
            watcher::Event::InitDone => {
                if let Some(relisted) = self.relisted.take() {
                    // Pods deleted while the watch was down were not listed again.
                    self.cache.write().retain(|key, _| relisted.contains(key));
                }
                self.cache.shared.ready.send_replace(true);
            }
            watcher::Event::Apply(pod) => {
                self.upsert(&pod);
            }
            watcher::Event::Delete(pod) => {
                if let Some(key) = key_of(&pod) {
                    self.cache.write().remove(&key);
                }
            }
        }
    }

    /// Keeps the facts of a device pod (replacing what was cached), drops any other; marks it
    /// dirty when its facts changed, and sends it to the marker when it must be marked now.
    /// Returns its key.
    fn upsert(&mut self, pod: &Pod) -> Option<PodKey> {
        let key = key_of(pod)?;
        let facts = PodFacts::of(pod, &self.policy);
        if !facts.is_device_pod() {
            self.cache.write().remove(&key);
            return Some(key);
        }
        let facts = Arc::new(facts);
        let old = self.cache.write().insert(key.clone(), facts.clone());
        if old.as_deref() == Some(&*facts) {
            return Some(key);
        }
        let urgent = facts.needs_mark_now(&self.policy)
            && old.is_none_or(|old| !old.needs_mark_now(&self.policy));
        if urgent && let Some(sender) = &self.urgent {
            // The receiver is gone only when the controller stops.
            let _ = sender.send(facts);
        }
        self.cache
            .shared
            .dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone());
        self.cache.shared.dirtied.notify_one();
        Some(key)
    }
}

fn key_of(pod: &Pod) -> Option<PodKey> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}
