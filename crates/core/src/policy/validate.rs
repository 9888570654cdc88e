//! The policy file's semantic rules: everything serde cannot check. Every problem is returned at
//! once, each with its field path, so a user fixes a file in one pass.

use std::collections::BTreeMap;

use super::{Guard, Policy, RuleAction};
use crate::api_rules::names::{
    dns_label_errors, dns_subdomain_errors, label_value_errors, qualified_name_errors,
};
use crate::field::FieldPath;
use crate::kinds::KINDS;
use crate::wellknown::{POLICY_API_VERSION as API_VERSION, POLICY_KIND as KIND};

/// The API server's limit on podFailurePolicy rules.
pub const MAX_RULES: usize = 20;

/// Exit codes that must never be retried without limit: 137 is SIGKILL (OOM kills, and sidecars
/// killed at shutdown) and 143 is SIGTERM (every container at pod shutdown).
const NEVER_IGNORED_EXIT_CODES: [i32; 2] = [137, 143];

/// Exit codes a container restart rule must never catch, each with why: ordinary crashes must
/// reach `backoffLimit`, and a container stopped at shutdown must not be started again.
const NEVER_RESTARTED_EXIT_CODES: [(i32, &str); 5] = [
    (1, "an ordinary crash (an uncaught exception)"),
    (134, "an abort (SIGABRT: a failed assertion)"),
    (
        137,
        "a kill (SIGKILL: an OOM kill, or a container killed at shutdown)",
    ),
    (139, "a segmentation fault (SIGSEGV)"),
    (
        143,
        "a shutdown (SIGTERM, sent to every container when the pod stops)",
    ),
];

/// The problems of one section of a policy, each with its field.
type Section = fn(&Policy) -> Vec<(FieldPath, String)>;

/// Every problem of `policy`, section by section, in the order of the file.
pub(super) fn validate(policy: &Policy) -> Vec<(FieldPath, String)> {
    let sections: [Section; 10] = [
        validate_header,
        validate_devices,
        validate_pod_condition_rules,
        validate_exit_code_rules,
        validate_rule_count,
        validate_grace_period,
        validate_readiness_tolerations,
        validate_active_deadline,
        validate_gang,
        validate_restart_rules,
    ];
    let mut problems: Vec<_> = sections
        .into_iter()
        .flat_map(|section| section(policy))
        .collect();
    problems.extend(super::avoid::validate_avoid(
        &policy.mutation.avoid_failed_nodes,
    ));
    problems.extend(validate_guard(&policy.guard));
    problems.extend(super::controller::validate_controller(&policy.controller));
    problems
}

/// `apiVersion` and `kind`.
fn validate_header(policy: &Policy) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    if policy.api_version != API_VERSION {
        report(
            FieldPath::new(["apiVersion"]),
            format!("must be {API_VERSION:?}, found {:?}", policy.api_version),
        );
    }
    if policy.kind != KIND {
        report(
            FieldPath::new(["kind"]),
            format!("must be {KIND:?}, found {:?}", policy.kind),
        );
    }
    problems
}

