//! AdmissionReview in, AdmissionReview out: the wire contract of the webhooks, with no
//! transport in it (the server hands it bytes and sends back what it returns).
//!
//! - `/mutate`: a Job or CronJob CREATE goes through the engine ([`crate::mutate::object`]); the JSON
//!   Patch is derived from the engine's changes and proven to apply to the raw request object
//!   before it is sent. No change: no patch and no patchType. UPDATE, DELETE, CONNECT and every
//!   other kind: allowed, no patch (a Job's pod template and podFailurePolicy are immutable).
//! - `/validate`: the GPU-node priority guard ([`crate::guard`]) judges Pods and the pod
//!   template of Deployments, StatefulSets, DaemonSets, ReplicaSets, ReplicationControllers,
//!   Jobs and CronJobs at CREATE and UPDATE (an UPDATE that leaves the pod spec as it was, or
//!   that belongs to a deletion, is not judged again). A violation is denied (HTTP 200,
//!   `allowed: false`, code 403), warned about or audited, as the policy's mode says; the
//!   `gpu-guard.io/skip` annotation does not bypass it. Subresources are not judged.
//! - Malformed input is a [`ReviewError`] (HTTP 400) with a message saying what is wrong; an
//!   object that does not decode as a Job is allowed unchanged with a warning, so a bad object
//!   never turns into a 500 loop. `admission.k8s.io/v1beta1` is answered in v1beta1 (same shape).

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::guard::{self, ClusterView, GuardedKind, Verdict, Workload};
use crate::mutate::object::{ObjectError, ObjectMutation, mutate_job_json, mutate_object};
use crate::policy::{GuardMode, Policy};
use crate::wellknown::{GUARD_AUDIT_KEY, GUARD_UNJUDGED_AUDIT_KEY};

/// The two webhooks the server exposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Webhook {
    Mutate,
    Validate,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mutate => "mutate",
            Self::Validate => "validate",
        }
    }
}

/// At most this many characters in one admission warning (the API server's limit is 120).
pub const MAX_WARNING_CHARS: usize = 120;

/// The deepest JSON nesting accepted (serde_json's own limit for the values it builds).
pub const MAX_DEPTH: usize = 128;

const SUPPORTED_VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// Why a request body is not a usable AdmissionReview (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not a JSON AdmissionReview: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("the body nests JSON deeper than {MAX_DEPTH} levels; no Kubernetes object does")]
    TooDeep,
    #[error(
        "unsupported apiVersion {0:?}: send admission.k8s.io/v1 (admissionReviewVersions: [v1])"
    )]
    UnsupportedVersion(String),
    #[error("kind must be \"AdmissionReview\", found {0:?}")]
    WrongKind(String),
    #[error("the AdmissionReview has no request")]
    MissingRequest,
    #[error("request.uid is empty")]
    MissingUid,
    #[error("request.object is missing on a {0}")]
    MissingObject(String),
    /// Not the request's fault (HTTP 500, so the webhook's failurePolicy applies).
    #[error("internal error: {0}")]
    Internal(String),
}

impl ReviewError {
    /// Whether the error is gpu-guard's (500) rather than the request's (400).
    pub fn is_internal(&self) -> bool {
        matches!(self, Self::Internal(_))
    }
}

/// The parts of an AdmissionReview gpu-guard reads. The object stays JSON text (borrowed from
/// the body): the engine decodes the typed Job from it directly.
#[derive(Deserialize)]
struct IncomingReview<'a> {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(borrow)]
    request: Option<IncomingRequest<'a>>,
}

#[derive(Deserialize)]
struct IncomingRequest<'a> {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    kind: GroupVersionKind,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "subResource")]
    sub_resource: Option<String>,
    #[serde(default, borrow)]
    object: Option<&'a RawValue>,
    #[serde(default, borrow, rename = "oldObject")]
    old_object: Option<&'a RawValue>,
}

/// `request.kind` of an AdmissionReview.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// What was decided, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Patched,
    Denied,
    /// Allowed with a guard warning (Warn mode).
    Warned,
    /// Allowed with a guard audit annotation (Audit mode).
    Audited,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Patched => "patched",
            Self::Denied => "denied",
            Self::Warned => "warned",
            Self::Audited => "audited",
        }
    }
}

