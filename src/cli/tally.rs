//! Every object accounted for: the summary line of `mutate` and `check` counts objects by
//! outcome and kind, and objects that carry pod templates but are not handled are named.

use std::collections::BTreeMap;

use serde_json::Value;

use gpu_guard_core::kinds::{self, PodTemplates};

/// Objects counted by outcome (`mutated`, `not handled`, ...) and kind.
#[derive(Debug, Default)]
pub struct Tally {
    counts: BTreeMap<&'static str, BTreeMap<String, usize>>,
}

impl Tally {
    pub fn add(&mut self, outcome: &'static str, kind: &str) {
        *self
            .counts
            .entry(outcome)
            .or_default()
            .entry(kind.to_owned())
            .or_default() += 1;
    }

    /// How many objects were counted.
    pub fn total(&self) -> usize {
        self.counts.values().flat_map(BTreeMap::values).sum()
    }

    /// How many objects had `outcome`.
    pub fn count(&self, outcome: &str) -> usize {
        self.counts
            .get(outcome)
            .map_or(0, |kinds| kinds.values().sum())
    }

    /// Each outcome with its count of objects, by name.
    pub fn outcomes(&self) -> impl Iterator<Item = (&'static str, usize)> + '_ {
        self.counts
            .iter()
            .map(|(outcome, kinds)| (*outcome, kinds.values().sum()))
    }

    /// `2 mutated (CronJob 1, Job 1), 3 not handled (ConfigMap 2, PyTorchJob 1)`: the outcomes
    /// in `order`, those with no object left out.
    pub fn line(&self, order: &[&str]) -> String {
        order
            .iter()
            .filter_map(|outcome| {
                let kinds = self.counts.get(outcome)?;
                let by_kind: Vec<String> = kinds
                    .iter()
                    .map(|(kind, count)| format!("{kind} {count}"))
                    .collect();
                Some(format!(
                    "{} {outcome} ({})",
                    kinds.values().sum::<usize>(),
                    by_kind.join(", ")
                ))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `{"mutated": {"Job": 2}, ...}`.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(&self.counts).expect("counts serialize")
    }
}

/// The object's kind as the summary names it (`<no kind>` when it has none).
pub fn kind_of(value: &Value) -> &str {
    value
        .get("kind")
        .and_then(Value::as_str)
        .filter(|kind| !kind.is_empty())
        .unwrap_or("<no kind>")
}

/// Whether an object carries a pod template anywhere in it: a mapping with a `containers`
/// list of containers (a PodSpec), as in a Pod, a Deployment, a Kubeflow PyTorchJob's
/// `pytorchReplicaSpecs.*.template` or a RayJob's `rayClusterSpec`. Iterative, so no
/// document can exhaust the stack.
pub fn carries_pod_template(value: &Value) -> bool {
    let mut pending: Vec<&Value> = match value.get("spec") {
        Some(spec) => vec![spec],
        None => return false,
    };
    while let Some(node) = pending.pop() {
        match node {
            Value::Object(fields) => {
                if fields
                    .get("containers")
                    .and_then(Value::as_array)
                    .is_some_and(|containers| {
                        containers
                            .iter()
                            .any(|c| c.get("image").is_some() || c.get("name").is_some())
                    })
                {
                    return true;
                }
                pending.extend(fields.values());
            }
            Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    false
}

/// The workload kinds of Kubernetes itself other than Job and CronJob (the kind registry's
/// built-in kinds with pod templates that it does not mark mutated): they carry pod templates,
/// but a podFailurePolicy is a Job's, so `mutate` leaves them alone by design (the guard judges
/// them).
pub fn is_core_workload(value: &Value) -> bool {
    kinds::of(value).is_some_and(|known| {
        known.built_in && !known.mutated && known.templates != PodTemplates::None
    })
}

/// `kubeflow.org/v1 PyTorchJob`.
pub fn api_kind(value: &Value) -> String {
    match value.get("apiVersion").and_then(Value::as_str) {
        Some(api_version) => format!("{api_version} {}", kind_of(value)),
        None => kind_of(value).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pod_templates_are_found_at_any_depth_of_the_spec() {
        let pytorch = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {
            "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {
                "containers": [{"name": "pytorch", "image": "trainer:1"}]}}}}}});
        assert!(carries_pod_template(&pytorch));
        let ray = json!({"kind": "RayJob", "spec": {"rayClusterSpec": {"workerGroupSpecs": [
            {"template": {"spec": {"containers": [{"name": "w", "image": "ray"}]}}}]}}});
        assert!(carries_pod_template(&ray));
        let config = json!({"kind": "ConfigMap", "data": {"containers": "[]"}});
        assert!(!carries_pod_template(&config));
        let service = json!({"kind": "Service", "spec": {"ports": [{"port": 80}]}});
        assert!(!carries_pod_template(&service));
    }

    #[test]
    fn kubernetes_own_workloads_are_left_alone_by_design() {
        for (api_version, kind, core) in [
            ("v1", "Pod", true),
            ("v1", "PodTemplate", true),
            ("apps/v1", "StatefulSet", true),
            ("batch/v1", "Job", false),
            ("apps/v1beta1", "Deployment", false),
            ("kubeflow.org/v1", "PyTorchJob", false),
            ("jobset.x-k8s.io/v1alpha2", "JobSet", false),
        ] {
            let object = json!({"apiVersion": api_version, "kind": kind});
            assert_eq!(is_core_workload(&object), core, "{api_version} {kind}");
        }
    }

    #[test]
    fn the_summary_counts_by_outcome_and_kind_in_the_order_given() {
        let mut tally = Tally::default();
        tally.add("mutated", "Job");
        tally.add("not handled", "Service");
        tally.add("mutated", "CronJob");
        tally.add("mutated", "Job");
        assert_eq!(tally.total(), 4);
        assert_eq!(tally.count("mutated"), 3);
        assert_eq!(
            tally.line(&["mutated", "unchanged", "not handled"]),
            "3 mutated (CronJob 1, Job 2), 1 not handled (Service 1)"
        );
    }
}
