//! PURE: the GPU-node priority guard. A [`Workload`] (a Pod or a pod template) and a read-only
//! [`ClusterView`] in, a [`Verdict`] out. No IO, no async: the webhook and `gpu-guard check`
//! call [`judge`] and cannot disagree.
//!
//! A workload **targets GPU nodes** when a container or init container requests or limits a
//! device, a toleration tolerates a GPU node taint (an `Exists` toleration without a key
//! tolerates every taint), `nodeSelector` or a required node-affinity term selects a GPU node
//! label (or names a GPU node in `matchFields`), or `spec.nodeName` names a GPU node. It must
//! then reach `minimumPriority.withDevice` when it uses a device, `withoutDevice` otherwise.
//! Every reason is reported at once, each with its field and the fix. A node agent (a
//! DaemonSet, or a pod whose controller is one) that uses no device is not judged unless
//! `guard.exemptions.nodeAgents` is false: the GPU stack's own agents are DaemonSets.
//!
//! | file | what it holds |
//! |---|---|
//! | `input.rs` | [`GuardedKind`] and the [`Workload`] decoded from an object's JSON |
//! | `view.rs` | the [`ClusterView`] the guard asks about nodes and PriorityClasses |
//! | `judge.rs` | [`judge`]: each pod template alone, then the workload's verdict |
//! | `exemptions.rs` | the policy file's exemptions, and mirror pods |
//! | `targets.rs` | what makes a pod spec target GPU nodes, and a node a GPU node |
//! | `verdict.rs` | the [`Verdict`] and what a violation carries |
//! | `messages.rs` | verdicts in words: messages, admission warnings, the fix |

mod exemptions;
mod input;
mod judge;
mod messages;
mod targets;
mod verdict;
mod view;

#[cfg(test)]
mod tests;

pub use exemptions::MIRROR_POD_ANNOTATION;
pub use input::{
    AffinityView, ContainerView, DecodeError, GuardedKind, Metadata, NodeAffinityView,
    OwnerReference, PodSpecView, PodTemplateView, ResourcesView, Workload,
};
pub use judge::judge;
pub use targets::gpu_node_reason;
pub use verdict::{Allowed, NotSynced, Priority, PriorityViolation, Target, Unjudged, Verdict};
pub use view::{BUILT_IN_PRIORITY_CLASSES, ClusterView, KnownNode, Layered, StaticView};
