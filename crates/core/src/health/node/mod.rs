//! PURE: is a GPU node degraded, and what should happen to its taint? No IO, no clock: the
//! time and the node's history are arguments, so every edge is a table test.
//!
//! A node is judged per device resource (`policy.devices`): unusable devices are
//! `status.capacity - status.allocatable` (the device plugin takes an unhealthy device out of
//! allocatable). A node missing either field for a resource, or with a quantity that is not a
//! whole number, is not judged for it. DRA devices count too, per driver: those its
//! ResourceSlices publish, unusable when tainted ([`dra_device_counts`]).
//!
//! A resource whose device plugin is gone is "plugin down", never healthy: allocatable 0 for
//! every device while capacity is not (the kubelet marks a vanished plugin's devices unhealthy),
//! or a resource the node had that vanished from capacity/allocatable (after a grace period the
//! kubelet drops its capacity to 0 too). Treating those as "not judged", i.e. healthy, made a
//! loop: untaint, plugin back, taint again (issue 16).
//!
//! But "vanished means down" is bounded: the kubelet keeps a removed resource at capacity 0 for
//! ever (kubernetes `pkg/kubelet/nodestatus/setters.go` "Set capacity for removed resource to
//! 0", v1.36), and ordinary operations remove resources for good (a MIG reconfiguration, a move
//! from the device plugin to a DRA driver, an uninstalled plugin, removed GPUs). A vanished
//! resource is forgotten once it has been gone for [`VANISHED_FORGET_SECONDS`], at once when
//! another resource of the same vendor is on the node, or on a node annotated
//! `gpu-guard.io/ignore-vanished-resources: "true"`; a resource whose plugin stopped is
//! replaced, not down, when a resource of the same vendor new to the node appears with it
//! ([`NodeVerdict::forgotten`]).

pub mod condition;
pub mod daemonsets;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use crate::api_rules::names::label_value_errors;
use crate::memory::suspect::SuspectRecord;
use crate::policy::Policy;
use crate::wellknown::{
    DEGRADED_OWNER_ANNOTATION, DEGRADED_TAINT_KEY, IGNORE_VANISHED_ANNOTATION, SUSPECT_ANNOTATION,
    SUSPECT_TAINT_VALUE,
};

/// How long a device resource may stay gone from a node (absent, or capacity 0) and still be
/// "plugin down": one hour. A device plugin that restarts or is upgraded is back within
/// minutes; the kubelet itself waits 5 minutes (`endpointStopGracePeriod`, kubernetes
/// `pkg/kubelet/cm/devicemanager/manager.go`, v1.36) before it drops a stopped plugin's
/// capacity to 0, so a resource gone an hour has been gone at least 65 minutes, and no pod
/// requesting it can be scheduled there meanwhile.
pub const VANISHED_FORGET_SECONDS: u64 = 3600;

/// One device resource of a node, as its status reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCount {
    pub resource: String,
    pub capacity: u64,
    pub allocatable: u64,
}

impl DeviceCount {
    /// Devices the node has but cannot hand out.
    pub fn unusable(&self) -> u64 {
        self.capacity.saturating_sub(self.allocatable)
    }

    /// Whether the device plugin of this extended resource has stopped: none of its devices is
    /// allocatable (the kubelet marks every device of a plugin that unregistered unhealthy,
    /// `pkg/kubelet/cm/devicemanager/manager.go` `markResourceUnhealthy`, v1.36). A DRA driver
    /// whose devices are all tainted is still running: it tainted them.
    pub fn plugin_stopped(&self) -> bool {
        self.capacity > 0 && self.allocatable == 0 && !self.resource.starts_with("dra/")
    }
}

/// What the controller remembers of a node between passes (in memory; rebuilt conservatively
/// after a restart: an empty history only delays decisions by the configured times).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeHistory {
    /// Since when the threshold has been reached without a break.
    pub degraded_since: Option<Timestamp>,
    /// Since when a node gpu-guard tainted has been below the threshold.
    pub healthy_since: Option<Timestamp>,
    /// Dry run: the controller acts as if it had added its taint (it did not).
    pub assumed_tainted: bool,
    /// Every device resource seen on the node with devices, and the most devices seen: one
    /// that vanishes later is "plugin down" ([`NodeVerdict::plugin_down`]). Kept across a
    /// taint and its removal; forgotten when the node is deleted, or, for the resources gone
    /// from the node, when someone removes gpu-guard's taint by hand (a person's word that the
    /// node is fine).
    pub seen: BTreeMap<String, u64>,
    /// The node carried gpu-guard's taint when last judged: if it is gone now and gpu-guard
    /// did not remove it, someone removed it by hand ([`removed_by_hand`]).
    pub held_taint: bool,
    /// Since when each resource of `seen` has been gone from the node (absent or capacity 0):
    /// forgotten after [`VANISHED_FORGET_SECONDS`].
    pub vanished_since: BTreeMap<String, Timestamp>,
    /// Resources whose device plugin stopped (nothing allocatable) when a resource of the same
    /// vendor new to the node appeared (a MIG reconfiguration: `nvidia.com/gpu` replaced by
    /// `nvidia.com/mig-1g.10gb`), or on a node that opted out: not judged until they have
    /// allocatable devices again.
    pub replaced: BTreeSet<String>,
}