/// A decided review: the response body and what to log about it.
#[derive(Debug)]
pub struct Reviewed {
    pub body: Vec<u8>,
    pub outcome: Decision,
    pub uid: String,
    pub kind: String,
    pub operation: String,
    pub namespace: String,
    pub name: String,
    /// Bytes of the JSON Patch sent (before base64), 0 when none.
    pub patch_bytes: usize,
    /// What the guard decided, when it judged the object: the mode and the outcome.
    pub guard: Option<GuardOutcome>,
}

/// A guard decision, for metrics: the mode in force and what came of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardOutcome {
    pub mode: GuardMode,
    /// `allowed`, `exempt`, `unjudged`, `denied`, `warned` or `audited`.
    pub outcome: &'static str,
}

#[derive(Serialize)]
struct OutgoingReview<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'static str,
    response: Response,
}

/// `response` of an AdmissionReview.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty", default)]
    pub audit_annotations: std::collections::BTreeMap<String, String>,
}

/// `response.status` (a metav1.Status) of a denial.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    pub message: String,
    /// A machine-readable reason (`Forbidden` for a guard denial).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
}

/// Decides one AdmissionReview body for `webhook`; the guard reads the cluster from `view`.
pub fn review(
    webhook: Webhook,
    body: &[u8],
    policy: &Policy,
    view: &dyn ClusterView,
) -> Result<Reviewed, ReviewError> {
    // serde_json skips the parts it does not decode without a depth limit (safely, but it
    // would accept them); refuse absurd nesting anywhere, in one pass over the bytes. The same
    // pass finds the object, so the envelope is parsed without it and the object only once.
    let scan = scan_body(body, MAX_DEPTH);
    if scan.too_deep {
        return Err(ReviewError::TooDeep);
    }
    let split = scan.object.and_then(|range| {
        let object = std::str::from_utf8(&body[range.clone()]).ok()?;
        let mut envelope = Vec::with_capacity(body.len() - range.len() + 4);
        envelope.extend_from_slice(&body[..range.start]);
        envelope.extend_from_slice(b"null");
        envelope.extend_from_slice(&body[range.end..]);
        Some((envelope, object))
    });
    review_parsed(webhook, body, split, policy, view)
}

