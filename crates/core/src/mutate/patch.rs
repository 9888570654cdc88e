//! JSON Patch operations derived from the engine's typed [`Change`] list, applied to the raw
//! object as it arrived (so fields this version of k8s-openapi does not know survive).
//!
//! This is the only place patches are built. Each change owns one path; an absent or `null`
//! parent is created in the same operation (`add /metadata/annotations {"k": "v"}`), arrays are
//! appended to (`.../tolerations/-`, `.../containers/0/restartPolicyRules/-`) or inserted into
//! at a known index (rules prepended to a podFailurePolicy), never rewritten by position; a
//! container is reached by its index in `containers`, which the engine read from the same
//! object. A property test proves that applying these operations gives the same document as
//! `json_patch::diff` of the typed objects. Before a patch is sent or written,
//! [`check_applies`] has json-patch apply it.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchError, PatchOperation};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::mutate::Change;
use crate::mutate::jobset::{JobSetOutcome, RULE_PREFIX};
use crate::wellknown::MUTATED_ANNOTATION;

/// Where a Job's fields are inside an object: `""` for a Job, `/spec/jobTemplate` for a
/// CronJob (whose `jobTemplate` has the Job's `metadata` and `spec`).
pub const JOB_ROOT: &str = "";
/// The Job inside a CronJob.
pub const CRON_JOB_TEMPLATE_ROOT: &str = "/spec/jobTemplate";

/// The JSON Patch that makes `raw` (the object as received) carry `changes`; `root` is where
/// the Job is inside `raw` ([`JOB_ROOT`] or [`CRON_JOB_TEMPLATE_ROOT`]).
pub fn operations(changes: &[Change], raw: &Value, root: &str) -> Patch {
    let mut builder = Builder {
        raw,
        root,
        created: Vec::new(),
        ops: Vec::new(),
    };
    for change in changes {
        builder.add_change(change);
    }
    Patch(builder.ops)
}

/// The JSON Patch that makes `raw` (a JobSet, or a Trainer runtime, whose JobSet spec is at
/// `root`) carry what the JobSet engine decided: each replicated Job's changes under its
/// `template`, the new `failurePolicy` (gpu-guard's rules in front of the JobSet's own, which
/// are copied from `raw` so their unknown fields survive), and the `gpu-guard.io/mutated`
/// annotation on the object.
pub fn jobset_operations(outcome: &JobSetOutcome, raw: &Value, root: &str) -> Patch {
    let mut ops = Vec::new();
    for (index, job) in &outcome.replicated {
        let template = format!("{root}/replicatedJobs/{index}/template");
        ops.extend(operations(&job.changes, raw, &template).0);
    }
    let Some(policy) = &outcome.failure_policy else {
        return Patch(ops);
    };
    let path = format!("{root}/failurePolicy");
    let existing = raw.pointer(&path).filter(|value| value.is_object());
    match existing {
        None => ops.push(add(&path, json(policy))),
        Some(existing) => {
            ops.push(add(
                &format!("{path}/maxRestarts"),
                json(&policy.max_restarts),
            ));
            // The JobSet's own rules, as they came, after gpu-guard's (whose names start with
            // RULE_PREFIX; the JobSet's cannot: such a JobSet is left alone).
            let own: Vec<Value> = existing
                .get("rules")
                .and_then(Value::as_array)
                .map(|rules| {
                    rules
                        .iter()
                        .zip(
                            policy
                                .rules
                                .iter()
                                .filter(|r| !r.name.starts_with(RULE_PREFIX)),
                        )
                        .map(|(raw_rule, named)| {
                            let mut rule = raw_rule.clone();
                            if let Some(fields) = rule.as_object_mut() {
                                fields.insert("name".to_owned(), Value::from(named.name.clone()));
                            }
                            rule
                        })
                        .collect()
                })
                .unwrap_or_default();
            let mut rules: Vec<Value> = policy
                .rules
                .iter()
                .filter(|rule| rule.name.starts_with(RULE_PREFIX))
                .map(json)
                .collect();
            rules.extend(own);
            ops.push(add(&format!("{path}/rules"), Value::Array(rules)));
        }
    }
    let annotation = Change::SetAnnotation {
        key: MUTATED_ANNOTATION.to_owned(),
        value: outcome.summary(),
    };
    ops.extend(operations(&[annotation], raw, JOB_ROOT).0);
    Patch(ops)
}

