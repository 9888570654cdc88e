//! Fields the API does not know, as kubectl's strict field validation finds them: a
//! misspelt `podFailurePolicyy` would otherwise pass `mutate` and `check` without a word, and
//! then be refused by `kubectl apply` (`unknown field "spec.podFailurePolicyy"`; `kubectl apply
//! --help`, `--validate`: default `strict`, while `ignore` "silently drop[s] any unknown or
//! duplicate fields") or dropped by the API server without it.
//!
//! The known fields are the API's own, as k8s-openapi (v1.36) declares them: decoding a value
//! into a k8s-openapi type hands the deserializer each struct's field names
//! (`deserialize_struct`), and a deserializer that follows the value's path records the keys
//! of each mapping that are not among them. Maps (labels, annotations, resource limits, node
//! selectors) are maps there, so their keys are never unknown; the value of an unknown field
//! is not looked into (kubectl names the field, not what is below it).
//!
//! Checked: the kinds gpu-guard reads with full k8s-openapi types (Job, CronJob, Pod,
//! Deployment, StatefulSet, DaemonSet, ReplicaSet) and the Job templates a JobSet or a Kubeflow
//! Trainer runtime embeds (their own fields are a CRD's, which k8s-openapi does not describe).

use std::cell::RefCell;
use std::fmt;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job, JobTemplateSpec};
use k8s_openapi::api::core::v1::Pod;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A field the API does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownField {
    /// Its path, as kubectl writes it (`spec.template.spec.containers[0].imagee`).
    pub path: String,
    /// A known field of the same object whose name is close, when one is.
    pub suggestion: Option<&'static str>,
}

impl fmt::Display for UnknownField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown field {:?}", self.path)?;
        if let Some(suggestion) = self.suggestion {
            write!(f, ", did you mean {suggestion:?}?")?;
        }
        f.write_str(
            " (kubectl apply refuses it with its default strict field validation; without that \
             the API server drops it)",
        )
    }
}

/// The unknown fields of an object of the kinds above, in the order they are written; empty
/// for any other object. An object that does not decode is reported where it is decoded:
/// here it gives the unknown fields found before the error.
pub fn unknown_fields(object: &Value) -> Vec<UnknownField> {
    let api_version = object.get("apiVersion").and_then(Value::as_str);
    let kind = object.get("kind").and_then(Value::as_str);
    let group =
        api_version.map(|api_version| api_version.rsplit_once('/').map_or("", |(group, _)| group));
    let found = RefCell::new(Vec::new());
    match (api_version, kind) {
        (Some("batch/v1"), Some("Job")) => check::<Job>(object, "", &found),
        (Some("batch/v1"), Some("CronJob")) => check::<CronJob>(object, "", &found),
        (Some("v1"), Some("Pod")) => check::<Pod>(object, "", &found),
        (Some("apps/v1"), Some("Deployment")) => check::<Deployment>(object, "", &found),
        (Some("apps/v1"), Some("StatefulSet")) => check::<StatefulSet>(object, "", &found),
        (Some("apps/v1"), Some("DaemonSet")) => check::<DaemonSet>(object, "", &found),
        (Some("apps/v1"), Some("ReplicaSet")) => check::<ReplicaSet>(object, "", &found),
        // A JobSet's `spec.replicatedJobs[].template` is a JobTemplateSpec (jobset
        // api/jobset/v1alpha2/jobset_types.go); a Trainer runtime holds a JobSet spec in
        // `spec.template.spec` (trainer pkg/apis/trainer/v1alpha1/trainingruntime_types.go).
        _ if group == Some("jobset.x-k8s.io") && kind == Some("JobSet") => {
            job_templates(object, "spec", &found);
        }
        _ if group == Some("trainer.kubeflow.org")
            && matches!(kind, Some("TrainingRuntime" | "ClusterTrainingRuntime")) =>
        {
            job_templates(object, "spec.template.spec", &found);
        }
        _ => {}
    }
    found.into_inner()
}

/// Checks each `replicatedJobs[].template` of the JobSet spec at `spec` (a dotted path).
fn job_templates(object: &Value, spec: &str, found: &RefCell<Vec<UnknownField>>) {
    let pointer = format!("/{}", spec.replace('.', "/"));
    let Some(replicated) = object
        .pointer(&format!("{pointer}/replicatedJobs"))
        .and_then(Value::as_array)
    else {
        return;
    };
    for (index, replicated_job) in replicated.iter().enumerate() {
        if let Some(template) = replicated_job.get("template") {
            let path = format!("{spec}.replicatedJobs[{index}].template");
            check::<JobTemplateSpec>(template, &path, found);
        }
    }
}

/// Decodes `value` as a `T` found at `path`, recording its unknown fields.
fn check<'de, T: de::Deserialize<'de>>(
    value: &'de Value,
    path: &str,
    found: &RefCell<Vec<UnknownField>>,
) {
    // A decode error is reported by the engine; what was found before it stands.
    let _ = T::deserialize(Tracking {
        value,
        step: Step::Root(path),
        found,
    });
}

