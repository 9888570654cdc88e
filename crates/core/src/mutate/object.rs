//! A raw Kubernetes object (as JSON) through the engine: decode the typed Job (or a CronJob's
//! `jobTemplate`, or a JobSet spec), run [`mutate_job`](super::mutate_job) (or
//! [`mutate_jobset`]), and derive the JSON Patch for the raw object. The CLI and the webhook
//! both call [`mutate_object`], so both produce the same bytes for the same input: the CLI on
//! the whole object, the webhook on the fields of it that the engines read
//! ([`reads`](super::reads), their one list).

use json_patch::Patch;
use k8s_openapi::api::batch::v1::{Job, JobTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::jobset::{JobSetOutcome, lacks_exactly_the_gang_part, mutate_jobset};
use super::patch::{self, CRON_JOB_TEMPLATE_ROOT, JOB_ROOT};
use crate::decode::{self, JsonError};
use crate::devices::DraFacts;
use crate::field::FieldPath;
use crate::jobset::JobSetSpec;
use crate::kinds::{self, Kind, PodTemplates, WorkloadKind};
use crate::mutate::{
    ClusterFacts, JobRole, Outcome, SkipReason, is_skipped, mutate_job_as, mutate_owned_job,
    template_as_job,
};
use crate::policy::Policy;
use crate::wellknown::MUTATED_ANNOTATION;

/// The kinds the engine mutates: those [`WorkloadKind::mutated`] in the kind registry, whose
/// facts [`MutableKind::info`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MutableKind {
    Job,
    CronJob,
    JobSet,
    /// Its `spec.template.spec` is a JobSet spec, the template of every TrainJob that names it.
    TrainingRuntime,
    ClusterTrainingRuntime,
}

impl MutableKind {
    /// The kind for an API group, version and kind, if the engine mutates it.
    pub fn from_gvk(group: &str, version: &str, kind: &str) -> Option<Self> {
        let known = kinds::find(group, version, kind).filter(|known| known.mutated)?;
        Some(match known.id {
            Kind::Job => Self::Job,
            Kind::CronJob => Self::CronJob,
            Kind::JobSet => Self::JobSet,
            Kind::TrainingRuntime => Self::TrainingRuntime,
            Kind::ClusterTrainingRuntime => Self::ClusterTrainingRuntime,
            _ => return None,
        })
    }

    /// The kind of a raw object, when it is one the engine mutates.
    pub fn of(object: &Value) -> Option<Self> {
        let known = kinds::of(object)?;
        Self::from_gvk(known.group, known.version, known.kind)
    }

    /// Its entry in the kind registry.
    pub fn info(self) -> &'static WorkloadKind {
        match self {
            Self::Job => Kind::Job,
            Self::CronJob => Kind::CronJob,
            Self::JobSet => Kind::JobSet,
            Self::TrainingRuntime => Kind::TrainingRuntime,
            Self::ClusterTrainingRuntime => Kind::ClusterTrainingRuntime,
        }
        .info()
    }

    /// The kind with its API group and version, for messages (`batch/v1 Job`).
    pub fn api_name(self) -> &'static str {
        self.info().api_name
    }

    /// Where the JobSet spec is in an object of a JobSet kind (`None` for Jobs and CronJobs).
    pub fn jobset_spec_root(self) -> Option<&'static str> {
        match self.info().templates {
            PodTemplates::PerReplicatedJob(root) => Some(root),
            PodTemplates::One(_) | PodTemplates::None => None,
        }
    }
}

/// What an engine decided for one raw object.
#[derive(Clone, Debug, PartialEq)]
pub enum ObjectOutcome {
    /// A Job, or a CronJob's `jobTemplate`.
    Job(Box<Outcome>),
    /// A JobSet, or a Trainer runtime's JobSet template.
    JobSet(JobSetOutcome),
}

impl ObjectOutcome {
    pub fn warnings(&self) -> &[String] {
        match self {
            Self::Job(outcome) => &outcome.warnings,
            Self::JobSet(outcome) => &outcome.warnings,
        }
    }

    pub fn skipped(&self) -> Option<SkipReason> {
        match self {
            Self::Job(outcome) => outcome.skipped,
            Self::JobSet(outcome) => outcome.skipped,
        }
    }

    /// A one-line summary of the changes.
    pub fn summary(&self) -> String {
        match self {
            Self::Job(outcome) => outcome.summary(),
            Self::JobSet(outcome) => outcome.summary(),
        }
    }

