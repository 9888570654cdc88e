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

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodResourceClaim, ResourceClaim};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The prefix of the implicit extended resource of every DeviceClass
/// (`deviceclass.resource.kubernetes.io/<class name>`, KEP-5004).
pub const IMPLICIT_EXTENDED_RESOURCE_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Extended resources and DRA DeviceClasses that mark a container as using a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DeviceResources {
    /// Exact resource names, e.g. `nvidia.com/gpu`.
    pub names: Vec<String>,
    /// Name prefixes, e.g. `nvidia.com/mig-` for every MIG profile.
    pub prefixes: Vec<String>,
    /// Exact DRA DeviceClass names whose devices are devices, e.g. `gpu.nvidia.com`.
    pub classes: Vec<String>,
    /// DeviceClass name prefixes.
    pub class_prefixes: Vec<String>,
    /// DRA drivers whose devices are GPUs: the node health controller counts the devices their
    /// ResourceSlices publish for a node (and those tainted unusable), beside the extended
    /// resources of its status, and only their devices mark a pod the kubelet reports an
    /// unhealthy DRA device of.
    pub drivers: Vec<String>,
}

impl Default for DeviceResources {
    fn default() -> Self {
        Self {
            names: ["nvidia.com/gpu", "amd.com/gpu"].map(String::from).to_vec(),
            prefixes: vec!["nvidia.com/mig-".to_owned()],
            classes: ["gpu.nvidia.com", "mig.nvidia.com", "gpu.amd.com"]
                .map(String::from)
                .to_vec(),
            class_prefixes: Vec::new(),
            drivers: ["gpu.nvidia.com", "gpu.amd.com"].map(String::from).to_vec(),
        }
    }
}

/// The device classes one request of a claim asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The request's name.
    pub name: String,
    /// `exactly.deviceClassName` as `(None, class)`, and each `firstAvailable` alternative as
    /// `(Some(subrequest), class)`.
    pub classes: Vec<(Option<String>, String)>,
}

/// What a ResourceClaimTemplate's or ResourceClaim's `devices.requests` ask for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimDevices {
    pub requests: Vec<ClaimRequest>,
}

impl ClaimDevices {
    /// Reads the `devices.requests` of a claim spec (a ResourceClaim's `spec`, a
    /// ResourceClaimTemplate's `spec.spec`) given as JSON.
    pub fn from_claim_spec(spec: &serde_json::Value) -> Self {
        let requests = spec
            .pointer("/devices/requests")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .map(|request| {
                let text = |value: &serde_json::Value, key: &str| {
                    value
                        .get(key)
                        .and_then(serde_json::Value::as_str)
                        .map(str::to_owned)
                };
                let mut classes = Vec::new();
                // `resource.k8s.io/v1` and `v1beta2` wrap a single request in `exactly`;
                // `v1beta1` (still in manifests) has its fields on the request itself.
                if let Some(class) = request
                    .get("exactly")
                    .and_then(|exactly| text(exactly, "deviceClassName"))
                    .or_else(|| text(request, "deviceClassName"))
                {
                    classes.push((None, class));
                }
                for alternative in request
                    .get("firstAvailable")
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(class) = text(alternative, "deviceClassName") {
                        classes.push((text(alternative, "name"), class));
                    }
                }
                ClaimRequest {
                    name: text(request, "name").unwrap_or_default(),
                    classes,
                }
            })
            .collect();
        Self { requests }
    }

    /// Reads the requests of a typed `resource.k8s.io/v1` claim spec's `devices`.
    pub fn from_device_claim(
        devices: Option<&k8s_openapi::api::resource::v1::DeviceClaim>,
    ) -> Self {
        let requests = devices
            .and_then(|devices| devices.requests.as_ref())
            .into_iter()
            .flatten()
            .map(|request| ClaimRequest {
                name: request.name.clone(),
                classes: request
                    .exactly
                    .iter()
                    .map(|exactly| (None, exactly.device_class_name.clone()))
                    .chain(request.first_available.iter().flatten().map(|alternative| {
                        (
                            Some(alternative.name.clone()),
                            alternative.device_class_name.clone(),
                        )
                    }))
                    .collect(),
            })
            .collect();
        Self { requests }
    }

    /// The classes a container gets from this claim: all, or those of one `request` (or
    /// `request/subrequest`).
    fn classes_for<'a>(&'a self, request: Option<&'a str>) -> impl Iterator<Item = &'a str> {
        let (wanted, sub) = match request.filter(|r| !r.is_empty()) {
            None => (None, None),
            Some(request) => match request.split_once('/') {
                Some((request, sub)) => (Some(request), Some(sub)),
                None => (Some(request), None),
            },
        };
        self.requests
            .iter()
            .filter(move |r| wanted.is_none_or(|wanted| r.name == wanted))
            .flat_map(move |r| {
                r.classes
                    .iter()
                    .filter(move |(name, _)| sub.is_none_or(|sub| name.as_deref() == Some(sub)))
                    .map(|(_, class)| class.as_str())
            })
    }
}