/// `devices`: something listed, and every name, prefix, class and driver well-formed.
fn validate_devices(policy: &Policy) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    let devices = FieldPath::new(["devices"]);
    let listed = &policy.devices;
    if listed.names.is_empty()
        && listed.prefixes.is_empty()
        && listed.classes.is_empty()
        && listed.class_prefixes.is_empty()
    {
        report(
            devices.clone(),
            "list at least one device resource in names or prefixes (e.g. nvidia.com/gpu) or \
             one DRA DeviceClass in classes or classPrefixes (e.g. gpu.nvidia.com)"
                .to_owned(),
        );
    }
    for (index, name) in policy.devices.names.iter().enumerate() {
        let errors = qualified_name_errors(name);
        if !errors.is_empty() || !name.contains('/') {
            report(
                devices.child("names").index(index),
                format!(
                    "{name:?} is not an extended resource name (a domain-prefixed name such as \
                     nvidia.com/gpu){}",
                    suffix(&errors)
                ),
            );
        }
    }
    for (index, prefix) in policy.devices.prefixes.iter().enumerate() {
        // A prefix is a resource name cut short: it must still have its domain and '/'.
        let probe = format!("{prefix}x");
        if !prefix.contains('/') || !qualified_name_errors(&probe).is_empty() {
            report(
                devices.child("prefixes").index(index),
                format!(
                    "{prefix:?} is not the start of an extended resource name (e.g. \
                     nvidia.com/mig-)"
                ),
            );
        }
    }

    for (index, class) in policy.devices.classes.iter().enumerate() {
        let errors = dns_subdomain_errors(class);
        if !errors.is_empty() {
            report(
                devices.child("classes").index(index),
                format!(
                    "{class:?} is not a DeviceClass name (a DNS subdomain such as \
                     gpu.nvidia.com){}",
                    suffix(&errors)
                ),
            );
        }
    }
    for (index, prefix) in policy.devices.class_prefixes.iter().enumerate() {
        if prefix.is_empty() || !dns_subdomain_errors(&format!("{prefix}x")).is_empty() {
            report(
                devices.child("classPrefixes").index(index),
                format!(
                    "{prefix:?} is not the start of a DeviceClass name (a DNS subdomain cut \
                     short, e.g. gpu.)"
                ),
            );
        }
    }

    for (index, driver) in policy.devices.drivers.iter().enumerate() {
        let errors = dns_subdomain_errors(driver);
        if !errors.is_empty() {
            report(
                devices.child("drivers").index(index),
                format!(
                    "{driver:?} is not a DRA driver name (a DNS subdomain such as \
                     gpu.nvidia.com){}",
                    suffix(&errors)
                ),
            );
        }
    }
    problems
}

/// `mutation.podFailurePolicy.podConditionRules`: valid condition types, no `FailIndex`, each
/// condition matched once.
fn validate_pod_condition_rules(policy: &Policy) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    let settings = &policy.mutation.pod_failure_policy;
    let pfp = FieldPath::new(["mutation", "podFailurePolicy"]);
    for (index, rule) in settings.pod_condition_rules.iter().enumerate() {
        let path = pfp.child("podConditionRules").index(index);
        let errors = qualified_name_errors(&rule.condition_type);
        if !errors.is_empty() {
            report(
                path.child("type"),
                format!(
                    "{:?} is not a valid condition type: {}",
                    rule.condition_type,
                    errors.join("; ")
                ),
            );
        }
        if rule.action == RuleAction::FailIndex {
            report(
                path.child("action"),
                fail_index_message("failIndexForPerIndexJobs applies to exit-code rules only"),
            );
        }
    }
    for (index, rule) in settings.pod_condition_rules.iter().enumerate() {
        let first = settings
            .pod_condition_rules
            .iter()
            .position(|other| {
                other.condition_type == rule.condition_type && other.status == rule.status
            })
            .unwrap_or(index);
        if first != index {
            report(
                pfp.child("podConditionRules").index(index),
                format!(
                    "condition {}={} is already matched by podConditionRules[{first}]",
                    rule.condition_type,
                    rule.status.as_str()
                ),
            );
        }
    }
    problems
}

/// `mutation.podFailurePolicy.exitCodeRules`: codes 1 to 255, each in one rule only, no
/// `FailIndex`, and never `Ignore` for the codes of killed and shut-down containers.
fn validate_exit_code_rules(policy: &Policy) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    let settings = &policy.mutation.pod_failure_policy;
    let pfp = FieldPath::new(["mutation", "podFailurePolicy"]);
    // Which rule first named each exit code, to refuse a code in two rules.
    let mut owner: BTreeMap<i32, usize> = BTreeMap::new();
    for (index, rule) in settings.exit_code_rules.iter().enumerate() {
        let path = pfp.child("exitCodeRules").index(index);
        if rule.codes.is_empty() {
            report(
                path.child("codes"),
                "list at least one exit code (1 to 255)".to_owned(),
            );
        }
        if rule.action == RuleAction::FailIndex {
            report(
                path.child("action"),
                fail_index_message(
                    "use FailJob with failIndexForPerIndexJobs: true, which becomes FailIndex \
                     on Jobs that set backoffLimitPerIndex",
                ),
            );
        }
        for (position, &code) in rule.codes.iter().enumerate() {
            let code_path = path.child("codes").index(position);
            if !(1..=255).contains(&code) {
                report(
                    code_path,
                    format!(
                        "invalid exit code {code}: exit codes are 1 to 255 (0 is success and \
                         never matches an In rule)"
                    ),
                );
                continue;
            }
            if rule.action == RuleAction::Ignore && NEVER_IGNORED_EXIT_CODES.contains(&code) {
                report(
                    code_path.clone(),
                    format!(
                        "exit code {code} must not be ignored: it is what OOM-killed and \
                         shut-down containers exit with, and Ignore retries without limit"
                    ),
                );
            }
            match owner.get(&code) {
                Some(&first) if first == index => report(
                    code_path,
                    format!("duplicate exit code {code}; list it once"),
                ),
                Some(&first) => report(
                    code_path,
                    format!(
                        "exit code {code} is already in exitCodeRules[{first}]; a code can have \
                         one action only"
                    ),
                ),
                None => {
                    owner.insert(code, index);
                }
            }
        }
    }
    problems
}

