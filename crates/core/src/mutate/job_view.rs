//! What the engine reads of a raw Job, decoded in one pass over its JSON text: the typed Job
//! the engine sees, and the skeleton of the raw object the patch is derived from and checked
//! against.
//!
//! The engine reads a Job's labels and annotations, a few spec fields, the pod template's
//! annotations, restart policy, grace period, tolerations and DRA claims, and each container's name,
//! restart policy, restart rules and resources. An API server object is mostly other things
//! (`managedFields`, env vars,
//! volumes, affinity, status): they are skipped unread here, which is most of the webhook's
//! saving over decoding the whole Job. The Job handed to the engine has only the fields it
//! reads; a property test proves the patch is the same as from the whole object.
//!
//! The skeleton holds `metadata.annotations`, `spec.template.metadata.annotations`,
//! `spec.podFailurePolicy.rules` (its length),
//! `spec.template.spec.tolerations` (its length), `spec.template.spec.containers` (one object
//! per container, with its `restartPolicyRules` by length) and their parents, each present
//! exactly when it is present and not null in the raw object: the paths the patch builder
//! looks at.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec, PodFailurePolicy, PodFailurePolicyRule};
use k8s_openapi::api::core::v1::{
    Container, ContainerRestartRule, PodResourceClaim, PodSpec, PodTemplateSpec,
    ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::decode::{self, JsonError};

/// A raw Job as the engine sees it.
#[derive(Debug)]
pub struct JobView {
    /// The Job with only the fields the engine reads.
    pub job: Job,
    /// The paths of the raw object the patch builder looks at (see the module docs).
    pub skeleton: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawJob {
    api_version: Option<String>,
    kind: Option<String>,
    metadata: Option<RawMetadata>,
    spec: Option<RawSpec>,
}

#[derive(Deserialize)]
pub(super) struct RawMetadata {
    name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

/// A Job's `spec` (a Job's, or a JobSet's replicated Job template's).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawSpec {
    active_deadline_seconds: Option<i64>,
    // Read for JobSet's `InPlaceRestart` checks (`rules::jobset`), never changed.
    backoff_limit: Option<i32>,
    completions: Option<i32>,
    parallelism: Option<i32>,
    backoff_limit_per_index: Option<i32>,
    completion_mode: Option<String>,
    pod_failure_policy: Option<RawFailurePolicy>,
    pod_replacement_policy: Option<String>,
    template: Option<RawTemplate>,
}

#[derive(Deserialize)]
struct RawFailurePolicy {
    rules: Option<Vec<PodFailurePolicyRule>>,
}

#[derive(Deserialize)]
struct RawTemplate {
    metadata: Option<RawTemplateMetadata>,
    spec: Option<RawPod>,
}

/// A pod template's metadata: its annotations (gpu-guard marks a gang's pods there).
#[derive(Deserialize)]
struct RawTemplateMetadata {
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawPod {
    #[serde(default)]
    containers: Vec<RawContainer>,
    init_containers: Option<Vec<RawContainer>>,
    restart_policy: Option<String>,
    termination_grace_period_seconds: Option<i64>,
    tolerations: Option<Vec<Toleration>>,
    resource_claims: Option<Vec<PodResourceClaim>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawContainer {
    name: String,
    restart_policy: Option<String>,
    restart_policy_rules: Option<Vec<ContainerRestartRule>>,
    resources: Option<ResourceRequirements>,
}

impl RawContainer {
    /// The container's skeleton: `{}`, or `{"restartPolicyRules": [{}, ...]}`.
    fn skeleton(&self) -> Value {
        let mut fields = Map::new();
        if let Some(rules) = &self.restart_policy_rules {
            fields.insert("restartPolicyRules".to_owned(), items(rules.len()));
        }
        Value::Object(fields)
    }

    fn into_container(self) -> Container {
        Container {
            name: self.name,
            restart_policy: self.restart_policy,
            restart_policy_rules: self.restart_policy_rules,
            resources: self.resources,
            ..Container::default()
        }
    }
}

/// Decodes a raw `batch/v1` Job's JSON text into what the engine reads.
pub fn decode(raw: &str) -> Result<JobView, JsonError> {
    let raw: RawJob = decode::from_json_str(raw)?;
    match (raw.api_version.as_deref(), raw.kind.as_deref()) {
        (Some("batch/v1"), Some("Job")) => {}
        (api_version, kind) => {
            // The error says what was expected (`does not decode as a batch/v1 Job`).
            return Err(JsonError::custom(format!(
                "found {}",
                found_type(api_version, kind)
            )));
        }
    }

    let mut skeleton = Map::new();
    let metadata = metadata(raw.metadata, &mut skeleton);
    let spec = raw.spec.map(|raw_spec| {
        let (spec, fields) = job_spec(raw_spec);
        skeleton.insert("spec".to_owned(), fields);
        spec
    });
    Ok(JobView {
        job: Job {
            metadata,
            spec,
            status: None,
        },
        skeleton: Value::Object(skeleton),
    })
}

/// What an object says it is, for a message: `apiVersion "v1" and kind "Job"`, `no
/// apiVersion and kind "Job"`.
pub(super) fn found_type(api_version: Option<&str>, kind: Option<&str>) -> String {
    let say = |name: &str, value: Option<&str>| match value {
        Some(value) => format!("{name} {value:?}"),
        None => format!("no {name}"),
    };
    format!(
        "{} and {}",
        say("apiVersion", api_version),
        say("kind", kind)
    )
}

/// The metadata the engine reads; puts `metadata` (with `annotations` when present) into
/// `skeleton` when the object has metadata.
pub(super) fn metadata(raw: Option<RawMetadata>, skeleton: &mut Map<String, Value>) -> ObjectMeta {
    let Some(raw) = raw else {
        return ObjectMeta::default();
    };
    let mut fields = Map::new();
    if raw.annotations.is_some() {
        fields.insert("annotations".to_owned(), Value::Object(Map::new()));
    }
    skeleton.insert("metadata".to_owned(), Value::Object(fields));
    ObjectMeta {
        name: raw.name,
        namespace: raw.namespace,
        labels: raw.labels,
        annotations: raw.annotations,
        ..ObjectMeta::default()
    }
}

/// The Job spec the engine reads, and its skeleton.
pub(super) fn job_spec(raw_spec: RawSpec) -> (JobSpec, Value) {
    let mut fields = Map::new();
    let pod_failure_policy = raw_spec.pod_failure_policy.map(|policy| {
        let mut policy_fields = Map::new();
        if let Some(rules) = &policy.rules {
            policy_fields.insert("rules".to_owned(), items(rules.len()));
        }
        fields.insert("podFailurePolicy".to_owned(), Value::Object(policy_fields));
        PodFailurePolicy {
            rules: policy.rules.unwrap_or_default(),
        }
    });
    let mut template = PodTemplateSpec::default();
    if let Some(raw_template) = raw_spec.template {
        let mut template_fields = Map::new();
        if let Some(metadata) = raw_template.metadata {
            let mut metadata_fields = Map::new();
            if metadata.annotations.is_some() {
                metadata_fields.insert("annotations".to_owned(), Value::Object(Map::new()));
            }
            template_fields.insert("metadata".to_owned(), Value::Object(metadata_fields));
            template.metadata = Some(ObjectMeta {
                annotations: metadata.annotations,
                ..ObjectMeta::default()
            });
        }
        if let Some(pod) = raw_template.spec {
            let mut pod_fields = Map::new();
            if let Some(tolerations) = &pod.tolerations {
                pod_fields.insert("tolerations".to_owned(), items(tolerations.len()));
            }
            if !pod.containers.is_empty() {
                let containers = pod.containers.iter().map(RawContainer::skeleton).collect();
                pod_fields.insert("containers".to_owned(), Value::Array(containers));
            }
            template_fields.insert("spec".to_owned(), Value::Object(pod_fields));
            template.spec = Some(PodSpec {
                containers: pod
                    .containers
                    .into_iter()
                    .map(RawContainer::into_container)
                    .collect(),
                init_containers: pod.init_containers.map(|containers| {
                    containers
                        .into_iter()
                        .map(RawContainer::into_container)
                        .collect()
                }),
                restart_policy: pod.restart_policy,
                termination_grace_period_seconds: pod.termination_grace_period_seconds,
                tolerations: pod.tolerations,
                resource_claims: pod.resource_claims,
                ..PodSpec::default()
            });
        }
        fields.insert("template".to_owned(), Value::Object(template_fields));
    }
    let spec = JobSpec {
        active_deadline_seconds: raw_spec.active_deadline_seconds,
        backoff_limit: raw_spec.backoff_limit,
        backoff_limit_per_index: raw_spec.backoff_limit_per_index,
        completion_mode: raw_spec.completion_mode,
        completions: raw_spec.completions,
        parallelism: raw_spec.parallelism,
        pod_failure_policy,
        pod_replacement_policy: raw_spec.pod_replacement_policy,
        template,
        ..JobSpec::default()
    };
    (spec, Value::Object(fields))
}

/// An array of `count` empty objects: the skeleton of a list whose items the patch may reach
/// into (`tolerations/2/tolerationSeconds`) or insert before (`rules/0`).
fn items(count: usize) -> Value {
    Value::Array(vec![Value::Object(Map::new()); count])
}
