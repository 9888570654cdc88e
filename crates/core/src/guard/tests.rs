use serde_json::{Value, json};

use super::targets::is_zero_quantity;
use super::*;
use crate::policy::{ExemptWorkload, GpuNodeLabel, Guard, GuardMode, OfflinePriorityClass, Policy};

fn view() -> StaticView {
    let mut offline = Policy::default().guard.offline;
    offline.priority_classes = vec![
        OfflinePriorityClass {
            name: "high".into(),
            value: 1_000_000,
            global_default: false,
        },
        OfflinePriorityClass {
            name: "preemptible".into(),
            value: -10,
            global_default: false,
        },
    ];
    offline.gpu_nodes = vec!["gpu-listed".into()];
    // Stands in for the cluster caches: what it does not know does not exist.
    let mut view = StaticView::from_policy(&offline).authoritative();
    view.add_node(
        serde_json::from_value(json!({
            "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.present": "true"}}
        }))
        .unwrap(),
    );
    view.add_node(
        serde_json::from_value(json!({
            "metadata": {"name": "gpu-2"},
            "status": {"capacity": {"cpu": "8", "nvidia.com/gpu": "4"}}
        }))
        .unwrap(),
    );
    view.add_node(
        serde_json::from_value(json!({
            "metadata": {"name": "cpu-1", "labels": {"nvidia.com/gpu.present": "false"}},
            "status": {"capacity": {"cpu": "8", "nvidia.com/gpu": "0"}}
        }))
        .unwrap(),
    );
    view
}

fn deployment(pod_spec: Value) -> Workload {
    let object = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team"},
        "spec": {"template": {"spec": pod_spec}}
    });
    Workload::from_json(GuardedKind::Deployment, &object.to_string()).unwrap()
}

fn judge_with(kind: GuardedKind, workload: &Workload, guard: &Guard) -> Verdict {
    let policy = Policy::default();
    judge(kind, "team", workload, guard, &policy.devices, &view()).unwrap()
}

fn verdict(pod_spec: Value) -> Verdict {
    judge_with(
        GuardedKind::Deployment,
        &deployment(pod_spec),
        &Policy::default().guard,
    )
}

fn violation(pod_spec: Value) -> PriorityViolation {
    match verdict(pod_spec.clone()) {
        Verdict::Violation(violation) => violation,
        other => panic!("expected a violation for {pod_spec}, got {other:?}"),
    }
}

fn target_paths(violation: &PriorityViolation) -> Vec<String> {
    violation
        .targets
        .iter()
        .map(|t| t.path.to_string())
        .collect()
}

const C: &str = "spec.template.spec";

#[test]
fn a_plain_workload_does_not_target_gpu_nodes() {
    assert_eq!(
        verdict(json!({"containers": [{"name": "app", "image": "nginx"}]})),
        Verdict::Allowed(Allowed::NotTargetingGpuNodes)
    );
}

#[test]
fn every_detection_path_is_found_and_all_are_reported_at_once() {
    let found = violation(json!({
        "nodeName": "gpu-1",
        "nodeSelector": {"nvidia.com/gpu.present": "true", "zone": "a"},
        "tolerations": [
            {"key": "example.com/other", "operator": "Exists"},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]}
            ]}]
        }}},
        "containers": [{"name": "app"}]
    }));
    assert_eq!(
        target_paths(&found),
        [
            format!("{C}.tolerations[1]"),
            format!("{C}.nodeSelector[nvidia.com/gpu.present]"),
            format!(
                "{C}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.\
                 nodeSelectorTerms[0].matchExpressions[0]"
            ),
            format!("{C}.nodeName"),
        ]
    );
    assert!(!found.uses_device);
    assert_eq!(found.minimum, 1000);
    assert_eq!(found.mode, GuardMode::Enforce);
    let message = found.message();
    assert!(message.starts_with("Deployment team/web targets GPU nodes without using a device, so it needs priority >= 1000, but its priority is 0 (no priorityClassName and no globalDefault PriorityClass)"), "{message}");
    assert!(message.contains("names the GPU node gpu-1 (label nvidia.com/gpu.present=true)"));
    assert!(
        message.ends_with(
            "Fix: set spec.template.spec.priorityClassName to a PriorityClass with value >= 1000, \
         or remove the nvidia.com/gpu toleration, the nvidia.com/gpu.present node selector, the \
         GPU requirement of node affinity term 0 and spec.template.spec.nodeName if it does not \
         need a GPU node."
        ),
        "{message}"
    );
}

#[test]
fn device_requests_in_containers_and_init_containers_use_the_lower_minimum() {
    let spec = json!({
        "priorityClassName": "preemptible",
        "initContainers": [{"name": "warmup", "resources": {"requests": {"nvidia.com/mig-1g.5gb": 1}}}],
        "containers": [{"name": "app", "resources": {"limits": {"cpu": "1"}}}]
    });
    let found = violation(spec);
    assert!(found.uses_device);
    assert_eq!(found.minimum, 0);
    assert_eq!(
        target_paths(&found),
        [format!(
            "{C}.initContainers[0].resources.requests[nvidia.com/mig-1g.5gb]"
        )]
    );
    assert_eq!(
        found.priority,
        Priority::Known {
            value: -10,
            source: "PriorityClass \"preemptible\"".into()
        }
    );
    // With a device the fix is the class, never "stop using the GPU".
    assert_eq!(
        found.fix(),
        "set spec.template.spec.priorityClassName to a PriorityClass with value >= 0"
    );
    // An ordinary GPU job (priority 0) passes.
    assert_eq!(
        verdict(
            json!({"containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]})
        ),
        Verdict::Allowed(Allowed::PriorityMet {
            priority: 0,
            minimum: 0
        })
    );
}

#[test]
fn a_device_request_and_a_toleration_together_use_the_device_minimum() {
    let spec = json!({
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": 1}}}]
    });
    assert!(matches!(
        verdict(spec),
        Verdict::Allowed(Allowed::PriorityMet { minimum: 0, .. })
    ));
}

#[test]
fn an_exists_toleration_without_a_key_tolerates_gpu_taints() {
    let found = violation(json!({"tolerations": [{"operator": "Exists"}], "containers": []}));
    assert_eq!(target_paths(&found), [format!("{C}.tolerations[0]")]);
    assert!(found.targets[0].what.contains("tolerates every taint"));
    // Equal without a key tolerates nothing here; Exists with another key neither.
    assert_eq!(
        verdict(json!({"tolerations": [
            {"key": "", "operator": "Equal", "value": "x"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
        ]})),
        Verdict::Allowed(Allowed::NotTargetingGpuNodes)
    );
}

#[test]
fn affinity_operators_that_select_away_from_gpu_nodes_do_not_count() {
    let affinity = |expressions: Value| {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]
        }}}})
    };
    for expressions in [
        json!([{"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}]),
        json!([{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]),
        json!([{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["false"]}]),
        // Exists on a label only some values of which mark GPU nodes is not a GPU selection.
        json!([{"key": "nvidia.com/gpu.present", "operator": "Exists"}]),
        json!([{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]),
    ] {
        assert_eq!(
            verdict(affinity(expressions.clone())),
            Verdict::Allowed(Allowed::NotTargetingGpuNodes),
            "{expressions}"
        );
    }
    for expressions in [
        json!([{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["0"]}]),
        json!([{"key": "nvidia.com/gpu.product", "operator": "Exists"}]),
        json!([{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["false", "true"]}]),
    ] {
        violation(affinity(expressions));
    }
    // Preferred affinity does not bind the scheduler.
    assert_eq!(
        verdict(
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [
                    {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
                ]}}
            ]}}})
        ),
        Verdict::Allowed(Allowed::NotTargetingGpuNodes)
    );
}

