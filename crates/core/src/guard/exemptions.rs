//! The exemptions of the policy file (`guard.exemptions`): namespaces, workloads and their pods
//! (through their controllers), and the mirror pods of static pods.

use super::input::{GuardedKind, Metadata};
use crate::policy::Guard;

/// The annotation the kubelet puts on mirror pods of static pods: denying one would not stop
/// the static pod, so they are not judged.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The exemption that applies, described, if any.
pub(super) fn exemption(
    kind: GuardedKind,
    namespace: &str,
    metadata: &Metadata,
    guard: &Guard,
) -> Option<String> {
    let exemptions = &guard.exemptions;
    if exemptions.namespaces.iter().any(|n| n == namespace) {
        return Some(format!("namespace {namespace:?} is exempt"));
    }
    if kind == GuardedKind::Pod && metadata.annotation(MIRROR_POD_ANNOTATION).is_some() {
        return Some("mirror pod of a static pod".to_owned());
    }
    let name = metadata.name.as_deref().unwrap_or_default();
    let matches = |kind: &str, name: &str| {
        exemptions.workloads.iter().find(|w| {
            w.namespace == namespace
                && w.name == name
                && w.kind.as_deref().is_none_or(|k| k == kind)
        })
    };
    if let Some(workload) = matches(kind.as_str(), name) {
        return Some(format!(
            "workload {}/{} is exempt",
            workload.namespace, name
        ));
    }
    // A pod is exempt with its controller: a DaemonSet or StatefulSet owns its pods directly,
    // a Deployment through a ReplicaSet named `<deployment>-<pod-template-hash>`.
    let owner = metadata.controller()?;
    if let Some(workload) = matches(&owner.kind, &owner.name) {
        return Some(format!(
            "its {} {}/{} is exempt",
            owner.kind, workload.namespace, owner.name
        ));
    }
    // A CronJob owns its Jobs, named `<cronjob>-<scheduled minute>`, which own the pods.
    if owner.kind == "Job"
        && let Some((cronjob, minute)) = owner.name.rsplit_once('-')
        && !minute.is_empty()
        && minute.bytes().all(|b| b.is_ascii_digit())
        && let Some(workload) = matches("CronJob", cronjob)
    {
        return Some(format!(
            "its CronJob {}/{cronjob} is exempt",
            workload.namespace
        ));
    }
    if owner.kind == "ReplicaSet"
        && let Some(hash) = metadata.label("pod-template-hash")
        && let Some(deployment) = owner
            .name
            .strip_suffix(hash)
            .and_then(|rest| rest.strip_suffix('-'))
        && let Some(workload) = matches("Deployment", deployment)
    {
        return Some(format!(
            "its Deployment {}/{deployment} is exempt",
            workload.namespace
        ));
    }
    None
}
