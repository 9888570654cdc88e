//! PURE: the one rule of "this container uses a device", for device-plugin resources and for
//! GPUs claimed through Dynamic Resource Allocation (DRA, `resource.k8s.io/v1`, GA in 1.34).
//!
//! A container uses a device when
//! - it requests or limits an extended resource the policy lists (`nvidia.com/gpu`), or
//!   `deviceclass.resource.kubernetes.io/<class>` for a listed DeviceClass (DRA's implicit
//!   extended resource, every DeviceClass has one), or the extended resource a DeviceClass maps
//!   with `spec.extendedResourceName` when that class is listed (DRA extended-resource support,
//!   beta in 1.36: `staging/src/k8s.io/api/resource/v1/types.go`, `DeviceClassSpec`); or
//! - it names, in `resources.claims`, a pod claim (`spec.resourceClaims[]`, from a
//!   `resourceClaimTemplateName` or a `resourceClaimName`) whose requests ask for a listed
//!   DeviceClass: `spec.devices.requests[].exactly.deviceClassName`, or any
//!   `firstAvailable[].deviceClassName` alternative (a container that names one `request`, or
//!   `request/subrequest`, uses only that one).
//!
//! ResourceClaimTemplates, ResourceClaims and DeviceClasses are facts about the cluster, given
//! through [`DraFacts`]: the webhook's caches, the documents of a manifest, or nothing. A claim
//! that cannot be resolved is never guessed: the answer says so ([`ContainerDevices::unresolved`]).

mod dra;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodResourceClaim, ResourceClaim};

pub use crate::policy::DeviceResources;
pub use dra::{ClaimDevices, ClaimRequest, DraFacts, DraObjects, Lookup, NoDraFacts};

/// The prefix of the implicit extended resource of every DeviceClass
/// (`deviceclass.resource.kubernetes.io/<class name>`, KEP-5004).
pub const IMPLICIT_EXTENDED_RESOURCE_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// One device a container uses, and where it is named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceUse {
    /// An extended resource under `resources.limits` or `resources.requests` (`field`).
    Resource {
        field: &'static str,
        resource: String,
    },
    /// A DRA claim in `resources.claims[index]`, asking for `class`.
    Claim {
        index: usize,
        claim: String,
        class: String,
    },
}

impl DeviceUse {
    /// For messages: `the device nvidia.com/gpu`, `the DRA claim "gpus" (gpu.nvidia.com)`.
    pub fn describe(&self) -> String {
        match self {
            Self::Resource { resource, .. } => format!("the device {resource}"),
            Self::Claim { claim, class, .. } => {
                format!("the DRA claim {claim:?} (DeviceClass {class})")
            }
        }
    }
}

/// A claim the device rule could not resolve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnresolvedClaim {
    /// The container's claim (`resources.claims[].name`).
    pub claim: String,
    /// `ResourceClaimTemplate ns/name` or `ResourceClaim ns/name`.
    pub object: String,
    /// Known not to exist (else: not known).
    pub missing: bool,
}

impl UnresolvedClaim {
    /// `ResourceClaimTemplate ml/x is not known`: the short form, for admission warnings.
    pub fn what(&self) -> String {
        let state = if self.missing {
            "does not exist"
        } else {
            "is not known"
        };
        format!("{} {state}", self.object)
    }
}

impl std::fmt::Display for UnresolvedClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (claim {:?})", self.what(), self.claim)
    }
}

/// What the device rule found for one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerDevices {
    /// The devices it uses (empty: none known).
    pub devices: Vec<DeviceUse>,
    /// Claims it names that could not be resolved (never guessed to be devices or not).
    pub unresolved: Vec<UnresolvedClaim>,
}

impl ContainerDevices {
    pub fn uses_device(&self) -> bool {
        !self.devices.is_empty()
    }
}

/// The `resources` of a container, borrowed from whichever shape it was decoded into (a typed
/// `Container`, the guard's slimmer view): the rule reads only the names of its limits and
/// requests, and its claims.
#[derive(Debug)]
pub struct ContainerResources<'a, V> {
    pub limits: Option<&'a BTreeMap<String, V>>,
    pub requests: Option<&'a BTreeMap<String, V>>,
    /// `resources.claims`: the pod claims (DRA) the container uses.
    pub claims: Option<&'a [ResourceClaim]>,
}