#[test]
fn one_gpu_term_among_several_is_enough_and_is_named() {
    let found = violation(json!({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["b"]},
                {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
            ]}
        ]}
    }}}));
    assert_eq!(
        target_paths(&found),
        [format!(
            "{C}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.\
             nodeSelectorTerms[1].matchExpressions[1]"
        )]
    );
}

#[test]
fn instance_type_labels_can_mark_gpu_nodes() {
    let mut guard = Policy::default().guard;
    guard.gpu_node_labels.push(GpuNodeLabel {
        key: "node.kubernetes.io/instance-type".into(),
        values: vec!["p4d.24xlarge".into()],
    });
    let select = |value: &str| {
        deployment(json!({"nodeSelector": {"node.kubernetes.io/instance-type": value}}))
    };
    assert!(matches!(
        judge_with(GuardedKind::Deployment, &select("p4d.24xlarge"), &guard),
        Verdict::Violation(_)
    ));
    assert_eq!(
        judge_with(GuardedKind::Deployment, &select("m5.large"), &guard),
        Verdict::Allowed(Allowed::NotTargetingGpuNodes)
    );
}

#[test]
fn node_names_are_gpu_nodes_by_capacity_label_or_listing() {
    for (node, why) in [
        ("gpu-1", "label nvidia.com/gpu.present=true"),
        ("gpu-2", "capacity nvidia.com/gpu: 4"),
        ("gpu-listed", "listed in guard.offline.gpuNodes"),
    ] {
        let found = violation(json!({"nodeName": node}));
        assert_eq!(
            found.targets[0].what,
            format!("names the GPU node {node} ({why})")
        );
    }
    // Zero GPUs and a "false" label: not a GPU node. An unknown node in a synced view: not one.
    for node in ["cpu-1", "nowhere"] {
        assert_eq!(
            verdict(json!({"nodeName": node})),
            Verdict::Allowed(Allowed::NotTargetingGpuNodes)
        );
    }
    // A DaemonSet pod names its node in matchFields.
    let found = violation(json!({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-2"]}]}
        ]}
    }}}));
    assert!(
        found.targets[0]
            .path
            .to_string()
            .ends_with("matchFields[0]")
    );
}

#[test]
fn template_priority_comes_from_the_class_or_the_global_default() {
    let spec = json!({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]});
    let mut with_class = spec.clone();
    with_class["priorityClassName"] = json!("high");
    assert!(matches!(
        verdict(with_class),
        Verdict::Allowed(Allowed::PriorityMet {
            priority: 1_000_000,
            minimum: 1000
        })
    ));
    let mut built_in = spec.clone();
    built_in["priorityClassName"] = json!("system-node-critical");
    assert!(matches!(verdict(built_in), Verdict::Allowed(_)));

    let mut unknown = spec.clone();
    unknown["priorityClassName"] = json!("hihg");
    let found = violation(unknown);
    assert_eq!(found.priority, Priority::UnknownClass("hihg".into()));
    assert!(
        found
            .fix()
            .starts_with("create PriorityClass \"hihg\" with value >= 1000")
    );

    // A global default applies to templates that name no class.
    let mut view = view();
    view.add_priority_class("default-high", 5000, true);
    view.add_priority_class("default-low", 10, true);
    let policy = Policy::default();
    let verdict = judge(
        GuardedKind::Deployment,
        "team",
        &deployment(spec),
        &policy.guard,
        &policy.devices,
        &view,
    )
    .unwrap();
    let Verdict::Violation(found) = verdict else {
        panic!("{verdict:?}")
    };
    assert_eq!(
        found.priority,
        Priority::Known {
            value: 10,
            source: "no priorityClassName: the globalDefault class \"default-low\"".into()
        }
    );
}

#[test]
fn a_pod_uses_its_resolved_spec_priority() {
    let pod = |priority: Value| {
        let object = json!({"metadata": {"name": "p"}, "spec": {
            "priority": priority, "priorityClassName": "whatever",
            "tolerations": [{"key": "amd.com/gpu", "operator": "Exists"}]
        }});
        Workload::from_json(GuardedKind::Pod, &object.to_string()).unwrap()
    };
    let guard = Policy::default().guard;
    assert!(matches!(
        judge_with(GuardedKind::Pod, &pod(json!(2000)), &guard),
        Verdict::Allowed(Allowed::PriorityMet { priority: 2000, .. })
    ));
    let Verdict::Violation(found) = judge_with(GuardedKind::Pod, &pod(json!(5)), &guard) else {
        panic!()
    };
    assert_eq!(found.class_path.to_string(), "spec.priorityClassName");
    assert_eq!(found.subject, "Pod team/p");
    assert!(
        found
            .message()
            .contains("its priority is 5 (spec.priority, from PriorityClass \"whatever\")")
    );
}

#[test]
fn exemptions_by_namespace_class_workload_and_controller() {
    let mut guard = Policy::default().guard;
    // DaemonSets are judged here, so that the exemptions by name are what exempts them.
    guard.exemptions.node_agents = false;
    guard.exemptions.namespaces = vec!["gpu-operator".into()];
    guard.exemptions.priority_classes = vec!["batch-low".into()];
    guard.exemptions.workloads = vec![
        ExemptWorkload {
            namespace: "team".into(),
            name: "nvidia-device-plugin".into(),
            kind: Some("DaemonSet".into()),
        },
        ExemptWorkload {
            namespace: "team".into(),
            name: "dashboard".into(),
            kind: Some("Deployment".into()),
        },
    ];
    let policy = Policy::default();
    let tolerating = json!({"tolerations": [{"operator": "Exists"}]});
    let run = |kind: GuardedKind, namespace: &str, object: Value| {
        let workload = Workload::from_json(kind, &object.to_string()).unwrap();
        judge(kind, namespace, &workload, &guard, &policy.devices, &view()).unwrap()
    };
    let template = |name: &str, spec: &Value| json!({"metadata": {"name": name}, "spec": {"template": {"spec": spec}}});
    let exempt = |verdict: Verdict| matches!(verdict, Verdict::Allowed(Allowed::Exempt(_)));

    assert!(exempt(run(
        GuardedKind::DaemonSet,
        "gpu-operator",
        template("x", &tolerating)
    )));
    assert!(exempt(run(
        GuardedKind::DaemonSet,
        "team",
        template("nvidia-device-plugin", &tolerating)
    )));
    // The same name as another kind, or in another namespace, is not exempt.
    assert!(!exempt(run(
        GuardedKind::Deployment,
        "team",
        template("nvidia-device-plugin", &tolerating)
    )));
    assert!(!exempt(run(
        GuardedKind::DaemonSet,
        "other",
        template("nvidia-device-plugin", &tolerating)
    )));
    // The DaemonSet's pods, through their controller reference.
    let ds_pod = json!({"metadata": {"name": "nvidia-device-plugin-x7k2p", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-device-plugin", "uid": "u", "controller": true}
    ]}, "spec": {"priority": 0, "tolerations": [{"operator": "Exists"}]}});
    assert!(exempt(run(GuardedKind::Pod, "team", ds_pod)));
    // A Deployment's pods, through the ReplicaSet and the pod-template-hash.
    let rs_pod = json!({"metadata": {"name": "dashboard-5d8f7c-abcde",
        "labels": {"pod-template-hash": "5d8f7c"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "dashboard-5d8f7c", "controller": true}]},
        "spec": {"priority": 0, "tolerations": [{"operator": "Exists"}]}});
    assert!(exempt(run(GuardedKind::Pod, "team", rs_pod)));
    // A priority class exemption.
    let mut with_class = tolerating.clone();
    with_class["priorityClassName"] = json!("batch-low");
    assert!(exempt(run(
        GuardedKind::Deployment,
        "team",
        template("y", &with_class)
    )));
}

