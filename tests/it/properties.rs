//! Property tests of the mutation engine and the patch layer on random `batch/v1` Jobs.
//!
//! The generators build Jobs the way users write them: 1-4 containers and 0-3 init containers
//! (some native sidecars) that request or limit GPUs, MIG slices or only CPU; an optional
//! podFailurePolicy of their own (up to 19 rules); node tolerations; grace period, restart and
//! replacement policies; Indexed Jobs with `backoffLimitPerIndex`; and the skip/inject
//! annotations and labels; regular containers with a `restartPolicy` and restart rules of their
//! own (`In`/`NotIn`, sometimes at the 20-rule limit). Each case runs under one of four
//! policies: the embedded default (Merge), a strict variant (Replace, OnFailure converted to
//! Never, FailJob on 126/127), a Keep variant that also sets `activeDeadlineSeconds`, and the
//! shipped in-place restart profile (restart rules for 70 and 140).
//!
//! `generated_jobs_exercise_every_kind_of_change` checks that the generators are not trivial:
//! most device Jobs get changed, and every kind of change and fallback shows up.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::LazyLock;

use gpu_guard_core::api_rules::job::check_job;
use gpu_guard_core::devices::NoDraFacts;
use gpu_guard_core::mutate::object::{MutableKind, mutate_object};
use gpu_guard_core::mutate::patch::{self, CRON_JOB_TEMPLATE_ROOT, JOB_ROOT};
use gpu_guard_core::mutate::pod_settings::{NOT_READY_TAINT, UNREACHABLE_TAINT};
use gpu_guard_core::mutate::{Change, Outcome, mutate_job};
use gpu_guard_core::policy::{
    ExistingPolicy, ExitCodeRule, OnFailureRestartPolicy, PodReplacementPolicy, Policy, RuleAction,
};
use gpu_guard_core::wellknown::MUTATED_ANNOTATION;
use gpu_guard_webhook::admission::MAX_WARNING_CHARS;
use json_patch::PatchOperation;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Toleration;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::{Map, Value, json};

/// Cases per property; `PROPTEST_CASES` raises it for a longer run.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256)
}

// ---------------------------------------------------------------------------------------------
// Policies

static EMBEDDED: LazyLock<Policy> = LazyLock::new(Policy::embedded);

/// Replace the Job's own rules, convert OnFailure to Never, and fail the Job on 126/127.
static STRICT_REPLACE: LazyLock<Policy> = LazyLock::new(|| {
    let mut policy = Policy::embedded();
    let settings = &mut policy.mutation.pod_failure_policy;
    settings.existing_policy = ExistingPolicy::Replace;
    settings.on_failure_restart_policy = OnFailureRestartPolicy::ConvertToNever;
    settings.exit_code_rules.push(ExitCodeRule {
        action: RuleAction::FailJob,
        codes: vec![126, 127],
    });
    policy
});

/// Keep the Job's own rules, touch podReplacementPolicy only where required, and bound the
/// retries with an activeDeadlineSeconds.
static KEEP_WITH_DEADLINE: LazyLock<Policy> = LazyLock::new(|| {
    let mut policy = Policy::embedded();
    let settings = &mut policy.mutation.pod_failure_policy;
    settings.existing_policy = ExistingPolicy::Keep;
    settings.pod_replacement_policy = PodReplacementPolicy::Unchanged;
    policy.mutation.active_deadline_seconds = Some(604_800);
    policy
});

/// The shipped profile `policies/in-place-restart.yaml`: the default plus restart rules.
static IN_PLACE_RESTART: LazyLock<Policy> = LazyLock::new(|| {
    gpu_guard_core::policy::parse(
        include_str!("../../policies/in-place-restart.yaml"),
        "policies/in-place-restart.yaml",
    )
    .expect("the shipped profile is valid")
});

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PolicyKind {
    Embedded,
    StrictReplace,
    KeepWithDeadline,
    InPlaceRestart,
}

impl PolicyKind {
    fn policy(self) -> &'static Policy {
        match self {
            Self::Embedded => &EMBEDDED,
            Self::StrictReplace => &STRICT_REPLACE,
            Self::KeepWithDeadline => &KEEP_WITH_DEADLINE,
            Self::InPlaceRestart => &IN_PLACE_RESTART,
        }
    }
}

fn policy_kind() -> impl Strategy<Value = PolicyKind> {
    prop_oneof![
        2 => Just(PolicyKind::Embedded),
        2 => Just(PolicyKind::StrictReplace),
        1 => Just(PolicyKind::KeepWithDeadline),
        2 => Just(PolicyKind::InPlaceRestart),
    ]
}

// ---------------------------------------------------------------------------------------------
// Generators

/// Distinct DNS labels; containers and init containers take distinct names from a shuffle.
const NAMES: [&str; 9] = [
    "main", "trainer", "worker-0", "metrics", "loader", "warmup", "sidecar", "proxy", "a",
];
const RESOURCES: [&str; 4] = [
    "nvidia.com/gpu",
    "amd.com/gpu",
    "nvidia.com/mig-1g.5gb",
    "cpu",
];
const CONDITION_TYPES: [&str; 3] = [
    "DisruptionTarget",
    "gpu-guard.io/DeviceFailure",
    "example.com/Xid",
];

