//! The webhook's view of the cluster: PriorityClass and Node reflectors (started with the
//! shared [`super::reflector`] helper) behind the read-only [`ClusterView`] the guard asks.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceClassSpec, DeviceRequest, DeviceSubRequest, ExactDeviceRequest,
    ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::task::AbortHandle;

use super::rbac::{READ, RbacRule};
use super::reflector::{CacheStatus, Reflected, Watch};
use gpu_guard_core::devices::{ClaimDevices, DraFacts, Lookup};
use gpu_guard_core::guard::{BUILT_IN_PRIORITY_CLASSES, ClusterView, KnownNode};
use gpu_guard_core::jobset;
use gpu_guard_core::memory::avoid::Memories;
use gpu_guard_core::memory::{MEMORY_ANNOTATION, WorkloadKind, WorkloadRef};

/// What the caches read, as RBAC rules. The installation's ClusterRole is generated from this.
pub const RBAC_RULES: [RbacRule; 7] = [
    RbacRule::new("scheduling.k8s.io", PRIORITY_CLASSES, READ),
    RbacRule::new("", NODES, READ),
    RbacRule::new("resource.k8s.io", RESOURCE_CLAIM_TEMPLATES, READ),
    RbacRule::new("resource.k8s.io", RESOURCE_CLAIMS, READ),
    RbacRule::new("resource.k8s.io", DEVICE_CLASSES, READ),
    RbacRule::new("batch", JOBS, READ),
    RbacRule::new(jobset::GROUP, JOBSETS, READ),
];

/// The `resource` of the cache of Jobs with device failures on record (`batch/v1`).
pub const JOBS: &str = "jobs";
/// The `resource` of the cache of JobSets with device failures on record.
pub const JOBSETS: &str = "jobsets";

/// The label the controller sets (`"true"`) on a Job or JobSet whose device failures it
/// records: the webhook watches those only.
pub use gpu_guard_core::memory::MEMORY_LABEL;

/// The `resource` of the PriorityClass cache in [`CacheStatus`].
pub const PRIORITY_CLASSES: &str = "priorityclasses";
/// The `resource` of the Node cache in [`CacheStatus`].
pub const NODES: &str = "nodes";
/// The `resource` of the ResourceClaimTemplate cache (`resource.k8s.io/v1`).
pub const RESOURCE_CLAIM_TEMPLATES: &str = "resourceclaimtemplates";
/// The `resource` of the ResourceClaim cache.
pub const RESOURCE_CLAIMS: &str = "resourceclaims";
/// The `resource` of the DeviceClass cache.
pub const DEVICE_CLASSES: &str = "deviceclasses";

/// How the log names these caches.
const CACHE: &str = "cluster cache";

/// The cluster as the guard sees it: reflector caches of PriorityClasses and Nodes, kept up to
/// date by background tasks.
///
/// # What is cached
///
/// [`ClusterCache::start`] runs seven reflectors, each a Tokio task that lists once and then
/// watches:
/// - `scheduling.k8s.io/v1` PriorityClasses, slimmed to name, `value` and `globalDefault`;
/// - `core/v1` Nodes, slimmed to name, labels, `spec.taints` and `status.capacity` (managed
///   fields, annotations, images, conditions, the rest of the status and the spec are dropped
///   on arrival, so a large cluster costs little memory);
/// - `resource.k8s.io/v1` ResourceClaimTemplates and ResourceClaims, slimmed to name,
///   namespace and each device request's name and classes (a ResourceClaim generated for a
///   pod costs a few hundred bytes), and DeviceClasses, slimmed to name, creation time and
///   `extendedResourceName`: to tell whether a container's DRA claim is a device. These three
///   are optional: on a cluster that does not serve `resource.k8s.io/v1` (before 1.34, or the
///   API disabled) the list answers `404`, and the cache counts as synced and empty;
/// - `batch/v1` Jobs and `jobset.x-k8s.io/v1alpha2` JobSets labelled
///   `gpu-guard.io/device-failures=true` (those whose device failures the controller
///   records: a few, whatever the number of Jobs), slimmed to name, namespace and the
///   `gpu-guard.io/device-failures` annotation, for a Pod CREATE to keep a new pod off the
///   nodes where its workload failed ([`Memories`]). JobSets are optional, as the DRA objects
///   are: without the CRD, none.
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
/// every cache has had its first complete list, and never turns false again.
/// [`ClusterCache::status`] tells, per resource, whether it has listed, how many objects it
/// holds, how long ago its last event came, and how many watch errors it has seen.
///
/// # RBAC
///
/// The service account needs `get`, `list` and `watch` on `priorityclasses`
/// (`scheduling.k8s.io`), on `nodes` (core, `""`), on `resourceclaimtemplates`,
/// `resourceclaims` and `deviceclasses` (`resource.k8s.io`), on `jobs` (`batch`) and on
/// `jobsets` (`jobset.x-k8s.io`), cluster-wide; nothing more:
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
///   - apiGroups: ["resource.k8s.io"]
///     resources: ["resourceclaimtemplates", "resourceclaims", "deviceclasses"]
///     verbs: ["get", "list", "watch"]
///   - apiGroups: ["batch"]
///     resources: ["jobs"]
///     verbs: ["get", "list", "watch"]
///   - apiGroups: ["jobset.x-k8s.io"]
///     resources: ["jobsets"]
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
    claim_templates: Reflected<ResourceClaimTemplate>,
    claims: Reflected<ResourceClaim>,
    device_classes: Reflected<DeviceClass>,
    jobs: Reflected<Remembering<JobApi>>,
    jobsets: Reflected<Remembering<JobSetApi>>,
    tasks: Mutex<Vec<AbortHandle>>,
}