#[test]
fn the_skip_annotation_does_not_bypass_the_guard() {
    let object = json!({"metadata": {"name": "sneaky", "annotations": {"gpu-guard.io/skip": "true"}},
        "spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}});
    let workload = Workload::from_json(GuardedKind::Deployment, &object.to_string()).unwrap();
    assert!(matches!(
        judge_with(GuardedKind::Deployment, &workload, &Policy::default().guard),
        Verdict::Violation(_)
    ));
}

#[test]
fn modes_are_per_namespace_and_the_guard_can_be_switched_off() {
    let mut guard = Policy::default().guard;
    guard.mode = GuardMode::Audit;
    guard.namespace_modes.insert("team".into(), GuardMode::Warn);
    let workload = deployment(json!({"tolerations": [{"operator": "Exists"}]}));
    let Verdict::Violation(found) = judge_with(GuardedKind::Deployment, &workload, &guard) else {
        panic!()
    };
    assert_eq!(found.mode, GuardMode::Warn);
    guard.enabled = false;
    assert_eq!(
        judge_with(GuardedKind::Deployment, &workload, &guard),
        Verdict::Allowed(Allowed::Disabled)
    );
}

#[test]
fn cronjob_templates_and_every_owner_kind_are_read() {
    let cron = json!({"metadata": {"name": "nightly"}, "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": {"spec": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    }}}}}});
    let workload = Workload::from_json(GuardedKind::CronJob, &cron.to_string()).unwrap();
    let Verdict::Violation(found) =
        judge_with(GuardedKind::CronJob, &workload, &Policy::default().guard)
    else {
        panic!()
    };
    assert_eq!(
        target_paths(&found),
        ["spec.jobTemplate.spec.template.spec.tolerations[0]"]
    );
    for (api_version, kind) in [
        ("apps/v1", "Deployment"),
        ("apps/v1", "StatefulSet"),
        ("apps/v1", "DaemonSet"),
        ("apps/v1", "ReplicaSet"),
        ("v1", "ReplicationController"),
        ("batch/v1", "Job"),
        ("batch/v1", "CronJob"),
        ("v1", "Pod"),
    ] {
        let kind = GuardedKind::from_api_version(api_version, kind).unwrap();
        assert!(kind.judged_at("CREATE"));
    }
    assert!(GuardedKind::from_api_version("apps/v1beta1", "Deployment").is_none());
    assert!(GuardedKind::Pod.judged_at("UPDATE"));
    assert!(!GuardedKind::Pod.judged_at("DELETE"));
    assert!(GuardedKind::Deployment.judged_at("UPDATE"));
}

#[test]
fn warnings_fit_the_api_servers_limit_and_name_each_reason() {
    let found = violation(json!({
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelector": {"nvidia.com/gpu.present": "true"}
    }));
    assert_eq!(
        found.warnings(),
        [
            "Deployment team/web: priority 0 is below the minimum 1000 for GPU nodes",
            "tolerations[0]: tolerates the GPU node taint nvidia.com/gpu",
            "nodeSelector[nvidia.com/gpu.present]: selects the GPU node label nvidia.com/gpu.present=true",
            "fix: set priorityClassName to a class with value >= 1000",
            "or, if it needs no GPU node, remove the nvidia.com/gpu toleration",
            "or, if it needs no GPU node, remove the nvidia.com/gpu.present node selector",
        ]
    );
    // A node-affinity reason is named from its term, so the reason survives the 120 cut.
    let affinity = violation(json!({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}
        ]}
    }}}));
    let warnings = affinity.warnings();
    assert_eq!(
        warnings[1],
        "nodeSelectorTerms[0].matchExpressions[0]: requires GPU label \
         nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
    );
    assert!(
        warnings
            .iter()
            .all(|w| w.chars().count() <= 120 - "gpu-guard: ".len()),
        "{warnings:?}"
    );
}

/// A view that has not synced: lookups it cannot answer are errors, not findings.
struct Unsynced;

impl ClusterView for Unsynced {
    fn synced(&self) -> bool {
        false
    }
    fn priority_class(&self, _: &str) -> Option<i32> {
        None
    }
    fn global_default_priority_class(&self) -> Option<(String, i32)> {
        None
    }
    fn node(&self, _: &str) -> Option<KnownNode> {
        None
    }
}

#[test]
fn an_unsynced_view_is_an_error_only_when_it_is_needed() {
    let policy = Policy::default();
    let run = |spec: Value| {
        judge(
            GuardedKind::Deployment,
            "team",
            &deployment(spec),
            &policy.guard,
            &policy.devices,
            &Unsynced,
        )
    };
    // Not targeting GPU nodes: no lookup needed.
    assert_eq!(
        run(json!({"containers": []})),
        Ok(Verdict::Allowed(Allowed::NotTargetingGpuNodes))
    );
    assert_eq!(
        run(json!({"tolerations": [{"operator": "Exists"}], "priorityClassName": "high"})),
        Err(NotSynced("PriorityClass \"high\"".into()))
    );
    assert_eq!(
        run(json!({"nodeName": "n1"})),
        Err(NotSynced("node \"n1\"".into()))
    );
}

#[test]
fn a_toleration_limited_to_another_effect_does_not_tolerate_gpu_taints() {
    assert_eq!(
        verdict(json!({"tolerations": [
            {"operator": "Exists", "effect": "NoExecute"},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "PreferNoSchedule"}
        ]})),
        Verdict::Allowed(Allowed::NotTargetingGpuNodes)
    );
    let found = violation(json!({"tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
    ]}));
    assert_eq!(target_paths(&found), [format!("{C}.tolerations[0]")]);
}