/// The operation that puts `value`, the old object's, back at `path` (its parent exists: the
/// owned fields of [`crate::mutate::object::restore_object`] hang below a Job's `spec` or pod
/// template spec, or a JobSet spec).
pub fn put_back(path: &str, value: &Value) -> PatchOperation {
    add(path, value.clone())
}

/// [`put_back`], creating the missing parents of `path` in `new` (objects holding just the
/// value on its way): the pod template annotation gpu-guard owns may come back to a template
/// whose update has no `annotations`, or no `metadata`.
pub fn put_back_under(new: &Value, path: &str, value: &Value) -> PatchOperation {
    let mut path = path.to_owned();
    let mut value = value.clone();
    while let Some((parent, key)) = path.rsplit_once('/')
        && !parent.is_empty()
        && new.pointer(parent).is_none_or(Value::is_null)
    {
        value = Value::Object(Map::from_iter([(unescape(key), value)]));
        path = parent.to_owned();
    }
    add(&path, value)
}

fn add(path: &str, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::parse(path).expect("patch paths are built from escaped tokens"),
        value,
    })
}

/// Applies a patch to a copy of `raw`; an error means the patch must not be sent.
pub fn apply(raw: &Value, patch: &Patch) -> Result<Value, PatchError> {
    let mut patched = raw.clone();
    // The copy is dropped on an error, so json-patch need not undo what it did.
    json_patch::patch_unsafe(&mut patched, patch)?;
    Ok(patched)
}

struct Builder<'a> {
    raw: &'a Value,
    root: &'a str,
    /// Paths (relative to `root`) this patch has already created.
    created: Vec<String>,
    ops: Vec<PatchOperation>,
}

impl Builder<'_> {
    fn add_change(&mut self, change: &Change) {
        const POD: &str = "/spec/template/spec";
        match change {
            Change::SetAnnotation { key, value } => {
                self.set("/metadata/annotations", key, json(value));
            }
            Change::SetTemplateAnnotation { key, value } => {
                self.set("/spec/template/metadata/annotations", key, json(value));
            }
            Change::SetPodFailurePolicy(policy) => {
                self.set("/spec", "podFailurePolicy", json(policy))
            }
            Change::PrependRules(rules) => {
                let path = "/spec/podFailurePolicy/rules";
                if self.exists(path) {
                    for (index, rule) in rules.iter().enumerate() {
                        self.push_add(&format!("{path}/{index}"), json(rule));
                    }
                } else {
                    self.set("/spec/podFailurePolicy", "rules", json(rules));
                }
            }
            Change::SetPodReplacementPolicy(value) => {
                self.set("/spec", "podReplacementPolicy", json(value));
            }
            Change::SetActiveDeadlineSeconds(value) => {
                self.set("/spec", "activeDeadlineSeconds", json(value));
            }
            Change::SetRestartPolicy(value) => self.set(POD, "restartPolicy", json(value)),
            Change::SetTerminationGracePeriod(value) => {
                self.set(POD, "terminationGracePeriodSeconds", json(value));
            }
            Change::SetTolerationSeconds { index, seconds } => {
                self.set(
                    &format!("{POD}/tolerations/{index}"),
                    "tolerationSeconds",
                    json(seconds),
                );
            }
            Change::AddToleration(toleration) => {
                let path = format!("{POD}/tolerations");
                if self.exists(&path) {
                    self.push_add(&format!("{path}/-"), json(toleration));
                } else {
                    self.set(POD, "tolerations", Value::Array(vec![json(toleration)]));
                }
            }
            Change::SetContainerRestartPolicy { index, value, .. } => {
                self.set(
                    &format!("{POD}/containers/{index}"),
                    "restartPolicy",
                    json(value),
                );
            }
            Change::AddContainerRestartRule { index, rule, .. } => {
                let container = format!("{POD}/containers/{index}");
                let path = format!("{container}/restartPolicyRules");
                if self.exists(&path) {
                    self.push_add(&format!("{path}/-"), json(rule));
                } else {
                    self.set(
                        &container,
                        "restartPolicyRules",
                        Value::Array(vec![json(rule)]),
                    );
                }
            }
        }
    }

    /// Sets `parent[key] = value`, creating `parent` (and its missing ancestors) as objects
    /// holding just this key when it is absent or null.
    fn set(&mut self, parent: &str, key: &str, value: Value) {
        let path = format!("{parent}/{}", escape(key));
        if parent.is_empty() || self.exists(parent) {
            self.push_add(&path, value);
            self.created.push(path);
            return;
        }
        let (grandparent, parent_key) = parent.rsplit_once('/').unwrap_or(("", parent));
        let parent_key = unescape(parent_key);
        self.set(
            grandparent,
            &parent_key,
            Value::Object(Map::from_iter([(key.to_owned(), value)])),
        );
        self.created.push(path);
    }

    fn exists(&self, path: &str) -> bool {
        self.created.iter().any(|created| created == path)
            || self
                .raw
                .pointer(&format!("{}{path}", self.root))
                .is_some_and(|value| !value.is_null())
    }

    fn push_add(&mut self, path: &str, value: Value) {
        let pointer = PointerBuf::parse(format!("{}{path}", self.root))
            .expect("patch paths are built from escaped tokens");
        self.ops.push(PatchOperation::Add(AddOperation {
            path: pointer,
            value,
        }));
    }
}

