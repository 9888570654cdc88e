//! `/validate`: the GPU-node guard on real AdmissionReview requests from kube-apiserver v1.36
//! (the fixtures), and on variants of them.

use gpu_guard_core::guard::{ClusterView, KnownNode, StaticView};
use gpu_guard_core::policy::{GuardMode, Policy};
use gpu_guard_core::wellknown::{GUARD_AUDIT_KEY, GUARD_UNJUDGED_AUDIT_KEY};
use gpu_guard_webhook::admission::{ReviewError, ReviewOutcome, Reviewed, Webhook, review};
use serde_json::{Value, json};

use crate::reviews;
use reviews::{JOB, JOBSET, KUEUE, fixture, manifest, review_of};

fn run(body: &Value, policy: &Policy) -> Result<Reviewed, ReviewError> {
    let view = StaticView::from_policy(&policy.guard.offline);
    review(
        Webhook::Validate,
        body.to_string().as_bytes(),
        policy,
        &view,
    )
}

fn answer(reviewed: &Reviewed) -> Value {
    serde_json::from_slice::<Value>(&reviewed.body).unwrap()["response"].clone()
}

/// The Pod fixture without priority, made to tolerate the GPU taint.
fn tolerating_pod() -> Value {
    let mut body = fixture("016-Pod-CREATE-validate.json");
    body["request"]["object"]["spec"]["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}));
    body
}

#[test]
fn the_fixtures_are_allowed_and_judged() {
    let policy = Policy::embedded();
    for name in [
        "002-Job-CREATE-validate.json",
        "012-CronJob-CREATE-validate.json",
        "014-Pod-CREATE-validate.json",
        "016-Pod-CREATE-validate.json",
        "020-Job-CREATE-validate.json",
    ] {
        let reviewed = run(&fixture(name), &policy).unwrap();
        let response = answer(&reviewed);
        assert_eq!(response["allowed"], true, "{name}");
        assert!(response.get("warnings").is_none(), "{name}: {response}");
        let guard = reviewed
            .guard
            .unwrap_or_else(|| panic!("{name} was not judged"));
        assert_eq!((guard.mode, guard.outcome), (GuardMode::Enforce, "allowed"));
    }
    // A Job UPDATE that leaves the pod spec alone is not judged again.
    let reviewed = run(&fixture("018-Job-UPDATE-validate.json"), &policy).unwrap();
    assert_eq!(answer(&reviewed)["allowed"], true);
    assert_eq!(reviewed.guard, None);
}

#[test]
fn a_low_priority_pod_tolerating_the_gpu_taint_is_denied_with_the_fix() {
    let body = tolerating_pod();
    let reviewed = run(&body, &Policy::embedded()).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Denied);
    let response = answer(&reviewed);
    assert_eq!(response["uid"], body["request"]["uid"]);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    assert_eq!(response["status"]["reason"], "Forbidden");
    let message = response["status"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        "gpu-guard: Pod gpu-lab/pod-no-priority targets GPU nodes without using a device, so it \
         needs priority >= 1000, but its priority is 0 (spec.priority). Why it targets GPU nodes: \
         spec.tolerations[2] tolerates the GPU node taint nvidia.com/gpu. Fix: set \
         spec.priorityClassName to a PriorityClass with value >= 1000, or remove the \
         nvidia.com/gpu toleration if it does not need a GPU node."
    );
    assert_eq!(response["auditAnnotations"][GUARD_AUDIT_KEY], message);
    // The skip annotation does not help.
    let mut skipping = body.clone();
    skipping["request"]["object"]["metadata"]["annotations"] = json!({"gpu-guard.io/skip": "true"});
    assert_eq!(
        run(&skipping, &Policy::embedded()).unwrap().outcome,
        ReviewOutcome::Denied
    );
    // A dry run gets the same answer.
    let mut dry = body.clone();
    dry["request"]["dryRun"] = json!(true);
    assert_eq!(
        answer(&run(&dry, &Policy::embedded()).unwrap())["status"]["message"],
        message
    );
}

