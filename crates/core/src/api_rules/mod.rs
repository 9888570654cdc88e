//! PURE: the API server's own validation rules, as plain functions over typed objects, so that
//! gpu-guard can prove it never emits an object the API server would reject.
//!
//! - [`jobset`]: the JobSet fields gpu-guard writes, as JobSet's webhook checks them
//!   (kubernetes-sigs/jobset v0.12.0 `pkg/webhooks/jobset_webhook.go`), and the Job rules inside
//!   every replicated Job;
//! - [`job`]: a Job's `podFailurePolicy` and the fields it constrains (Kubernetes v1.36
//!   `pkg/apis/batch/validation`);
//! - [`container`]: container `restartPolicy` and `restartPolicyRules` (KEP-5307 in-place
//!   restart rules, KEP-5532 `RestartAllContainers`), as Kubernetes 1.36 pod validation checks
//!   them; part of [`job::check_job`] for a Job's pod template;
//! - [`node_affinity`]: a pod's required node affinity (Kubernetes 1.36 pod validation), where
//!   gpu-guard keeps a pod off the nodes its workload's devices failed on;
//! - `names` (crate-private): Kubernetes name syntax (apimachinery `validation.IsQualifiedName` and friends).

pub mod container;
pub mod job;
pub mod jobset;
pub mod names;
pub mod node_affinity;
