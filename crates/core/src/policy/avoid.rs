//! `mutation.avoidFailedNodes`: a new pod of a workload whose devices failed is kept off the
//! nodes where they failed (see [`crate::memory::avoid`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::field::FieldPath;

/// Keep a workload's new pods off the nodes where its pods failed of a device.
///
/// The Pod CREATE of a pod the Job controller makes for a Job (or a JobSet's child Job) whose
/// device failures gpu-guard has recorded gets a required node affinity that excludes the
/// most recent of those nodes. When every node that could run the pod is excluded, the pod
/// stays `Pending` (the scheduler says the nodes did not match its node affinity), visible,
/// rather than going back to the broken device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AvoidFailedNodes {
    /// Exclude the nodes at all.
    pub enabled: bool,
    /// How many nodes, the most recent failure first (1 to 20, the failures the record
    /// keeps). 8: a rack's worth of GPU nodes (a fault in a shared switch, cable or power
    /// shelf shows on several neighbours), while a cluster of a dozen GPU nodes keeps room.
    #[schemars(range(min = 1, max = 20))]
    pub max_nodes: u32,
}

impl Default for AvoidFailedNodes {
    fn default() -> Self {
        Self {
            enabled: true,
            max_nodes: 8,
        }
    }
}

/// How many device failures a workload's record keeps (the memory's `MAX_RECORDS` is this
/// number): the most nodes a pod can be kept off. It lives here so that the policy's bound and
/// the record's size are one number, and the policy does not read the memory module.
pub const RECORDED_FAILURES: usize = 20;

/// `mutation.avoidFailedNodes.maxNodes`: 1 to [`RECORDED_FAILURES`] (a node beyond the
/// failures the record keeps is never known).
pub(super) fn validate_avoid(settings: &AvoidFailedNodes) -> Vec<(FieldPath, String)> {
    let max = settings.max_nodes;
    if (1..=RECORDED_FAILURES as u32).contains(&max) {
        return Vec::new();
    }
    vec![(
        FieldPath::new(["mutation", "avoidFailedNodes", "maxNodes"]),
        format!(
            "must be between 1 and {} (the device failures gpu-guard keeps per workload), \
             found {max}; to exclude no node, set enabled: false",
            RECORDED_FAILURES
        ),
    )]
}

#[cfg(test)]
mod tests {
    use crate::policy::parse;

    #[test]
    fn max_nodes_is_bounded_with_file_line_and_field() {
        let text = "apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\nmutation:\n  \
                    avoidFailedNodes:\n    maxNodes: 0\n";
        let error = parse(text, "p.yaml").unwrap_err().to_string();
        assert!(error.contains("p.yaml:5"), "{error}");
        assert!(
            error.contains("mutation.avoidFailedNodes.maxNodes: must be between 1 and 20"),
            "{error}"
        );
        assert!(error.contains("enabled: false"), "{error}");
        let ok = "apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\nmutation:\n  \
                  avoidFailedNodes:\n    enabled: false\n    maxNodes: 20\n";
        let policy = parse(ok, "p.yaml").unwrap();
        assert!(!policy.mutation.avoid_failed_nodes.enabled);
        assert_eq!(policy.mutation.avoid_failed_nodes.max_nodes, 20);
    }
}
