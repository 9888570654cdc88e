//! The API server's validation of container restart rules (KEP-5307 `restartPolicyRules`, and
//! the `RestartAllContainers` action of KEP-5532), as a plain function over a pod spec, with the
//! API server's field paths and messages.
//!
//! Sources:
//! - the types: `staging/src/k8s.io/api/core/v1/types.go` as published in k8s.io/api v0.36.3
//!   (Kubernetes 1.36.3): `Container.RestartPolicyRules` (L3007-3021: "At most 20 rules",
//!   "container MUST set RestartPolicy explicitly", `+listType=atomic`), `ContainerRestartRule`
//!   and its actions `Restart` and `RestartAllContainers` (L3688-3710),
//!   `ContainerRestartRuleOnExitCodes` (L3712-3729: "At most 255 elements", `+listType=set`)
//!   and its operators `In` and `NotIn` (L3731-3738). k8s-openapi 0.29 `v1_36`
//!   (`api/core/v1/container_restart_rule*.rs`) has the same fields.
//! - the validation: `pkg/apis/core/validation/validation.go`, functions
//!   `validateContainerRestartPolicy` (regular containers, through `validateContainers`, when
//!   the `ContainerRestartRules` gate is on) and `validateInitContainerRestartPolicy` (init
//!   containers, sidecars included when the `RestartAllContainersOnContainerExits` gate is on).
//!   Read from a kubernetes source tree of the 1.35/1.36 line (it has both gates); the tagged
//!   1.36 file was not reachable from here, and no real apiserver has yet answered these cases
//!   (`crates/core/tests/fixtures/apiserver-cases/` has none), so the messages are the source's, unchecked.
//!
//! Feature gates: `ContainerRestartRules` is beta and on by default since 1.35 (the Kubernetes
//! feature-gate page); `RestartAllContainersOnContainerExits` was alpha (off) in 1.35 and is
//! beta in 1.36 (KEP-5532 `kep.yaml`). This checker models a 1.36 API server with both on: it
//! accepts `RestartAllContainers`, which a server with the gate off refuses ("Unsupported
//! value"); gpu-guard only writes that action when the policy asks for it.
//!
//! What the API server does NOT check here, unlike a podFailurePolicy's `onExitCodes`: the
//! values need not be sorted, unique, non-empty, or free of 0. gpu-guard writes them sorted,
//! unique and without 0 anyway.

use k8s_openapi::api::core::v1::{Container, ContainerRestartRule, PodSpec};

use crate::field::{FieldPath, Violation};

/// At most this many rules in one container's `restartPolicyRules`.
pub const MAX_RESTART_RULES: usize = 20;
/// At most this many values in one rule's `exitCodes.values`.
pub const MAX_RESTART_EXIT_CODES: usize = 255;

/// The action that restarts the container that exited.
pub const RESTART: &str = "Restart";
/// The action that restarts every container of the pod, init containers again first (KEP-5532).
pub const RESTART_ALL_CONTAINERS: &str = "RestartAllContainers";

// `sets.List` sorts the supported values in the API server's messages.
const POLICIES: [&str; 3] = ["Always", "Never", "OnFailure"];
const ACTIONS: [&str; 2] = [RESTART, RESTART_ALL_CONTAINERS];
const OPERATORS: [&str; 2] = ["In", "NotIn"];

/// Every violation of the container restart-rule validation in a pod spec at `path`
/// (`spec.template.spec` in a Job): regular containers first, then init containers, as
/// `ValidatePodSpec` validates them. Empty when the API server would accept them.
pub fn check_restart_rules(pod: &PodSpec, path: &FieldPath) -> Vec<Violation> {
    let mut violations = Vec::new();
    let containers_path = path.child("containers");
    for (index, container) in pod.containers.iter().enumerate() {
        check_container(container, &containers_path.index(index), &mut violations);
    }
    let init_path = path.child("initContainers");
    for (index, container) in pod.init_containers.iter().flatten().enumerate() {
        // `validateInitContainerRestartPolicy`: without a restartPolicy only the missing
        // policy is reported, the rules themselves are not looked at.
        if container.restart_policy.is_none() {
            if has_rules(container) {
                violations.push(policy_required(&init_path.index(index)));
            }
            continue;
        }
        check_container(container, &init_path.index(index), &mut violations);
    }
    violations
}

fn has_rules(container: &Container) -> bool {
    container
        .restart_policy_rules
        .as_ref()
        .is_some_and(|rules| !rules.is_empty())
}

fn policy_required(path: &FieldPath) -> Violation {
    Violation::required(
        path.child("restartPolicy"),
        "must specify restartPolicy when restart rules are used",
    )
}

/// `validateContainerRestartPolicy` for one container at `path`.
fn check_container(container: &Container, path: &FieldPath, violations: &mut Vec<Violation>) {
    match container.restart_policy.as_deref() {
        None if !has_rules(container) => return,
        None => violations.push(policy_required(path)),
        Some(policy) if !POLICIES.contains(&policy) => violations.push(Violation::not_supported(
            path.child("restartPolicy"),
            policy,
            &POLICIES,
        )),
        Some(_) => {}
    }
    let rules = container
        .restart_policy_rules
        .as_deref()
        .unwrap_or_default();
    let rules_path = path.child("restartPolicyRules");
    if rules.len() > MAX_RESTART_RULES {
        violations.push(Violation::too_many(
            rules_path.clone(),
            rules.len(),
            MAX_RESTART_RULES,
        ));
    }
    for (index, rule) in rules.iter().enumerate() {
        check_rule(rule, &rules_path.index(index), violations);
    }
}