/// `mutation.podFailurePolicy` as a whole: the smallest policy it injects fits the API server's
/// limit on rules.
fn validate_rule_count(policy: &Policy) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    let settings = &policy.mutation.pod_failure_policy;
    // The smallest policy gpu-guard can inject: every condition rule plus one container-less
    // rule per exit-code rule (the fallback when per-container rules do not fit).
    let minimum_rules = settings.pod_condition_rules.len() + settings.exit_code_rules.len();
    if minimum_rules > MAX_RULES {
        report(
            FieldPath::new(["mutation", "podFailurePolicy"]),
            format!(
                "the policy needs at least {minimum_rules} rules, more than the {MAX_RULES} the \
                 API server allows in a podFailurePolicy; merge exit-code rules with the same \
                 action or drop condition rules"
            ),
        );
    }
    problems
}

/// `mutation.terminationGracePeriod`: a window from 0 up.
fn validate_grace_period(policy: &Policy) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    let grace = &policy.mutation.termination_grace_period;
    let grace_path = FieldPath::new(["mutation", "terminationGracePeriod"]);
    if grace.minimum_seconds < 0 {
        report(
            grace_path.child("minimumSeconds"),
            "must be 0 or more".to_owned(),
        );
    }
    if grace.maximum_seconds < grace.minimum_seconds {
        report(
            grace_path.child("maximumSeconds"),
            format!(
                "must be at least minimumSeconds ({}), found {}",
                grace.minimum_seconds, grace.maximum_seconds
            ),
        );
    }
    problems
}

/// `mutation.nodeReadinessTolerations`: no negative seconds.
fn validate_readiness_tolerations(policy: &Policy) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    let tolerations = &policy.mutation.node_readiness_tolerations;
    let tolerations_path = FieldPath::new(["mutation", "nodeReadinessTolerations"]);
    for (field, value) in [
        ("notReadySeconds", tolerations.not_ready_seconds),
        ("unreachableSeconds", tolerations.unreachable_seconds),
    ] {
        if value < 0 {
            report(
                tolerations_path.child(field),
                format!("must be 0 or more, found {value}"),
            );
        }
    }
    problems
}

/// `mutation.activeDeadlineSeconds`: at least 1 when set.
fn validate_active_deadline(policy: &Policy) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    if let Some(deadline) = policy.mutation.active_deadline_seconds
        && deadline < 1
    {
        report(
            FieldPath::new(["mutation", "activeDeadlineSeconds"]),
            format!("must be at least 1 (or left out), found {deadline}"),
        );
    }
    problems
}

/// `mutation.gang.deviceRestarts`: 1 to 1000.
fn validate_gang(policy: &Policy) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    let restarts = policy.mutation.gang.device_restarts;
    if !(1..=1000).contains(&restarts) {
        report(
            FieldPath::new(["mutation", "gang", "deviceRestarts"]),
            format!("must be between 1 and 1000, found {restarts}"),
        );
    }
    problems
}