/// What one container asks of a resource.
#[derive(Clone, Copy, Debug)]
enum Usage {
    Nothing,
    Request(&'static str),
    Limit(&'static str),
    Both(&'static str),
}

impl Usage {
    fn resources(self) -> Option<Value> {
        let quantity = |resource: &str| if resource == "cpu" { "500m" } else { "1" };
        let one = |resource: &str| json!({ resource: quantity(resource) });
        match self {
            Self::Nothing => None,
            Self::Request(r) => Some(json!({"requests": one(r)})),
            Self::Limit(r) => Some(json!({"limits": one(r)})),
            Self::Both(r) => Some(json!({"requests": one(r), "limits": one(r)})),
        }
    }
}

fn usage() -> impl Strategy<Value = Usage> {
    let resource = || prop::sample::select(&RESOURCES[..]);
    prop_oneof![
        1 => Just(Usage::Nothing),
        2 => resource().prop_map(Usage::Request),
        2 => resource().prop_map(Usage::Limit),
        1 => resource().prop_map(Usage::Both),
    ]
}

#[derive(Clone, Debug)]
enum Matcher {
    ExitCodes {
        not_in: bool,
        values: BTreeSet<i32>,
        container: Option<Index>,
    },
    Conditions(Vec<(&'static str, &'static str)>),
}

#[derive(Clone, Debug)]
struct RuleGen {
    action: &'static str,
    matcher: Matcher,
}

fn exit_code() -> impl Strategy<Value = i32> {
    prop_oneof![
        // The codes the policies care about, and the ones they must never touch.
        3 => prop::sample::select(&[1, 70, 74, 75, 126, 127, 137, 138, 140, 143][..]),
        2 => 0..=255i32,
    ]
}

fn rule() -> impl Strategy<Value = RuleGen> {
    // `NotIn` rarely: one decides every device code it does not list, so a Job with many of
    // them would leave gpu-guard no exit-code rule to add, and the fallbacks for a full
    // policy would never run.
    let exit_codes = (
        prop::bool::weighted(0.15),
        prop::collection::btree_set(exit_code(), 1..=5),
        prop::option::of(any::<Index>()),
    )
        .prop_map(|(not_in, values, container)| Matcher::ExitCodes {
            not_in,
            values,
            container,
        });
    let conditions = prop::collection::vec(
        (
            prop::sample::select(&CONDITION_TYPES[..]),
            prop::sample::select(&["True", "False"][..]),
        ),
        1..=2,
    )
    .prop_map(Matcher::Conditions);
    (
        prop::sample::select(&["FailJob", "Ignore", "Count", "FailIndex"][..]),
        prop_oneof![2 => exit_codes, 1 => conditions],
    )
        .prop_map(|(action, matcher)| RuleGen { action, matcher })
}

/// A Job's own podFailurePolicy rules: mostly a few, sometimes close to the 20-rule limit.
fn own_rules() -> impl Strategy<Value = Vec<RuleGen>> {
    prop_oneof![
        2 => prop::collection::vec(rule(), 0..=5),
        1 => prop::collection::vec(rule(), 6..=14),
        1 => prop::collection::vec(rule(), 15..=19),
    ]
}

/// A regular container's own restart settings: its `restartPolicy` and restart rules
/// (`(NotIn, values)`; a rule without a policy is an invalid input, only made when lax).
#[derive(Clone, Debug)]
struct ContainerRestart {
    policy: Option<&'static str>,
    rules: Vec<(bool, BTreeSet<i32>)>,
}

fn container_restart() -> impl Strategy<Value = ContainerRestart> {
    let rule = || {
        (
            prop::bool::weighted(0.2),
            prop::collection::btree_set(exit_code(), 1..=3),
        )
    };
    (
        prop::sample::select(
            &[
                None,
                None,
                None,
                Some("Never"),
                Some("Never"),
                Some("OnFailure"),
            ][..],
        ),
        prop_oneof![
            6 => Just(Vec::new()),
            3 => prop::collection::vec(rule(), 1..=3),
            1 => prop::collection::vec(rule(), 19..=20),
        ],
    )
        .prop_map(|(policy, rules)| ContainerRestart { policy, rules })
}

/// Tolerations users write (the apiserver only allows tolerationSeconds with NoExecute).
#[derive(Clone, Copy, Debug)]
enum Tol {
    NotReady(Option<i64>),
    Unreachable(Option<i64>),
    /// `{operator: Exists}`: every taint, for ever.
    Wildcard,
    GpuNoSchedule,
    /// not-ready with every effect, for ever.
    NotReadyAnyEffect,
    /// unreachable with `operator: Equal, value: ""`.
    UnreachableEqualEmpty(Option<i64>),
    /// Every NoExecute taint, maybe for a while.
    WildcardNoExecute(Option<i64>),
    OtherNoExecute(Option<i64>),
}

impl Tol {
    fn to_json(self) -> Value {
        fn no_execute(mut base: Value, seconds: Option<i64>) -> Value {
            base["effect"] = json!("NoExecute");
            if let Some(seconds) = seconds {
                base["tolerationSeconds"] = json!(seconds);
            }
            base
        }
        match self {
            Self::NotReady(s) => {
                no_execute(json!({"key": NOT_READY_TAINT, "operator": "Exists"}), s)
            }
            Self::Unreachable(s) => {
                no_execute(json!({"key": UNREACHABLE_TAINT, "operator": "Exists"}), s)
            }
            Self::Wildcard => json!({"operator": "Exists"}),
            Self::GpuNoSchedule => {
                json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
            }
            Self::NotReadyAnyEffect => json!({"key": NOT_READY_TAINT, "operator": "Exists"}),
            Self::UnreachableEqualEmpty(s) => no_execute(
                json!({"key": UNREACHABLE_TAINT, "operator": "Equal", "value": ""}),
                s,
            ),
            Self::WildcardNoExecute(s) => no_execute(json!({"operator": "Exists"}), s),
            Self::OtherNoExecute(s) => no_execute(
                json!({"key": "example.com/maintenance", "operator": "Equal", "value": "soon"}),
                s,
            ),
        }
    }
}

fn toleration() -> impl Strategy<Value = Tol> {
    let seconds = || prop::option::of(0i64..2000);
    prop_oneof![
        3 => seconds().prop_map(Tol::NotReady),
        3 => seconds().prop_map(Tol::Unreachable),
        1 => Just(Tol::Wildcard),
        2 => Just(Tol::GpuNoSchedule),
        1 => Just(Tol::NotReadyAnyEffect),
        1 => seconds().prop_map(Tol::UnreachableEqualEmpty),
        1 => seconds().prop_map(Tol::WildcardNoExecute),
        1 => seconds().prop_map(Tol::OtherNoExecute),
    ]
}

/// The random choices behind one Job.
#[derive(Clone, Debug)]
struct JobGen {
    names: Vec<&'static str>,
    containers: Vec<(Usage, ContainerRestart)>,
    /// (native sidecar, usage)
    init_containers: Vec<(bool, Usage)>,
    rules: Option<Vec<RuleGen>>,
    tolerations: Vec<Tol>,
    grace: Option<i64>,
    on_failure: bool,
    replacement: Option<&'static str>,
    per_index: Option<i32>,
    deadline: Option<i64>,
    skip: bool,
    inject_label: bool,
    inject_annotation: bool,
    app_label: bool,
    /// 0-2: no gang; 3: Indexed with parallelism = completions; 4: labelled
    /// `gpu-guard.io/gang: "true"`; 5: the gang shape, its template annotated `"false"`.
    gang: u8,
    /// The pod template has annotations of its own.
    template_annotations: bool,
    /// Skip the fix-ups that keep the input valid (about one Job in ten).
    lax: bool,
}

impl JobGen {
    fn build(&self) -> Value {
        let n = self.containers.len();
        let names = &self.names[..n + self.init_containers.len()];
        let container = |name: &str, usage: Usage| {
            let mut value = json!({"name": name, "image": "registry.example.com/train:1"});
            if let Some(resources) = usage.resources() {
                value["resources"] = resources;
            }
            value
        };
        let containers: Vec<Value> = self
            .containers
            .iter()
            .zip(names)
            .map(|((usage, restart), name)| {
                let mut value = container(name, *usage);
                // Rules need an explicit restartPolicy: without one they only go into lax Jobs.
                let policy = match restart.policy {
                    None if !restart.rules.is_empty() && !self.lax => Some("Never"),
                    policy => policy,
                };
                if let Some(policy) = policy {
                    value["restartPolicy"] = json!(policy);
                }
                if !restart.rules.is_empty() {
                    let rules: Vec<Value> = restart
                        .rules
                        .iter()
                        .map(|(not_in, values)| {
                            json!({"action": "Restart", "exitCodes": {
                                "operator": if *not_in { "NotIn" } else { "In" },
                                "values": values,
                            }})
                        })
                        .collect();
                    value["restartPolicyRules"] = json!(rules);
                }
                value
            })
            .collect();
        let init_containers: Vec<Value> = self
            .init_containers
            .iter()
            .zip(&names[n..])
            .map(|(&(sidecar, usage), name)| {
                let mut value = container(name, usage);
                if sidecar {
                    value["restartPolicy"] = json!("Always");
                }
                value
            })
            .collect();

        let has_policy = self.rules.is_some();
        let restart = if self.on_failure && (self.lax || !has_policy) {
            "OnFailure"
        } else {
            "Never"
        };
        let mut pod = json!({"restartPolicy": restart, "containers": containers});
        if !init_containers.is_empty() {
            pod["initContainers"] = json!(init_containers);
        }
        if !self.tolerations.is_empty() {
            let tolerations: Vec<Value> = self.tolerations.iter().map(|t| t.to_json()).collect();
            pod["tolerations"] = json!(tolerations);
        }
        if let Some(grace) = self.grace {
            pod["terminationGracePeriodSeconds"] = json!(grace);
        }

        let mut metadata = json!({"name": "train", "namespace": "ml"});
        let mut labels = Map::new();
        if self.app_label {
            labels.insert("app".into(), json!("train"));
        }
        if self.inject_label {
            labels.insert("gpu-guard.io/inject".into(), json!("true"));
        }
        if self.gang == 4 {
            labels.insert("gpu-guard.io/gang".into(), json!("true"));
        }
        if !labels.is_empty() {
            metadata["labels"] = Value::Object(labels);
        }
        let mut annotations = Map::new();
        if self.skip {
            annotations.insert("gpu-guard.io/skip".into(), json!("true"));
        }
        if self.inject_annotation {
            annotations.insert("gpu-guard.io/inject".into(), json!("true"));
        }
        if !annotations.is_empty() {
            metadata["annotations"] = Value::Object(annotations);
        }

        let mut spec = json!({
            "backoffLimit": 6,
            "template": {"metadata": {"labels": {"job": "train"}}, "spec": pod},
        });
        if let Some(per_index) = self.per_index {
            spec["completionMode"] = json!("Indexed");
            spec["completions"] = json!(4);
            spec["backoffLimitPerIndex"] = json!(per_index);
        }
        if matches!(self.gang, 3 | 5) {
            spec["completionMode"] = json!("Indexed");
            spec["completions"] = json!(4);
            spec["parallelism"] = json!(4);
        }
        let mut template_annotations = Map::new();
        if self.template_annotations {
            template_annotations.insert("team".into(), json!("vision"));
        }
        if self.gang == 5 {
            template_annotations.insert("gpu-guard.io/gang".into(), json!("false"));
        }
        if !template_annotations.is_empty() {
            spec["template"]["metadata"]["annotations"] = Value::Object(template_annotations);
        }
        if let Some(deadline) = self.deadline {
            spec["activeDeadlineSeconds"] = json!(deadline);
        }
        if let Some(replacement) = self.replacement {
            let replacement = if replacement == "TerminatingOrFailed" && has_policy && !self.lax {
                "Failed"
            } else {
                replacement
            };
            spec["podReplacementPolicy"] = json!(replacement);
        }
        if let Some(rules) = &self.rules {
            let rules: Vec<Value> = rules.iter().map(|rule| self.rule(rule, names)).collect();
            spec["podFailurePolicy"] = json!({"rules": rules});
        }
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec})
    }

    fn rule(&self, rule: &RuleGen, names: &[&str]) -> Value {
        let action = if rule.action == "FailIndex" && self.per_index.is_none() && !self.lax {
            "Count"
        } else {
            rule.action
        };
        match &rule.matcher {
            Matcher::ExitCodes {
                not_in,
                values,
                container,
            } => {
                let mut values: Vec<i32> = values
                    .iter()
                    .copied()
                    .filter(|&code| *not_in || code != 0)
                    .collect();
                if values.is_empty() {
                    values.push(1);
                }
                let mut requirement = json!({
                    "operator": if *not_in { "NotIn" } else { "In" },
                    "values": values,
                });
                if let Some(index) = container {
                    requirement["containerName"] = json!(names[index.index(names.len())]);
                }
                json!({"action": action, "onExitCodes": requirement})
            }
            Matcher::Conditions(patterns) => {
                let patterns: Vec<Value> = patterns
                    .iter()
                    .map(|(type_, status)| json!({"type": type_, "status": status}))
                    .collect();
                json!({"action": action, "onPodConditions": patterns})
            }
        }
    }
}

/// A generated Job; `Debug` prints it as compact JSON, so a shrunk failure is a ready-made
/// minimal input.
#[derive(Clone, PartialEq)]
struct Input(Job);

impl fmt::Debug for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_json::to_string(&self.0).map_err(|_| fmt::Error)?)
    }
}

