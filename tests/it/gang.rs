//! `/mutate` on gangs: JobSets, Kubeflow Trainer runtimes and the child Jobs of a JobSet, in
//! AdmissionReviews shaped as kube-apiserver v1.36 sends them, from the real examples of the
//! jobset, kueue and trainer repositories (`tests/fixtures/jobset/`, `tests/fixtures/trainer/`).

use base64::Engine as _;
use gpu_guard_core::api_rules::jobset::check_jobset_spec;
use gpu_guard_core::devices::NoDraFacts;
use gpu_guard_core::field::FieldPath;
use gpu_guard_core::guard::StaticView;
use gpu_guard_core::jobset::JobSetSpec;
use gpu_guard_core::mutate::patch;
use gpu_guard_core::policy::Policy;
use gpu_guard_core::wellknown::MUTATED_ANNOTATION;
use gpu_guard_webhook::admission::{ReviewOutcome, Reviewed, Webhook, review};
use json_patch::Patch;
use serde_json::{Value, json};

use crate::reviews;
use reviews::{JOBSET, fixture, manifest, review_of};

const CLUSTER_RUNTIME: (&str, &str, &str, &str) = (
    "trainer.kubeflow.org",
    "v1alpha1",
    "ClusterTrainingRuntime",
    "clustertrainingruntimes",
);

fn mutate(body: &Value) -> Reviewed {
    let policy = Policy::embedded();
    let view = StaticView::from_policy(&policy.guard.offline);
    review(Webhook::Mutate, body.to_string().as_bytes(), &policy, &view).expect("reviewed")
}

fn response(reviewed: &Reviewed) -> Value {
    serde_json::from_slice::<Value>(&reviewed.body).unwrap()["response"].clone()
}

/// The object with the response's patch applied, as the API server would store it.
fn patched(object: &Value, reviewed: &Reviewed) -> Value {
    let response = response(reviewed);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .unwrap();
    let patch: Patch = serde_json::from_slice(&bytes).unwrap();
    patch::apply(object, &patch).expect("the patch applies")
}

/// Gives every container of the JobSet spec at `pointer` 8 GPUs.
fn with_gpus(mut object: Value, pointer: &str) -> Value {
    let jobs = object
        .pointer_mut(&format!("{pointer}/replicatedJobs"))
        .and_then(Value::as_array_mut)
        .unwrap();
    for job in jobs {
        for container in job
            .pointer_mut("/template/spec/template/spec/containers")
            .and_then(Value::as_array_mut)
            .unwrap()
        {
            container["resources"]["limits"]["nvidia.com/gpu"] = json!("8");
        }
    }
    object
}

fn jobset_spec(object: &Value, pointer: &str) -> JobSetSpec {
    serde_json::from_value(object.pointer(pointer).unwrap().clone()).unwrap()
}