#[test]
fn zero_device_capacity_in_any_spelling_is_not_a_gpu_node() {
    for zero in ["0", "0k", "+0", "0.0"] {
        assert!(is_zero_quantity(zero), "{zero}");
    }
    for some in ["1", "10", "0.5", "100m", ""] {
        assert!(!is_zero_quantity(some), "{some}");
    }
}

#[test]
fn daemonset_pods_are_not_judged_for_the_node_their_controller_names() {
    let pod = |owner: &str| {
        let object = json!({"metadata": {"name": "agent-x", "ownerReferences": [
        {"kind": owner, "name": "agent", "controller": true}]},
        "spec": {"priority": 0, "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-2"]}]}
            ]}}}}});
        Workload::from_json(GuardedKind::Pod, &object.to_string()).unwrap()
    };
    let guard = Policy::default().guard;
    assert_eq!(
        judge_with(GuardedKind::Pod, &pod("DaemonSet"), &guard),
        Verdict::Allowed(Allowed::NotTargetingGpuNodes)
    );
    assert!(matches!(
        judge_with(GuardedKind::Pod, &pod("ReplicaSet"), &guard),
        Verdict::Violation(_)
    ));
}

#[test]
fn an_exempt_cronjob_exempts_the_pods_of_its_jobs() {
    let mut guard = Policy::default().guard;
    guard.exemptions.workloads = vec![ExemptWorkload {
        namespace: "team".into(),
        name: "nightly-probe".into(),
        kind: Some("CronJob".into()),
    }];
    let pod = |job: &str| {
        let object = json!({"metadata": {"name": "p", "ownerReferences": [
            {"kind": "Job", "name": job, "controller": true}]},
            "spec": {"priority": 0, "tolerations": [{"operator": "Exists"}]}});
        Workload::from_json(GuardedKind::Pod, &object.to_string()).unwrap()
    };
    assert!(matches!(
        judge_with(GuardedKind::Pod, &pod("nightly-probe-29410560"), &guard),
        Verdict::Allowed(Allowed::Exempt(_))
    ));
    for job in ["nightly-probe-manual", "nightly-probe", "other-29410560"] {
        assert!(
            matches!(
                judge_with(GuardedKind::Pod, &pod(job), &guard),
                Verdict::Violation(_)
            ),
            "{job}"
        );
    }
}

// === JobSets and Kubeflow Trainer runtimes: one pod template per replicatedJob ===

/// A replicatedJob named `name` whose pods have `pod_spec`.
fn replicated_job(name: &str, pod_spec: Value) -> Value {
    json!({"name": name, "replicas": 1, "template": {"spec": {"template": {"spec": pod_spec}}}})
}

/// An object of `kind` (a JobSet or a runtime) named `train` with these replicatedJobs.
fn gang(kind: GuardedKind, replicated_jobs: Value) -> Workload {
    let jobset_spec = json!({"replicatedJobs": replicated_jobs});
    let object = match kind {
        GuardedKind::JobSet => json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "namespace": "team"}, "spec": jobset_spec}),
        _ => json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind.as_str(),
            "metadata": {"name": "train"},
            "spec": {"mlPolicy": {"numNodes": 2}, "template": {"spec": jobset_spec}}}),
    };
    Workload::from_json(kind, &object.to_string()).unwrap()
}

const GPU_TOLERATION: &str = "nvidia.com/gpu";