fn job_gen() -> impl Strategy<Value = JobGen> {
    let shape = (
        Just(NAMES.to_vec()).prop_shuffle(),
        prop::collection::vec((usage(), container_restart()), 1..=4),
        prop::collection::vec((prop::bool::weighted(0.4), usage()), 0..=3),
        prop::option::weighted(0.4, own_rules()),
        prop::collection::vec(toleration(), 0..=4),
    );
    let settings = (
        prop::option::of(0i64..2000),
        prop::bool::weighted(0.25),
        prop::sample::select(&[None, Some("Failed"), Some("TerminatingOrFailed")][..]),
        prop::option::weighted(0.25, 1..=3i32),
        prop::option::weighted(0.15, 1i64..1_000_000),
    );
    let flags = (
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        any::<bool>(),
        prop::bool::weighted(0.1),
    );
    let gang = (0u8..6, prop::bool::weighted(0.3));
    (shape, settings, flags, gang).prop_map(
        |(
            (names, containers, init_containers, rules, tolerations),
            (grace, on_failure, replacement, per_index, deadline),
            (skip, inject_label, inject_annotation, app_label, lax),
            (gang, template_annotations),
        )| JobGen {
            names,
            containers,
            init_containers,
            rules,
            tolerations,
            grace,
            on_failure,
            replacement,
            per_index,
            deadline,
            skip,
            inject_label,
            inject_annotation,
            app_label,
            gang,
            template_annotations,
            lax,
        },
    )
}

fn job() -> impl Strategy<Value = Input> {
    job_gen().prop_map(|generated| {
        let value = generated.build();
        Input(serde_json::from_value(value).expect("generated Jobs decode"))
    })
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn to_value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("k8s-openapi types serialize")
}

fn pointer_mut<'a>(value: &'a mut Value, pointer: &str) -> Option<&'a mut Map<String, Value>> {
    value.pointer_mut(pointer).and_then(Value::as_object_mut)
}

/// Removes every member named `key` anywhere in `value`.
fn strip_key(value: &mut Value, key: &str) {
    match value {
        Value::Object(map) => {
            map.remove(key);
            map.values_mut().for_each(|v| strip_key(v, key));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| strip_key(v, key)),
        _ => {}
    }
}

