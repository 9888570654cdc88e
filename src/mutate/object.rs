//! A raw Kubernetes object (as JSON) through the engine: decode the typed Job (or a CronJob's
//! `jobTemplate`), run [`mutate_job`], and derive the JSON Patch for the raw object. Shared by
//! the CLI and the webhook, so both produce the same bytes for the same input.

use json_patch::Patch;
use k8s_openapi::api::batch::v1::{Job, JobTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::job_view;
use super::patch::{self, CRON_JOB_TEMPLATE_ROOT, JOB_ROOT};
use crate::mutate::{
    Outcome, SkipReason, is_skipped, mutate_job, mutate_job_template, template_as_job,
};
use crate::policy::Policy;

/// The kinds the engine mutates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MutableKind {
    Job,
    CronJob,
}

impl MutableKind {
    /// The kind of a raw object, when it is one the engine mutates (`batch/v1` only).
    pub fn of(object: &Value) -> Option<Self> {
        if object.get("apiVersion").and_then(Value::as_str) != Some("batch/v1") {
            return None;
        }
        match object.get("kind").and_then(Value::as_str) {
            Some("Job") => Some(Self::Job),
            Some("CronJob") => Some(Self::CronJob),
            _ => None,
        }
    }
}

/// What the engine did to one raw object.
#[derive(Debug)]
pub struct ObjectMutation {
    pub kind: MutableKind,
    pub outcome: Outcome,
    /// The operations to send or apply; empty when nothing changed.
    pub patch: Patch,
}

/// Why a raw object could not go through the engine.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("the object does not decode as a batch/v1 {kind}: {source}")]
    Decode {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("internal error: the computed patch does not apply to the object: {0}")]
    PatchDoesNotApply(#[from] json_patch::PatchError),
}

/// Runs the engine on a raw Job or CronJob. Returns `None` for every other kind.
pub fn mutate_object(raw: &Value, policy: &Policy) -> Option<Result<ObjectMutation, ObjectError>> {
    let kind = MutableKind::of(raw)?;
    Some(mutate_known(raw, kind, policy))
}

fn mutate_known(
    raw: &Value,
    kind: MutableKind,
    policy: &Policy,
) -> Result<ObjectMutation, ObjectError> {
    let (outcome, root) = match kind {
        MutableKind::Job => {
            let job = Job::deserialize_from(raw).map_err(|source| ObjectError::Decode {
                kind: "Job",
                source,
            })?;
            (mutate_job(&job, policy), JOB_ROOT)
        }
        MutableKind::CronJob => {
            let metadata: ObjectMeta = cron_job_part(raw, "/metadata")?.unwrap_or_default();
            let template: JobTemplateSpec =
                cron_job_part(raw, CRON_JOB_TEMPLATE_ROOT)?.unwrap_or_default();
            let outcome = if is_skipped(&metadata) {
                Outcome::skipped(&template_as_job(&template), SkipReason::SkipAnnotation)
            } else {
                mutate_job_template(&template, policy)
            };
            (outcome, CRON_JOB_TEMPLATE_ROOT)
        }
    };
    let patch = patch::operations(&outcome.changes, raw, root);
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

/// The webhook's fast path for a Job given as JSON text: decodes only what the engine reads
/// ([`job_view`]) and derives and checks the patch against the raw object's skeleton, so no
/// `serde_json::Value` of the whole object, and no typed copy of what the engine ignores, is
/// built. The outcome's Job has only the fields the engine reads.
pub fn mutate_job_json(raw: &str, policy: &Policy) -> Result<ObjectMutation, ObjectError> {
    let view = job_view::decode(raw).map_err(|source| ObjectError::Decode {
        kind: "Job",
        source,
    })?;
    let outcome = mutate_job(&view.job, policy);
    let patch = patch::operations(&outcome.changes, &view.skeleton, JOB_ROOT);
    if !patch.is_empty() {
        patch::check_applies(&view.skeleton, &patch)?;
    }
    Ok(ObjectMutation {
        kind: MutableKind::Job,
        outcome,
        patch,
    })
}

/// Decodes the part of a raw CronJob at `pointer`, if it has one.
fn cron_job_part<T: serde::de::DeserializeOwned>(
    raw: &Value,
    pointer: &str,
) -> Result<Option<T>, ObjectError> {
    raw.pointer(pointer)
        .map(T::deserialize_from)
        .transpose()
        .map_err(|source| ObjectError::Decode {
            kind: "CronJob",
            source,
        })
}

/// Deserializes a k8s-openapi type from a borrowed JSON value.
trait FromValue: Sized {
    fn deserialize_from(value: &Value) -> Result<Self, serde_json::Error>;
}

impl<T: serde::de::DeserializeOwned> FromValue for T {
    fn deserialize_from(value: &Value) -> Result<Self, serde_json::Error> {
        T::deserialize(value)
    }
}