#[test]
fn a_kueue_managed_gpu_jobset_is_protected_at_create_and_keeps_kueues_defaults() {
    // Kueue's sample JobSet (kueue v0.19.2) with GPUs, as the API server sends it to the
    // mutating webhooks: named, and suspended by Kueue's own webhook.
    let mut jobset = with_gpus(manifest("jobset/kueue-sample-jobset.yaml"), "/spec");
    jobset["metadata"]["name"] = json!("sleep-job-x7k2p");
    jobset["metadata"]["namespace"] = json!("gpu-lab");
    jobset["spec"]["suspend"] = json!(true);
    jobset["spec"]["managedBy"] = json!("kueue.x-k8s.io/multikueue");
    jobset["spec"]["futureField"] = json!({"kept": [1, 2]});
    let reviewed = mutate(&review_of(JOBSET, &jobset, None, "alice"));
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched);
    let stored = patched(&jobset, &reviewed);

    // What Kueue set, and what gpu-guard does not know, are as they were.
    for pointer in [
        "/spec/suspend",
        "/spec/managedBy",
        "/spec/futureField",
        "/metadata/labels",
    ] {
        assert_eq!(
            stored.pointer(pointer),
            jobset.pointer(pointer),
            "{pointer}"
        );
    }
    let spec = jobset_spec(&stored, "/spec");
    assert_eq!(check_jobset_spec(&spec, &FieldPath::new(["spec"])), vec![]);
    let rules = &stored["spec"]["failurePolicy"]["rules"];
    assert_eq!(rules[0]["name"], "gpuGuardDeviceRestart");
    let names: Vec<Value> = jobset["spec"]["replicatedJobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["name"].clone())
        .collect();
    assert_eq!(rules[0]["targetReplicatedJobs"], Value::Array(names));
    for job in spec.replicated_jobs {
        let pod = job.template.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"), "{}", job.name);
    }
    assert!(
        stored["metadata"]["annotations"][MUTATED_ANNOTATION]
            .as_str()
            .unwrap()
            .contains("failurePolicy: 2 gang rules, maxRestarts=5")
    );
    assert!(
        response(&reviewed)["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("restartPolicy was empty"))
    );

    // The reinvocation (reinvocationPolicy: IfNeeded) changes nothing.
    let again = mutate(&review_of(JOBSET, &stored, None, "alice"));
    assert_eq!(again.outcome, ReviewOutcome::Allowed);
    assert_eq!(again.patch_bytes, 0);
}

#[test]
fn a_jobsets_own_failure_policy_is_kept_behind_gpu_guards_rules() {
    // JobSet's host-maintenance example (jobset v0.12.0) with GPUs.
    let mut jobset = with_gpus(
        manifest("jobset/host-maintenance-event-model.yaml"),
        "/spec",
    );
    jobset["metadata"]["namespace"] = json!("gpu-lab");
    let own_rules = jobset["spec"]["failurePolicy"]["rules"].clone();
    let stored = patched(&jobset, &mutate(&review_of(JOBSET, &jobset, None, "alice")));
    let rules = stored["spec"]["failurePolicy"]["rules"].as_array().unwrap();
    let gpu_guards = rules
        .iter()
        .take_while(|rule| rule["name"].as_str().unwrap().starts_with("gpuGuard"))
        .count();
    assert!(gpu_guards >= 1);
    // The JobSet's rules follow, as they were, an unnamed one named as JobSet would name it.
    let mut named = own_rules.clone();
    for (index, rule) in named.as_array_mut().unwrap().iter_mut().enumerate() {
        if rule.get("name").is_none() {
            rule["name"] = json!(format!("failurePolicyRule{index}"));
        }
    }
    assert_eq!(Value::Array(rules[gpu_guards..].to_vec()), named);
    let max_restarts = jobset["spec"]["failurePolicy"]["maxRestarts"]
        .as_i64()
        .unwrap_or(0);
    assert_eq!(
        stored["spec"]["failurePolicy"]["maxRestarts"],
        max_restarts + 5
    );
    let spec = jobset_spec(&stored, "/spec");
    assert_eq!(check_jobset_spec(&spec, &FieldPath::new(["spec"])), vec![]);
}

#[test]
fn a_cluster_training_runtime_protects_every_trainjob_built_from_it() {
    // Trainer's torchtune runtime (trainer v2.3.0): one GPU replicated Job among three.
    let runtime = manifest("trainer/torchtune-llama3.2-1b.yaml");
    let reviewed = mutate(&review_of(CLUSTER_RUNTIME, &runtime, None, "admin"));
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched);
    let stored = patched(&runtime, &reviewed);
    let spec = jobset_spec(&stored, "/spec/template/spec");
    assert_eq!(
        check_jobset_spec(&spec, &FieldPath::new(["spec", "template", "spec"])),
        vec![]
    );
    let rules = &stored["spec"]["template"]["spec"]["failurePolicy"]["rules"];
    assert_eq!(rules[0]["targetReplicatedJobs"], json!(["node"]));
    // The initializers use no device: untouched.
    let before = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        .as_array()
        .unwrap();
    let after = stored["spec"]["template"]["spec"]["replicatedJobs"]
        .as_array()
        .unwrap();
    for (old, new) in before.iter().zip(after) {
        if old["name"] != "node" {
            assert_eq!(old, new);
        }
    }
    // The JobSet Trainer builds from it carries the rules already: nothing more to add.
    let mut jobset = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "tune-1", "namespace": "gpu-lab"}});
    jobset["spec"] = stored["spec"]["template"]["spec"].clone();
    let built = mutate(&review_of(
        JOBSET,
        &jobset,
        None,
        "system:serviceaccount:kubeflow-system:trainer",
    ));
    assert_eq!(built.patch_bytes, 0);
}

