//! The controller's Events (`events.k8s.io/v1`, through kube's recorder): their reasons, the
//! note size the API server accepts, and publishing one, never fatal to a pass.

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};

use super::Reconciler;

/// Event reasons.
pub const REASON_DEGRADED: &str = "DeviceDegraded";
pub const REASON_RECOVERED: &str = "DeviceRecovered";
pub const REASON_SAFETY_VALVE: &str = "SafetyValve";
/// A node tainted suspect (device failures of several pods), and released after the quiet
/// period.
pub const REASON_SUSPECT: &str = "DeviceSuspect";
pub const REASON_SUSPECT_RELEASED: &str = "DeviceSuspectReleased";
pub const REASON_MARKED: &str = "DeviceFailureMarked";
pub const REASON_PEER_MARKED: &str = "PeerDeviceFailureMarked";
pub const REASON_EVICTED: &str = "Evicted";
/// gpu-guard's Node condition added or rewritten, and removed.
pub const REASON_CONDITION_SET: &str = "DeviceDegradedConditionSet";
pub const REASON_CONDITION_REMOVED: &str = "DeviceDegradedConditionRemoved";
/// A pod of a protected Job stuck Terminating on a NotReady or unreachable node, and its
/// force deletion.
pub const REASON_STUCK: &str = "StuckTerminating";
pub const REASON_FORCE_DELETED: &str = "ForceDeleted";
/// On a workload: a pod's device failure was recorded in its memory.
pub const REASON_RECORDED: &str = "DeviceFailureRecorded";
/// On a workload: its recorded device failures exceed its budget.
pub const REASON_RETRIES_EXHAUSTED: &str = "DeviceRetriesExhausted";
/// On a pod: given `gpu-guard.io/DeviceRetriesExhausted`.
pub const REASON_EXHAUSTED_MARKED: &str = "DeviceRetriesExhaustedMarked";
/// On a workload: its memory annotation is not gpu-guard's, and is left alone.
pub const REASON_MEMORY_UNREADABLE: &str = "DeviceFailureMemoryUnreadable";

/// The most bytes of an Event note the API server accepts.
pub const EVENT_NOTE_MAX_BYTES: usize = 1024;

impl Reconciler {
    /// Publishes an Event; a failure is logged, never fatal. Not while leadership has run out:
    /// the new leader reports what happens from now on.
    pub(super) async fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if self.ensure_leading().is_err() {
            return;
        }
        publish(&self.recorder, regarding, type_, reason, action, note).await;
    }
}

/// Publishes an Event through `recorder`, its note cut to what the API server accepts; a
/// failure is logged, never fatal.
pub(super) async fn publish(
    recorder: &Recorder,
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    publish_related(recorder, regarding, None, type_, reason, action, note).await;
}

/// [`publish`], with the object the Event is also about (`related`). kube's recorder folds an
/// Event into the series of an earlier one with the same regarding, related, reason and action
/// (keeping the earlier note): two failures of a workload's pods, each told on the workload,
/// stay two Events only when each names its pod as related.
pub(super) async fn publish_related(
    recorder: &Recorder,
    regarding: &ObjectReference,
    related: Option<ObjectReference>,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(truncate_note(note)),
        action: action.to_owned(),
        secondary: related,
    };
    if let Err(error) = recorder.publish(&event, regarding).await {
        tracing::warn!(%error, reason, "cannot publish an Event");
    }
}

/// The API server refuses Event notes over [`EVENT_NOTE_MAX_BYTES`] bytes: the note is cut at
/// a character boundary within it.
pub fn truncate_note(mut note: String) -> String {
    if note.len() > EVENT_NOTE_MAX_BYTES {
        let mut end = EVENT_NOTE_MAX_BYTES;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}

/// What an Event about `node` regards.
pub(super) fn node_ref(node: &Node) -> ObjectReference {
    let mut reference = node.object_ref(&());
    // Events on cluster-scoped objects go to the default namespace (as kubelet's do).
    reference.namespace = None;
    reference
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_are_cut_to_1024_bytes_at_a_character_boundary() {
        assert_eq!(truncate_note("short".to_owned()), "short");
        let ascii = "a".repeat(2000);
        assert_eq!(truncate_note(ascii).len(), EVENT_NOTE_MAX_BYTES);
        // 'é' is two bytes: 1023 bytes of 'a' and one 'é' would end at byte 1025.
        let note = format!("{}é", "a".repeat(1023));
        let cut = truncate_note(note);
        assert_eq!(cut.len(), 1023);
        assert!(cut.chars().all(|c| c == 'a'));
        // 1000 characters of 'é' are 2000 bytes: the old limit of 1000 characters was too long.
        assert_eq!(truncate_note("é".repeat(1000)).len(), EVENT_NOTE_MAX_BYTES);
    }
}
