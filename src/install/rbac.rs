//! RBAC objects: each component's ServiceAccount, a ClusterRole and binding with exactly the
//! rules its code declares ([`RbacRule`]), and the controller's namespaced Role.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use serde_json::Value;

use gpu_guard_runtime::cluster::{self, RbacRule};

use super::{component_meta, to_value};

/// The webhook's ServiceAccount, and a ClusterRole with exactly what its caches read.
pub(super) fn webhook(namespace: &str) -> Vec<Value> {
    rbac_objects("webhook", "gpu-guard", namespace, &cluster::RBAC_RULES)
}

/// A component's ServiceAccount, a ClusterRole with exactly `rules` (as the code declares them)
/// and the binding, all named `name`.
pub(super) fn rbac_objects(
    component: &str,
    name: &str,
    namespace: &str,
    rules: &[RbacRule],
) -> Vec<Value> {
    let meta = |namespace: Option<&str>| component_meta(component, name, namespace);
    vec![
        to_value(ServiceAccount {
            metadata: meta(Some(namespace)),
            ..ServiceAccount::default()
        }),
        to_value(ClusterRole {
            metadata: meta(None),
            rules: Some(policy_rules(rules)),
            ..ClusterRole::default()
        }),
        to_value(ClusterRoleBinding {
            metadata: meta(None),
            role_ref: role_ref("ClusterRole", name),
            subjects: Some(account_subject(name, namespace)),
        }),
    ]
}

/// A Role of `namespace` with `rules` and its binding to the ServiceAccount `name`, both named
/// `name`.
pub(super) fn namespaced_role(
    component: &str,
    name: &str,
    namespace: &str,
    rules: &[RbacRule],
) -> Vec<Value> {
    let meta = || component_meta(component, name, Some(namespace));
    vec![
        to_value(Role {
            metadata: meta(),
            rules: Some(policy_rules(rules)),
        }),
        to_value(RoleBinding {
            metadata: meta(),
            role_ref: role_ref("Role", name),
            subjects: Some(account_subject(name, namespace)),
        }),
    ]
}

/// `rules` as a Role's or ClusterRole's, one resource each (`resourceNames` only when a rule
/// names its objects).
fn policy_rules(rules: &[RbacRule]) -> Vec<PolicyRule> {
    let strings = |items: &[&str]| items.iter().map(|item| (*item).to_owned()).collect();
    rules
        .iter()
        .map(|rule| PolicyRule {
            api_groups: Some(vec![rule.group.to_owned()]),
            resources: Some(vec![rule.resource.to_owned()]),
            verbs: strings(rule.verbs),
            resource_names: (!rule.names.is_empty()).then(|| strings(rule.names)),
            ..PolicyRule::default()
        })
        .collect()
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
