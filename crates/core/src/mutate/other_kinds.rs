//! PURE: what becomes of the device workloads of kinds the engine does not mutate.
//!
//! About a third of the GPU workloads in public examples are kinds of other operators: MPI,
//! PyTorch and the other Kubeflow v1 jobs, LeaderWorkerSet, Volcano, Ray. Each runs its pods its
//! own way, and a podFailurePolicy exists only on a `batch/v1` Job, so what gpu-guard can do for
//! them depends on what their operator creates. `gpu-guard mutate` and `check` say it per object
//! instead of passing them over in silence (docs/mutation.md#what-is-not-handled).
//!
//! A Kubeflow Trainer `TrainJob` is protected, but not by itself: Trainer builds a JobSet from the
//! runtime it names, and gpu-guard mutates that runtime and that JobSet.
//!
//! The kinds themselves, with what protects their pods, are listed in [`crate::kinds`].

use serde_json::Value;

use crate::kinds::{self, Kind, OPERATOR_KINDS, OperatorKind};

/// The entry for an object's `apiVersion` and `kind`, if it is one of [`OPERATOR_KINDS`] (any
/// version of the group).
pub fn other_kind(object: &Value) -> Option<&'static OperatorKind> {
    let (group, kind) = group_and_kind(object)?;
    OPERATOR_KINDS
        .iter()
        .find(|other| other.group == group && other.kinds.contains(&kind))
}

/// The runtime a Kubeflow Trainer `TrainJob` names, when the object is one:
/// `spec.runtimeRef`, whose `kind` defaults to `ClusterTrainingRuntime` (trainer
/// `pkg/apis/trainer/v1alpha1/trainjob_types.go`, `RuntimeRef`).
pub fn trainjob_runtime(object: &Value) -> Option<RuntimeRef> {
    let (group, kind) = group_and_kind(object)?;
    // Any version of Trainer's group: the runtime reference has kept its shape.
    let trainjob = Kind::TrainJob.info();
    if group != trainjob.group || kind != trainjob.kind {
        return None;
    }
    let reference = object.pointer("/spec/runtimeRef");
    let text = |key: &str| {
        reference
            .and_then(|r| r.get(key))
            .and_then(Value::as_str)
            .filter(|value| !value.is_empty())
    };
    Some(RuntimeRef {
        kind: text("kind").unwrap_or("ClusterTrainingRuntime").to_owned(),
        name: text("name").map(str::to_owned),
    })
}

/// The runtime a TrainJob names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeRef {
    /// `TrainingRuntime` or `ClusterTrainingRuntime`.
    pub kind: String,
    /// `None` when the TrainJob names none (the API server refuses it).
    pub name: Option<String>,
}

impl RuntimeRef {
    /// What protects a TrainJob that names this runtime; `known` says what gpu-guard found of
    /// the runtime, when it found it (`protected: ...` or `not protected: ...`).
    pub fn describe(&self, known: Option<&str>) -> String {
        let Some(name) = &self.name else {
            return "not mutated: it names no runtime (spec.runtimeRef.name), so Trainer builds \
                    nothing from it"
                .to_owned();
        };
        let runtime = format!("{} {name}", self.kind);
        let found = match known {
            Some(status) => format!("{runtime} is {status}"),
            None => format!(
                "{runtime} is not in the input: check it with `gpu-guard mutate --diff` on its \
                 manifest"
            ),
        };
        format!(
            "not mutated itself: Kubeflow Trainer builds its JobSet from {runtime}, so the \
             runtime's protection is the TrainJob's (docs/gang.md#kubeflow-trainer); {found}"
        )
    }
}

fn group_and_kind(object: &Value) -> Option<(&str, &str)> {
    let (api_version, kind) = kinds::api_version_and_kind(object)?;
    Some((kinds::split_api_version(api_version).0, kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_operators_kinds_are_named_by_group_and_kind_in_any_version() {
        for (api_version, kind, operator) in [
            ("kubeflow.org/v2beta1", "MPIJob", "MPI Operator"),
            ("kubeflow.org/v1", "PyTorchJob", "Training Operator"),
            (
                "leaderworkerset.x-k8s.io/v1",
                "LeaderWorkerSet",
                "StatefulSets",
            ),
            ("batch.volcano.sh/v1alpha1", "Job", "Volcano"),
            ("ray.io/v1", "RayJob", "KubeRay"),
        ] {
            let object = json!({"apiVersion": api_version, "kind": kind});
            let found = other_kind(&object).unwrap_or_else(|| panic!("{api_version} {kind}"));
            assert!(found.why.contains(operator), "{kind}: {}", found.why);
        }
        // A batch/v1 Job is the engine's, not Volcano's; an unknown kind is not named.
        assert_eq!(
            other_kind(&json!({"apiVersion": "batch/v1", "kind": "Job"})),
            None
        );
        assert_eq!(
            other_kind(&json!({"apiVersion": "example.com/v1", "kind": "MPIJob"})),
            None
        );
        assert_eq!(other_kind(&json!({"kind": "MPIJob"})), None);
    }

    #[test]
    fn a_trainjob_names_its_runtime_and_whether_it_is_protected() {
        let trainjob = json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "spec": {"runtimeRef": {"name": "torch-distributed"}}});
        let runtime = trainjob_runtime(&trainjob).expect("a TrainJob");
        assert_eq!(
            runtime,
            RuntimeRef {
                kind: "ClusterTrainingRuntime".to_owned(),
                name: Some("torch-distributed".to_owned()),
            }
        );
        let unknown = runtime.describe(None);
        assert!(
            unknown.contains("ClusterTrainingRuntime torch-distributed is not in the input"),
            "{unknown}"
        );
        let known = runtime.describe(Some("protected: gpu-guard mutates it"));
        assert!(
            known.ends_with(
                "ClusterTrainingRuntime torch-distributed is protected: gpu-guard \
                             mutates it"
            ),
            "{known}"
        );

        let namespaced = json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "spec": {"runtimeRef": {"name": "mine", "kind": "TrainingRuntime"}}});
        assert_eq!(
            trainjob_runtime(&namespaced).unwrap().kind,
            "TrainingRuntime"
        );
        let nameless = json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "spec": null});
        assert!(
            trainjob_runtime(&nameless)
                .unwrap()
                .describe(None)
                .contains("names no runtime")
        );
        assert_eq!(
            trainjob_runtime(&json!({"apiVersion": "batch/v1", "kind": "Job"})),
            None
        );
    }
}