/// `mutation.restartRules`, when enabled: its codes restart a container in place, which hides
/// the exit from the podFailurePolicy, so they must be disjoint from every code the failure
/// policy names (device codes, FailJob codes, any exit-code rule) and from ordinary crashes.
fn validate_restart_rules(policy: &Policy) -> Vec<(FieldPath, String)> {
    let settings = &policy.mutation.restart_rules;
    let mut problems = Vec::new();
    if !settings.enabled {
        return problems;
    }
    let path = FieldPath::new(["mutation", "restartRules", "exitCodes"]);
    if settings.exit_codes.is_empty() {
        problems.push((
            path.clone(),
            "list at least one exit code (1 to 255), e.g. [70, 140]".to_owned(),
        ));
    }
    let failure_rules = &policy.mutation.pod_failure_policy.exit_code_rules;
    for (position, &code) in settings.exit_codes.iter().enumerate() {
        let code_path = path.index(position);
        if !(1..=255).contains(&code) {
            problems.push((
                code_path,
                format!(
                    "invalid exit code {code}: exit codes are 1 to 255 (0 is success: \
                     restarting on it would run the container for ever)"
                ),
            ));
            continue;
        }
        if let Some((_, what)) = NEVER_RESTARTED_EXIT_CODES
            .iter()
            .find(|(never, _)| *never == code)
        {
            problems.push((
                code_path,
                format!(
                    "exit code {code} must not be restarted in place: it is {what}, which must \
                     fail the pod and count against backoffLimit"
                ),
            ));
            continue;
        }
        if let Some((index, rule)) = failure_rules
            .iter()
            .enumerate()
            .find(|(_, rule)| rule.codes.contains(&code))
        {
            problems.push((
                code_path,
                format!(
                    "exit code {code} is in mutation.podFailurePolicy.exitCodeRules[{index}] \
                     ({}): a restart rule would restart the container in place on it, and \
                     the podFailurePolicy would never see it; use another code",
                    rule.action.as_str()
                ),
            ));
            continue;
        }
        if settings.exit_codes[..position].contains(&code) {
            problems.push((
                code_path,
                format!("duplicate exit code {code}; list it once"),
            ));
        }
    }
    problems
}

/// The kinds an exempt workload can name: the built-in kinds the guard judges.
fn exemptible_kinds() -> impl Iterator<Item = &'static str> {
    KINDS
        .iter()
        .filter(|kind| kind.built_in && kind.guarded)
        .map(|kind| kind.kind)
}

fn validate_guard(guard: &Guard) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let mut report = |path: FieldPath, message: String| problems.push((path, message));
    let root = FieldPath::new(["guard"]);
    let mut namespace = |path: FieldPath, name: &str| {
        let errors = dns_label_errors(name);
        if !errors.is_empty() {
            report(
                path,
                format!("{name:?} is not a namespace name: {}", errors.join("; ")),
            );
        }
    };
    for name in guard.namespace_modes.keys() {
        namespace(root.child("namespaceModes").key(name), name);
    }
    for (index, name) in guard.exemptions.namespaces.iter().enumerate() {
        namespace(
            root.child("exemptions").child("namespaces").index(index),
            name,
        );
    }
    for (index, workload) in guard.exemptions.workloads.iter().enumerate() {
        namespace(
            root.child("exemptions")
                .child("workloads")
                .index(index)
                .child("namespace"),
            &workload.namespace,
        );
    }
    for (index, workload) in guard.exemptions.workloads.iter().enumerate() {
        let path = root.child("exemptions").child("workloads").index(index);
        if !dns_subdomain_errors(&workload.name).is_empty() || workload.name.is_empty() {
            report(
                path.child("name"),
                format!(
                    "{:?} is not an object name (a lowercase RFC 1123 subdomain)",
                    workload.name
                ),
            );
        }
        if let Some(kind) = &workload.kind
            && !exemptible_kinds().any(|known| known == kind)
        {
            report(
                path.child("kind"),
                format!(
                    "{kind:?} is not a kind the guard judges; use one of {}",
                    exemptible_kinds().collect::<Vec<_>>().join(", ")
                ),
            );
        }
    }
    if guard.gpu_node_taint_effects.is_empty() {
        report(
            root.child("gpuNodeTaintEffects"),
            "list the effects of the GPU node taints (usually [NoSchedule])".to_owned(),
        );
    }
    for (index, taint) in guard.gpu_node_taints.iter().enumerate() {
        let errors = qualified_name_errors(taint);
        if !errors.is_empty() {
            report(
                root.child("gpuNodeTaints").index(index),
                format!("{taint:?} is not a taint key: {}", errors.join("; ")),
            );
        }
    }
    for (index, label) in guard.gpu_node_labels.iter().enumerate() {
        let path = root.child("gpuNodeLabels").index(index);
        let errors = qualified_name_errors(&label.key);
        if !errors.is_empty() {
            report(
                path.child("key"),
                format!("{:?} is not a label key: {}", label.key, errors.join("; ")),
            );
        }
        for (at, value) in label.values.iter().enumerate() {
            let errors = label_value_errors(value);
            if !errors.is_empty() {
                report(
                    path.child("values").index(at),
                    format!("{value:?}: {}", errors.join("; ")),
                );
            }
        }
    }
    let offline = root.child("offline");
    let mut seen = BTreeMap::new();
    let mut defaults = Vec::new();
    for (index, class) in guard.offline.priority_classes.iter().enumerate() {
        let path = offline.child("priorityClasses").index(index);
        if class.name.is_empty() || !dns_subdomain_errors(&class.name).is_empty() {
            report(
                path.child("name"),
                format!(
                    "{:?} is not a PriorityClass name (a lowercase RFC 1123 subdomain)",
                    class.name
                ),
            );
        }
        if let Some(first) = seen.insert(class.name.as_str(), index) {
            report(
                path.child("name"),
                format!(
                    "PriorityClass {:?} is already listed at priorityClasses[{first}]",
                    class.name
                ),
            );
        }
        if class.global_default {
            defaults.push(class.name.as_str());
            if defaults.len() > 1 {
                report(
                    path.child("globalDefault"),
                    format!(
                        "only one PriorityClass can be the global default; {:?} already is",
                        defaults[0]
                    ),
                );
            }
        }
    }
    for (index, node) in guard.offline.gpu_nodes.iter().enumerate() {
        if node.is_empty() || !dns_subdomain_errors(node).is_empty() {
            report(
                offline.child("gpuNodes").index(index),
                format!("{node:?} is not a node name (a lowercase RFC 1123 subdomain)"),
            );
        }
    }
    problems
}

