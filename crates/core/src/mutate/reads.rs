//! What the engines read of a raw object, as ONE list of field paths per kind, and the decoder
//! that keeps only those fields of an object's JSON text: the webhook's request path.
//!
//! An object from the API server is mostly what the engines never read (`managedFields`, env
//! vars, volumes, affinity, status). Decoding it whole into a `serde_json::Value` and the typed
//! object made a review of the load test's 7 KB Job about four times slower
//! (`benches/request_path.rs`). So the webhook keeps, in one pass over the text, only the fields
//! these lists name (each whole, with its unknown fields) and their parents, and then runs
//! exactly what the CLI runs on a whole object ([`mutate_object`](super::object::mutate_object)):
//! the same typed decode, engine, patch derivation and patch check, on the smaller `Value`.
//!
//! These lists are the only place that says what the engines read. A field an engine starts to
//! read must be added here, or the webhook sees it absent where the CLI sees it: the property
//! tests (`tests/it/properties.rs`) send generated Jobs, JobSets and Trainer runtimes through
//! the webhook and through the CLI's path and require the same patch and warnings.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess};
use serde_json::{Map, Value};

use super::object::MutableKind;
use crate::decode::{self, JsonError};

/// What the engines read of an object's metadata (and of a JobSet template's).
const METADATA: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "ownerReferences",
];

/// What the Job engine reads of a Job spec (a Job's, or a JobSet template's), and of each
/// container and init container of its pod template.
const JOB_SPEC: &[&str] = &[
    "activeDeadlineSeconds",
    "backoffLimit",
    "backoffLimitPerIndex",
    "completionMode",
    "completions",
    "parallelism",
    "podFailurePolicy",
    "podReplacementPolicy",
    "template.metadata.annotations",
    "template.spec.restartPolicy",
    "template.spec.terminationGracePeriodSeconds",
    "template.spec.tolerations",
    "template.spec.resourceClaims",
    "template.spec.containers[].name",
    "template.spec.containers[].restartPolicy",
    "template.spec.containers[].restartPolicyRules",
    "template.spec.containers[].resources",
    "template.spec.initContainers[].name",
    "template.spec.initContainers[].restartPolicy",
    "template.spec.initContainers[].restartPolicyRules",
    "template.spec.initContainers[].resources",
];

/// What the JobSet engine reads of a JobSet spec (besides each replicated Job's template,
/// which is [`METADATA`] and [`JOB_SPEC`]).
const JOBSET_SPEC: &[&str] = &[
    "replicatedJobs[].name",
    "replicatedJobs[].replicas",
    "failurePolicy",
    "suspend",
];

/// The paths `kind`'s engine reads, from the object's root (`spec.template.spec.tolerations`,
/// `[]` for every item of a list); `None` for a CronJob, which the webhook reads whole.
pub fn paths(kind: MutableKind) -> Option<Vec<String>> {
    let under = |prefix: &str, fields: &[&str]| -> Vec<String> {
        fields
            .iter()
            .map(|field| format!("{prefix}{field}"))
            .collect()
    };
    let jobset = |root: &str| -> Vec<String> {
        let template = format!("{root}replicatedJobs[].template.");
        [
            under(root, JOBSET_SPEC),
            under(&format!("{template}metadata."), METADATA),
            under(&format!("{template}spec."), JOB_SPEC),
        ]
        .concat()
    };
    let spec = match kind {
        MutableKind::Job => under("spec.", JOB_SPEC),
        MutableKind::JobSet => jobset("spec."),
        MutableKind::TrainingRuntime | MutableKind::ClusterTrainingRuntime => {
            jobset("spec.template.spec.")
        }
        MutableKind::CronJob => return None,
    };
    Some(
        [
            vec!["apiVersion".to_owned(), "kind".to_owned()],
            under("metadata.", METADATA),
            spec,
        ]
        .concat(),
    )
}

/// Decodes the fields of `kind`'s [`paths`] from an object's JSON text into a `Value` (the
/// object less everything else); an error only for text that is not JSON. A CronJob is decoded
/// whole.
pub fn decode(text: &str, kind: MutableKind) -> Result<Value, JsonError> {
    static TREES: LazyLock<BTreeMap<&'static str, Node>> = LazyLock::new(|| {
        [
            MutableKind::Job,
            MutableKind::JobSet,
            MutableKind::TrainingRuntime,
            MutableKind::ClusterTrainingRuntime,
        ]
        .into_iter()
        .filter_map(|kind| Some((kind.api_name(), Node::of(&paths(kind)?))))
        .collect()
    });
    let Some(tree) = TREES.get(kind.api_name()) else {
        return decode::from_json_str(text);
    };
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let kept = Keep(tree)
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value));
    // Keeping fields never fails on JSON text; the error of one that is not JSON says where,
    // in serde_json's words.
    kept.map_err(|_| match decode::from_json_str::<IgnoredAny>(text) {
        Err(error) => error,
        Ok(_) => JsonError::custom("the object could not be read"),
    })
}

