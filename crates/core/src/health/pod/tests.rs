//! Table tests of the pod verdicts and the condition patch ([`super`]).

use super::*;
use k8s_openapi::api::core::v1::{
    PodSpec, PodStatus, ResourceHealth, ResourceRequirements, ResourceStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

fn pod(resource: Option<&str>, phase: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("train-0".to_owned()),
            namespace: Some("ml".to_owned()),
            owner_references: Some(vec![owner("Job")]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("gpu-1".to_owned()),
            containers: vec![Container {
                name: "trainer".to_owned(),
                resources: resource.map(|resource| ResourceRequirements {
                    limits: Some([(resource.to_owned(), Quantity("1".to_owned()))].into()),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(phase.to_owned()),
            ..PodStatus::default()
        }),
    }
}

fn health(mut pod: Pod, resource: &str, devices: &[(&str, &str)]) -> Pod {
    pod.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        name: "trainer".to_owned(),
        allocated_resources_status: Some(vec![ResourceStatus {
            name: resource.to_owned(),
            resources: Some(
                devices
                    .iter()
                    .map(|(id, health)| ResourceHealth {
                        resource_id: (*id).to_owned(),
                        health: Some((*health).to_owned()),
                        message: None,
                    })
                    .collect(),
            ),
        }]),
        ..ContainerStatus::default()
    }]);
    pod
}

fn owner(kind: &str) -> OwnerReference {
    OwnerReference {
        api_version: "batch/v1".to_owned(),
        kind: kind.to_owned(),
        name: "train".to_owned(),
        uid: "uid-train".to_owned(),
        controller: Some(true),
        ..OwnerReference::default()
    }
}

fn marked(mut pod: Pod, status: &str) -> Pod {
    pod.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: DEVICE_FAILURE_CONDITION.to_owned(),
        status: status.to_owned(),
        ..PodCondition::default()
    }]);
    pod
}

fn deleting(mut pod: Pod) -> Pod {
    pod.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    pod
}

fn degraded(resource: &str) -> NodeState {
    NodeState {
        degraded: [resource.to_owned()].into(),
    }
}

fn unhealthy(ids: &[&str]) -> Cause {
    Cause::UnhealthyDevice {
        container: "trainer".to_owned(),
        resource: "nvidia.com/gpu".to_owned(),
        device_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
    }
}

fn node_degraded() -> Cause {
    Cause::NodeDegraded {
        node: "gpu-1".to_owned(),
        resource: "nvidia.com/gpu".to_owned(),
    }
}

fn act(cause: Cause, mark: bool, evict: bool) -> Action {
    Action::Act { cause, mark, evict }
}

