//! PURE: every workload kind gpu-guard knows, in one table: its API group, version, kind and
//! resource, whether the mutating webhook changes it and the validating webhook judges it, and
//! where its pod templates are. The mutation engine, the guard, the webhook registrations of
//! the installation, the webhook's metrics and the CLI read this table, so adding a kind here
//! is the one change that makes all of them know it.
//!
//! The kinds of other operators (MPI, Kubeflow v1, LeaderWorkerSet, Volcano, Ray), which
//! gpu-guard neither mutates nor judges but names with what protects their pods, are
//! [`OPERATOR_KINDS`].

use serde_json::Value;

/// A kind of [`KINDS`], to match on. Its facts are [`Kind::info`]: each variant has its row in
/// [`KINDS`], in this order (checked when compiling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Pod,
    ReplicationController,
    PodTemplate,
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    Job,
    CronJob,
    JobSet,
    TrainingRuntime,
    ClusterTrainingRuntime,
    TrainJob,
}

/// Whether objects of a kind live in a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    /// Cluster-scoped: a webhook's `namespaceSelector` does not filter it.
    Cluster,
}

impl Scope {
    /// As the API names it (a CRD's `scope`, a webhook rule's `scope`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Namespaced => "Namespaced",
            Self::Cluster => "Cluster",
        }
    }
}

/// Where the pod specs of an object are, as JSON pointers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodTemplates {
    /// One pod spec, at this pointer.
    One(&'static str),
    /// A JobSetSpec at this pointer: one pod spec per replicatedJob, at
    /// `replicatedJobs/<i>/template/spec/template/spec` under it (jobset
    /// `api/jobset/v1alpha2/jobset_types.go`, `ReplicatedJob.Template` is a JobTemplateSpec).
    PerReplicatedJob(&'static str),
    /// None of its own (a TrainJob's pods come from the runtime it names).
    None,
}

/// One workload kind and what gpu-guard does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkloadKind {
    pub id: Kind,
    /// The API group (`""`: the core group).
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// The resource (plural) the API server and the webhook rules name it by.
    pub resource: &'static str,
    /// The kind with its API group and version, for messages (`batch/v1 Job`).
    pub api_name: &'static str,
    pub scope: Scope,
    /// A kind of Kubernetes itself (not of a CustomResourceDefinition).
    pub built_in: bool,
    /// Whether the mutation engine changes it (the mutating webhook's rules).
    pub mutated: bool,
    /// Whether the guard judges it (the validating webhook's rules).
    pub guarded: bool,
    /// Whether the mutating webhook decides where it may run at CREATE: a pod the Job
    /// controller creates is kept off the nodes where its workload's devices failed
    /// ([`crate::memory::avoid`]; its own webhook, for Job pods only).
    pub placed: bool,
    pub templates: PodTemplates,
}

impl WorkloadKind {
    /// Whether the webhooks handle it (it is mutated, placed or judged).
    pub fn handled(&self) -> bool {
        self.mutated || self.placed || self.guarded
    }
}

/// A pod template owner's pod spec (`spec.template` is a PodTemplateSpec).
const OWNER: PodTemplates = PodTemplates::One("/spec/template/spec");
/// A Trainer runtime's JobSet spec (trainer `pkg/apis/trainer/v1alpha1/trainingruntime_types.go`:
/// `spec.template` is a JobSetTemplateSpec).
const RUNTIME: PodTemplates = PodTemplates::PerReplicatedJob("/spec/template/spec");

