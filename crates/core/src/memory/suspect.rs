//! PURE: when do device failures of several pods make a node suspect?
//!
//! A device the device plugin does not flag still fails the pods that use it. One pod's
//! failure says little (the application may misreport its own error); failures of several
//! different pods on one node, close together, say the node is the common cause. Such a node is
//! suspect: the controller taints it as it taints a degraded one, and releases it after a quiet
//! period without a device failure on it. While it is tainted, new pods land elsewhere, so the
//! quiet period runs from its last failure.
//!
//! The failures come from the workloads' memories ([`super::Memory`]), where each has its node,
//! pod and time; a failure without a time is not counted (its age is unknown).

use std::collections::BTreeSet;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::DeviceFailure;

/// When a node becomes suspect and when it stops being.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuspectRule {
    /// Distinct pods whose device failed on the node within [`SuspectRule::window_seconds`].
    pub pods: usize,
    pub window_seconds: u64,
    /// Seconds without a device failure on a suspect node before it is released.
    pub quiet_seconds: u64,
}

/// What the rule says of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuspectVerdict {
    /// Suspect now: the pods whose failures count (in the window, or since it became suspect),
    /// sorted, and when it may be released if nothing else fails on it.
    Suspect {
        pods: Vec<String>,
        release_at: Timestamp,
    },
    /// Not (or no longer) suspect.
    Clear,
}

/// The verdict on `node` at `now`, from the device failures recorded anywhere (any node, any
/// workload; the node's own are picked out), given whether it is suspect already (gpu-guard's
/// taint says so).
pub fn verdict<'a>(
    node: &str,
    failures: impl IntoIterator<Item = &'a DeviceFailure>,
    suspect_now: bool,
    now: Timestamp,
    rule: &SuspectRule,
) -> SuspectVerdict {
    let on_node: Vec<(&str, Timestamp)> = failures
        .into_iter()
        .filter(|failure| failure.node == node)
        .filter_map(|failure| Some((failure.pod.as_str(), failure.at?)))
        .filter(|(_, at)| *at <= now)
        .collect();
    let Some(last) = on_node.iter().map(|(_, at)| *at).max() else {
        return SuspectVerdict::Clear;
    };
    let release_at = later(last, rule.quiet_seconds);
    let since = |start: Timestamp| -> Vec<String> {
        let pods: BTreeSet<&str> = on_node
            .iter()
            .filter(|(_, at)| *at >= start)
            .map(|(pod, _)| *pod)
            .collect();
        pods.into_iter().map(str::to_owned).collect()
    };
    if suspect_now {
        if now < release_at {
            return SuspectVerdict::Suspect {
                pods: since(earlier(now, rule.window_seconds.max(rule.quiet_seconds))),
                release_at,
            };
        }
        return SuspectVerdict::Clear;
    }
    let pods = since(earlier(now, rule.window_seconds));
    if rule.pods > 0 && pods.len() >= rule.pods && now < release_at {
        SuspectVerdict::Suspect { pods, release_at }
    } else {
        SuspectVerdict::Clear
    }
}

/// What a suspect node's annotation ([`crate::wellknown::SUSPECT_ANNOTATION`]) records: its
/// last device failure and the pods whose failures count, so that a restarted controller, which
/// no longer sees the pods a JobSet's gang restart deleted, still releases it on time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuspectRecord {
    pub last: Timestamp,
    pub pods: Vec<String>,
}

impl SuspectRecord {
    /// The record of a [`SuspectVerdict::Suspect`] under `rule`: its last failure is its release
    /// time less the quiet period.
    pub fn of(pods: &[String], release_at: Timestamp, rule: &SuspectRule) -> Self {
        Self {
            last: earlier(release_at, rule.quiet_seconds),
            pods: pods.to_vec(),
        }
    }

    /// The annotation value: `<RFC 3339 time>;<pod>,<pod>`. Pod names are DNS subdomains: they
    /// hold neither `;` nor `,`.
    pub fn annotation(&self) -> String {
        format!("{};{}", self.last, self.pods.join(","))
    }