/// (name, pod, node state, mark_pods, evict_pods, action)
type Row = (&'static str, Pod, Option<NodeState>, bool, bool, Action);

#[test]
fn verdicts() {
    let gpu = Some("nvidia.com/gpu");
    let sick = |phase| {
        health(
            pod(gpu, phase),
            "nvidia.com/gpu",
            &[("GPU-a", "Healthy"), ("GPU-b", "Unhealthy")],
        )
    };
    let tainted = degraded("nvidia.com/gpu");
    // (name, pod, node state, mark_pods, evict_pods, action)
    let table: Vec<Row> = vec![
        (
            "healthy device pod",
            pod(gpu, "Running"),
            None,
            true,
            false,
            Action::Nothing,
        ),
        (
            "all devices healthy",
            health(
                pod(gpu, "Running"),
                "nvidia.com/gpu",
                &[("GPU-a", "Healthy"), ("GPU-b", "Unknown")],
            ),
            None,
            true,
            true,
            Action::Nothing,
        ),
        (
            "unhealthy device: mark",
            sick("Running"),
            None,
            true,
            false,
            act(unhealthy(&["GPU-b"]), true, false),
        ),
        (
            "unhealthy device: mark and evict",
            sick("Running"),
            None,
            true,
            true,
            act(unhealthy(&["GPU-b"]), true, true),
        ),
        (
            "unhealthy device: evict only",
            sick("Pending"),
            None,
            false,
            true,
            act(unhealthy(&["GPU-b"]), false, true),
        ),
        (
            "neither configured",
            sick("Running"),
            None,
            false,
            false,
            Action::Nothing,
        ),
        (
            "already marked",
            marked(sick("Running"), "True"),
            None,
            true,
            false,
            Action::Nothing,
        ),
        (
            "already marked, eviction still due",
            marked(sick("Running"), "True"),
            None,
            true,
            true,
            act(unhealthy(&["GPU-b"]), false, true),
        ),
        (
            "a False condition is not a mark",
            marked(sick("Running"), "False"),
            None,
            true,
            false,
            act(unhealthy(&["GPU-b"]), true, false),
        ),
        (
            "failed pod: marked (the Job may not have counted it yet), never evicted",
            sick("Failed"),
            None,
            true,
            true,
            act(unhealthy(&["GPU-b"]), true, false),
        ),
        (
            "succeeded pod: nothing",
            sick("Succeeded"),
            None,
            true,
            true,
            Action::Nothing,
        ),
        (
            "terminating pod: not evicted again",
            deleting(sick("Running")),
            None,
            false,
            true,
            Action::Nothing,
        ),
        (
            "node tainted for the pod's resource",
            pod(gpu, "Running"),
            Some(tainted.clone()),
            true,
            true,
            act(node_degraded(), true, true),
        ),
        (
            "node tainted for another resource",
            pod(gpu, "Running"),
            Some(degraded("amd.com/gpu")),
            true,
            true,
            Action::Nothing,
        ),
        (
            "node not tainted",
            pod(gpu, "Running"),
            Some(NodeState::default()),
            true,
            true,
            Action::Nothing,
        ),
        (
            "not a device pod",
            pod(Some("cpu"), "Running"),
            Some(tainted.clone()),
            true,
            true,
            Action::Nothing,
        ),
        (
            "no resources",
            pod(None, "Running"),
            Some(tainted.clone()),
            true,
            true,
            Action::Nothing,
        ),
        (
            "the unhealthy device wins over the node",
            sick("Running"),
            Some(tainted.clone()),
            true,
            false,
            act(unhealthy(&["GPU-b"]), true, false),
        ),
        (
            "an unconfigured resource reported unhealthy is ignored",
            health(
                pod(gpu, "Running"),
                "example.com/fpga",
                &[("F-1", "Unhealthy")],
            ),
            None,
            true,
            false,
            Action::Nothing,
        ),
        (
            "a DRA claim reported unhealthy counts",
            health(
                pod(gpu, "Running"),
                "claim:gpu/req-0",
                &[("gpu.nvidia.com/pool-a/gpu-0", "Unhealthy")],
            ),
            None,
            true,
            false,
            act(
                Cause::UnhealthyDevice {
                    container: "trainer".to_owned(),
                    resource: "claim:gpu/req-0".to_owned(),
                    device_ids: vec!["gpu.nvidia.com/pool-a/gpu-0".to_owned()],
                },
                true,
                false,
            ),
        ),
    ];
    for (name, pod, node, mark_pods, evict_pods, expected) in table {
        let mut policy = Policy::default();
        policy.controller.pods.mark_pods = mark_pods;
        policy.controller.pods.evict_pods = evict_pods;
        assert_eq!(
            pod_verdict(&pod, node.as_ref(), &policy),
            expected,
            "{name}"
        );
    }
}

#[test]
fn init_containers_count_as_device_users() {
    let mut pod = pod(None, "Running");
    let spec = pod.spec.as_mut().unwrap();
    spec.init_containers = Some(vec![Container {
        name: "warmup".to_owned(),
        resources: Some(ResourceRequirements {
            requests: Some([("nvidia.com/mig-1g.5gb".to_owned(), Quantity("1".to_owned()))].into()),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }]);
    assert_eq!(
        device_resources(&pod, &Policy::default()),
        ["nvidia.com/mig-1g.5gb".to_owned()].into()
    );
}

#[test]
fn the_condition_patch() {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    assert_eq!(
        condition_patch("uid-1", &unhealthy(&["GPU-b", "GPU-c"]), now),
        json!({"metadata": {"uid": "uid-1"}, "status": {"conditions": [{
            "type": "gpu-guard.io/DeviceFailure",
            "status": "True",
            "reason": "UnhealthyDevice",
            "message": "nvidia.com/gpu device GPU-b, GPU-c allocated to container trainer is \
                        reported Unhealthy by the kubelet; gpu-guard marks the pod so its \
                        failure is retried",
            "lastTransitionTime": "2027-01-15T08:00:00Z",
        }]}})
    );
    assert_eq!(
        node_degraded().message(),
        "node gpu-1 is tainted gpu-guard.io/device-degraded=nvidia.com_gpu by gpu-guard: its \
         nvidia.com/gpu devices are degraded; gpu-guard marks the pod so its failure is retried"
    );
}

#[test]
fn a_dra_only_pod_reported_unhealthy_is_marked_and_evicted() {
    // It requests no device resource: only a DRA claim, whose device the kubelet reports.
    let dra = health(
        pod(None, "Running"),
        "claim:gpu-claim/gpu",
        &[("gpu.nvidia.com/pool-a/gpu-0", "Unhealthy")],
    );
    let mut policy = Policy::default();
    policy.controller.pods.evict_pods = true;
    assert_eq!(
        pod_verdict(&dra, None, &policy),
        act(
            Cause::UnhealthyDevice {
                container: "trainer".to_owned(),
                resource: "claim:gpu-claim/gpu".to_owned(),
                device_ids: vec!["gpu.nvidia.com/pool-a/gpu-0".to_owned()],
            },
            true,
            true
        )
    );
    // Healthy, or on a degraded node it does not use a device resource of: nothing.
    let fine = health(
        pod(None, "Running"),
        "claim:gpu-claim/gpu",
        &[("gpu.nvidia.com/pool-a/gpu-0", "Healthy")],
    );
    assert_eq!(
        pod_verdict(&fine, Some(&degraded("nvidia.com/gpu")), &policy),
        Action::Nothing
    );
}

#[test]
fn pods_nothing_recreates_elsewhere_or_that_tolerate_the_taint_are_marked_not_evicted() {
    let mut policy = Policy::default();
    policy.controller.pods.evict_pods = true;
    let gpu = Some("nvidia.com/gpu");
    let tainted = degraded("nvidia.com/gpu");
    let sick = || {
        health(
            pod(gpu, "Running"),
            "nvidia.com/gpu",
            &[("GPU-b", "Unhealthy")],
        )
    };
    let on_node = |edit: &dyn Fn(&mut Pod)| {
        let mut pod = pod(gpu, "Running");
        edit(&mut pod);
        pod_verdict(&pod, Some(&tainted), &policy)
    };
    assert_eq!(on_node(&|_| {}), act(node_degraded(), true, true));
    // No controller: it would not be recreated.
    assert_eq!(
        on_node(&|pod| pod.metadata.owner_references = None),
        act(node_degraded(), true, false)
    );
    assert_eq!(
        on_node(&|pod| pod.metadata.owner_references.as_mut().unwrap()[0].controller = None),
        act(node_degraded(), true, false)
    );
    // A DaemonSet's pod comes back on the same node.
    assert_eq!(
        on_node(&|pod| pod.metadata.owner_references = Some(vec![owner("DaemonSet")])),
        act(node_degraded(), true, false)
    );
    // A mirror pod of a static pod: a Node controls it, the kubelet recreates it in place.
    assert_eq!(
        on_node(&|pod| pod.metadata.owner_references = Some(vec![owner("Node")])),
        act(node_degraded(), true, false)
    );
    // Its annotation alone is enough (whatever owner it names).
    assert_eq!(
        on_node(&|pod| {
            pod.metadata.annotations =
                Some([(MIRROR_ANNOTATION.to_owned(), "5e1f…".to_owned())].into());
        }),
        act(node_degraded(), true, false)
    );
    let mut bare = sick();
    bare.metadata.owner_references = None;
    assert_eq!(
        pod_verdict(&bare, None, &policy),
        act(unhealthy(&["GPU-b"]), true, false)
    );
    // Tolerating the taint: the scheduler would put it back on the node.
    let toleration =
        |key: Option<&str>, operator: &str, value: Option<&str>, effect: Option<&str>| {
            k8s_openapi::api::core::v1::Toleration {
                key: key.map(str::to_owned),
                operator: Some(operator.to_owned()),
                value: value.map(str::to_owned),
                effect: effect.map(str::to_owned),
                toleration_seconds: None,
            }
        };
    for (tolerations, tolerated) in [
        (
            vec![toleration(Some(DEGRADED_TAINT_KEY), "Exists", None, None)],
            true,
        ),
        (vec![toleration(None, "Exists", None, None)], true),
        (
            vec![toleration(
                Some(DEGRADED_TAINT_KEY),
                "Equal",
                Some("nvidia.com_gpu"),
                Some("NoSchedule"),
            )],
            true,
        ),
        (
            vec![toleration(
                Some(DEGRADED_TAINT_KEY),
                "Equal",
                Some("amd.com_gpu"),
                None,
            )],
            false,
        ),
        (
            vec![toleration(
                Some(DEGRADED_TAINT_KEY),
                "Exists",
                None,
                Some("NoExecute"),
            )],
            false,
        ),
        (vec![toleration(Some("other"), "Exists", None, None)], false),
    ] {
        let verdict = on_node(&|pod| {
            pod.spec.as_mut().unwrap().tolerations = Some(tolerations.clone());
        });
        assert_eq!(
            verdict,
            act(node_degraded(), true, !tolerated),
            "{tolerations:?}"
        );
    }
    // An unhealthy device is evicted even when the pod tolerates the node's taint.
    let mut sick_tolerating = sick();
    sick_tolerating.spec.as_mut().unwrap().tolerations =
        Some(vec![toleration(None, "Exists", None, None)]);
    assert_eq!(
        pod_verdict(&sick_tolerating, Some(&tainted), &policy),
        act(unhealthy(&["GPU-b"]), true, true)
    );
}

#[test]
fn only_the_policys_dra_devices_count_and_a_claim_without_a_request_is_read() {
    let mut policy = Policy::default();
    policy.controller.pods.evict_pods = true;
    let dra_pod = |entry: &str, id: &str| health(pod(None, "Running"), entry, &[(id, "Unhealthy")]);
    let hit = |entry: &str, id: &str| {
        act(
            Cause::UnhealthyDevice {
                container: "trainer".to_owned(),
                resource: entry.to_owned(),
                device_ids: vec![id.to_owned()],
            },
            true,
            true,
        )
    };
    // (name, allocatedResourcesStatus entry, resource ID, counted)
    let table = [
        (
            "the kubelet's fallback ID <driver>/<pool>/<device>",
            "claim:gpu/req-0",
            "gpu.nvidia.com/node-1/gpu-3",
            true,
        ),
        (
            "NVIDIA's CDI ID: vendor k8s.<driver>",
            "claim:gpu/req-0",
            "k8s.gpu.nvidia.com/device=gpu-3",
            true,
        ),
        (
            "a claim reference without a request: claim:<name>",
            "claim:gpu",
            "gpu.amd.com/node-1/gpu-0",
            true,
        ),
        (
            "an unhealthy NIC claimed through DRA",
            "claim:net/nic",
            "k8s.sriov.example.com/vf=eth1",
            false,
        ),
        (
            "an ID that names no driver is never guessed to be a GPU",
            "claim:gpu",
            "gpu-0",
            false,
        ),
    ];
    for (name, entry, id, counted) in table {
        let expected = if counted {
            hit(entry, id)
        } else {
            Action::Nothing
        };
        assert_eq!(
            pod_verdict(&dra_pod(entry, id), None, &policy),
            expected,
            "{name}"
        );
    }
    // A NIC and a GPU in the same claim: only the GPU is named.
    let mixed = health(
        pod(None, "Running"),
        "claim:all",
        &[
            ("k8s.sriov.example.com/vf=eth1", "Unhealthy"),
            ("gpu.nvidia.com/node-1/gpu-3", "Unhealthy"),
        ],
    );
    assert_eq!(
        pod_verdict(&mixed, None, &policy),
        hit("claim:all", "gpu.nvidia.com/node-1/gpu-3")
    );
}

/// A rank of gang `uid-train` (index `index`, created at second `created`), its phase `phase`.
fn rank(name: &str, index: u32, phase: &str, created: i64) -> PodFacts {
    let mut pod = pod(Some("nvidia.com/gpu"), phase);
    pod.metadata.name = Some(name.to_owned());
    pod.metadata.uid = Some(format!("uid-{name}"));
    pod.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
    pod.metadata.labels = Some([(JOB_UID_LABEL.to_owned(), "uid-train".to_owned())].into());
    pod.metadata.annotations = Some(
        [
            (GANG_KEY.to_owned(), "true".to_owned()),
            (COMPLETION_INDEX_ANNOTATION.to_owned(), index.to_string()),
        ]
        .into(),
    );
    PodFacts::of(&pod, &Policy::default())
}

#[test]
fn peers_are_the_running_unmarked_ranks_of_the_same_gang_that_ran_beside_the_failed_one() {
    let mut failed = rank("train-2", 2, "Running", 100);
    failed.unhealthy = Some(Cause::UnhealthyDevice {
        container: "trainer".to_owned(),
        resource: "nvidia.com/gpu".to_owned(),
        device_ids: vec!["GPU-1234".to_owned()],
    });
    assert_eq!(failed.gang.as_deref(), Some("uid-train"));
    assert!(!failed.peers_due(false), "not marked yet");
    assert!(
        failed.peers_due(true),
        "marked now, its device reported unhealthy"
    );
    let since = Some(Timestamp::from_second(200).unwrap());

    let peer = rank("train-0", 0, "Running", 100);
    assert!(peer.is_peer_of(&failed, since));
    assert!(rank("train-1", 1, "Pending", 100).is_peer_of(&failed, since));
    let not_peers = [
        ("itself", failed.clone()),
        ("its replacement", rank("train-2-b", 2, "Pending", 100)),
        ("terminated", rank("train-1", 1, "Failed", 100)),
        (
            "created after the mark",
            rank("train-3-b", 3, "Running", 300),
        ),
        (
            "marked already",
            PodFacts {
                marked: true,
                ..peer.clone()
            },
        ),
        (
            "a peer already",
            PodFacts {
                peer_marked: true,
                ..peer.clone()
            },
        ),
        (
            "another Job",
            PodFacts {
                gang: Some("uid-other".to_owned()),
                ..peer.clone()
            },
        ),
        (
            "not a gang pod",
            PodFacts {
                gang: None,
                ..peer.clone()
            },
        ),
        (
            "another namespace",
            PodFacts {
                namespace: "dev".to_owned(),
                ..peer.clone()
            },
        ),
    ];
    for (what, pod) in not_peers {
        assert!(!pod.is_peer_of(&failed, since), "{what}");
    }
    // Without a bound (the failed pod marked just now), a pod created later counts.
    assert!(rank("train-3-b", 3, "Running", 300).is_peer_of(&failed, None));

    // A pod without the annotation, or without the Job's label, is in no gang.
    let mut plain = pod(Some("nvidia.com/gpu"), "Running");
    plain.metadata.labels = Some([(JOB_UID_LABEL.to_owned(), "uid-train".to_owned())].into());
    assert_eq!(PodFacts::of(&plain, &Policy::default()).gang, None);
    plain.metadata.annotations = Some([(GANG_KEY.to_owned(), "true".to_owned())].into());
    plain.metadata.labels = None;
    assert_eq!(PodFacts::of(&plain, &Policy::default()).gang, None);

    // Marked earlier for its node, running on a healthy device: nothing has failed yet.
    let healthy = PodFacts {
        marked: true,
        ..rank("train-2", 2, "Running", 100)
    };
    assert!(!healthy.peers_due(false));
    let failed_later = PodFacts {
        phase: Some("Failed".to_owned()),
        ..healthy
    };
    assert!(failed_later.peers_due(false));
}

#[test]
fn the_peer_condition_names_the_failed_pod_and_its_node_and_carries_the_peers_uid() {
    let failed = rank("train-2", 2, "Running", 100);
    let patch = peer_condition_patch("uid-train-0", &failed, Timestamp::from_second(0).unwrap());
    assert_eq!(
        patch,
        json!({"metadata": {"uid": "uid-train-0"}, "status": {"conditions": [{
            "type": "gpu-guard.io/PeerDeviceFailure", "status": "True",
            "reason": "PeerDeviceFailure",
            "message": "pod train-2 of the same gang, on node gpu-1, was hit by a device \
                        failure; gpu-guard marks this peer so its failure, which follows from \
                        it, is retried",
            "lastTransitionTime": "1970-01-01T00:00:00Z"}]}})
    );
}

#[test]
fn only_the_unfinished_pods_of_the_workload_still_lacking_it_need_the_budget_condition() {
    let workload = WorkloadRef {
        kind: WorkloadKind::Job,
        namespace: "ml".to_owned(),
        name: "train".to_owned(),
    };
    let running = PodFacts {
        namespace: "ml".to_owned(),
        name: "train-a".to_owned(),
        phase: Some("Running".to_owned()),
        workload: Some((WorkloadKind::Job, "train".to_owned())),
        ..PodFacts::default()
    };
    assert!(running.needs_retries_exhausted(&workload));
    let pending = PodFacts {
        phase: Some("Pending".to_owned()),
        ..running.clone()
    };
    assert!(pending.needs_retries_exhausted(&workload));
    for other in [
        PodFacts {
            retries_exhausted: true,
            ..running.clone()
        },
        PodFacts {
            phase: Some("Failed".to_owned()),
            ..running.clone()
        },
        PodFacts {
            deleting: true,
            ..running.clone()
        },
        PodFacts {
            namespace: "other".to_owned(),
            ..running.clone()
        },
        PodFacts {
            workload: Some((WorkloadKind::JobSet, "train".to_owned())),
            ..running.clone()
        },
        PodFacts {
            workload: None,
            ..running.clone()
        },
    ] {
        assert!(!other.needs_retries_exhausted(&workload), "{other:?}");
    }
    let patch = retries_exhausted_patch(
        "uid-1",
        "4 on record",
        "2027-01-15T08:00:00Z".parse().unwrap(),
    );
    assert_eq!(patch["metadata"]["uid"], "uid-1");
    let condition = &patch["status"]["conditions"][0];
    assert_eq!(condition["type"], "gpu-guard.io/DeviceRetriesExhausted");
    assert_eq!(condition["reason"], "DeviceRetryBudgetExhausted");
    assert_eq!(condition["status"], "True");
}
