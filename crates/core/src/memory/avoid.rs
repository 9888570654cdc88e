//! PURE: keep a new pod off the nodes where its workload's devices failed.
//!
//! A pod's required node affinity is a list of `nodeSelectorTerms`, ORed; the requirements in
//! one term are ANDed. So the exclusion goes into every term (a new term when there is none),
//! and everything the user wrote stays. It is one `matchFields` requirement per node,
//! `{key: metadata.name, operator: NotIn, values: [node]}`: `metadata.name` is the only field
//! key `matchFields` takes, with `In` or `NotIn` and exactly one value ("must be only one
//! value when `operator` is 'In' or 'NotIn' for node field selector": kubernetes
//! `pkg/apis/core/validation/validation.go`, `validateNodeFieldSelectorRequirement`, v1.36);
//! a list of nodes in one requirement is refused. The DaemonSet controller pins its pods with
//! the same field. Node affinity is immutable on a created pod: this runs at Pod CREATE only.
//!
//! An empty term (`{}`) matches no node (core/v1 `NodeSelectorTerm`: "a null or empty node
//! selector term matches no objects"); adding the exclusion to it would make it match every
//! other node, so it is left as it is.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use serde_json::{Value, json};

const AFFINITY: &str = "/spec/affinity";
const NODE_AFFINITY: &str = "/spec/affinity/nodeAffinity";
const REQUIRED: &str = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution";
const TERMS: &str =
    "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms";

/// The JSON Patch that keeps `pod` (a Pod's JSON) off `nodes`; empty when `nodes` is empty,
/// when the pod is bound to a node already (`spec.nodeName`: the kubelet would refuse it for
/// the affinity instead of the scheduler placing it elsewhere), or when its every term is
/// empty (it can run nowhere as it is).
pub fn exclusion_patch(pod: &Value, nodes: &[String]) -> Patch {
    let spec = &pod["spec"];
    let bound = spec["nodeName"]
        .as_str()
        .is_some_and(|name| !name.is_empty());
    if nodes.is_empty() || bound || !spec.is_object() {
        return Patch(Vec::new());
    }
    let exclusions: Vec<Value> = nodes
        .iter()
        .map(|node| json!({"key": "metadata.name", "operator": "NotIn", "values": [node]}))
        .collect();
    let term = || json!({"matchFields": exclusions.clone()});
    // The outermost absent (or null) field is added with what it holds.
    let only = |path: &str, value: Value| Patch(vec![add(path, value)]);
    let affinity = &spec["affinity"];
    if !affinity.is_object() {
        return only(
            AFFINITY,
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term()]}}}),
        );
    }
    let node_affinity = &affinity["nodeAffinity"];
    if !node_affinity.is_object() {
        return only(
            NODE_AFFINITY,
            json!({"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term()]}}),
        );
    }
    let required = &node_affinity["requiredDuringSchedulingIgnoredDuringExecution"];
    if !required.is_object() {
        return only(REQUIRED, json!({"nodeSelectorTerms": [term()]}));
    }
    let terms = match required["nodeSelectorTerms"].as_array() {
        Some(terms) if !terms.is_empty() => terms,
        _ => return only(TERMS, json!([term()])),
    };
    Patch(
        terms
            .iter()
            .enumerate()
            .filter(|(_, term)| !is_empty_term(term))
            .flat_map(|(index, term)| match term["matchFields"].as_array() {
                Some(_) => exclusions
                    .iter()
                    .map(|exclusion| {
                        add(&format!("{TERMS}/{index}/matchFields/-"), exclusion.clone())
                    })
                    .collect(),
                None => vec![add(
                    &format!("{TERMS}/{index}/matchFields"),
                    Value::Array(exclusions.clone()),
                )],
            })
            .collect(),
    )
}

/// A term with no requirement: no `matchExpressions` and no `matchFields`, or both empty.
fn is_empty_term(term: &Value) -> bool {
    let none = |key: &str| term[key].as_array().is_none_or(Vec::is_empty);
    none("matchExpressions") && none("matchFields")
}

fn add(path: &str, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::parse(path).expect("the paths here are valid JSON Pointers"),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn excluded(pod: Value) -> Value {
        let nodes = ["gpu-3".to_owned(), "gpu-7".to_owned()];
        let patch = exclusion_patch(&pod, &nodes);
        let mut patched = pod;
        json_patch::patch(&mut patched, &patch).expect("the patch applies");
        patched["spec"]["affinity"].clone()
    }

    /// One requirement per node: the API server takes one value per field requirement.
    fn not_in() -> [Value; 2] {
        ["gpu-3", "gpu-7"]
            .map(|node| json!({"key": "metadata.name", "operator": "NotIn", "values": [node]}))
    }

    #[test]
    fn a_pod_without_affinity_gets_one_term() {
        for spec in [
            json!({"containers": []}),
            json!({"affinity": null}),
            json!({"affinity": {"podAntiAffinity": {}}}),
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}}),
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}),
        ] {
            let affinity = excluded(json!({"spec": spec.clone()}));
            assert_eq!(
                affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
                json!({"nodeSelectorTerms": [{"matchFields": not_in()}]}),
                "{spec}"
            );
        }
        // What was beside it stays.
        let kept = excluded(json!({"spec": {"affinity": {"podAntiAffinity": {"x": 1}}}}));
        assert_eq!(kept["podAntiAffinity"], json!({"x": 1}));
    }

    #[test]
    fn every_term_gets_the_exclusion_and_keeps_what_it_had() {
        let zone = json!({"key": "zone", "operator": "In", "values": ["a"]});
        let pinned = json!({"key": "metadata.name", "operator": "In", "values": ["gpu-1"]});
        let affinity = excluded(json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [zone.clone()]},
                {"matchFields": [pinned.clone()]},
                {}
            ]}
        }}}}));
        assert_eq!(
            affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
            json!([
                {"matchExpressions": [zone], "matchFields": not_in()},
                {"matchFields": [pinned, not_in()[0], not_in()[1]]},
                // An empty term matches no node; with the exclusion it would match many.
                {}
            ])
        );
    }

    #[test]
    fn no_patch_without_nodes_or_for_a_bound_pod() {
        let pod = json!({"spec": {"containers": []}});
        assert!(exclusion_patch(&pod, &[]).is_empty());
        let bound = json!({"spec": {"nodeName": "gpu-3"}});
        assert!(exclusion_patch(&bound, &["gpu-3".to_owned()]).is_empty());
    }
}