#[test]
fn a_gpu_pod_below_the_device_minimum_is_denied() {
    let mut policy = Policy::embedded();
    policy.guard.minimum_priority.with_device = 200_000;
    let reviewed = run(&fixture("014-Pod-CREATE-validate.json"), &policy).unwrap();
    let message = answer(&reviewed)["status"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.starts_with(
            "gpu-guard: Pod gpu-lab/pod-gpu-priority targets GPU nodes and uses a device, so it \
             needs priority >= 200000, but its priority is 100000 (spec.priority, from \
             PriorityClass \"gpu-high\")"
        ),
        "{message}"
    );
    assert!(message.contains("spec.containers[0].resources.limits[nvidia.com/gpu]"));
}

#[test]
fn warn_and_audit_modes_allow_and_say_so() {
    let mut policy = Policy::embedded();
    policy
        .guard
        .namespace_modes
        .insert("gpu-lab".into(), GuardMode::Warn);
    let reviewed = run(&tolerating_pod(), &policy).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Warned);
    assert_eq!(reviewed.guard.unwrap().mode, GuardMode::Warn);
    let response = answer(&reviewed);
    assert_eq!(response["allowed"], true);
    assert!(response.get("status").is_none());
    let warnings: Vec<&str> = response["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(
        warnings[..2],
        [
            "gpu-guard: Pod gpu-lab/pod-no-priority: priority 0 is below the minimum 1000 for GPU nodes",
            "gpu-guard: tolerations[2]: tolerates the GPU node taint nvidia.com/gpu",
        ]
    );
    assert_eq!(
        warnings[2..],
        [
            "gpu-guard: fix: set priorityClassName to a class with value >= 1000",
            "gpu-guard: or, if it needs no GPU node, remove the nvidia.com/gpu toleration",
        ]
    );
    assert!(warnings.iter().all(|w| w.chars().count() <= 120));

    policy.guard.namespace_modes.clear();
    policy.guard.mode = GuardMode::Audit;
    let reviewed = run(&tolerating_pod(), &policy).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Audited);
    let response = answer(&reviewed);
    assert_eq!(response["allowed"], true);
    assert!(response.get("warnings").is_none());
    assert!(
        response["auditAnnotations"][GUARD_AUDIT_KEY]
            .as_str()
            .unwrap()
            .contains("spec.tolerations[2] tolerates the GPU node taint nvidia.com/gpu")
    );
}

/// A Deployment review built from the Pod fixture's envelope.
fn deployment_review(operation: &str, spec: Value, old_spec: Option<Value>) -> Value {
    let mut body = fixture("016-Pod-CREATE-validate.json");
    let object = |spec: Value| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "gpu-lab"},
               "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}}})
    };
    let request = &mut body["request"];
    request["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    request["resource"] = json!({"group": "apps", "version": "v1", "resource": "deployments"});
    request["operation"] = json!(operation);
    request["name"] = json!("web");
    request["object"] = object(spec);
    request["oldObject"] = old_spec.map_or(Value::Null, object);
    body
}

