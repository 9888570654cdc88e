//! The `controller` section of the policy file: how `gpu-guard controller` judges GPU nodes
//! and the pods on them (see [`crate::controller`]).
//!
//! Fractions are whole percentages (`maxTaintedPercent: 10`), so the policy stays exactly
//! comparable and a schema can bound them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::field::FieldPath;

/// The longest `degradedForSeconds` and `healthyForSeconds`: 30 days.
pub const MAX_HOLD_SECONDS: u64 = 30 * 24 * 3600;
/// The longest `resyncSeconds`: one hour.
pub const MAX_RESYNC_SECONDS: u64 = 3600;

/// The node health controller and device-failure pod watcher.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Controller {
    /// Compute, log, count and emit Events for everything, but change nothing: taints, pod
    /// conditions and evictions are sent with `dryRun=All` (checked by the API server, RBAC,
    /// admission and PodDisruptionBudgets included, and not stored). `gpu-guard controller
    /// --dry-run` turns it on too.
    pub dry_run: bool,
    /// Seconds between two full passes over nodes and pods. Watch events trigger a pass
    /// sooner; this bounds how late a time threshold (`degradedForSeconds`, ...) is noticed (at most one hour).
    #[schemars(range(min = 1, max = 3600))]
    pub resync_seconds: u64,
    /// Node health: compare device capacity with allocatable, taint degraded nodes.
    pub node_health: NodeHealth,
    /// The device-failure pod watcher.
    pub pods: PodWatcher,
    /// Pods of protected Jobs stuck Terminating on a NotReady or unreachable node.
    pub stuck_pods: StuckPods,
    /// How many device failures of a workload are retried for free (the budget).
    pub device_retries: DeviceRetries,
}

impl Default for Controller {
    fn default() -> Self {
        Self {
            dry_run: false,
            resync_seconds: 15,
            node_health: NodeHealth::default(),
            pods: PodWatcher::default(),
            stuck_pods: StuckPods::default(),
            device_retries: DeviceRetries::default(),
        }
    }
}

/// When a node counts as degraded, and what is done about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeHealth {
    /// Taint degraded nodes at all. When false, nodes are still judged, logged and counted,
    /// and the taints gpu-guard added earlier are still removed on recovery.
    pub enabled: bool,
    /// How many unusable devices (capacity minus allocatable) of one resource make a node
    /// degraded.
    pub unusable_devices: UnusableThreshold,
    /// Seconds the threshold must hold before the node is tainted (a device plugin restart
    /// briefly reports allocatable 0; at most 30 days).
    #[schemars(range(min = 0, max = 2_592_000))]
    pub degraded_for_seconds: u64,
    /// Seconds a tainted node must stay below the threshold before the taint is removed (at
    /// most 30 days).
    #[schemars(range(min = 0, max = 2_592_000))]
    pub healthy_for_seconds: u64,
    /// Taint with effect `NoExecute` instead of `NoSchedule`: pods on the node that do not
    /// tolerate it are evicted too, healthy GPUs' pods included. Never while the node's device
    /// plugin is down (then `NoSchedule`). The GPU DaemonSets must tolerate it. Off by default.
    pub no_execute: bool,
    /// The safety valve: gpu-guard never holds more than this percentage of GPU nodes (nodes
    /// with capacity for a device resource) tainted at once, rounded down but at least one
    /// node. Past it, further degraded nodes are reported (log, Event, metric), not tainted.
    #[schemars(range(min = 0, max = 100))]
    pub max_tainted_percent: u32,
    /// Suspect nodes: device failures of several different pods on one node its device plugin
    /// reports healthy taint it like a degraded node (value `suspect`), until a quiet period
    /// passes without another.
    pub suspect: SuspectNodes,
}

