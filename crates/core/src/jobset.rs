//! The JobSet API (`jobset.x-k8s.io/v1alpha2`) as gpu-guard reads and writes it: a JobSet's
//! `spec`, which is also the `spec.template.spec` of a Kubeflow Trainer runtime
//! (`trainer.kubeflow.org/v1alpha1` TrainingRuntime and ClusterTrainingRuntime hold a JobSet
//! template). The rules JobSet's webhook enforces on it are [`crate::api_rules::jobset`].
//!
//! Read from kubernetes-sigs/jobset v0.12.0 (commit f22e565a):
//! `api/jobset/v1alpha2/jobset_types.go` (FailurePolicy L475-495, FailurePolicyRule L437-473,
//! ReplicatedJob L320-354); `pkg/webhooks/jobset_webhook.go` `Default()` L111-161 (an unnamed
//! failure-policy rule is named `failurePolicyRule<index>`).

use k8s_openapi::api::batch::v1::JobTemplateSpec;
use serde::{Deserialize, Deserializer, Serialize};

/// The API group of JobSet.
pub const GROUP: &str = "jobset.x-k8s.io";
/// `apiVersion` of the JobSets gpu-guard reads.
pub const API_VERSION: &str = "jobset.x-k8s.io/v1alpha2";
/// The label JobSet puts on its child Jobs (and their pods) naming the JobSet.
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";

/// `spec` of a JobSet (and `spec.template.spec` of a Kubeflow Trainer runtime): the parts
/// gpu-guard reads. Unknown fields are ignored when reading; gpu-guard's patches touch only the
/// paths it owns, so they survive.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JobSetSpec {
    #[serde(deserialize_with = "null_as_default")]
    pub replicated_jobs: Vec<ReplicatedJob>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<JobSetFailurePolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}

/// One replicated Job: a Job template run `replicas` times.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReplicatedJob {
    #[serde(deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(deserialize_with = "null_as_default")]
    pub template: JobTemplateSpec,
}

/// `spec.failurePolicy` of a JobSet (JobSet's `FailurePolicy`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JobSetFailurePolicy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_strategy: Option<String>,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub rules: Vec<JobSetFailurePolicyRule>,
}

/// One rule of a JobSet's failure policy (JobSet's `FailurePolicyRule`): what the JobSet does when a child Job fails with one of the
/// reasons (and, since JobSet v0.10, messages) it names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JobSetFailurePolicyRule {
    #[serde(deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(deserialize_with = "null_as_default")]
    pub action: String,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub on_job_failure_reasons: Vec<String>,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub on_job_failure_message_patterns: Vec<String>,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub target_replicated_jobs: Vec<String>,
}

/// A field given as `null` reads as absent. The API server prunes the null fields of a custom
/// resource before defaulting unless its schema says `nullable` (Kubernetes CRD docs,
/// "Defaulting and Nullable"; JobSet's CRD says it nowhere), so JobSet's webhook and
/// controller never see them, and manifests written with an empty key (`rules:`) are accepted.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The name JobSet's defaulting webhook gives an unnamed rule at `index`.
pub fn default_rule_name(index: usize) -> String {
    format!("failurePolicyRule{index}")
}