/// The fields kept below one point of an object: each key's node; `items` for every item of
/// a list; a node with neither keeps its value whole.
#[derive(Debug, Default)]
struct Node {
    fields: BTreeMap<String, Node>,
    items: Option<Box<Node>>,
}

impl Node {
    fn of(paths: &[String]) -> Self {
        let mut root = Node::default();
        for path in paths {
            let mut node = &mut root;
            for token in path.split('.') {
                let (key, every_item) = match token.strip_suffix("[]") {
                    Some(key) => (key, true),
                    None => (token, false),
                };
                node = node.fields.entry(key.to_owned()).or_default();
                if every_item {
                    node = node.items.get_or_insert_default();
                }
            }
        }
        root
    }

    fn is_whole(&self) -> bool {
        self.fields.is_empty() && self.items.is_none()
    }
}

/// Visitor methods that make each scalar the `Value` it is.
macro_rules! scalars_as_values {
    ($($method:ident: $type:ty),*) => {
        $(fn $method<E>(self, value: $type) -> Result<Value, E> {
            Ok(Value::from(value))
        })*
    };
}

/// Decodes a value, keeping below it only what its [`Node`] names.
#[derive(Clone, Copy)]
struct Keep<'n>(&'n Node);

impl<'de> DeserializeSeed<'de> for Keep<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        if self.0.is_whole() {
            return Value::deserialize(deserializer);
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for Keep<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    // A scalar where an object or a list was expected is kept as it is: the typed decode
    // says what is wrong with it, as it does for the whole object.
    scalars_as_values!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64);
    scalars_as_values!(visit_str: &str);

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut kept = Vec::new();
        match &self.0.items {
            // Every item stays in the list, so that the engine's indexes are the object's.
            Some(node) => {
                while let Some(item) = items.next_element_seed(Keep(node))? {
                    kept.push(item);
                }
            }
            None => while items.next_element::<IgnoredAny>()?.is_some() {},
        }
        Ok(Value::Array(kept))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut fields: A) -> Result<Value, A::Error> {
        let mut kept = Map::new();
        while let Some(key) = fields.next_key::<std::borrow::Cow<'de, str>>()? {
            match self.0.fields.get(key.as_ref()) {
                Some(node) => {
                    kept.insert(key.into_owned(), fields.next_value_seed(Keep(node))?);
                }
                None => {
                    fields.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(kept))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_listed_fields_and_their_parents_are_kept_each_whole() {
        let object = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "a", "managedFields": [{"x": 1}], "annotations": null},
            "spec": {
                "podFailurePolicy": {"rules": [{"action": "Ignore", "future": 1}]},
                "template": {"spec": {
                    "volumes": [{"name": "v"}],
                    "containers": [
                        {"name": "main", "env": [{"name": "E"}],
                         "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                        {"name": "side"},
                        null
                    ]
                }}
            },
            "status": {"active": 1}
        });
        let kept = decode(&object.to_string(), MutableKind::Job).unwrap();
        assert_eq!(
            kept,
            json!({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "a", "annotations": null},
                "spec": {
                    "podFailurePolicy": {"rules": [{"action": "Ignore", "future": 1}]},
                    "template": {"spec": {"containers": [
                        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                        {"name": "side"},
                        null
                    ]}}
                }
            })
        );
    }

    #[test]
    fn a_runtime_keeps_its_jobset_spec_and_a_cron_job_is_whole() {
        let runtime = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
            "spec": {"mlPolicy": {"numNodes": 2}, "template": {"spec": {
                "failurePolicy": {"maxRestarts": 3},
                "replicatedJobs": [{"name": "node", "template": {"spec": {"parallelism": 2}}}]
            }}}
        });
        let kept = decode(&runtime.to_string(), MutableKind::TrainingRuntime).unwrap();
        assert_eq!(kept["spec"].get("mlPolicy"), None);
        assert_eq!(kept["spec"]["template"], runtime["spec"]["template"]);
        let cron = json!({"apiVersion": "batch/v1", "kind": "CronJob", "spec": {"x": [1]}});
        assert_eq!(
            decode(&cron.to_string(), MutableKind::CronJob).unwrap(),
            cron
        );
    }

    #[test]
    fn text_that_is_not_json_is_an_error_that_says_where() {
        let error = decode(r#"{"kind": "Job", "spec": {"x": ]}"#, MutableKind::Job).unwrap_err();
        assert!(error.is_syntax());
        assert!(error.to_string().contains("line 1 column"), "{error}");
        let trailing = decode(r#"{"kind": "Job"} x"#, MutableKind::Job).unwrap_err();
        assert!(trailing.is_syntax(), "{trailing}");
    }
}