fn tolerating(extra: Value) -> Value {
    let mut spec = json!({"tolerations": [{"key": GPU_TOLERATION, "operator": "Exists"}],
        "containers": [{"name": "main"}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    spec
}

#[test]
fn every_replicated_job_of_jobsets_and_runtimes_is_judged_with_its_path_and_name() {
    let replicated_jobs = json!([
        replicated_job("initializer", json!({"containers": [{"name": "init"}]})),
        replicated_job("launcher", tolerating(json!({}))),
        replicated_job(
            "workers",
            json!({
                "nodeSelector": {"nvidia.com/gpu.present": "true"},
                "containers": [{"name": "main"}]
            })
        ),
    ]);
    for (kind, spec, subject) in [
        (GuardedKind::JobSet, "spec", "JobSet team/train"),
        (
            GuardedKind::TrainingRuntime,
            "spec.template.spec",
            "TrainingRuntime team/train",
        ),
        // Cluster-scoped: judged with no namespace (see the next test).
        (
            GuardedKind::ClusterTrainingRuntime,
            "spec.template.spec",
            "ClusterTrainingRuntime train",
        ),
    ] {
        let workload = gang(kind, replicated_jobs.clone());
        let Verdict::Violation(found) = judge_with(kind, &workload, &Policy::default().guard)
        else {
            panic!("{kind:?}")
        };
        let job =
            |index: usize| format!("{spec}.replicatedJobs[{index}].template.spec.template.spec");
        assert_eq!(
            (found.subject.as_str(), found.replicated_job.as_deref()),
            (subject, Some("launcher"))
        );
        assert_eq!(target_paths(&found), [format!("{}.tolerations[0]", job(1))]);
        assert_eq!(
            found.class_path.to_string(),
            format!("{}.priorityClassName", job(1))
        );
        // Every violating replicatedJob is reported at once, each with its own fix.
        assert_eq!(found.other_templates.len(), 1, "{kind:?}");
        let workers = &found.other_templates[0];
        assert_eq!(workers.replicated_job.as_deref(), Some("workers"));
        assert_eq!(
            target_paths(workers),
            [format!("{}.nodeSelector[nvidia.com/gpu.present]", job(2))]
        );
        let message = found.message();
        assert!(
            message.starts_with(&format!(
                "{subject} replicatedJob \"launcher\" targets GPU nodes without using a device"
            )),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                ". {subject} replicatedJob \"workers\" targets GPU nodes without using a device, \
                 so it needs priority >= 1000"
            )),
            "{message}"
        );
        assert!(
            message.ends_with(&format!(
                "Fix: set {}.priorityClassName to a PriorityClass with value >= 1000, or remove \
                 the nvidia.com/gpu.present node selector if it does not need a GPU node.",
                job(2)
            )),
            "{message}"
        );
    }
}

#[test]
fn a_cluster_training_runtime_gets_the_default_mode_and_no_namespace_exemption() {
    let mut guard = Policy::default().guard;
    guard.namespace_modes.insert("team".into(), GuardMode::Warn);
    guard.exemptions.namespaces = vec!["kubeflow-system".into()];
    let policy = Policy::default();
    let jobs = json!([replicated_job("node", tolerating(json!({})))]);
    let run = |kind: GuardedKind, namespace: &str| {
        judge(
            kind,
            namespace,
            &gang(kind, jobs.clone()),
            &guard,
            &policy.devices,
            &view(),
        )
        .unwrap()
    };
    // A namespaced runtime follows its namespace, as every other kind does.
    let Verdict::Violation(found) = run(GuardedKind::TrainingRuntime, "team") else {
        panic!()
    };
    assert_eq!(found.mode, GuardMode::Warn);
    assert!(matches!(
        run(GuardedKind::TrainingRuntime, "kubeflow-system"),
        Verdict::Allowed(Allowed::Exempt(_))
    ));
    // A cluster-scoped one is used by TrainJobs of every namespace: whatever namespace a
    // caller passes, the default mode applies and no namespace is exempt.
    for namespace in ["", "team", "kubeflow-system"] {
        let Verdict::Violation(found) = run(GuardedKind::ClusterTrainingRuntime, namespace) else {
            panic!("{namespace}")
        };
        assert_eq!(found.mode, GuardMode::Enforce, "{namespace}");
        assert_eq!(found.subject, "ClusterTrainingRuntime train");
    }
}

#[test]
fn a_gang_verdict_is_its_worst_replicated_job() {
    let plain = json!({"containers": [{"name": "main"}]});
    let high = tolerating(json!({"priorityClassName": "high"}));
    let gpu =
        json!({"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 8}}}]});
    let exempt = tolerating(json!({"priorityClassName": "batch-low"}));
    let unknown = tolerating(json!({"priorityClassName": "not-offline"}));
    let low = tolerating(json!({}));
    let mut guard = Policy::default().guard;
    guard.exemptions.priority_classes = vec!["batch-low".into()];
    let policy = Policy::default();
    // Not authoritative (as `check` without a cluster): an unknown class is unjudged.
    let offline = {
        let mut view = StaticView::from_policy(&policy.guard.offline);
        view.add_priority_class("high", 1_000_000, false);
        view
    };
    for (specs, expected) in [
        (vec![], Verdict::Allowed(Allowed::NotTargetingGpuNodes)),
        (
            vec![&plain, &plain],
            Verdict::Allowed(Allowed::NotTargetingGpuNodes),
        ),
        (
            vec![&plain, &exempt],
            Verdict::Allowed(Allowed::Exempt(
                "priority class \"batch-low\" is exempt".into(),
            )),
        ),
        // The replicatedJob closest to its minimum is the one reported.
        (
            vec![&high, &gpu, &exempt],
            Verdict::Allowed(Allowed::PriorityMet {
                priority: 0,
                minimum: 0,
            }),
        ),
        (
            vec![&high, &unknown],
            Verdict::Allowed(Allowed::Unjudged(Unjudged::PriorityClass(
                "not-offline".into(),
            ))),
        ),
    ] {
        let jobs: Vec<Value> = specs
            .iter()
            .enumerate()
            .map(|(index, spec)| replicated_job(&format!("job-{index}"), (*spec).clone()))
            .collect();
        let workload = gang(GuardedKind::JobSet, Value::from(jobs));
        assert_eq!(
            judge(
                GuardedKind::JobSet,
                "team",
                &workload,
                &guard,
                &policy.devices,
                &offline
            ),
            Ok(expected.clone()),
            "{specs:?}"
        );
    }
    // A violation outweighs an unjudged, met or exempt replicatedJob.
    let jobs = json!([
        replicated_job("a", unknown),
        replicated_job("b", high),
        replicated_job("c", exempt),
        replicated_job("d", low),
    ]);
    let workload = gang(GuardedKind::JobSet, jobs);
    let verdict = judge(
        GuardedKind::JobSet,
        "team",
        &workload,
        &guard,
        &policy.devices,
        &offline,
    );
    let Ok(Verdict::Violation(found)) = verdict else {
        panic!("{verdict:?}")
    };
    assert_eq!(found.replicated_job.as_deref(), Some("d"));
    assert!(found.other_templates.is_empty());
}

#[test]
fn gang_warnings_name_each_replicated_job_and_its_fix() {
    let jobs = json!([
        replicated_job("launcher", tolerating(json!({}))),
        replicated_job(
            "workers",
            json!({"priorityClassName": "preemptible",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 8}}}]})
        ),
    ]);
    let workload = gang(GuardedKind::JobSet, jobs);
    let Verdict::Violation(found) =
        judge_with(GuardedKind::JobSet, &workload, &Policy::default().guard)
    else {
        panic!()
    };
    assert_eq!(
        found.warnings(),
        [
            "JobSet team/train: priority 0 is below the minimum 1000 for GPU nodes",
            "in replicatedJob \"launcher\":",
            "tolerations[0]: tolerates the GPU node taint nvidia.com/gpu",
            "fix: set priorityClassName to a class with value >= 1000",
            "or, if it needs no GPU node, remove the nvidia.com/gpu toleration",
            "JobSet team/train: priority -10 is below the minimum 0 for GPU nodes",
            "in replicatedJob \"workers\":",
            "containers[0].resources.limits[nvidia.com/gpu]: container \"main\" uses the device nvidia.com/gpu",
            "fix: set priorityClassName to a class with value >= 0",
        ]
    );
}

#[test]
fn jobset_and_trainer_kinds_are_known_by_group_and_version() {
    for (api_version, kind, expected) in [
        (
            "jobset.x-k8s.io/v1alpha2",
            "JobSet",
            Some(GuardedKind::JobSet),
        ),
        (
            "trainer.kubeflow.org/v1alpha1",
            "TrainingRuntime",
            Some(GuardedKind::TrainingRuntime),
        ),
        (
            "trainer.kubeflow.org/v1alpha1",
            "ClusterTrainingRuntime",
            Some(GuardedKind::ClusterTrainingRuntime),
        ),
        // A TrainJob names a runtime and holds no pod template: its runtime is judged.
        ("trainer.kubeflow.org/v1alpha1", "TrainJob", None),
        ("jobset.x-k8s.io/v1alpha1", "JobSet", None),
    ] {
        let found = GuardedKind::from_api_version(api_version, kind);
        assert_eq!(found, expected, "{api_version} {kind}");
        if let Some(found) = found {
            assert_eq!(found.as_str(), kind);
            assert!(found.judged_at("CREATE") && found.judged_at("UPDATE"));
        }
    }
}

#[test]
fn a_jobset_without_replicated_jobs_or_with_null_fields_decodes() {
    for object in [
        json!({"metadata": {"name": "empty"}, "spec": {}}),
        json!({"metadata": {"name": "empty"}, "spec": {"replicatedJobs": null}}),
        json!({"metadata": {"name": "empty"}}),
    ] {
        let workload = Workload::from_json(GuardedKind::JobSet, &object.to_string()).unwrap();
        assert!(workload.templates.is_empty(), "{object}");
    }
    let runtime = json!({"metadata": {"name": "r"}, "spec": {"mlPolicy": {}}});
    let workload = Workload::from_json(GuardedKind::ClusterTrainingRuntime, &runtime.to_string());
    assert!(workload.unwrap().templates.is_empty());
}

// === Node agents: the GPU stack's own DaemonSets (guard.exemptions.nodeAgents) ===
//
// The manifests below are small, written here in the shapes of the upstream files each row
// names; only the fields the guard reads are kept.

/// A verdict in one word, for tables.
fn outcome(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Violation(_) => "violation",
        Verdict::Allowed(Allowed::Exempt(_)) => "exempt",
        Verdict::Allowed(Allowed::PriorityMet { .. }) => "priority met",
        Verdict::Allowed(Allowed::NotTargetingGpuNodes) => "not targeting",
        Verdict::Allowed(Allowed::Unjudged(_)) => "unjudged",
        Verdict::Allowed(Allowed::Disabled) => "disabled",
    }
}

