//! AdmissionReview requests in the shape kube-apiserver v1.36 sends them, for the kinds and
//! operations the fixtures (recorded from a real API server) do not cover: the envelope of a
//! recorded request with another object, kind and operation.
#![allow(dead_code)]

use serde_json::{Value, json};

/// A recorded AdmissionReview of `tests/fixtures/admission/`.
pub fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/admission/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A review of `object` for `/validate` in the envelope kube-apiserver v1.36 sends (copied from
/// the Job fixtures): `old_object` makes it an UPDATE, by `user`.
pub fn review_of(
    (group, version, kind, resource): (&str, &str, &str, &str),
    object: &Value,
    old_object: Option<&Value>,
    user: &str,
) -> Value {
    let (mut body, operation, options) = match old_object {
        None => (
            fixture("002-Job-CREATE-validate.json"),
            "CREATE",
            json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
                   "fieldManager": "kubectl-client-side-apply", "fieldValidation": "Strict"}),
        ),
        // A merge patch arrives as an UPDATE with PatchOptions.
        Some(_) => (
            fixture("018-Job-UPDATE-validate.json"),
            "UPDATE",
            json!({"kind": "PatchOptions", "apiVersion": "meta.k8s.io/v1"}),
        ),
    };
    let request = &mut body["request"];
    let gvk = json!({"group": group, "version": version, "kind": kind});
    let gvr = json!({"group": group, "version": version, "resource": resource});
    request["kind"] = gvk.clone();
    request["requestKind"] = gvk;
    request["resource"] = gvr.clone();
    request["requestResource"] = gvr;
    request["uid"] = json!(format!(
        "0f6c3a52-7d0e-4c8e-9a51-{:012}",
        object.to_string().len()
    ));
    request["operation"] = json!(operation);
    request["options"] = options;
    request["name"] = object["metadata"]["name"].clone();
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => request["namespace"] = json!(namespace),
        // A cluster-scoped object's request has no namespace.
        None => {
            if let Some(request) = request.as_object_mut() {
                request.remove("namespace");
            }
        }
    }
    request["userInfo"]["username"] = json!(user);
    request["object"] = object.clone();
    request["oldObject"] = old_object.cloned().unwrap_or(Value::Null);
    body
}

pub const JOBSET: (&str, &str, &str, &str) = ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets");
pub const JOB: (&str, &str, &str, &str) = ("batch", "v1", "Job", "jobs");
pub const KUEUE: &str = "system:serviceaccount:kueue-system:kueue-controller-manager";

/// The first document of a fixture file, as JSON.
pub fn manifest(path: &str) -> Value {
    let path = format!("{}/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let (documents, error) = gpu_guard_manifest::parse(&text, &path);
    assert!(error.is_empty(), "{error:?}");
    documents[0].value.clone()
}