/// What should happen to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaintDecision {
    /// No device resource to judge (no capacity and allocatable for one): not a GPU node.
    NotJudged,
    /// Below the threshold and not tainted by gpu-guard.
    Healthy,
    /// The threshold is reached, not for long enough yet.
    Degrading { taint_at: Timestamp },
    /// The threshold has held for `degradedForSeconds`: add the taint.
    Taint,
    /// Tainted by gpu-guard and still degraded.
    Tainted,
    /// Tainted by gpu-guard and healthy again, not for long enough yet.
    Recovering { untaint_at: Timestamp },
    /// Healthy for `healthyForSeconds`: remove gpu-guard's taint.
    Untaint,
    /// Someone else put a `gpu-guard.io/device-degraded` taint on the node: it is theirs, and
    /// gpu-guard neither adds nor removes one here.
    ForeignTaint,
}

/// A node's verdict: the decision, what was seen, and the history to keep for the next pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeVerdict {
    pub decision: TaintDecision,
    /// Every judged device resource, by name.
    pub devices: Vec<DeviceCount>,
    /// The resources at or past the threshold, and those whose device plugin is down.
    pub degraded: Vec<DeviceCount>,
    /// The resources whose device plugin is down (by name): degraded whatever the threshold,
    /// and never tainted `NoExecute` (that would evict the device plugin's own pod).
    pub plugin_down: Vec<String>,
    /// The resources this judgment stopped counting as "plugin down", and why.
    pub forgotten: Vec<(String, String)>,
    pub history: NodeHistory,
}

impl NodeVerdict {
    /// Whether the node has at least one device resource to judge.
    pub fn is_gpu_node(&self) -> bool {
        !self.devices.is_empty()
    }

