//! What the JobSet engine reads of a raw JobSet or Kubeflow Trainer runtime, decoded in one pass
//! over its JSON text: the object's metadata, the JobSet spec with each replicated Job's
//! template as the Job engine reads it ([`job_view`](super::job_view)), and the skeleton of the
//! raw object the patch is derived from and checked against. The webhook's JobSet fast path, as
//! [`job_view`](super::job_view) is the Job's: no `serde_json::Value` of the whole object, and
//! no typed copy of the containers' env, volumes or `managedFields`.
//!
//! The skeleton holds what [`jobset_operations`](super::patch::jobset_operations) looks at:
//! `metadata.annotations`; at the JobSet spec, every replicated Job (by index) with the Job
//! skeleton of its `template`; and the JobSet's own `failurePolicy` whole (its rules are copied
//! into the patch with their unknown fields). A property test proves the patch is the same as
//! from the whole object.

use k8s_openapi::api::batch::v1::JobTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::job_view::{RawMetadata, RawSpec, found_type, job_spec, metadata};
use super::object::MutableKind;
use crate::decode::{self, JsonError};
use crate::jobset::{JobSetFailurePolicy, JobSetSpec, ReplicatedJob};

/// A raw JobSet (or Trainer runtime) as the JobSet engine sees it.
#[derive(Debug)]
pub struct JobSetView {
    /// The object's metadata: name, namespace, labels and annotations.
    pub metadata: ObjectMeta,
    /// The JobSet spec, each template with only the fields the Job engine reads.
    pub spec: JobSetSpec,
    /// The paths of the raw object the patch builder looks at (see the module docs).
    pub skeleton: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawObject {
    api_version: Option<String>,
    kind: Option<String>,
    metadata: Option<RawMetadata>,
    spec: Option<RawJobSetSpec>,
}

/// A JobSet's `spec`, or a Trainer runtime's (whose `template.spec` is a JobSet spec): one
/// type reads both, each kind reads its own fields.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawJobSetSpec {
    replicated_jobs: Option<Vec<RawReplicatedJob>>,
    failure_policy: Option<Value>,
    suspend: Option<bool>,
    template: Option<RawRuntimeTemplate>,
}

#[derive(Deserialize)]
struct RawRuntimeTemplate {
    spec: Option<Box<RawJobSetSpec>>,
}

#[derive(Deserialize)]
struct RawReplicatedJob {
    name: Option<String>,
    replicas: Option<i32>,
    template: Option<RawJobTemplate>,
}

#[derive(Deserialize)]
struct RawJobTemplate {
    metadata: Option<RawMetadata>,
    spec: Option<RawSpec>,
}

/// Decodes a raw object of `kind` (a JobSet or a Trainer runtime) from its JSON text into what
/// the JobSet engine reads. An object whose own `apiVersion` and `kind` are not `kind`'s is an
/// error, as for a Job.
pub fn decode(raw: &str, kind: MutableKind) -> Result<JobSetView, JsonError> {
    let raw: RawObject = decode::from_json_str(raw)?;
    let found = raw
        .api_version
        .as_deref()
        .zip(raw.kind.as_deref())
        .and_then(|(api_version, kind)| {
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            MutableKind::from_gvk(group, version, kind)
        });
    if found != Some(kind) || kind.jobset_spec_root().is_none() {
        // The error says what was expected (`does not decode as a jobset.x-k8s.io/...`).
        return Err(JsonError::custom(format!(
            "found {}",
            found_type(raw.api_version.as_deref(), raw.kind.as_deref())
        )));
    }

    let mut skeleton = Map::new();
    let metadata = metadata(raw.metadata, &mut skeleton);
    let mut spec = JobSetSpec::default();
    if let Some(raw_spec) = raw.spec {
        let fields = match kind {
            MutableKind::JobSet => jobset_spec(raw_spec, &mut spec, "spec")?,
            _ => {
                // A Trainer runtime: the JobSet spec is at spec.template.spec.
                let mut template_fields = Map::new();
                if let Some(template) = raw_spec.template {
                    let mut inner = Map::new();
                    if let Some(jobset) = template.spec {
                        inner = jobset_spec(*jobset, &mut spec, "spec.template.spec")?;
                    }
                    template_fields.insert("template".to_owned(), object(inner, "spec"));
                }
                template_fields
            }
        };
        skeleton.insert("spec".to_owned(), Value::Object(fields));
    }
    Ok(JobSetView {
        metadata,
        spec,
        skeleton: Value::Object(skeleton),
    })
}

/// `{key: fields}`.
fn object(fields: Map<String, Value>, key: &str) -> Value {
    Value::Object(Map::from_iter([(key.to_owned(), Value::Object(fields))]))
}

/// Fills `spec` from a raw JobSet spec found at `path`; returns the spec's skeleton.
fn jobset_spec(
    raw: RawJobSetSpec,
    spec: &mut JobSetSpec,
    path: &str,
) -> Result<Map<String, Value>, JsonError> {
    let mut fields = Map::new();
    if let Some(replicated) = raw.replicated_jobs {
        let mut items = Vec::with_capacity(replicated.len());
        for replica in replicated {
            let mut item = Map::new();
            let mut template = JobTemplateSpec::default();
            if let Some(raw_template) = replica.template {
                let mut template_fields = Map::new();
                if raw_template.metadata.is_some() {
                    template.metadata = Some(metadata(raw_template.metadata, &mut template_fields));
                }
                if let Some(raw_job) = raw_template.spec {
                    let (job, job_fields) = job_spec(raw_job);
                    template_fields.insert("spec".to_owned(), job_fields);
                    template.spec = Some(job);
                }
                item.insert("template".to_owned(), Value::Object(template_fields));
            }
            items.push(Value::Object(item));
            spec.replicated_jobs.push(ReplicatedJob {
                name: replica.name.unwrap_or_default(),
                replicas: replica.replicas,
                template,
            });
        }
        fields.insert("replicatedJobs".to_owned(), Value::Array(items));
    }
    if let Some(policy) = raw.failure_policy {
        spec.failure_policy = Some(
            decode::from_json_value::<JobSetFailurePolicy>(&policy)
                .map_err(|error| error.under(&format!("{path}.failurePolicy")))?,
        );
        fields.insert("failurePolicy".to_owned(), policy);
    }
    spec.suspend = raw.suspend;
    Ok(fields)
}