/// Every kind gpu-guard knows, in the order of [`Kind`] (the webhook rules list them in this
/// order, grouped by API group and version).
pub const KINDS: [WorkloadKind; 13] = [
    WorkloadKind {
        id: Kind::Pod,
        group: "",
        version: "v1",
        kind: "Pod",
        resource: "pods",
        api_name: "v1 Pod",
        scope: Scope::Namespaced,
        built_in: true,
        mutated: false,
        guarded: true,
        placed: true,
        templates: PodTemplates::One("/spec"),
    },
    WorkloadKind {
        id: Kind::ReplicationController,
        group: "",
        version: "v1",
        kind: "ReplicationController",
        resource: "replicationcontrollers",
        api_name: "v1 ReplicationController",
        scope: Scope::Namespaced,
        built_in: true,
        mutated: false,
        guarded: true,
        placed: false,
        templates: OWNER,
    },
    // Carries a pod template but runs nothing: neither mutated nor judged.
    WorkloadKind {
        id: Kind::PodTemplate,
        group: "",
        version: "v1",
        kind: "PodTemplate",
        resource: "podtemplates",
        api_name: "v1 PodTemplate",
        scope: Scope::Namespaced,
        built_in: true,
        mutated: false,
        guarded: false,
        placed: false,
        templates: PodTemplates::One("/template/spec"),
    },
    WorkloadKind {
        id: Kind::Deployment,
        group: "apps",
        version: "v1",
        kind: "Deployment",
        resource: "deployments",
        api_name: "apps/v1 Deployment",
        scope: Scope::Namespaced,
        built_in: true,
        mutated: false,
        guarded: true,
        placed: false,
        templates: OWNER,
    },
    WorkloadKind {
        id: Kind::StatefulSet,
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        resource: "statefulsets",
        api_name: "apps/v1 StatefulSet",
        scope: Scope::Namespaced,
        built_in: true,
        mutated: false,
        guarded: true,
        placed: false,
        templates: OWNER,
    },
    WorkloadKind {
        id: Kind::DaemonSet,
        group: "apps",
        version: "v1",
        kind: "DaemonSet",
        resource: "daemonsets",
        api_name: "apps/v1 DaemonSet",
        scope: Scope::Namespaced,
        built_in: true,
        mutated: false,
        guarded: true,
        placed: false,
        templates: OWNER,
    },
    WorkloadKind {
        id: Kind::ReplicaSet,
        group: "apps",
        version: "v1",
        kind: "ReplicaSet",
        resource: "replicasets",
        api_name: "apps/v1 ReplicaSet",
        scope: Scope::Namespaced,
        built_in: true,
        mutated: false,
        guarded: true,
        placed: false,
        templates: OWNER,
    },
    WorkloadKind {
        id: Kind::Job,
        group: "batch",
        version: "v1",
        kind: "Job",
        resource: "jobs",
        api_name: "batch/v1 Job",
        scope: Scope::Namespaced,
        built_in: true,
        mutated: true,
        guarded: true,
        placed: false,
        templates: OWNER,
    },
    // Mutated in its `jobTemplate`, so the protection is visible on the CronJob.
    WorkloadKind {
        id: Kind::CronJob,
        group: "batch",
        version: "v1",
        kind: "CronJob",
        resource: "cronjobs",
        api_name: "batch/v1 CronJob",
        scope: Scope::Namespaced,
        built_in: true,
        mutated: true,
        guarded: true,
        placed: false,
        templates: PodTemplates::One("/spec/jobTemplate/spec/template/spec"),
    },
    WorkloadKind {
        id: Kind::JobSet,
        group: "jobset.x-k8s.io",
        version: "v1alpha2",
        kind: "JobSet",
        resource: "jobsets",
        api_name: "jobset.x-k8s.io/v1alpha2 JobSet",
        scope: Scope::Namespaced,
        built_in: false,
        mutated: true,
        guarded: true,
        placed: false,
        templates: PodTemplates::PerReplicatedJob("/spec"),
    },
    // A runtime's JobSet template is the template of every TrainJob that names it.
    WorkloadKind {
        id: Kind::TrainingRuntime,
        group: "trainer.kubeflow.org",
        version: "v1alpha1",
        kind: "TrainingRuntime",
        resource: "trainingruntimes",
        api_name: "trainer.kubeflow.org/v1alpha1 TrainingRuntime",
        scope: Scope::Namespaced,
        built_in: false,
        mutated: true,
        guarded: true,
        placed: false,
        templates: RUNTIME,
    },
    WorkloadKind {
        id: Kind::ClusterTrainingRuntime,
        group: "trainer.kubeflow.org",
        version: "v1alpha1",
        kind: "ClusterTrainingRuntime",
        resource: "clustertrainingruntimes",
        api_name: "trainer.kubeflow.org/v1alpha1 ClusterTrainingRuntime",
        scope: Scope::Cluster,
        built_in: false,
        mutated: true,
        guarded: true,
        placed: false,
        templates: RUNTIME,
    },
    // Protected through the runtime it names (`crate::mutate::other_kinds`), not by itself.
    WorkloadKind {
        id: Kind::TrainJob,
        group: "trainer.kubeflow.org",
        version: "v1alpha1",
        kind: "TrainJob",
        resource: "trainjobs",
        api_name: "trainer.kubeflow.org/v1alpha1 TrainJob",
        scope: Scope::Namespaced,
        built_in: false,
        mutated: false,
        guarded: false,
        placed: false,
        templates: PodTemplates::None,
    },
];

