//! PURE: is a pod stuck Terminating on a node that is gone, since when, and what is done about
//! it?
//!
//! A Job with a podFailurePolicy must use `podReplacementPolicy: Failed` (the API server
//! refuses anything else beside one), so the Job controller creates a replacement only once
//! the old pod is terminal or gone. A pod Terminating on a node that stopped reporting is
//! neither: its kubelet cannot confirm the containers stopped, and nothing deletes it for good
//! (the pod garbage collector force-deletes such pods only on nodes tainted
//! `node.kubernetes.io/out-of-service`). The Job waits for ever; Kueue's KEP-6757 describes
//! the same trap.
//!
//! A pod is stuck when it is protected ([`is_protected`]), not terminal, Terminating
//! (`deletionTimestamp` set), on a node that is NotReady or unreachable ([`node_unready`]),
//! and has been both past its deletionTimestamp and on that unready node for
//! `controller.stuckPods.afterSeconds`.

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::PodFacts;
use crate::mutate::pod_settings::UNREACHABLE_TAINT;
use crate::policy::Policy;
use crate::wellknown::SKIP_ANNOTATION;

/// Since when a node has been NotReady or unreachable, as far as it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unready {
    /// The earliest of its Ready condition's `lastTransitionTime` (when not `"True"`) and its
    /// unreachable taint's `timeAdded`; `None` when it gives neither.
    pub since: Option<Timestamp>,
}

/// Whether the node is NotReady or unreachable: its `Ready` condition is `"False"` or
/// `"Unknown"` (the node lifecycle controller sets `Unknown` when the kubelet stops reporting),
/// or it carries the `node.kubernetes.io/unreachable` taint. `None`: Ready (or it reports no
/// Ready condition at all, a node not yet registered: nothing to say).
pub fn node_unready(node: &Node) -> Option<Unready> {
    let ready = node
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .filter(|ready| ready.status != "True");
    let unreachable = node
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.as_ref())
        .and_then(|taints| taints.iter().find(|taint| taint.key == UNREACHABLE_TAINT));
    if ready.is_none() && unreachable.is_none() {
        return None;
    }
    let since = [
        ready.and_then(|ready| ready.last_transition_time.as_ref()),
        unreachable.and_then(|taint| taint.time_added.as_ref()),
    ]
    .into_iter()
    .flatten()
    .map(|time| time.0)
    .min();
    Some(Unready { since })
}

/// Whether the pod is one of a Job gpu-guard protects: its controller is a `batch/v1` Job
/// (the webhook mutates device Jobs of opted-in namespaces; the namespace and the device are
/// the caller's and the pod cache's to check), and it does not carry `gpu-guard.io/skip:
/// "true"` (a Job that opted out through its pod template). The pod carries nothing that
/// tells a mutated Job from one the policy left alone otherwise: a Job skipped through its own
/// metadata, or not opted in when the policy asks for `gpu-guard.io/inject`, counts as
/// protected too.
pub fn is_protected(pod: &Pod) -> bool {
    let skipped = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(SKIP_ANNOTATION))
        .is_some_and(|value| value == "true");
    let job = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))
        .is_some_and(|owner| owner.kind == "Job" && owner.api_version == "batch/v1");
    job && !skipped
}

/// What to do about a pod, by [`stuck_verdict`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stuck {
    /// Not stuck, and not about to be: not protected, not Terminating, terminal, or its node
    /// is Ready (or unknown).
    No,
    /// Terminating on an unready node, not for long enough yet.
    Waiting { stuck_at: Timestamp },
    /// Stuck since `since` (it has been stuck for `afterSeconds` by now): report it, and
    /// force-delete it when `force_delete`.
    Yes {
        since: Timestamp,
        node: String,
        force_delete: bool,
    },
}

