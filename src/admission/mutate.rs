//! `/mutate`: a Job or CronJob CREATE through the mutation engine; the JSON Patch, derived
//! from the engine's changes and proven to apply to the raw object, goes into the response.

use base64::Engine as _;

use super::ReviewOutcome;
use super::envelope::{IncomingRequest, Operation, Response, ReviewError};
use crate::mutate::SkipReason;
use crate::mutate::object::{
    MutableKind, ObjectError, ObjectMutation, mutate_job_json, mutate_object,
};
use crate::policy::Policy;

/// Mutates the request's object when it is a batch/v1 Job or CronJob CREATE (everything else is
/// allowed unchanged); returns the outcome and the size of the patch sent.
pub(super) fn mutate(
    request: &IncomingRequest<'_>,
    object: Option<&str>,
    policy: &Policy,
    response: &mut Response,
) -> Result<(ReviewOutcome, usize), ReviewError> {
    let kind = &request.kind;
    let Some(mutable) = MutableKind::from_gvk(&kind.group, &kind.version, &kind.kind) else {
        return Ok((ReviewOutcome::Allowed, 0));
    };
    if request.operation != Operation::Create {
        return Ok((ReviewOutcome::Allowed, 0));
    }
    let object =
        object.ok_or_else(|| ReviewError::MissingObject(request.operation.as_str().to_owned()))?;
    match mutate_raw(mutable, object, policy) {
        // The object's own apiVersion/kind disagree with request.kind: leave it alone.
        None => response.warnings.push(format!(
            "gpu-guard: the object is not a {}; left unchanged",
            if mutable == MutableKind::CronJob {
                MutableKind::Job
            } else {
                mutable
            }
            .api_name()
        )),
        // Not JSON at all is malformed input, not an object gpu-guard cannot read.
        Some(Err(ObjectError::Decode { source, .. })) if source.is_syntax() || source.is_eof() => {
            return Err(ReviewError::NotJson(source));
        }
        Some(Err(error @ ObjectError::PatchDoesNotApply(_))) => {
            return Err(ReviewError::Internal(error.to_string()));
        }
        Some(Err(error)) => response.warnings.push(format!("gpu-guard: {error}")),
        Some(Ok(mutation)) => {
            response.warnings = mutation
                .outcome
                .warnings()
                .iter()
                .map(|w| format!("gpu-guard: {w}"))
                .collect();
            if mutation.outcome.skipped() == Some(SkipReason::JobSetChild) {
                response
                    .audit_annotations
                    .insert("mutation".to_owned(), SkipReason::JobSetChild.describe());
            }
            if !mutation.patch.is_empty() {
                let patch = serde_json::to_vec(&mutation.patch).expect("a JSON Patch serializes");
                response.patch = Some(base64::engine::general_purpose::STANDARD.encode(&patch));
                response.patch_type = Some("JSONPatch".to_owned());
                response
                    .audit_annotations
                    .insert("mutation".to_owned(), mutation.outcome.summary());
                return Ok((ReviewOutcome::Patched, patch.len()));
            }
        }
    }
    Ok((ReviewOutcome::Allowed, 0))
}

/// A Job goes through the fast path (no `Value` of the whole object); a CronJob, rare at
/// admission, through the general one.
fn mutate_raw(
    kind: MutableKind,
    object: &str,
    policy: &Policy,
) -> Option<Result<ObjectMutation, ObjectError>> {
    if kind == MutableKind::Job {
        return Some(mutate_job_json(object, policy));
    }
    match serde_json::from_str(object) {
        Ok(value) => mutate_object(&value, policy),
        Err(source) => Some(Err(ObjectError::Decode {
            kind: kind.api_name(),
            source,
        })),
    }
}
