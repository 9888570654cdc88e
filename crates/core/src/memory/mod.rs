//! PURE: the memory of a workload's device failures, and what it steers.
//!
//! gpu-guard turns a device failure into a free retry (the injected `Ignore` rules). When the
//! device plugin does not flag the fault (an Xid it does not treat as fatal, an NVLink or NCCL
//! error, a GPU that hangs), the application's exit code is the only signal, and the
//! replacement pod is scheduled where the failed one ran: that node has just freed exactly the
//! GPUs the pod asks for and holds its image. So gpu-guard remembers, per workload, where its
//! pods failed of a device ([`Memory`]), and
//! - a new pod of the workload is kept off those nodes ([`avoid`]);
//! - past a budget, the workload's failures count again (the controller's part).
//! - failures of several pods on one node make the node suspect ([`suspect`]).
//!
//! A workload is a Job, or, for the child Jobs of a JobSet, the JobSet: a JobSet's gang restart
//! deletes its child Jobs and their pods, so a memory kept on them would be lost
//! ([`WorkloadRef`]). The memory is an annotation on the workload ([`MEMORY_ANNOTATION`],
//! JSON): it survives a restart of the controller and a change of its leader, and
//! `kubectl describe` shows it. It is bounded: the most recent [`Memory::MAX_RECORDS`]
//! failures, and the total count.
//!
//! What is a device failure ([`crate::health::pod::device_failure`]): a failed pod whose device container
//! exited with one of the policy's free-retry exit codes, or that carries
//! `gpu-guard.io/DeviceFailure=True`, or a device of which the kubelet reported `Unhealthy`.
//! Not: other exit codes, OOM kills, `DisruptionTarget` (drains, preemption, eviction).

pub mod avoid;
pub mod failure;
pub mod suspect;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

pub use failure::{WorkloadKind, WorkloadRef, workload_of};

/// The annotation on a Job or JobSet that holds its [`Memory`] (JSON).
pub const MEMORY_ANNOTATION: &str = "gpu-guard.io/device-failures";
/// The label (value `"true"`) the controller sets beside [`MEMORY_ANNOTATION`]: a label, unlike
/// an annotation, can select, so a cache can watch only the workloads that have a memory.
pub const MEMORY_LABEL: &str = "gpu-guard.io/device-failures";

/// One device failure of a pod of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceFailure {
    /// The node the pod ran on (`spec.nodeName`).
    pub node: String,
    /// The pod's name.
    pub pod: String,
    /// The IDs of the devices the kubelet reported unhealthy, where known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// When it failed (the container's `finishedAt`, or the condition's transition), where
    /// known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
    /// Why it counts, in words (`exit code 74 in container trainer`).
    pub cause: String,
}

/// A workload's device failures: the most recent ones, oldest first, and how many there were.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// Every device failure recorded, including those no longer in `failures`.
    pub total: u32,
    /// The most recent failures, at most [`Memory::MAX_RECORDS`], oldest first.
    #[serde(default)]
    pub failures: Vec<DeviceFailure>,
}

