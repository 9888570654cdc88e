//! Every name gpu-guard shares with the cluster, the manifests it generates and its users: the
//! `gpu-guard.io/*` labels, annotations, conditions and taints, the Lease, the ports and the
//! HTTP paths. A leaf: it imports nothing of the crate, so every module may import it, and a
//! name that appears in `webhook-config/`, in the docs and in the code is defined once.
//!
//! (`kueue`'s `pkg/constants` plays the same part there.)

// === labels and annotations on user objects ===

/// The namespace label that opts a namespace in: both webhooks' `namespaceSelector` and the
/// controller's pod watcher use it (value `"true"`).
pub const ENABLED_LABEL: &str = "gpu-guard.io/enabled";
/// The annotation with which an object opts out of mutation (value `"true"`). It does not
/// bypass the GPU-node guard.
pub const SKIP_ANNOTATION: &str = "gpu-guard.io/skip";
/// The label or annotation with which a Job opts in explicitly when the policy does not
/// mutate every device Job (value `"true"`).
pub const INJECT_KEY: &str = "gpu-guard.io/inject";
/// The annotation gpu-guard adds to a Job it changed, listing what it changed.
pub const MUTATED_ANNOTATION: &str = "gpu-guard.io/mutated";
/// A Job's label or annotation saying whether its pods are a gang (ranks of one program, as
/// under torchrun or MPI): `"true"` for any Job, `"false"` for an Indexed Job whose
/// parallelism equals its completions that is not one. On a pod template (and so on the pods)
/// gpu-guard sets it to `"true"`: the controller marks the running peers of a gang pod hit by a
/// device failure.
pub const GANG_KEY: &str = "gpu-guard.io/gang";

// === pod conditions and node taints ===

/// The pod condition the controller adds to a pod hit by an unhealthy device; the injected
/// podFailurePolicy ignores failures that carry it.
pub const DEVICE_FAILURE_CONDITION: &str = "gpu-guard.io/DeviceFailure";
/// The pod condition the controller adds to the running peers of a gang pod that got
/// [`DEVICE_FAILURE_CONDITION`]: they fail next, of the collective's error, not of their own.
pub const PEER_DEVICE_FAILURE_CONDITION: &str = "gpu-guard.io/PeerDeviceFailure";
/// The pod condition the controller adds to the running pods of a workload whose recorded
/// device failures exceed its budget (`controller.deviceRetries`): the injected
/// podFailurePolicy counts the failures of pods that carry it (a `Count` rule ahead of the
/// `Ignore` rules), so free retries end.
pub const DEVICE_RETRIES_EXHAUSTED_CONDITION: &str = "gpu-guard.io/DeviceRetriesExhausted";
/// The taint key the controller puts on a GPU node whose devices degraded.
pub const DEGRADED_TAINT_KEY: &str = "gpu-guard.io/device-degraded";
/// The node annotation that records gpu-guard's ownership of its taint (the exact taint and
/// since when), so a restarted controller only ever removes a taint it added.
pub const DEGRADED_OWNER_ANNOTATION: &str = "gpu-guard.io/device-degraded-since";
/// The value of gpu-guard's taint on a suspect node (device failures of several pods, no
/// unusable device): not a resource name, so nothing reads it as one.
pub const SUSPECT_TAINT_VALUE: &str = "suspect";
/// The annotation of a suspect node: its last device failure and the pods that failed
/// (`<RFC 3339 time>;<pod>,<pod>,...`), what its release after the quiet period needs, read
/// back after a controller restart.
pub const SUSPECT_ANNOTATION: &str = "gpu-guard.io/suspect-failures";

// === the policy file ===

/// The policy file's `apiVersion`.
pub const POLICY_API_VERSION: &str = "gpu-guard.io/v1alpha1";
/// The policy file's `kind`.
pub const POLICY_KIND: &str = "Policy";

// === the controller ===

/// `reportingController` of the controller's Events.
pub const EVENT_REPORTER: &str = "gpu-guard.io/controller";
/// The default name of the controller's leader-election Lease.
pub const LEASE_NAME: &str = "gpu-guard-controller";

// === audit annotations of the validating webhook ===

/// Audit annotation (prefixed by the API server with the webhook name) of a guard violation in
/// Warn or Audit mode.
pub const GUARD_AUDIT_KEY: &str = "guard-violation";
/// Audit annotation of an object the guard could not judge (an unknown PriorityClass offline).
pub const GUARD_UNJUDGED_AUDIT_KEY: &str = "guard-unjudged";

// === ports and paths ===

/// The default HTTPS port of `serve`'s webhook listener.
pub const WEBHOOK_PORT: u16 = 8443;
/// The default plain-HTTP admin port of `serve` (`/healthz`, `/readyz`, `/metrics`).
pub const SERVE_ADMIN_PORT: u16 = 8080;
/// The default plain-HTTP admin port of `controller` (`/healthz`, `/readyz`, `/metrics`).
pub const CONTROLLER_ADMIN_PORT: u16 = 8081;
/// The mutating webhook's path.
pub const MUTATE_PATH: &str = "/mutate";
/// The validating webhook's path.
pub const VALIDATE_PATH: &str = "/validate";
/// Liveness, on the admin port.
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness, on the admin port.
pub const READYZ_PATH: &str = "/readyz";
/// Prometheus metrics (OpenMetrics text), on the admin port.
pub const METRICS_PATH: &str = "/metrics";

// === node health opt-outs ===

/// Node annotation: with the value `"true"`, a device resource that vanishes from the node, or
/// whose device plugin stops (nothing allocatable), is forgotten at once instead of judged
/// "plugin down" (a node being reconfigured, or whose GPUs are gone for good).
pub const IGNORE_VANISHED_ANNOTATION: &str = "gpu-guard.io/ignore-vanished-resources";

// === node condition for repair systems (issue 29) ===

/// The Node condition the controller sets (status `"True"`) on a node it taints degraded, and
/// removes with its taint: what node repair systems (medik8s Node Health Check) act on, as they
/// read conditions, not taints. The API server puts no rule on a node condition's type
/// (kubernetes `pkg/apis/core/validation/validation.go`: `ValidateNode` and
/// `ValidateNodeUpdate` check no `status.conditions` field), so it carries gpu-guard's domain
/// like its pod conditions.
pub const DEVICE_DEGRADED_NODE_CONDITION: &str = "gpu-guard.io/DeviceDegraded";