// Each row of KINDS is at the index of its `id`, so `Kind::info` can index the table.
const _: () = {
    let mut index = 0;
    while index < KINDS.len() {
        assert!(
            KINDS[index].id as usize == index,
            "KINDS is not in the order of Kind"
        );
        index += 1;
    }
};

impl Kind {
    /// Its entry in [`KINDS`].
    pub fn info(self) -> &'static WorkloadKind {
        &KINDS[self as usize]
    }
}

/// The entry for an API group, version and kind.
pub fn find(group: &str, version: &str, kind: &str) -> Option<&'static WorkloadKind> {
    KINDS
        .iter()
        .find(|known| known.group == group && known.version == version && known.kind == kind)
}

/// The entry for a manifest's `apiVersion` and `kind`.
pub fn find_api_version(api_version: &str, kind: &str) -> Option<&'static WorkloadKind> {
    let (group, version) = split_api_version(api_version);
    find(group, version, kind)
}

/// The entry for a raw object's `apiVersion` and `kind`.
pub fn of(object: &Value) -> Option<&'static WorkloadKind> {
    let (api_version, kind) = api_version_and_kind(object)?;
    find_api_version(api_version, kind)
}

/// `(group, version)` of an `apiVersion` (`v1` is the core group's).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// A raw object's `apiVersion` and `kind`, when it has both.
pub fn api_version_and_kind(object: &Value) -> Option<(&str, &str)> {
    let api_version = object.get("apiVersion").and_then(Value::as_str)?;
    let kind = object.get("kind").and_then(Value::as_str)?;
    Some((api_version, kind))
}

/// Kinds of other operators, known by API group in any version: gpu-guard neither mutates nor
/// judges them, and says what protects their pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperatorKind {
    /// The API group (any version of it).
    pub group: &'static str,
    /// Its kinds in that group.
    pub kinds: &'static [&'static str],
    /// What its operator creates, and so what protects its pods from device failures.
    pub why: &'static str,
}

