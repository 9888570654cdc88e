//! PURE: the API server's own validation rules, as plain functions over typed objects, so that
//! gpu-guard can prove it never emits an object the API server would reject.
//!
//! - [`job`]: a Job's `podFailurePolicy` and the fields it constrains (Kubernetes v1.36
//!   `pkg/apis/batch/validation`);
//! - `names` (crate-private): Kubernetes name syntax (apimachinery `validation.IsQualifiedName` and friends).

pub mod job;
pub(crate) mod names;
