//! What the guard reads of a workload, decoded straight from the object's JSON: only the fields
//! it judges (everything else is skipped by serde, so a large Deployment costs little).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, PodResourceClaim, ResourceClaim, Toleration};
use serde::Deserialize;

use crate::decode::{self, JsonError};
use crate::field::FieldPath;
use crate::kinds::{self, Kind, PodTemplates, Scope, WorkloadKind};

/// The kinds the guard judges: Pods and every pod-template owner, JobSets and Kubeflow Trainer
/// runtimes (one pod template per replicatedJob) included; those [`WorkloadKind::guarded`] in
/// the kind registry, whose facts [`GuardedKind::info`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GuardedKind {
    Pod,
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    ReplicationController,
    Job,
    CronJob,
    JobSet,
    TrainingRuntime,
    ClusterTrainingRuntime,
}

impl GuardedKind {
    /// The kind for an API group, version and kind, if the guard judges it.
    pub fn from_gvk(group: &str, version: &str, kind: &str) -> Option<Self> {
        kinds::find(group, version, kind).and_then(|known| Self::of(known.id))
    }

    /// The kind for a manifest's `apiVersion` and `kind`.
    pub fn from_api_version(api_version: &str, kind: &str) -> Option<Self> {
        let (group, version) = kinds::split_api_version(api_version);
        Self::from_gvk(group, version, kind)
    }

    /// The guarded kind of a registry kind, if [`WorkloadKind::guarded`].
    fn of(kind: Kind) -> Option<Self> {
        let guarded = match kind {
            Kind::Pod => Self::Pod,
            Kind::Deployment => Self::Deployment,
            Kind::StatefulSet => Self::StatefulSet,
            Kind::DaemonSet => Self::DaemonSet,
            Kind::ReplicaSet => Self::ReplicaSet,
            Kind::ReplicationController => Self::ReplicationController,
            Kind::Job => Self::Job,
            Kind::CronJob => Self::CronJob,
            Kind::JobSet => Self::JobSet,
            Kind::TrainingRuntime => Self::TrainingRuntime,
            Kind::ClusterTrainingRuntime => Self::ClusterTrainingRuntime,
            Kind::PodTemplate | Kind::TrainJob => return None,
        };
        kind.info().guarded.then_some(guarded)
    }

    /// Its entry in the kind registry.
    pub fn info(self) -> &'static WorkloadKind {
        match self {
            Self::Pod => Kind::Pod,
            Self::Deployment => Kind::Deployment,
            Self::StatefulSet => Kind::StatefulSet,
            Self::DaemonSet => Kind::DaemonSet,
            Self::ReplicaSet => Kind::ReplicaSet,
            Self::ReplicationController => Kind::ReplicationController,
            Self::Job => Kind::Job,
            Self::CronJob => Kind::CronJob,
            Self::JobSet => Kind::JobSet,
            Self::TrainingRuntime => Kind::TrainingRuntime,
            Self::ClusterTrainingRuntime => Kind::ClusterTrainingRuntime,
        }
        .info()
    }

    pub fn as_str(self) -> &'static str {
        self.info().kind
    }

    /// The namespace whose mode and exemptions apply to an object of this kind in `namespace`.
    /// None for a cluster-scoped kind (a ClusterTrainingRuntime): its pods run in the namespace
    /// of each TrainJob that references it, unknown at admission, so the guard's default mode
    /// applies, and no namespace exemption (a namespace's Warn or exemption must not open a
    /// runtime that every namespace can use).
    pub fn policy_namespace(self, namespace: &str) -> &str {
        match self.info().scope {
            Scope::Cluster => "",
            Scope::Namespaced => namespace,
        }
    }

    /// Whether the guard judges this operation: CREATE and UPDATE, for Pods too (a pod may gain
    /// tolerations, and a scheduling-gated pod node selectors and affinity, after it is
    /// created; an UPDATE that leaves the pod spec as it was is not judged again).
    pub fn judged_at(self, operation: &str) -> bool {
        matches!(operation, "CREATE" | "UPDATE")
    }
}

