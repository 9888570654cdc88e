//! Reading YAML manifests the way kubectl reads them.
//!
//! kubectl (sigs.k8s.io/yaml, a go-yaml v2 fork) resolves plain scalars with YAML 1.1 rules:
//! `defaultMode: 0755` is the octal number 493, `readOnly: yes` and `hostIPC: off` are booleans,
//! `1_000` is a thousand. YAML 1.2 libraries read those as strings or other numbers, and writing
//! them back would change the manifest. This reader walks yaml-rust2's events and resolves
//! plain scalars the way go-yaml v2 does; quoted and block scalars are strings; anchors,
//! aliases and `<<` merge keys (go-yaml v2's order) are resolved; keys become strings as
//! sigs.k8s.io/yaml makes them. The result is JSON values, one per document.

use std::collections::HashMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Why a YAML stream could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// The 0-based index of the document the error is in.
    pub document: usize,
    /// 1-based line.
    pub line: usize,
    pub message: String,
}

/// Reads every document of a YAML stream. Empty documents are dropped. On an error, the
/// documents before it are returned with it.
pub fn read_documents(text: &str) -> (Vec<Value>, Option<ReadError>) {
    let mut builder = Builder::default();
    let result = Parser::new_from_str(text).load(&mut builder, true);
    // Document indices count the documents kept (empty ones are dropped).
    let index = builder.documents.iter().filter(|d| !d.is_null()).count();
    let error = match (result, builder.error.take()) {
        (Err(error), _) => Some(ReadError {
            document: index,
            line: error.marker().line(),
            message: error.info().to_owned(),
        }),
        (Ok(()), Some((line, message))) => Some(ReadError {
            document: index,
            line,
            message,
        }),
        (Ok(()), None) => None,
    };
    let documents = builder
        .documents
        .into_iter()
        .filter(|document| !document.is_null())
        .collect();
    (documents, error)
}

enum Frame {
    Sequence {
        items: Vec<Value>,
        anchor: usize,
    },
    Mapping {
        entries: Map<String, Value>,
        /// The key waiting for its value; `None` when the next node is a key.
        key: Option<Key>,
        anchor: usize,
    },
}

enum Key {
    Text(String),
    Merge,
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Value>,
    documents: Vec<Value>,
    /// A semantic error (the events were well formed): line and message.
    error: Option<(usize, String)>,
}

impl Builder {
    /// Adds a finished node to its parent; `key_text` is the node's own text when it is a
    /// scalar (mapping keys are strings, taken as written).
    fn push(&mut self, value: Value, key_text: Option<(String, bool)>, marker: Marker) {
        match self.stack.last_mut() {
            None => self.documents.push(value),
            Some(Frame::Sequence { items, .. }) => items.push(value),
            Some(Frame::Mapping { entries, key, .. }) => match key.take() {
                None => {
                    // Keys resolve like values and become strings, as sigs.k8s.io/yaml
                    // makes them: `yes:` is "true", `0755:` is "493".
                    *key = Some(match (key_text, value) {
                        (Some((text, true)), _) if text == "<<" => Key::Merge,
                        (_, Value::String(text)) => Key::Text(text),
                        (_, Value::Bool(flag)) => Key::Text(flag.to_string()),
                        (_, Value::Number(number)) => Key::Text(number.to_string()),
                        (_, Value::Null) => {
                            self.error
                                .get_or_insert((marker.line(), "a null mapping key".to_owned()));
                            Key::Text(String::new())
                        }
                        (_, collection) => {
                            self.error.get_or_insert((
                                marker.line(),
                                "a mapping or list as a mapping key cannot be JSON".to_owned(),
                            ));
                            Key::Text(collection.to_string())
                        }
                    });
                }
                Some(Key::Text(name)) => {
                    entries.insert(name, value);
                }
                // go-yaml v2 merges where `<<` stands: it overwrites keys written before it,
                // keys after it overwrite the merged ones, and of several sources the first
                // wins (they are applied last to first).
                Some(Key::Merge) => match value {
                    Value::Object(source) => entries.extend(source),
                    Value::Array(sources) if sources.iter().all(Value::is_object) => {
                        for source in sources.into_iter().rev() {
                            if let Value::Object(source) = source {
                                entries.extend(source);
                            }
                        }
                    }
                    _ => {
                        self.error.get_or_insert((
                            marker.line(),
                            "a << merge key needs a mapping or a list of mappings".to_owned(),
                        ));
                    }
                },
            },
        }
    }