    /// The Job engine's outcome, for a Job or CronJob.
    pub fn job(&self) -> Option<&Outcome> {
        match self {
            Self::Job(outcome) => Some(outcome),
            Self::JobSet(_) => None,
        }
    }
}

/// What the engine did to one raw object.
#[derive(Debug)]
pub struct ObjectMutation {
    pub kind: MutableKind,
    pub outcome: ObjectOutcome,
    /// The operations to send or apply; empty when nothing changed.
    pub patch: Patch,
}

/// Why a raw object could not go through the engine.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("the object does not decode as a {kind}: {source}")]
    Decode {
        kind: &'static str,
        #[source]
        source: JsonError,
    },
    #[error("internal error: the computed patch does not apply to the object: {0}")]
    PatchDoesNotApply(#[from] patch::DoesNotApply),
}

/// Runs the engine on a raw object of a [`MutableKind`], with the DRA objects `dra` knows (to
/// tell whether a claim is a device). Returns `None` for every other kind.
pub fn mutate_object(
    raw: &Value,
    policy: &Policy,
    dra: &dyn DraFacts,
) -> Option<Result<ObjectMutation, ObjectError>> {
    let kind = MutableKind::of(raw)?;
    Some(mutate_known(raw, kind, policy, dra))
}

/// What an object says it is, as serde reads it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    api_version: Option<String>,
    kind: Option<String>,
}

/// Checks that `raw` says it is a `kind` (the webhook is told the kind by the request, and an
/// object that disagrees is not mutated): the error says what was found.
pub fn expect_kind(raw: &Value, kind: MutableKind) -> Result<(), ObjectError> {
    let decode_error = |source| ObjectError::Decode {
        kind: kind.api_name(),
        source,
    };
    if MutableKind::of(raw) == Some(kind) {
        return Ok(());
    }
    let found: TypeMeta = decode::from_json_value(raw).map_err(decode_error)?;
    let say = |name: &str, value: Option<&str>| match value {
        Some(value) => format!("{name} {value:?}"),
        None => format!("no {name}"),
    };
    // The error says what was expected (`does not decode as a batch/v1 Job`).
    Err(decode_error(JsonError::custom(format!(
        "found {} and {}",
        say("apiVersion", found.api_version.as_deref()),
        say("kind", found.kind.as_deref())
    ))))
}

fn mutate_known(
    raw: &Value,
    kind: MutableKind,
    policy: &Policy,
    dra: &dyn DraFacts,
) -> Result<ObjectMutation, ObjectError> {
    let (outcome, patch) = match kind {
        MutableKind::Job => {
            let decode_job = || {
                decode::from_json_value::<Job>(raw).map_err(|source| ObjectError::Decode {
                    kind: kind.api_name(),
                    source,
                })
            };
            let job = decode_job()?;
            let namespace = job.metadata.namespace.clone().unwrap_or_default();
            let facts = ClusterFacts {
                namespace: &namespace,
                dra,
            };
            // The engine drafts on the decoded Job itself; the input is decoded once more only
            // when the result would be rejected (the decode cannot fail then: it just
            // succeeded).
            let outcome = mutate_owned_job(job, policy, JobRole::Standalone, facts, || {
                decode_job().unwrap_or_default()
            });
            let patch = patch::operations(&outcome.changes, raw, JOB_ROOT);
            (ObjectOutcome::Job(Box::new(outcome)), patch)
        }
        MutableKind::CronJob => {
            let metadata: ObjectMeta = part(raw, "/metadata", kind)?.unwrap_or_default();
            let template: JobTemplateSpec =
                part(raw, CRON_JOB_TEMPLATE_ROOT, kind)?.unwrap_or_default();
            let outcome = if is_skipped(&metadata) {
                Outcome::skipped(template_as_job(&template), SkipReason::SkipAnnotation)
            } else {
                let facts = ClusterFacts::of(&metadata, dra);
                mutate_job_as(
                    &template_as_job(&template),
                    policy,
                    JobRole::Standalone,
                    facts,
                )
            };
            let patch = patch::operations(&outcome.changes, raw, CRON_JOB_TEMPLATE_ROOT);
            (ObjectOutcome::Job(Box::new(outcome)), patch)
        }
        MutableKind::JobSet
        | MutableKind::TrainingRuntime
        | MutableKind::ClusterTrainingRuntime => {
            let root = kind.jobset_spec_root().unwrap_or("/spec");
            let metadata: ObjectMeta = part(raw, "/metadata", kind)?.unwrap_or_default();
            let spec: JobSetSpec = part(raw, root, kind)?.unwrap_or_default();
            return jobset_mutation(kind, &metadata, &spec, raw, policy, dra);
        }
    };
    if !patch.is_empty() {
        // Proves the operations apply before anyone sends or writes them.
        patch::check_applies(raw, &patch)?;
    }
    Ok(ObjectMutation {
        kind,
        outcome,
        patch,
    })
}