/// Why a patch does not apply: the operation (its index in the patch), its path, and what is
/// wrong there.
#[derive(Debug, thiserror::Error)]
#[error("operation '/{operation}' failed at path '{path}': {reason}")]
pub struct DoesNotApply {
    pub operation: usize,
    pub path: String,
    pub reason: String,
}

impl From<PatchError> for DoesNotApply {
    fn from(error: PatchError) -> Self {
        Self {
            operation: error.operation,
            path: error.path.to_string(),
            reason: error.kind.to_string(),
        }
    }
}

/// Checks that a patch applies to `document` without keeping the result: json-patch applies
/// it to a copy, so the check judges exactly as the API server's JSON Patch does (RFC 6902).
pub fn check_applies(document: &Value, patch: &Patch) -> Result<(), DoesNotApply> {
    apply(document, patch).map(drop).map_err(DoesNotApply::from)
}

fn json(value: &impl Serialize) -> Value {
    serde_json::to_value(value).expect("k8s-openapi types serialize to JSON")
}

/// Escapes a key as a JSON Pointer token (RFC 6901).
fn escape(key: &str) -> std::borrow::Cow<'_, str> {
    if key.contains(['~', '/']) {
        key.replace('~', "~0").replace('/', "~1").into()
    } else {
        key.into()
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerRestartRule, Toleration};
    use serde_json::json;

    #[test]
    fn a_patch_that_does_not_apply_is_caught() {
        let raw = json!({"metadata": {}, "spec": {"template": {"spec": {}}}});
        let good = operations(
            &[Change::SetTolerationSeconds {
                index: 0,
                seconds: 1,
            }],
            &json!({"spec": {"template": {"spec": {"tolerations": [{}]}}}}),
            JOB_ROOT,
        );
        // Built for a document that has tolerations[0]; this one has none.
        assert_eq!(
            check_applies(&raw, &good).map_err(|error| error.to_string()),
            Err("operation '/0' failed at path \
                 '/spec/template/spec/tolerations/0/tolerationSeconds': path is invalid"
                .to_owned())
        );
        let append = operations(
            &[
                Change::AddToleration(Toleration::default()),
                Change::AddToleration(Toleration::default()),
            ],
            &raw,
            JOB_ROOT,
        );
        assert!(
            check_applies(&raw, &append).is_ok(),
            "appending to an array the patch made"
        );
    }

    #[test]
    fn an_annotation_on_an_object_without_annotations_creates_the_map_in_one_operation() {
        let raw = json!({"metadata": {"name": "x"}, "spec": {}});
        let changes = [Change::SetAnnotation {
            key: "gpu-guard.io/mutated".to_owned(),
            value: "yes".to_owned(),
        }];
        let patch = operations(&changes, &raw, JOB_ROOT);
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([{"op": "add", "path": "/metadata/annotations",
                    "value": {"gpu-guard.io/mutated": "yes"}}])
        );
        let patched = apply(&raw, &patch).unwrap();
        assert_eq!(
            patched["metadata"]["annotations"]["gpu-guard.io/mutated"],
            "yes"
        );
    }

    #[test]
    fn keys_with_slashes_are_escaped_and_null_parents_are_replaced() {
        let raw = json!({"metadata": {"annotations": {"a": "b"}}, "spec": {"template": {"spec": {"tolerations": null}}}});
        let toleration = serde_json::from_value(json!({"key": "k", "operator": "Exists"})).unwrap();
        let changes = [
            Change::SetAnnotation {
                key: "gpu-guard.io/mutated".to_owned(),
                value: "v".to_owned(),
            },
            Change::AddToleration(toleration),
            Change::AddToleration(serde_json::from_value(json!({"key": "j"})).unwrap()),
        ];
        let patch = operations(&changes, &raw, JOB_ROOT);
        let paths: Vec<String> = patch.iter().map(|op| op.path().to_string()).collect();
        assert_eq!(
            paths,
            vec![
                "/metadata/annotations/gpu-guard.io~1mutated",
                "/spec/template/spec/tolerations",
                "/spec/template/spec/tolerations/-",
            ]
        );
        let patched = apply(&raw, &patch).unwrap();
        assert_eq!(
            patched["spec"]["template"]["spec"]["tolerations"][1]["key"],
            "j"
        );
        assert_eq!(patched["metadata"]["annotations"]["a"], "b");
    }

    #[test]
    fn restart_rules_are_appended_to_the_container_by_index_or_created_with_their_list() {
        let raw = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "metrics", "restartPolicyRules": null},
            {"name": "main", "restartPolicy": "Never", "restartPolicyRules": [
                {"action": "Restart", "exitCodes": {"operator": "In", "values": [3]}, "futureField": 1}
            ]},
        ]}}}});
        let rule: ContainerRestartRule = serde_json::from_value(
            json!({"action": "Restart", "exitCodes": {"operator": "In", "values": [70, 140]}}),
        )
        .unwrap();
        let changes = [
            Change::SetContainerRestartPolicy {
                index: 0,
                container: "metrics".to_owned(),
                value: "Never".to_owned(),
            },
            Change::AddContainerRestartRule {
                index: 0,
                container: "metrics".to_owned(),
                rule: rule.clone(),
            },
            Change::AddContainerRestartRule {
                index: 1,
                container: "main".to_owned(),
                rule,
            },
        ];
        let patch = operations(&changes, &raw, JOB_ROOT);
        let paths: Vec<String> = patch.iter().map(|op| op.path().to_string()).collect();
        assert_eq!(
            paths,
            vec![
                "/spec/template/spec/containers/0/restartPolicy",
                "/spec/template/spec/containers/0/restartPolicyRules",
                "/spec/template/spec/containers/1/restartPolicyRules/-",
            ]
        );
        let patched = apply(&raw, &patch).unwrap();
        let containers = &patched["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers[0]["restartPolicy"], "Never");
        assert_eq!(
            containers[0]["restartPolicyRules"][0]["exitCodes"]["values"],
            json!([70, 140])
        );
        let main = containers[1]["restartPolicyRules"].as_array().unwrap();
        assert_eq!(main.len(), 2);
        assert_eq!(
            main[0]["futureField"], 1,
            "the container's own rule is untouched"
        );
        assert_eq!(main[1]["exitCodes"]["values"], json!([70, 140]));
    }

    #[test]
    fn prepended_rules_are_inserted_without_touching_the_existing_ones() {
        let raw = json!({"spec": {"podFailurePolicy": {"rules": [
            {"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}, "futureField": 1}
        ]}}});
        let rule = serde_json::from_value(json!({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]})).unwrap();
        let patch = operations(&[Change::PrependRules(vec![rule])], &raw, JOB_ROOT);
        let patched = apply(&raw, &patch).unwrap();
        let rules = patched["spec"]["podFailurePolicy"]["rules"]
            .as_array()
            .unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0]["action"], "Ignore");
        assert_eq!(
            rules[1]["futureField"], 1,
            "unknown fields of the Job's own rules survive"
        );
    }
}
