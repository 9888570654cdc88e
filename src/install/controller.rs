//! The controller's installation (`webhook-config/controller/`): its RBAC, its Deployment and
//! its NetworkPolicy.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec, PodTemplateSpec,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use gpu_guard_core::wellknown::{CONTROLLER_ADMIN_PORT, HEALTHZ_PATH, READYZ_PATH};

use super::network_policy::{Source, network_policy};
use super::pod::{container_security, pod_security, probe, quantities, spread};
use super::rbac::{namespaced_role, rbac_objects};
use super::{File, Options, component_labels, component_meta, to_value};

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
        .map(|(name, field)| EnvVar {
            name: (*name).to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: (*field).to_owned(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
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
