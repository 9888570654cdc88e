//! AdmissionReview in, AdmissionReview out: the wire contract of the webhooks, with no
//! transport in it (the server hands it bytes and sends back what it returns).
//!
//! - `/mutate`: a Job or CronJob CREATE goes through the engine ([`gpu_guard_core::mutate::object`]); the JSON
//!   Patch is derived from the engine's changes and proven to apply to the raw request object
//!   before it is sent. No change: no patch and no patchType. UPDATE, DELETE, CONNECT and every
//!   other kind: allowed, no patch (a Job's pod template and podFailurePolicy are immutable).
//!   A Pod CREATE (the Job pods' own webhook) is kept off the nodes where its workload's devices
//!   failed, read from [`Memories`] ([`review_with_memories`]; `place`): the patch goes with
//!   the audit annotation [`AVOIDED_AUDIT_KEY`], never a warning.
//! - `/validate`: the GPU-node priority guard ([`gpu_guard_core::guard`]) judges Pods and the pod
//!   template of Deployments, StatefulSets, DaemonSets, ReplicaSets, ReplicationControllers,
//!   Jobs and CronJobs at CREATE and UPDATE (an UPDATE that leaves the pod spec as it was, or
//!   that belongs to a deletion, is not judged again). A violation is denied (HTTP 200,
//!   `allowed: false`, code 403), warned about or audited, as the policy's mode says; the
//!   `gpu-guard.io/skip` annotation does not bypass it. Subresources are not judged.
//! - Malformed input is a [`ReviewError`] (HTTP 400) with a message saying what is wrong; an
//!   object that does not decode as a Job is allowed unchanged with a warning, so a bad object
//!   never turns into a 500 loop. `admission.k8s.io/v1beta1` is answered in v1beta1 (same shape).

mod envelope;
mod mutate;
mod place;
mod validate;

pub use place::AVOIDED_AUDIT_KEY;

pub use envelope::{GroupVersionKind, MAX_WARNING_CHARS, Operation, Response, ReviewError, Status};

use serde_json::value::RawValue;

use gpu_guard_core::decode;
use gpu_guard_core::guard::ClusterView;
use gpu_guard_core::kinds;
use gpu_guard_core::memory::avoid::{Memories, NoMemories};
use gpu_guard_core::policy::{GuardMode, Policy};

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

/// What was decided, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReviewOutcome {
    Allowed,
    Patched,
    Denied,
    /// Allowed with a guard warning (Warn mode).
    Warned,
    /// Allowed with a guard audit annotation (Audit mode).
    Audited,
}

impl ReviewOutcome {
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
    pub outcome: ReviewOutcome,
    pub uid: String,
    pub kind: String,
    pub operation: Operation,
    pub namespace: String,
    pub name: String,
    /// Bytes of the JSON Patch sent (before base64), 0 when none.
    pub patch_bytes: usize,
    /// What the guard decided, when it judged the object: the mode and the outcome.
    pub guard: Option<GuardOutcome>,
    /// Warnings sent to the client (`response.warnings`).
    pub warnings: usize,
    /// What came of keeping a pod off the nodes where its workload failed, when it was tried.
    pub avoided: Option<Avoided>,
}

/// What came of a pod's avoidance of failed nodes, for metrics and the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Avoided {
    /// Kept off this many nodes.
    Excluded(usize),
    /// The workload's memory annotation is not gpu-guard's: the pod was admitted unchanged.
    Unreadable { workload: String, error: String },
}

/// A guard decision, for metrics: the mode in force and what came of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardOutcome {
    pub mode: GuardMode,
    /// `allowed`, `exempt`, `unjudged`, `denied`, `warned` or `audited`.
    pub outcome: &'static str,
}

/// Decides one AdmissionReview body for `webhook`; the guard reads the cluster from `view`.
/// No workload has a memory of device failures: a Pod CREATE passes unchanged.
pub fn review(
    webhook: Webhook,
    body: &[u8],
    policy: &Policy,
    view: &dyn ClusterView,
) -> Result<Reviewed, ReviewError> {
    review_with_memories(webhook, body, policy, view, &NoMemories)
}

/// [`review`], a Pod CREATE to `/mutate` reading its workload's device failures from
/// `memories`.
pub fn review_with_memories(
    webhook: Webhook,
    body: &[u8],
    policy: &Policy,
    view: &dyn ClusterView,
    memories: &dyn Memories,
) -> Result<Reviewed, ReviewError> {
    // No separate walk refuses deep nesting: serde_json bounds its recursion (128 levels) where
    // it builds values, and skips what nobody reads without recursing. A walk of its own cost
    // a whole pass over the body, a tenth of the webhook's CPU under load (perf, 2026-12-04).
    // The envelope and the objects are read from text, so serde_json's byte reader (a second
    // copy of the decoder's code) runs only for a body that is not UTF-8, whose error it places.
    let incoming = match std::str::from_utf8(body) {
        Ok(text) => envelope::parse(decode::from_json_str(text))?,
        Err(_) => envelope::parse(decode::from_json_slice(body))?,
    };
    review_parsed(webhook, incoming, policy, view, memories)
}