/// The memory annotation could not be read.
#[derive(Debug, thiserror::Error)]
#[error(
    "the annotation {MEMORY_ANNOTATION} is not gpu-guard's record of device failures ({0}); \
     remove it and gpu-guard starts a new record"
)]
pub struct MemoryError(#[source] serde_json::Error);

impl Memory {
    /// How many failures the annotation keeps. Enough for the avoidance list of any sensible
    /// policy and for a person to read, while the annotation stays under 4 KiB (an entry is
    /// about 150 bytes), far below the 256 KiB the API server allows for all annotations.
    pub const MAX_RECORDS: usize = crate::policy::RECORDED_FAILURES;

    /// The memory in a workload's annotations: empty without the annotation.
    pub fn of_annotation(value: Option<&str>) -> Result<Memory, MemoryError> {
        match value {
            None => Ok(Memory::default()),
            Some(text) => serde_json::from_str(text).map_err(MemoryError),
        }
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a memory serializes")
    }

    /// Records `failure`, unless the same pod's failure is recorded already; returns whether
    /// it was new. Only the most recent [`Memory::MAX_RECORDS`] are kept.
    ///
    /// When the record is full, a failure older than the oldest one kept is not new either:
    /// it was recorded and has since been pushed out (a controller that restarts sees a plain
    /// Job's failed pods again, all of them), and counting it again would spend the
    /// workload's budget twice.
    pub fn record(&mut self, failure: DeviceFailure) -> bool {
        if self.failures.iter().any(|known| known.pod == failure.pod) {
            return false;
        }
        let oldest = self.failures.first().and_then(|oldest| oldest.at);
        if self.failures.len() >= Self::MAX_RECORDS
            && let (Some(oldest), Some(at)) = (oldest, failure.at)
            && at < oldest
        {
            return false;
        }
        self.total = self.total.saturating_add(1);
        self.failures.push(failure);
        // Oldest first: a failure without a time stays where it came.
        self.failures.sort_by_key(|known| known.at);
        let excess = self.failures.len().saturating_sub(Self::MAX_RECORDS);
        self.failures.drain(..excess);
        true
    }

    /// The nodes to keep the workload's next pods off: at most `max`, distinct, the most
    /// recent failure first.
    pub fn nodes_to_avoid(&self, max: usize) -> Vec<String> {
        let mut nodes: Vec<String> = Vec::new();
        for failure in self.failures.iter().rev() {
            if nodes.len() == max {
                break;
            }
            if !failure.node.is_empty() && !nodes.contains(&failure.node) {
                nodes.push(failure.node.clone());
            }
        }
        nodes
    }
}

/// How many pods a workload runs at once, from its object (a Job's or a JobSet's JSON): a
/// Job's `spec.parallelism` (default 1, batch/v1 `JobSpec`); for a JobSet, the sum over
/// `spec.replicatedJobs` of `replicas` (default 1: kubernetes-sigs/jobset
/// `api/jobset/v1alpha2/jobset_types.go`, `ReplicatedJob.Replicas`, `+kubebuilder:default=1`)
/// times the template's `parallelism`. What the retry budget scales with.
pub fn workload_pods(kind: WorkloadKind, object: &serde_json::Value) -> u32 {
    let count = |value: &serde_json::Value| {
        value
            .as_u64()
            .map_or(1, |count| u32::try_from(count).unwrap_or(u32::MAX))
    };
    let spec = &object["spec"];
    match kind {
        WorkloadKind::Job => count(&spec["parallelism"]),
        WorkloadKind::JobSet => spec["replicatedJobs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|replicated| {
                count(&replicated["replicas"])
                    .saturating_mul(count(&replicated["template"]["spec"]["parallelism"]))
            })
            .fold(0u32, u32::saturating_add),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(pod: &str, node: &str, at: Option<&str>) -> DeviceFailure {
        DeviceFailure {
            node: node.to_owned(),
            pod: pod.to_owned(),
            devices: Vec::new(),
            at: at.map(|at| at.parse().unwrap()),
            cause: "exit code 74 in container trainer".to_owned(),
        }
    }

    #[test]
    fn a_pod_is_recorded_once_and_the_record_is_bounded() {
        let mut memory = Memory::default();
        assert!(memory.record(failure("p0", "n0", Some("2026-12-04T10:00:00Z"))));
        assert!(!memory.record(failure("p0", "n9", Some("2026-12-04T10:00:01Z"))));
        assert_eq!(memory.total, 1);
        for i in 1..30 {
            let at = format!("2026-12-04T10:{i:02}:00Z");
            assert!(memory.record(failure(&format!("p{i}"), &format!("n{}", i % 3), Some(&at))));
        }
        assert_eq!(memory.total, 30);
        assert_eq!(memory.failures.len(), Memory::MAX_RECORDS);
        assert_eq!(memory.failures[0].pod, "p10");
        assert_eq!(memory.failures.last().unwrap().pod, "p29");
    }

    #[test]
    fn a_failure_older_than_a_full_record_is_not_counted_again() {
        let mut memory = Memory::default();
        for i in 0..Memory::MAX_RECORDS + 1 {
            let at = format!("2026-12-04T10:{i:02}:00Z");
            memory.record(failure(&format!("p{i}"), "n", Some(&at)));
        }
        assert_eq!(memory.total, 21);
        // p0 was pushed out; a restarted controller sees its failed pod again.
        assert!(!memory.record(failure("p0", "n", Some("2026-12-04T10:00:00Z"))));
        assert_eq!(memory.total, 21);
        assert!(memory.record(failure("p99", "n", Some("2026-12-04T11:00:00Z"))));
        assert_eq!(memory.total, 22);
    }

    #[test]
    fn a_workload_runs_its_parallelism_or_its_replicated_jobs_pods() {
        use serde_json::json;
        assert_eq!(workload_pods(WorkloadKind::Job, &json!({"spec": {}})), 1);
        assert_eq!(
            workload_pods(WorkloadKind::Job, &json!({"spec": {"parallelism": 8}})),
            8
        );
        let jobset = json!({"spec": {"replicatedJobs": [
            {"name": "workers", "replicas": 4, "template": {"spec": {"parallelism": 2}}},
            {"name": "driver", "template": {"spec": {}}}]}});
        assert_eq!(workload_pods(WorkloadKind::JobSet, &jobset), 9);
        assert_eq!(workload_pods(WorkloadKind::JobSet, &json!({})), 0);
    }

    #[test]
    fn nodes_to_avoid_are_distinct_most_recent_first_and_bounded() {
        let mut memory = Memory::default();
        for (pod, node, at) in [
            ("a", "n1", "2026-12-04T10:00:00Z"),
            ("c", "n3", "2026-12-04T10:02:00Z"),
            ("b", "n2", "2026-12-04T10:01:00Z"),
            ("d", "n1", "2026-12-04T10:03:00Z"),
        ] {
            memory.record(failure(pod, node, Some(at)));
        }
        assert_eq!(memory.nodes_to_avoid(8), ["n1", "n3", "n2"]);
        assert_eq!(memory.nodes_to_avoid(2), ["n1", "n3"]);
        assert!(memory.nodes_to_avoid(0).is_empty());
    }

    #[test]
    fn the_annotation_round_trips_and_a_foreign_one_is_an_error_that_says_what_to_do() {
        let mut memory = Memory::default();
        memory.record(failure("p", "n", Some("2026-12-04T10:00:00Z")));
        let text = memory.to_annotation();
        assert_eq!(
            text,
            r#"{"total":1,"failures":[{"node":"n","pod":"p","at":"2026-12-04T10:00:00Z","cause":"exit code 74 in container trainer"}]}"#
        );
        assert_eq!(Memory::of_annotation(Some(&text)).unwrap(), memory);
        assert_eq!(Memory::of_annotation(None).unwrap(), Memory::default());
        let error = Memory::of_annotation(Some("n1,n2"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("remove it"), "{error}");
    }
}