#[test]
fn templates_are_judged_at_create_and_at_updates_that_change_the_pod_spec() {
    let policy = Policy::embedded();
    let plain = json!({"containers": [{"name": "web", "image": "nginx"}]});
    let tolerating = json!({"containers": [{"name": "web", "image": "nginx"}],
                            "tolerations": [{"operator": "Exists"}]});

    let created = run(
        &deployment_review("CREATE", tolerating.clone(), None),
        &policy,
    )
    .unwrap();
    assert_eq!(created.outcome, ReviewOutcome::Denied);
    let message = answer(&created)["status"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("Deployment gpu-lab/web"), "{message}");
    assert!(message.contains("spec.template.spec.tolerations[0] tolerates every taint"));
    assert!(message.contains(
        "set spec.template.spec.priorityClassName to a PriorityClass with value >= 1000"
    ));

    // An UPDATE adding the toleration is denied; one leaving it (scaling, relabelling) is not
    // judged, so a workload admitted before its namespace opted in stays manageable.
    let adding = deployment_review("UPDATE", tolerating.clone(), Some(plain.clone()));
    assert_eq!(
        run(&adding, &policy).unwrap().outcome,
        ReviewOutcome::Denied
    );
    let unchanged = deployment_review("UPDATE", tolerating.clone(), Some(tolerating.clone()));
    let reviewed = run(&unchanged, &policy).unwrap();
    assert_eq!(
        (reviewed.outcome, reviewed.guard),
        (ReviewOutcome::Allowed, None)
    );

    // Subresources and deletions are not judged.
    let mut status = deployment_review("UPDATE", tolerating.clone(), Some(plain.clone()));
    status["request"]["subResource"] = json!("status");
    assert_eq!(
        run(&status, &policy).unwrap().outcome,
        ReviewOutcome::Allowed
    );
    let mut deleting = adding.clone();
    deleting["request"]["object"]["metadata"]["deletionTimestamp"] = json!("2026-11-29T15:43:04Z");
    assert_eq!(
        run(&deleting, &policy).unwrap().outcome,
        ReviewOutcome::Allowed
    );

    // The mutating webhook never judges.
    let view = StaticView::from_policy(&policy.guard.offline);
    let mutated = review(
        Webhook::Mutate,
        deployment_review("CREATE", tolerating, None)
            .to_string()
            .as_bytes(),
        &policy,
        &view,
    )
    .unwrap();
    assert_eq!(
        (mutated.outcome, mutated.guard),
        (ReviewOutcome::Allowed, None)
    );
}

#[test]
fn exempt_namespaces_are_counted_as_exempt() {
    let mut policy = Policy::embedded();
    policy.guard.exemptions.namespaces = vec!["gpu-lab".into()];
    let reviewed = run(&tolerating_pod(), &policy).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Allowed);
    assert_eq!(reviewed.guard.unwrap().outcome, "exempt");
}

#[test]
fn a_malformed_object_is_a_bad_request() {
    let body = tolerating_pod().to_string();
    let at = body.find("\"object\":{").unwrap() + "\"object\":{".len();
    let broken = format!("{}\"metadata\": {{,{}", &body[..at], &body[at..]);
    let view = StaticView::from_policy(&Policy::embedded().guard.offline);
    let error = review(
        Webhook::Validate,
        broken.as_bytes(),
        &Policy::embedded(),
        &view,
    )
    .unwrap_err();
    assert!(!error.is_internal(), "{error}");
    assert!(
        error
            .to_string()
            .starts_with("the body is not a JSON AdmissionReview"),
        "{error}"
    );
}

/// A cache that has not listed yet.
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
fn an_unsynced_cache_is_an_internal_error_only_when_a_lookup_is_needed() {
    let policy = Policy::embedded();
    // A Pod carries its resolved priority: no lookup.
    let pod = review(
        Webhook::Validate,
        tolerating_pod().to_string().as_bytes(),
        &policy,
        &Unsynced,
    )
    .unwrap();
    assert_eq!(pod.outcome, ReviewOutcome::Denied);
    // A template without a class needs the global default.
    let body = deployment_review(
        "CREATE",
        json!({"tolerations": [{"operator": "Exists"}]}),
        None,
    );
    let error = review(
        Webhook::Validate,
        body.to_string().as_bytes(),
        &policy,
        &Unsynced,
    )
    .unwrap_err();
    assert!(error.is_internal());
    assert!(error.to_string().contains("has not synced yet"), "{error}");
}

#[test]
fn without_a_cluster_an_unknown_class_is_reported_not_denied() {
    // The Job names PriorityClass gpu-high, which the embedded policy does not list.
    let body = fixture("006-Job-CREATE-validate.json");
    let mut policy = Policy::embedded();
    let reviewed = run(&body, &policy).unwrap();
    assert_eq!(reviewed.guard.unwrap().outcome, "unjudged");
    let sent = answer(&reviewed);
    assert_eq!(sent["allowed"], true);
    assert_eq!(
        sent["warnings"],
        json!(["gpu-guard: priority not checked: PriorityClass \"gpu-high\" is unknown offline"])
    );
    // The audit log says what `serve` can do about it: no `check` flag.
    assert_eq!(
        sent["auditAnnotations"][GUARD_UNJUDGED_AUDIT_KEY],
        "gpu-guard: PriorityClass \"gpu-high\" is not known offline, so the priority of this \
         workload, which targets GPU nodes, was not checked; list it in \
         guard.offline.priorityClasses, or run the webhook with a cluster (without --no-cluster)"
    );
    // Listed in the policy file, it is judged (and a GPU job at 100000 passes).
    policy
        .guard
        .offline
        .priority_classes
        .push(gpu_guard_core::policy::OfflinePriorityClass {
            name: "gpu-high".into(),
            value: 100_000,
            global_default: false,
        });
    let reviewed = run(&body, &policy).unwrap();
    assert_eq!(reviewed.guard.unwrap().outcome, "allowed");
    assert!(answer(&reviewed).get("warnings").is_none());
}