/// A workload decoded for the guard: its metadata and its pod templates.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    pub metadata: Metadata,
    /// Every pod spec of the object, in its order: one for a Pod and the single-template owners,
    /// one per replicatedJob for JobSets and Trainer runtimes (none when they list none).
    pub templates: Vec<PodTemplateView>,
}

/// One pod spec of a workload and where it is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodTemplateView {
    /// The pod spec's path, e.g. `spec.replicatedJobs[1].template.spec.template.spec`.
    pub path: FieldPath,
    /// The name of its replicatedJob (JobSets and Trainer runtimes), to tell the user which one.
    pub replicated_job: Option<String>,
    pub spec: PodSpecView,
}

/// Why an object could not be decoded for the guard.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the {kind}: {source}")]
pub struct DecodeError {
    pub kind: &'static str,
    #[source]
    pub source: JsonError,
}

impl Workload {
    /// Decodes the parts the guard reads from an object of `kind` in JSON. The pod specs are
    /// where the kind registry says ([`WorkloadKind::templates`]); each shape has its own
    /// decoder, and a test below holds each guarded kind's decoder to the registry's places.
    pub fn from_json(kind: GuardedKind, json: &str) -> Result<Self, DecodeError> {
        let decoded = match kind.info().templates {
            PodTemplates::One("/spec") => decode::from_json_str::<PodObject>(json)
                .map(|pod| Self::single(pod.metadata, "/spec", pod.spec)),
            PodTemplates::One(path @ "/spec/jobTemplate/spec/template/spec") => {
                decode::from_json_str::<CronJobObject>(json).map(|cron| {
                    Self::single(
                        cron.metadata,
                        path,
                        cron.spec.job_template.spec.template.spec,
                    )
                })
            }
            PodTemplates::One(path) => decode::from_json_str::<TemplateOwner>(json)
                .map(|owner| Self::single(owner.metadata, path, owner.spec.template.spec)),
            PodTemplates::PerReplicatedJob("/spec") => decode::from_json_str::<JobSetObject>(json)
                .map(|jobset| Self {
                    metadata: jobset.metadata,
                    templates: jobset.spec.templates(pointer_path("/spec")),
                }),
            // A runtime holds a whole JobSetSpec, the one the Trainer builds each TrainJob from.
            PodTemplates::PerReplicatedJob(path) => decode::from_json_str::<RuntimeObject>(json)
                .map(|runtime| Self {
                    metadata: runtime.metadata,
                    templates: runtime.spec.template.spec.templates(pointer_path(path)),
                }),
            // Nothing guarded is without pod templates (the registry's test).
            PodTemplates::None => decode::from_json_str::<MetadataOnly>(json).map(|object| Self {
                metadata: object.metadata,
                templates: Vec::new(),
            }),
        };
        decoded.map_err(|source| DecodeError {
            kind: kind.as_str(),
            source,
        })
    }

    /// A workload with one pod spec, at the JSON pointer `path`.
    fn single(metadata: Metadata, path: &str, spec: PodSpecView) -> Self {
        Self {
            metadata,
            templates: vec![PodTemplateView {
                path: pointer_path(path),
                replicated_job: None,
                spec,
            }],
        }
    }

    /// [`Workload::from_json`] from a decoded value (the CLI reads manifests into values).
    pub fn from_value(kind: GuardedKind, value: &serde_json::Value) -> Result<Self, DecodeError> {
        // Through text: one decoder, so the webhook and the CLI cannot read differently. A
        // manifest's null fields (`spec:` left empty) are dropped first, as the API server
        // drops them: a custom resource's before defaulting (CRD docs, "Defaulting and
        // Nullable"), a built-in type's as it decodes them into absent values; the webhook
        // never sees them.
        Self::from_json(kind, &without_null_fields(value).to_string())
    }
}

/// The field path of a JSON pointer (`/spec/template/spec`: `spec.template.spec`).
fn pointer_path(pointer: &str) -> FieldPath {
    FieldPath::new(pointer.split('/').skip(1))
}

/// `value` without the fields whose value is `null`, at every depth (list items are kept).
fn without_null_fields(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(_, field)| !field.is_null())
                .map(|(key, field)| (key.clone(), without_null_fields(field)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_null_fields).collect()),
        other => other.clone(),
    }
}

