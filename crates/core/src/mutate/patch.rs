//! JSON Patch operations derived from the engine's typed [`Change`] list, applied to the raw
//! object as it arrived (so fields this version of k8s-openapi does not know survive).
//!
//! This is the only place patches are built. Each change owns one path; an absent or `null`
//! parent is created in the same operation (`add /metadata/annotations {"k": "v"}`), arrays are
//! appended to (`.../tolerations/-`, `.../containers/0/restartPolicyRules/-`) or inserted into
//! at a known index (rules prepended to a podFailurePolicy), never rewritten by position; a
//! container is reached by its index in `containers`, which the engine read from the same
//! object. A property test proves that applying these
//! operations gives the same document as `json_patch::diff` of the typed objects.

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
    json_patch::patch(&mut patched, patch)?;
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
            || lookup(self.raw, &[self.root, path]).is_some_and(|value| !value.is_null())
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

/// Checks that a patch applies to `document` (a raw object, or its skeleton: see
/// [`job_view`](super::job_view)) without keeping the result. Whether an `add` applies depends
/// on its path and on what earlier operations created there, not on the content of the values,
/// so the operations are applied, with RFC 6902's rules for `add` (those of json-patch and
/// serde_json's pointers), to the [`skeleton`] of the document, each added value replaced by an
/// empty container of the same kind: no deep copies of the values on the request path. A patch
/// with other operations (gpu-guard builds only `add`) is judged by json-patch itself; a `test`
/// is judged on the shapes, not the values.
///
/// The skeleton holds the paths as the patch writes them. An operation that inserts into or
/// removes from an array moves the items after it, which a later operation may then name at
/// their new index: the skeleton does not follow them. So a failure on the skeleton is only a
/// suspicion, confirmed by json-patch on the whole document (a copy, on that rare path only).
pub fn check_applies(document: &Value, patch: &Patch) -> Result<(), DoesNotApply> {
    let mut copy = skeleton(document, patch);
    for item in patch.iter() {
        let PatchOperation::Add(add) = item else {
            // Not a patch gpu-guard built: json-patch judges the whole of it.
            return json_patch::patch_unsafe(&mut skeleton(document, patch), &shapes(patch))
                .or_else(|_| check_on_the_whole(document, patch));
        };
        if add_shape(&mut copy, add.path.as_str(), shape(&add.value)).is_err() {
            return check_on_the_whole(document, patch);
        }
    }
    Ok(())
}

/// json-patch's verdict on the whole document, each added value replaced by its shape.
fn check_on_the_whole(document: &Value, patch: &Patch) -> Result<(), DoesNotApply> {
    Ok(json_patch::patch_unsafe(
        &mut document.clone(),
        &shapes(patch),
    )?)
}

/// The patch with each added value replaced by its shape.
fn shapes(patch: &Patch) -> Vec<PatchOperation> {
    patch
        .iter()
        .map(|operation| match operation {
            PatchOperation::Add(add) => PatchOperation::Add(AddOperation {
                path: add.path.clone(),
                value: shape(&add.value),
            }),
            other => other.clone(),
        })
        .collect()
}

/// An empty container of `value`'s kind, or `null`: what an `add` of `value` leaves for later
/// operations to walk into.
fn shape(value: &Value) -> Value {
    match value {
        Value::Object(_) => Value::Object(Map::new()),
        Value::Array(_) => Value::Array(Vec::new()),
        _ => Value::Null,
    }
}

/// RFC 6902 `add` of `value` at `pointer` (RFC 6901, encoded): the parent must exist; an
/// object gets the key, an array the value at an index up to its length (`-` is its length).
fn add_shape(document: &mut Value, pointer: &str, value: Value) -> Result<(), &'static str> {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        if !pointer.is_empty() {
            return Err("a JSON Pointer starts with '/'");
        }
        *document = value;
        return Ok(());
    };
    let mut target = document;
    for token in parent.split('/').skip(1) {
        target = match target {
            Value::Object(map) => map.get_mut(decoded(token).as_ref()),
            Value::Array(items) => array_index(token).and_then(|index| items.get_mut(index)),
            _ => None,
        }
        .ok_or("the parent of the path does not exist")?;
    }
    match target {
        Value::Object(map) => {
            map.insert(decoded(last).into_owned(), value);
            Ok(())
        }
        Value::Array(items) => {
            let index = match last {
                "-" => items.len(),
                _ => array_index(last).ok_or("the last token is not an array index")?,
            };
            if index > items.len() {
                return Err("the index is past the end of the array");
            }
            items.insert(index, value);
            Ok(())
        }
        _ => Err("the parent of the path is neither an object nor an array"),
    }
}

/// An array index as RFC 6901 writes it: `0`, or digits without a leading zero (serde_json's
/// and json-patch's reading).
fn array_index(token: &str) -> Option<usize> {
    let digits = token.bytes().all(|byte| byte.is_ascii_digit());
    if !digits || token.is_empty() || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

/// A pointer token (RFC 6901, encoded) as the key it names; borrowed unless it has escapes.
fn decoded(token: &str) -> std::borrow::Cow<'_, str> {
    if token.contains('~') {
        std::borrow::Cow::Owned(unescape(token))
    } else {
        std::borrow::Cow::Borrowed(token)
    }
}