/// The API of a workload that keeps a memory of its device failures.
pub trait WorkloadApi: Clone + fmt::Debug + Send + Sync + 'static {
    const GROUP: &'static str;
    const VERSION: &'static str;
    const KIND: &'static str;
    const PLURAL: &'static str;
}

/// `batch/v1` Jobs.
#[derive(Clone, Debug)]
pub enum JobApi {}

impl WorkloadApi for JobApi {
    const GROUP: &'static str = "batch";
    const VERSION: &'static str = "v1";
    const KIND: &'static str = "Job";
    const PLURAL: &'static str = JOBS;
}

/// `jobset.x-k8s.io/v1alpha2` JobSets (jobset `api/jobset/v1alpha2/jobset_types.go`).
#[derive(Clone, Debug)]
pub enum JobSetApi {}

impl WorkloadApi for JobSetApi {
    const GROUP: &'static str = jobset::GROUP;
    const VERSION: &'static str = "v1alpha2";
    const KIND: &'static str = "JobSet";
    const PLURAL: &'static str = JOBSETS;
}

/// A Job or JobSet as the memory cache reads it: its metadata only (the spec and status are
/// skipped by serde unread), slimmed to name, namespace and the memory annotation.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Remembering<W> {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(skip)]
    api: std::marker::PhantomData<W>,
}

impl<W: WorkloadApi> kube::Resource for Remembering<W> {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        W::KIND.into()
    }

    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        W::GROUP.into()
    }

    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        W::VERSION.into()
    }

    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        W::PLURAL.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Keeps a workload's name, namespace and memory annotation.
fn slim_remembering<W>(workload: &mut Remembering<W>) {
    let mut full = std::mem::take(&mut workload.metadata);
    let memory = full
        .annotations
        .take()
        .and_then(|mut annotations| annotations.remove_entry(MEMORY_ANNOTATION));
    workload.metadata = ObjectMeta {
        annotations: memory.map(|entry| [entry].into()),
        ..slim_metadata(full)
    };
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

/// Keeps what the device rule reads of a claim's devices: each request's name and device
/// classes (`exactly.deviceClassName`, every `firstAvailable` alternative's name and class).
fn slim_device_claim(devices: Option<DeviceClaim>) -> Option<DeviceClaim> {
    let requests = devices?.requests?;
    Some(DeviceClaim {
        requests: Some(
            requests
                .into_iter()
                .map(|request| DeviceRequest {
                    name: request.name,
                    exactly: request.exactly.map(|exactly| ExactDeviceRequest {
                        device_class_name: exactly.device_class_name,
                        ..ExactDeviceRequest::default()
                    }),
                    first_available: request.first_available.map(|alternatives| {
                        alternatives
                            .into_iter()
                            .map(|alternative| DeviceSubRequest {
                                name: alternative.name,
                                device_class_name: alternative.device_class_name,
                                ..DeviceSubRequest::default()
                            })
                            .collect()
                    }),
                })
                .collect(),
        ),
        ..DeviceClaim::default()
    })
}

/// Name and namespace only.
fn slim_metadata(metadata: ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        ..ObjectMeta::default()
    }
}