/// [`review`] after the scan: `split` is the envelope without its object and the object,
/// when the scan found it; otherwise the whole body is parsed.
fn review_parsed(
    webhook: Webhook,
    body: &[u8],
    split: Option<(Vec<u8>, &str)>,
    policy: &Policy,
    view: &dyn ClusterView,
) -> Result<Reviewed, ReviewError> {
    let (envelope, split_object): (&[u8], _) = match &split {
        Some((envelope, object)) => (envelope, Some(*object)),
        None => (body, None),
    };
    let incoming: IncomingReview =
        serde_json::from_slice(envelope).map_err(ReviewError::NotJson)?;
    if !SUPPORTED_VERSIONS.contains(&incoming.api_version.as_str()) {
        return Err(ReviewError::UnsupportedVersion(incoming.api_version));
    }
    if incoming.kind != "AdmissionReview" {
        return Err(ReviewError::WrongKind(incoming.kind));
    }
    let request = incoming.request.ok_or(ReviewError::MissingRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::MissingUid);
    }
    let mut response = Response {
        uid: request.uid.clone(),
        allowed: true,
        ..Response::default()
    };
    let mut outcome = Decision::Allowed;
    let mut patch_bytes = 0;
    let mut guard_outcome = None;

    let is_batch = request.kind.group == "batch" && request.kind.version == "v1";
    let mutable = is_batch && matches!(request.kind.kind.as_str(), "Job" | "CronJob");
    if webhook == Webhook::Mutate && mutable && request.operation == "CREATE" {
        let object = split_object
            .or(request.object.map(RawValue::get))
            .ok_or_else(|| ReviewError::MissingObject(request.operation.clone()))?;
        match mutate_raw(&request.kind.kind, object, policy) {
            // The object's own apiVersion/kind disagree with request.kind: leave it alone.
            None => response
                .warnings
                .push("gpu-guard: the object is not a batch/v1 Job; left unchanged".to_owned()),
            // Not JSON at all is malformed input, not an object gpu-guard cannot read.
            Some(Err(ObjectError::Decode { source, .. }))
                if source.is_syntax() || source.is_eof() =>
            {
                return Err(ReviewError::NotJson(source));
            }
            Some(Err(error @ ObjectError::PatchDoesNotApply(_))) => {
                return Err(ReviewError::Internal(error.to_string()));
            }
            Some(Err(error)) => response.warnings.push(format!("gpu-guard: {error}")),
            Some(Ok(mutation)) => {
                response.warnings = mutation
                    .outcome
                    .warnings
                    .iter()
                    .map(|w| format!("gpu-guard: {w}"))
                    .collect();
                if !mutation.patch.is_empty() {
                    let patch =
                        serde_json::to_vec(&mutation.patch).expect("a JSON Patch serializes");
                    patch_bytes = patch.len();
                    response.patch = Some(base64::engine::general_purpose::STANDARD.encode(&patch));
                    response.patch_type = Some("JSONPatch".to_owned());
                    response
                        .audit_annotations
                        .insert("mutation".to_owned(), mutation.outcome.summary());
                    outcome = Decision::Patched;
                }
            }
        }
    }
    let guarded = GuardedKind::from_gvk(
        &request.kind.group,
        &request.kind.version,
        &request.kind.kind,
    )
    .filter(|kind| kind.judged_at(&request.operation));
    if webhook == Webhook::Validate
        && let Some(kind) = guarded
        && request
            .sub_resource
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    {
        let object = split_object
            .or(request.object.map(RawValue::get))
            .ok_or_else(|| {
                ReviewError::MissingObject(format!("{} of a {}", request.operation, kind.as_str()))
            })?;
        let namespace = request.namespace.as_deref().unwrap_or_default();
        match read_workload(kind, object, request.old_object) {
            Err(error) if error.source.is_syntax() || error.source.is_eof() => {
                return Err(ReviewError::NotJson(error.source));
            }
            // The API server has checked the object's schema; this is not expected.
            Err(error) => response.warnings.push(format!(
                "gpu-guard: {error}; the GPU-node guard did not judge it"
            )),
            Ok(None) => {}
            Ok(Some(workload)) => {
                let verdict = guard::judge(
                    kind,
                    namespace,
                    &workload,
                    &policy.guard,
                    &policy.devices,
                    view,
                )
                .map_err(|error| ReviewError::Internal(error.to_string()))?;
                let mode = policy.guard.mode_for(namespace);
                let (decision, label) = apply_verdict(&verdict, &mut response);
                outcome = decision;
                guard_outcome = Some(GuardOutcome {
                    mode,
                    outcome: label,
                });
            }
        }
    }
    for warning in &mut response.warnings {
        truncate_chars(warning, MAX_WARNING_CHARS);
    }

    let body = serde_json::to_vec(&OutgoingReview {
        api_version: if incoming.api_version.is_empty() {
            SUPPORTED_VERSIONS[0]
        } else {
            &incoming.api_version
        },
        kind: "AdmissionReview",
        response,
    })
    .expect("an AdmissionReview serializes");
    Ok(Reviewed {
        body,
        outcome,
        uid: request.uid,
        kind: request.kind.kind,
        operation: request.operation,
        namespace: request.namespace.unwrap_or_default(),
        name: request.name.unwrap_or_default(),
        patch_bytes,
        guard: guard_outcome,
    })
}

/// The workload to judge, or `None` when there is nothing to judge: an UPDATE that leaves the
/// pod spec as it was (labels, replicas, status, finalizers: a workload admitted before its
/// namespace opted in must stay manageable), or one of an object being deleted.
fn read_workload(
    kind: GuardedKind,
    object: &str,
    old_object: Option<&RawValue>,
) -> Result<Option<Workload>, guard::DecodeError> {
    let workload = Workload::from_json(kind, object)?;
    if workload.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    if let Some(old) = old_object.filter(|old| old.get() != "null")
        && let Ok(old) = Workload::from_json(kind, old.get())
        && old.spec == workload.spec
    {
        return Ok(None);
    }
    Ok(Some(workload))
}

