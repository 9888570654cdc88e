//! The typed list of what the engine changes. Each variant owns one path of the Job; the patch
//! layer ([`patch`](super::patch)) renders the same variants as JSON Patch operations.

use k8s_openapi::api::batch::v1::{Job, PodFailurePolicy, PodFailurePolicyRule};
use k8s_openapi::api::core::v1::{ContainerRestartRule, PodSpec, Toleration};

/// One change to a Job (or to a CronJob's `jobTemplate`, which has the same shape).
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// `metadata.annotations[key] = value`.
    SetAnnotation { key: String, value: String },
    /// `spec.template.metadata.annotations[key] = value`: on every pod of the Job.
    SetTemplateAnnotation { key: String, value: String },
    /// `spec.podFailurePolicy = policy` (the Job had none, or it is replaced).
    SetPodFailurePolicy(PodFailurePolicy),
    /// Insert `rules` in front of the Job's existing `spec.podFailurePolicy.rules`.
    PrependRules(Vec<PodFailurePolicyRule>),
    /// `spec.podReplacementPolicy = value`.
    SetPodReplacementPolicy(String),
    /// `spec.template.spec.restartPolicy = value`.
    SetRestartPolicy(String),
    /// `spec.template.spec.terminationGracePeriodSeconds = value`.
    SetTerminationGracePeriod(i64),
    /// `spec.template.spec.tolerations[index].tolerationSeconds = seconds`.
    SetTolerationSeconds { index: usize, seconds: i64 },
    /// Append a toleration to `spec.template.spec.tolerations`.
    AddToleration(Toleration),
    /// `spec.activeDeadlineSeconds = value`.
    SetActiveDeadlineSeconds(i64),
    /// `spec.template.spec.containers[index].restartPolicy = value` (the container, named
    /// `container`, had none: restart rules need an explicit one).
    SetContainerRestartPolicy {
        index: usize,
        container: String,
        value: String,
    },
    /// Append `rule` to `spec.template.spec.containers[index].restartPolicyRules`, after the
    /// container's own rules (the kubelet uses the first rule that matches).
    AddContainerRestartRule {
        index: usize,
        container: String,
        rule: ContainerRestartRule,
    },
}

impl Change {
    /// Applies the change to a typed Job. The Job must have a spec and a pod template spec
    /// (the engine only builds changes for such Jobs).
    pub fn apply(&self, job: &mut Job) {
        let spec = job.spec.get_or_insert_with(Default::default);
        match self {
            Self::SetAnnotation { key, value } => {
                job.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(key.clone(), value.clone());
            }
            Self::SetTemplateAnnotation { key, value } => {
                spec.template
                    .metadata
                    .get_or_insert_with(Default::default)
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(key.clone(), value.clone());
            }
            Self::SetPodFailurePolicy(policy) => spec.pod_failure_policy = Some(policy.clone()),
            Self::PrependRules(rules) => {
                let policy = spec.pod_failure_policy.get_or_insert_with(Default::default);
                policy.rules.splice(0..0, rules.iter().cloned());
            }
            Self::SetPodReplacementPolicy(value) => {
                spec.pod_replacement_policy = Some(value.clone());
            }
            Self::SetActiveDeadlineSeconds(value) => spec.active_deadline_seconds = Some(*value),
            Self::SetRestartPolicy(value) => pod_spec(job).restart_policy = Some(value.clone()),
            Self::SetTerminationGracePeriod(value) => {
                pod_spec(job).termination_grace_period_seconds = Some(*value);
            }
            Self::SetTolerationSeconds { index, seconds } => {
                if let Some(toleration) = pod_spec(job)
                    .tolerations
                    .as_mut()
                    .and_then(|tolerations| tolerations.get_mut(*index))
                {
                    toleration.toleration_seconds = Some(*seconds);
                }
            }
            Self::AddToleration(toleration) => pod_spec(job)
                .tolerations
                .get_or_insert_with(Default::default)
                .push(toleration.clone()),
            Self::SetContainerRestartPolicy { index, value, .. } => {
                if let Some(container) = pod_spec(job).containers.get_mut(*index) {
                    container.restart_policy = Some(value.clone());
                }
            }
            Self::AddContainerRestartRule { index, rule, .. } => {
                if let Some(container) = pod_spec(job).containers.get_mut(*index) {
                    container
                        .restart_policy_rules
                        .get_or_insert_with(Default::default)
                        .push(rule.clone());
                }
            }
        }
    }

    /// A short description, for the `gpu-guard.io/mutated` annotation and audit logs.
    pub fn summary(&self) -> String {
        match self {
            Self::SetAnnotation { key, .. } => format!("annotation {key}"),
            Self::SetTemplateAnnotation { key, .. } => format!("pod annotation {key}"),
            Self::SetPodFailurePolicy(policy) => {
                format!("podFailurePolicy ({} rules)", policy.rules.len())
            }
            Self::PrependRules(rules) => format!("podFailurePolicy (+{} rules)", rules.len()),
            Self::SetPodReplacementPolicy(value) => format!("podReplacementPolicy={value}"),
            Self::SetRestartPolicy(value) => format!("restartPolicy={value}"),
            Self::SetTerminationGracePeriod(value) => {
                format!("terminationGracePeriodSeconds={value}")
            }
            Self::SetTolerationSeconds { index, seconds } => {
                format!("tolerations[{index}].tolerationSeconds={seconds}")
            }
            Self::AddToleration(toleration) => format!(
                "toleration {}={}s",
                toleration.key.as_deref().unwrap_or("*"),
                toleration.toleration_seconds.unwrap_or_default()
            ),
            Self::SetActiveDeadlineSeconds(value) => format!("activeDeadlineSeconds={value}"),
            Self::SetContainerRestartPolicy {
                container, value, ..
            } => format!("container {container} restartPolicy={value}"),
            Self::AddContainerRestartRule {
                container, rule, ..
            } => {
                let codes = rule
                    .exit_codes
                    .as_ref()
                    .and_then(|codes| codes.values.as_ref())
                    .map(|values| format!("{values:?}"))
                    .unwrap_or_default();
                format!(
                    "container {container} restart rule ({} on {codes})",
                    rule.action
                )
            }
        }
    }
}

fn pod_spec(job: &mut Job) -> &mut PodSpec {
    job.spec
        .get_or_insert_with(Default::default)
        .template
        .spec
        .get_or_insert_with(Default::default)
}