fn daemonset_object(namespace: &str, name: &str, pod_spec: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec}}})
}

/// A pod as the DaemonSet controller creates it (kubernetes
/// pkg/controller/daemon/util/daemonset_util.go): a controller reference to the DaemonSet,
/// the required node affinity replaced by one `matchFields metadata.name In [node]` term, the
/// daemon tolerations added; `spec.priority` as the Priority admission plugin resolved it.
fn daemonset_pod(namespace: &str, daemonset: &str, mut pod_spec: Value, priority: i32) -> Value {
    pod_spec["nodeName"] = Value::Null;
    pod_spec["priority"] = json!(priority);
    pod_spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]}}});
    let tolerations = pod_spec["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    pod_spec["tolerations"] = json!(
        tolerations
            .into_iter()
            .chain([
                json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}),
                json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}),
                json!({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}),
            ])
            .collect::<Vec<_>>()
    );
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("{daemonset}-x7k2p"), "namespace": namespace,
               "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": daemonset,
                                    "uid": "5d1f", "controller": true, "blockOwnerDeletion": true}]},
           "spec": pod_spec})
}

/// `object` of `kind` judged with `guard`, in its own namespace.
fn judge_object(kind: GuardedKind, object: &Value, guard: &Guard) -> Verdict {
    let workload = Workload::from_json(kind, &object.to_string()).unwrap();
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let policy = Policy::default();
    judge(kind, namespace, &workload, guard, &policy.devices, &view()).unwrap()
}

/// The toleration the GPU stack's agents carry for GPU nodes' taint.
fn gpu_toleration() -> Value {
    json!({"key": GPU_TOLERATION, "operator": "Exists", "effect": "NoSchedule"})
}

/// GPU feature discovery, NVIDIA/k8s-device-plugin v0.20.0
/// `deployments/static/gpu-feature-discovery-daemonset.yaml`: no device, no priority class,
/// one of three alternative node-affinity terms on `nvidia.com/gpu.present`.
fn gfd_static_spec() -> Value {
    json!({
        "containers": [{"name": "gpu-feature-discovery",
            "image": "nvcr.io/nvidia/k8s-device-plugin:v0.19.3",
            "command": ["/usr/bin/gpu-feature-discovery"],
            "securityContext": {"privileged": true},
            "volumeMounts": [{"name": "output-dir", "mountPath": "/etc/kubernetes/node-feature-discovery/features.d"},
                             {"name": "host-sys", "mountPath": "/sys"}]}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}]},
            {"matchExpressions": [{"key": "feature.node.kubernetes.io/cpu-model.vendor_id", "operator": "In", "values": ["NVIDIA"]}]},
            {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}
        ]}}},
        "volumes": [{"name": "output-dir", "hostPath": {"path": "/etc/kubernetes/node-feature-discovery/features.d", "type": "DirectoryOrCreate"}},
                    {"name": "host-sys", "hostPath": {"path": "/sys", "type": "Directory"}}]
    })
}

/// An operand of the GPU operator (NVIDIA/gpu-operator v26.7 `assets/state-*/0*_daemonset.yaml`):
/// its `nvidia.com/gpu.deploy.<operand>` node selector, the GPU taint toleration and the
/// ClusterPolicy's `daemonsets.priorityClassName` (default system-node-critical).
fn operand_spec(operand: &str, container: &str) -> Value {
    json!({
        "nodeSelector": {format!("nvidia.com/gpu.deploy.{operand}"): "true"},
        "tolerations": [gpu_toleration()],
        "priorityClassName": "system-node-critical",
        "hostPID": true,
        "containers": [{"name": container, "image": "nvcr.io/nvidia/k8s/operand",
                        "securityContext": {"privileged": true}}],
        "volumes": [{"name": "run-nvidia", "hostPath": {"path": "/run/nvidia", "type": "DirectoryOrCreate"}}]
    })
}

/// The NFD worker, kubernetes-sigs/node-feature-discovery v0.18 Helm chart
/// `templates/worker.yaml` with the chart's `priorityClassName: ""` and the
/// `worker.tolerations` the GPU operator's chart gives it (`nvidia.com/gpu`).
fn nfd_worker_spec() -> Value {
    json!({
        "dnsPolicy": "ClusterFirstWithHostNet",
        "serviceAccountName": "node-feature-discovery-worker",
        "tolerations": [
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "value": "", "effect": "NoSchedule"},
            gpu_toleration()
        ],
        "containers": [{"name": "worker", "image": "registry.k8s.io/nfd/node-feature-discovery:v0.18.0",
            "command": ["nfd-worker"],
            "resources": {"limits": {"memory": "512Mi"}, "requests": {"cpu": "5m", "memory": "64Mi"}},
            "volumeMounts": [{"name": "host-sys", "mountPath": "/host-sys", "readOnly": true}]}],
        "volumes": [{"name": "host-sys", "hostPath": {"path": "/sys"}}]
    })
}

/// NVIDIA's IMEX compute-domain daemon, NVIDIA/k8s-dra-driver-gpu
/// `templates/compute-domain-daemon.tmpl.yaml`: tolerates every taint, no priority class, one
/// DRA claim of a ResourceClaimTemplate the driver's controller creates (DeviceClass
/// compute-domain-daemon.nvidia.com, not a GPU).
fn compute_domain_daemon_spec() -> Value {
    json!({
        "serviceAccountName": "compute-domain-daemon-service-account",
        "nodeSelector": {"resource.nvidia.com/computeDomain": "0c5e"},
        "containers": [{"name": "compute-domain-daemon", "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0",
            "command": ["compute-domain-daemon", "run"],
            "resources": {"claims": [{"name": "compute-domain-daemon"}]}}],
        "tolerations": [
            {"operator": "Exists", "effect": "NoSchedule"},
            {"operator": "Exists", "effect": "NoExecute"},
            {"operator": "Exists", "effect": "PreferNoSchedule"}
        ],
        "resourceClaims": [{"name": "compute-domain-daemon",
                            "resourceClaimTemplateName": "imex-channel-0c5e-daemon-claim"}]
    })
}

