//! The DRA objects of a cluster the device rule reads (ResourceClaimTemplates, ResourceClaims,
//! DeviceClasses), and where they come from: the webhook's caches, the documents of a manifest,
//! or nothing.

use std::collections::BTreeMap;

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
    pub(super) fn classes_for<'a>(
        &'a self,
        request: Option<&'a str>,
    ) -> impl Iterator<Item = &'a str> {
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
