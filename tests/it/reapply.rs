//! Server-side apply re-applies: the AdmissionReview sequence an `kubectl apply --server-side`
//! (or Flux, Argo CD with server-side apply, or Trainer's JobSet apply) produces.
//!
//! At CREATE gpu-guard prepends its rules to the user's own `podFailurePolicy.rules` and appends
//! tolerations to the user's own. Both lists are atomic: the manager that applied them owns the
//! whole list, so its next apply sets them back to what it applies, dropping gpu-guard's part;
//! on an immutable field the API server would refuse that update. The webhook puts back, from
//! the old object, exactly what the update dropped of gpu-guard's changes, and nothing else.

use base64::Engine as _;
use gpu_guard_core::guard::StaticView;
use gpu_guard_core::mutate::patch;
use gpu_guard_core::policy::Policy;
use gpu_guard_webhook::admission::{ReviewOutcome, Reviewed, Webhook, review};
use json_patch::Patch;
use serde_json::{Value, json};

use crate::reviews;
use reviews::{JOB, JOBSET, review_of};

fn mutate(body: &Value) -> Reviewed {
    mutate_with(body, &Policy::embedded())
}

fn mutate_with(body: &Value, policy: &Policy) -> Reviewed {
    let view = StaticView::from_policy(&policy.guard.offline);
    review(Webhook::Mutate, body.to_string().as_bytes(), policy, &view).expect("reviewed")
}

