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
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Memory, MemoryError, WorkloadRef, workload_of};
use crate::policy::Policy;
use crate::wellknown::SKIP_ANNOTATION;

/// Where the memories of workloads are read from: the webhook's cache of the Jobs and JobSets
/// that have one, or, offline, what `gpu-guard mutate` computed from the pods of its input.
pub trait Memories {
    /// The [`super::MEMORY_ANNOTATION`] of `workload`, when it is known and has one.
    fn memory_annotation(&self, workload: &WorkloadRef) -> Option<String>;
}

/// No memory at all (`serve --no-cluster`): every pod passes unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMemories;

impl Memories for NoMemories {
    fn memory_annotation(&self, _: &WorkloadRef) -> Option<String> {
        None
    }
}

/// What [`avoid_failed_nodes`] decided for a pod.
#[derive(Debug)]
pub enum Avoidance {
    /// Nothing to do: avoidance is off, the pod is not a new pod of a Job, it asks to be
    /// skipped, or its workload has no device failure on record.
    Unchanged,
    /// The workload's memory annotation is not gpu-guard's: the pod passes unchanged.
    BadMemory {
        workload: WorkloadRef,
        error: MemoryError,
    },
    /// The pod is kept off `nodes` (most recent failure first) by `patch`.
    Excluded {
        workload: WorkloadRef,
        nodes: Vec<String>,
        patch: Patch,
    },
}

/// The one decision of the webhook's Pod CREATE and of `gpu-guard mutate` for a pod (`pod`, a
/// Pod's JSON): when it is a pod not yet scheduled (no `spec.nodeName`, no phase past
/// `Pending`) that the Job controller made for a workload with device failures on record, the
/// patch that keeps it off the most recent `mutation.avoidFailedNodes.maxNodes` of those nodes.
/// A pod annotated `gpu-guard.io/skip: "true"` is left alone.
pub fn avoid_failed_nodes(pod: &Value, policy: &Policy, memories: &dyn Memories) -> Avoidance {
    let settings = &policy.mutation.avoid_failed_nodes;
    if !settings.enabled || !is_unscheduled(pod) {
        return Avoidance::Unchanged;
    }
    // Only the metadata says whose pod it is; the rest is not decoded.
    let Some(metadata) = pod
        .get("metadata")
        .and_then(|metadata| ObjectMeta::deserialize(metadata).ok())
    else {
        return Avoidance::Unchanged;
    };
    let skipped = metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(SKIP_ANNOTATION))
        .is_some_and(|value| value == "true");
    let owned = Pod {
        metadata,
        ..Pod::default()
    };
    let Some(workload) = workload_of(&owned).filter(|_| !skipped) else {
        return Avoidance::Unchanged;
    };
    let Some(annotation) = memories.memory_annotation(&workload) else {
        return Avoidance::Unchanged;
    };
    let memory = match Memory::of_annotation(Some(&annotation)) {
        Ok(memory) => memory,
        Err(error) => return Avoidance::BadMemory { workload, error },
    };
    let nodes = memory.nodes_to_avoid(settings.max_nodes as usize);
    let patch = exclusion_patch(pod, &nodes);
    if patch.is_empty() {
        return Avoidance::Unchanged;
    }
    Avoidance::Excluded {
        workload,
        nodes,
        patch,
    }
}

/// What was done, in words, for `gpu-guard mutate` and the webhook's audit annotation.
pub fn describe(workload: &WorkloadRef, nodes: &[String]) -> String {
    format!(
        "kept off {} {}, where {workload} failed of a device",
        if nodes.len() == 1 { "node" } else { "nodes" },
        nodes.join(", ")
    )
}

