//! `/mutate` for a Pod CREATE: a pod the Job controller creates for a workload whose devices
//! failed before is kept off those nodes ([`avoid::avoid_failed_nodes`], the decision
//! `gpu-guard mutate` makes offline). Its webhook registration selects Job pods only, with
//! `failurePolicy: Ignore`: the Job controller creates the pod, and nobody reads a warning, so
//! what was done goes into the audit annotation `avoided-nodes` and the metrics.

use serde_json::Value;

use super::envelope::{IncomingRequest, Operation, Response, ReviewError};
use super::{Avoided, ReviewOutcome, mutate::send_patch};
use gpu_guard_core::decode;
use gpu_guard_core::memory::avoid::{self, Avoidance, Memories};
use gpu_guard_core::policy::Policy;

/// The audit annotation (`<webhook name>/avoided-nodes` in the audit log) of a pod kept off
/// nodes.
pub const AVOIDED_AUDIT_KEY: &str = "avoided-nodes";

/// Decides a Pod CREATE: the exclusion patch when the pod's workload has device failures on
/// record in `memories`; every other request (UPDATE, a subresource, a pod of nothing on
/// record) is allowed unchanged.
pub(super) fn place(
    request: &IncomingRequest<'_>,
    object: Option<&str>,
    policy: &Policy,
    memories: &dyn Memories,
    response: &mut Response,
) -> Result<(ReviewOutcome, usize, Option<Avoided>), ReviewError> {
    let unchanged = Ok((ReviewOutcome::Allowed, 0, None));
    if request.operation != Operation::Create
        || request
            .sub_resource
            .as_deref()
            .is_some_and(|s| !s.is_empty())
        || !policy.mutation.avoid_failed_nodes.enabled
    {
        return unchanged;
    }
    let object =
        object.ok_or_else(|| ReviewError::MissingObject(request.operation.as_str().to_owned()))?;
    let mut pod: Value = decode::from_json_str(object).map_err(ReviewError::NotJson)?;
    // The pod's namespace is the request's when the object leaves it out.
    if let (Some(metadata), Some(namespace)) = (
        pod.get_mut("metadata").and_then(Value::as_object_mut),
        request.namespace.as_deref(),
    ) && !metadata.get("namespace").is_some_and(Value::is_string)
    {
        metadata.insert("namespace".to_owned(), namespace.into());
    }
    match avoid::avoid_failed_nodes(&pod, policy, memories) {
        Avoidance::Unchanged => unchanged,
        Avoidance::BadMemory { workload, error } => Ok((
            ReviewOutcome::Allowed,
            0,
            Some(Avoided::Unreadable {
                workload: workload.to_string(),
                error: error.to_string(),
            }),
        )),
        Avoidance::Excluded {
            workload,
            nodes,
            patch,
        } => {
            // The patch is proven to apply before it is sent, as the engine's are.
            let mut applied = pod;
            json_patch::patch(&mut applied, &patch)
                .map_err(|error| ReviewError::Internal(error.to_string()))?;
            let summary = avoid::describe(&workload, &nodes);
            let (outcome, bytes) = send_patch(response, &patch, AVOIDED_AUDIT_KEY, summary);
            Ok((outcome, bytes, Some(Avoided::Excluded(nodes.len()))))
        }
    }
}