    /// What was seen, for Events and the log: `2 of 8 nvidia.com/gpu unusable (allocatable 6)`,
    /// `nvidia.com/gpu device plugin down (8 seen, none allocatable)`.
    pub fn describe_degraded(&self) -> String {
        self.degraded
            .iter()
            .map(|device| {
                if !self.plugin_down.contains(&device.resource) {
                    format!(
                        "{} of {} {} unusable (allocatable {})",
                        device.unusable(),
                        device.capacity,
                        device.resource,
                        device.allocatable
                    )
                } else if device.capacity > 0 {
                    format!(
                        "{} device plugin down ({} seen, none allocatable)",
                        device.resource, device.capacity
                    )
                } else {
                    format!(
                        "{} device plugin down (gone from the node)",
                        device.resource
                    )
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether the device plugin of any resource of the node is down.
    pub fn is_plugin_down(&self) -> bool {
        !self.plugin_down.is_empty()
    }
}

/// Judges one node. `history` is what the previous pass returned (empty at first).
pub fn node_verdict(
    node: &Node,
    policy: &Policy,
    now: Timestamp,
    history: &NodeHistory,
) -> NodeVerdict {
    node_verdict_with(node, Vec::new(), policy, now, history)
}

/// [`node_verdict`] for a node whose DRA devices are `dra` ([`dra_device_counts`]), judged
/// like its extended resources.
pub fn node_verdict_with(
    node: &Node,
    dra: Vec<DeviceCount>,
    policy: &Policy,
    now: Timestamp,
    history: &NodeHistory,
) -> NodeVerdict {
    let mut devices = device_counts(node, policy);
    devices.extend(dra);
    let ownership = ownership(node);
    // Someone removed gpu-guard's taint: a new episode, its clocks start again, and what has
    // vanished from the node is forgotten.
    let by_hand = removed_by_hand(node, history);
    let new_episode;
    let history = if by_hand {
        new_episode = NodeHistory {
            seen: history.seen.clone(),
            replaced: history.replaced.clone(),
            ..NodeHistory::default()
        };
        &new_episode
    } else {
        history
    };
    let mut forgotten = Vec::new();
    let replaced = replaced_resources(node, &devices, history, &mut forgotten);
    devices.retain(|device| !replaced.contains(&device.resource));
    let gone = plugin_gone(
        node,
        &devices,
        history,
        &replaced,
        (ownership, by_hand),
        now,
    );
    let (vanished, seen) = (gone.vanished, gone.seen);
    forgotten.extend(gone.forgotten);
    let mut plugin_down: Vec<String> = devices
        .iter()
        .filter(|device| device.plugin_stopped())
        .map(|device| device.resource.clone())
        .collect();
    plugin_down.extend(vanished.iter().map(|device| device.resource.clone()));
    devices.extend(vanished);
    let degraded: Vec<DeviceCount> = devices
        .iter()
        .filter(|device| {
            plugin_down.contains(&device.resource) || threshold_reached(device, policy)
        })
        .cloned()
        .collect();
    let owned = ownership == Ownership::Ours || history.assumed_tainted;
    let health = &policy.controller.node_health;
    let mut next = NodeHistory {
        assumed_tainted: history.assumed_tainted,
        seen,
        held_taint: ownership == Ownership::Ours,
        vanished_since: gone.vanished_since,
        replaced,
        ..NodeHistory::default()
    };
    let decision = if ownership == Ownership::Foreign {
        TaintDecision::ForeignTaint
    } else if !degraded.is_empty() {
        // After a restart the history is empty: a node gpu-guard tainted has been degraded at
        // least since its taint was added (the owner annotation).
        let since = history
            .degraded_since
            .or_else(|| {
                let restarted = history.healthy_since.is_none();
                (restarted && ownership == Ownership::Ours)
                    .then(|| tainted_since(node))
                    .flatten()
            })
            .unwrap_or(now);
        next.degraded_since = Some(since);
        let taint_at = later(since, health.degraded_for_seconds);
        if owned {
            TaintDecision::Tainted
        } else if now >= taint_at {
            TaintDecision::Taint
        } else {
            TaintDecision::Degrading { taint_at }
        }
    } else if owned {
        let since = history.healthy_since.unwrap_or(now);
        next.healthy_since = Some(since);
        let untaint_at = later(since, health.healthy_for_seconds);
        if now >= untaint_at {
            TaintDecision::Untaint
        } else {
            TaintDecision::Recovering { untaint_at }
        }
    } else if devices.is_empty() {
        TaintDecision::NotJudged
    } else {
        TaintDecision::Healthy
    };
    NodeVerdict {
        decision,
        devices,
        degraded,
        plugin_down,
        forgotten,
        history: next,
    }
}

/// Whether the node opted out of "plugin down" ([`IGNORE_VANISHED_ANNOTATION`] `"true"`).
pub fn ignores_vanished(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(IGNORE_VANISHED_ANNOTATION))
        .is_some_and(|value| value == "true")
}

/// The vendor of a resource: the domain of an extended resource (`nvidia.com` of
/// `nvidia.com/mig-1g.10gb`), the driver of a DRA resource (`gpu.nvidia.com`), and the same of
/// a taint value remembered after a restart (`nvidia.com_gpu`, `dra_gpu.nvidia.com`).
fn vendor(resource: &str) -> &str {
    if let Some(driver) = resource
        .strip_prefix("dra/")
        .or_else(|| resource.strip_prefix("dra_"))
    {
        return driver;
    }
    resource
        .split_once('/')
        .or_else(|| resource.split_once('_'))
        .map_or(resource, |(domain, _)| domain)
}

/// Whether two resources come from the same vendor: the same domain, or one a subdomain of
/// the other (NVIDIA's DRA driver `gpu.nvidia.com` and its device plugin's `nvidia.com/gpu`).
fn same_vendor(a: &str, b: &str) -> bool {
    let (a, b) = (vendor(a), vendor(b));
    let under = |sub: &str, domain: &str| {
        sub.strip_suffix(domain)
            .is_some_and(|head| head.ends_with('.'))
    };
    a == b || under(a, b) || under(b, a)
}

/// The resources not to judge: those whose device plugin stopped (capacity, nothing
/// allocatable) when a resource of the same vendor, new to the node and with allocatable
/// devices, appeared (the plugin came back serving other resources: a MIG reconfiguration
/// under the mixed strategy), or on a node that opted out; until they have allocatable devices
/// again. Each new one is added to `forgotten`, with why.
fn replaced_resources(
    node: &Node,
    devices: &[DeviceCount],
    history: &NodeHistory,
    forgotten: &mut Vec<(String, String)>,
) -> BTreeSet<String> {
    let ignore = ignores_vanished(node);
    // After a restart every resource is new: nothing can be told replaced.
    let newcomers: Vec<&DeviceCount> = devices
        .iter()
        .filter(|device| {
            !history.seen.is_empty()
                && !history.seen.contains_key(&device.resource)
                && device.allocatable > 0
        })
        .collect();
    let mut replaced = BTreeSet::new();
    for device in devices.iter().filter(|device| device.plugin_stopped()) {
        if history.replaced.contains(&device.resource) {
            replaced.insert(device.resource.clone());
        } else if ignore {
            replaced.insert(device.resource.clone());
            forgotten.push((
                device.resource.clone(),
                format!("its device plugin stopped, and the node is annotated {IGNORE_VANISHED_ANNOTATION}"),
            ));
        } else if let Some(newcomer) = newcomers
            .iter()
            .find(|newcomer| same_vendor(&newcomer.resource, &device.resource))
        {
            replaced.insert(device.resource.clone());
            forgotten.push((
                device.resource.clone(),
                format!(
                    "its device plugin stopped as {} appeared: replaced",
                    newcomer.resource
                ),
            ));
        }
    }
    replaced
}

/// What [`plugin_gone`] found.
struct Gone {
    /// The resources gone from the node and still "plugin down", with nothing allocatable.
    vanished: Vec<DeviceCount>,
    /// What to remember as seen for the next judgment.
    seen: BTreeMap<String, u64>,
    vanished_since: BTreeMap<String, Timestamp>,
    /// The resources no longer "plugin down", and why.
    forgotten: Vec<(String, String)>,
}

/// Whether someone other than gpu-guard removed its taint: the node carried it when last
/// judged and carries no `gpu-guard.io/device-degraded` taint now (gpu-guard's own removal
/// starts a new history, [`NodeHistory::held_taint`] false), or its owner annotation is left
/// without the taint it records (`kubectl taint` removes the taint alone; after a restart this
/// is all that tells).
pub fn removed_by_hand(node: &Node, history: &NodeHistory) -> bool {
    (history.held_taint && ownership(node) == Ownership::None) || stale_annotation(node)
}

/// The resources the node had (`history.seen`) that are gone from its device counts now, as
/// counts with nothing allocatable; and what to remember as seen for the next pass. After a
/// restart (an empty history) the resource gpu-guard's own taint names counts as seen, so that
/// a node tainted while its plugin was gone is not untainted as "healthy". `by_hand` (someone
/// removed gpu-guard's taint) forgets the vanished resources, and so do the bounds of "vanished
/// means down" (see the module documentation); `replaced` resources are not remembered.
fn plugin_gone(
    node: &Node,
    devices: &[DeviceCount],
    history: &NodeHistory,
    replaced: &BTreeSet<String>,
    (ownership, by_hand): (Ownership, bool),
    now: Timestamp,
) -> Gone {
    let mut seen = history.seen.clone();
    let restarted = history.degraded_since.is_none()
        && history.healthy_since.is_none()
        && !history.assumed_tainted
        && history.seen.is_empty();
    // A suspect taint names no resource (its value is [`SUSPECT_TAINT_VALUE`]).
    if restarted
        && ownership == Ownership::Ours
        && let Some(record) = owner_record(node)
        && record.value != SUSPECT_TAINT_VALUE
        && !devices
            .iter()
            .any(|device| taint_value(&device.resource) == record.value)
    {
        // The resource its taint names, by name if the node still lists it (with capacity 0),
        // else by the taint value (`nvidia.com_gpu`), an alias until the resource is back.
        let resource = node
            .status
            .as_ref()
            .and_then(|status| status.capacity.as_ref())
            .and_then(|capacity| {
                capacity
                    .keys()
                    .find(|resource| taint_value(resource) == record.value)
            })
            .cloned()
            .unwrap_or(record.value);
        seen.entry(resource).or_insert(0);
    }
    // A resource is back when a device count carries its name, or its taint value (an alias
    // remembered after a restart), which is then forgotten for the name.
    let back = |resource: &str| {
        devices
            .iter()
            .any(|device| device.resource == resource || taint_value(&device.resource) == resource)
    };
    if by_hand {
        seen.retain(|resource, _| back(resource));
    }
    seen.retain(|resource, _| {
        devices.iter().any(|device| device.resource == *resource) || !back(resource)
    });
    // Replaced resources are not judged ([`replaced_resources`]); when they vanish, nothing
    // is left to remember.
    seen.retain(|resource, _| !replaced.contains(resource));
    let ignore = ignores_vanished(node);
    let mut vanished_since = BTreeMap::new();
    let mut forgotten = Vec::new();
    seen.retain(|resource, _| {
        if back(resource) {
            return true;
        }
        let why = if ignore {
            Some(format!(
                "gone, and the node is annotated {IGNORE_VANISHED_ANNOTATION}"
            ))
        } else if let Some(sibling) = devices
            .iter()
            .find(|device| same_vendor(&device.resource, resource))
        {
            Some(format!(
                "gone while {} is on the node: replaced",
                sibling.resource
            ))
        } else {
            let since = history.vanished_since.get(resource).copied().unwrap_or(now);
            vanished_since.insert(resource.clone(), since);
            (now >= later(since, VANISHED_FORGET_SECONDS))
                .then(|| format!("gone since {since}, over {VANISHED_FORGET_SECONDS} s"))
        };
        if let Some(why) = why {
            vanished_since.remove(resource);
            forgotten.push((resource.clone(), why));
            return false;
        }
        true
    });
    let vanished = seen
        .iter()
        .filter(|(resource, _)| !back(resource))
        .map(|(resource, capacity)| DeviceCount {
            resource: resource.clone(),
            capacity: *capacity,
            allocatable: 0,
        })
        .collect();
    for device in devices {
        let most = seen.entry(device.resource.clone()).or_insert(0);
        *most = (*most).max(device.capacity);
    }
    Gone {
        vanished,
        seen,
        vanished_since,
        forgotten,
    }
}

/// `seconds` after `since`, saturating at the end of time (never a panic: an owner annotation
/// near year 9999 or a huge setting must not kill the loop).
pub fn later(since: Timestamp, seconds: u64) -> Timestamp {
    i64::try_from(seconds)
        .ok()
        .and_then(|seconds| since.checked_add(SignedDuration::from_secs(seconds)).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Whether one resource's unusable devices reach the policy's threshold.
pub fn threshold_reached(device: &DeviceCount, policy: &Policy) -> bool {
    let unusable = device.unusable();
    if unusable == 0 {
        return false;
    }
    let threshold = &policy.controller.node_health.unusable_devices;
    let by_count = threshold
        .count
        .is_some_and(|count| unusable >= u64::from(count));
    let by_percent = threshold.percent.is_some_and(|percent| {
        device.capacity > 0
            && u128::from(unusable) * 100 >= u128::from(percent) * u128::from(device.capacity)
    });
    by_count || by_percent
}

/// The node's device resources with a whole-number capacity and allocatable, by name.
pub fn device_counts(node: &Node, policy: &Policy) -> Vec<DeviceCount> {
    let Some(status) = &node.status else {
        return Vec::new();
    };
    let (Some(capacity), Some(allocatable)) = (&status.capacity, &status.allocatable) else {
        return Vec::new();
    };
    capacity
        .iter()
        .filter(|(resource, _)| policy.devices.is_device_resource(resource))
        .filter_map(|(resource, quantity)| {
            let capacity = parse_count(&quantity.0)?;
            let allocatable = parse_count(&allocatable.get(resource)?.0)?;
            (capacity > 0).then(|| DeviceCount {
                resource: resource.clone(),
                capacity,
                allocatable,
            })
        })
        .collect()
}

/// The DRA GPUs of node `node`, per driver listed in `policy.devices.drivers`, from the devices
/// its ResourceSlices publish (`spec.nodeName`); as unusable those with a device taint of
/// effect `NoSchedule` or `NoExecute` (a driver taints a device it finds unhealthy;
/// `resource.k8s.io/v1` `Device.taints`, Kubernetes v1.36 `staging/src/k8s.io/api/resource/
/// v1/types.go`). Only the newest generation of each pool counts: while a driver republishes
/// a pool, slices of the older generation are stale (`ResourcePool.generation`). The resource
/// is named `dra/<driver>` (its taint value `dra_<driver>`, a valid label value).
///
/// Counted in physical devices, not in what is published: with partitionable devices a driver
/// publishes a whole GPU and each of its partitions, all consuming one counter set of the pool
/// (`Device.consumesCounters`; counter set names are unique in a pool). NVIDIA's DRA driver
/// names one counter set per GPU (`gpu-<minor>-counter-set`) that the GPU and its MIG devices
/// consume (NVIDIA/k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/partitions.go`, main at
/// 1b84773). Devices that consume a common counter set are one device, unusable when any of
/// them is tainted (a fault in a partition is a fault of its GPU); a device that consumes no
/// counter set is one on its own.
pub fn dra_device_counts<'a>(
    node: &str,
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
    policy: &Policy,
) -> Vec<DeviceCount> {
    let slices: Vec<&ResourceSlice> = slices
        .into_iter()
        .filter(|slice| slice.spec.node_name.as_deref() == Some(node))
        .filter(|slice| policy.devices.is_device_driver(&slice.spec.driver))
        .collect();
    let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for slice in &slices {
        let pool = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
        let generation = newest.entry(pool).or_insert(slice.spec.pool.generation);
        *generation = (*generation).max(slice.spec.pool.generation);
    }
    let mut by_driver: BTreeMap<&str, PhysicalDevices> = BTreeMap::new();
    for slice in slices {
        let pool = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
        if newest.get(&pool) != Some(&slice.spec.pool.generation) {
            continue;
        }
        let physical = by_driver.entry(pool.0).or_default();
        for device in slice.spec.devices.iter().flatten() {
            let unusable = device
                .taints
                .iter()
                .flatten()
                .any(|taint| matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute"));
            let sets = device
                .consumes_counters
                .iter()
                .flatten()
                .map(|consumed| (pool.1, consumed.counter_set.as_str()));
            physical.add(unusable, sets);
        }
    }
    by_driver
        .into_iter()
        .map(|(driver, physical)| {
            let (capacity, unusable) = physical.count();
            DeviceCount {
                resource: format!("dra/{driver}"),
                capacity,
                allocatable: capacity - unusable,
            }
        })
        .filter(|count| count.capacity > 0)
        .collect()
}

/// Published devices grouped into physical ones: devices that consume a common counter set
/// (by pool and name) are one (a union-find over the devices).
#[derive(Default)]
struct PhysicalDevices<'a> {
    /// Per device, the device it was merged into (itself when it leads its group).
    parent: Vec<usize>,
    unusable: Vec<bool>,
    /// The first device seen consuming each counter set.
    by_set: BTreeMap<(&'a str, &'a str), usize>,
}

impl<'a> PhysicalDevices<'a> {
    fn add(&mut self, unusable: bool, sets: impl Iterator<Item = (&'a str, &'a str)>) {
        let device = self.parent.len();
        self.parent.push(device);
        self.unusable.push(unusable);
        for set in sets {
            match self.by_set.get(&set) {
                Some(&other) => self.merge(device, other),
                None => {
                    self.by_set.insert(set, device);
                }
            }
        }
    }

    fn leader(&mut self, mut device: usize) -> usize {
        while self.parent[device] != device {
            self.parent[device] = self.parent[self.parent[device]];
            device = self.parent[device];
        }
        device
    }

    fn merge(&mut self, a: usize, b: usize) {
        let (a, b) = (self.leader(a), self.leader(b));
        if a != b {
            self.parent[a] = b;
            self.unusable[b] |= self.unusable[a];
        }
    }

    /// The physical devices, and how many of them are unusable.
    fn count(mut self) -> (u64, u64) {
        let (mut devices, mut unusable) = (0, 0);
        for device in 0..self.parent.len() {
            if self.leader(device) == device {
                devices += 1;
                unusable += u64::from(self.unusable[device]);
            }
        }
        (devices, unusable)
    }
}

/// The start-up hint when no node is judged although nodes publish DRA ResourceSlices: GPUs
/// served through DRA (its extended-resource mapping included, which never shows in
/// `status.capacity`) are judged only for the drivers of `devices.drivers`. `None` when some
/// node is judged or no slice is bound to a node. Full DRA node health belongs to the DRA work.
pub fn unjudged_dra_hint<'a>(
    gpu_nodes: usize,
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
    policy: &Policy,
) -> Option<String> {
    if gpu_nodes > 0 {
        return None;
    }
    let mut nodes_by_driver: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for slice in slices {
        if let Some(node) = slice.spec.node_name.as_deref() {
            nodes_by_driver
                .entry(slice.spec.driver.as_str())
                .or_default()
                .insert(node);
        }
    }
    if nodes_by_driver.is_empty() {
        return None;
    }
    let drivers = nodes_by_driver
        .iter()
        .map(|(driver, nodes)| {
            let listed = if policy.devices.is_device_driver(driver) {
                "in devices.drivers, no device"
            } else {
                "not in devices.drivers"
            };
            format!("{driver} ({} nodes, {listed})", nodes.len())
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "no node is judged (no device resource in any node's capacity), but nodes publish DRA \
         ResourceSlices: {drivers}. DRA GPUs are judged only for the drivers listed in the \
         policy's devices.drivers: add a GPU driver there to have its nodes judged"
    ))
}

/// A device count: a whole number, optionally with a decimal suffix (`8`, `1k`). Anything else
/// (fractions, `500m`, garbage) is unknown.
pub fn parse_count(quantity: &str) -> Option<u64> {
    let quantity = quantity.trim();
    let (digits, factor) = match quantity.strip_suffix('k') {
        Some(digits) => (digits, 1000),
        None => (quantity, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(factor)
}

/// What the owner annotation records: when gpu-guard added its taint, and which taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRecord {
    pub since: Timestamp,
    pub value: String,
    pub effect: String,
}

impl OwnerRecord {
    /// The annotation value: `<RFC 3339 time>;<value>:<effect>`.
    pub fn annotation(taint: &Taint, since: Timestamp) -> String {
        format!(
            "{since};{}:{}",
            taint.value.as_deref().unwrap_or_default(),
            taint.effect
        )
    }

    fn parse(text: &str) -> Option<Self> {
        let (since, taint) = text.split_once(';')?;
        let (value, effect) = taint.rsplit_once(':')?;
        Some(Self {
            since: since.parse().ok()?,
            value: value.to_owned(),
            effect: effect.to_owned(),
        })
    }

    /// Whether `taint` is exactly the one recorded (key, value and effect).
    pub fn matches(&self, taint: &Taint) -> bool {
        taint.key == DEGRADED_TAINT_KEY
            && taint.value.as_deref().unwrap_or_default() == self.value
            && taint.effect == self.effect
    }
}

fn annotation(node: &Node) -> Option<&String> {
    node.metadata
        .annotations
        .as_ref()?
        .get(DEGRADED_OWNER_ANNOTATION)
}

/// The node's owner annotation, if it has one that parses.
pub fn owner_record(node: &Node) -> Option<OwnerRecord> {
    OwnerRecord::parse(annotation(node)?)
}

/// gpu-guard's own taint on the node: the one its owner annotation records.
fn our_taint(node: &Node) -> Option<&Taint> {
    let record = owner_record(node)?;
    taints(node).iter().find(|taint| record.matches(taint))
}

/// Whether gpu-guard's taint on the node is a suspect one ([`SUSPECT_TAINT_VALUE`]).
pub fn holds_suspect_taint(node: &Node) -> bool {
    our_taint(node).is_some_and(|taint| taint.value.as_deref() == Some(SUSPECT_TAINT_VALUE))
}

/// The suspect node's record ([`SUSPECT_ANNOTATION`]), if it has one that parses.
pub fn suspect_record(node: &Node) -> Option<SuspectRecord> {
    let text = node
        .metadata
        .annotations
        .as_ref()?
        .get(SUSPECT_ANNOTATION)?;
    SuspectRecord::parse(text)
}

/// The taint gpu-guard adds to a suspect node: always `NoSchedule`. Nothing says the pods
/// running there are failing; they finish or fail on their own, and new ones go elsewhere.
pub fn suspect_taint() -> Taint {
    Taint {
        key: DEGRADED_TAINT_KEY.to_owned(),
        value: Some(SUSPECT_TAINT_VALUE.to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    }
}

/// [`add_taint_patch`] for the suspect taint, with the node's [`SUSPECT_ANNOTATION`].
pub fn add_suspect_taint_patch(node: &Node, record: &SuspectRecord, now: Timestamp) -> Value {
    let mut patch = add_taint_patch(node, &suspect_taint(), now);
    patch["metadata"]["annotations"][SUSPECT_ANNOTATION] = Value::String(record.annotation());
    patch
}

/// The JSON merge patch that rewrites a suspect node's record (a later failure moves its
/// release), with the node's `resourceVersion`.
pub fn suspect_record_patch(node: &Node, record: &SuspectRecord) -> Value {
    json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": {SUSPECT_ANNOTATION: record.annotation()},
        },
    })
}

/// When gpu-guard tainted the node, from its owner annotation (only while its taint is there).
pub fn tainted_since(node: &Node) -> Option<Timestamp> {
    our_taint(node)?;
    owner_record(node).map(|record| record.since)
}

/// Whether the node carries the owner annotation without the taint it records (someone removed
/// the taint, or the annotation does not parse): the annotation is to be removed, alone.
pub fn stale_annotation(node: &Node) -> bool {
    annotation(node).is_some() && our_taint(node).is_none()
}

/// Who owns the node's `gpu-guard.io/device-degraded` taint, if it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    None,
    Ours,
    Foreign,
}

/// Whether the node carries gpu-guard's taint (the exact taint its owner annotation records),
/// someone else's taint with that key, or none.
pub fn ownership(node: &Node) -> Ownership {
    if our_taint(node).is_some() {
        Ownership::Ours
    } else if taints(node)
        .iter()
        .any(|taint| taint.key == DEGRADED_TAINT_KEY)
    {
        Ownership::Foreign
    } else {
        Ownership::None
    }
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|spec| spec.taints.as_deref())
        .unwrap_or_default()
}

