//! Prometheus metrics of `gpu-guard controller`, owned by the controller (not a global), so
//! tests read the same counters `/metrics` exposes. Counters count what was done, or in a dry
//! run what would have been done (`gpu_guard_controller_dry_run` tells which).

use gpu_guard_core::memory::WorkloadKind;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The metric names as exposed (the registry prefix `gpu_guard_` included; counters get
/// `_total` appended), for documentation and dashboards.
pub const METRIC_NAMES: [(&str, &str); 28] = [
    ("gpu_guard_controller_gpu_nodes", "gauge"),
    ("gpu_guard_controller_degraded_nodes", "gauge"),
    ("gpu_guard_controller_tainted_nodes", "gauge"),
    ("gpu_guard_controller_taints_added_total", "counter"),
    ("gpu_guard_controller_suspect_nodes", "gauge"),
    ("gpu_guard_controller_suspect_taints_added_total", "counter"),
    ("gpu_guard_controller_taints_removed_total", "counter"),
    ("gpu_guard_controller_pods_marked_total", "counter"),
    ("gpu_guard_controller_peer_pods_marked_total", "counter"),
    ("gpu_guard_controller_pods_evicted_total", "counter"),
    ("gpu_guard_controller_evictions_deferred_total", "counter"),
    ("gpu_guard_controller_safety_valve_trips_total", "counter"),
    ("gpu_guard_controller_reconcile_errors_total", "counter"),
    ("gpu_guard_controller_passes_total", "counter"),
    ("gpu_guard_controller_leader", "gauge"),
    ("gpu_guard_controller_dry_run", "gauge"),
    ("gpu_guard_controller_caches_synced", "gauge"),
    ("gpu_guard_controller_daemonsets_not_tolerating", "gauge"),
    ("gpu_guard_controller_device_pods", "gauge"),
    ("gpu_guard_controller_events_dropped_total", "counter"),
    (
        "gpu_guard_controller_vanished_resources_forgotten_total",
        "counter",
    ),
    ("gpu_guard_controller_node_conditions_set_total", "counter"),
    (
        "gpu_guard_controller_node_conditions_removed_total",
        "counter",
    ),
    ("gpu_guard_controller_stuck_pods", "gauge"),
    ("gpu_guard_controller_pods_force_deleted_total", "counter"),
    (
        "gpu_guard_controller_device_failures_recorded_total",
        "counter",
    ),
    (
        "gpu_guard_controller_device_retries_exhausted_total",
        "counter",
    ),
    (
        "gpu_guard_controller_pods_marked_retries_exhausted_total",
        "counter",
    ),
];

/// The label of the workload metrics: `kind` (`Job`, `JobSet`).
pub type KindLabel = Vec<(&'static str, &'static str)>;

/// Every metric the controller exports.
#[derive(Debug)]
pub struct ControllerMetrics {
    pub registry: Registry,
    pub gpu_nodes: Gauge,
    pub degraded_nodes: Gauge,
    pub tainted_nodes: Gauge,
    pub taints_added: Counter,
    pub taints_removed: Counter,
    /// GPU nodes holding gpu-guard's taint as suspect, and suspect taints added (counted in
    /// `tainted_nodes` and `taints_added` too).
    pub suspect_nodes: Gauge,
    pub suspect_taints_added: Counter,
    pub pods_marked: Counter,
    /// Pods given `gpu-guard.io/PeerDeviceFailure` as running peers of a gang pod hit by a
    /// device failure.
    pub peers_marked: Counter,
    pub pods_evicted: Counter,
    pub evictions_deferred: Counter,
    pub safety_valve_trips: Counter,
    pub reconcile_errors: Counter,
    pub passes: Counter,
    pub leader: Gauge,
    pub dry_run: Gauge,
    pub caches_synced: Gauge,
    /// GPU DaemonSets that do not tolerate gpu-guard's taint, as listed at start (-1: the list
    /// failed).
    pub daemonsets_not_tolerating: Gauge,
    /// Device pods in the pod cache (what the controller's memory grows with).
    pub device_pods: Gauge,
    /// Pod Events not published because the queue that takes them off the mark path was full.
    pub events_dropped: Counter,
    /// Device resources no longer counted as "plugin down" on their node: gone too long,
    /// replaced by another resource of the same vendor, or on a node that opted out.
    pub vanished_forgotten: Counter,
    /// gpu-guard's Node condition added or rewritten (node repair systems read it).
    pub node_conditions_set: Counter,
    pub node_conditions_removed: Counter,
    /// Pods of protected Jobs stuck Terminating on a NotReady or unreachable node, as of the
    /// passes that judged them.
    pub stuck_pods: Gauge,
    pub pods_force_deleted: Counter,
    /// Device failures recorded in their workload's memory, by workload kind.
    pub failures_recorded: Family<KindLabel, Counter>,
    /// Workloads found past their device-retry budget, by kind.
    pub retries_exhausted: Family<KindLabel, Counter>,
    /// Pods given `gpu-guard.io/DeviceRetriesExhausted`.
    pub pods_marked_exhausted: Counter,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gpu_guard");
        macro_rules! register {
            ($metric:expr, $name:literal, $help:literal) => {{
                let metric = $metric;
                registry.register($name, $help, metric.clone());
                metric
            }};
        }
        let metrics = Self {
            gpu_nodes: register!(
                Gauge::default(),
                "controller_gpu_nodes",
                "Nodes with capacity and allocatable for a configured device resource"
            ),
            degraded_nodes: register!(
                Gauge::default(),
                "controller_degraded_nodes",
                "GPU nodes whose unusable devices reach the threshold (tainted or not yet)"
            ),
            tainted_nodes: register!(
                Gauge::default(),
                "controller_tainted_nodes",
                "GPU nodes holding gpu-guard's device-degraded taint (in a dry run: would)"
            ),
            taints_added: register!(
                Counter::default(),
                "controller_taints_added",
                "Device-degraded taints added (in a dry run: that would have been)"
            ),
            suspect_nodes: register!(
                Gauge::default(),
                "controller_suspect_nodes",
                "GPU nodes holding gpu-guard's taint as suspect: device failures of several pods, no unusable device (in a dry run: would)"
            ),
            suspect_taints_added: register!(
                Counter::default(),
                "controller_suspect_taints_added",
                "Suspect taints added (in a dry run: that would have been)"
            ),
            taints_removed: register!(
                Counter::default(),
                "controller_taints_removed",
                "Device-degraded taints removed after recovery (in a dry run: that would have been)"
            ),
            pods_marked: register!(
                Counter::default(),
                "controller_pods_marked",
                "Pods given the condition gpu-guard.io/DeviceFailure=True (in a dry run: that would have been)"
            ),
            peers_marked: register!(
                Counter::default(),
                "controller_peer_pods_marked",
                "Running peers of a gang pod hit by a device failure given the condition gpu-guard.io/PeerDeviceFailure=True (in a dry run: that would have been)"
            ),
            pods_evicted: register!(
                Counter::default(),
                "controller_pods_evicted",
                "Pods evicted through the Eviction API (in a dry run: that would have been)"
            ),
            evictions_deferred: register!(
                Counter::default(),
                "controller_evictions_deferred",
                "Evictions put off to a later pass: rate limit reached, refused by a PodDisruptionBudget (429), or throttled by the API server (429)"
            ),
            safety_valve_trips: register!(
                Counter::default(),
                "controller_safety_valve_trips",
                "Degraded nodes left untainted because maxTaintedPercent of GPU nodes are tainted"
            ),
            reconcile_errors: register!(
                Counter::default(),
                "controller_reconcile_errors",
                "Failed API calls while applying decisions (retried on the next pass)"
            ),
            passes: register!(
                Counter::default(),
                "controller_passes",
                "Reconcile passes over the nodes (full passes and passes after node events; passes over changed pods alone are not counted)"
            ),
            leader: register!(
                Gauge::default(),
                "controller_leader",
                "1 while this replica holds the leader Lease and acts"
            ),
            dry_run: register!(
                Gauge::default(),
                "controller_dry_run",
                "1 when the controller runs in dry-run mode (changes nothing)"
            ),
            caches_synced: register!(
                Gauge::default(),
                "controller_caches_synced",
                "1 once the Node, Pod, Namespace and ResourceSlice caches have listed"
            ),
            daemonsets_not_tolerating: register!(
                Gauge::default(),
                "controller_daemonsets_not_tolerating",
                "GPU DaemonSets (device plugin, DCGM exporter, driver) whose pod template does not tolerate gpu-guard's taint, listed at start (-1: could not list)"
            ),
            device_pods: register!(
                Gauge::default(),
                "controller_device_pods",
                "Pods that use a device, held in the controller's pod cache (other pods are not kept)"
            ),
            events_dropped: register!(
                Counter::default(),
                "controller_events_dropped",
                "Pod Events (DeviceFailureMarked, PeerDeviceFailureMarked) not published because their queue was full (the marks themselves were made)"
            ),
            vanished_forgotten: register!(
                Counter::default(),
                "controller_vanished_resources_forgotten",
                "Device resources gone from a node (or whose plugin stopped) no longer judged plugin down: gone over an hour, replaced by a resource of the same vendor, or the node annotated gpu-guard.io/ignore-vanished-resources"
            ),
            node_conditions_set: register!(
                Counter::default(),
                "controller_node_conditions_set",
                "Node conditions gpu-guard.io/DeviceDegraded=True added or rewritten on nodes holding gpu-guard's taint (in a dry run: that would have been)"
            ),
            node_conditions_removed: register!(
                Counter::default(),
                "controller_node_conditions_removed",
                "Node conditions gpu-guard.io/DeviceDegraded removed from nodes without gpu-guard's taint (in a dry run: that would have been)"
            ),
            stuck_pods: register!(
                Gauge::default(),
                "controller_stuck_pods",
                "Pods of protected Jobs Terminating on a NotReady or unreachable node for controller.stuckPods.afterSeconds"
            ),
            pods_force_deleted: register!(
                Counter::default(),
                "controller_pods_force_deleted",
                "Stuck pods deleted with gracePeriodSeconds 0 (controller.stuckPods.forceDelete; in a dry run: that would have been)"
            ),
            failures_recorded: register!(
                Family::<KindLabel, Counter>::default(),
                "controller_device_failures_recorded",
                "Device failures of pods recorded in their workload's annotation gpu-guard.io/device-failures, by workload kind (in a dry run: that would have been)"
            ),
            retries_exhausted: register!(
                Family::<KindLabel, Counter>::default(),
                "controller_device_retries_exhausted",
                "Workloads found with more device failures on record than their budget (controller.deviceRetries), by kind"
            ),
            pods_marked_exhausted: register!(
                Counter::default(),
                "controller_pods_marked_retries_exhausted",
                "Pods given the condition gpu-guard.io/DeviceRetriesExhausted=True (in a dry run: that would have been)"
            ),
            registry,
        };
        // Exposed at 0 from the start, for each kind: a family without a sample is not
        // exposed at all, and an alert on its rate would see no series.
        for kind in [WorkloadKind::Job, WorkloadKind::JobSet] {
            drop(metrics.failures_recorded.get_or_create(&kind_label(kind)));
            drop(metrics.retries_exhausted.get_or_create(&kind_label(kind)));
        }
        metrics
    }
}

/// The label set of a workload metric.
pub fn kind_label(kind: WorkloadKind) -> KindLabel {
    vec![("kind", kind.as_str())]
}

impl ControllerMetrics {
    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_name_is_exposed() {
        let text = ControllerMetrics::default().encode();
        for (name, kind) in METRIC_NAMES {
            let family = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                text.contains(&format!("# TYPE {family} {kind}")),
                "{name} missing from\n{text}"
            );
        }
    }
}
