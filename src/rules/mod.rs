//! PURE: the API server's own validation rules, as plain functions over typed objects, so that
//! gpu-guard can prove it never emits an object the API server would reject.
//!
//! - [`jobset`]: the JobSet fields gpu-guard writes, as JobSet's webhook checks them
//!   (kubernetes-sigs/jobset v0.12.0 `pkg/webhooks/jobset_webhook.go`), and the Job rules inside
//!   every replicated Job;
//! - [`job`]: a Job's `podFailurePolicy` and the fields it constrains (Kubernetes v1.36
//!   `pkg/apis/batch/validation`);
//! - `names` (crate-private): Kubernetes name syntax (apimachinery `validation.IsQualifiedName` and friends).

pub mod job;
pub mod jobset;
pub(crate) mod names;