/// The object metadata the guard reads.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Metadata {
    pub name: Option<String>,
    pub generate_name: Option<String>,
    pub namespace: Option<String>,
    pub labels: Option<BTreeMap<String, String>>,
    pub annotations: Option<BTreeMap<String, String>>,
    pub owner_references: Option<Vec<OwnerReference>>,
    pub deletion_timestamp: Option<String>,
}

impl Metadata {
    /// The name, or the generateName prefix followed by `*` when the name is not set yet.
    pub fn display_name(&self) -> String {
        match (&self.name, &self.generate_name) {
            (Some(name), _) if !name.is_empty() => name.clone(),
            (_, Some(prefix)) => format!("{prefix}*"),
            _ => String::new(),
        }
    }

    /// The owner reference with `controller: true`, if any.
    pub fn controller(&self) -> Option<&OwnerReference> {
        self.owner_references
            .iter()
            .flatten()
            .find(|owner| owner.controller == Some(true))
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
}

/// An owner reference.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OwnerReference {
    pub kind: String,
    pub name: String,
    pub controller: Option<bool>,
}

/// The pod spec fields the guard reads.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpecView {
    pub priority: Option<i32>,
    pub priority_class_name: Option<String>,
    pub node_name: Option<String>,
    pub node_selector: Option<BTreeMap<String, String>>,
    pub affinity: Option<AffinityView>,
    pub tolerations: Option<Vec<Toleration>>,
    pub containers: Option<Vec<ContainerView>>,
    pub init_containers: Option<Vec<ContainerView>>,
    /// `resourceClaims`: the DRA claims its containers may name.
    pub resource_claims: Option<Vec<PodResourceClaim>>,
}

/// `affinity`: only the node affinity.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AffinityView {
    pub node_affinity: Option<NodeAffinityView>,
}

/// `affinity.nodeAffinity`: only the required part (preferences do not bind the scheduler).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct NodeAffinityView {
    #[serde(rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    pub required: Option<NodeSelector>,
}

/// A container: its name and the names of the resources it requests or limits.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ContainerView {
    pub name: String,
    pub resources: Option<ResourcesView>,
}

/// `resources`: the quantities are not read, only the names.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ResourcesView {
    pub requests: Option<BTreeMap<String, serde::de::IgnoredAny>>,
    pub limits: Option<BTreeMap<String, serde::de::IgnoredAny>>,
    /// DRA claims (`resources.claims`).
    pub claims: Option<Vec<ResourceClaim>>,
}

#[derive(Deserialize)]
struct PodObject {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: PodSpecView,
}

#[derive(Deserialize)]
struct MetadataOnly {
    #[serde(default)]
    metadata: Metadata,
}

#[derive(Deserialize)]
struct TemplateOwner {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: TemplateSpec,
}

#[derive(Default, Deserialize)]
struct TemplateSpec {
    #[serde(default)]
    template: PodTemplate,
}

#[derive(Default, Deserialize)]
struct PodTemplate {
    #[serde(default)]
    spec: PodSpecView,
}

#[derive(Deserialize)]
struct CronJobObject {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: CronJobSpec,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CronJobSpec {
    #[serde(default)]
    job_template: JobTemplate,
}

#[derive(Default, Deserialize)]
struct JobTemplate {
    #[serde(default)]
    spec: TemplateSpec,
}

#[derive(Deserialize)]
struct JobSetObject {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: JobSetSpec,
}

/// A JobSetSpec (of a JobSet, or in a Trainer runtime's `spec.template.spec`).
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct JobSetSpec {
    #[serde(default)]
    replicated_jobs: Option<Vec<ReplicatedJob>>,
}

impl JobSetSpec {
    /// The pod spec of each replicatedJob, its path under `spec_path` (the JobSetSpec's).
    fn templates(self, spec_path: FieldPath) -> Vec<PodTemplateView> {
        let list = spec_path.child("replicatedJobs");
        self.replicated_jobs
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(index, job)| PodTemplateView {
                path: list
                    .index(index)
                    .child("template")
                    .child("spec")
                    .child("template")
                    .child("spec"),
                replicated_job: Some(job.name),
                spec: job.template.spec.template.spec,
            })
            .collect()
    }
}

