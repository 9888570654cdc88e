//! The installation, as typed Kubernetes objects: `gpu-guard generate webhook-config` renders
//! them, and `webhook-config/base/` is that output (a test fails when it is stale). Names, ports,
//! paths and labels are defined once here and in [`gpu_guard_webhook::server`], so the manifests and the
//! server cannot disagree.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, HTTPGetAction, Namespace, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec, TopologySpreadConstraint,
    Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use gpu_guard_runtime::cluster;

mod network_policy;
use gpu_guard_core::wellknown::{
    CONTROLLER_ADMIN_PORT, ENABLED_LABEL, HEALTHZ_PATH, MUTATE_PATH, READYZ_PATH,
    SERVE_ADMIN_PORT as ADMIN_PORT, VALIDATE_PATH, WEBHOOK_PORT,
};
pub use network_policy::{
    API_SERVER_PORTS, DNS_NAMESPACE, DNS_PORT, MONITORING_NAMESPACE, Source, network_policy,
};

/// The label every namespace carries with its own name (set by the API server).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The name of the mutating webhook (in its configuration).
pub const MUTATING_WEBHOOK_NAME: &str = "jobs.gpu-guard.io";
/// The name of the validating webhook.
pub const VALIDATING_WEBHOOK_NAME: &str = "workloads.gpu-guard.io";
/// The Secret holding the serving certificate (`tls.crt`, `tls.key`; `ca.crt` optional).
pub const TLS_SECRET: &str = "gpu-guard-tls";
/// Where the Secret is mounted.
pub const CERT_DIR: &str = "/certs";
/// The Service port the API server calls (443 → the webhook port).
pub const SERVICE_PORT: i32 = 443;
/// The Service port Prometheus scrapes (→ the admin port).
pub const METRICS_SERVICE_PORT: i32 = 8080;
/// The webhook timeout: far below the API server's 30 s, so a slow webhook cannot stall writes.
pub const TIMEOUT_SECONDS: i32 = 5;
/// The drain delay the Deployment passes to `serve`.
pub const DRAIN_DELAY_SECONDS: i64 = 10;

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
            objects: rbac(namespace),
        },
        File {
            name: "deployment.yaml",
            objects: vec![to_value(deployment(options))],
        },
        File {
            name: "pdb.yaml",
            objects: vec![to_value(pdb(namespace))],
        },
        File {
            name: "service.yaml",
            objects: vec![to_value(service(options))],
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

/// The ServiceAccount, and a ClusterRole with exactly what the code reads.
fn rbac(namespace: &str) -> Vec<Value> {
    rbac_objects("webhook", "gpu-guard", namespace, &cluster::RBAC_RULES)
}

/// A component's ServiceAccount, a ClusterRole with exactly `rules` (`(API group, resource,
/// verbs)`, as the code declares them) and the binding, all named `name`.
fn rbac_objects(
    component: &str,
    name: &str,
    namespace: &str,
    rules: &[(&str, &str, &[&str])],
) -> Vec<Value> {
    let meta = |namespace: Option<&str>| component_meta(component, name, namespace);
    let rules = rules
        .iter()
        .map(|(group, resource, verbs)| PolicyRule {
            api_groups: Some(vec![(*group).to_owned()]),
            resources: Some(vec![(*resource).to_owned()]),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..PolicyRule::default()
        })
        .collect();
    vec![
        to_value(ServiceAccount {
            metadata: meta(Some(namespace)),
            ..ServiceAccount::default()
        }),
        to_value(ClusterRole {
            metadata: meta(None),
            rules: Some(rules),
            ..ClusterRole::default()
        }),
        to_value(ClusterRoleBinding {
            metadata: meta(None),
            role_ref: role_ref("ClusterRole", name),
            subjects: Some(account_subject(name, namespace)),
        }),
    ]
}

/// A Role of `namespace` with `rules` (each with its `resourceNames`, none: any name) and its
/// binding to the ServiceAccount `name`, both named `name`.
fn namespaced_role(
    component: &str,
    name: &str,
    namespace: &str,
    rules: &[gpu_guard_controller::NamedRule],
) -> Vec<Value> {
    let meta = || component_meta(component, name, Some(namespace));
    let rules = rules
        .iter()
        .map(|(group, resource, verbs, names)| PolicyRule {
            api_groups: Some(vec![(*group).to_owned()]),
            resources: Some(vec![(*resource).to_owned()]),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            resource_names: (!names.is_empty())
                .then(|| names.iter().map(|n| (*n).to_owned()).collect()),
            ..PolicyRule::default()
        })
        .collect();
    vec![
        to_value(Role {
            metadata: meta(),
            rules: Some(rules),
        }),
        to_value(RoleBinding {
            metadata: meta(),
            role_ref: role_ref("Role", name),
            subjects: Some(account_subject(name, namespace)),
        }),
    ]
}

/// A binding's reference to the `kind` (`ClusterRole`, `Role`) named `name`.
fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: Some("rbac.authorization.k8s.io".to_owned()),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
}