fn slim_claim_template(template: &mut ResourceClaimTemplate) {
    let full = std::mem::take(template);
    *template = ResourceClaimTemplate {
        metadata: slim_metadata(full.metadata),
        spec: ResourceClaimTemplateSpec {
            metadata: None,
            spec: ResourceClaimSpec {
                devices: slim_device_claim(full.spec.spec.devices),
            },
        },
    };
}

fn slim_claim(claim: &mut ResourceClaim) {
    let full = std::mem::take(claim);
    *claim = ResourceClaim {
        metadata: slim_metadata(full.metadata),
        spec: ResourceClaimSpec {
            devices: slim_device_claim(full.spec.devices),
        },
        status: None,
    };
}

/// Keeps a DeviceClass's name, creation time and `spec.extendedResourceName`.
fn slim_device_class(class: &mut DeviceClass) {
    let full = std::mem::take(class);
    *class = DeviceClass {
        metadata: ObjectMeta {
            name: full.metadata.name,
            creation_timestamp: full.metadata.creation_timestamp,
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            extended_resource_name: full.spec.extended_resource_name,
            ..DeviceClassSpec::default()
        },
    };
}

/// A watch of the webhook's cache: every object of `api`, slimmed on arrival.
fn watch<K>(resource: &'static str, api: Api<K>, slim: fn(&mut K), optional: bool) -> Watch<K> {
    Watch {
        cache: CACHE,
        resource,
        api,
        config: watcher::Config::default(),
        slim,
        changed: None,
        optional,
    }
}

impl ClusterCache {
    /// Starts the reflectors on the current Tokio runtime and returns at once: the cache is
    /// not synced until each has listed (see [`ClusterCache::wait_synced`]).
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    pub fn start(client: Client) -> ClusterCache {
        let mut tasks = Vec::with_capacity(4);
        let classes = Reflected::start(
            watch(
                PRIORITY_CLASSES,
                Api::<PriorityClass>::all(client.clone()),
                slim_priority_class,
                false,
            ),
            &mut tasks,
        );
        let nodes = Reflected::start(
            watch(
                NODES,
                Api::<Node>::all(client.clone()),
                keep_node_labels_taints_capacity,
                false,
            ),
            &mut tasks,
        );
        // DRA (`resource.k8s.io/v1`, GA in 1.34): optional, so that a cluster that does not
        // serve it is not kept waiting.
        let claim_templates = Reflected::start(
            watch(
                RESOURCE_CLAIM_TEMPLATES,
                Api::<ResourceClaimTemplate>::all(client.clone()),
                slim_claim_template,
                true,
            ),
            &mut tasks,
        );
        let claims = Reflected::start(
            watch(
                RESOURCE_CLAIMS,
                Api::<ResourceClaim>::all(client.clone()),
                slim_claim,
                true,
            ),
            &mut tasks,
        );
        let device_classes = Reflected::start(
            watch(
                DEVICE_CLASSES,
                Api::<DeviceClass>::all(client.clone()),
                slim_device_class,
                true,
            ),
            &mut tasks,
        );
        // The workloads with device failures on record, by the controller's label: a few,
        // whatever the number of Jobs. JobSets are optional: without the CRD, none.
        let jobs = Reflected::start(remembering(JOBS, client.clone(), false), &mut tasks);
        let jobsets = Reflected::start(remembering(JOBSETS, client, true), &mut tasks);
        ClusterCache {
            inner: Arc::new(Inner {
                classes,
                nodes,
                claim_templates,
                claims,
                device_classes,
                jobs,
                jobsets,
                tasks: Mutex::new(tasks),
            }),
        }
    }