/// Judges one pod at `now`, given whether its node is unready (`None`: Ready or unknown).
pub fn stuck_verdict(
    facts: &PodFacts,
    node: Option<&Unready>,
    policy: &Policy,
    now: Timestamp,
) -> Stuck {
    let terminal = matches!(facts.phase.as_deref(), Some("Succeeded" | "Failed"));
    let (Some(deletion), Some(node_name), Some(unready)) =
        (facts.deletion, facts.node.as_ref(), node)
    else {
        return Stuck::No;
    };
    if !facts.protected || terminal {
        return Stuck::No;
    }
    // Both must hold: past its grace period, and on a node that is gone.
    let since = unready.since.map_or(deletion, |since| since.max(deletion));
    let settings = &policy.controller.stuck_pods;
    let after =
        SignedDuration::from_secs(i64::try_from(settings.after_seconds).unwrap_or(i64::MAX));
    let stuck_at = since.checked_add(after).unwrap_or(Timestamp::MAX);
    if now < stuck_at {
        return Stuck::Waiting { stuck_at };
    }
    Stuck::Yes {
        since,
        node: node_name.clone(),
        force_delete: settings.force_delete,
    }
}

/// The note of the Event on a stuck pod.
pub fn stuck_message(facts: &PodFacts, since: Timestamp, force_delete: bool) -> String {
    let node = facts.node.as_deref().unwrap_or("(none)");
    let then = if force_delete {
        "force-deleting it (controller.stuckPods.forceDelete) so its Job can replace it"
    } else {
        "its Job cannot replace it until it is gone: taint the node \
         node.kubernetes.io/out-of-service if it is down (the pod garbage collector then \
         deletes the pod), or enable controller.stuckPods.forceDelete"
    };
    format!(
        "pod {} has been Terminating on node {node}, which is NotReady or unreachable, since \
         {since}; {then}",
        facts.id()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn node(ready: Option<(&str, i64)>, unreachable_at: Option<Option<i64>>) -> Node {
        Node {
            metadata: ObjectMeta::default(),
            spec: Some(NodeSpec {
                taints: unreachable_at.map(|added| {
                    vec![Taint {
                        key: UNREACHABLE_TAINT.to_owned(),
                        effect: "NoExecute".to_owned(),
                        time_added: added.map(|s| Time(at(s))),
                        value: None,
                    }]
                }),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: ready.map(|(status, since)| {
                    vec![NodeCondition {
                        type_: "Ready".to_owned(),
                        status: status.to_owned(),
                        last_transition_time: Some(Time(at(since))),
                        ..NodeCondition::default()
                    }]
                }),
                ..NodeStatus::default()
            }),
        }
    }

    #[test]
    fn a_node_is_unready_by_its_ready_condition_or_its_unreachable_taint() {
        let cases = [
            (node(Some(("True", 0)), None), None),
            (node(None, None), None),
            (node(Some(("False", 10)), None), Some(Some(at(10)))),
            (node(Some(("Unknown", 20)), None), Some(Some(at(20)))),
            // The earliest sign counts.
            (
                node(Some(("Unknown", 50)), Some(Some(40))),
                Some(Some(at(40))),
            ),
            (
                node(Some(("Unknown", 30)), Some(Some(40))),
                Some(Some(at(30))),
            ),
            // Tainted unreachable while Ready still says True (the taint came first).
            (node(Some(("True", 0)), Some(Some(40))), Some(Some(at(40)))),
            (node(None, Some(None)), Some(None)),
        ];
        for (node, expected) in cases {
            assert_eq!(node_unready(&node).map(|u| u.since), expected, "{node:?}");
        }
    }

    fn owned(kind: &str, api_version: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                owner_references: Some(vec![OwnerReference {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                    name: "train".to_owned(),
                    uid: "uid-train".to_owned(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn only_pods_of_jobs_that_did_not_opt_out_are_protected() {
        assert!(is_protected(&owned("Job", "batch/v1")));
        assert!(!is_protected(&owned("ReplicaSet", "apps/v1")));
        assert!(!is_protected(&owned("Job", "example.com/v1")));
        assert!(!is_protected(&Pod::default()));
        let mut skipped = owned("Job", "batch/v1");
        skipped.metadata.annotations =
            Some([(SKIP_ANNOTATION.to_owned(), "true".to_owned())].into());
        assert!(!is_protected(&skipped));
        let mut not_controller = owned("Job", "batch/v1");
        not_controller.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert!(!is_protected(&not_controller));
    }

    fn facts(deletion: Option<i64>, phase: &str, protected: bool) -> PodFacts {
        PodFacts {
            namespace: "ml".to_owned(),
            name: "train-0".to_owned(),
            node: Some("gpu-1".to_owned()),
            phase: Some(phase.to_owned()),
            deleting: deletion.is_some(),
            deletion: deletion.map(at),
            protected,
            ..PodFacts::default()
        }
    }

    #[test]
    fn a_pod_is_stuck_once_both_clocks_ran_for_the_threshold() {
        let mut policy = Policy::default();
        policy.controller.stuck_pods.after_seconds = 300;
        let unready = |since: Option<i64>| {
            Some(Unready {
                since: since.map(at),
            })
        };
        let yes = |since: i64, force_delete: bool| Stuck::Yes {
            since: at(since),
            node: "gpu-1".to_owned(),
            force_delete,
        };
        let waiting = |until: i64| Stuck::Waiting {
            stuck_at: at(until),
        };
        let cases: Vec<(&str, PodFacts, Option<Unready>, i64, Stuck)> = vec![
            (
                "ready node",
                facts(Some(0), "Running", true),
                None,
                1000,
                Stuck::No,
            ),
            (
                "not terminating",
                facts(None, "Running", true),
                unready(Some(0)),
                1000,
                Stuck::No,
            ),
            (
                "not protected",
                facts(Some(0), "Running", false),
                unready(Some(0)),
                1000,
                Stuck::No,
            ),
            (
                "failed",
                facts(Some(0), "Failed", true),
                unready(Some(0)),
                1000,
                Stuck::No,
            ),
            (
                "succeeded",
                facts(Some(0), "Succeeded", true),
                unready(Some(0)),
                1000,
                Stuck::No,
            ),
            // Deleted at 100 (grace period over), node gone since 0: from 100.
            (
                "deletion later",
                facts(Some(100), "Running", true),
                unready(Some(0)),
                399,
                waiting(400),
            ),
            (
                "deletion later, stuck",
                facts(Some(100), "Running", true),
                unready(Some(0)),
                400,
                yes(100, false),
            ),
            // Node gone at 200, after the deletion: from 200.
            (
                "node later",
                facts(Some(100), "Running", true),
                unready(Some(200)),
                450,
                waiting(500),
            ),
            (
                "node later, stuck",
                facts(Some(100), "Running", true),
                unready(Some(200)),
                500,
                yes(200, false),
            ),
            // The node says not since when: the deletion alone.
            (
                "unknown since",
                facts(Some(100), "Running", true),
                unready(None),
                400,
                yes(100, false),
            ),
            // Its grace period is not over (a deletionTimestamp in the future).
            (
                "in grace",
                facts(Some(900), "Running", true),
                unready(Some(0)),
                1000,
                waiting(1200),
            ),
            (
                "pending",
                facts(Some(0), "Pending", true),
                unready(Some(0)),
                300,
                yes(0, false),
            ),
        ];
        for (name, pod, node, now, expected) in &cases {
            assert_eq!(
                stuck_verdict(pod, node.as_ref(), &policy, at(*now)),
                *expected,
                "{name}"
            );
        }
        policy.controller.stuck_pods.force_delete = true;
        assert_eq!(
            stuck_verdict(
                &facts(Some(0), "Running", true),
                unready(Some(0)).as_ref(),
                &policy,
                at(300)
            ),
            yes(0, true)
        );
        policy.controller.stuck_pods.after_seconds = 0;
        assert_eq!(
            stuck_verdict(
                &facts(Some(5), "Running", true),
                unready(Some(0)).as_ref(),
                &policy,
                at(5)
            ),
            yes(5, true)
        );
    }

    #[test]
    fn the_message_names_the_pod_the_node_and_what_to_do() {
        let pod = facts(Some(0), "Running", true);
        assert_eq!(
            stuck_message(&pod, at(0), false),
            "pod ml/train-0 has been Terminating on node gpu-1, which is NotReady or \
             unreachable, since 2027-01-15T08:00:00Z; its Job cannot replace it until it is \
             gone: taint the node node.kubernetes.io/out-of-service if it is down (the pod \
             garbage collector then deletes the pod), or enable controller.stuckPods.forceDelete"
        );
        assert!(stuck_message(&pod, at(0), true).ends_with(
            "force-deleting it (controller.stuckPods.forceDelete) so its Job can replace it"
        ));
    }
}