#[test]
fn a_pod_update_adding_a_gpu_toleration_is_judged() {
    let policy = Policy::embedded();
    let mut body = tolerating_pod();
    let old = fixture("016-Pod-CREATE-validate.json")["request"]["object"].clone();
    body["request"]["operation"] = json!("UPDATE");
    body["request"]["oldObject"] = old.clone();
    assert_eq!(run(&body, &policy).unwrap().outcome, ReviewOutcome::Denied);
    // An UPDATE that leaves the pod spec alone (a label, say) is not judged again.
    let mut relabel = body.clone();
    relabel["request"]["oldObject"] = body["request"]["object"].clone();
    relabel["request"]["object"]["metadata"]["labels"] = json!({"team": "a"});
    let reviewed = run(&relabel, &policy).unwrap();
    assert_eq!(
        (reviewed.outcome, reviewed.guard),
        (ReviewOutcome::Allowed, None)
    );
}

// === JobSets, Trainer runtimes and Kueue ===

/// Kueue's sample JobSet (two CPU replicatedJobs) as the API server holds it after CREATE:
/// named, in `gpu-lab`, suspended by Kueue's webhook.
fn kueue_jobset() -> Value {
    let mut jobset = manifest("jobset/kueue-sample-jobset.yaml");
    jobset["metadata"]["name"] = json!("sleep-job-x7k2p");
    jobset["metadata"]["namespace"] = json!("gpu-lab");
    jobset["spec"]["suspend"] = json!(true);
    jobset
}

/// What Kueue's UPDATE does when it admits a suspended workload on a flavor of GPU nodes: the
/// flavor's nodeSelector, tolerations and labels into each pod template, `suspend: false`.
fn admitted_on_gpu_flavor(object: &Value, templates: &[&str]) -> Value {
    let mut admitted = object.clone();
    admitted["spec"]["suspend"] = json!(false);
    for pointer in templates {
        let template = admitted.pointer_mut(pointer).unwrap();
        template["metadata"]["labels"]["kueue.x-k8s.io/podset"] = json!("main");
        template["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.present": "true"});
        template["spec"]["tolerations"] =
            json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]);
    }
    admitted
}

#[test]
fn a_jobset_is_judged_per_replicated_job_in_every_mode() {
    let mut jobset = kueue_jobset();
    jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["tolerations"] =
        json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]);
    let body = review_of(JOBSET, &jobset, None, "lab-admin");
    let mut policy = Policy::embedded();

    let reviewed = run(&body, &policy).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Denied);
    let response = answer(&reviewed);
    assert_eq!(response["uid"], body["request"]["uid"]);
    assert_eq!(response["status"]["code"], 403);
    assert_eq!(
        response["status"]["message"],
        "gpu-guard: JobSet gpu-lab/sleep-job-x7k2p replicatedJob \"driver\" targets GPU nodes \
         without using a device, so it needs priority >= 1000, but its priority is 0 (no \
         priorityClassName and no globalDefault PriorityClass). Why it targets GPU nodes: \
         spec.replicatedJobs[1].template.spec.template.spec.tolerations[0] tolerates the GPU \
         node taint nvidia.com/gpu. Fix: set \
         spec.replicatedJobs[1].template.spec.template.spec.priorityClassName to a \
         PriorityClass with value >= 1000, or remove the nvidia.com/gpu toleration if it does \
         not need a GPU node."
    );

    policy.guard.mode = GuardMode::Warn;
    let reviewed = run(&body, &policy).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Warned);
    let warnings = answer(&reviewed)["warnings"].clone();
    assert_eq!(
        warnings,
        json!([
            "gpu-guard: JobSet gpu-lab/sleep-job-x7k2p: priority 0 is below the minimum 1000 for GPU nodes",
            "gpu-guard: in replicatedJob \"driver\":",
            "gpu-guard: tolerations[0]: tolerates the GPU node taint nvidia.com/gpu",
            "gpu-guard: fix: set priorityClassName to a class with value >= 1000",
            "gpu-guard: or, if it needs no GPU node, remove the nvidia.com/gpu toleration",
        ])
    );

    policy.guard.mode = GuardMode::Audit;
    let reviewed = run(&body, &policy).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Audited);
    let response = answer(&reviewed);
    assert_eq!(response["allowed"], true);
    assert!(
        response["auditAnnotations"][GUARD_AUDIT_KEY]
            .as_str()
            .unwrap()
            .contains("spec.replicatedJobs[1].template.spec.template.spec.tolerations[0]")
    );
}