#[test]
fn the_gpu_stacks_own_agents_are_not_judged_by_default_and_the_switch_judges_them() {
    let ds = GuardedKind::DaemonSet;
    let pod = GuardedKind::Pod;
    // (what, kind, object, verdict by default, verdict with nodeAgents: false)
    let rows: Vec<(&str, GuardedKind, Value, &str, &str)> = vec![
        // Issue 27, defect 4: denied before, for its third node-affinity term.
        (
            "GFD static DaemonSet",
            ds,
            daemonset_object("default", "gpu-feature-discovery", gfd_static_spec()),
            "exempt",
            "violation",
        ),
        // NVIDIA/k8s-device-plugin v0.20.0 deployments/static/nvidia-device-plugin.yml.
        (
            "NVIDIA device plugin",
            ds,
            daemonset_object(
                "kube-system",
                "nvidia-device-plugin-daemonset",
                json!({
                    "tolerations": [gpu_toleration()],
                    "priorityClassName": "system-node-critical",
                    "containers": [{"name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                        "volumeMounts": [{"name": "kubelet-device-plugins-dir", "mountPath": "/var/lib/kubelet/device-plugins"}]}],
                    "volumes": [{"name": "kubelet-device-plugins-dir", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}}]
                }),
            ),
            "exempt",
            "priority met",
        ),
        // NVIDIA/dcgm-exporter dcgm-exporter.yaml (4.8.2) with the GPU taint toleration a
        // tainted GPU pool needs (its Helm values suggest `operator: Exists`); no class.
        (
            "DCGM exporter",
            ds,
            daemonset_object(
                "monitoring",
                "dcgm-exporter",
                json!({
                    "automountServiceAccountToken": false,
                    "tolerations": [gpu_toleration()],
                    "containers": [{"name": "dcgm-exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless",
                        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}},
                        "resources": {"limits": {"cpu": "200m", "memory": "256Mi"}},
                        "volumeMounts": [{"name": "pod-gpu-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": true}]}],
                    "volumes": [{"name": "pod-gpu-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}}]
                }),
            ),
            "exempt",
            "violation",
        ),
        // NVIDIA/k8s-dra-driver-gpu Helm chart templates/kubeletplugin.yaml with its values.
        (
            "NVIDIA DRA kubelet plugin",
            ds,
            daemonset_object(
                "nvidia-dra-driver-gpu",
                "nvidia-dra-driver-gpu-kubelet-plugin",
                json!({
                    "priorityClassName": "system-node-critical",
                    "serviceAccountName": "nvidia-dra-driver-gpu-service-account-kubeletplugin",
                    "initContainers": [{"name": "init-container", "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0",
                                        "securityContext": {"privileged": true}}],
                    "containers": [{"name": "gpus", "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0",
                                    "securityContext": {"privileged": true}}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}]},
                        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}
                    ]}}},
                    "tolerations": [gpu_toleration()],
                    "volumes": [{"name": "plugins", "hostPath": {"path": "/var/lib/kubelet/plugins"}}]
                }),
            ),
            "exempt",
            "priority met",
        ),
        // Its claim's template is not known offline: whether it is a device decides nothing
        // for a node agent unless the claim is a device, then the device minimum (0) is met.
        (
            "DRA compute-domain daemon",
            ds,
            daemonset_object(
                "nvidia-dra-driver-gpu",
                "imex-channel-0c5e",
                compute_domain_daemon_spec(),
            ),
            "exempt",
            "unjudged",
        ),
        (
            "GPU operator driver",
            ds,
            daemonset_object(
                "gpu-operator",
                "nvidia-driver-daemonset",
                operand_spec("driver", "nvidia-driver-ctr"),
            ),
            "exempt",
            "priority met",
        ),
        (
            "GPU operator container toolkit",
            ds,
            daemonset_object(
                "gpu-operator",
                "nvidia-container-toolkit-daemonset",
                operand_spec("container-toolkit", "nvidia-container-toolkit-ctr"),
            ),
            "exempt",
            "priority met",
        ),
        (
            "GPU operator validator",
            ds,
            daemonset_object(
                "gpu-operator",
                "nvidia-operator-validator",
                operand_spec("operator-validator", "nvidia-operator-validator"),
            ),
            "exempt",
            "priority met",
        ),
        (
            "GPU operator MIG manager",
            ds,
            daemonset_object(
                "gpu-operator",
                "nvidia-mig-manager",
                operand_spec("mig-manager", "nvidia-mig-manager"),
            ),
            "exempt",
            "priority met",
        ),
        (
            "GPU operator node-status exporter",
            ds,
            daemonset_object(
                "gpu-operator",
                "nvidia-node-status-exporter",
                operand_spec("node-status-exporter", "nvidia-node-status-exporter"),
            ),
            "exempt",
            "priority met",
        ),
        (
            "NFD worker",
            ds,
            daemonset_object("node-feature-discovery", "nfd-worker", nfd_worker_spec()),
            "exempt",
            "violation",
        ),
        // ROCm/k8s-device-plugin Helm chart amd-gpu templates/deviceplugin-daemonset.yaml with
        // its values: AMD nodes are selected by an NFD label the default policy does not list
        // and the chart tolerates no GPU taint, so it does not target GPU nodes at all.
        (
            "AMD device plugin (Helm)",
            ds,
            daemonset_object(
                "kube-system",
                "amd-gpu-device-plugin-daemonset",
                json!({
                    "nodeSelector": {"feature.node.kubernetes.io/pci-0300_1002.present": "true", "kubernetes.io/arch": "amd64"},
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                    "containers": [{"name": "amd-gpu-dp-cntr", "image": "docker.io/rocm/k8s-device-plugin:1.25.2.4"}],
                    "volumes": [{"name": "dp", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}]
                }),
            ),
            "not targeting",
            "not targeting",
        ),
        // ROCm/k8s-device-plugin k8s-ds-amdgpu-labeller.yaml, on a node pool tainted
        // amd.com/gpu (so given that toleration); no class.
        (
            "AMD node labeller",
            ds,
            daemonset_object(
                "kube-system",
                "amdgpu-labeller-daemonset",
                json!({
                    "serviceAccount": "amd-gpu",
                    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                                    {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "amdgpu-lr-cntr", "image": "rocm/k8s-device-plugin:labeller-latest",
                        "command": ["./k8s-node-labeller"], "securityContext": {"privileged": true},
                        "volumeMounts": [{"name": "dev", "mountPath": "/dev"}]}],
                    "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}]
                }),
            ),
            "exempt",
            "violation",
        ),
        // The pods these DaemonSets create are treated like their DaemonSet.
        (
            "NFD worker pod",
            pod,
            daemonset_pod("node-feature-discovery", "nfd-worker", nfd_worker_spec(), 0),
            "exempt",
            "violation",
        ),
        // The repro's pod: its affinity replaced by the node's name, no GPU toleration.
        (
            "GFD static pod",
            pod,
            daemonset_pod("default", "gpu-feature-discovery", gfd_static_spec(), 0),
            "not targeting",
            "not targeting",
        ),
        (
            "DRA compute-domain daemon pod",
            pod,
            daemonset_pod(
                "nvidia-dra-driver-gpu",
                "imex-channel-0c5e",
                compute_domain_daemon_spec(),
                0,
            ),
            "exempt",
            "unjudged",
        ),
    ];
    let default = Policy::default().guard;
    let mut judged = default.clone();
    judged.exemptions.node_agents = false;
    for (what, kind, object, by_default, when_judged) in &rows {
        let verdict = judge_object(*kind, object, &default);
        assert_eq!(outcome(&verdict), *by_default, "{what}: {verdict:?}");
        if let Verdict::Allowed(Allowed::Exempt(why)) = &verdict {
            assert!(
                why.starts_with("node agent, not judged: this "),
                "{what}: {why}"
            );
            assert!(
                why.ends_with("(guard.exemptions.nodeAgents)"),
                "{what}: {why}"
            );
        }
        let verdict = judge_object(*kind, object, &judged);
        assert_eq!(
            outcome(&verdict),
            *when_judged,
            "{what} judged: {verdict:?}"
        );
    }
}