/// A binding's subjects: the ServiceAccount `name` of `namespace`.
fn account_subject(name: &str, namespace: &str) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".to_owned(),
        name: name.to_owned(),
        namespace: Some(namespace.to_owned()),
        ..Subject::default()
    }]
}

fn probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("admin".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Probe::default()
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

/// The webhook Deployment: two replicas on different nodes, the restricted security context,
/// probes on the admin port, a grace period longer than drain plus shutdown.
fn deployment(options: &Options) -> Deployment {
    let labels = pod_labels();
    let args = [
        "serve".to_owned(),
        format!("--listen=0.0.0.0:{WEBHOOK_PORT}"),
        format!("--admin-listen=0.0.0.0:{ADMIN_PORT}"),
        format!("--tls-cert-file={CERT_DIR}/tls.crt"),
        format!("--tls-key-file={CERT_DIR}/tls.key"),
        "--log-format=json".to_owned(),
        format!("--drain-delay-seconds={DRAIN_DELAY_SECONDS}"),
    ];
    let container = Container {
        name: "gpu-guard".to_owned(),
        image: Some(options.image.clone()),
        args: Some(args.to_vec()),
        ports: Some(vec![
            ContainerPort {
                name: Some("webhook".to_owned()),
                container_port: i32::from(WEBHOOK_PORT),
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("admin".to_owned()),
                container_port: i32::from(ADMIN_PORT),
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            },
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "100m"), ("memory", "64Mi")])),
            limits: Some(quantities(&[("cpu", "1"), ("memory", "256Mi")])),
            ..ResourceRequirements::default()
        }),
        liveness_probe: Some(probe(HEALTHZ_PATH, 10, 3)),
        readiness_probe: Some(probe(READYZ_PATH, 5, 2)),
        security_context: Some(container_security()),
        volume_mounts: Some(vec![VolumeMount {
            name: "tls".to_owned(),
            mount_path: CERT_DIR.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    Deployment {
        metadata: meta(&options.service_name, Some(&options.namespace)),
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some("gpu-guard".to_owned()),
                    priority_class_name: Some("system-cluster-critical".to_owned()),
                    // Drain delay + the server's 10 s shutdown timeout + margin.
                    termination_grace_period_seconds: Some(DRAIN_DELAY_SECONDS + 20),
                    security_context: Some(pod_security()),
                    topology_spread_constraints: Some(spread(&labels)),
                    containers: vec![container],
                    volumes: Some(vec![Volume {
                        name: "tls".to_owned(),
                        secret: Some(SecretVolumeSource {
                            secret_name: Some(TLS_SECRET.to_owned()),
                            ..SecretVolumeSource::default()
                        }),
                        ..Volume::default()
                    }]),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// The restricted Pod Security Standard, container part.
fn container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

/// The restricted Pod Security Standard, pod part: a numeric non-root user, RuntimeDefault.
fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// Replicas on different nodes (required) and zones (preferred).
fn spread(labels: &BTreeMap<String, String>) -> Vec<TopologySpreadConstraint> {
    let constraint = |key: &str, unsatisfiable: &str| TopologySpreadConstraint {
        max_skew: 1,
        topology_key: key.to_owned(),
        when_unsatisfiable: unsatisfiable.to_owned(),
        label_selector: Some(LabelSelector {
            match_labels: Some(labels.clone()),
            ..LabelSelector::default()
        }),
        ..TopologySpreadConstraint::default()
    };
    vec![
        constraint("kubernetes.io/hostname", "DoNotSchedule"),
        constraint("topology.kubernetes.io/zone", "ScheduleAnyway"),
    ]
}

/// The container arguments of the controller Deployment (the policy comes from
/// `GPU_GUARD_POLICY` or `--policy`, as for `serve`).
pub fn controller_container_args() -> Vec<String> {
    vec![
        "controller".to_owned(),
        format!("--admin-listen=0.0.0.0:{CONTROLLER_ADMIN_PORT}"),
        "--log-format=json".to_owned(),
    ]
}

/// Environment variables the controller Deployment sets from the downward API: the replica's
/// identity in the Lease and in Events (`metadata.name`), and the Lease's namespace
/// (`metadata.namespace`).
pub const CONTROLLER_DOWNWARD_API_ENV: [(&str, &str); 2] = [
    ("POD_NAME", "metadata.name"),
    ("POD_NAMESPACE", "metadata.namespace"),
];

/// The controller (`gpu-guard controller`): its ServiceAccount, ClusterRole (exactly
/// [`gpu_guard_controller::RBAC_RULES`]) and binding, a Role of its namespace (exactly
/// [`gpu_guard_controller::LEASE_RULES`]: its own Lease) and binding, a Deployment of two replicas of which
/// the Lease holder acts, and its NetworkPolicy.
pub fn controller(options: &Options) -> Vec<File> {
    const NAME: &str = "gpu-guard-controller";
    let namespace = options.namespace.as_str();
    let meta = |name: &str, namespace: Option<&str>| component_meta("controller", name, namespace);
    let mut rbac = rbac_objects(
        "controller",
        NAME,
        namespace,
        &gpu_guard_controller::RBAC_RULES,
    );
    rbac.extend(namespaced_role(
        "controller",
        NAME,
        namespace,
        &gpu_guard_controller::LEASE_RULES,
    ));
    let labels = component_labels("controller");
    let env = CONTROLLER_DOWNWARD_API_ENV
        .iter()
        .map(|(name, field)| k8s_openapi::api::core::v1::EnvVar {
            name: (*name).to_owned(),
            value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
                field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                    field_path: (*field).to_owned(),
                    ..k8s_openapi::api::core::v1::ObjectFieldSelector::default()
                }),
                ..k8s_openapi::api::core::v1::EnvVarSource::default()
            }),
            ..k8s_openapi::api::core::v1::EnvVar::default()
        })
        .collect();
    let container = Container {
        name: "controller".to_owned(),
        image: Some(options.image.clone()),
        args: Some(controller_container_args()),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("admin".to_owned()),
            container_port: i32::from(CONTROLLER_ADMIN_PORT),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        // From the scale benchmark (benches/scale, docs/controller.md): at 5,000 nodes and
        // 150,000 pods (40,000 of them GPU pods) the controller holds 120 MiB steady and peaks
        // at 157 MiB while it lists. The request covers that steady size; the limit leaves
        // about 2.4 times the peak.
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "50m"), ("memory", "128Mi")])),
            limits: Some(quantities(&[("cpu", "500m"), ("memory", "384Mi")])),
            ..ResourceRequirements::default()
        }),
        liveness_probe: Some(probe(HEALTHZ_PATH, 10, 3)),
        readiness_probe: Some(probe(READYZ_PATH, 5, 2)),
        security_context: Some(container_security()),
        ..Container::default()
    };
    let deployment = Deployment {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(NAME.to_owned()),
                    priority_class_name: Some("system-cluster-critical".to_owned()),
                    termination_grace_period_seconds: Some(30),
                    security_context: Some(pod_security()),
                    topology_spread_constraints: Some(spread(&labels)),
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    vec![
        File {
            name: "rbac.yaml",
            objects: rbac,
        },
        File {
            name: "deployment.yaml",
            objects: vec![to_value(deployment)],
        },
        File {
            name: "network-policy.yaml",
            objects: vec![to_value(network_policy(
                "controller",
                NAME,
                namespace,
                &[(CONTROLLER_ADMIN_PORT, Source::Monitoring)],
            ))],
        },
    ]
}

