//! Golden snapshots of the engine on every Job and CronJob AdmissionReview a real kube-apiserver
//! v1.36 sent (`tests/fixtures/admission/`): the patch is applied to the raw request object and
//! the patched object is snapshotted (insta), so a review shows exactly what a user would get.

use gpu_guard_core::api_rules::job::check_job;
use gpu_guard_core::api_rules::jobset::check_jobset_spec;
use gpu_guard_core::devices::NoDraFacts;
use gpu_guard_core::field::FieldPath;
use gpu_guard_core::mutate::object::{MutableKind, mutate_object};
use gpu_guard_core::mutate::patch;
use gpu_guard_core::policy::Policy;
use k8s_openapi::api::batch::v1::{Job, JobTemplateSpec};
use serde_json::{Value, json};

fn fixtures() -> Vec<(String, Value)> {
    let mut paths: Vec<_> = std::fs::read_dir("../../tests/fixtures/admission")
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with("-mutate.json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let review: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, review)
        })
        .collect()
}

#[test]
fn every_job_and_cronjob_fixture_is_mutated_into_a_valid_object() {
    let policy = Policy::embedded();
    let mut snapshotted = 0;
    for (name, review) in fixtures() {
        let request = &review["request"];
        if request["operation"] != "CREATE" {
            continue;
        }
        let raw = &request["object"];
        let Some(result) = mutate_object(raw, &policy, &NoDraFacts) else {
            assert_eq!(
                request["kind"]["kind"], "Pod",
                "{name}: only Pods are passed over"
            );
            continue;
        };
        let mutation = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let patched = patch::apply(raw, &mutation.patch).unwrap();

        // What the API server would then validate passes the API rules.
        let violations = match mutation.kind {
            MutableKind::Job => check_job(&serde_json::from_value::<Job>(patched.clone()).unwrap()),
            MutableKind::CronJob => {
                let template: JobTemplateSpec =
                    serde_json::from_value(patched["spec"]["jobTemplate"].clone()).unwrap();
                check_job(&Job {
                    spec: template.spec,
                    ..Job::default()
                })
            }
            kind => {
                let root = kind.jobset_spec_root().unwrap();
                let spec = serde_json::from_value(patched.pointer(root).unwrap().clone()).unwrap();
                let path = FieldPath::new(root.trim_start_matches('/').split('/'));
                check_jobset_spec(&spec, &path)
            }
        };
        assert_eq!(violations, vec![], "{name}");

        // The webhook may be called again (reinvocationPolicy: IfNeeded): no second patch.
        let again = mutate_object(&patched, &policy, &NoDraFacts)
            .unwrap()
            .unwrap();
        assert!(
            again.patch.is_empty(),
            "{name}: second pass patched {:?}",
            again.patch
        );

        let mut shown = patched.clone();
        if let Some(metadata) = shown["metadata"].as_object_mut() {
            metadata.remove("managedFields");
        }
        insta::assert_yaml_snapshot!(
            name.clone(),
            json!({
                "patch": mutation.patch,
                "warnings": mutation.outcome.warnings(),
                "patchedObject": shown,
            })
        );
        snapshotted += 1;
    }
    assert_eq!(snapshotted, 7, "six Job CREATEs and one CronJob");
}