#[test]
fn a_child_job_of_a_jobset_gets_no_per_pod_rules_and_the_audit_says_why() {
    // The plain GPU Job fixture as the JobSet controller would create it.
    let mut body = fixture("001-Job-CREATE-mutate.json");
    let job = &mut body["request"]["object"];
    job["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train",
        "uid": "5c3e1a8e-2b7d-4d0f-9e8a-1f2a3b4c5d6e", "controller": true,
        "blockOwnerDeletion": true}]);
    job["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = json!("train");
    let reviewed = mutate(&body);
    assert_eq!(reviewed.outcome, ReviewOutcome::Allowed);
    let response = response(&reviewed);
    assert!(response.get("patch").is_none());
    assert!(
        response["auditAnnotations"]["mutation"]
            .as_str()
            .unwrap()
            .contains("a child Job of a JobSet"),
        "{response}"
    );
    // A Job of the same shape that no JobSet owns is protected as before.
    let plain = mutate(&fixture("001-Job-CREATE-mutate.json"));
    assert_eq!(plain.outcome, ReviewOutcome::Patched);
}

/// The response's warnings.
fn warnings(reviewed: &Reviewed) -> Vec<String> {
    response(reviewed)["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|warning| warning.as_str().unwrap().to_owned())
        .collect()
}

/// The engine's whole warnings for a JobSet object (the CLI prints them uncut).
fn full_warnings(jobset: &Value) -> Vec<String> {
    let mutation =
        gpu_guard_core::mutate::object::mutate_object(jobset, &Policy::embedded(), &NoDraFacts)
            .expect("a JobSet")
            .expect("it decodes");
    mutation.outcome.warnings().to_vec()
}

#[test]
fn a_child_rule_that_fails_on_any_error_keeps_the_device_codes_it_decides() {
    // The failure-policy shape of JobSet's KEP-262: the leader's Job fails on any exit code
    // but 143 (`NotIn`), and the JobSet fails on a podFailurePolicy failure. gpu-guard's own
    // exit-code rule in front would turn exit 74 into a gang restart; the user said fail.
    let mut jobset = with_gpus(
        manifest("jobset/onjobfailurereasons-present-podfailurepolicy.yaml"),
        "/spec",
    );
    jobset["metadata"]["namespace"] = json!("gpu-lab");
    let leader_rule = json!({"action": "FailJob", "onExitCodes":
        {"containerName": "leader", "operator": "NotIn", "values": [143]}});
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"] =
        json!({"rules": [leader_rule.clone()]});
    jobset["spec"]["failurePolicy"]["rules"] = json!([{"name": "leaderFails", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]);
    let reviewed = mutate(&review_of(JOBSET, &jobset, None, "alice"));
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched);
    let stored = patched(&jobset, &reviewed);
    let leader =
        &stored["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"];
    // The condition rules go first; no exit-code rule of gpu-guard's; the user's rule last.
    let leader = leader.as_array().unwrap();
    assert_eq!(leader.last(), Some(&leader_rule));
    assert!(
        leader
            .iter()
            .all(|rule| rule.get("onExitCodes").is_none() || rule == &leader_rule),
        "{leader:?}"
    );
    // The workers have no rule of their own: they get the device codes.
    let workers =
        &stored["spec"]["replicatedJobs"][1]["template"]["spec"]["podFailurePolicy"]["rules"];
    assert!(
        workers
            .as_array()
            .unwrap()
            .iter()
            .any(|rule| rule["onExitCodes"]["values"] == json!([74, 75, 138])),
        "{workers}"
    );
    assert!(
        warnings(&reviewed).iter().any(|w| w.contains(
            "replicatedJob leader: exit code(s) [74, 75, 138] of leader are left to the Job's \
             own FailJob rule"
        )),
        "{:?}",
        warnings(&reviewed)
    );
    let spec = jobset_spec(&stored, "/spec");
    assert_eq!(check_jobset_spec(&spec, &FieldPath::new(["spec"])), vec![]);
}

#[test]
fn null_fields_of_a_jobset_read_as_absent() {
    // JobSet's config/samples leave keys empty (`spec:`), and so do hand-written manifests
    // (`rules:`); the API server drops such nulls of a custom resource before defaulting.
    let mut jobset = with_gpus(manifest("jobset/kueue-sample-jobset.yaml"), "/spec");
    jobset["metadata"]["namespace"] = json!("gpu-lab");
    jobset["spec"]["failurePolicy"] = json!({"maxRestarts": null, "rules": null});
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["tolerations"] =
        json!(null);
    let reviewed = mutate(&review_of(JOBSET, &jobset, None, "alice"));
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched, "{:?}", reviewed);
    let stored = patched(&jobset, &reviewed);
    assert_eq!(
        stored["spec"]["failurePolicy"]["rules"][0]["name"],
        "gpuGuardDeviceRestart"
    );
    let spec = jobset_spec(&stored, "/spec");
    assert_eq!(check_jobset_spec(&spec, &FieldPath::new(["spec"])), vec![]);

    // `spec: null`: nothing to protect, nothing refused.
    let empty = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "empty", "namespace": "gpu-lab"}, "spec": null});
    let reviewed = mutate(&review_of(JOBSET, &empty, None, "alice"));
    assert_eq!(reviewed.outcome, ReviewOutcome::Allowed);
    assert_eq!(reviewed.patch_bytes, 0);
}