/// The object as stored after the review: with its patch applied, if any.
fn stored(object: &Value, reviewed: &Reviewed) -> Value {
    let response = &serde_json::from_slice::<Value>(&reviewed.body).unwrap()["response"];
    let Some(encoded) = response["patch"].as_str() else {
        return object.clone();
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    let patch: Patch = serde_json::from_slice(&bytes).unwrap();
    patch::apply(object, &patch).expect("the patch applies")
}

/// What the user applies: a GPU Job with its own podFailurePolicy rule and toleration.
fn applied_job() -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "gpu-lab", "labels": {"team": "vision"}},
        "spec": {
            "backoffLimit": 3,
            "podFailurePolicy": {"rules": [{"action": "FailJob",
                "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}}]},
            "template": {"spec": {
                "restartPolicy": "Never",
                "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "main", "image": "train:1",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
        }
    })
}

/// The live object after `manager` applies `applied` again: the lists it owns atomically are
/// what it applies; what no manager owns (gpu-guard's annotation, its own fields) stays.
fn reapplied(live: &Value, applied: &Value, atomic_lists: &[&str]) -> Value {
    let mut next = live.clone();
    next["metadata"]["labels"] = applied["metadata"]["labels"].clone();
    for pointer in atomic_lists {
        *next.pointer_mut(pointer).unwrap() = applied.pointer(pointer).unwrap().clone();
    }
    next
}

#[test]
fn a_job_reapplied_by_its_manager_keeps_what_gpu_guard_added() {
    let applied = applied_job();
    let created = mutate(&review_of(JOB, &applied, None, "alice"));
    assert_eq!(created.outcome, ReviewOutcome::Patched);
    let live = stored(&applied, &created);
    assert_eq!(
        live["spec"]["podFailurePolicy"]["rules"]
            .as_array()
            .unwrap()
            .len(),
        5,
        "4 device rules before the user's own"
    );

    // A label changes in git; the manager applies again.
    let mut changed = applied.clone();
    changed["metadata"]["labels"]["team"] = json!("vision-2");
    let lists = [
        "/spec/podFailurePolicy/rules",
        "/spec/template/spec/tolerations",
    ];
    let update = reapplied(&live, &changed, &lists);
    let reviewed = mutate(&review_of(JOB, &update, Some(&live), "alice"));
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched);
    let after = stored(&update, &reviewed);
    // The immutable fields are as they were (the API server accepts the update), and the
    // user's change is in.
    assert_eq!(
        after["spec"]["podFailurePolicy"],
        live["spec"]["podFailurePolicy"]
    );
    assert_eq!(after["spec"]["template"], live["spec"]["template"]);
    assert_eq!(after["metadata"]["labels"]["team"], "vision-2");
    let response = &serde_json::from_slice::<Value>(&reviewed.body).unwrap()["response"];
    assert!(
        response["auditAnnotations"]["mutation"]
            .as_str()
            .unwrap()
            .starts_with("restored on UPDATE: /spec/podFailurePolicy"),
        "{response}"
    );

    // The same apply once more, after the put-back: nothing is missing, nothing is sent.
    let quiet = mutate(&review_of(JOB, &after, Some(&after), "alice"));
    assert_eq!(quiet.patch_bytes, 0);
}

#[test]
fn what_the_user_changes_on_purpose_is_not_put_back() {
    let applied = applied_job();
    let live = stored(&applied, &mutate(&review_of(JOB, &applied, None, "alice")));
    // The user's own rule changes: the result is not what gpu-guard would make of the update,
    // so gpu-guard leaves it to the API server (which refuses it: podFailurePolicy is
    // immutable).
    let mut changed = applied.clone();
    changed["spec"]["podFailurePolicy"]["rules"][0]["action"] = json!("Ignore");
    let update = reapplied(&live, &changed, &["/spec/podFailurePolicy/rules"]);
    let reviewed = mutate(&review_of(JOB, &update, Some(&live), "alice"));
    assert_eq!(reviewed.patch_bytes, 0);
    assert_eq!(reviewed.outcome, ReviewOutcome::Allowed);

    // A mutable field gpu-guard set, removed on purpose: the Job stays valid, so it stays out.
    let mut removed = live.clone();
    removed["spec"]
        .as_object_mut()
        .unwrap()
        .remove("podReplacementPolicy");
    let kept_out = mutate(&review_of(JOB, &removed, Some(&live), "alice"));
    assert_eq!(kept_out.patch_bytes, 0);

    // A Job gpu-guard never mutated is never patched on UPDATE.
    let mut foreign = applied.clone();
    foreign["metadata"]["labels"]["team"] = json!("other");
    let untouched = mutate(&review_of(JOB, &foreign, Some(&applied), "alice"));
    assert_eq!(untouched.patch_bytes, 0);
}

#[test]
fn a_jobset_reapplied_by_its_manager_keeps_its_gang_rules() {
    // A JobSet with its own failure policy, applied by Trainer-like manager (its rules list is
    // atomic: the JobSet CRD gives it no list type).
    let applied = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "pretrain", "namespace": "gpu-lab", "labels": {"run": "1"}},
        "spec": {
            "failurePolicy": {"maxRestarts": 2, "rules": [{"name": "deadline",
                "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]}]},
            "replicatedJobs": [{"name": "workers", "replicas": 8, "template": {"spec": {
                "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "containers": [{
                    "name": "trainer", "image": "train:1",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}}]
        }
    });
    let live = stored(
        &applied,
        &mutate(&review_of(JOBSET, &applied, None, "trainer")),
    );
    assert_eq!(live["spec"]["failurePolicy"]["maxRestarts"], 7);
    let mut changed = applied.clone();
    changed["metadata"]["labels"]["run"] = json!("2");
    let mut update = reapplied(&live, &changed, &["/spec/failurePolicy/rules"]);
    // The manager owns maxRestarts too, and applies its own value.
    update["spec"]["failurePolicy"]["maxRestarts"] = json!(2);
    let reviewed = mutate(&review_of(JOBSET, &update, Some(&live), "trainer"));
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched);
    let after = stored(&update, &reviewed);
    assert_eq!(
        after["spec"], live["spec"],
        "failurePolicy is immutable: as it was"
    );
    assert_eq!(after["metadata"]["labels"]["run"], "2");

    // A budget the user changes on purpose is theirs to argue with the API server.
    update["spec"]["failurePolicy"]["maxRestarts"] = json!(3);
    let changed_budget = mutate(&review_of(JOBSET, &update, Some(&live), "trainer"));
    assert_eq!(changed_budget.patch_bytes, 0);
}

#[test]
fn a_container_restart_rule_dropped_by_a_reapply_is_put_back() {
    // The in-place profile appends its rule to the trainer's own: the manager that applied
    // the trainer's rules owns that atomic list, and its next apply drops gpu-guard's rule.
    let policy =
        gpu_guard_core::policy::load(std::path::Path::new("policies/in-place-restart.yaml"))
            .expect("the shipped profile loads");
    let mut applied = applied_job();
    let trainer = &mut applied["spec"]["template"]["spec"]["containers"][0];
    trainer["restartPolicy"] = json!("Never");
    trainer["restartPolicyRules"] =
        json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": [3]}}]);
    let created = mutate_with(&review_of(JOB, &applied, None, "alice"), &policy);
    let live = stored(&applied, &created);
    let rules = "/spec/template/spec/containers/0/restartPolicyRules";
    assert_eq!(
        live.pointer(rules).unwrap(),
        &json!([
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [3]}},
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [70, 140]}},
        ])
    );

    let mut changed = applied.clone();
    changed["metadata"]["labels"]["team"] = json!("vision-2");
    let update = reapplied(
        &live,
        &changed,
        &[
            "/spec/podFailurePolicy/rules",
            "/spec/template/spec/tolerations",
            rules,
        ],
    );
    assert_ne!(
        update.pointer(rules),
        live.pointer(rules),
        "the re-apply dropped it"
    );
    let reviewed = mutate_with(&review_of(JOB, &update, Some(&live), "alice"), &policy);
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched);
    let after = stored(&update, &reviewed);
    assert_eq!(
        after["spec"]["template"], live["spec"]["template"],
        "the template is immutable: as it was"
    );
    assert_eq!(after["metadata"]["labels"]["team"], "vision-2");

    // The trainer's own rule changed on purpose: not put back, the API server decides.
    let mut own_change = changed.clone();
    own_change["spec"]["template"]["spec"]["containers"][0]["restartPolicyRules"][0]["exitCodes"]
        ["values"] = json!([4]);
    let update = reapplied(&live, &own_change, &[rules]);
    let left = mutate_with(&review_of(JOB, &update, Some(&live), "alice"), &policy);
    assert_eq!(left.patch_bytes, 0);
}

