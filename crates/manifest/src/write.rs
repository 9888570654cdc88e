//! A YAML writer for JSON values that every YAML reader agrees on.
//!
//! kubectl reads YAML 1.1 (sigs.k8s.io/yaml), where plain `yes`, `on`, `off`, `y`, `NO`,
//! `1_000`, `0o17` or `2026-01-01` are booleans, numbers or timestamps; YAML 1.2 emitters leave
//! them unquoted because, for YAML 1.2, they are strings. This writer prints a string plain only
//! when it is plainly a string under both versions (a conservative character set and none of
//! the special words or number shapes), and as a JSON string (valid YAML) otherwise. Block style
//! throughout, two-space indent, `- ` list items, keys in the order of the value.

use std::fmt::Write as _;

use serde_json::{Map, Value};

/// Renders one value as a YAML document (ending in a newline).
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_mapping(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => write_sequence(&mut out, items, 0),
        scalar => {
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
    out
}

fn write_mapping(out: &mut String, map: &Map<String, Value>, indent: usize) {
    for (key, value) in map {
        pad(out, indent);
        out.push_str(&string(key));
        out.push(':');
        write_nested(out, value, indent);
    }
}

fn write_sequence(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        pad(out, indent);
        out.push('-');
        match item {
            // `- key: value` with the rest of the mapping indented under the first key.
            Value::Object(map) if !map.is_empty() => {
                let mut first = true;
                for (key, value) in map {
                    if first {
                        out.push(' ');
                        first = false;
                    } else {
                        pad(out, indent + 2);
                    }
                    out.push_str(&string(key));
                    out.push(':');
                    write_nested(out, value, indent + 2);
                }
            }
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                write_sequence(out, inner, indent + 2);
            }
            scalar => {
                out.push(' ');
                out.push_str(&inline(scalar));
                out.push('\n');
            }
        }
    }
}

/// Writes what follows `key:` — a scalar on the same line, a collection on the next ones.
fn write_nested(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_mapping(out, map, indent + 2);
        }
        // Sequences under a key are written at the key's indentation, as kubectl does.
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_sequence(out, items, indent);
        }
        scalar => {
            out.push(' ');
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn inline(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        Value::Array(_) => "[]".to_owned(),
        Value::Object(_) => "{}".to_owned(),
    }
}

/// A string as a plain scalar when that is unambiguous in YAML 1.1 and 1.2, else double-quoted
/// with every character outside YAML's printable set (and the line breaks NEL, LS, PS) escaped,
/// so libyaml-based readers (go-yaml, kubectl) accept it and read the same characters.
fn string(s: &str) -> String {
    if is_plain_safe(s) {
        return s.to_owned();
    }
    let mut quoted = String::with_capacity(s.len() + 2);
    quoted.push('"');
    for c in s.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            '\t' => quoted.push_str("\\t"),
            '\r' => quoted.push_str("\\r"),
            c if (c as u32) < 0x20
                || ('\u{7f}'..='\u{9f}').contains(&c)
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                ) =>
            {
                let _ = write!(quoted, "\\u{:04X}", c as u32);
            }
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

fn is_plain_safe(s: &str) -> bool {
    const SPECIAL_WORDS: [&str; 22] = [
        "y", "yes", "n", "no", "true", "false", "on", "off", "null", "~", "nan", "inf", "-inf",
        "+inf", ".nan", ".inf", "-.inf", "+.inf", "<<", "=", "-", "?",
    ];
    let Some(first) = s.chars().next() else {
        return false;
    };
    let allowed =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | '+' | ':');
    if !(first.is_ascii_alphabetic() || first == '/' || first == '_') || !s.chars().all(allowed) {
        return false;
    }
    // A colon is plain inside a scalar (`image: registry/train:1.0`), but not at its end.
    if s.ends_with(':') {
        return false;
    }
    if SPECIAL_WORDS.contains(&s.to_ascii_lowercase().as_str()) {
        return false;
    }
    // Starts with a letter, so it is not a number or a timestamp, except YAML 1.1 sexagesimal
    // and hex/octal forms, which all start with a digit.
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ambiguous_strings_are_quoted_and_plain_ones_are_not() {
        for ambiguous in [
            "yes",
            "on",
            "OFF",
            "y",
            "NO",
            "1_000",
            "0o17",
            "2026-01-01",
            "",
            " x",
            "1",
            "-1",
            "a: b",
            "#x",
            "x #y",
            "a:",
            "12:30",
            "true",
            "null",
            "~",
        ] {
            let text = string(ambiguous);
            assert!(text.starts_with('"'), "{ambiguous:?} came out as {text}");
        }
        for plain in [
            "main",
            "nvidia.com/gpu",
            "Never",
            "registry.example/train:1.0",
            "gpu-guard.io/mutated",
            "/dev/termination-log",
        ] {
            assert_eq!(string(plain), plain);
        }
    }

    #[test]
    fn characters_outside_yamls_printable_set_are_escaped() {
        let tricky = "a\u{7f}b\u{85}c\u{2028}d\u{9f}e\u{1}f\"g\\h\ti\u{feff}";
        let value = json!({tricky: tricky});
        let text = to_string(&value);
        assert!(text.is_ascii(), "{text}");
        let back: Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(back, value, "{text}");
        let documents = crate::read::read_yaml(&text, crate::read::Bounds::default());
        assert_eq!(documents, Ok(vec![value]));
    }

    #[test]
    fn the_output_reads_back_as_the_same_value_and_looks_like_kubectl() {
        let value = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "flags", "labels": {}, "annotations": {"a": "yes"}},
            "data": {"multi": "line one\nline two", "quote": "say \"hi\"", "n": 1, "f": 1.5, "b": true, "z": null},
            "list": [{"name": "a", "args": ["x", "on"]}, [1, 2], [], "s", {}],
            "empty": []
        });
        let text = to_string(&value);
        let back: Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(back, value, "{text}");
        assert!(
            text.contains("\nlist:\n- name: a\n  args:\n  - x\n  - \"on\"\n"),
            "{text}"
        );
    }
}