/// When device failures of several pods make a node suspect (see docs/controller.md, "Suspect
/// nodes"). The defaults: device remediations run at about 19 per 1,000 nodes a day (design.md),
/// about 0.02 a node a day; three different pods failing of a device on one node within an hour
/// is far beyond chance, and one or two may be the applications' own misreported errors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SuspectNodes {
    /// Make nodes suspect at all. When false, the suspect taints gpu-guard added earlier are
    /// still removed after `quietSeconds`.
    pub enabled: bool,
    /// How many different pods must fail of a device on the node within `windowSeconds` (at
    /// least 2: one pod's failures say nothing of the node).
    #[schemars(range(min = 2))]
    pub pods: u32,
    /// The window, in seconds, the failures must fall in (1 to 30 days).
    #[schemars(range(min = 1, max = 2_592_000))]
    pub window_seconds: u64,
    /// Seconds without a device failure on a suspect node before its taint is removed (1 to 30
    /// days). Six hours: long enough that the next batch of work lands elsewhere, short enough
    /// that a node whose fault was transient returns the same working day.
    #[schemars(range(min = 1, max = 2_592_000))]
    pub quiet_seconds: u64,
}

impl Default for SuspectNodes {
    fn default() -> Self {
        Self {
            enabled: true,
            pods: 3,
            window_seconds: 3600,
            quiet_seconds: 6 * 3600,
        }
    }
}

impl Default for NodeHealth {
    fn default() -> Self {
        Self {
            enabled: true,
            unusable_devices: UnusableThreshold::default(),
            degraded_for_seconds: 120,
            healthy_for_seconds: 600,
            no_execute: false,
            max_tainted_percent: 10,
            suspect: SuspectNodes::default(),
        }
    }
}

/// The unusable-device threshold. A node is degraded for a resource when either bound that is
/// set is reached; zero unusable devices never degrade a node. Without this section the bound
/// is `count: 1`; a section that is given sets exactly the bounds it names (so
/// `{percent: 25}` has no count bound).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnusableThreshold {
    /// At least this many unusable devices.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub count: Option<u32>,
    /// At least this percentage of the node's devices of the resource unusable.
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub percent: Option<u32>,
}

impl Default for UnusableThreshold {
    fn default() -> Self {
        Self {
            count: Some(1),
            percent: None,
        }
    }
}

/// What happens to pods hit by a device failure, in opted-in namespaces (label
/// `gpu-guard.io/enabled: "true"`) only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PodWatcher {
    /// Add the pod condition `gpu-guard.io/DeviceFailure=True`, so the injected
    /// podFailurePolicy rule retries the pod's failure (action Ignore).
    pub mark_pods: bool,
    /// Evict the pod through the Eviction API (PodDisruptionBudgets apply), so its Job
    /// recreates it on a healthy node. Off by default.
    pub evict_pods: bool,
    /// At most this many evictions per minute, cluster-wide (a token bucket that holds as
    /// many). Evictions past it, and those a PodDisruptionBudget refuses, wait for a later pass.
    #[schemars(range(min = 1))]
    pub evictions_per_minute: u32,
}

impl Default for PodWatcher {
    fn default() -> Self {
        Self {
            mark_pods: true,
            evict_pods: false,
            evictions_per_minute: 5,
        }
    }
}

/// Pods of protected Jobs (a device pod whose controller is a Job, in an opted-in namespace)
/// that are Terminating on a node that is NotReady or unreachable: with a podFailurePolicy the
/// Job must use `podReplacementPolicy: Failed`, so such a pod holds its replacement back until
/// it is gone, which on an unreachable node is never, unless someone force-deletes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StuckPods {
    /// Seconds a pod must have been Terminating (past its grace period: its
    /// deletionTimestamp) on a node that is NotReady or unreachable (since its Ready condition
    /// changed, or its unreachable taint was added) before it counts as stuck: reported with an
    /// Event and the stuck-pods gauge, and force-deleted when `forceDelete` is on. 300: the
    /// default `tolerationSeconds` of the not-ready and unreachable taints, so a node that
    /// comes back within the time Kubernetes itself waits is left alone (at most 30 days).
    #[schemars(range(min = 0, max = 2_592_000))]
    pub after_seconds: u64,
    /// Delete stuck pods with `gracePeriodSeconds: 0` so their Job can replace them. Off by
    /// default: the pod may still run on a partitioned node, holding its GPUs and writing to
    /// shared storage, next to its replacement. Prefer the node.kubernetes.io/out-of-service
    /// taint on a node known to be down (docs/controller.md).
    pub force_delete: bool,
    /// At most this many force deletions per minute, cluster-wide (a token bucket that holds
    /// as many): a partition that cuts off a rack makes hundreds of pods stuck at once, and
    /// every deletion starts a replacement that may run beside a pod still alive. 5, as
    /// evictions.
    #[schemars(range(min = 1))]
    pub deletions_per_minute: u32,
}

