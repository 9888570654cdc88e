//! The AdmissionReview envelope: what gpu-guard reads of a request (the objects stay JSON
//! text, borrowed from the body by serde_json), the typed operation, the response it writes,
//! and why a body is refused.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use gpu_guard_core::decode::JsonError;

/// At most this many characters in one admission warning (the API server's limit is 120).
pub const MAX_WARNING_CHARS: usize = 120;

pub(super) const SUPPORTED_VERSIONS: [&str; 2] =
    ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// Why a request body is not a usable AdmissionReview (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not a JSON AdmissionReview: {0}")]
    NotJson(#[source] JsonError),
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

/// The parts of an AdmissionReview gpu-guard reads. The objects stay JSON text (borrowed from
/// the body): each is decoded once, by the webhook that reads it, and only when it does.
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

/// Checks what every request must have in the decoded envelope: a supported apiVersion, the
/// kind, a request with a uid.
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