/// What is known of one ResourceClaimTemplate or ResourceClaim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(ClaimDevices),
    /// Known not to exist (the source is complete and has no such object).
    Missing,
    /// Not known: the source is incomplete (a cache not synced yet, a manifest without it).
    Unknown,
}

/// The DRA objects of a cluster that the device rule reads.
pub trait DraFacts: Send + Sync {
    /// The ResourceClaimTemplate `name` in `namespace`.
    fn claim_template(&self, namespace: &str, name: &str) -> Lookup;
    /// The ResourceClaim `name` in `namespace`.
    fn claim(&self, namespace: &str, name: &str) -> Lookup;
    /// The DeviceClass whose `spec.extendedResourceName` is `resource`, if one is known.
    fn class_of_extended_resource(&self, resource: &str) -> Option<String>;
}

/// No DRA objects known at all: every claim is [`Lookup::Unknown`].
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDraFacts;

impl DraFacts for NoDraFacts {
    fn claim_template(&self, _: &str, _: &str) -> Lookup {
        Lookup::Unknown
    }
    fn claim(&self, _: &str, _: &str) -> Lookup {
        Lookup::Unknown
    }
    fn class_of_extended_resource(&self, _: &str) -> Option<String> {
        None
    }
}

/// DRA objects read from documents (a manifest's, a test's): complete for what they hold only
/// when `complete` says so.
#[derive(Clone, Debug, Default)]
pub struct DraObjects {
    /// `(namespace, name)` to devices; the namespace is `""` when a document names none.
    pub templates: BTreeMap<(String, String), ClaimDevices>,
    pub claims: BTreeMap<(String, String), ClaimDevices>,
    /// `spec.extendedResourceName` to DeviceClass name.
    pub extended_resources: BTreeMap<String, String>,
    /// Whether an object absent here does not exist (a synced cache) or is only not known.
    pub complete: bool,
}

