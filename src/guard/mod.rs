//! PURE: the GPU-node priority guard. A workload (a Pod or a pod template) and a read-only
//! [`ClusterView`] in, a [`Verdict`] out. No IO, no async.

mod view;

pub use view::{BUILT_IN_PRIORITY_CLASSES, ClusterView, KnownNode, StaticView};
