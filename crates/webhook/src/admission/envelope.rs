//! The AdmissionReview envelope: what gpu-guard reads of a request (the object stays JSON
//! text, found by one pass over the bytes), the typed operation, the response it writes, and
//! why a body is refused.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use gpu_guard_core::decode::JsonError;

/// At most this many characters in one admission warning (the API server's limit is 120).
pub const MAX_WARNING_CHARS: usize = 120;

/// The deepest JSON nesting accepted (serde_json's own limit for the values it builds).
pub const MAX_DEPTH: usize = 128;

pub(super) const SUPPORTED_VERSIONS: [&str; 2] =
    ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// Why a request body is not a usable AdmissionReview (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not a JSON AdmissionReview: {0}")]
    NotJson(#[source] JsonError),
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

/// `request.operation`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "String")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
    /// Anything else, as sent (no API server sends it; it is logged as it came).
    #[default]
    Unknown,
    Other(String),
}

impl From<String> for Operation {
    fn from(operation: String) -> Self {
        match operation.as_str() {
            "CREATE" => Self::Create,
            "UPDATE" => Self::Update,
            "DELETE" => Self::Delete,
            "CONNECT" => Self::Connect,
            "" => Self::Unknown,
            _ => Self::Other(operation),
        }
    }
}

impl Operation {
    /// The operation as the API server spells it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Connect => "CONNECT",
            Self::Unknown => "",
            Self::Other(operation) => operation,
        }
    }
}

/// The parts of an AdmissionReview gpu-guard reads. The object stays JSON text (borrowed from
/// the body): the engine decodes the typed Job from it directly.
#[derive(Deserialize)]
#[serde(expecting = "an AdmissionReview")]
pub(super) struct IncomingReview<'a> {
    #[serde(rename = "apiVersion", default)]
    pub(super) api_version: String,
    #[serde(default)]
    pub(super) kind: String,
    #[serde(borrow)]
    pub(super) request: Option<IncomingRequest<'a>>,
}

#[derive(Deserialize)]
#[serde(expecting = "an AdmissionRequest")]
pub(super) struct IncomingRequest<'a> {
    #[serde(default)]
    pub(super) uid: String,
    #[serde(default)]
    pub(super) kind: GroupVersionKind,
    #[serde(default)]
    pub(super) operation: Operation,
    #[serde(default)]
    pub(super) namespace: Option<String>,
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default, rename = "subResource")]
    pub(super) sub_resource: Option<String>,
    #[serde(default, borrow)]
    pub(super) object: Option<&'a RawValue>,
    #[serde(default, borrow, rename = "oldObject")]
    pub(super) old_object: Option<&'a RawValue>,
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

/// Checks what every request must have in the decoded envelope (the body, or the body without
/// its object): a supported apiVersion, the kind, a request with a uid.
pub(super) fn parse(
    decoded: Result<IncomingReview<'_>, JsonError>,
) -> Result<IncomingReview<'_>, ReviewError> {
    let incoming = decoded.map_err(ReviewError::NotJson)?;
    if !SUPPORTED_VERSIONS.contains(&incoming.api_version.as_str()) {
        return Err(ReviewError::UnsupportedVersion(incoming.api_version));
    }
    if incoming.kind != "AdmissionReview" {
        return Err(ReviewError::WrongKind(incoming.kind));
    }
    match &incoming.request {
        None => Err(ReviewError::MissingRequest),
        Some(request) if request.uid.is_empty() => Err(ReviewError::MissingUid),
        Some(_) => Ok(incoming),
    }
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

/// The response body, in the AdmissionReview version of the request, warnings cut to the API
/// server's limit.
pub(super) fn encode(api_version: &str, mut response: Response) -> Vec<u8> {
    for warning in &mut response.warnings {
        truncate_chars(warning, MAX_WARNING_CHARS);
    }
    serde_json::to_vec(&OutgoingReview {
        api_version: if api_version.is_empty() {
            SUPPORTED_VERSIONS[0]
        } else {
            api_version
        },
        kind: "AdmissionReview",
        response,
    })
    .expect("an AdmissionReview serializes")
}

/// What one pass over the body finds: whether it nests too deep, and where the value of
/// `request.object` is when it is a JSON object.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct BodyScan {
    pub(super) too_deep: bool,
    pub(super) object: Option<std::ops::Range<usize>>,
}

/// One pass over JSON text at memchr speed: measures nesting (brackets inside strings do not
/// count) and finds the byte range of `request.object`, so that the envelope can be parsed
/// without it and the object decoded once. Not a validator: anything unexpected (a key
/// spelt with escapes, `object` twice, malformed text) leaves `object` unset and the caller
/// parses the whole body with serde instead.
pub(super) fn scan_body(text: &[u8], limit: usize) -> BodyScan {
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
    fn long_warnings_are_cut_to_the_api_servers_limit() {
        let mut long = "x".repeat(300);
        truncate_chars(&mut long, MAX_WARNING_CHARS);
        assert_eq!(long.chars().count(), MAX_WARNING_CHARS);
        let mut short = "short".to_owned();
        truncate_chars(&mut short, MAX_WARNING_CHARS);
        assert_eq!(short, "short");
    }

    #[test]
    fn operations_are_typed_and_spelt_as_sent() {
        for text in ["CREATE", "UPDATE", "DELETE", "CONNECT", "PATCH", ""] {
            assert_eq!(Operation::from(text.to_owned()).as_str(), text);
        }
        assert_eq!(Operation::from("CREATE".to_owned()), Operation::Create);
    }
}