#[test]
fn a_gang_jobs_pod_annotation_is_put_back_with_its_rules() {
    // A torchrun gang: one Indexed Job, every index at once.
    let mut applied = applied_job();
    applied["spec"]["completionMode"] = json!("Indexed");
    applied["spec"]["completions"] = json!(4);
    applied["spec"]["parallelism"] = json!(4);
    let live = stored(&applied, &mutate(&review_of(JOB, &applied, None, "alice")));
    assert_eq!(
        live["spec"]["template"]["metadata"]["annotations"]["gpu-guard.io/gang"],
        "true"
    );
    assert_eq!(
        live["spec"]["podFailurePolicy"]["rules"][3]["onPodConditions"][0]["type"],
        "gpu-guard.io/PeerDeviceFailure"
    );

    // A server-side apply keeps the annotation (a map merged by key that the manager never
    // named) and drops the rules: only the rules come back.
    let update = reapplied(&live, &applied, &["/spec/podFailurePolicy/rules"]);
    let after = stored(
        &update,
        &mutate(&review_of(JOB, &update, Some(&live), "alice")),
    );
    assert_eq!(after["spec"], live["spec"]);

    // The manifest put back whole (`kubectl replace`): the template has no metadata at all.
    // Everything gpu-guard added comes back, the annotation with the parents it needs, so the
    // immutable template is as it was.
    let mut replaced = applied.clone();
    replaced["metadata"] = live["metadata"].clone();
    let reviewed = mutate(&review_of(JOB, &replaced, Some(&live), "alice"));
    assert_eq!(reviewed.outcome, ReviewOutcome::Patched);
    let after = stored(&replaced, &reviewed);
    assert_eq!(after["spec"]["template"], live["spec"]["template"]);
    assert_eq!(
        after["spec"]["podFailurePolicy"],
        live["spec"]["podFailurePolicy"]
    );
}