/// "SetAnnotation", "AddToleration", ...: the variant name of a change.
fn variant(change: &Change) -> String {
    let debug = format!("{change:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn tolerations(job: &Job) -> Vec<Toleration> {
    job.spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .and_then(|pod| pod.tolerations.clone())
        .unwrap_or_default()
}

/// The Job with every path the policy owns removed (see `policy_owned_paths_are_the_only_ones_
/// that_change`).
fn without_owned_paths(job: &Job, annotations_were_absent: bool) -> Value {
    let mut value = to_value(job);
    if let Some(metadata) = pointer_mut(&mut value, "/metadata") {
        let now_empty = match metadata
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
        {
            Some(annotations) => {
                annotations.remove(MUTATED_ANNOTATION);
                annotations.is_empty()
            }
            None => false,
        };
        if now_empty && annotations_were_absent {
            metadata.remove("annotations");
        }
    }
    // A gang Job's pods are annotated; the template's own annotations stay.
    if let Some(metadata) = pointer_mut(&mut value, "/spec/template/metadata") {
        let now_empty = match metadata
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
        {
            Some(annotations) => {
                annotations.remove("gpu-guard.io/gang").is_some() && annotations.is_empty()
            }
            None => false,
        };
        if now_empty {
            metadata.remove("annotations");
        }
    }
    if let Some(spec) = pointer_mut(&mut value, "/spec") {
        for key in [
            "podFailurePolicy",
            "podReplacementPolicy",
            "activeDeadlineSeconds",
        ] {
            spec.remove(key);
        }
    }
    if let Some(pod) = pointer_mut(&mut value, "/spec/template/spec") {
        for key in [
            "restartPolicy",
            "terminationGracePeriodSeconds",
            "tolerations",
        ] {
            pod.remove(key);
        }
        for container in pod
            .get_mut("containers")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            container.remove("restartPolicy");
            container.remove("restartPolicyRules");
        }
    }
    value
}

fn containers(job: &Job) -> &[k8s_openapi::api::core::v1::Container] {
    job.spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .map(|pod| pod.containers.as_slice())
        .unwrap_or_default()
}

/// A field that a client may send as explicit `null` and that decodes to the same typed Job.
struct Nullable {
    parent: &'static str,
    key: &'static str,
    /// `null` stands for an empty array (`rules`), not for an absent field.
    empty_array: bool,
}

impl Nullable {
    const fn absent(parent: &'static str, key: &'static str) -> Self {
        Self {
            parent,
            key,
            empty_array: false,
        }
    }

    /// What the typed Job serializes where the raw Job has `null` (`None`: nothing).
    fn typed(&self) -> Option<Value> {
        self.empty_array.then(|| json!([]))
    }
}

const NULLABLE: [Nullable; 12] = [
    Nullable::absent("/metadata", "annotations"),
    Nullable::absent("/spec/template/metadata", "annotations"),
    Nullable::absent("/metadata", "labels"),
    Nullable::absent("/spec", "podFailurePolicy"),
    Nullable::absent("/spec", "podReplacementPolicy"),
    Nullable::absent("/spec", "activeDeadlineSeconds"),
    Nullable::absent("/spec/template/spec", "tolerations"),
    Nullable::absent("/spec/template/spec", "terminationGracePeriodSeconds"),
    Nullable::absent("/spec/template/spec", "initContainers"),
    Nullable::absent("/spec/template/spec/containers/0", "restartPolicy"),
    Nullable::absent("/spec/template/spec/containers/0", "restartPolicyRules"),
    // An empty rule list decodes the same as `rules: null`.
    Nullable {
        parent: "/spec/podFailurePolicy",
        key: "rules",
        empty_array: true,
    },
];

/// `raw` with the chosen absent (or, for `rules`, empty) fields set to explicit `null`; also
/// returns which of [`NULLABLE`] it set.
fn with_nulls(raw: &Value, chosen: &[bool]) -> (Value, Vec<usize>) {
    let mut nulled = raw.clone();
    let mut applied = Vec::new();
    for (index, nullable) in NULLABLE.iter().enumerate() {
        if !chosen[index] {
            continue;
        }
        let Some(object) = pointer_mut(&mut nulled, nullable.parent) else {
            continue;
        };
        if object.get(nullable.key).cloned() == nullable.typed() {
            object.insert(nullable.key.to_owned(), Value::Null);
            applied.push(index);
        }
    }
    (nulled, applied)
}

/// Undoes [`with_nulls`] where the patch left the `null` in place.
fn without_nulls(mut patched: Value, applied: &[usize]) -> Value {
    for &index in applied {
        let nullable = &NULLABLE[index];
        if let Some(object) = pointer_mut(&mut patched, nullable.parent)
            && object.get(nullable.key) == Some(&Value::Null)
        {
            match nullable.typed() {
                Some(typed) => object.insert(nullable.key.to_owned(), typed),
                None => object.remove(nullable.key),
            };
        }
    }
    patched
}

/// The warning of the fallback to exit-code rules without `containerName`.
const SHARED_FALLBACK_WARNING: &str = "exit-code rules match every container";