/// The kinds named, with what their operators create (read from each project's controller).
pub const OPERATOR_KINDS: &[OperatorKind] = &[
    OperatorKind {
        group: "kubeflow.org",
        kinds: &["MPIJob"],
        why: "the MPI Operator runs the workers as bare Pods, which have no podFailurePolicy, \
              and the launcher as a batch/v1 Job (mpi-operator v0.3+), which gpu-guard's Job \
              webhook mutates only when it requests a device: a device failure on a worker \
              fails the launcher's mpirun and counts against runPolicy.backoffLimit; run \
              it as a JobSet or a Kubeflow TrainJob to have it protected",
    },
    OperatorKind {
        group: "kubeflow.org",
        kinds: &["PyTorchJob"],
        // Retried codes: kubeflow/training-operator `pkg/util/train/train_util.go`.
        why: "the Kubeflow Training Operator (v1) creates bare Pods, which have no \
              podFailurePolicy; its restartPolicy ExitCode retries only exit codes 130, 137, \
              138 and 143, so the device codes 74 and 75 fail the job; run it as a \
              Kubeflow Trainer v2 TrainJob to have it protected",
    },
    OperatorKind {
        group: "kubeflow.org",
        kinds: &["TFJob", "XGBoostJob", "PaddleJob", "JAXJob"],
        why: "the Kubeflow Training Operator (v1) creates bare Pods, which have no \
              podFailurePolicy",
    },
    OperatorKind {
        group: "leaderworkerset.x-k8s.io",
        kinds: &["LeaderWorkerSet"],
        why: "LeaderWorkerSet runs each group as StatefulSets, whose pods are restarted in \
              place (or the group recreated) with no podFailurePolicy; gpu-guard's node \
              controller still taints degraded nodes so that recreated pods land elsewhere",
    },
    OperatorKind {
        group: "batch.volcano.sh",
        kinds: &["Job"],
        why: "the Volcano controller creates bare Pods and applies the Job's own \
              policies (event PodFailed, action RestartJob, ...), not a podFailurePolicy",
    },
    OperatorKind {
        group: "ray.io",
        kinds: &["RayJob", "RayCluster"],
        why: "KubeRay runs the Ray cluster as bare Pods (and a RayJob's submitter as a batch/v1 \
              Job without a device); Ray retries failed tasks itself",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_its_own_entry_once() {
        for known in &KINDS {
            assert_eq!(known.id.info(), known);
            assert_eq!(
                find(known.group, known.version, known.kind),
                Some(known),
                "{} is listed twice",
                known.kind
            );
        }
    }

    #[test]
    fn each_entry_agrees_with_itself() {
        for known in &KINDS {
            let api_version = match known.group {
                "" => known.version.to_owned(),
                group => format!("{group}/{}", known.version),
            };
            assert_eq!(known.api_name, format!("{api_version} {}", known.kind));
            assert_eq!(find_api_version(&api_version, known.kind), Some(known));
            // The API server's plural of these kinds: lower case, with an `s`.
            assert_eq!(
                known.resource,
                format!("{}s", known.kind.to_lowercase()),
                "{}",
                known.kind
            );
            // What is mutated or judged has pod templates to work on.
            if known.handled() {
                assert_ne!(known.templates, PodTemplates::None, "{}", known.kind);
            }
            match known.templates {
                PodTemplates::One(pointer) | PodTemplates::PerReplicatedJob(pointer) => {
                    assert!(
                        pointer.starts_with('/') && !pointer.ends_with('/'),
                        "{pointer}"
                    );
                }
                PodTemplates::None => {}
            }
        }
    }

    #[test]
    fn the_engine_mutates_exactly_the_kinds_marked_mutated() {
        use crate::mutate::object::MutableKind;
        for known in &KINDS {
            let mutable = MutableKind::from_gvk(known.group, known.version, known.kind);
            assert_eq!(mutable.is_some(), known.mutated, "{}", known.kind);
            if let Some(mutable) = mutable {
                assert_eq!(mutable.info(), known);
            }
        }
    }

    #[test]
    fn only_pods_are_placed() {
        // The avoidance reads a pod's own metadata and spec; a template owner's pods are
        // placed when they are created, as pods.
        for known in &KINDS {
            assert_eq!(known.placed, known.id == Kind::Pod, "{}", known.kind);
            if known.placed {
                assert_eq!(known.templates, PodTemplates::One("/spec"));
            }
        }
    }

    #[test]
    fn an_operator_kind_is_never_one_gpu_guard_handles() {
        for operator in OPERATOR_KINDS {
            assert!(
                KINDS.iter().all(|known| known.group != operator.group),
                "{} is both an operator's group and a known kind's",
                operator.group
            );
        }
    }

    #[test]
    fn objects_are_found_by_api_version_and_kind() {
        let job = serde_json::json!({"apiVersion": "batch/v1", "kind": "Job"});
        assert_eq!(of(&job).map(|known| known.id), Some(Kind::Job));
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod"});
        assert_eq!(of(&pod).map(|known| known.id), Some(Kind::Pod));
        // Another version of a group is another kind.
        assert_eq!(find_api_version("apps/v1beta1", "Deployment"), None);
        assert_eq!(find_api_version("batch.volcano.sh/v1alpha1", "Job"), None);
        assert_eq!(of(&serde_json::json!({"kind": "Job"})), None);
    }
}