fn check_rule(rule: &ContainerRestartRule, path: &FieldPath, violations: &mut Vec<Violation>) {
    if !ACTIONS.contains(&rule.action.as_str()) {
        violations.push(Violation::not_supported(
            path.child("action"),
            &rule.action,
            &ACTIONS,
        ));
    }
    let Some(exit_codes) = &rule.exit_codes else {
        violations.push(Violation::required(
            path.child("exitCodes"),
            "must be specified",
        ));
        return;
    };
    let codes_path = path.child("exitCodes");
    if !OPERATORS.contains(&exit_codes.operator.as_str()) {
        violations.push(Violation::not_supported(
            codes_path.child("operator"),
            &exit_codes.operator,
            &OPERATORS,
        ));
    }
    let values = exit_codes.values.as_deref().unwrap_or_default();
    if values.len() > MAX_RESTART_EXIT_CODES {
        violations.push(Violation::too_many(
            codes_path.child("values"),
            values.len(),
            MAX_RESTART_EXIT_CODES,
        ));
    }
}

/// Whether a restart rule matches a container exit code (`In`: the code is listed; `NotIn`: it
/// is not). The kubelet evaluates a container's rules in order and the first match acts.
pub fn rule_matches(rule: &ContainerRestartRule, code: i32) -> bool {
    let Some(exit_codes) = &rule.exit_codes else {
        return false;
    };
    let listed = exit_codes
        .values
        .iter()
        .flatten()
        .any(|&value| value == code);
    match exit_codes.operator.as_str() {
        "In" => listed,
        "NotIn" => !listed,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(pod: serde_json::Value) -> Vec<String> {
        let pod: PodSpec = serde_json::from_value(pod).unwrap();
        check_restart_rules(&pod, &FieldPath::new(["spec", "template", "spec"]))
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn restart_on(values: serde_json::Value) -> serde_json::Value {
        json!({"action": "Restart", "exitCodes": {"operator": "In", "values": values}})
    }

    #[test]
    fn valid_rules_have_no_violations() {
        let rules = json!([
            restart_on(json!([70, 140])),
            {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0, 1]}},
            // Not sorted, with a duplicate and a 0: the API server does not mind.
            restart_on(json!([9, 0, 9])),
        ]);
        assert!(
            messages(json!({"restartPolicy": "Never", "containers": [
                {"name": "main", "restartPolicy": "Never", "restartPolicyRules": rules},
                {"name": "plain"},
            ], "initContainers": [
                {"name": "setup", "restartPolicy": "Never", "restartPolicyRules": [restart_on(json!([3]))]},
                {"name": "sidecar", "restartPolicy": "Always", "restartPolicyRules": [restart_on(json!([3]))]},
            ]}))
            .is_empty()
        );
    }

    #[test]
    fn table_of_violations() {
        let base = "spec.template.spec.containers[0]";
        let cases = [
            (
                json!({"name": "main", "restartPolicyRules": [restart_on(json!([70]))]}),
                vec![format!(
                    "{base}.restartPolicy: Required value: must specify restartPolicy when \
                     restart rules are used"
                )],
            ),
            (
                json!({"name": "main", "restartPolicy": "Sometimes"}),
                vec![format!(
                    r#"{base}.restartPolicy: Unsupported value: "Sometimes": supported values: "Always", "Never", "OnFailure""#
                )],
            ),
            (
                json!({"name": "main", "restartPolicy": "Never",
                       "restartPolicyRules": vec![restart_on(json!([70])); 21]}),
                vec![format!(
                    "{base}.restartPolicyRules: Too many: 21: must have at most 20 items"
                )],
            ),
            (
                json!({"name": "main", "restartPolicy": "Never", "restartPolicyRules": [
                    {"action": "Terminate", "exitCodes": {"operator": "Equals", "values": [1]}},
                    {"action": "Restart"},
                    restart_on(json!((0..256).collect::<Vec<i32>>())),
                ]}),
                vec![
                    format!(
                        r#"{base}.restartPolicyRules[0].action: Unsupported value: "Terminate": supported values: "Restart", "RestartAllContainers""#
                    ),
                    format!(
                        r#"{base}.restartPolicyRules[0].exitCodes.operator: Unsupported value: "Equals": supported values: "In", "NotIn""#
                    ),
                    format!(
                        "{base}.restartPolicyRules[1].exitCodes: Required value: must be specified"
                    ),
                    format!(
                        "{base}.restartPolicyRules[2].exitCodes.values: Too many: 256: must have \
                         at most 255 items"
                    ),
                ],
            ),
        ];
        for (container, expected) in cases {
            assert_eq!(
                messages(json!({"restartPolicy": "Never", "containers": [container]})),
                expected
            );
        }
    }

    #[test]
    fn an_init_container_without_a_policy_gets_only_the_missing_policy_reported() {
        assert_eq!(
            messages(json!({"containers": [{"name": "main"}], "initContainers": [
                {"name": "setup", "restartPolicyRules": [{"action": "Explode"}]},
            ]})),
            vec![
                "spec.template.spec.initContainers[0].restartPolicy: Required value: must \
                 specify restartPolicy when restart rules are used"
            ]
        );
    }

    #[test]
    fn rules_match_like_the_kubelet() {
        let rule = |operator: &str| -> ContainerRestartRule {
            serde_json::from_value(
                json!({"action": "Restart", "exitCodes": {"operator": operator, "values": [70]}}),
            )
            .unwrap()
        };
        assert!(rule_matches(&rule("In"), 70));
        assert!(!rule_matches(&rule("In"), 74));
        assert!(rule_matches(&rule("NotIn"), 74));
        assert!(!rule_matches(&rule("NotIn"), 70));
        assert!(!rule_matches(&rule("Sometimes"), 70));
    }
}