fn all_adds(patch: &json_patch::Patch) -> bool {
    patch.iter().all(|op| matches!(op, PatchOperation::Add(_)))
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// 1. What the API server stores is valid: the raw Job with the webhook's patch applied (not
    /// the engine's typed result, which its own safety net already checks) passes the API
    /// server's rules whenever the input did, and an unchanged outcome is the input itself.
    #[test]
    fn the_patched_job_the_api_server_sees_is_valid(input in job(), kind in policy_kind()) {
        let valid_before = check_job(&input.0).is_empty();
        let outcome = mutate_job(&input.0, kind.policy());
        if !outcome.is_changed() {
            prop_assert_eq!(&outcome.job, &input.0);
        }
        let raw = serde_json::to_value(&input.0).expect("a Job serializes");
        let mutation = mutate_object(&raw, kind.policy(), &NoDraFacts)
            .expect("a Job is mutable")
            .expect("a generated Job decodes");
        let patched = patch::apply(&raw, &mutation.patch).expect("the patch applies");
        let stored: Job = serde_json::from_value(patched).expect("the patched Job decodes");
        let after = check_job(&stored);
        if valid_before {
            prop_assert!(after.is_empty(), "the API server would reject the patched Job: {after:?}");
        }
    }

    /// 1b. For a valid Job, the engine never builds a result the API server would reject: its
    /// last-resort check (which returns the Job unchanged with a warning) never fires.
    #[test]
    fn the_engine_never_needs_its_safety_net_on_a_valid_job(
        input in job(),
        kind in policy_kind(),
    ) {
        prop_assume!(check_job(&input.0).is_empty());
        let outcome = mutate_job(&input.0, kind.policy());
        let rejected: Vec<&String> = outcome
            .warnings
            .iter()
            .filter(|warning| warning.contains("the API server would reject"))
            .collect();
        prop_assert!(rejected.is_empty(), "{rejected:?}");
    }

    /// 2. Mutating a mutated Job changes nothing.
    #[test]
    fn mutation_is_idempotent(input in job(), kind in policy_kind()) {
        let policy = kind.policy();
        let once = mutate_job(&input.0, policy);
        let twice = mutate_job(&once.job, policy);
        prop_assert!(
            twice.changes.is_empty(),
            "second pass changed {:?} (first pass: {:?})",
            twice.changes,
            once.changes
        );
        prop_assert_eq!(&twice.job, &once.job);
    }

    /// 3. Only the paths the policy owns change; existing tolerations keep their order and
    /// fields, their tolerationSeconds is only raised (never added); new ones are appended.
    #[test]
    fn policy_owned_paths_are_the_only_ones_that_change(input in job(), kind in policy_kind()) {
        let policy = kind.policy();
        let outcome = mutate_job(&input.0, policy);
        let annotations_were_absent = input.0.metadata.annotations.is_none();
        prop_assert_eq!(
            without_owned_paths(&outcome.job, annotations_were_absent),
            without_owned_paths(&input.0, annotations_were_absent)
        );

        let before = tolerations(&input.0);
        let after = tolerations(&outcome.job);
        prop_assert!(after.len() >= before.len());
        for (old, new) in before.iter().zip(&after) {
            let strip = |t: &Toleration| Toleration { toleration_seconds: None, ..t.clone() };
            prop_assert_eq!(strip(old), strip(new), "a toleration changed beyond its seconds");
            match (old.toleration_seconds, new.toleration_seconds) {
                (None, None) => {}
                (Some(old), Some(new)) => prop_assert!(new >= old, "lowered {old} to {new}"),
                (old, new) => prop_assert!(false, "tolerationSeconds {old:?} became {new:?}"),
            }
        }
        for added in &after[before.len()..] {
            prop_assert!(
                [NOT_READY_TAINT, UNREACHABLE_TAINT].contains(&added.key.as_deref().unwrap_or(""))
                    && added.effect.as_deref() == Some("NoExecute")
                    && added.operator.as_deref() == Some("Exists")
                    && added.toleration_seconds.is_some(),
                "unexpected added toleration {added:?}"
            );
        }

        // A container's restartPolicy is only added (Never), its own rules stay first.
        for (before, after) in containers(&input.0).iter().zip(containers(&outcome.job)) {
            prop_assert!(
                after.restart_policy == before.restart_policy
                    || (before.restart_policy.is_none()
                        && after.restart_policy.as_deref() == Some("Never"))
            );
            let own = before.restart_policy_rules.as_deref().unwrap_or_default();
            let now = after.restart_policy_rules.as_deref().unwrap_or_default();
            prop_assert!(now.starts_with(own), "{own:?} -> {now:?}");
        }

        // The other owned paths only move the way the policy says.
        let spec_in = input.0.spec.as_ref().unwrap();
        let spec_out = outcome.job.spec.as_ref().unwrap();
        let replacement = spec_out.pod_replacement_policy.as_deref();
        prop_assert!(
            replacement == spec_in.pod_replacement_policy.as_deref()
                || replacement == Some("Failed")
        );
        if spec_in.active_deadline_seconds.is_some() {
            prop_assert_eq!(spec_out.active_deadline_seconds, spec_in.active_deadline_seconds);
        }
        let restart = |spec: &k8s_openapi::api::batch::v1::JobSpec| {
            spec.template.spec.as_ref().unwrap().restart_policy.clone()
        };
        prop_assert!(
            restart(spec_out) == restart(spec_in) || restart(spec_out).as_deref() == Some("Never")
        );
        match (kind, &spec_in.pod_failure_policy, &spec_out.pod_failure_policy) {
            // Merge: the Job's own rules come last, in their order.
            (PolicyKind::Embedded, Some(own), Some(merged)) => {
                prop_assert!(merged.rules.ends_with(&own.rules));
            }
            (PolicyKind::Embedded, Some(_), None) => prop_assert!(false, "policy removed"),
            (PolicyKind::KeepWithDeadline, Some(own), merged) => {
                prop_assert_eq!(Some(own), merged.as_ref());
            }
            _ => {}
        }
    }

    /// 3b. The restart rules gpu-guard adds go only into regular device containers, hold only
    /// the policy's codes with its action and operator `In`, and never a code that a
    /// podFailurePolicy `In` rule names for that container: the device rules still fire.
    #[test]
    fn restart_rules_are_disjoint_from_the_failure_policy_and_only_in_device_containers(
        input in job(),
        kind in policy_kind(),
    ) {
        let policy = kind.policy();
        let outcome = mutate_job(&input.0, policy);
        let settings = &policy.mutation.restart_rules;
        let says_inject = |map: Option<&BTreeMap<String, String>>| {
            map.and_then(|m| m.get("gpu-guard.io/inject")).is_some_and(|v| v == "true")
        };
        let opted_in = says_inject(input.0.metadata.labels.as_ref())
            || says_inject(input.0.metadata.annotations.as_ref());
        let pod = input.0.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let targets = gpu_guard_core::mutate::device_containers(
            pod,
            &policy.devices,
            opted_in,
            "",
            &gpu_guard_core::devices::NoDraFacts,
        )
        .targets;
        let failure_rules = outcome
            .job
            .spec
            .as_ref()
            .and_then(|spec| spec.pod_failure_policy.as_ref())
            .map(|p| p.rules.clone())
            .unwrap_or_default();
        for (before, after) in containers(&input.0).iter().zip(containers(&outcome.job)) {
            let own = before.restart_policy_rules.as_deref().unwrap_or_default().len();
            let added = &after.restart_policy_rules.as_deref().unwrap_or_default()[own..];
            if added.is_empty() {
                continue;
            }
            prop_assert!(settings.enabled);
            prop_assert!(targets.contains(&after.name), "{} is no device container", after.name);
            prop_assert_eq!(added.len(), 1);
            let codes = added[0].exit_codes.as_ref().unwrap();
            prop_assert_eq!(added[0].action.as_str(), settings.action.as_str());
            prop_assert_eq!(codes.operator.as_str(), "In");
            let named: BTreeSet<i32> = failure_rules
                .iter()
                .filter_map(|rule| rule.on_exit_codes.as_ref())
                .filter(|c| c.operator == "In"
                    && c.container_name.as_deref().is_none_or(|n| n == after.name))
                .flat_map(|c| c.values.iter().copied())
                .collect();
            for code in codes.values.iter().flatten() {
                prop_assert!(settings.exit_codes.contains(code), "{code} is not the policy's");
                prop_assert!(!named.contains(code), "{code} hides a podFailurePolicy rule");
            }
        }
    }

    /// 4. The JSON Patch built from the typed changes turns the raw Job into exactly the
    /// mutated Job (as `json_patch::diff` does), only with `add` operations, also when absent
    /// optional parents arrive as explicit `null`.
    #[test]
    fn the_patch_gives_the_same_document_as_a_diff(
        input in job(),
        kind in policy_kind(),
        nulls in prop::collection::vec(any::<bool>(), NULLABLE.len()),
    ) {
        let outcome = mutate_job(&input.0, kind.policy());
        let raw = to_value(&input.0);
        let expected = to_value(&outcome.job);

        let ops = patch::operations(&outcome.changes, &raw, JOB_ROOT);
        prop_assert!(all_adds(&ops), "{ops:?}");
        prop_assert_eq!(ops.is_empty(), outcome.changes.is_empty());
        let patched = patch::apply(&raw, &ops).expect("the patch applies");
        prop_assert_eq!(&patched, &expected);
        let diffed =
            patch::apply(&raw, &json_patch::diff(&raw, &expected)).expect("diff applies");
        prop_assert_eq!(&patched, &diffed);

        let (nulled, applied) = with_nulls(&raw, &nulls);
        let decoded: Job = serde_json::from_value(nulled.clone()).expect("nulls decode");
        prop_assert_eq!(&decoded, &input.0, "explicit nulls must mean the same Job");
        let ops = patch::operations(&outcome.changes, &nulled, JOB_ROOT);
        prop_assert!(all_adds(&ops), "{ops:?}");
        let patched = patch::apply(&nulled, &ops)
            .map_err(|e| TestCaseError::fail(format!("patch on {nulled} fails: {e}")))?;
        prop_assert_eq!(
            &without_nulls(patched, &applied),
            &expected,
            "raw with nulls: {}",
            nulled
        );
        let diffed = patch::apply(&nulled, &json_patch::diff(&nulled, &expected))
            .expect("diff applies");
        prop_assert_eq!(&diffed, &expected);
    }

    /// 4b. The webhook sends exactly the patch and the warnings the CLI's path
    /// ([`mutate_object`] on the object as a `Value`) gives, with or without explicit nulls:
    /// the AdmissionReview around the object, its text borrowed from the body and decoded
    /// there, changes nothing.
    #[test]
    fn the_webhook_sends_the_same_patch_as_the_cli_path(
        input in job(),
        kind in policy_kind(),
        nulls in prop::collection::vec(any::<bool>(), NULLABLE.len()),
    ) {
        let policy = kind.policy();
        let mut raw = to_value(&input.0);
        raw["apiVersion"] = json!("batch/v1");
        raw["kind"] = json!("Job");
        let (nulled, _) = with_nulls(&raw, &nulls);
        for document in [&raw, &nulled] {
            prop_assert_eq!(webhook_answer(document, policy)?, cli_answer(document, policy)?);
        }
    }

    /// 5. Fields this version of k8s-openapi does not know survive the patch wherever they are,
    /// including on the Job's own podFailurePolicy rules (which the device rules are put in
    /// front of); without them, the patched object is the mutated Job.
    #[test]
    fn unknown_fields_survive_the_patch(
        input in job(),
        kind in policy_kind(),
        future in any::<i64>(),
    ) {
        let policy = kind.policy();
        let mut raw = to_value(&input.0);
        raw["apiVersion"] = json!("batch/v1");
        raw["kind"] = json!("Job");
        let mut planted = Vec::new();
        let places = [
            "",
            "/metadata",
            "/spec",
            "/spec/template/spec",
            "/spec/template/spec/containers/0",
            "/spec/template/spec/tolerations/0",
        ];
        for (n, place) in places.into_iter().enumerate() {
            // The first toleration is only there when the Job has tolerations.
            let Some(object) = pointer_mut(&mut raw, place) else { continue };
            let value = json!(future.wrapping_add(n as i64));
            object.insert("futureField".into(), value.clone());
            planted.push((place, value));
        }
        prop_assert!(planted.len() >= 5);
        let rule_value = json!({"future": future, "nested": [1, 2]});
        let own_rule = pointer_mut(&mut raw, "/spec/podFailurePolicy/rules/0").map(|rule| {
            rule.insert("futureField".into(), rule_value.clone());
            Value::Object(rule.clone())
        });

        let mutation = mutate_object(&raw, policy, &NoDraFacts)
            .expect("a batch/v1 Job is mutable")
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(mutation.kind, MutableKind::Job);
        let outcome = mutate_job(&input.0, policy);
        prop_assert_eq!(mutation.outcome.job(), Some(&outcome));
        let patched = patch::apply(&raw, &mutation.patch).expect("the patch applies");

        for (place, value) in &planted {
            prop_assert_eq!(
                patched.pointer(place).and_then(|object| object.get("futureField")),
                Some(value),
                "futureField lost at {:?}", place
            );
        }
        let replaced = outcome
            .changes
            .iter()
            .any(|change| matches!(change, Change::SetPodFailurePolicy(_)));
        if let (Some(own_rule), false) = (own_rule, replaced) {
            let prepended: usize = outcome
                .changes
                .iter()
                .map(|change| match change {
                    Change::PrependRules(rules) => rules.len(),
                    _ => 0,
                })
                .sum();
            let rules = patched
                .pointer("/spec/podFailurePolicy/rules")
                .and_then(Value::as_array)
                .expect("the Job's rules are still there");
            let carriers: Vec<usize> = rules
                .iter()
                .enumerate()
                .filter(|(_, rule)| rule.get("futureField").is_some())
                .map(|(index, _)| index)
                .collect();
            prop_assert_eq!(carriers, vec![prepended]);
            prop_assert_eq!(&rules[prepended], &own_rule);
        }

        let mut known = patched;
        strip_key(&mut known, "futureField");
        prop_assert_eq!(known, to_value(&outcome.job));
    }

    /// 6. In a CronJob, the patch touches only `spec.jobTemplate`, and the template comes out
    /// as `mutate_job` mutates the Job it describes (unless the CronJob itself says skip).
    #[test]
    fn a_cron_job_template_is_mutated_like_its_job(
        input in job(),
        kind in policy_kind(),
        skip_cron_job in prop::bool::weighted(0.1),
    ) {
        let policy = kind.policy();
        let job_value = to_value(&input.0);
        let mut metadata = json!({"name": "nightly", "namespace": "ml"});
        if skip_cron_job {
            metadata["annotations"] = json!({"gpu-guard.io/skip": "true"});
        }
        let raw = json!({
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": metadata,
            "spec": {
                "schedule": "0 * * * *",
                "concurrencyPolicy": "Forbid",
                "jobTemplate": {"metadata": job_value["metadata"], "spec": job_value["spec"]},
            },
        });
        let mutation = mutate_object(&raw, policy, &NoDraFacts)
            .expect("a batch/v1 CronJob is mutable")
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(mutation.kind, MutableKind::CronJob);
        let expected: Outcome = if skip_cron_job {
            prop_assert!(mutation.patch.is_empty());
            Outcome {
                job: input.0.clone(),
                changes: Vec::new(),
                warnings: Vec::new(),
                change_notes: Vec::new(),
                skipped: None,
            }
        } else {
            mutate_job(&input.0, policy)
        };
        prop_assert_eq!(&mutation.outcome.job().expect("a CronJob").changes, &expected.changes);
        prop_assert_eq!(&mutation.outcome.job().expect("a CronJob").job, &expected.job);
        let prefix = format!("{CRON_JOB_TEMPLATE_ROOT}/");
        for op in mutation.patch.iter() {
            let path = op.path().to_string();
            prop_assert!(path.starts_with(&prefix), "operation outside the template: {path}");
        }

        let mut patched = patch::apply(&raw, &mutation.patch).expect("the patch applies");
        let template = pointer_mut(&mut patched, "/spec").unwrap().remove("jobTemplate");
        prop_assert_eq!(
            template,
            Some(json!({
                "metadata": to_value(&expected.job.metadata),
                "spec": to_value(&expected.job.spec),
            }))
        );
        let mut rest = raw.clone();
        pointer_mut(&mut rest, "/spec").unwrap().remove("jobTemplate");
        prop_assert_eq!(patched, rest);
    }
}