#[test]
fn a_jobset_update_is_judged_only_when_a_pod_template_changes() {
    let policy = Policy::embedded();
    let mut violating = kueue_jobset();
    violating["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["tolerations"] =
        json!([{"operator": "Exists"}]);
    // Admitted before its namespace opted in: relabelling it is not judged again.
    let mut relabelled = violating.clone();
    relabelled["metadata"]["labels"]["team"] = json!("research");
    let reviewed = run(
        &review_of(JOBSET, &relabelled, Some(&violating), "lab-admin"),
        &policy,
    )
    .unwrap();
    assert_eq!(
        (reviewed.outcome, reviewed.guard),
        (ReviewOutcome::Allowed, None)
    );
    // A change to another replicatedJob's template is: the whole object is judged again.
    let mut changed = violating.clone();
    changed["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["priorityClassName"] =
        json!("system-cluster-critical");
    let reviewed = run(
        &review_of(JOBSET, &changed, Some(&violating), "lab-admin"),
        &policy,
    )
    .unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Denied);
}

#[test]
fn kueue_admitting_a_suspended_job_or_jobset_on_a_gpu_flavor_is_judged_at_its_update() {
    // A CPU Job the user queues: Kueue's webhook labelled and suspended it.
    let mut job = fixture("002-Job-CREATE-validate.json")["request"]["object"].clone();
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = json!("user-queue");
    job["spec"]["suspend"] = json!(true);
    job["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "1"}});
    let jobset = kueue_jobset();
    for (gvk, created, templates) in [
        (JOB, job, &[("/spec/template", "spec.template.spec")][..]),
        (
            JOBSET,
            jobset,
            &[
                (
                    "/spec/replicatedJobs/0/template/spec/template",
                    "spec.replicatedJobs[0].template.spec.template.spec",
                ),
                (
                    "/spec/replicatedJobs/1/template/spec/template",
                    "spec.replicatedJobs[1].template.spec.template.spec",
                ),
            ][..],
        ),
    ] {
        let kind = gvk.2;
        let mut policy = Policy::embedded();
        // The user's CREATE: nothing targets GPU nodes yet.
        let reviewed = run(&review_of(gvk, &created, None, "lab-admin"), &policy).unwrap();
        assert_eq!(reviewed.outcome, ReviewOutcome::Allowed, "{kind}");
        assert_eq!(reviewed.guard.unwrap().outcome, "allowed", "{kind}");
        // Kueue's UPDATE places the low-priority workload on the GPU flavor.
        let pointers: Vec<&str> = templates.iter().map(|(pointer, _)| *pointer).collect();
        let admitted = admitted_on_gpu_flavor(&created, &pointers);
        let update = review_of(gvk, &admitted, Some(&created), KUEUE);
        let reviewed = run(&update, &policy).unwrap();
        assert_eq!(reviewed.outcome, ReviewOutcome::Denied, "{kind}");
        let message = answer(&reviewed)["status"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        for (_, spec) in templates {
            assert!(
                message.contains(&format!(
                    "{spec}.tolerations[0] tolerates the GPU node taint nvidia.com/gpu; \
                     {spec}.nodeSelector[nvidia.com/gpu.present] selects the GPU node label"
                )),
                "{kind}: {spec}: {message}"
            );
        }
        // In Warn mode Kueue's update goes through, and the warning says why.
        policy.guard.mode = GuardMode::Warn;
        let reviewed = run(&update, &policy).unwrap();
        assert_eq!(reviewed.outcome, ReviewOutcome::Warned, "{kind}");
        // Kueue evicting it suspends it and restores the templates: judged again, allowed.
        let reviewed = run(&review_of(gvk, &created, Some(&admitted), KUEUE), &policy).unwrap();
        assert_eq!(
            (reviewed.outcome, reviewed.guard.map(|guard| guard.outcome)),
            (ReviewOutcome::Allowed, Some("allowed")),
            "{kind}"
        );
    }
}

#[test]
fn trainer_runtimes_are_judged_and_a_cluster_runtime_under_the_default_mode() {
    const RUNTIME: (&str, &str, &str, &str) = (
        "trainer.kubeflow.org",
        "v1alpha1",
        "ClusterTrainingRuntime",
        "clustertrainingruntimes",
    );
    // The torchtune runtime asks for GPUs with priority 0: met (withDevice is 0).
    let runtime = manifest("trainer/torchtune-llama3.2-1b.yaml");
    let body = review_of(RUNTIME, &runtime, None, "lab-admin");
    assert!(body["request"].get("namespace").is_none());
    let mut policy = Policy::embedded();
    let reviewed = run(&body, &policy).unwrap();
    assert_eq!(reviewed.guard.unwrap().outcome, "allowed");
    // Its dataset initializer tolerating the GPU taint: judged under the default mode, as no
    // namespace's mode or exemption can apply to a runtime every namespace may use.
    let mut tolerating = runtime.clone();
    tolerating["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        ["tolerations"] = json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]);
    policy.guard.mode = GuardMode::Warn;
    policy
        .guard
        .namespace_modes
        .insert("gpu-lab".into(), GuardMode::Enforce);
    let reviewed = run(&review_of(RUNTIME, &tolerating, None, "lab-admin"), &policy).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Warned);
    assert_eq!(reviewed.guard.unwrap().mode, GuardMode::Warn);
    let warnings = answer(&reviewed)["warnings"].clone();
    assert_eq!(
        warnings.as_array().unwrap()[..2],
        [
            "gpu-guard: ClusterTrainingRuntime torchtune-llama3.2-1b: priority 0 is below the \
             minimum 1000 for GPU nodes",
            "gpu-guard: in replicatedJob \"dataset-initializer\":",
        ]
    );
    // A namespaced TrainingRuntime follows its namespace.
    let mut namespaced = tolerating.clone();
    namespaced["kind"] = json!("TrainingRuntime");
    namespaced["metadata"]["namespace"] = json!("gpu-lab");
    let reviewed = run(
        &review_of(
            (RUNTIME.0, RUNTIME.1, "TrainingRuntime", "trainingruntimes"),
            &namespaced,
            None,
            "lab-admin",
        ),
        &policy,
    )
    .unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Denied);
    let message = answer(&reviewed)["status"]["message"].clone();
    assert!(
        message.as_str().unwrap().contains(
            "TrainingRuntime gpu-lab/torchtune-llama3.2-1b replicatedJob \"dataset-initializer\""
        ),
        "{message}"
    );
    assert!(message.as_str().unwrap().contains(
        "spec.template.spec.replicatedJobs[0].template.spec.template.spec.tolerations[0]"
    ));
}

// === Node agents (issue 27, defect 4): the GPU stack's DaemonSets are not denied ===

const DAEMONSET: (&str, &str, &str, &str) = ("apps", "v1", "DaemonSet", "daemonsets");

/// `gpu-guard check` on the fixture `file`, with the policy `policy` (YAML) when given: exit code and the
/// JSON report.
fn check_json(policy: Option<&str>, file: &str) -> (i32, Value) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-guard"));
    if let Some(policy) = policy {
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy).unwrap();
        command.arg("--policy").arg(path);
    }
    let path = format!("{}/tests/fixtures/check/{file}", env!("CARGO_MANIFEST_DIR"));
    let out = command
        .args(["check", "-o", "json", "-f", &path])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "{stderr}");
    (
        out.status.code().unwrap(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

#[test]
fn check_does_not_deny_the_gpu_feature_discovery_daemonset_but_still_a_ci_runner() {
    let (code, report) = check_json(None, "gpu-stack-agents.yaml");
    // The CI runner is denied: exit 1.
    assert_eq!(code, 1, "{report}");
    let gfd = &report["findings"][0];
    assert_eq!(gfd["kind"], "DaemonSet");
    assert_eq!(gfd["name"], "gpu-feature-discovery");
    assert_eq!(gfd["verdict"], "exempt", "{gfd}");
    assert_eq!(
        gfd["message"],
        "node agent, not judged: this DaemonSet uses no device, and a DaemonSet runs one pod on \
         each node it selects (guard.exemptions.nodeAgents)"
    );
    let runner = &report["findings"][1];
    assert_eq!(
        (&runner["kind"], &runner["name"], &runner["verdict"]),
        (&json!("Deployment"), &json!("ci-runner"), &json!("denied")),
        "{runner}"
    );
    assert_eq!(runner["minimum"], 1000);
}

#[test]
fn check_judges_daemonsets_when_node_agents_are_switched_off() {
    let policy = "apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\n\
                  guard:\n  exemptions:\n    nodeAgents: false\n";
    let (code, report) = check_json(Some(policy), "gpu-stack-agents.yaml");
    assert_eq!(code, 1);
    let gfd = &report["findings"][0];
    assert_eq!(gfd["verdict"], "denied", "{gfd}");
    assert_eq!(
        gfd["reasons"],
        json!([{"field": "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[2].matchExpressions[0]",
                "what": "requires GPU label nvidia.com/gpu.present=true"}])
    );
    // Another exemption left as it was: node agents stay exempt.
    let policy = "apiVersion: gpu-guard.io/v1alpha1\nkind: Policy\n\
                  guard:\n  exemptions:\n    namespaces: [ci]\n";
    let (code, report) = check_json(Some(policy), "gpu-stack-agents.yaml");
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["findings"][0]["verdict"], "exempt");
    assert_eq!(report["findings"][1]["verdict"], "exempt");
}

#[test]
fn the_webhook_allows_a_node_agent_and_its_pods_as_check_does() {
    let gfd = manifest("check/gpu-stack-agents.yaml");
    let mut gfd = gfd.clone();
    gfd["metadata"]["namespace"] = json!("gpu-operator");
    let body = review_of(
        DAEMONSET,
        &gfd,
        None,
        "system:serviceaccount:gpu-operator:helm",
    );
    let mut policy = Policy::embedded();
    let reviewed = run(&body, &policy).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Allowed);
    assert_eq!(reviewed.guard.unwrap().outcome, "exempt");
    assert!(answer(&reviewed).get("warnings").is_none());

    // A pod of a DaemonSet that tolerates the GPU taint, as the DaemonSet controller creates it.
    let mut pod = tolerating_pod();
    pod["request"]["object"]["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
        "kind": "DaemonSet", "name": "nfd-worker", "uid": "5d1f", "controller": true,
        "blockOwnerDeletion": true}]);
    let reviewed = run(&pod, &policy).unwrap();
    assert_eq!(reviewed.guard.unwrap().outcome, "exempt");

    // Judged, both are denied, the DaemonSet for its third node-affinity term.
    policy.guard.exemptions.node_agents = false;
    let reviewed = run(&body, &policy).unwrap();
    assert_eq!(reviewed.outcome, ReviewOutcome::Denied);
    let message = answer(&reviewed)["status"]["message"].clone();
    assert!(
        message.as_str().unwrap().starts_with(
            "gpu-guard: DaemonSet gpu-operator/gpu-feature-discovery targets GPU nodes without \
             using a device, so it needs priority >= 1000"
        ),
        "{message}"
    );
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("nodeSelectorTerms[2].matchExpressions[0] requires GPU label nvidia.com/gpu.present=true"),
        "{message}"
    );
    assert_eq!(run(&pod, &policy).unwrap().outcome, ReviewOutcome::Denied);
}