fn pdb(namespace: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta("gpu-guard", Some(namespace)),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(pod_labels()),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

fn service(options: &Options) -> Service {
    Service {
        metadata: meta(&options.service_name, Some(&options.namespace)),
        spec: Some(ServiceSpec {
            selector: Some(pod_labels()),
            ports: Some(vec![
                ServicePort {
                    name: Some("webhook".to_owned()),
                    port: SERVICE_PORT,
                    target_port: Some(IntOrString::String("webhook".to_owned())),
                    protocol: Some("TCP".to_owned()),
                    ..ServicePort::default()
                },
                ServicePort {
                    name: Some("metrics".to_owned()),
                    port: METRICS_SERVICE_PORT,
                    target_port: Some(IntOrString::String("admin".to_owned())),
                    protocol: Some("TCP".to_owned()),
                    ..ServicePort::default()
                },
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Opted-in namespaces, never kube-system nor gpu-guard's own: the webhooks can never block
/// their own recovery or the control plane's.
fn namespace_selector(own_namespace: &str) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![
            LabelSelectorRequirement {
                key: ENABLED_LABEL.to_owned(),
                operator: "In".to_owned(),
                values: Some(vec!["true".to_owned()]),
            },
            LabelSelectorRequirement {
                key: NAMESPACE_NAME_LABEL.to_owned(),
                operator: "NotIn".to_owned(),
                values: Some(vec![
                    "kube-system".to_owned(),
                    "kube-node-lease".to_owned(),
                    own_namespace.to_owned(),
                ]),
            },
        ]),
        ..LabelSelector::default()
    }
}

fn client_config(options: &Options, path: &str) -> WebhookClientConfig {
    let ca_bundle = options.ca_bundle.clone().map(ByteString);
    match &options.local_url {
        Some(base) => WebhookClientConfig {
            url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            ca_bundle,
            ..WebhookClientConfig::default()
        },
        None => WebhookClientConfig {
            service: Some(ServiceReference {
                name: options.service_name.clone(),
                namespace: options.namespace.clone(),
                path: Some(path.to_owned()),
                port: Some(SERVICE_PORT),
            }),
            ca_bundle,
            ..WebhookClientConfig::default()
        },
    }
}

/// One registration rule: `(API group, version, resources, operations)`.
pub type Registration = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

fn rules(registrations: &[Registration], scope: &str) -> Vec<RuleWithOperations> {
    registrations
        .iter()
        .map(
            |(group, version, resources, operations)| RuleWithOperations {
                api_groups: Some(vec![(*group).to_owned()]),
                api_versions: Some(vec![(*version).to_owned()]),
                resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
                operations: Some(operations.iter().map(|o| (*o).to_owned()).collect()),
                scope: Some(scope.to_owned()),
            },
        )
        .collect()
}

/// The namespaced resources the mutating webhook changes: Jobs, CronJobs (their
/// `jobTemplate`, so the protection is visible on the CronJob), JobSets and Kubeflow Trainer
/// TrainingRuntimes (their JobSet template), at CREATE; at UPDATE only to put back what a
/// server-side apply dropped of gpu-guard's changes. When the JobSet or Trainer CRDs are not
/// installed, the API server never sends those kinds.
pub const MUTATED: [Registration; 3] = [
    ("batch", "v1", &["jobs", "cronjobs"], &["CREATE", "UPDATE"]),
    (
        "jobset.x-k8s.io",
        "v1alpha2",
        &["jobsets"],
        &["CREATE", "UPDATE"],
    ),
    (
        "trainer.kubeflow.org",
        "v1alpha1",
        &["trainingruntimes"],
        &["CREATE", "UPDATE"],
    ),
];

/// The resources the validating webhook judges, at CREATE and UPDATE (a Pod can gain
/// tolerations and, while scheduling-gated, node selectors after it is created; Kueue admits a
/// suspended Job or JobSet by an UPDATE that adds its flavor's node selector and tolerations).
/// Subresources are not listed, so never sent.
pub const VALIDATED: [Registration; 5] = [
    (
        "",
        "v1",
        &["pods", "replicationcontrollers"],
        &["CREATE", "UPDATE"],
    ),
    (
        "apps",
        "v1",
        &["deployments", "statefulsets", "daemonsets", "replicasets"],
        &["CREATE", "UPDATE"],
    ),
    ("batch", "v1", &["jobs", "cronjobs"], &["CREATE", "UPDATE"]),
    (
        "jobset.x-k8s.io",
        "v1alpha2",
        &["jobsets"],
        &["CREATE", "UPDATE"],
    ),
    (
        "trainer.kubeflow.org",
        "v1alpha1",
        &["trainingruntimes"],
        &["CREATE", "UPDATE"],
    ),
];

/// ClusterTrainingRuntimes are cluster-scoped: a `namespaceSelector` does not filter them, so a
/// webhook of their own selects those labelled `gpu-guard.io/enabled: "true"` (the opt-in of a
/// cluster-scoped object). Mutated and judged as the namespaced kinds are.
pub const CLUSTER_RUNTIMES: [Registration; 1] = [(
    "trainer.kubeflow.org",
    "v1alpha1",
    &["clustertrainingruntimes"],
    &["CREATE", "UPDATE"],
)];

/// The name of the webhooks for cluster-scoped Trainer runtimes (in both configurations).
pub const CLUSTER_RUNTIMES_WEBHOOK_NAME: &str = "clustertrainingruntimes.gpu-guard.io";

fn opted_in_objects() -> LabelSelector {
    LabelSelector {
        match_labels: Some([(ENABLED_LABEL.to_owned(), "true".to_owned())].into()),
        ..LabelSelector::default()
    }
}

/// The two webhook configurations.
pub fn webhooks(options: &Options) -> Vec<Value> {
    let own = options.namespace.as_str();
    let mutating = MutatingWebhookConfiguration {
        metadata: meta("gpu-guard", None),
        webhooks: Some(vec![
            MutatingWebhook {
                name: MUTATING_WEBHOOK_NAME.to_owned(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(options, MUTATE_PATH),
                failure_policy: Some(options.mutate_failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector: Some(namespace_selector(own)),
                reinvocation_policy: Some("IfNeeded".to_owned()),
                rules: Some(rules(&MUTATED, "Namespaced")),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(TIMEOUT_SECONDS),
                ..MutatingWebhook::default()
            },
            MutatingWebhook {
                name: CLUSTER_RUNTIMES_WEBHOOK_NAME.to_owned(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(options, MUTATE_PATH),
                failure_policy: Some(options.mutate_failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                object_selector: Some(opted_in_objects()),
                reinvocation_policy: Some("IfNeeded".to_owned()),
                rules: Some(rules(&CLUSTER_RUNTIMES, "Cluster")),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(TIMEOUT_SECONDS),
                ..MutatingWebhook::default()
            },
        ]),
    };
    let validating = ValidatingWebhookConfiguration {
        metadata: meta("gpu-guard", None),
        webhooks: Some(vec![
            ValidatingWebhook {
                name: VALIDATING_WEBHOOK_NAME.to_owned(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(options, VALIDATE_PATH),
                failure_policy: Some(options.validate_failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector: Some(namespace_selector(own)),
                rules: Some(rules(&VALIDATED, "Namespaced")),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(TIMEOUT_SECONDS),
                ..ValidatingWebhook::default()
            },
            ValidatingWebhook {
                name: CLUSTER_RUNTIMES_WEBHOOK_NAME.to_owned(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config: client_config(options, VALIDATE_PATH),
                failure_policy: Some(options.validate_failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                object_selector: Some(opted_in_objects()),
                rules: Some(rules(&CLUSTER_RUNTIMES, "Cluster")),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(TIMEOUT_SECONDS),
                ..ValidatingWebhook::default()
            },
        ]),
    };
    vec![to_value(mutating), to_value(validating)]
}

/// The `kustomization.yaml` of a generated directory. For the local overlay (`local`), the CA
/// of `certs/ca.crt` (written by `gpu-guard certs`) becomes both webhooks' caBundle through a
/// Secret that only exists during the build (`config.kubernetes.io/local-config`).
pub fn kustomization(files: &[File], local: bool) -> Value {
    let mut kustomization = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": files.iter().map(|f| f.name).collect::<Vec<_>>(),
    });
    if local {
        let target = |kind: &str| {
            serde_json::json!({
                "select": {"kind": kind, "name": "gpu-guard"},
                "fieldPaths": ["webhooks.*.clientConfig.caBundle"],
                "options": {"create": true},
            })
        };
        kustomization["secretGenerator"] = serde_json::json!([{
            "name": "gpu-guard-local-ca",
            "files": ["ca.crt=certs/ca.crt"],
            "options": {
                "disableNameSuffixHash": true,
                "annotations": {"config.kubernetes.io/local-config": "true"},
            },
        }]);
        kustomization["replacements"] = serde_json::json!([{
            "source": {"kind": "Secret", "name": "gpu-guard-local-ca", "fieldPath": "data.[ca.crt]"},
            "targets": [
                target("MutatingWebhookConfiguration"),
                target("ValidatingWebhookConfiguration"),
            ],
        }]);
    }
    kustomization
}

/// The files of a generated directory, rendered: each resource file and `kustomization.yaml`,
/// each headed with the command that makes it.
pub fn render(files: &[File], kind: Generated) -> Vec<(String, String)> {
    let local = kind == Generated::Local;
    let command = match kind {
        Generated::Base => BASE_COMMAND,
        Generated::Local => LOCAL_COMMAND,
        Generated::Controller => CONTROLLER_COMMAND,
    };
    let header = format!("# Generated by `{command}`; do not edit.\n");
    let mut rendered: Vec<(String, String)> = files
        .iter()
        .map(|file| {
            let body = gpu_guard_manifest::render(&file.objects, gpu_guard_manifest::Format::Yaml);
            (file.name.to_owned(), format!("{header}{body}"))
        })
        .collect();
    rendered.push((
        "kustomization.yaml".to_owned(),
        format!(
            "{header}{}",
            gpu_guard_manifest::to_yaml(&kustomization(files, local))
        ),
    ));
    rendered
}

/// Which generated directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generated {
    /// `webhook-config/base/`.
    Base,
    /// `webhook-config/overlays/local/`.
    Local,
    /// `webhook-config/controller/`.
    Controller,
}

/// The command that generates `webhook-config/controller/`.
pub const CONTROLLER_COMMAND: &str =
    "gpu-guard generate webhook-config --controller --out-dir webhook-config/controller";
/// The command that generates `webhook-config/base/`.
pub const BASE_COMMAND: &str = "gpu-guard generate webhook-config --out-dir webhook-config/base";
/// The command that generates `webhook-config/overlays/local/`.
pub const LOCAL_COMMAND: &str = "gpu-guard generate webhook-config --local-url https://127.0.0.1:8443 --out-dir webhook-config/overlays/local";