// ---------------------------------------------------------------------------------------------
// The generators are not trivial

/// Samples the generator and checks that the properties above are about Jobs that do change:
/// most device Jobs get changed, and every kind of change, fallback and skip occurs.
#[test]
fn generated_jobs_exercise_every_kind_of_change() {
    const SAMPLES: usize = 1500;
    let mut runner = TestRunner::deterministic();
    let strategy = (job(), policy_kind());
    let mut valid = 0;
    let mut changed = 0;
    let mut skipped: BTreeMap<&str, usize> = BTreeMap::new();
    let mut variants: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_policy: BTreeMap<String, usize> = BTreeMap::new();
    let mut changed_with_own_rules = 0;
    let mut shared_fallback = 0;
    let mut too_many_rules = 0;
    for _ in 0..SAMPLES {
        let (input, kind) = strategy
            .new_tree(&mut runner)
            .expect("the strategy generates")
            .current();
        valid += usize::from(check_job(&input.0).is_empty());
        let outcome = mutate_job(&input.0, kind.policy());
        if let Some(reason) = outcome.skipped {
            *skipped.entry(reason.as_str()).or_default() += 1;
        }
        if outcome.is_changed() {
            changed += 1;
            *by_policy.entry(format!("{kind:?}")).or_default() += 1;
            let had_rules = input
                .0
                .spec
                .as_ref()
                .is_some_and(|spec| spec.pod_failure_policy.is_some());
            changed_with_own_rules += usize::from(had_rules);
        }
        for change in &outcome.changes {
            *variants.entry(variant(change)).or_default() += 1;
        }
        for warning in &outcome.warnings {
            shared_fallback += usize::from(warning.contains(SHARED_FALLBACK_WARNING));
            too_many_rules += usize::from(warning.contains("exceed the limit"));
        }
    }
    let report = format!(
        "valid {valid}, changed {changed}, with own rules {changed_with_own_rules}, \
         skipped {skipped:?}, by policy {by_policy:?}, changes {variants:?}, \
         shared fallback {shared_fallback}, too many rules {too_many_rules}"
    );
    println!("{report}");
    assert!(valid * 10 >= SAMPLES * 8, "{report}");
    assert!(changed * 2 >= SAMPLES, "{report}");
    assert!(changed_with_own_rules * 10 >= SAMPLES, "{report}");
    for reason in ["skip-annotation", "not-a-device-workload"] {
        assert!(skipped.get(reason).is_some_and(|&n| n >= 10), "{report}");
    }
    for kind in [
        "Embedded",
        "StrictReplace",
        "KeepWithDeadline",
        "InPlaceRestart",
    ] {
        assert!(by_policy.get(kind).is_some_and(|&n| n >= 50), "{report}");
    }
    for name in [
        "SetAnnotation",
        "SetTemplateAnnotation",
        "SetPodFailurePolicy",
        "PrependRules",
        "SetPodReplacementPolicy",
        "SetRestartPolicy",
        "SetTerminationGracePeriod",
        "SetTolerationSeconds",
        "AddToleration",
        "SetActiveDeadlineSeconds",
        "SetContainerRestartPolicy",
        "AddContainerRestartRule",
    ] {
        assert!(
            variants.get(name).is_some_and(|&n| n >= 5),
            "{name}: {report}"
        );
    }
    assert!(shared_fallback >= 3, "{report}");
    assert!(too_many_rules >= 2, "{report}");
}