/// Where a value is, as a chain of steps from the root: built as the decoding goes down and
/// written out only for an unknown field, so that a known one costs no text.
#[derive(Clone, Copy)]
enum Step<'a> {
    /// The root, at this path (empty for an object's own root).
    Root(&'a str),
    Key(&'a Step<'a>, &'a str),
    Index(&'a Step<'a>, usize),
}

impl Step<'_> {
    /// The path below this step by `key`, as kubectl writes it.
    fn path_to(&self, key: &str) -> String {
        let mut path = String::new();
        self.write(&mut path);
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
        path
    }

    fn write(&self, path: &mut String) {
        match self {
            Step::Root(root) => path.push_str(root),
            Step::Key(parent, key) => {
                parent.write(path);
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
            }
            Step::Index(parent, index) => {
                parent.write(path);
                path.push_str(&format!("[{index}]"));
            }
        }
    }
}

/// A deserializer of a JSON value that knows the value's path and records, for each struct
/// the type decodes, the keys its fields do not name.
struct Tracking<'de, 'f> {
    value: &'de Value,
    step: Step<'f>,
    found: &'f RefCell<Vec<UnknownField>>,
}

impl<'de, 'f> Tracking<'de, 'f> {
    fn items(self, items: &'de [Value]) -> Items<'de, 'f> {
        Items {
            parent: self,
            items: items.iter().enumerate(),
        }
    }

    fn entries(self, entries: &'de Map<String, Value>) -> Entries<'de, 'f> {
        Entries {
            parent: self,
            entries: entries.iter(),
            value: None,
        }
    }
}

/// Everything but structs, maps, lists, options and newtypes is the value's own.
macro_rules! the_values_own {
    ($($method:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.value.$method(visitor)
        }
    )*};
}

impl<'de> Deserializer<'de> for Tracking<'de, '_> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(entries) => visitor.visit_map(self.entries(entries)),
            Value::Array(items) => visitor.visit_seq(self.items(items)),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let Value::Object(entries) = self.value else {
            return self.value.deserialize_struct(name, fields, visitor);
        };
        let mut found = self.found.borrow_mut();
        for key in entries.keys().filter(|key| !fields.contains(&key.as_str())) {
            found.push(UnknownField {
                path: self.step.path_to(key),
                suggestion: closest(key, fields),
            });
        }
        drop(found);
        visitor.visit_map(self.entries(entries))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(entries) => visitor.visit_map(self.entries(entries)),
            other => other.deserialize_map(visitor),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Array(items) => visitor.visit_seq(self.items(items)),
            other => other.deserialize_seq(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_tuple(len, visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_tuple_struct(name, len, visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_unit_struct(name, visitor)
    }

    the_values_own!(
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_unit,
        deserialize_identifier,
        deserialize_ignored_any
    );
}

/// The entries of a mapping, each value followed on its path.
struct Entries<'de, 'f> {
    parent: Tracking<'de, 'f>,
    entries: serde_json::map::Iter<'de>,
    value: Option<(&'de String, &'de Value)>,
}

impl<'de> MapAccess<'de> for Entries<'de, '_> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some((key, value));
        seed.deserialize(de::value::BorrowedStrDeserializer::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let (key, value) = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value asked before its key"))?;
        seed.deserialize(Tracking {
            value,
            step: Step::Key(&self.parent.step, key),
            found: self.parent.found,
        })
    }
}

/// The items of a list, each followed on its path.
struct Items<'de, 'f> {
    parent: Tracking<'de, 'f>,
    items: std::iter::Enumerate<std::slice::Iter<'de, Value>>,
}

impl<'de> SeqAccess<'de> for Items<'de, '_> {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        match self.items.next() {
            Some((index, item)) => seed
                .deserialize(Tracking {
                    value: item,
                    step: Step::Index(&self.parent.step, index),
                    found: self.parent.found,
                })
                .map(Some),
            None => Ok(None),
        }
    }
}

/// The field whose name is closest to `key` (edit distance, case ignored), when it is close
/// enough to be what was meant: a fourth of the name's letters wrong at most, one at least.
fn closest(key: &str, fields: &'static [&'static str]) -> Option<&'static str> {
    let key = key.to_lowercase();
    let limit = (key.chars().count() / 4).max(1);
    fields
        .iter()
        .map(|field| (edit_distance(&key, &field.to_lowercase()), *field))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, field)| field)
}