/// Writes a verdict into the response: a denial, warnings or an audit annotation.
fn apply_verdict(verdict: &Verdict, response: &mut Response) -> (Decision, &'static str) {
    let violation = match verdict {
        Verdict::Allowed(guard::Allowed::Exempt(_)) => return (Decision::Allowed, "exempt"),
        Verdict::Allowed(guard::Allowed::Unjudged { class }) => {
            // Only without a cluster; the full text goes to the audit log.
            response.audit_annotations.insert(
                GUARD_UNJUDGED_AUDIT_KEY.to_owned(),
                format!("gpu-guard: {}", guard::unjudged_message(class)),
            );
            response.warnings.push(format!(
                "gpu-guard: priority not checked: PriorityClass {class:?} is unknown offline"
            ));
            return (Decision::Allowed, "unjudged");
        }
        Verdict::Allowed(_) => return (Decision::Allowed, "allowed"),
        Verdict::Violation(violation) => violation,
    };
    let message = format!("gpu-guard: {}", violation.message());
    response
        .audit_annotations
        .insert(GUARD_AUDIT_KEY.to_owned(), message.clone());
    match violation.mode {
        GuardMode::Enforce => {
            response.allowed = false;
            response.status = Some(Status {
                code: 403,
                message,
                reason: Some("Forbidden".to_owned()),
            });
            (Decision::Denied, "denied")
        }
        GuardMode::Warn => {
            response.warnings.extend(
                violation
                    .warnings()
                    .into_iter()
                    .map(|warning| format!("gpu-guard: {warning}")),
            );
            (Decision::Warned, "warned")
        }
        GuardMode::Audit => (Decision::Audited, "audited"),
    }
}

/// What one pass over the body finds: whether it nests too deep, and where the value of
/// `request.object` is when it is a JSON object.
#[derive(Debug, Default, PartialEq, Eq)]
struct BodyScan {
    too_deep: bool,
    object: Option<std::ops::Range<usize>>,
}

/// One pass over JSON text at memchr speed: measures nesting (brackets inside strings do not
/// count) and finds the byte range of `request.object`, so that the envelope can be parsed
/// without it and the object decoded once. Not a validator: anything unexpected (a key
/// spelt with escapes, `object` twice, malformed text) leaves `object` unset and the caller
/// parses the whole body with serde instead.
fn scan_body(text: &[u8], limit: usize) -> BodyScan {
    #[derive(Clone, Copy, PartialEq)]
    enum Frame {
        Array,
        /// An object; `true` while the next string is a key.
        Object(bool),
    }
    let mut frames: Vec<Frame> = Vec::with_capacity(16);
    let mut last_key: (usize, usize) = (0, 0);
    let mut request_depth = None;
    let mut object_start = None;
    let mut found = None;
    let mut object_keys = 0;
    let mut at = 0;
    while let Some(&byte) = text.get(at) {
        at += 1;
        match byte {
            b'"' => {
                let start = at;
                loop {
                    // `at` can be past the end after an escape at the very end of the text.
                    let rest = text.get(at..).unwrap_or_default();
                    let Some(offset) = memchr::memchr2(b'"', b'\\', rest) else {
                        return BodyScan::default();
                    };
                    at += offset + 1;
                    if text[at - 1] == b'"' {
                        break;
                    }
                    at += 1; // the escaped character
                }
                if let Some(Frame::Object(expect_key @ true)) = frames.last_mut() {
                    *expect_key = false;
                    last_key = (start, at - 1);
                }
            }
            b':' => {
                let key = &text[last_key.0..last_key.1];
                let depth = frames.len();
                if depth == 1 && key == b"request" {
                    request_depth = Some(2);
                } else if Some(depth) == request_depth && key == b"object" {
                    object_keys += 1;
                    let value = text[at..].iter().position(|b| !b.is_ascii_whitespace());
                    if let Some(start) = value.map(|offset| at + offset)
                        && text[start] == b'{'
                    {
                        object_start = Some(start);
                    }
                }
            }
            b',' => {
                if let Some(Frame::Object(expect_key)) = frames.last_mut() {
                    *expect_key = true;
                }
            }
            b'[' | b'{' => {
                frames.push(if byte == b'{' {
                    Frame::Object(true)
                } else {
                    Frame::Array
                });
                if frames.len() > limit {
                    return BodyScan {
                        too_deep: true,
                        object: None,
                    };
                }
            }
            b']' | b'}' => {
                frames.pop();
                if byte == b'}'
                    && request_depth.is_some_and(|depth| frames.len() == depth)
                    && let Some(start) = object_start.take()
                {
                    found = Some(start..at);
                }
                if request_depth.is_some_and(|depth| frames.len() < depth) {
                    request_depth = None;
                }
            }
            _ => {}
        }
    }
    BodyScan {
        too_deep: false,
        object: if object_keys == 1 { found } else { None },
    }
}

/// A Job goes through the fast path (no `Value` of the whole object); a CronJob, rare at
/// admission, through the general one.
fn mutate_raw(
    kind: &str,
    object: &str,
    policy: &Policy,
) -> Option<Result<ObjectMutation, ObjectError>> {
    if kind == "Job" {
        return Some(mutate_job_json(object, policy));
    }
    match serde_json::from_str(object) {
        Ok(value) => mutate_object(&value, policy),
        Err(source) => Some(Err(ObjectError::Decode {
            kind: "CronJob",
            source,
        })),
    }
}

