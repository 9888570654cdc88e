//! kube-rs reflectors for PriorityClasses and Nodes behind a read-only [`crate::guard::ClusterView`].
