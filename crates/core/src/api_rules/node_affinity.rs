//! A pod's required node affinity, as Kubernetes 1.36 pod validation checks it
//! (`pkg/apis/core/validation/validation.go`: `ValidateNodeSelector`, `ValidateNodeSelectorTerm`,
//! `ValidateNodeSelectorRequirement`, `ValidateNodeFieldSelectorRequirement`): what gpu-guard
//! writes when it keeps a pod off the nodes where its workload's devices failed
//! ([`crate::memory::avoid`]).

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};

use super::names::{dns_subdomain_errors, qualified_name_errors};
use crate::field::{FieldPath, Violation};

/// The one field key `matchFields` takes (`nodeFieldSelectorValidators`): the node's name.
pub const NODE_NAME_FIELD: &str = "metadata.name";

// `sets.List` sorts the supported values in the API server's messages.
const OPERATORS: [&str; 6] = ["DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"];

/// Every violation in `requiredDuringSchedulingIgnoredDuringExecution` at `path`; empty when the
/// API server would accept it.
pub fn check_required(selector: &NodeSelector, path: &FieldPath) -> Vec<Violation> {
    let terms_path = path.child("nodeSelectorTerms");
    if selector.node_selector_terms.is_empty() {
        return vec![Violation::required(
            terms_path,
            "must have at least one node selector term",
        )];
    }
    let mut violations = Vec::new();
    for (index, term) in selector.node_selector_terms.iter().enumerate() {
        let term_path = terms_path.index(index);
        for (j, requirement) in term.match_expressions.iter().flatten().enumerate() {
            check_expression(
                requirement,
                &term_path.child("matchExpressions").index(j),
                &mut violations,
            );
        }
        for (j, requirement) in term.match_fields.iter().flatten().enumerate() {
            check_field(
                requirement,
                &term_path.child("matchFields").index(j),
                &mut violations,
            );
        }
    }
    violations
}

/// `ValidateNodeSelectorRequirement`: a label requirement.
fn check_expression(
    requirement: &NodeSelectorRequirement,
    path: &FieldPath,
    violations: &mut Vec<Violation>,
) {
    let values = requirement.values.as_deref().unwrap_or_default();
    let values_path = path.child("values");
    match requirement.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => violations.push(Violation::required(
            values_path,
            "must be specified when `operator` is 'In' or 'NotIn'",
        )),
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            violations.push(Violation::invalid_without_value(
                values_path,
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            ))
        }
        "Gt" | "Lt" if values.len() != 1 => violations.push(Violation::required(
            values_path,
            "must be specified single value when `operator` is 'Lt' or 'Gt'",
        )),
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => {}
        other => violations.push(Violation::not_supported(
            path.child("operator"),
            other,
            &OPERATORS,
        )),
    }
    for detail in qualified_name_errors(&requirement.key) {
        violations.push(Violation::invalid(
            path.child("key"),
            requirement.key.clone(),
            detail,
        ));
    }
}

/// `ValidateNodeFieldSelectorRequirement`: a field requirement takes only `metadata.name`,
/// with `In` or `NotIn` and exactly one value, a valid node name.
fn check_field(
    requirement: &NodeSelectorRequirement,
    path: &FieldPath,
    violations: &mut Vec<Violation>,
) {
    let values = requirement.values.as_deref().unwrap_or_default();
    match requirement.operator.as_str() {
        "In" | "NotIn" if values.len() != 1 => violations.push(Violation::required(
            path.child("values"),
            "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
        )),
        "In" | "NotIn" => {}
        other => violations.push(Violation::invalid(
            path.child("operator"),
            other,
            "not a valid selector operator",
        )),
    }
    if requirement.key != NODE_NAME_FIELD {
        violations.push(Violation::invalid(
            path.child("key"),
            requirement.key.clone(),
            "not a valid field selector key",
        ));
        return;
    }
    for (index, value) in values.iter().enumerate() {
        for detail in dns_subdomain_errors(value) {
            violations.push(Violation::invalid(
                path.child("values").index(index),
                value.clone(),
                detail,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn violations(required: serde_json::Value) -> Vec<String> {
        let selector: NodeSelector = serde_json::from_value(required).unwrap();
        check_required(&selector, &FieldPath::new(["spec", "affinity"]))
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_field_requirement_takes_one_node_name() {
        let ok = json!({"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-3"]},
            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-7.example.com"]}
        ]}]});
        assert_eq!(violations(ok), Vec::<String>::new());
        let two = json!({"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-3", "gpu-7"]}
        ]}]});
        let found = violations(two);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("matchFields[0].values"), "{found:?}");
        assert!(found[0].contains("must be only one value"), "{found:?}");
        let wrong = json!({"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.labels", "operator": "Exists"},
            {"key": "metadata.name", "operator": "In", "values": ["Not_A_Node"]}
        ]}]});
        let found = violations(wrong);
        assert_eq!(found.len(), 3, "{found:?}");
    }

    #[test]
    fn terms_and_label_requirements() {
        assert_eq!(
            violations(json!({"nodeSelectorTerms": []})).len(),
            1,
            "no term at all"
        );
        // An empty term is accepted (it matches no node).
        assert!(violations(json!({"nodeSelectorTerms": [{}]})).is_empty());
        let found = violations(json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In"},
            {"key": "zone", "operator": "Exists", "values": ["a"]},
            {"key": "gpus", "operator": "Gt", "values": ["1", "2"]},
            {"key": "zone", "operator": "Near", "values": ["a"]},
            {"key": "bad key!", "operator": "Exists"}
        ]}]}));
        assert_eq!(found.len(), 5, "{found:?}");
    }

    /// What [`crate::memory::avoid`] writes passes, on pods with and without affinity of their
    /// own.
    #[test]
    fn the_avoidance_patch_gives_an_affinity_the_api_server_takes() {
        let nodes: Vec<String> = ["gpu-3", "gpu-7", "ip-10-0-1-5.ec2.internal"]
            .map(String::from)
            .to_vec();
        for affinity in [
            json!(null),
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]},
                {}
            ]}}}),
        ] {
            let mut pod = json!({"spec": {"affinity": affinity, "containers": []}});
            let patch = crate::memory::avoid::exclusion_patch(&pod, &nodes);
            json_patch::patch(&mut pod, &patch).unwrap();
            let required: NodeSelector = serde_json::from_value(
                pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                    .clone(),
            )
            .unwrap();
            let found = check_required(&required, &FieldPath::root());
            assert!(found.is_empty(), "{found:?}");
            let terms = &required.node_selector_terms;
            assert!(terms.iter().filter(|t| t.match_fields.is_some()).all(|t| {
                nodes.iter().all(|node| {
                    t.match_fields.iter().flatten().any(|r| {
                        r.operator == "NotIn" && r.values.as_deref() == Some(&[node.clone()][..])
                    })
                })
            }));
        }
    }
}