fn fail_index_message(hint: &str) -> String {
    format!("FailIndex is only valid on Jobs with backoffLimitPerIndex; {hint}")
}

fn suffix(errors: &[String]) -> String {
    if errors.is_empty() {
        String::new()
    } else {
        format!(": {}", errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{ConditionStatus, ExitCodeRule, PodConditionRule};

    fn fields(policy: &Policy) -> Vec<String> {
        validate(policy)
            .into_iter()
            .map(|(path, _)| path.to_string())
            .collect()
    }

    #[test]
    fn the_defaults_are_valid() {
        assert!(validate(&Policy::default()).is_empty());
    }

    /// An exemption names a kind the guard judges (read from the kind registry); anything else
    /// is refused with the list to choose from.
    #[test]
    fn an_exempt_workload_names_a_kind_the_guard_judges() {
        let mut policy = Policy::default();
        for kind in ["DaemonSet", "Pod", "CronJob", "Deployment"] {
            policy.guard.exemptions.workloads = vec![crate::policy::ExemptWorkload {
                namespace: "gpu-operator".to_owned(),
                name: "agent".to_owned(),
                kind: Some(kind.to_owned()),
            }];
            assert!(fields(&policy).is_empty(), "{kind} is judged");
        }
        policy.guard.exemptions.workloads[0].kind = Some("Daemonset".to_owned());
        let problems = validate(&policy);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let (path, message) = &problems[0];
        assert_eq!(path.to_string(), "guard.exemptions.workloads[0].kind");
        assert_eq!(
            message,
            "\"Daemonset\" is not a kind the guard judges; use one of Pod, \
             ReplicationController, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob"
        );
    }

    #[test]
    fn exit_codes_are_checked() {
        let mut policy = Policy::default();
        policy.mutation.pod_failure_policy.exit_code_rules = vec![
            ExitCodeRule {
                action: RuleAction::Ignore,
                codes: vec![0, 74, 256, 137],
            },
            ExitCodeRule {
                action: RuleAction::FailJob,
                codes: vec![74],
            },
            ExitCodeRule {
                action: RuleAction::FailIndex,
                codes: vec![],
            },
        ];
        let base = "mutation.podFailurePolicy.exitCodeRules";
        assert_eq!(
            fields(&policy),
            vec![
                format!("{base}[0].codes[0]"),
                format!("{base}[0].codes[2]"),
                format!("{base}[0].codes[3]"),
                format!("{base}[1].codes[0]"),
                format!("{base}[2].codes"),
                format!("{base}[2].action"),
            ]
        );
    }

    #[test]
    fn restart_rule_codes_are_checked_only_when_enabled() {
        let mut policy = Policy::default();
        policy.mutation.restart_rules.exit_codes = vec![74, 0, 137, 70, 70, 127];
        assert!(
            fields(&policy).is_empty(),
            "a disabled section is not judged"
        );
        policy.mutation.restart_rules.enabled = true;
        policy
            .mutation
            .pod_failure_policy
            .exit_code_rules
            .push(ExitCodeRule {
                action: RuleAction::FailJob,
                codes: vec![126, 127],
            });
        let base = "mutation.restartRules.exitCodes";
        let found = validate(&policy);
        let summary: Vec<(String, &str)> = found
            .iter()
            .map(|(path, message)| (path.to_string(), message.as_str()))
            .collect();
        let expect = |index: usize, words: &str| {
            let (path, message) = &summary
                .iter()
                .find(|(path, _)| *path == format!("{base}[{index}]"))
                .unwrap_or_else(|| panic!("no problem at [{index}]: {summary:?}"));
            assert!(message.contains(words), "{path}: {message}");
        };
        assert_eq!(summary.len(), 5, "{summary:?}");
        expect(0, "exitCodeRules[0] (Ignore)");
        expect(1, "0 is success");
        expect(2, "OOM kill");
        expect(4, "duplicate exit code 70");
        expect(5, "exitCodeRules[1] (FailJob)");

        policy.mutation.restart_rules.exit_codes.clear();
        assert_eq!(fields(&policy), vec![base]);
    }

    #[test]
    fn the_rule_budget_is_checked() {
        let mut policy = Policy::default();
        policy.mutation.pod_failure_policy.pod_condition_rules = (0..20)
            .map(|i| PodConditionRule {
                condition_type: format!("example.com/C{i}"),
                status: ConditionStatus::True,
                action: RuleAction::Ignore,
            })
            .collect();
        assert_eq!(fields(&policy), vec!["mutation.podFailurePolicy"]);
    }

    #[test]
    fn names_and_bounds_are_checked() {
        let mut policy = Policy::default();
        policy.devices.names = vec!["gpu".to_owned()];
        policy.devices.prefixes = vec!["nvidia.com/".to_owned(), "mig-".to_owned()];
        policy.mutation.pod_failure_policy.pod_condition_rules[0].condition_type =
            "Not/Valid/Type".to_owned();
        policy.mutation.termination_grace_period.maximum_seconds = 10;
        policy
            .mutation
            .node_readiness_tolerations
            .unreachable_seconds = -1;
        policy.mutation.active_deadline_seconds = Some(0);
        policy.api_version = "v1".to_owned();
        assert_eq!(
            fields(&policy),
            vec![
                "apiVersion",
                "devices.names[0]",
                "devices.prefixes[1]",
                "mutation.podFailurePolicy.podConditionRules[0].type",
                "mutation.terminationGracePeriod.maximumSeconds",
                "mutation.nodeReadinessTolerations.unreachableSeconds",
                "mutation.activeDeadlineSeconds",
            ]
        );
    }

    #[test]
    fn the_guard_section_is_checked() {
        let text = r#"
guard:
  namespaceModes: {Research: Warn}
  gpuNodeTaints: ["nvidia.com/"]
  gpuNodeLabels:
    - key: node.kubernetes.io/instance-type
      values: ["p4d 24xlarge"]
  exemptions:
    workloads:
      - {namespace: kube-system, name: nvidia-device-plugin, kind: Daemonset}
  offline:
    priorityClasses:
      - {name: high, value: 1000000, globalDefault: true}
      - {name: high, value: 10, globalDefault: true}
    gpuNodes: ["GPU_1"]
"#;
        let policy: Policy = serde_norway::from_str(text).unwrap();
        assert_eq!(
            fields(&policy),
            [
                "guard.namespaceModes[Research]",
                "guard.exemptions.workloads[0].kind",
                "guard.gpuNodeTaints[0]",
                "guard.gpuNodeLabels[0].values[0]",
                "guard.offline.priorityClasses[1].name",
                "guard.offline.priorityClasses[1].globalDefault",
                "guard.offline.gpuNodes[0]",
            ]
        );
    }
}