    fn anchored(&mut self, anchor: usize, value: &Value) {
        if anchor != 0 {
            self.anchors.insert(anchor, value.clone());
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, marker: Marker) {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                let plain = style == TScalarStyle::Plain;
                let value = resolve(&text, plain, tag.as_ref());
                self.anchored(anchor, &value);
                self.push(value, Some((text, plain)), marker);
            }
            Event::Alias(anchor) => {
                let value = self.anchors.get(&anchor).cloned().unwrap_or_else(|| {
                    self.error
                        .get_or_insert((marker.line(), "an alias to an unknown anchor".to_owned()));
                    Value::Null
                });
                self.push(value, None, marker);
            }
            Event::SequenceStart(anchor, _) => self.stack.push(Frame::Sequence {
                items: Vec::new(),
                anchor,
            }),
            Event::MappingStart(anchor, _) => self.stack.push(Frame::Mapping {
                entries: Map::new(),
                key: None,
                anchor,
            }),
            Event::SequenceEnd | Event::MappingEnd => {
                let (value, anchor) = match self.stack.pop() {
                    Some(Frame::Sequence { items, anchor }) => (Value::Array(items), anchor),
                    Some(Frame::Mapping {
                        entries, anchor, ..
                    }) => (Value::Object(entries), anchor),
                    None => return,
                };
                self.anchored(anchor, &value);
                self.push(value, None, marker);
            }
            Event::DocumentStart => self.anchors.clear(),
            _ => {}
        }
    }
}

/// A scalar's value: plain scalars by YAML 1.1 rules (as go-yaml v2 resolves them), quoted
/// and block scalars as strings, core-schema tags (`!!str`, `!!int`, ...) as they say.
fn resolve(text: &str, plain: bool, tag: Option<&Tag>) -> Value {
    match tag {
        Some(tag) if tag.handle == "tag:yaml.org,2002:" || tag.handle == "!!" => {
            return match tag.suffix.as_str() {
                "str" => Value::String(text.to_owned()),
                "null" => Value::Null,
                "bool" | "int" | "float" => resolve_plain(text),
                _ => Value::String(text.to_owned()),
            };
        }
        _ => {}
    }
    if plain {
        resolve_plain(text)
    } else {
        Value::String(text.to_owned())
    }
}

fn resolve_plain(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Value::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Value::Bool(false);
        }
        _ => {}
    }
    match text.as_bytes().first() {
        Some(b'0'..=b'9' | b'-' | b'+' | b'.') => {}
        _ => return Value::String(text.to_owned()),
    }
    // go-yaml v2: drop underscores, then Go's ParseInt(s, 0, 64), ParseUint, then its float
    // pattern. A float with no fraction is a whole number once sigs.k8s.io/yaml turns it into
    // JSON (Go writes float64 10 as `10`), so it is stored as one.
    let cleaned: String = text.chars().filter(|c| *c != '_').collect();
    if let Some(number) = go_int(&cleaned) {
        return Value::Number(number);
    }
    if is_go_yaml_float(&cleaned)
        && let Ok(float) = cleaned.parse::<f64>()
        && float.is_finite()
    {
        if float.fract() == 0.0 && float.abs() < 9.0e15 {
            // Exactly representable: the integer Go would print.
            return Value::Number(Number::from(float as i64));
        }
        if let Some(number) = Number::from_f64(float) {
            return Value::Number(number);
        }
    }
    Value::String(text.to_owned())
}