#[derive(Default, Deserialize)]
struct ReplicatedJob {
    #[serde(default)]
    name: String,
    #[serde(default)]
    template: JobTemplate,
}

#[derive(Deserialize)]
struct RuntimeObject {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: RuntimeSpec,
}

#[derive(Default, Deserialize)]
struct RuntimeSpec {
    #[serde(default)]
    template: JobSetTemplate,
}

/// A runtime's `spec.template`: a JobSetTemplateSpec.
#[derive(Default, Deserialize)]
struct JobSetTemplate {
    #[serde(default)]
    spec: JobSetSpec,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An object of `known` with one container `c` at each of its registry's pod spec places.
    fn object_with_a_container(known: &WorkloadKind) -> (serde_json::Value, String) {
        let pod_spec = json!({"containers": [{"name": "c"}]});
        let (pointer, spec_path) = match known.templates {
            PodTemplates::One(pointer) => (pointer.to_owned(), pointer_path(pointer)),
            PodTemplates::PerReplicatedJob(pointer) => (
                format!("{pointer}/replicatedJobs"),
                pointer_path(pointer)
                    .child("replicatedJobs")
                    .index(0)
                    .child("template")
                    .child("spec")
                    .child("template")
                    .child("spec"),
            ),
            PodTemplates::None => panic!("{} has no pod templates", known.kind),
        };
        let mut object = json!({"metadata": {"name": "w"}});
        let mut at = &mut object;
        let steps: Vec<&str> = pointer.split('/').skip(1).collect();
        for step in &steps {
            at = &mut at[*step];
        }
        *at = match known.templates {
            PodTemplates::PerReplicatedJob(_) => {
                json!([{"name": "workers", "template": {"spec": {"template": {"spec": pod_spec}}}}])
            }
            _ => pod_spec,
        };
        (object, spec_path.to_string())
    }

    #[test]
    fn every_guarded_kind_is_read_where_the_registry_puts_its_pod_templates() {
        let guarded: Vec<_> = kinds::KINDS.iter().filter(|known| known.guarded).collect();
        assert!(guarded.len() > 1);
        for known in guarded {
            let kind = GuardedKind::of(known.id).expect("a guarded kind");
            assert_eq!(kind.info(), known);
            assert_eq!(
                GuardedKind::from_gvk(known.group, known.version, known.kind),
                Some(kind)
            );
            let (object, spec_path) = object_with_a_container(known);
            let workload = Workload::from_value(kind, &object).expect("decodes");
            assert_eq!(workload.templates.len(), 1, "{}: {object}", known.kind);
            let template = &workload.templates[0];
            assert_eq!(template.path.to_string(), spec_path);
            let containers = template.spec.containers.as_deref().unwrap_or_default();
            assert_eq!(
                containers.len(),
                1,
                "{}: the container is not read",
                known.kind
            );
        }
        // What the registry does not mark guarded is not a guarded kind.
        for known in kinds::KINDS.iter().filter(|known| !known.guarded) {
            assert_eq!(GuardedKind::of(known.id), None, "{}", known.kind);
        }
    }

    #[test]
    fn a_manifests_null_fields_read_as_absent() {
        // JobSet's config/samples leave `spec:` empty; hand-written manifests leave lists empty.
        let empty = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "empty", "labels": null}, "spec": null});
        let workload = Workload::from_value(GuardedKind::JobSet, &empty).expect("read");
        assert!(workload.templates.is_empty());
        assert_eq!(workload.metadata.name.as_deref(), Some("empty"));

        let pod = json!({"metadata": {"name": "p"}, "spec": {"tolerations": null,
            "containers": [{"name": "c", "resources": {"limits": null}}]}});
        let workload = Workload::from_value(GuardedKind::Pod, &pod).expect("read");
        assert_eq!(workload.templates[0].spec.tolerations, None);
        assert_eq!(
            without_null_fields(&json!({"a": [null, {"b": null, "c": 1}]})),
            json!({"a": [null, {"c": 1}]})
        );
    }
}