impl Default for StuckPods {
    fn default() -> Self {
        Self {
            after_seconds: 300,
            force_delete: false,
            deletions_per_minute: 5,
        }
    }
}

/// The free retries of a workload's device failures. The controller records each device
/// failure of a Job (for a JobSet's pods, of the JobSet) in its memory; once more are on
/// record than the budget, `max(minimum, perPod x pods)` where `pods` is how many pods the
/// workload runs at once (a Job's `parallelism`, a JobSet's replicas times parallelism), its
/// running and new pods get `gpu-guard.io/DeviceRetriesExhausted=True`, and the injected
/// podFailurePolicy counts their failures against `backoffLimit` again.
///
/// The defaults: NVIDIA reports about 19 remediation requests per 1,000 nodes per day, so a
/// pod on one node meets about 0.02 device failures a day, and a 64-pod Job running two
/// weeks about 17 (of its 128). Past `perPod: 2` each, the failures are no longer the fleet's
/// bad luck: the application misreports its own errors as device errors (a deterministic
/// exit 74), or the workload breaks every node it lands on. `minimum: 3` lets a one-pod Job
/// ride out a bad node and its replacement's first trouble.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DeviceRetries {
    /// End free retries past the budget. When false, device failures are still recorded
    /// (the avoidance uses them), and retried for free without end.
    pub enabled: bool,
    /// Free device retries per pod the workload runs at once.
    #[schemars(range(max = 1000))]
    pub per_pod: u32,
    /// The least budget of any workload, however small.
    #[schemars(range(max = 10000))]
    pub minimum: u32,
}

/// The largest `perPod`: more is no budget (use `enabled: false`).
pub const MAX_RETRIES_PER_POD: u32 = 1000;
/// The largest `minimum`.
pub const MAX_RETRIES_MINIMUM: u32 = 10_000;

impl Default for DeviceRetries {
    fn default() -> Self {
        Self {
            enabled: true,
            per_pod: 2,
            minimum: 3,
        }
    }
}

impl DeviceRetries {
    /// The budget of a workload that runs `pods` pods at once.
    pub fn budget(&self, pods: u32) -> u32 {
        self.minimum.max(self.per_pod.saturating_mul(pods))
    }

    /// Whether `total` recorded device failures exceed the budget of a workload of `pods`
    /// pods (never when budgets are off).
    pub fn exhausted(&self, total: u32, pods: u32) -> bool {
        self.enabled && total > self.budget(pods)
    }
}