impl DraObjects {
    /// Adds a `resource.k8s.io` ResourceClaimTemplate, ResourceClaim or DeviceClass given as
    /// JSON; returns whether `object` was one.
    pub fn add(&mut self, object: &serde_json::Value) -> bool {
        let api_version = object.get("apiVersion").and_then(serde_json::Value::as_str);
        if !api_version.is_some_and(|v| v.starts_with("resource.k8s.io/")) {
            return false;
        }
        let text = |pointer: &str| {
            object
                .pointer(pointer)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let key = (text("/metadata/namespace"), text("/metadata/name"));
        match object.get("kind").and_then(serde_json::Value::as_str) {
            Some("ResourceClaimTemplate") => {
                let spec = object
                    .pointer("/spec/spec")
                    .unwrap_or(&serde_json::Value::Null);
                self.templates
                    .insert(key, ClaimDevices::from_claim_spec(spec));
            }
            Some("ResourceClaim") => {
                let spec = object.get("spec").unwrap_or(&serde_json::Value::Null);
                self.claims.insert(key, ClaimDevices::from_claim_spec(spec));
            }
            Some("DeviceClass") => {
                let resource = text("/spec/extendedResourceName");
                if !resource.is_empty() {
                    self.extended_resources.insert(resource, key.1);
                }
            }
            _ => return false,
        }
        true
    }

    fn lookup(
        &self,
        map: &BTreeMap<(String, String), ClaimDevices>,
        ns: &str,
        name: &str,
    ) -> Lookup {
        let found = map
            .get(&(ns.to_owned(), name.to_owned()))
            // A document without a namespace is applied to the namespace of the Job beside it.
            .or_else(|| map.get(&(String::new(), name.to_owned())))
            // A Job without a namespace: the one object of that name, if there is just one.
            .or_else(|| {
                let mut named = map.iter().filter(|((_, n), _)| n == name);
                match (ns.is_empty(), named.next(), named.next()) {
                    (true, Some((_, devices)), None) => Some(devices),
                    _ => None,
                }
            });
        match found {
            Some(devices) => Lookup::Found(devices.clone()),
            None if self.complete => Lookup::Missing,
            None => Lookup::Unknown,
        }
    }
}

impl DraFacts for DraObjects {
    fn claim_template(&self, namespace: &str, name: &str) -> Lookup {
        self.lookup(&self.templates, namespace, name)
    }
    fn claim(&self, namespace: &str, name: &str) -> Lookup {
        self.lookup(&self.claims, namespace, name)
    }
    fn class_of_extended_resource(&self, resource: &str) -> Option<String> {
        self.extended_resources.get(resource).cloned()
    }
}

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

impl DeviceResources {
    /// The device resources a container's `resources` name: each `(field, resource)` with
    /// `field` `"limits"` or `"requests"`, limits first, in key order. The extended-resource
    /// half of [`DeviceResources::container_devices`], which needs no cluster facts except a
    /// DeviceClass's `extendedResourceName`.
    pub fn devices_in<'a, V>(
        &'a self,
        limits: Option<&'a BTreeMap<String, V>>,
        requests: Option<&'a BTreeMap<String, V>>,
    ) -> impl Iterator<Item = (&'static str, &'a str)> + 'a {
        self.devices_in_with(limits, requests, &NoDraFacts)
    }

    /// [`Self::devices_in`], with the DeviceClasses of `facts`.
    pub fn devices_in_with<'a, V>(
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

    /// Whether a resource name (a key of `resources.requests` or `resources.limits`) is a device,
    /// without cluster facts (a listed name or prefix, or a listed DeviceClass's implicit name).
    pub fn is_device_resource(&self, resource: &str) -> bool {
        self.is_device_resource_in(resource, &NoDraFacts)
    }

    /// [`Self::is_device_resource`], and the extended resource a listed DeviceClass maps.
    pub fn is_device_resource_in(&self, resource: &str, facts: &dyn DraFacts) -> bool {
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

    /// The one rule: the devices `container` of a pod in `namespace` whose `spec.resourceClaims`
    /// are `pod_claims` uses.
    pub fn container_devices(
        &self,
        container: &Container,
        pod_claims: Option<&[PodResourceClaim]>,
        namespace: &str,
        facts: &dyn DraFacts,
    ) -> ContainerDevices {
        let Some(resources) = &container.resources else {
            return ContainerDevices::default();
        };
        let mut found =
            self.claimed_devices(resources.claims.as_deref(), pod_claims, namespace, facts);
        let extended = self
            .devices_in_with(
                resources.limits.as_ref(),
                resources.requests.as_ref(),
                facts,
            )
            .map(|(field, resource)| DeviceUse::Resource {
                field,
                resource: resource.to_owned(),
            });
        found.devices.splice(0..0, extended);
        found
    }

    /// The DRA half of [`Self::container_devices`]: the devices a container's
    /// `resources.claims` ask for.
    pub fn claimed_devices(
        &self,
        claims: Option<&[ResourceClaim]>,
        pod_claims: Option<&[PodResourceClaim]>,
        namespace: &str,
        facts: &dyn DraFacts,
    ) -> ContainerDevices {
        let mut found = ContainerDevices::default();
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
        found
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
            let found =
                devices.container_devices(&container(resources), Some(&pod_claims()), "ml", &facts);
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
        let unknown = devices.container_devices(&gpus, Some(&claims), "ml", &NoDraFacts);
        assert!(!unknown.uses_device());
        assert_eq!(
            unknown.unresolved[0].to_string(),
            r#"ResourceClaimTemplate ml/one-gpu is not known (claim "gpus")"#
        );
        let elsewhere = devices.container_devices(&gpus, Some(&claims), "other", &facts());
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