#[test]
fn a_gpu_jobset_that_jobset_would_refuse_is_left_unchanged_with_the_reason() {
    let base = || {
        let mut jobset = with_gpus(manifest("jobset/kueue-sample-jobset.yaml"), "/spec");
        jobset["metadata"]["namespace"] = json!("gpu-lab");
        jobset
    };
    let first_name = base()["spec"]["replicatedJobs"][0]["name"].clone();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "a rule naming a missing replicated Job",
            json!({"rules": [{"name": "r", "action": "RestartJobSet",
                "targetReplicatedJobs": ["leader-typo"]}]}),
            "spec.failurePolicy.rules[0].targetReplicatedJobs[0]: Invalid value: \"leader-typo\"",
        ),
        (
            "an action the CRD does not know",
            json!({"rules": [{"name": "r", "action": "RestartJobset"}]}),
            "spec.failurePolicy.rules[0].action: Unsupported value: \"RestartJobset\"",
        ),
    ];
    for (case, failure_policy, violation) in cases {
        let mut jobset = base();
        jobset["spec"]["failurePolicy"] = failure_policy;
        let reviewed = mutate(&review_of(JOBSET, &jobset, None, "alice"));
        assert_eq!(reviewed.outcome, ReviewOutcome::Allowed, "{case}");
        assert_eq!(reviewed.patch_bytes, 0, "{case}");
        let warnings = warnings(&reviewed);
        assert!(
            warnings.iter().any(|w| w.starts_with(
                "gpu-guard: JobSet left unchanged: JobSet's webhook or the API server will reject"
            )),
            "{case}: {warnings:?}"
        );
        // The whole warning (the webhook's are cut at 120 characters) names the field.
        let full = full_warnings(&jobset);
        assert!(
            full.iter().any(|w| w.contains(violation)),
            "{case}: {full:?}"
        );
        assert!(
            !warnings.iter().any(|w| w.contains("raised from")),
            "{case}: no warning tells of a change that was not made: {warnings:?}"
        );
    }

    // A replicated Job name the child Job names cannot carry (JobSet names them
    // `<jobset>-<replicatedJob>-<index>`, a DNS-1035 label).
    let mut jobset = base();
    jobset["spec"]["replicatedJobs"][0]["name"] = json!("Workers_1");
    let reviewed = mutate(&review_of(JOBSET, &jobset, None, "alice"));
    assert_eq!(reviewed.patch_bytes, 0);
    assert!(
        full_warnings(&jobset).iter().any(|w| w.contains(
            "spec.replicatedJobs[0].name: Invalid value: \"Workers_1\": the child Job name"
        )),
        "{:?}",
        full_warnings(&jobset)
    );
    // A JobSet name that makes the child Job names longer than 63 characters.
    let mut jobset = base();
    jobset["metadata"]["name"] = json!("a".repeat(60));
    let reviewed = mutate(&review_of(JOBSET, &jobset, None, "alice"));
    assert_eq!(reviewed.patch_bytes, 0, "{first_name}");
    assert!(
        full_warnings(&jobset)
            .iter()
            .any(|w| w.contains("job names generated for this JobSet will exceed 63 characters")),
        "{:?}",
        full_warnings(&jobset)
    );
}