/// The `controller` section's semantic rules.
pub(super) fn validate_controller(controller: &Controller) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let root = FieldPath::new(["controller"]);
    if controller.resync_seconds == 0 {
        problems.push((root.child("resyncSeconds"), "must be at least 1".to_owned()));
    } else if controller.resync_seconds > MAX_RESYNC_SECONDS {
        problems.push((
            root.child("resyncSeconds"),
            format!(
                "must be at most {MAX_RESYNC_SECONDS} (one hour), found {}",
                controller.resync_seconds
            ),
        ));
    }
    let health = root.child("nodeHealth");
    for (field, value) in [
        (
            "degradedForSeconds",
            controller.node_health.degraded_for_seconds,
        ),
        (
            "healthyForSeconds",
            controller.node_health.healthy_for_seconds,
        ),
    ] {
        if value > MAX_HOLD_SECONDS {
            problems.push((
                health.child(field),
                format!("must be at most {MAX_HOLD_SECONDS} (30 days), found {value}"),
            ));
        }
    }
    let threshold = &controller.node_health.unusable_devices;
    let threshold_path = health.child("unusableDevices");
    match (threshold.count, threshold.percent) {
        (None, None) => problems.push((
            threshold_path.clone(),
            "set count or percent (or both): with neither, no node is ever degraded".to_owned(),
        )),
        _ => {
            if threshold.count == Some(0) {
                problems.push((
                    threshold_path.child("count"),
                    "must be at least 1 (0 would call every node degraded)".to_owned(),
                ));
            }
            if let Some(percent) = threshold.percent
                && !(1..=100).contains(&percent)
            {
                problems.push((
                    threshold_path.child("percent"),
                    format!("must be 1 to 100, found {percent}"),
                ));
            }
        }
    }
    if controller.node_health.max_tainted_percent > 100 {
        problems.push((
            health.child("maxTaintedPercent"),
            format!(
                "must be 0 to 100, found {}",
                controller.node_health.max_tainted_percent
            ),
        ));
    }
    let suspect = &controller.node_health.suspect;
    if suspect.pods < 2 {
        problems.push((
            health.child("suspect").child("pods"),
            format!(
                "must be at least 2, found {}: one pod's failures say nothing of its node; to \
                 make no node suspect, set suspect.enabled: false",
                suspect.pods
            ),
        ));
    }
    for (field, value) in [
        ("windowSeconds", suspect.window_seconds),
        ("quietSeconds", suspect.quiet_seconds),
    ] {
        if value == 0 || value > MAX_HOLD_SECONDS {
            problems.push((
                health.child("suspect").child(field),
                format!("must be 1 to {MAX_HOLD_SECONDS} (30 days), found {value}"),
            ));
        }
    }
    if controller.pods.evictions_per_minute == 0 {
        problems.push((
            root.child("pods").child("evictionsPerMinute"),
            "must be at least 1; to evict nothing, set evictPods: false".to_owned(),
        ));
    }
    let retries = root.child("deviceRetries");
    for (field, value, max) in [
        (
            "perPod",
            controller.device_retries.per_pod,
            MAX_RETRIES_PER_POD,
        ),
        (
            "minimum",
            controller.device_retries.minimum,
            MAX_RETRIES_MINIMUM,
        ),
    ] {
        if value > max {
            problems.push((
                retries.child(field),
                format!(
                    "must be at most {max}, found {value}; to retry device failures for free \
                     without end, set deviceRetries.enabled: false"
                ),
            ));
        }
    }
    problems.extend(validate_stuck_pods(&controller.stuck_pods, &root));
    problems
}