/// Whether the pod has not been placed: no `spec.nodeName`, and no phase or `Pending`. A pod
/// of the input of `gpu-guard mutate` that ran (an earlier pod, with its status) is not new.
fn is_unscheduled(pod: &Value) -> bool {
    let bound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|name| !name.is_empty());
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    !bound && matches!(phase, None | Some("" | "Pending"))
}

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
    let mut operations = Vec::new();
    for (index, term) in terms.iter().enumerate() {
        if is_empty_term(term) {
            continue;
        }
        // A node this term excludes already (a pod admitted twice, a manifest mutated twice)
        // is not excluded again.
        let present = term["matchFields"].as_array();
        let missing: Vec<Value> = exclusions
            .iter()
            .filter(|exclusion| present.is_none_or(|present| !present.contains(exclusion)))
            .cloned()
            .collect();
        if missing.is_empty() {
            continue;
        }
        match present {
            Some(_) => operations.extend(
                missing
                    .into_iter()
                    .map(|exclusion| add(&format!("{TERMS}/{index}/matchFields/-"), exclusion)),
            ),
            None => operations.push(add(
                &format!("{TERMS}/{index}/matchFields"),
                Value::Array(missing),
            )),
        }
    }
    Patch(operations)
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

    /// The memory of Job ml/train: failures on gpu-1 .. gpu-4, gpu-4 the latest.
    struct TrainMemory(String);

    impl Memories for TrainMemory {
        fn memory_annotation(&self, workload: &WorkloadRef) -> Option<String> {
            (workload.to_string() == "Job ml/train").then(|| self.0.clone())
        }
    }

    fn train_memory() -> TrainMemory {
        let mut memory = Memory::default();
        for i in 1..=4 {
            memory.record(crate::memory::DeviceFailure {
                node: format!("gpu-{i}"),
                pod: format!("train-{i}"),
                devices: Vec::new(),
                at: Some(format!("2026-12-04T10:0{i}:00Z").parse().unwrap()),
                cause: "exit code 74 in container trainer".to_owned(),
            });
        }
        TrainMemory(memory.to_annotation())
    }

    /// A pod as the Job controller creates it for Job ml/train.
    fn job_pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "generateName": "train-", "namespace": "ml",
                "labels": {"batch.kubernetes.io/job-name": "train", "job-name": "train"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                    "uid": "u1", "controller": true, "blockOwnerDeletion": true}]
            },
            "spec": {"containers": [{"name": "trainer"}]}
        })
    }

    fn avoided(pod: &Value, policy: &Policy, memories: &dyn Memories) -> Option<Vec<String>> {
        match avoid_failed_nodes(pod, policy, memories) {
            Avoidance::Excluded { nodes, .. } => Some(nodes),
            Avoidance::Unchanged => None,
            Avoidance::BadMemory { error, .. } => panic!("{error}"),
        }
    }

    #[test]
    fn a_new_pod_of_a_workload_with_failures_avoids_the_latest_nodes() {
        let mut policy = Policy::embedded();
        let memory = train_memory();
        let pod = job_pod();
        assert_eq!(
            avoided(&pod, &policy, &memory).unwrap(),
            ["gpu-4", "gpu-3", "gpu-2", "gpu-1"]
        );
        policy.mutation.avoid_failed_nodes.max_nodes = 2;
        assert_eq!(avoided(&pod, &policy, &memory).unwrap(), ["gpu-4", "gpu-3"]);
        // Off, skipped, placed already, ran already, another Job's, nothing recorded: no change.
        let mut off = policy.clone();
        off.mutation.avoid_failed_nodes.enabled = false;
        assert_eq!(avoided(&pod, &off, &memory), None);
        let mut skipped = pod.clone();
        skipped["metadata"]["annotations"] = json!({"gpu-guard.io/skip": "true"});
        assert_eq!(avoided(&skipped, &policy, &memory), None);
        let mut bound = pod.clone();
        bound["spec"]["nodeName"] = json!("gpu-9");
        assert_eq!(avoided(&bound, &policy, &memory), None);
        let mut ran = pod.clone();
        ran["status"] = json!({"phase": "Failed"});
        assert_eq!(avoided(&ran, &policy, &memory), None);
        let mut pending = pod.clone();
        pending["status"] = json!({"phase": "Pending"});
        assert!(avoided(&pending, &policy, &memory).is_some());
        let mut other = pod.clone();
        other["metadata"]["labels"] = json!({"batch.kubernetes.io/job-name": "eval"});
        other["metadata"]["ownerReferences"][0]["name"] = json!("eval");
        assert_eq!(avoided(&other, &policy, &memory), None);
        assert_eq!(avoided(&pod, &policy, &NoMemories), None);
        let mut bare = pod.clone();
        bare["metadata"] = json!({"name": "standalone", "namespace": "ml"});
        assert_eq!(avoided(&bare, &policy, &memory), None);
    }

    #[test]
    fn a_foreign_annotation_is_reported_and_changes_nothing() {
        let policy = Policy::embedded();
        let foreign = TrainMemory("gpu-3,gpu-7".to_owned());
        match avoid_failed_nodes(&job_pod(), &policy, &foreign) {
            Avoidance::BadMemory { workload, error } => {
                assert_eq!(workload.to_string(), "Job ml/train");
                assert!(error.to_string().contains("remove it"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_excluded_already_is_not_excluded_again() {
        let pod = json!({"spec": {"containers": []}});
        let nodes = ["gpu-3".to_owned(), "gpu-7".to_owned()];
        let mut once = pod.clone();
        json_patch::patch(&mut once, &exclusion_patch(&pod, &nodes)).unwrap();
        assert!(exclusion_patch(&once, &nodes).is_empty());
        // A new node joins the ones there.
        let more = ["gpu-9".to_owned(), "gpu-3".to_owned()];
        let mut twice = once.clone();
        json_patch::patch(&mut twice, &exclusion_patch(&once, &more)).unwrap();
        let fields = &twice["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"];
        let excluded: Vec<&str> = fields
            .as_array()
            .unwrap()
            .iter()
            .map(|field| field["values"][0].as_str().unwrap())
            .collect();
        assert_eq!(excluded, ["gpu-3", "gpu-7", "gpu-9"]);
    }

    #[test]
    fn no_patch_without_nodes_or_for_a_bound_pod() {
        let pod = json!({"spec": {"containers": []}});
        assert!(exclusion_patch(&pod, &[]).is_empty());
        let bound = json!({"spec": {"nodeName": "gpu-3"}});
        assert!(exclusion_patch(&bound, &["gpu-3".to_owned()]).is_empty());
    }
}
