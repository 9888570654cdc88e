//! What the guard may know of the cluster: a read-only view, passed in as an argument. The
//! server backs it with reflector caches ([`crate::cluster`]); `serve --no-cluster` and
//! `gpu-guard check` with [`StaticView`] (policy file, flags, manifests).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use crate::devices::{DraFacts, DraObjects, Lookup, NoDraFacts};
use crate::policy::OfflineCluster;

/// The built-in PriorityClasses every cluster has, known without one.
pub const BUILT_IN_PRIORITY_CLASSES: [(&str, i32); 2] = [
    ("system-cluster-critical", 2_000_000_000),
    ("system-node-critical", 2_000_001_000),
];

/// What the view knows of a node.
#[derive(Clone, Debug)]
pub enum KnownNode {
    /// The Node object (from the cache: labels, capacity and taints at least).
    Object(Arc<Node>),
    /// Listed as a GPU node in the policy file (`guard.offline.gpuNodes`).
    ListedGpuNode,
}

/// A read-only view of the cluster. Implementations answer from memory: no API call.
pub trait ClusterView: Send + Sync {
    /// Whether the view is complete (its caches have listed once). A name the view does not
    /// know is a finding only in a synced view; in an unsynced one it is an internal error.
    fn synced(&self) -> bool;
    /// Whether a PriorityClass the view does not know does not exist. True for the cluster
    /// caches; false for the offline view, which knows only what it was told, so that a
    /// class missing from it leaves the workload unjudged instead of denied.
    fn authoritative(&self) -> bool {
        true
    }
    /// The value of the PriorityClass `name`, if known (built-in classes included).
    fn priority_class(&self, name: &str) -> Option<i32>;
    /// The PriorityClass with `globalDefault: true` (name and value), if there is one.
    fn global_default_priority_class(&self) -> Option<(String, i32)>;
    /// The node `name`, if known.
    fn node(&self, name: &str) -> Option<KnownNode>;
    /// The DRA objects the view knows (ResourceClaimTemplates, ResourceClaims, DeviceClasses),
    /// to tell whether a container's claim is a device.
    fn dra(&self) -> &dyn DraFacts {
        &NoDraFacts
    }
}

/// A view built from the policy file, `--priority-class` flags and objects found in
/// manifests: always synced.
#[derive(Clone, Debug, Default)]
pub struct StaticView {
    classes: BTreeMap<String, (i32, bool)>,
    gpu_nodes: Vec<String>,
    nodes: BTreeMap<String, Arc<Node>>,
    authoritative: bool,
    dra: DraObjects,
}

impl StaticView {
    /// The built-in classes and the `guard.offline` section of the policy file.
    pub fn from_policy(offline: &OfflineCluster) -> Self {
        let mut view = Self::default();
        for (name, value) in BUILT_IN_PRIORITY_CLASSES {
            view.add_priority_class(name, value, false);
        }
        for class in &offline.priority_classes {
            view.add_priority_class(&class.name, class.value, class.global_default);
        }
        view.gpu_nodes = offline.gpu_nodes.clone();
        view
    }

    /// Marks the view as knowing every PriorityClass there is (the classes were read from a
    /// cluster), so that an unknown class name is a finding.
    #[must_use]
    pub fn authoritative(mut self) -> Self {
        self.authoritative = true;
        self
    }

    /// Adds (or replaces) a PriorityClass.
    pub fn add_priority_class(&mut self, name: &str, value: i32, global_default: bool) {
        self.classes
            .insert(name.to_owned(), (value, global_default));
    }

    /// Adds a ResourceClaimTemplate, ResourceClaim or DeviceClass given as JSON; returns
    /// whether `object` was one.
    pub fn add_dra_object(&mut self, object: &serde_json::Value) -> bool {
        self.dra.add(object)
    }

    /// Adds (or replaces) a Node object.
    pub fn add_node(&mut self, node: Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.nodes.insert(name, Arc::new(node));
    }
}

impl ClusterView for StaticView {
    fn synced(&self) -> bool {
        true
    }

    fn authoritative(&self) -> bool {
        self.authoritative
    }

    fn priority_class(&self, name: &str) -> Option<i32> {
        self.classes.get(name).map(|(value, _)| *value)
    }

    fn global_default_priority_class(&self) -> Option<(String, i32)> {
        // Like the API server's Priority plugin: with several defaults, the lowest value wins.
        self.classes
            .iter()
            .filter(|(_, (_, global_default))| *global_default)
            .min_by_key(|(_, (value, _))| *value)
            .map(|(name, (value, _))| (name.clone(), *value))
    }

    fn dra(&self) -> &dyn DraFacts {
        &self.dra
    }

    fn node(&self, name: &str) -> Option<KnownNode> {
        if let Some(node) = self.nodes.get(name) {
            return Some(KnownNode::Object(node.clone()));
        }
        self.gpu_nodes
            .iter()
            .any(|listed| listed == name)
            .then_some(KnownNode::ListedGpuNode)
    }
}
/// Facts from the manifests laid over a cluster's view: what the manifests define wins, the
/// cluster answers the rest (and says whether the whole is complete).
pub struct Layered<'a> {
    pub over: StaticView,
    pub under: &'a dyn ClusterView,
}

impl ClusterView for Layered<'_> {
    fn synced(&self) -> bool {
        self.under.synced()
    }

    fn authoritative(&self) -> bool {
        self.under.authoritative()
    }

    fn priority_class(&self, name: &str) -> Option<i32> {
        self.over
            .priority_class(name)
            .or_else(|| self.under.priority_class(name))
    }

    fn global_default_priority_class(&self) -> Option<(String, i32)> {
        self.over
            .global_default_priority_class()
            .or_else(|| self.under.global_default_priority_class())
    }

    fn node(&self, name: &str) -> Option<KnownNode> {
        self.over.node(name).or_else(|| self.under.node(name))
    }

    fn dra(&self) -> &dyn DraFacts {
        self
    }
}

impl DraFacts for Layered<'_> {
    fn claim_template(&self, namespace: &str, name: &str) -> Lookup {
        match self.over.dra.claim_template(namespace, name) {
            Lookup::Found(devices) => Lookup::Found(devices),
            _ => self.under.dra().claim_template(namespace, name),
        }
    }

    fn claim(&self, namespace: &str, name: &str) -> Lookup {
        match self.over.dra.claim(namespace, name) {
            Lookup::Found(devices) => Lookup::Found(devices),
            _ => self.under.dra().claim(namespace, name),
        }
    }

    fn class_of_extended_resource(&self, resource: &str) -> Option<String> {
        self.over
            .dra
            .class_of_extended_resource(resource)
            .or_else(|| self.under.dra().class_of_extended_resource(resource))
    }
}
