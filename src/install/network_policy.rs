//! The NetworkPolicies of the webhook and the controller pods: what may reach them and what they
//! may reach, from the same ports the Deployments declare.
//!
//! Two facts of NetworkPolicy shape these (Kubernetes documentation, "Network Policies",
//! `content/en/docs/concepts/services-networking/network-policies.md` in kubernetes/website):
//!
//! - traffic between a pod and the node it runs on is always allowed, so the kubelet's probes need
//!   no rule;
//! - whether a policy sees an address before or after a Service or NAT rewrites it is left to the
//!   network plugin. The API server's calls to the webhook come from the control plane's address
//!   (or a provider's tunnel), which no pod or namespace selector matches and whose range is not
//!   known in general; and the pods reach the API server through the `kubernetes` Service, whose
//!   backends listen on 443 on most managed clusters and 6443 on kubeadm-style ones. So the webhook
//!   port is open to any source and the API server is reached by port, not by address.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{NAMESPACE_NAME_LABEL, component_labels, component_meta};

/// The namespace whose pods may scrape the admin ports (`/metrics`): where kube-prometheus-stack
/// is usually installed. Another one: patch the policies' `namespaceSelector`
/// (docs/install.md).
pub const MONITORING_NAMESPACE: &str = "monitoring";
/// The ports the API server's endpoints listen on: 443 on most managed clusters, 6443 where
/// kubeadm (kind, k3s, and most self-managed clusters) set it up. Egress is allowed to these
/// ports at any address (see the module documentation).
pub const API_SERVER_PORTS: [i32; 2] = [443, 6443];
/// The namespace of the cluster DNS (CoreDNS or kube-dns).
pub const DNS_NAMESPACE: &str = "kube-system";
/// DNS, over UDP and TCP.
pub const DNS_PORT: i32 = 53;

/// Who may open connections to a port of the pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Any address: the API server's calls to the webhook.
    Anywhere,
    /// Pods in [`MONITORING_NAMESPACE`]: Prometheus scraping `/metrics`.
    Monitoring,
}

fn port(number: i32, protocol: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(number)),
        protocol: Some(protocol.to_owned()),
        ..NetworkPolicyPort::default()
    }
}

fn namespace_named(name: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some([(NAMESPACE_NAME_LABEL.to_owned(), name.to_owned())].into()),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// The NetworkPolicy of one component's pods (`webhook`, `controller`), named `name`: ingress to
/// each TCP port in `ingress` from its source only, egress to the API server ports and to the
/// cluster DNS only.
pub fn network_policy(
    component: &str,
    name: &str,
    namespace: &str,
    ingress: &[(u16, Source)],
) -> NetworkPolicy {
    let ingress = ingress
        .iter()
        .map(|(number, source)| NetworkPolicyIngressRule {
            // No `from`: any source.
            from: match source {
                Source::Anywhere => None,
                Source::Monitoring => Some(vec![namespace_named(MONITORING_NAMESPACE)]),
            },
            ports: Some(vec![port(i32::from(*number), "TCP")]),
        })
        .collect();
    let egress = vec![
        // The API server, by port only (see the module documentation).
        NetworkPolicyEgressRule {
            to: None,
            ports: Some(API_SERVER_PORTS.iter().map(|p| port(*p, "TCP")).collect()),
        },
        // In a pod the API server is reached by the address in KUBERNETES_SERVICE_HOST, which
        // needs no DNS; but that variable may hold a host name (AKS sets one in kube-system, and
        // users of AKS clusters behind a firewall set it: Azure/AKS#676), and a mounted
        // kubeconfig may name one.
        NetworkPolicyEgressRule {
            to: Some(vec![namespace_named(DNS_NAMESPACE)]),
            ports: Some(vec![port(DNS_PORT, "UDP"), port(DNS_PORT, "TCP")]),
        },
    ];
    NetworkPolicy {
        metadata: component_meta(component, name, Some(namespace)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(component_labels(component)),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: Some(ingress),
            egress: Some(egress),
        }),
    }
}