// ---------------------------------------------------------------------------------------------
// Regressions found by the properties above (minimal inputs)

/// Found by `mutation_is_idempotent`. Three device containers, a Job policy of 16 rules, two of
/// which give containers `a` and `b` their own rule for exit code 75. The per-container device
/// rules (3 + 3) do not fit next to 15, so the engine falls back to one exit-code rule for every
/// container. It used to leave 75 out of it because *some* container has its own rule for 75,
/// so `c`'s exit code 75 was handled by no rule and a second pass added it. Now the fallback
/// adds the per-container rule for `c` in the same pass.
#[test]
fn merging_after_the_shared_rule_fallback_is_idempotent() {
    let own_75 = |container: &str| {
        json!({"action": "FailJob",
               "onExitCodes": {"containerName": container, "operator": "In", "values": [75]}})
    };
    let filler = json!({"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}});
    let mut rules = vec![own_75("a"), own_75("b")];
    rules.extend(std::iter::repeat_n(filler, 13));
    let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "podFailurePolicy": {"rules": rules},
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [
                    {"name": "a", "resources": gpu},
                    {"name": "b", "resources": gpu},
                    {"name": "c", "resources": gpu},
                ],
            }},
        },
    }))
    .unwrap();
    assert!(check_job(&job).is_empty());
    let once = mutate_job(&job, &EMBEDDED);
    assert!(once.is_changed());
    let twice = mutate_job(&once.job, &EMBEDDED);
    assert_eq!(twice.changes, Vec::new(), "first pass: {:?}", once.changes);
    // And the first pass already covers `c`'s exit code 75, leaving `a` and `b` to their rules.
    let rules = &once
        .job
        .spec
        .as_ref()
        .unwrap()
        .pod_failure_policy
        .as_ref()
        .unwrap()
        .rules;
    let for_c: Vec<_> = rules
        .iter()
        .filter_map(|rule| rule.on_exit_codes.as_ref())
        .filter(|codes| codes.container_name.as_deref() == Some("c"))
        .collect();
    assert_eq!(for_c.len(), 1);
    assert_eq!(for_c[0].values, vec![75]);
}

// ---------------------------------------------------------------------------------------------
// JobSets: the generated Jobs as the replicated Jobs of a gang