/// The fields gpu-guard may add to a Job (relative to where the Job is) that it puts back on
/// UPDATE: those an update cannot drop without being refused (a Job's `podFailurePolicy` and
/// `template` are immutable; `podReplacementPolicy` must stay `Failed` beside a
/// podFailurePolicy). `activeDeadlineSeconds` is not among them: it is mutable, gpu-guard only
/// sets it when absent (so no manager owns it and no apply drops it), and removing it is a
/// choice.
const JOB_OWNED: [&str; 5] = [
    "/spec/podFailurePolicy",
    "/spec/podReplacementPolicy",
    "/spec/template/spec/restartPolicy",
    "/spec/template/spec/terminationGracePeriodSeconds",
    "/spec/template/spec/tolerations",
];

/// Where the containers of a Job's pod template are (relative to where the Job is).
///
/// Restart rules need a put-back, per container: `containers` is a list merged by `name` in a
/// server-side apply, but a container's `restartPolicyRules` is atomic (`+listType=atomic`,
/// core/v1 `types.go` of Kubernetes 1.36). A manager that applies the container with rules of
/// its own owns that list, and a re-apply sets it to exactly those rules, dropping the one
/// gpu-guard appended; the template is immutable, so the update would be refused. When the
/// manager's manifest has no rules, gpu-guard's list (and the container `restartPolicy` it set,
/// a scalar) is owned by no manager and survives. The container `restartPolicy` needs no
/// put-back: gpu-guard only sets it where the manifest had none.
const JOB_CONTAINERS: &str = "/spec/template/spec/containers";

/// The pod-template annotation of a gang Job (`gpu-guard.io/gang`, [`super::peers`]), relative
/// to where the Job is. Annotations are a map merged by key in a server-side apply, so an apply
/// that never named it keeps it; an update that replaces the whole object (`kubectl replace`,
/// a PUT of the manifest) drops it with the rest of gpu-guard's changes, and the template is
/// immutable: it is put back with them, its parents created when the update has none.
const JOB_TEMPLATE_ANNOTATION: &str = "/spec/template/metadata/annotations/gpu-guard.io~1gang";

/// The one patch gpu-guard sends on UPDATE: for an object it mutated at CREATE (its
/// `gpu-guard.io/mutated` annotation on `old`), each field it owns that `new` lacks exactly as
/// gpu-guard added it is put back as `old` has it.
///
/// Why: a server-side apply by the manager that owns an enclosing atomic list (a Job's
/// `podFailurePolicy.rules` or `tolerations`, a container's `restartPolicyRules`, a JobSet's
/// `failurePolicy.rules`) sets the list to
/// what it applies, dropping what gpu-guard added at CREATE; on an immutable field (a Job's
/// `podFailurePolicy` and `template`, a JobSet's `failurePolicy` and `replicatedJobs`) the
/// update is then refused, and a GitOps sync or a controller (Trainer re-applies its JobSet) is
/// stuck retrying. Fields a mutating webhook adds are owned by no manager since Kubernetes 1.18
/// (kubernetes#87672; apiserver `pkg/endpoints/handlers/create.go` updates managedFields before
/// mutating admission), so an apply that never named them leaves them alone.
///
/// "Exactly as gpu-guard added it": the engine run on `new`, as at CREATE, gives `old`'s value.
/// A value the user changed on purpose does not, and is left to the API server. No value that
/// `old` does not have is ever written, so the update leaves these fields as they were.
pub fn restore_object(
    old: &Value,
    new: &Value,
    policy: &Policy,
    dra: &dyn DraFacts,
) -> Option<Result<ObjectMutation, ObjectError>> {
    let kind = MutableKind::of(new)?;
    let mutated_by_us = old
        .pointer("/metadata/annotations")
        .and_then(|annotations| annotations.get(MUTATED_ANNOTATION))
        .is_some();
    if !mutated_by_us || MutableKind::of(old) != Some(kind) {
        return None;
    }
    Some(restore_known(kind, old, new, policy, dra))
}

