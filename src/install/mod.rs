//! The installation, as typed Kubernetes objects: `gpu-guard generate webhook-config` renders
//! them, and `webhook-config/base/` is that output (a test fails when it is stale). Names, ports,
//! paths and labels are defined once here and in [`gpu_guard_webhook::server`], so the manifests and the
//! server cannot disagree.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the options, the labels every object carries, the base installation file by file |
//! | `server.rs` | the webhook server: Deployment, PodDisruptionBudget, Service |
//! | `webhooks.rs` | the webhook configurations, their rules read from the kind registry |
//! | `controller.rs` | the controller's installation |
//! | `rbac.rs` | ServiceAccounts, ClusterRoles, Roles and bindings from the code's RBAC rules |
//! | `pod.rs` | the pod spec parts both Deployments share |
//! | `network_policy.rs` | the NetworkPolicies of both components |
//! | `kustomize.rs` | the rendered files and their `kustomization.yaml` |

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use gpu_guard_core::wellknown::{SERVE_ADMIN_PORT as ADMIN_PORT, WEBHOOK_PORT};

mod controller;
mod kustomize;
mod network_policy;
mod pod;
mod rbac;
mod server;
mod webhooks;

pub use controller::{CONTROLLER_DOWNWARD_API_ENV, controller, controller_container_args};
pub use kustomize::{
    BASE_COMMAND, CONTROLLER_COMMAND, Generated, LOCAL_COMMAND, kustomization, render,
};
pub use network_policy::{
    API_SERVER_PORTS, DNS_NAMESPACE, DNS_PORT, MONITORING_NAMESPACE, Source, network_policy,
};
pub use server::{CERT_DIR, DRAIN_DELAY_SECONDS, METRICS_SERVICE_PORT, SERVICE_PORT, TLS_SECRET};
pub use webhooks::{
    CLUSTER_RUNTIMES_WEBHOOK_NAME, MUTATING_WEBHOOK_NAME, PODS_TIMEOUT_SECONDS, PODS_WEBHOOK_NAME,
    TIMEOUT_SECONDS, VALIDATING_WEBHOOK_NAME, webhooks,
};

/// The label every namespace carries with its own name (set by the API server).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What `generate webhook-config` can change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub namespace: String,
    pub service_name: String,
    pub image: String,
    /// PEM CA bundle the API server trusts the webhook with (empty: left out, for cert-manager's
    /// CA injector or a kustomize replacement to fill).
    pub ca_bundle: Option<Vec<u8>>,
    /// `failurePolicy` of the mutating webhook.
    pub mutate_failure_policy: WebhookFailurePolicy,
    /// `failurePolicy` of the validating webhook.
    pub validate_failure_policy: WebhookFailurePolicy,
    /// Local development: the webhook configurations call `https://127.0.0.1:8443` (a
    /// `gpu-guard serve` beside a local API server) instead of the Service.
    pub local_url: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            namespace: "gpu-guard".to_owned(),
            service_name: "gpu-guard".to_owned(),
            image: format!("ghcr.io/gpu-guard/gpu-guard:v{}", env!("CARGO_PKG_VERSION")),
            ca_bundle: None,
            mutate_failure_policy: WebhookFailurePolicy::Ignore,
            validate_failure_policy: WebhookFailurePolicy::Ignore,
            local_url: None,
        }
    }
}

/// A webhook's `failurePolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookFailurePolicy {
    /// Admit the object when the webhook cannot be reached (the default: gpu-guard can never
    /// block the cluster).
    Ignore,
    /// Reject the object when the webhook cannot be reached.
    Fail,
}

impl WebhookFailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ignore => "Ignore",
            Self::Fail => "Fail",
        }
    }
}

/// The labels of gpu-guard's webhook pods (the Deployment's selector, the Service's, the PDB's).
pub fn pod_labels() -> BTreeMap<String, String> {
    component_labels("webhook")
}

/// The labels of one component's pods (`webhook`, `controller`).
pub fn component_labels(component: &str) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", "gpu-guard"),
        ("app.kubernetes.io/component", component),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    component_meta("webhook", name, namespace)
}

fn component_meta(component: &str, name: &str, namespace: Option<&str>) -> ObjectMeta {
    let mut labels = component_labels(component);
    labels.insert(
        "app.kubernetes.io/part-of".to_owned(),
        "gpu-guard".to_owned(),
    );
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

/// One generated file: its name under `webhook-config/base/` and its objects.
#[derive(Clone, Debug, PartialEq)]
pub struct File {
    pub name: &'static str,
    pub objects: Vec<Value>,
}

fn to_value(object: impl serde::Serialize) -> Value {
    serde_json::to_value(object).expect("a Kubernetes object serializes")
}

/// The base installation, file by file; the last is the webhook pods' NetworkPolicy.
pub fn base(options: &Options) -> Vec<File> {
    let namespace = options.namespace.as_str();
    vec![
        File {
            name: "namespace.yaml",
            objects: vec![to_value(namespace_object(namespace))],
        },
        File {
            name: "rbac.yaml",
            objects: rbac::webhook(namespace),
        },
        File {
            name: "deployment.yaml",
            objects: vec![to_value(server::deployment(options))],
        },
        File {
            name: "pdb.yaml",
            objects: vec![to_value(server::pdb(namespace))],
        },
        File {
            name: "service.yaml",
            objects: vec![to_value(server::service(options))],
        },
        File {
            name: "webhooks.yaml",
            objects: webhooks(options),
        },
        File {
            name: "network-policy.yaml",
            objects: vec![to_value(network_policy(
                "webhook",
                &options.service_name,
                namespace,
                &[
                    (WEBHOOK_PORT, Source::Anywhere),
                    (ADMIN_PORT, Source::Monitoring),
                ],
            ))],
        },
    ]
}

/// The namespace, with the restricted Pod Security Standard enforced.
fn namespace_object(name: &str) -> Namespace {
    let mut metadata = meta(name, None);
    let labels = metadata.labels.get_or_insert_with(BTreeMap::new);
    for mode in ["enforce", "audit", "warn"] {
        labels.insert(
            format!("pod-security.kubernetes.io/{mode}"),
            "restricted".to_owned(),
        );
    }
    Namespace {
        metadata,
        ..Namespace::default()
    }
}
