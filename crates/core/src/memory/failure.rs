//! PURE: whose is a pod's failure: the workload whose record it goes to.

use k8s_openapi::api::core::v1::Pod;

use crate::jobset::JOBSET_NAME_LABEL;

/// The label the Job controller puts on its pods with the Job's name (kubernetes
/// `pkg/controller/job`, `batch.kubernetes.io/job-name`; `job-name` before 1.27, still set).
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
const LEGACY_JOB_NAME_LABEL: &str = "job-name";

/// The kind of a workload that keeps a memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    Job,
    JobSet,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Job => "Job",
            Self::JobSet => "JobSet",
        }
    }
}

/// The workload whose memory a pod's failures go to: its JobSet when it is a JobSet's (a gang
/// restart deletes the child Jobs), else its Job.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkloadRef {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// The workload of a pod the Job controller created; `None` for any other pod.
pub fn workload_of(pod: &Pod) -> Option<WorkloadRef> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let labels = pod.metadata.labels.as_ref();
    let label = |key: &str| {
        labels
            .and_then(|labels| labels.get(key))
            .filter(|value| !value.is_empty())
            .cloned()
    };
    let job = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| {
            owner.controller == Some(true) && owner.kind == "Job" && owner.api_version == "batch/v1"
        })
        .map(|owner| owner.name.clone())
        .or_else(|| label(JOB_NAME_LABEL))
        .or_else(|| label(LEGACY_JOB_NAME_LABEL))?;
    Some(match label(JOBSET_NAME_LABEL) {
        Some(jobset) => WorkloadRef {
            kind: WorkloadKind::JobSet,
            namespace,
            name: jobset,
        },
        None => WorkloadRef {
            kind: WorkloadKind::Job,
            namespace,
            name: job,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "train-0-abcde", "namespace": "ml",
                "labels": {"batch.kubernetes.io/job-name": "train"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                     "uid": "u1", "controller": true}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_belongs_to_its_jobset_else_its_job() {
        let mut pod = pod();
        assert_eq!(
            workload_of(&pod),
            Some(WorkloadRef {
                kind: WorkloadKind::Job,
                namespace: "ml".into(),
                name: "train".into()
            })
        );
        pod.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(JOBSET_NAME_LABEL.into(), "llm".into());
        assert_eq!(workload_of(&pod).unwrap().to_string(), "JobSet ml/llm");
        pod.metadata.labels = None;
        pod.metadata.owner_references = None;
        assert_eq!(workload_of(&pod), None);
    }
}
