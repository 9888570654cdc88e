//! The webhook server's objects: its Deployment, PodDisruptionBudget and Service.

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, PodSpec, PodTemplateSpec, ResourceRequirements, SecretVolumeSource,
    Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use gpu_guard_core::wellknown::{
    HEALTHZ_PATH, READYZ_PATH, SERVE_ADMIN_PORT as ADMIN_PORT, WEBHOOK_PORT,
};

use super::pod::{container_security, pod_security, probe, quantities, spread};
use super::{Options, meta, pod_labels};

/// The Secret holding the serving certificate (`tls.crt`, `tls.key`; `ca.crt` optional).
pub const TLS_SECRET: &str = "gpu-guard-tls";

/// Where the Secret is mounted.
pub const CERT_DIR: &str = "/certs";

/// The Service port the API server calls (443 → the webhook port).
pub const SERVICE_PORT: i32 = 443;

/// The Service port Prometheus scrapes (→ the admin port).
pub const METRICS_SERVICE_PORT: i32 = 8080;

/// The drain delay the Deployment passes to `serve`.
pub const DRAIN_DELAY_SECONDS: i64 = 10;

/// The webhook Deployment: two replicas on different nodes, the restricted security context,
/// probes on the admin port, a grace period longer than drain plus shutdown.
pub(super) fn deployment(options: &Options) -> Deployment {
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

pub(super) fn pdb(namespace: &str) -> PodDisruptionBudget {
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

pub(super) fn service(options: &Options) -> Service {
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