/// The parts of `document` a patch's operations can depend on: for every operation, the chain
/// of containers from the root to the parent of its target (objects with just the keys on a
/// chain, arrays at their full length with `null` off the chains). Applying the patch to it
/// succeeds exactly when applying it to `document` does, without copying the whole object.
fn skeleton(document: &Value, patch: &Patch) -> Value {
    let mut skeleton = empty_like(document);
    for operation in patch.iter() {
        let pointer = operation.path().as_str();
        // An `add` needs its parent; any other operation its target too.
        let walked = match operation {
            PatchOperation::Add(_) => pointer.rsplit_once('/').map_or("", |(parent, _)| parent),
            _ => pointer,
        };
        let (mut from, mut to) = (document, &mut skeleton);
        for token in walked.split('/').skip(1) {
            let key = decoded(token);
            let next = match from {
                Value::Object(map) => map.get(key.as_ref()),
                Value::Array(items) => array_index(token).and_then(|i| items.get(i)),
                _ => None,
            };
            let Some(next) = next else { break };
            let slot = match to {
                Value::Object(map) => map
                    .entry(key.into_owned())
                    .or_insert_with(|| empty_like(next)),
                Value::Array(items) => match array_index(token).and_then(|i| items.get_mut(i)) {
                    Some(slot) => {
                        if slot.is_null() {
                            *slot = empty_like(next);
                        }
                        slot
                    }
                    None => break,
                },
                _ => break,
            };
            (from, to) = (next, slot);
        }
    }
    skeleton
}

/// `value.pointer(pointer)` for the JSON Pointer that is `parts` joined, without building it
/// or unescaping tokens that need none (the builder looks up a few paths for every change).
fn lookup<'v>(value: &'v Value, parts: &[&str]) -> Option<&'v Value> {
    let mut current = value;
    for token in parts.iter().flat_map(|part| part.split('/').skip(1)) {
        current = match current {
            Value::Object(map) => map.get(decoded(token).as_ref())?,
            Value::Array(items) => items.get(array_index(token)?)?,
            _ => return None,
        };
    }
    Some(current)
}

/// An empty container of `value`'s kind (an array keeps its length), or `value` itself.
fn empty_like(value: &Value) -> Value {
    match value {
        Value::Object(_) => Value::Object(Map::new()),
        Value::Array(items) => Value::Array(vec![Value::Null; items.len()]),
        other => other.clone(),
    }
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
    fn an_insertion_that_moves_the_items_after_it_is_followed() {
        // Found by the property test: `/0` inserts, so the object at index 2 is at index 3
        // for the next operation; the skeleton keeps the paths as written.
        let document = json!([null, null, {}]);
        let patch: Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/0", "value": {}},
            {"op": "add", "path": "/3/a", "value": {}},
        ]))
        .unwrap();
        assert_eq!(
            check_applies(&document, &patch).map_err(|e| e.to_string()),
            Ok(())
        );
        let removal: Patch = serde_json::from_value(json!([
            {"op": "remove", "path": "/0"},
            {"op": "add", "path": "/1/a", "value": 1},
        ]))
        .unwrap();
        assert_eq!(
            check_applies(&document, &removal).map_err(|e| e.to_string()),
            Ok(())
        );
        // And what does not apply on the whole document is still refused, by json-patch.
        let past: Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/0", "value": {}},
            {"op": "add", "path": "/2/a", "value": {}},
        ]))
        .unwrap();
        assert_eq!(
            check_applies(&document, &past).map_err(|e| e.operation),
            Err(1)
        );
    }

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
        assert!(check_applies(&raw, &good).is_err());
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
    fn the_check_reads_only_the_chains_the_operations_use_and_judges_as_the_whole_would() {
        let raw = json!({"spec": {"rules": [{"a": 1}, {"b": 2}], "big": {"x": [1, 2, 3]}}});
        let patch = |path: &str| {
            Patch(vec![PatchOperation::Add(AddOperation {
                path: PointerBuf::parse(path).unwrap(),
                value: json!({"c": 3}),
            })])
        };
        for (path, applies) in [
            ("/spec/rules/2", true),
            ("/spec/rules/3", false),
            ("/spec/rules/-", true),
            ("/spec/rules/1/c", true),
            ("/spec/missing/c", false),
            ("/spec/big/x/0/c", false),
        ] {
            assert_eq!(check_applies(&raw, &patch(path)).is_ok(), applies, "{path}");
            assert_eq!(apply(&raw, &patch(path)).is_ok(), applies, "{path}");
        }
        let skeleton = skeleton(&raw, &patch("/spec/rules/1/c"));
        assert_eq!(skeleton, json!({"spec": {"rules": [null, {}]}}));
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
    fn lookup_finds_what_a_json_pointer_finds() {
        let raw = json!({"spec": {"a/b": {"c~d": [1, {"e": null}]}, "list": []}});
        for pointer in [
            "",
            "/spec",
            "/spec/a~1b",
            "/spec/a~1b/c~0d/1",
            "/spec/a~1b/c~0d/1/e",
            "/spec/a~1b/c~0d/2",
            "/spec/a~1b/c~0d/x",
            "/spec/list/0",
            "/spec/missing",
            "/spec/a~1b/c~0d/0/deeper",
        ] {
            assert_eq!(lookup(&raw, &[pointer]), raw.pointer(pointer), "{pointer}");
            let (head, tail) = pointer.split_at(pointer.rfind('/').unwrap_or(0));
            assert_eq!(
                lookup(&raw, &[head, tail]),
                raw.pointer(pointer),
                "{pointer}"
            );
        }
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
