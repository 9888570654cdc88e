//! `/mutate`: a Job, CronJob, JobSet or Trainer runtime CREATE through the mutation engine; the
//! JSON Patch, derived from the engine's changes and proven to apply to the raw object, goes
//! into the response. On UPDATE, the one patch sent puts back, unchanged from the old object,
//! what a server-side apply dropped of gpu-guard's changes ([`restore_object`]).

use base64::Engine as _;

use super::ReviewOutcome;
use super::envelope::{IncomingRequest, Operation, Response, ReviewError};
use gpu_guard_core::decode;
use gpu_guard_core::devices::DraFacts;
use gpu_guard_core::mutate::object::{
    MutableKind, ObjectError, ObjectMutation, expect_kind, mutate_object, restore_object,
};
use gpu_guard_core::mutate::{SkipReason, reads};
use gpu_guard_core::policy::Policy;
use gpu_guard_core::wellknown::MUTATED_ANNOTATION;
use json_patch::Patch;
use serde_json::Value;
use serde_json::value::RawValue;

/// Mutates the request's object at CREATE when it is a kind the engine mutates (a Job, CronJob,
/// JobSet or Trainer runtime; everything else is allowed unchanged), resolving DRA claims with
/// `dra`; an UPDATE goes to the put-back. Returns the outcome and the size of the patch sent.
pub(super) fn mutate(
    request: &IncomingRequest<'_>,
    object: Option<&str>,
    policy: &Policy,
    dra: &dyn DraFacts,
    response: &mut Response,
) -> Result<(ReviewOutcome, usize), ReviewError> {
    let kind = &request.kind;
    let Some(mutable) = MutableKind::from_gvk(&kind.group, &kind.version, &kind.kind) else {
        return Ok((ReviewOutcome::Allowed, 0));
    };
    match request.operation {
        Operation::Create => {}
        Operation::Update => return restore(request, object, policy, dra, response),
        _ => return Ok((ReviewOutcome::Allowed, 0)),
    }
    let object =
        object.ok_or_else(|| ReviewError::MissingObject(request.operation.as_str().to_owned()))?;
    match mutate_raw(mutable, object, policy, dra) {
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
        Some(Err(ObjectError::Decode { source, .. })) if source.is_syntax() => {
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
                let summary = mutation.outcome.summary();
                return Ok(send_patch(
                    response,
                    &mutation.patch,
                    MUTATION_AUDIT_KEY,
                    summary,
                ));
            }
        }
    }
    Ok((ReviewOutcome::Allowed, 0))
}

/// The audit annotation of what the engine changed.
const MUTATION_AUDIT_KEY: &str = "mutation";

/// Puts `patch` into the response with the audit annotation `key` saying what it does;
/// returns the outcome and the size of the patch sent.
pub(super) fn send_patch(
    response: &mut Response,
    patch: &Patch,
    key: &str,
    summary: String,
) -> (ReviewOutcome, usize) {
    let bytes = serde_json::to_vec(patch).expect("a JSON Patch serializes");
    response.patch = Some(base64::engine::general_purpose::STANDARD.encode(&bytes));
    response.patch_type = Some("JSONPatch".to_owned());
    response.audit_annotations.insert(key.to_owned(), summary);
    (ReviewOutcome::Patched, bytes.len())
}

/// An UPDATE of an object gpu-guard mutated at CREATE: what the update drops of gpu-guard's
/// additions is put back as the old object has it ([`restore_object`]); nothing else changes.
fn restore(
    request: &IncomingRequest<'_>,
    object: Option<&str>,
    policy: &Policy,
    dra: &dyn DraFacts,
    response: &mut Response,
) -> Result<(ReviewOutcome, usize), ReviewError> {
    let (Some(object), Some(old)) = (object, request.old_object.map(RawValue::get)) else {
        return Ok((ReviewOutcome::Allowed, 0));
    };
    // Most updates are of objects gpu-guard never touched: no parsing for them.
    if !old.contains(MUTATED_ANNOTATION) {
        return Ok((ReviewOutcome::Allowed, 0));
    }
    let (new, old): (Value, Value) =
        match (decode::from_json_str(object), decode::from_json_str(old)) {
            (Ok(new), Ok(old)) => (new, old),
            (Err(source), _) | (_, Err(source)) => return Err(ReviewError::NotJson(source)),
        };
    match restore_object(&old, &new, policy, dra) {
        Some(Ok(mutation)) if !mutation.patch.is_empty() => {
            let restored: Vec<String> = mutation
                .patch
                .iter()
                .map(|op| op.path().to_string())
                .collect();
            response.warnings.push(format!(
                "gpu-guard: put back what this update dropped of gpu-guard's changes at CREATE \
                 ({}), as the object had it",
                restored.join(", ")
            ));
            let summary = format!("restored on UPDATE: {}", restored.join(", "));
            Ok(send_patch(
                response,
                &mutation.patch,
                MUTATION_AUDIT_KEY,
                summary,
            ))
        }
        Some(Err(error @ ObjectError::PatchDoesNotApply(_))) => {
            Err(ReviewError::Internal(error.to_string()))
        }
        Some(Err(error)) => {
            response.warnings.push(format!("gpu-guard: {error}"));
            Ok((ReviewOutcome::Allowed, 0))
        }
        _ => Ok((ReviewOutcome::Allowed, 0)),
    }
}

/// The object through the engine as the CLI runs it ([`mutate_object`]), on the fields of it
/// that the engines read ([`reads`]). A Job, JobSet or Trainer runtime whose own apiVersion
/// and kind are not the request's is not mutated, with an error saying what it is.
fn mutate_raw(
    kind: MutableKind,
    object: &str,
    policy: &Policy,
    dra: &dyn DraFacts,
) -> Option<Result<ObjectMutation, ObjectError>> {
    let value = match reads::decode(object, kind) {
        Ok(value) => value,
        Err(source) => {
            return Some(Err(ObjectError::Decode {
                kind: kind.api_name(),
                source,
            }));
        }
    };
    if kind != MutableKind::CronJob
        && let Err(error) = expect_kind(&value, kind)
    {
        return Some(Err(error));
    }
    mutate_object(&value, policy, dra)
}