/// The taint value for a resource: its name with `/` written `_` (a taint value is a label
/// value, which cannot hold `/`), or, when that is not a valid label value (too long), the
/// name after the `/`.
pub fn taint_value(resource: &str) -> String {
    let encoded = resource.replace('/', "_");
    if label_value_errors(&encoded).is_empty() {
        encoded
    } else {
        resource
            .rsplit_once('/')
            .map_or(resource, |(_, name)| name)
            .to_owned()
    }
}

/// The taint gpu-guard adds for `resource`.
pub fn degraded_taint(resource: &str, no_execute: bool) -> Taint {
    Taint {
        key: DEGRADED_TAINT_KEY.to_owned(),
        value: Some(taint_value(resource)),
        effect: if no_execute {
            "NoExecute"
        } else {
            "NoSchedule"
        }
        .to_owned(),
        time_added: None,
    }
}

/// The JSON merge patch that adds gpu-guard's taint: the node's whole taint list (the list has
/// no merge key, so a patch replaces it) with the new taint appended, the owner annotation, and
/// the node's `resourceVersion`, so that a concurrent change of the node makes the API server
/// answer 409 Conflict instead of losing the other writer's taints.
pub fn add_taint_patch(node: &Node, taint: &Taint, now: Timestamp) -> Value {
    let mut list: Vec<Taint> = taints(node).to_vec();
    list.push(taint.clone());
    json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": {DEGRADED_OWNER_ANNOTATION: OwnerRecord::annotation(taint, now)},
        },
        "spec": {"taints": list},
    })
}