    /// The record an annotation holds; `None` when it does not parse (then the node is released
    /// as if nothing were on record: a suspect taint never outlives what explains it).
    pub fn parse(text: &str) -> Option<Self> {
        let (last, pods) = text.split_once(';')?;
        Some(Self {
            last: last.trim().parse().ok()?,
            pods: pods
                .split(',')
                .map(str::trim)
                .filter(|pod| !pod.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }

    /// The failures it stands for on `node`, each at the last failure's time: enough for
    /// [`verdict`] on a node suspect already (the release follows the last failure).
    pub fn failures(&self, node: &str) -> Vec<DeviceFailure> {
        self.pods
            .iter()
            .map(|pod| DeviceFailure {
                node: node.to_owned(),
                pod: pod.clone(),
                devices: Vec::new(),
                at: Some(self.last),
                cause: "on record in the node's annotation".to_owned(),
            })
            .collect()
    }
}

fn seconds(value: u64) -> SignedDuration {
    SignedDuration::from_secs(i64::try_from(value).unwrap_or(i64::MAX))
}

/// `time` plus `secs`, the latest time there is past the end of time.
fn later(time: Timestamp, secs: u64) -> Timestamp {
    time.checked_add(seconds(secs)).unwrap_or(Timestamp::MAX)
}

/// `time` minus `secs`, the earliest time there is before the start of time.
fn earlier(time: Timestamp, secs: u64) -> Timestamp {
    time.checked_sub(seconds(secs)).unwrap_or(Timestamp::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: SuspectRule = SuspectRule {
        pods: 3,
        window_seconds: 3600,
        quiet_seconds: 6 * 3600,
    };

    fn at(time: &str) -> Timestamp {
        format!("2026-12-04T{time}Z").parse().unwrap()
    }

    fn failure(node: &str, pod: &str, time: Option<&str>) -> DeviceFailure {
        DeviceFailure {
            node: node.to_owned(),
            pod: pod.to_owned(),
            devices: Vec::new(),
            at: time.map(at),
            cause: "exit code 74 in container trainer".to_owned(),
        }
    }

    #[test]
    fn several_pods_close_together_make_a_node_suspect() {
        /// What, the failures, suspect already, now, suspect with this many pods.
        type Case = (
            &'static str,
            Vec<DeviceFailure>,
            bool,
            &'static str,
            Option<usize>,
        );
        let cases: &[Case] = &[
            (
                "three pods within the hour",
                vec![
                    failure("n1", "a", Some("10:00:00")),
                    failure("n1", "b", Some("10:20:00")),
                    failure("n1", "c", Some("10:50:00")),
                ],
                false,
                "10:55:00",
                Some(3),
            ),
            (
                "the same pod thrice is one pod",
                vec![
                    failure("n1", "a", Some("10:00:00")),
                    failure("n1", "a", Some("10:20:00")),
                    failure("n1", "b", Some("10:50:00")),
                ],
                false,
                "10:55:00",
                None,
            ),
            (
                "spread over more than the window",
                vec![
                    failure("n1", "a", Some("08:00:00")),
                    failure("n1", "b", Some("10:20:00")),
                    failure("n1", "c", Some("10:50:00")),
                ],
                false,
                "10:55:00",
                None,
            ),
            (
                "other nodes' failures do not count",
                vec![
                    failure("n1", "a", Some("10:00:00")),
                    failure("n2", "b", Some("10:20:00")),
                    failure("n3", "c", Some("10:50:00")),
                ],
                false,
                "10:55:00",
                None,
            ),
            (
                "a failure without a time does not count",
                vec![
                    failure("n1", "a", None),
                    failure("n1", "b", Some("10:20:00")),
                    failure("n1", "c", Some("10:50:00")),
                ],
                false,
                "10:55:00",
                None,
            ),
            (
                "suspect stays suspect within the quiet period",
                vec![failure("n1", "a", Some("10:00:00"))],
                true,
                "15:59:59",
                Some(1),
            ),
            (
                "released after the quiet period",
                vec![failure("n1", "a", Some("10:00:00"))],
                true,
                "16:00:00",
                None,
            ),
            ("nothing on record", vec![], true, "10:00:00", None),
        ];
        for (what, failures, suspect_now, now, expected) in cases {
            let found = verdict("n1", failures, *suspect_now, at(now), &RULE);
            let pods = match &found {
                SuspectVerdict::Suspect { pods, .. } => Some(pods.len()),
                SuspectVerdict::Clear => None,
            };
            assert_eq!(pods, *expected, "{what}: {found:?}");
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_keeps_the_release() {
        let pods = vec!["a".to_owned(), "b-0".to_owned()];
        let record = SuspectRecord::of(&pods, at("16:30:00"), &RULE);
        assert_eq!(record.last, at("10:30:00"));
        let text = record.annotation();
        assert_eq!(text, "2026-12-04T10:30:00Z;a,b-0");
        assert_eq!(SuspectRecord::parse(&text), Some(record.clone()));
        // After a restart only the record is left: the node stays suspect until its release.
        let failures = record.failures("n1");
        let found = verdict("n1", &failures, true, at("16:29:59"), &RULE);
        assert_eq!(
            found,
            SuspectVerdict::Suspect {
                pods,
                release_at: at("16:30:00")
            }
        );
        assert_eq!(
            verdict("n1", &failures, true, at("16:30:00"), &RULE),
            SuspectVerdict::Clear
        );
        for bad in ["", "yesterday;a", "no separator"] {
            assert_eq!(SuspectRecord::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_release_follows_the_last_failure() {
        let failures = [
            failure("n1", "a", Some("10:00:00")),
            failure("n1", "b", Some("10:10:00")),
            failure("n1", "c", Some("10:30:00")),
        ];
        let SuspectVerdict::Suspect { release_at, .. } =
            verdict("n1", &failures, false, at("10:31:00"), &RULE)
        else {
            panic!("suspect");
        };
        assert_eq!(release_at, at("16:30:00"));
    }
}