/// The optimal string alignment distance: insertions, deletions, substitutions and swaps of
/// two neighbouring letters (`podFialurePolicy`) each count one.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two back, one back, this one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (previous[j] + 1)
                .min(current[j - 1] + 1)
                .min(previous[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 1);
            }
            current[j] = best;
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(object: &Value) -> Vec<(String, Option<&'static str>)> {
        unknown_fields(object)
            .into_iter()
            .map(|unknown| (unknown.path, unknown.suggestion))
            .collect()
    }

    /// A Job as written by hand, with every kind of value k8s-openapi decodes specially
    /// (quantities, int-or-string, times, maps, nulls).
    fn job() -> Value {
        json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "train",
                "creationTimestamp": null,
                "labels": {"team": "ml", "podFailurePolicyy": "a label, not a field"},
                "annotations": {"example.com/anything": "x"},
            },
            "spec": {
                "backoffLimit": 3,
                "completions": null,
                "template": {
                    "metadata": {"labels": {"app": "train"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{
                            "name": "main",
                            "image": "registry.example/train:1.0",
                            "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "16Gi"}},
                            "ports": [{"containerPort": 8080}],
                            "livenessProbe": {"httpGet": {"path": "/", "port": "http"}},
                        }],
                        "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    },
                },
            },
            "status": {"startTime": "2026-01-02T15:04:05Z", "active": 1},
        })
    }

    #[test]
    fn a_job_as_the_api_knows_it_has_no_unknown_field() {
        assert_eq!(paths(&job()), []);
    }

    #[test]
    fn misspelt_fields_are_named_with_their_path_and_the_field_meant() {
        let mut job = job();
        job["spec"]["podFailurePolicyy"] = json!({"rules": []});
        job["spec"]["template"]["spec"]["containers"][0]["imagee"] = json!("x");
        job["spec"]["template"]["spec"]["containers"][0]["resources"]["limts"] = json!({});
        job["spec"]["template"]["spec"]["RestartPolicy"] = json!("Never");
        job["spec"]["template"]["spec"]["gpus"] = json!(null);
        job["metdata"] = json!({});
        assert_eq!(
            paths(&job),
            [
                ("metdata".to_owned(), Some("metadata")),
                (
                    "spec.podFailurePolicyy".to_owned(),
                    Some("podFailurePolicy")
                ),
                (
                    "spec.template.spec.RestartPolicy".to_owned(),
                    Some("restartPolicy")
                ),
                ("spec.template.spec.gpus".to_owned(), None),
                (
                    "spec.template.spec.containers[0].imagee".to_owned(),
                    Some("image")
                ),
                (
                    "spec.template.spec.containers[0].resources.limts".to_owned(),
                    Some("limits")
                ),
            ]
        );
        assert_eq!(
            unknown_fields(&job)[1].to_string(),
            "unknown field \"spec.podFailurePolicyy\", did you mean \"podFailurePolicy\"? \
             (kubectl apply refuses it with its default strict field validation; without that \
             the API server drops it)"
        );
    }

    #[test]
    fn other_workloads_and_the_job_templates_of_jobsets_and_runtimes() {
        let pod_spec = json!({"containers": [{"name": "main", "image": "x", "comand": ["sh"]}]});
        let template = json!({"metadata": {"labels": {"a": "b"}}, "spec": pod_spec});
        let cases = [
            (
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod_spec}),
                "spec.containers[0].comand",
            ),
            (
                json!({"apiVersion": "apps/v1", "kind": "Deployment",
                       "spec": {"replicas": 1, "template": template}}),
                "spec.template.spec.containers[0].comand",
            ),
            (
                json!({"apiVersion": "batch/v1", "kind": "CronJob", "spec": {"schedule": "* * * * *",
                       "jobTemplate": {"spec": {"template": template}}}}),
                "spec.jobTemplate.spec.template.spec.containers[0].comand",
            ),
            (
                json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": {
                    "failurePolicy": {"maxRestarts": 3, "anything": 1},
                    "replicatedJobs": [{"name": "workers", "replicas": 2,
                        "template": {"spec": {"template": template}}}]}}),
                "spec.replicatedJobs[0].template.spec.template.spec.containers[0].comand",
            ),
            (
                json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
                       "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [
                           {"name": "node", "template": {"spec": {"template": template}}}]}}}}),
                "spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers[0].comand",
            ),
        ];
        for (object, path) in cases {
            assert_eq!(
                paths(&object),
                [(path.to_owned(), Some("command"))],
                "{object}"
            );
        }
        // Kinds without a k8s-openapi type: not checked.
        let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "dataa": {}});
        assert_eq!(paths(&config_map), []);
        let pytorch =
            json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {"x": 1}});
        assert_eq!(paths(&pytorch), []);
    }

    #[test]
    fn a_job_that_does_not_decode_gives_what_was_found_before_the_error() {
        let job = json!({"apiVersion": "batch/v1", "kind": "Job",
                         "spec": {"backofLimit": 1, "parallelism": "two", "suspendd": true}});
        assert_eq!(
            paths(&job),
            [
                ("spec.backofLimit".to_owned(), Some("backoffLimit")),
                ("spec.suspendd".to_owned(), Some("suspend"))
            ]
        );
    }

    #[test]
    fn edit_distance_counts_swaps_as_one() {
        assert_eq!(edit_distance("podfialurepolicy", "podfailurepolicy"), 1);
        assert_eq!(edit_distance("image", "imagee"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(
            closest("nodeselector", &["nodeSelector", "nodeName"]),
            Some("nodeSelector")
        );
        assert_eq!(closest("gpus", &["nodeSelector", "nodeName"]), None);
    }
}