/// The JSON merge patch that removes gpu-guard's taint (exactly the one its owner annotation
/// records: another taint with the same key, someone else's, stays) and its owner annotation,
/// with the node's `resourceVersion` (see [`add_taint_patch`]).
pub fn remove_taint_patch(node: &Node) -> Value {
    let record = owner_record(node);
    let list: Vec<&Taint> = taints(node)
        .iter()
        .filter(|existing| !record.as_ref().is_some_and(|r| r.matches(existing)))
        .collect();
    json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": cleared_annotations(node),
        },
        "spec": {"taints": list},
    })
}

/// The annotations removed with gpu-guard's taint: the owner annotation, and a suspect node's
/// record where it has one.
fn cleared_annotations(node: &Node) -> Value {
    let mut cleared = json!({DEGRADED_OWNER_ANNOTATION: null});
    let has_record = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|annotations| annotations.contains_key(SUSPECT_ANNOTATION));
    if has_record {
        cleared[SUSPECT_ANNOTATION] = Value::Null;
    }
    cleared
}

/// The JSON merge patch that removes only a stale owner annotation (see [`stale_annotation`]),
/// with the node's `resourceVersion`.
pub fn clear_annotation_patch(node: &Node) -> Value {
    json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": cleared_annotations(node),
        },
    })
}

/// The safety valve: how many GPU nodes gpu-guard may hold tainted at once. `maxTaintedPercent`
/// of the GPU nodes, rounded down, but at least one (a small cluster must still be protected);
/// none when the percentage is 0.
pub fn taint_limit(gpu_nodes: usize, policy: &Policy) -> usize {
    let percent = u128::from(policy.controller.node_health.max_tainted_percent);
    if percent == 0 {
        return 0;
    }
    let limit = (gpu_nodes as u128).saturating_mul(percent) / 100;
    usize::try_from(limit).unwrap_or(usize::MAX).max(1)
}

/// Whether one more node may be tainted while `tainted` of `gpu_nodes` are.
pub fn may_taint(gpu_nodes: usize, tainted: usize, policy: &Policy) -> bool {
    tainted < taint_limit(gpu_nodes, policy)
}

#[cfg(test)]
mod tests;