/// Go's `strconv.ParseInt(s, 0, 64)` and `ParseUint(s, 0, 64)`: a sign, then `0x`/`0X`,
/// `0b`/`0B`, `0o`/`0O` or a leading `0` for octal, else decimal.
fn go_int(text: &str) -> Option<Number> {
    let (negative, unsigned) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = unsigned.get(..2).map(str::to_ascii_lowercase);
    let (radix, digits) = match lower.as_deref() {
        Some("0x") => (16, &unsigned[2..]),
        Some("0b") => (2, &unsigned[2..]),
        Some("0o") => (8, &unsigned[2..]),
        _ if unsigned.len() > 1 && unsigned.starts_with('0') => (8, &unsigned[1..]),
        _ => (10, unsigned),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u128::from_str_radix(digits, radix).ok()?;
    if negative {
        let value = i64::try_from(magnitude)
            .ok()
            .map(|m| -m)
            .or_else(|| (magnitude == 1u128 << 63).then_some(i64::MIN))?;
        Some(Number::from(value))
    } else if let Ok(value) = i64::try_from(magnitude) {
        Some(Number::from(value))
    } else {
        u64::try_from(magnitude).ok().map(Number::from)
    }
}

/// go-yaml v2's float pattern: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_go_yaml_float(text: &str) -> bool {
    let bytes = text.strip_prefix(['-', '+']).unwrap_or(text).as_bytes();
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .position(|b| !b.is_ascii_digit())
            .map_or(bytes.len(), |offset| from + offset)
    };
    let mut at = digits(0);
    let integer_digits = at;
    if bytes.get(at) == Some(&b'.') {
        let after = digits(at + 1);
        if integer_digits == 0 && after == at + 1 {
            return false; // `.` alone or `.e5`
        }
        at = after;
    } else if integer_digits == 0 {
        return false;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        let mut exponent = at + 1;
        if matches!(bytes.get(exponent), Some(b'-' | b'+')) {
            exponent += 1;
        }
        let end = digits(exponent);
        if end == exponent {
            return false;
        }
        at = end;
    }
    at == bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(text: &str) -> Value {
        let (documents, error) = read_documents(text);
        assert_eq!(error, None);
        assert_eq!(documents.len(), 1);
        documents.into_iter().next().unwrap()
    }

    #[test]
    fn plain_scalars_resolve_as_kubectl_resolves_them() {
        let value = one(
            "mode: 0755\nhex: 0x1F\nbin: 0b101\nbig: 1_000\nneg: -12\nf: 1.5\ne: 1e3\n\
             yy: yes\nnn: off\nt: true\nz: ~\nempty:\nname: main\nver: 1.2.3\noct8: 0o17\n\
             date: 2026-01-01\nq: \"0755\"\ns: 'yes'\nlit: |\n  on\n\
             whole: 1.0\nHEX: 0X1F\neight: 08\nu: 18446744073709551615\nneg_u: -_1\nhalf: .5\n",
        );
        assert_eq!(
            value,
            json!({"mode": 493, "hex": 31, "bin": 5, "big": 1000, "neg": -12, "f": 1.5, "e": 1000,
                   "yy": true, "nn": false, "t": true, "z": null, "empty": null, "name": "main",
                   "ver": "1.2.3", "oct8": 15, "date": "2026-01-01", "q": "0755", "s": "yes",
                   "lit": "on\n", "whole": 1, "HEX": 31, "eight": 8, "u": 18446744073709551615u64,
                   "neg_u": -1, "half": 0.5})
        );
    }

    #[test]
    fn anchors_aliases_and_merge_keys() {
        let value = one(
            "base: &gpu\n  limits: {nvidia.com/gpu: 1}\n  requests: {cpu: 1}\n\
             a: *gpu\nb:\n  <<: *gpu\n  requests: {cpu: 2}\nc:\n  <<: [{x: 1}, {x: 2, w: 2}]\n",
        );
        assert_eq!(value["a"], value["base"]);
        assert_eq!(value["b"]["limits"], json!({"nvidia.com/gpu": 1}));
        assert_eq!(
            value["b"]["requests"],
            json!({"cpu": 2}),
            "keys after << win"
        );
        assert_eq!(value["c"], json!({"x": 1, "w": 2}), "earlier sources win");
        let before = one("b:\n  x: 1\n  <<: {x: 2}\n");
        assert_eq!(
            before["b"]["x"], 2,
            "<< overwrites keys written before it, as go-yaml v2"
        );
    }

    #[test]
    fn keys_become_strings_as_sigs_k8s_io_yaml_makes_them() {
        let value = one("data:\n  yes: a\n  0755: b\n  1.10: c\n  'y': d\n");
        assert_eq!(
            value["data"],
            json!({"true": "a", "493": "b", "1.1": "c", "y": "d"})
        );
        let (_, error) = read_documents("a:\n  ~: 1\n");
        assert!(error.unwrap().message.contains("null mapping key"));
    }

    #[test]
    fn documents_and_errors() {
        let (documents, error) = read_documents("---\na: 1\n---\n---\nb: [1\n");
        assert_eq!(documents, vec![json!({"a": 1})]);
        let error = error.unwrap();
        assert_eq!(error.document, 1);
        assert!(error.line >= 5, "{error:?}");
        let (documents, error) = read_documents("a: 1\n---\nb: 2\n...\n");
        assert_eq!(error, None);
        assert_eq!(documents, vec![json!({"a": 1}), json!({"b": 2})]);
    }
}