    /// Waits until every cache has listed (or, for the DRA caches, found its API not served),
    /// at most `timeout`. Returns whether they have (false on timeout, or when the cache was
    /// stopped before it synced).
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let all = async {
            let inner = &self.inner;
            let mut synced = true;
            for ready in [
                inner.classes.wait_synced().await,
                inner.nodes.wait_synced().await,
                inner.claim_templates.wait_synced().await,
                inner.claims.wait_synced().await,
                inner.device_classes.wait_synced().await,
                inner.jobs.wait_synced().await,
                inner.jobsets.wait_synced().await,
            ] {
                synced &= ready;
            }
            synced
        };
        tokio::time::timeout(timeout, all).await.unwrap_or(false)
    }

    /// How each cache is doing: PriorityClasses, Nodes, ResourceClaimTemplates,
    /// ResourceClaims, DeviceClasses, Jobs and JobSets with device failures on record.
    pub fn status(&self) -> Vec<CacheStatus> {
        let inner = &self.inner;
        vec![
            inner.classes.status(),
            inner.nodes.status(),
            inner.claim_templates.status(),
            inner.claims.status(),
            inner.device_classes.status(),
            inner.jobs.status(),
            inner.jobsets.status(),
        ]
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

/// A watch of the workloads labelled [`MEMORY_LABEL`]`=true`.
fn remembering<W: WorkloadApi>(
    resource: &'static str,
    client: Client,
    optional: bool,
) -> Watch<Remembering<W>> {
    Watch {
        cache: CACHE,
        resource,
        api: Api::all(client),
        config: watcher::Config::default().labels(&format!("{MEMORY_LABEL}=true")),
        slim: slim_remembering::<W>,
        changed: None,
        optional,
    }
}

/// The memory annotation of a Job or JobSet the controller labelled; `None` for one it did
/// not (nothing on record), or before the cache has listed (the webhook is not ready then).
impl Memories for ClusterCache {
    fn memory_annotation(&self, workload: &WorkloadRef) -> Option<String> {
        let meta = match workload.kind {
            WorkloadKind::Job => self
                .inner
                .jobs
                .get_namespaced(&workload.namespace, &workload.name)
                .map(|job| job.metadata.annotations.clone()),
            WorkloadKind::JobSet => self
                .inner
                .jobsets
                .get_namespaced(&workload.namespace, &workload.name)
                .map(|jobset| jobset.metadata.annotations.clone()),
        };
        meta.flatten()?.remove(MEMORY_ANNOTATION)
    }
}

impl ClusterView for ClusterCache {
    fn synced(&self) -> bool {
        let inner = &self.inner;
        inner.classes.synced()
            && inner.nodes.synced()
            && inner.claim_templates.synced()
            && inner.claims.synced()
            && inner.device_classes.synced()
            && inner.jobs.synced()
            && inner.jobsets.synced()
    }

    fn dra(&self) -> &dyn DraFacts {
        self
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

/// A claim of a DRA cache: found, known not to exist (synced), or not known yet.
fn lookup<K>(
    cache: &Reflected<K>,
    namespace: &str,
    name: &str,
    devices: impl Fn(&K) -> ClaimDevices,
) -> Lookup
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + fmt::Debug,
    K: Send + Sync + 'static,
{
    match cache.get_namespaced(namespace, name) {
        Some(object) => Lookup::Found(devices(&object)),
        None if cache.synced() => Lookup::Missing,
        None => Lookup::Unknown,
    }
}

/// The DRA objects of the cluster, from the caches. Until a cache has synced, what it does not
/// hold is [`Lookup::Unknown`] (a claim is then unresolved, never guessed); the webhook is not
/// ready before every cache has synced, so this is only met while it starts.
impl DraFacts for ClusterCache {
    fn claim_template(&self, namespace: &str, name: &str) -> Lookup {
        lookup(&self.inner.claim_templates, namespace, name, |template| {
            ClaimDevices::from_device_claim(template.spec.spec.devices.as_ref())
        })
    }

    fn claim(&self, namespace: &str, name: &str) -> Lookup {
        lookup(&self.inner.claims, namespace, name, |claim| {
            ClaimDevices::from_device_claim(claim.spec.devices.as_ref())
        })
    }

    /// With several classes mapping the same name, the API picks the newest (ties: the first
    /// name); so does this (`DeviceClassSpec.extendedResourceName`, resource.k8s.io/v1 v1.36).
    fn class_of_extended_resource(&self, resource: &str) -> Option<String> {
        self.inner
            .device_classes
            .store()
            .state()
            .iter()
            .filter(|class| class.spec.extended_resource_name.as_deref() == Some(resource))
            .max_by(|a, b| {
                let created = |class: &DeviceClass| class.metadata.creation_timestamp.clone();
                created(a)
                    .cmp(&created(b))
                    .then_with(|| b.metadata.name.cmp(&a.metadata.name))
            })
            .and_then(|class| class.metadata.name.clone())
    }
}