#[test]
fn the_gfd_repro_is_denied_when_node_agents_are_judged_for_its_third_affinity_term() {
    let mut guard = Policy::default().guard;
    let object = daemonset_object("default", "gpu-feature-discovery", gfd_static_spec());
    assert_eq!(
        judge_object(GuardedKind::DaemonSet, &object, &guard),
        Verdict::Allowed(Allowed::Exempt(
            "node agent, not judged: this DaemonSet uses no device, and a DaemonSet runs one pod \
             on each node it selects (guard.exemptions.nodeAgents)"
                .into()
        ))
    );
    guard.exemptions.node_agents = false;
    let Verdict::Violation(found) = judge_object(GuardedKind::DaemonSet, &object, &guard) else {
        panic!("judged, the GFD DaemonSet targets GPU nodes below 1000")
    };
    assert_eq!(
        target_paths(&found),
        [format!(
            "{C}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.\
             nodeSelectorTerms[2].matchExpressions[0]"
        )]
    );
    assert_eq!((found.minimum, found.uses_device), (1000, false));
    // A pod of it names its DaemonSet.
    let pod = daemonset_pod("node-feature-discovery", "nfd-worker", nfd_worker_spec(), 0);
    let Verdict::Allowed(Allowed::Exempt(why)) =
        judge_object(GuardedKind::Pod, &pod, &Policy::default().guard)
    else {
        panic!("the NFD worker pod is a node agent")
    };
    assert!(
        why.contains("this pod of DaemonSet node-feature-discovery/nfd-worker uses no device"),
        "{why}"
    );
}

#[test]
fn ordinary_low_priority_workloads_are_still_denied_beside_node_agents() {
    let guard = Policy::default().guard;
    assert!(
        guard.exemptions.node_agents,
        "node agents are exempt by default"
    );
    let tolerating = json!({"tolerations": [gpu_toleration()],
                            "containers": [{"name": "app", "image": "registry.example/app:1"}]});
    let owned_pod = |owner: Value, spec: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p-1", "namespace": "team", "ownerReferences": owner},
               "spec": spec})
    };
    let mut pod_spec = tolerating.clone();
    pod_spec["priority"] = json!(0);
    let mut gpu_pod_spec = json!({"priority": -10, "containers": [{"name": "burn",
        "resources": {"limits": {"nvidia.com/gpu": 1}}}]});
    let gpu_daemonset = json!({"priorityClassName": "preemptible", "containers": [{"name": "burn",
        "resources": {"limits": {"nvidia.com/gpu": 1}}}]});
    let template_owner = |kind: &str, spec: &Value| {
        let spec = if kind == "CronJob" {
            json!({"schedule": "@hourly", "jobTemplate": {"spec": {"template": {"spec": spec}}}})
        } else {
            json!({"template": {"spec": spec}})
        };
        json!({"kind": kind, "metadata": {"name": "w", "namespace": "team"}, "spec": spec})
    };
    let rows: Vec<(&str, GuardedKind, Value)> = vec![
        (
            "a Deployment tolerating nvidia.com/gpu",
            GuardedKind::Deployment,
            template_owner("Deployment", &tolerating),
        ),
        (
            "a StatefulSet tolerating nvidia.com/gpu",
            GuardedKind::StatefulSet,
            template_owner("StatefulSet", &tolerating),
        ),
        (
            "a Job selecting GPU nodes",
            GuardedKind::Job,
            template_owner(
                "Job",
                &json!({
            "nodeSelector": {"nvidia.com/gpu.present": "true"}, "containers": [{"name": "etl"}]}),
            ),
        ),
        (
            "a CronJob tolerating nvidia.com/gpu",
            GuardedKind::CronJob,
            template_owner("CronJob", &tolerating),
        ),
        (
            "a notebook Pod",
            GuardedKind::Pod,
            owned_pod(Value::Null, pod_spec.clone()),
        ),
        // actions-runner-controller's runner pods are controlled by an EphemeralRunner.
        (
            "a CI runner Pod",
            GuardedKind::Pod,
            owned_pod(
                json!([{"apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner", "name": "runner-abc", "controller": true}]),
                pod_spec.clone(),
            ),
        ),
        // A DaemonSet owner that is not the controller does not make a node agent.
        (
            "a ReplicaSet's Pod also owned by a DaemonSet",
            GuardedKind::Pod,
            owned_pod(
                json!([
            {"kind": "DaemonSet", "name": "d", "controller": false},
            {"kind": "ReplicaSet", "name": "web-5d8f7c", "controller": true}]),
                pod_spec.clone(),
            ),
        ),
        // A DaemonSet that takes a GPU on every node competes for GPUs: the device minimum.
        (
            "a preemptible DaemonSet using a GPU",
            GuardedKind::DaemonSet,
            daemonset_object("team", "burn-in", gpu_daemonset),
        ),
        ("its pod", GuardedKind::Pod, {
            gpu_pod_spec["tolerations"] = json!([gpu_toleration()]);
            daemonset_pod("team", "burn-in", gpu_pod_spec, -10)
        }),
    ];
    for (what, kind, object) in rows {
        let verdict = judge_object(kind, &object, &guard);
        assert_eq!(outcome(&verdict), "violation", "{what}: {verdict:?}");
    }
}

#[test]
fn operator_pods_outside_a_daemonset_are_exempted_through_their_controller() {
    // NVIDIA/gpu-operator validator/manifests/cuda-workload-validation.yaml, as
    // cmd/nvidia-validator creates it: the validator DaemonSet's ownerReferences (the
    // ClusterPolicy, controller) and tolerations, its node's name, no device request, no class.
    let cuda_validator = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "nvidia-cuda-validator-", "namespace": "gpu-operator",
            "labels": {"app": "nvidia-cuda-validator"},
            "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                                 "name": "cluster-policy", "uid": "9a1e", "controller": true}]},
        "spec": {"priority": 0, "nodeName": "gpu-1", "restartPolicy": "OnFailure",
            "tolerations": [gpu_toleration()],
            "initContainers": [{"name": "cuda-validation", "securityContext": {"privileged": true}}],
            "containers": [{"name": "nvidia-cuda-validator"}]}});
    let mut guard = Policy::default().guard;
    assert_eq!(
        outcome(&judge_object(GuardedKind::Pod, &cuda_validator, &guard)),
        "violation",
        "not a node agent: its controller is the ClusterPolicy"
    );
    guard.exemptions.workloads = vec![ExemptWorkload {
        namespace: "gpu-operator".into(),
        name: "cluster-policy".into(),
        // The policy file names the kinds the guard judges; without a kind, any controller.
        kind: None,
    }];
    assert_eq!(
        judge_object(GuardedKind::Pod, &cuda_validator, &guard),
        Verdict::Allowed(Allowed::Exempt(
            "its ClusterPolicy gpu-operator/cluster-policy is exempt".into()
        ))
    );
}
