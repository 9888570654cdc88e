//! The policy reference (`docs/reference/policy.md`), generated from the policy types' JSON
//! Schema (their doc comments and defaults), so that it cannot drift from the code:
//! `tests/it/reference_docs.rs` fails when the checked-in file is stale.

use std::fmt::Write as _;

use serde_json::Value;

use super::Policy;

/// Every key of the policy file, by its dotted path, with its type, default and description.
pub fn markdown() -> String {
    let schema: Value =
        serde_json::from_str(&Policy::json_schema()).expect("the policy schema is JSON");
    let mut out = String::from(
        "# Policy reference\n\n<!-- Generated from the policy types in crates/core/src/policy/ by \
         tests/it/reference_docs.rs; do not edit. -->\n\n\
         Every key of a policy file (`apiVersion: gpu-guard.io/v1alpha1`, `kind: Policy`), with \
         its default. A key left out takes its default; `gpu-guard policy show` prints the \
         effective policy and `gpu-guard policy check FILE` validates one.\n\n\
         | key | type | default | description |\n|---|---|---|---|\n",
    );
    let definitions = schema.get("$defs").cloned().unwrap_or(Value::Null);
    keys(&mut out, &schema, "", &definitions, 0);
    out
}

fn keys(out: &mut String, schema: &Value, prefix: &str, definitions: &Value, depth: usize) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let resolved = resolve(property, definitions);
        let _ = writeln!(
            out,
            "| `{path}` | {} | {} | {} |",
            type_name(resolved, definitions),
            property
                .get("default")
                .filter(|default| !default.is_object())
                .map(|default| format!("`{default}`"))
                .unwrap_or_default(),
            cell(&description(property, resolved)),
        );
        // Nested objects (not lists of them) get their own rows; a depth limit guards cycles.
        if depth < 8 {
            keys(out, resolved, &path, definitions, depth + 1);
        }
    }
}

/// The schema a `$ref` (directly or in `allOf`/`anyOf` with null) points at.
fn resolve<'a>(schema: &'a Value, definitions: &'a Value) -> &'a Value {
    let reference = schema.get("$ref").and_then(Value::as_str).or_else(|| {
        ["allOf", "anyOf", "oneOf"]
            .iter()
            .filter_map(|key| schema.get(*key).and_then(Value::as_array))
            .flatten()
            .find_map(|option| option.get("$ref").and_then(Value::as_str))
    });
    reference
        .and_then(|reference| reference.strip_prefix("#/$defs/"))
        .and_then(|name| definitions.get(name))
        .unwrap_or(schema)
}

fn type_name(schema: &Value, definitions: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .map(|value| format!("`{}`", value.as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(" \\| ");
    }
    if let Some(options) = schema.get("oneOf").and_then(Value::as_array)
        && options.iter().all(|option| option.get("const").is_some())
    {
        return options
            .iter()
            .map(|option| format!("`{}`", option["const"].as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(" \\| ");
    }
    match schema.get("type") {
        Some(Value::String(kind)) if kind == "array" => {
            let items = schema
                .get("items")
                .map(|items| type_name(resolve(items, definitions), definitions))
                .unwrap_or_else(|| "any".to_owned());
            format!("list of {items}")
        }
        Some(Value::String(kind)) => kind.clone(),
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .filter(|kind| *kind != "null")
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "object".to_owned(),
    }
}

fn description(property: &Value, resolved: &Value) -> String {
    property
        .get("description")
        .or_else(|| resolved.get("description"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Text fit for one Markdown table cell.
pub fn cell(text: &str) -> String {
    text.trim()
        .replace('|', "\\|")
        .replace("\n\n", "<br><br>")
        .replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_keys_have_dotted_paths_types_and_defaults() {
        let reference = markdown();
        assert!(reference.contains("| `apiVersion` | string | `\"gpu-guard.io/v1alpha1\"` |"));
        assert!(reference.contains("| `devices.names` | list of string |"));
        assert!(reference.contains("| `mutation.podFailurePolicy.enabled` | boolean | `true` |"));
        assert!(reference.contains("`controller.dryRun`"));
    }
}
