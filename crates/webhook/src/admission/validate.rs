//! `/validate`: the GPU-node priority guard on Pods and pod templates, its verdict written
//! into the response as a denial, warnings or an audit annotation.

use serde_json::value::RawValue;

use super::envelope::{IncomingRequest, Response, ReviewError, Status};
use super::{GuardOutcome, ReviewOutcome};
use gpu_guard_core::guard::{self, ClusterView, GuardedKind, Verdict, Workload};
use gpu_guard_core::policy::{GuardMode, Policy};
use gpu_guard_core::wellknown::{GUARD_AUDIT_KEY, GUARD_UNJUDGED_AUDIT_KEY};

/// Judges the request's workload when the guard judges its kind at its operation (not a
/// subresource); `None` when there was nothing to judge.
pub(super) fn validate(
    request: &IncomingRequest<'_>,
    object: Option<&str>,
    policy: &Policy,
    view: &dyn ClusterView,
    response: &mut Response,
) -> Result<Option<(ReviewOutcome, GuardOutcome)>, ReviewError> {
    let Some(kind) = GuardedKind::from_gvk(
        &request.kind.group,
        &request.kind.version,
        &request.kind.kind,
    )
    .filter(|kind| kind.judged_at(request.operation.as_str())) else {
        return Ok(None);
    };
    if !request
        .sub_resource
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        return Ok(None);
    }
    let object = object.ok_or_else(|| {
        ReviewError::MissingObject(format!(
            "{} of a {}",
            request.operation.as_str(),
            kind.as_str()
        ))
    })?;
    let namespace = request.namespace.as_deref().unwrap_or_default();
    match read_workload(kind, object, request.old_object) {
        Err(error) if error.source.is_syntax() => Err(ReviewError::NotJson(error.source)),
        // The API server has checked the object's schema; this is not expected.
        Err(error) => {
            response.warnings.push(format!(
                "gpu-guard: {error}; the GPU-node guard did not judge it"
            ));
            Ok(None)
        }
        Ok(None) => Ok(None),
        Ok(Some(workload)) => {
            let verdict = guard::judge(
                kind,
                namespace,
                &workload,
                &policy.guard,
                &policy.devices,
                view,
            )
            .map_err(|error| ReviewError::Internal(error.to_string()))?;
            let mode = policy.guard.mode_for(kind.policy_namespace(namespace));
            let (outcome, label) = apply_verdict(&verdict, response);
            Ok(Some((
                outcome,
                GuardOutcome {
                    mode,
                    outcome: label,
                },
            )))
        }
    }
}

/// The workload to judge, or `None` when there is nothing to judge: an UPDATE that leaves every
/// pod spec as it was (labels, replicas, status, finalizers: a workload admitted before its
/// namespace opted in must stay manageable), or one of an object being deleted. An UPDATE that
/// changes a pod spec is judged: Kueue admits a suspended Job or JobSet by adding its flavor's
/// nodeSelector and tolerations to the templates, which may put it on GPU nodes.
fn read_workload(
    kind: GuardedKind,
    object: &str,
    old_object: Option<&RawValue>,
) -> Result<Option<Workload>, guard::DecodeError> {
    let workload = Workload::from_json(kind, object)?;
    if workload.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    if let Some(old) = old_object.filter(|old| old.get() != "null")
        && let Ok(old) = Workload::from_json(kind, old.get())
        && old.templates == workload.templates
    {
        return Ok(None);
    }
    Ok(Some(workload))
}

/// Writes a verdict into the response: a denial, warnings or an audit annotation.
fn apply_verdict(verdict: &Verdict, response: &mut Response) -> (ReviewOutcome, &'static str) {
    let violation = match verdict {
        Verdict::Allowed(guard::Allowed::Exempt(_)) => return (ReviewOutcome::Allowed, "exempt"),
        Verdict::Allowed(guard::Allowed::Unjudged(why)) => {
            // The full text goes to the audit log.
            response.audit_annotations.insert(
                GUARD_UNJUDGED_AUDIT_KEY.to_owned(),
                format!("gpu-guard: {}", why.webhook_message()),
            );
            response
                .warnings
                .push(format!("gpu-guard: {}", why.warning()));
            return (ReviewOutcome::Allowed, "unjudged");
        }
        Verdict::Allowed(_) => return (ReviewOutcome::Allowed, "allowed"),
        Verdict::Violation(violation) => violation,
    };
    let message = format!("gpu-guard: {}", violation.message());
    response
        .audit_annotations
        .insert(GUARD_AUDIT_KEY.to_owned(), message.clone());
    match violation.mode {
        GuardMode::Enforce => {
            response.allowed = false;
            response.status = Some(Status {
                code: 403,
                message,
                reason: Some("Forbidden".to_owned()),
            });
            (ReviewOutcome::Denied, "denied")
        }
        GuardMode::Warn => {
            response.warnings.extend(
                violation
                    .warnings()
                    .into_iter()
                    .map(|warning| format!("gpu-guard: {warning}")),
            );
            (ReviewOutcome::Warned, "warned")
        }
        GuardMode::Audit => (ReviewOutcome::Audited, "audited"),
    }
}