impl<V> Clone for ContainerResources<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for ContainerResources<'_, V> {}

impl<'a> ContainerResources<'a, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    /// The resources of a typed container.
    pub fn of(container: &'a Container) -> Self {
        let resources = container.resources.as_ref();
        Self {
            limits: resources.and_then(|r| r.limits.as_ref()),
            requests: resources.and_then(|r| r.requests.as_ref()),
            claims: resources.and_then(|r| r.claims.as_deref()),
        }
    }
}

/// The rule, over the policy's `devices` section.
impl DeviceResources {
    /// The device resources a container's `resources` name: each `(field, resource)` with
    /// `field` `"limits"` or `"requests"`, limits first, in key order, without cluster facts.
    /// The controller's question about a running pod, whose claims it reads from the pod's
    /// status instead.
    pub fn devices_in<'a, V>(
        &'a self,
        limits: Option<&'a BTreeMap<String, V>>,
        requests: Option<&'a BTreeMap<String, V>>,
    ) -> impl Iterator<Item = (&'static str, &'a str)> + 'a {
        self.extended_devices(limits, requests, &NoDraFacts)
    }

    /// [`Self::devices_in`], with the DeviceClasses of `facts`.
    fn extended_devices<'a, V>(
        &'a self,
        limits: Option<&'a BTreeMap<String, V>>,
        requests: Option<&'a BTreeMap<String, V>>,
        facts: &'a dyn DraFacts,
    ) -> impl Iterator<Item = (&'static str, &'a str)> + 'a {
        [("limits", limits), ("requests", requests)]
            .into_iter()
            .flat_map(|(field, names)| {
                names
                    .into_iter()
                    .flatten()
                    .map(move |(name, _)| (field, name))
            })
            .filter(move |(_, name)| self.is_device_resource_in(name, facts))
            .map(|(field, name)| (field, name.as_str()))
    }

    /// Whether a resource name (a key of `resources.requests` or `resources.limits`, or of a
    /// Node's capacity) is a device, without cluster facts (a listed name or prefix, or a
    /// listed DeviceClass's implicit name).
    pub fn is_device_resource(&self, resource: &str) -> bool {
        self.is_device_resource_in(resource, &NoDraFacts)
    }

    /// [`Self::is_device_resource`], and the extended resource a listed DeviceClass maps.
    fn is_device_resource_in(&self, resource: &str, facts: &dyn DraFacts) -> bool {
        self.names.iter().any(|name| name == resource)
            || self
                .prefixes
                .iter()
                .any(|prefix| resource.starts_with(prefix.as_str()))
            || resource
                .strip_prefix(IMPLICIT_EXTENDED_RESOURCE_PREFIX)
                .is_some_and(|class| self.is_device_class(class))
            || (resource.contains('/')
                && facts
                    .class_of_extended_resource(resource)
                    .is_some_and(|class| self.is_device_class(&class)))
    }

    /// Whether a DRA DeviceClass is a device class.
    pub fn is_device_class(&self, class: &str) -> bool {
        self.classes.iter().any(|name| name == class)
            || self
                .class_prefixes
                .iter()
                .any(|prefix| class.starts_with(prefix.as_str()))
    }

    /// Whether the devices a DRA driver publishes (in ResourceSlices) and allocates are GPUs.
    pub fn is_device_driver(&self, driver: &str) -> bool {
        self.drivers.iter().any(|known| known == driver)
    }

    /// The one rule: the devices a container of a pod in `namespace` whose
    /// `spec.resourceClaims` are `pod_claims` uses, extended resources first, then claims.
    pub fn container_devices<V>(
        &self,
        resources: ContainerResources<'_, V>,
        pod_claims: Option<&[PodResourceClaim]>,
        namespace: &str,
        facts: &dyn DraFacts,
    ) -> ContainerDevices {
        let mut found = ContainerDevices {
            devices: self
                .extended_devices(resources.limits, resources.requests, facts)
                .map(|(field, resource)| DeviceUse::Resource {
                    field,
                    resource: resource.to_owned(),
                })
                .collect(),
            unresolved: Vec::new(),
        };
        self.add_claimed_devices(resources.claims, pod_claims, namespace, facts, &mut found);
        found
    }

    /// The DRA half of [`Self::container_devices`]: the devices a container's
    /// `resources.claims` ask for.
    fn add_claimed_devices(
        &self,
        claims: Option<&[ResourceClaim]>,
        pod_claims: Option<&[PodResourceClaim]>,
        namespace: &str,
        facts: &dyn DraFacts,
        found: &mut ContainerDevices,
    ) {
        for (index, claim) in claims.into_iter().flatten().enumerate() {
            let source = pod_claims
                .into_iter()
                .flatten()
                .find(|pod_claim| pod_claim.name == claim.name);
            let lookup = match source {
                Some(PodResourceClaim {
                    resource_claim_template_name: Some(template),
                    ..
                }) => (
                    facts.claim_template(namespace, template),
                    format!("ResourceClaimTemplate {namespace}/{template}"),
                ),
                Some(PodResourceClaim {
                    resource_claim_name: Some(name),
                    ..
                }) => (
                    facts.claim(namespace, name),
                    format!("ResourceClaim {namespace}/{name}"),
                ),
                // The API server refuses a container claim without its pod claim.
                _ => continue,
            };
            match lookup {
                (Lookup::Found(devices), _) => {
                    if let Some(class) = devices
                        .classes_for(claim.request.as_deref())
                        .find(|class| self.is_device_class(class))
                    {
                        found.devices.push(DeviceUse::Claim {
                            index,
                            claim: claim.name.clone(),
                            class: class.to_owned(),
                        });
                    }
                }
                (lookup, object) => found.unresolved.push(UnresolvedClaim {
                    claim: claim.name.clone(),
                    object,
                    missing: lookup == Lookup::Missing,
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts() -> DraObjects {
        let mut facts = DraObjects {
            complete: true,
            ..DraObjects::default()
        };
        for object in [
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"namespace": "ml", "name": "one-gpu"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"namespace": "ml", "name": "mixed"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
                    {"name": "accel", "firstAvailable": [
                        {"name": "big", "deviceClassName": "gpu.nvidia.com"},
                        {"name": "small", "deviceClassName": "mig.nvidia.com"},
                        {"name": "none", "deviceClassName": "cpu.example.com"}]}]}}}}),
            json!({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaimTemplate",
                "metadata": {"namespace": "ml", "name": "beta"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]}}}}),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"namespace": "ml", "name": "shared"},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.amd.com"}}]}}}),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": "gpu.nvidia.com"},
                "spec": {"extendedResourceName": "example.com/gpu"}}),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": "nic.example.com"},
                "spec": {"extendedResourceName": "example.com/nic"}}),
        ] {
            assert!(facts.add(&object), "{object}");
        }
        facts
    }

    fn container(resources: serde_json::Value) -> Container {
        serde_json::from_value(json!({"name": "main", "resources": resources})).unwrap()
    }

    fn pod_claims() -> Vec<PodResourceClaim> {
        serde_json::from_value(json!([
            {"name": "gpus", "resourceClaimTemplateName": "one-gpu"},
            {"name": "mixed", "resourceClaimTemplateName": "mixed"},
            {"name": "beta", "resourceClaimTemplateName": "beta"},
            {"name": "shared", "resourceClaimName": "shared"},
            {"name": "lost", "resourceClaimTemplateName": "not-there"},
        ]))
        .unwrap()
    }

    /// (case, container resources, device uses found, unresolved count)
    #[test]
    fn the_device_rule_reads_extended_resources_and_dra_claims() {
        let devices = DeviceResources::default();
        let facts = facts();
        let cases = [
            (
                "a listed extended resource",
                json!({"limits": {"nvidia.com/gpu": "1"}}),
                vec!["the device nvidia.com/gpu"],
                0,
            ),
            (
                "a listed class's implicit extended resource",
                json!({"requests": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "2"}}),
                vec!["the device deviceclass.resource.kubernetes.io/gpu.nvidia.com"],
                0,
            ),
            (
                "an unlisted class's implicit extended resource",
                json!({"requests": {"deviceclass.resource.kubernetes.io/nic.example.com": "1"}}),
                vec![],
                0,
            ),
            (
                "a DeviceClass's extendedResourceName of a listed class",
                json!({"limits": {"example.com/gpu": "1"}}),
                vec!["the device example.com/gpu"],
                0,
            ),
            (
                "a DeviceClass's extendedResourceName of an unlisted class",
                json!({"limits": {"example.com/nic": "1"}}),
                vec![],
                0,
            ),
            (
                "a claim from a template asking for a listed class (exactly)",
                json!({"claims": [{"name": "gpus"}]}),
                vec![r#"the DRA claim "gpus" (DeviceClass gpu.nvidia.com)"#],
                0,
            ),
            (
                "a v1beta1 template (deviceClassName on the request)",
                json!({"claims": [{"name": "beta"}]}),
                vec![r#"the DRA claim "beta" (DeviceClass gpu.nvidia.com)"#],
                0,
            ),
            (
                "a shared ResourceClaim",
                json!({"claims": [{"name": "shared"}]}),
                vec![r#"the DRA claim "shared" (DeviceClass gpu.amd.com)"#],
                0,
            ),
            (
                "the whole claim: one request is a firstAvailable GPU",
                json!({"claims": [{"name": "mixed"}]}),
                vec![r#"the DRA claim "mixed" (DeviceClass gpu.nvidia.com)"#],
                0,
            ),
            (
                "only the NIC request of the claim",
                json!({"claims": [{"name": "mixed", "request": "nic"}]}),
                vec![],
                0,
            ),
            (
                "one firstAvailable alternative, by subrequest",
                json!({"claims": [{"name": "mixed", "request": "accel/small"}]}),
                vec![r#"the DRA claim "mixed" (DeviceClass mig.nvidia.com)"#],
                0,
            ),
            (
                "an alternative of no listed class",
                json!({"claims": [{"name": "mixed", "request": "accel/none"}]}),
                vec![],
                0,
            ),
            (
                "a template that does not exist is reported, not guessed",
                json!({"claims": [{"name": "lost"}]}),
                vec![],
                1,
            ),
            (
                "a container claim without its pod claim (the API refuses it)",
                json!({"claims": [{"name": "nowhere"}]}),
                vec![],
                0,
            ),
        ];
        for (case, resources, expected, unresolved) in cases {
            let found = devices.container_devices(
                ContainerResources::of(&container(resources)),
                Some(&pod_claims()),
                "ml",
                &facts,
            );
            let described: Vec<String> = found.devices.iter().map(DeviceUse::describe).collect();
            assert_eq!(described, expected, "{case}");
            assert_eq!(
                found.unresolved.len(),
                unresolved,
                "{case}: {:?}",
                found.unresolved
            );
        }
    }

    #[test]
    fn an_unknown_template_is_not_known_and_a_missing_one_does_not_exist() {
        let devices = DeviceResources::default();
        let gpus = container(json!({"claims": [{"name": "gpus"}]}));
        let claims = pod_claims();
        let unknown = devices.container_devices(
            ContainerResources::of(&gpus),
            Some(&claims),
            "ml",
            &NoDraFacts,
        );
        assert!(!unknown.uses_device());
        assert_eq!(
            unknown.unresolved[0].to_string(),
            r#"ResourceClaimTemplate ml/one-gpu is not known (claim "gpus")"#
        );
        let elsewhere = devices.container_devices(
            ContainerResources::of(&gpus),
            Some(&claims),
            "other",
            &facts(),
        );
        assert_eq!(
            elsewhere.unresolved[0].what(),
            "ResourceClaimTemplate other/one-gpu does not exist"
        );
    }

    #[test]
    fn documents_without_a_namespace_match_the_workload_beside_them() {
        let mut facts = DraObjects::default();
        facts.add(
            &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}),
        );
        assert!(matches!(
            facts.claim_template("team-a", "one-gpu"),
            Lookup::Found(_)
        ));
        assert_eq!(facts.claim_template("team-a", "other"), Lookup::Unknown);
        // Not a DRA object.
        assert!(!facts.add(&json!({"apiVersion": "v1", "kind": "ConfigMap"})));
    }
}