/// A JobSet of 1-3 generated Jobs (their specs as the replicated Jobs' templates, some with
/// an empty restartPolicy, as JobSet users leave it), with or without a failure policy of its
/// own, and a field this version does not know, in the spec and in the JobSet's own rule.
fn jobset() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec((job(), any::<bool>()), 1..=3),
        prop::option::of((0..4i32, any::<bool>())),
    )
        .prop_map(|(jobs, failure_policy)| {
            let replicated: Vec<Value> = jobs
                .into_iter()
                .enumerate()
                .map(|(index, (input, empty_restart))| {
                    let mut spec = to_value(input.0.spec.as_ref().unwrap());
                    if empty_restart
                        && let Some(pod) = spec
                            .pointer_mut("/template/spec")
                            .and_then(Value::as_object_mut)
                    {
                        pod.remove("restartPolicy");
                    }
                    json!({"name": format!("rj{index}"), "replicas": 2,
                           "template": {"spec": spec}})
                })
                .collect();
            let mut object = json!({
                "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "metadata": {"name": "gang", "namespace": "ml"},
                "spec": {"replicatedJobs": replicated, "futureField": {"n": 1}}
            });
            if let Some((max_restarts, named)) = failure_policy {
                let mut rule = json!({"action": "FailJobSet",
                    "onJobFailureReasons": ["DeadlineExceeded"], "futureField": true});
                if named {
                    rule["name"] = json!("deadline");
                }
                object["spec"]["failurePolicy"] =
                    json!({"maxRestarts": max_restarts, "rules": [rule]});
            }
            object
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// A JobSet JobSet's webhook and the Job API accept stays accepted once patched; a second
    /// pass adds nothing; the patch touches only what gpu-guard owns; unknown fields survive.
    #[test]
    fn jobsets_stay_valid_change_once_and_only_where_gpu_guard_owns(
        raw in jobset(),
        kind in policy_kind(),
    ) {
        use gpu_guard_core::field::FieldPath;
        use gpu_guard_core::api_rules::jobset::check_jobset_spec;
use gpu_guard_core::jobset::JobSetSpec;
        let policy = kind.policy();
        let path = FieldPath::new(["spec"]);
        let spec: JobSetSpec = serde_json::from_value(raw["spec"].clone()).unwrap();
        let valid_before = check_jobset_spec(&spec, &path).is_empty();
        let mutation = mutate_object(&raw, policy, &NoDraFacts)
            .expect("a JobSet is mutable")
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let patched = patch::apply(&raw, &mutation.patch).expect("the patch applies");
        let after: JobSetSpec = serde_json::from_value(patched["spec"].clone()).unwrap();
        if valid_before {
            let violations = check_jobset_spec(&after, &path);
            prop_assert!(violations.is_empty(), "{violations:?}");
        }
        let again = mutate_object(&patched, policy, &NoDraFacts).unwrap().unwrap();
        prop_assert!(again.patch.is_empty(), "second pass: {:?}", again.patch);
        for op in mutation.patch.iter() {
            let target = op.path().to_string();
            let owned = target.starts_with("/metadata/annotations")
                || target.starts_with("/spec/failurePolicy")
                || (target.starts_with("/spec/replicatedJobs/")
                    && target.contains("/template/"));
            prop_assert!(owned, "{target}");
        }
        prop_assert_eq!(&patched["spec"]["futureField"], &raw["spec"]["futureField"]);
        // `existingPolicy: Replace` drops the JobSet's own rules, on purpose.
        let keeps_own = policy.mutation.pod_failure_policy.existing_policy != ExistingPolicy::Replace;
        if let Some(own) = raw["spec"]["failurePolicy"]["rules"].get(0).filter(|_| keeps_own) {
            let kept = patched["spec"]["failurePolicy"]["rules"]
                .as_array()
                .unwrap()
                .iter()
                .any(|rule| rule["futureField"] == own["futureField"]
                    && rule["action"] == own["action"]);
            prop_assert!(kept, "the JobSet's own rule and its unknown field survive");
        }
    }
    /// The webhook sends exactly the patch and the warnings the CLI's path gives for a
    /// JobSet, and for a Trainer runtime whose `spec.template.spec` is the same JobSet spec,
    /// with explicit nulls or without.
    #[test]
    fn the_webhook_sends_the_same_jobset_patch_as_the_cli_path(
        raw in jobset(),
        kind in policy_kind(),
        null_policy in any::<bool>(),
        null_annotations in any::<bool>(),
    ) {
        let policy = kind.policy();
        let mut jobset = raw.clone();
        if null_policy && jobset["spec"].get("failurePolicy").is_none() {
            jobset["spec"]["failurePolicy"] = Value::Null;
        }
        if null_annotations {
            jobset["metadata"]["annotations"] = Value::Null;
            jobset["spec"]["replicatedJobs"][0]["template"]["metadata"] =
                json!({"annotations": null, "labels": {"app": "x"}});
        }
        let runtime = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": jobset["metadata"],
            "spec": {"mlPolicy": {"numNodes": 2}, "template": {"spec": jobset["spec"]}}
        });
        for document in [&jobset, &runtime] {
            prop_assert_eq!(webhook_answer(document, policy)?, cli_answer(document, policy)?);
        }
    }
}

/// What a mutating webhook answers: the JSON Patch (none when empty) and the warnings.
type Answer = (Option<Value>, Vec<String>);

/// The webhook's answer to the CREATE of `object`, read from its AdmissionReview response.
fn webhook_answer(object: &Value, policy: &Policy) -> Result<Answer, TestCaseError> {
    use base64::Engine as _;
    use gpu_guard_webhook::admission::{Webhook, review};

    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u", "operation": "CREATE", "namespace": "ns",
            "kind": {"group": group, "version": version, "kind": object["kind"]},
            "object": object,
        }
    });
    let view = gpu_guard_core::guard::StaticView::default();
    let reviewed = review(Webhook::Mutate, body.to_string().as_bytes(), policy, &view)
        .map_err(|e| TestCaseError::fail(format!("the webhook refused {object}: {e}")))?;
    let sent: Value = serde_json::from_slice(&reviewed.body).unwrap();
    let response = &sent["response"];
    prop_assert_eq!(&response["allowed"], &json!(true));
    let patch = response["patch"].as_str().map(|patch| {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    });
    let warnings = response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|warning| warning.as_str().unwrap().to_owned())
        .collect();
    Ok((patch, warnings))
}

/// What the CLI's path decides for `object`, as the webhook would send it.
fn cli_answer(object: &Value, policy: &Policy) -> Result<Answer, TestCaseError> {
    let mutation = mutate_object(object, policy, &NoDraFacts)
        .expect("a kind the engine mutates")
        .map_err(|e| TestCaseError::fail(format!("the CLI's path on {object}: {e}")))?;
    let patch =
        (!mutation.patch.is_empty()).then(|| serde_json::to_value(&mutation.patch).unwrap());
    let warnings = mutation
        .outcome
        .warnings()
        .iter()
        .map(|warning| {
            let sent = format!("gpu-guard: {warning}");
            // Cut to the API server's limit, as the webhook cuts it.
            if sent.chars().count() <= MAX_WARNING_CHARS {
                return sent;
            }
            let mut cut: String = sent.chars().take(MAX_WARNING_CHARS - 1).collect();
            cut.push('…');
            cut
        })
        .collect();
    Ok((patch, warnings))
}