fn restore_known(
    kind: MutableKind,
    old: &Value,
    new: &Value,
    policy: &Policy,
    dra: &dyn DraFacts,
) -> Result<ObjectMutation, ObjectError> {
    let redo = mutate_known(new, kind, policy, dra)?;
    let redone = patch::apply(new, &redo.patch).map_err(patch::DoesNotApply::from)?;
    let mut owned: Vec<String> = Vec::new();
    let job_fields = |root: &str| -> Vec<String> {
        let containers = format!("{root}{JOB_CONTAINERS}");
        let count = new
            .pointer(&containers)
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        JOB_OWNED
            .iter()
            .chain([&JOB_TEMPLATE_ANNOTATION])
            .map(|path| format!("{root}{path}"))
            .chain((0..count).map(|index| format!("{containers}/{index}/restartPolicyRules")))
            .collect()
    };
    match kind.jobset_spec_root() {
        None => {
            let root = if kind == MutableKind::CronJob {
                CRON_JOB_TEMPLATE_ROOT
            } else {
                JOB_ROOT
            };
            owned.extend(job_fields(root));
        }
        Some(root) => {
            owned.push(format!("{root}/failurePolicy"));
            let replicas = new
                .pointer(&format!("{root}/replicatedJobs"))
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            for index in 0..replicas {
                owned.extend(job_fields(&format!(
                    "{root}/replicatedJobs/{index}/template"
                )));
            }
        }
    }
    let ops: Vec<_> = owned
        .iter()
        .filter_map(|path| {
            let was = old.pointer(path)?;
            let is = new.pointer(path);
            // A JobSet's failure policy: the engine adds nothing to a template that carries
            // gpu-guard's rules already, so compare with the old policy less gpu-guard's part.
            let dropped = redone.pointer(path) == Some(was)
                || (path.ends_with("/failurePolicy")
                    && lacks_exactly_the_gang_part(was, is, policy));
            // Without a podReplacementPolicy the Job is valid: its removal is a choice.
            if path.ends_with("/podReplacementPolicy") && is.is_none() {
                return None;
            }
            (is != Some(was) && dropped).then(|| patch::put_back_under(new, path, was))
        })
        .collect();
    let patch = Patch(ops);
    if !patch.is_empty() {
        patch::check_applies(new, &patch)?;
    }
    Ok(ObjectMutation {
        kind,
        outcome: redo.outcome,
        patch,
    })
}

/// The JobSet engine on the spec of an object of a JobSet `kind`, with the patch derived from
/// and checked against `raw`.
fn jobset_mutation(
    kind: MutableKind,
    metadata: &ObjectMeta,
    spec: &JobSetSpec,
    raw: &Value,
    policy: &Policy,
    dra: &dyn DraFacts,
) -> Result<ObjectMutation, ObjectError> {
    let root = kind.jobset_spec_root().unwrap_or("/spec");
    let path = FieldPath::new(root.trim_start_matches('/').split('/'));
    let jobset_name = (kind == MutableKind::JobSet)
        .then_some(metadata.name.as_deref())
        .flatten()
        .filter(|name| !name.is_empty());
    let outcome = mutate_jobset(metadata, jobset_name, spec, &path, policy, dra);
    let patch = patch::jobset_operations(&outcome, raw, root);
    if !patch.is_empty() {
        patch::check_applies(raw, &patch)?;
    }
    Ok(ObjectMutation {
        kind,
        outcome: ObjectOutcome::JobSet(outcome),
        patch,
    })
}

/// Decodes the part of a raw object of `kind` at `pointer`, if it has one.
fn part<T: serde::de::DeserializeOwned>(
    raw: &Value,
    pointer: &str,
    kind: MutableKind,
) -> Result<Option<T>, ObjectError> {
    // A null part is an absent one: the API server drops the null fields of a custom resource
    // (see `jobset::JobSetSpec`) and decodes a built-in type's null as its zero value.
    raw.pointer(pointer)
        .filter(|value| !value.is_null())
        .map(decode::from_json_value)
        .transpose()
        .map_err(|source| ObjectError::Decode {
            kind: kind.api_name(),
            source: source.under(&pointer.trim_start_matches('/').replace('/', ".")),
        })
}