/// The rules of `controller.stuckPods`.
fn validate_stuck_pods(stuck: &StuckPods, root: &FieldPath) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let path = root.child("stuckPods");
    if stuck.after_seconds > MAX_HOLD_SECONDS {
        problems.push((
            path.child("afterSeconds"),
            format!(
                "must be at most {MAX_HOLD_SECONDS} (30 days), found {}",
                stuck.after_seconds
            ),
        ));
    }
    if stuck.deletions_per_minute == 0 {
        problems.push((
            path.child("deletionsPerMinute"),
            "must be at least 1; to delete nothing, set forceDelete: false".to_owned(),
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(controller: &Controller) -> Vec<String> {
        validate_controller(controller)
            .into_iter()
            .map(|(path, message)| format!("{path}: {message}"))
            .collect()
    }

    #[test]
    fn suspect_nodes_out_of_bounds_are_named() {
        let mut controller = Controller::default();
        controller.node_health.suspect.pods = 1;
        controller.node_health.suspect.window_seconds = 0;
        controller.node_health.suspect.quiet_seconds = MAX_HOLD_SECONDS + 1;
        let found = messages(&controller);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("controller.nodeHealth.suspect.pods: must be at least 2"));
        assert!(found[1].starts_with("controller.nodeHealth.suspect.windowSeconds: must be 1 to"));
        assert!(found[2].starts_with("controller.nodeHealth.suspect.quietSeconds: must be 1 to"));
    }

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(messages(&Controller::default()), Vec::<String>::new());
    }

    #[test]
    fn every_problem_is_reported_with_its_field() {
        let mut controller = Controller {
            resync_seconds: 0,
            ..Controller::default()
        };
        controller.node_health.unusable_devices = UnusableThreshold {
            count: Some(0),
            percent: Some(101),
        };
        controller.node_health.max_tainted_percent = 150;
        controller.node_health.degraded_for_seconds = u64::MAX;
        controller.node_health.healthy_for_seconds = MAX_HOLD_SECONDS + 1;
        controller.pods.evictions_per_minute = 0;
        controller.device_retries.per_pod = 1001;
        controller.device_retries.minimum = 10_001;
        let found = messages(&controller);
        assert_eq!(
            found,
            [
                "controller.resyncSeconds: must be at least 1",
                "controller.nodeHealth.degradedForSeconds: must be at most 2592000 (30 days), found 18446744073709551615",
                "controller.nodeHealth.healthyForSeconds: must be at most 2592000 (30 days), found 2592001",
                "controller.nodeHealth.unusableDevices.count: must be at least 1 (0 would call every node degraded)",
                "controller.nodeHealth.unusableDevices.percent: must be 1 to 100, found 101",
                "controller.nodeHealth.maxTaintedPercent: must be 0 to 100, found 150",
                "controller.pods.evictionsPerMinute: must be at least 1; to evict nothing, set evictPods: false",
                "controller.deviceRetries.perPod: must be at most 1000, found 1001; to retry device failures for free without end, set deviceRetries.enabled: false",
                "controller.deviceRetries.minimum: must be at most 10000, found 10001; to retry device failures for free without end, set deviceRetries.enabled: false",
            ]
        );
    }

    #[test]
    fn stuck_pod_settings_are_checked_with_their_field() {
        let mut controller = Controller::default();
        assert_eq!(controller.stuck_pods.after_seconds, 300);
        assert!(!controller.stuck_pods.force_delete);
        controller.stuck_pods.after_seconds = MAX_HOLD_SECONDS;
        assert_eq!(messages(&controller), Vec::<String>::new());
        controller.stuck_pods.after_seconds = MAX_HOLD_SECONDS + 1;
        controller.stuck_pods.deletions_per_minute = 0;
        assert_eq!(
            messages(&controller),
            [
                "controller.stuckPods.afterSeconds: must be at most 2592000 (30 days), found 2592001",
                "controller.stuckPods.deletionsPerMinute: must be at least 1; to delete nothing, set forceDelete: false",
            ]
        );
    }

    #[test]
    fn durations_are_bounded() {
        let mut controller = Controller {
            resync_seconds: MAX_RESYNC_SECONDS,
            ..Controller::default()
        };
        controller.node_health.degraded_for_seconds = MAX_HOLD_SECONDS;
        controller.node_health.healthy_for_seconds = MAX_HOLD_SECONDS;
        assert_eq!(messages(&controller), Vec::<String>::new());
        controller.resync_seconds = MAX_RESYNC_SECONDS + 1;
        assert_eq!(
            messages(&controller),
            ["controller.resyncSeconds: must be at most 3600 (one hour), found 3601"]
        );
    }

    #[test]
    fn a_given_threshold_sets_exactly_the_bounds_it_names() {
        let parse = |yaml: &str| {
            crate::policy::parse(
                &format!("apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\n{yaml}"),
                "test.yaml",
            )
            .map(|policy| policy.controller.node_health.unusable_devices)
        };
        assert_eq!(parse("").unwrap(), UnusableThreshold::default());
        assert_eq!(
            parse("controller: {nodeHealth: {degradedForSeconds: 5}}").unwrap(),
            UnusableThreshold::default()
        );
        assert_eq!(
            parse("controller: {nodeHealth: {unusableDevices: {percent: 25}}}").unwrap(),
            UnusableThreshold {
                count: None,
                percent: Some(25)
            }
        );
        let error = parse("controller: {nodeHealth: {unusableDevices: {}}}").unwrap_err();
        assert!(
            error.to_string().contains("set count or percent"),
            "{error}"
        );
    }

    #[test]
    fn the_budget_scales_with_the_pods_and_has_a_floor() {
        let retries = DeviceRetries::default();
        assert_eq!(retries.budget(1), 3);
        assert_eq!(retries.budget(64), 128);
        assert!(!retries.exhausted(3, 1));
        assert!(retries.exhausted(4, 1));
        assert_eq!(
            DeviceRetries {
                per_pod: u32::MAX,
                ..retries.clone()
            }
            .budget(2),
            u32::MAX
        );
        let off = DeviceRetries {
            enabled: false,
            ..retries
        };
        assert!(!off.exhausted(1000, 1));
    }

    #[test]
    fn a_threshold_needs_a_bound() {
        let mut controller = Controller::default();
        controller.node_health.unusable_devices = UnusableThreshold {
            count: None,
            percent: None,
        };
        assert_eq!(
            messages(&controller),
            [
                "controller.nodeHealth.unusableDevices: set count or percent (or both): with neither, no node is ever degraded"
            ]
        );
        controller.node_health.unusable_devices.percent = Some(50);
        assert_eq!(messages(&controller), Vec::<String>::new());
    }
}
