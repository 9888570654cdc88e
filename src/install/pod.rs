//! The parts of a pod spec both Deployments share: probes on the admin port, resource
//! quantities, the restricted Pod Security Standard, and replicas spread over nodes and zones.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, HTTPGetAction, PodSecurityContext, Probe, SeccompProfile, SecurityContext,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub(super) fn probe(path: &str, period: i32, failures: i32) -> Probe {
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

pub(super) fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

/// The restricted Pod Security Standard, container part.
pub(super) fn container_security() -> SecurityContext {
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
pub(super) fn pod_security() -> PodSecurityContext {
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
pub(super) fn spread(labels: &BTreeMap<String, String>) -> Vec<TopologySpreadConstraint> {
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