fn truncate_chars(text: &mut String, max: usize) {
    if let Some((cut, _)) = text.char_indices().nth(max) {
        let keep = text[..cut]
            .char_indices()
            .nth(max - 1)
            .map_or(cut, |(index, _)| index);
        text.truncate(keep);
        text.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_measured_outside_strings() {
        assert!(!scan_body(br#"{"a": [[1], {"b": "[[[[[["}]}"#, 3).too_deep);
        assert!(scan_body(br#"{"a": [[[1]]]}"#, 3).too_deep);
        assert!(!scan_body(br#"{"a": "\"[[[[[[["}"#, 1).too_deep);
    }

    #[test]
    fn the_scan_finds_request_object_or_leaves_it_to_serde() {
        let found = |text: &str| {
            scan_body(text.as_bytes(), MAX_DEPTH)
                .object
                .map(|range| text[range].to_owned())
        };
        let object = r#"{"kind": "Job", "spec": {"x": "}{\"", "object": {"a": [1]}}}"#;
        let body = format!(
            r#"{{"kind": "AdmissionReview", "request": {{"uid": "u", "object" : {object}, "oldObject": null}}}}"#
        );
        assert_eq!(found(&body).as_deref(), Some(object));
        // Not at request level, null, twice, escaped key, truncated: left to serde.
        assert_eq!(
            found(r#"{"object": {"a": 1}, "request": {"uid": "u"}}"#),
            None
        );
        assert_eq!(found(r#"{"request": {"object": null}}"#), None);
        assert_eq!(found(r#"{"request": {"object": {}, "object": {}}}"#), None);
        assert_eq!(
            found(r#"{"request": {"object": null, "object": {}}}"#),
            None
        );
        assert_eq!(found(r#"{"request": {"obj\u0065ct": {}}}"#), None);
        assert_eq!(found(r#"{"request": {"object": {"a": "#), None);
        assert_eq!(found(r#"{"request": {"nested": {"object": {}}}}"#), None);
    }

    #[test]
    fn truncated_bodies_never_panic_the_scan_or_the_review() {
        let policy = Policy::embedded();
        let view = guard::StaticView::from_policy(&policy.guard.offline);
        let body = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/admission/009-Job-CREATE-mutate.json"
        ))
        .unwrap();
        for text in [
            &br#"{"a":"\"#[..],
            br#""\"#,
            br#"{"request":{"object":"\"#,
            br"\",
        ] {
            assert_eq!(scan_body(text, MAX_DEPTH), BodyScan::default());
            assert!(review(Webhook::Mutate, text, &policy, &view).is_err());
        }
        // Every prefix of a real review, and every single-byte change to a backslash or quote.
        for end in 0..body.len() {
            let _ = review(Webhook::Mutate, &body[..end], &policy, &view);
        }
        for at in (0..body.len()).step_by(7) {
            for byte in [b'\\', b'"', b'{', b'}'] {
                let mut changed = body.clone();
                changed[at] = byte;
                let _ = review(Webhook::Mutate, &changed, &policy, &view);
            }
        }
    }

    #[test]
    fn the_split_and_the_whole_body_give_the_same_answer() {
        let policy = Policy::embedded();
        let view = guard::StaticView::from_policy(&policy.guard.offline);
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/admission");
        let mut checked = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let body = std::fs::read(&path).unwrap();
            assert!(scan_body(&body, MAX_DEPTH).object.is_some(), "{path:?}");
            for webhook in [Webhook::Mutate, Webhook::Validate] {
                let fast = review(webhook, &body, &policy, &view).unwrap();
                let whole = review_parsed(webhook, &body, None, &policy, &view).unwrap();
                assert_eq!(fast.body, whole.body, "{path:?}");
            }
            checked += 1;
        }
        assert_eq!(checked, 20);
    }

    #[test]
    fn long_warnings_are_cut_to_the_api_servers_limit() {
        let mut long = "x".repeat(300);
        truncate_chars(&mut long, MAX_WARNING_CHARS);
        assert_eq!(long.chars().count(), MAX_WARNING_CHARS);
        let mut short = "short".to_owned();
        truncate_chars(&mut short, MAX_WARNING_CHARS);
        assert_eq!(short, "short");
    }
}