/// [`review`] after the envelope.
fn review_parsed(
    webhook: Webhook,
    incoming: envelope::IncomingReview<'_>,
    policy: &Policy,
    view: &dyn ClusterView,
    memories: &dyn Memories,
) -> Result<Reviewed, ReviewError> {
    let request = incoming.request.ok_or(ReviewError::MissingRequest)?;
    let object = request.object.map(RawValue::get);
    let mut response = Response {
        uid: request.uid.clone(),
        allowed: true,
        ..Response::default()
    };
    let mut avoided = None;
    let placed = kinds::find(
        &request.kind.group,
        &request.kind.version,
        &request.kind.kind,
    )
    .is_some_and(|known| known.placed);
    let (outcome, patch_bytes, guard) = match webhook {
        Webhook::Mutate if placed => {
            let (outcome, patch_bytes, decided) =
                place::place(&request, object, policy, memories, &mut response)?;
            avoided = decided;
            (outcome, patch_bytes, None)
        }
        Webhook::Mutate => {
            let (outcome, patch_bytes) =
                mutate::mutate(&request, object, policy, view.dra(), &mut response)?;
            (outcome, patch_bytes, None)
        }
        Webhook::Validate => {
            match validate::validate(&request, object, policy, view, &mut response)? {
                Some((outcome, guard)) => (outcome, 0, Some(guard)),
                None => (ReviewOutcome::Allowed, 0, None),
            }
        }
    };
    let warnings = response.warnings.len();
    Ok(Reviewed {
        body: envelope::encode(&incoming.api_version, response),
        outcome,
        uid: request.uid,
        kind: request.kind.kind,
        operation: request.operation,
        namespace: request.namespace.unwrap_or_default(),
        name: request.name.unwrap_or_default(),
        patch_bytes,
        guard,
        warnings,
        avoided,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_guard_core::guard;

    /// A Job's CREATE review as kube-apiserver v1.36 sent it (a recorded fixture).
    fn job_review_body() -> Vec<u8> {
        std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/admission/009-Job-CREATE-mutate.json"
        ))
        .unwrap()
    }

    #[test]
    fn truncated_bodies_never_panic_the_review() {
        let policy = Policy::embedded();
        let view = guard::StaticView::from_policy(&policy.guard.offline);
        let body = job_review_body();
        for text in [
            &br#"{"a":"\"#[..],
            br#""\"#,
            br#"{"request":{"object":"\"#,
            br"\",
        ] {
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

    /// serde's words for Rust types, which no message may use.
    const RUST_WORDS: &[&str] = &[
        "i32",
        "i64",
        "u32",
        "u128",
        "struct",
        "IncomingReview",
        "IncomingRequest",
        "RawJob",
        "Some",
        "sequence",
    ];

    fn assert_for_people(message: &str) {
        let words: Vec<&str> = message
            .split(|c: char| !c.is_ascii_alphanumeric())
            .collect();
        for word in RUST_WORDS {
            assert!(!words.contains(word), "{message:?} says {word:?}");
        }
    }

    #[test]
    fn bad_requests_and_objects_are_described_in_words_with_their_field() {
        let policy = Policy::embedded();
        let view = guard::StaticView::from_policy(&policy.guard.offline);
        let refused = |body: &[u8]| {
            review(Webhook::Mutate, body, &policy, &view)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused(b"5"),
            "the body is not a JSON AdmissionReview: expected an AdmissionReview, found 5 at \
             line 1 column 1"
        );
        assert_eq!(
            refused(br#"{"apiVersion": "admission.k8s.io/v1", "request": {"uid": 5}}"#),
            "the body is not a JSON AdmissionReview: request.uid: expected a string, found 5"
        );
        assert_eq!(
            refused(br#"{"apiVersion": "admission.k8s.io/v1", "request": 7}"#),
            "the body is not a JSON AdmissionReview: request: expected an AdmissionRequest, \
             found 7"
        );

        let job: serde_json::Value = serde_json::from_slice(
            &std::fs::read(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/admission/001-Job-CREATE-mutate.json"
            ))
            .unwrap(),
        )
        .unwrap();
        let warning = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut body = job.clone();
            edit(&mut body["request"]["object"]);
            let reviewed =
                review(Webhook::Mutate, body.to_string().as_bytes(), &policy, &view).unwrap();
            let sent: serde_json::Value = serde_json::from_slice(&reviewed.body).unwrap();
            assert_eq!(sent["response"]["allowed"], true);
            assert!(sent["response"].get("patch").is_none());
            sent["response"]["warnings"][0].as_str().unwrap().to_owned()
        };
        let wrong_kind = warning(&|object| object["apiVersion"] = "v1".into());
        assert_eq!(
            wrong_kind,
            "gpu-guard: the object does not decode as a batch/v1 Job: found apiVersion \"v1\" \
             and kind \"Job\""
        );
        let no_kind = warning(&|object| {
            object.as_object_mut().unwrap().remove("kind");
        });
        assert!(no_kind.ends_with("and no kind"), "{no_kind}");
        let deadline = warning(&|object| object["spec"]["activeDeadlineSeconds"] = "soon".into());
        assert!(
            deadline.starts_with(
                "gpu-guard: the object does not decode as a batch/v1 Job: \
                 spec.activeDeadlineSeconds: expected a whole number"
            ),
            "{deadline}"
        );
        for message in [wrong_kind, no_kind, deadline] {
            assert_for_people(&message);
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_refused_with_where_the_bad_byte_is() {
        let policy = Policy::embedded();
        let view = guard::StaticView::from_policy(&policy.guard.offline);
        let body = job_review_body();
        let text = String::from_utf8(body.clone()).unwrap();
        // A Latin-1 byte in the object (its apiVersion), then in the envelope (the namespace).
        for anchor in ["\"batch/v1\"", "\"gpu-lab\""] {
            let at = text.find(anchor).unwrap_or_else(|| panic!("{anchor}")) + 2;
            let mut bad = body.clone();
            bad[at] = 0xe9;
            let error = review(Webhook::Mutate, &bad, &policy, &view).unwrap_err();
            let message = error.to_string();
            let line = text[..at].matches('\n').count() + 1;
            assert!(matches!(error, ReviewError::NotJson(_)), "{message}");
            assert!(
                message.contains(&format!("line {line}")),
                "{anchor}: {message}"
            );
        }
    }
}
