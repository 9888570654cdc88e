//! Reading YAML manifests the way kubectl reads them.
//!
//! kubectl (sigs.k8s.io/yaml, a go-yaml v2 fork) resolves plain scalars with YAML 1.1 rules:
//! `defaultMode: 0755` is the octal number 493, `readOnly: yes` and `hostIPC: off` are booleans,
//! `1_000` is a thousand. YAML 1.2 libraries read those as strings or other numbers, and writing
//! them back would change the manifest. This reader walks yaml-rust2's events and resolves
//! plain scalars the YAML 1.1 way; quoted and block scalars are strings; anchors, aliases and
//! `<<` merge keys are resolved. The result is JSON values, one per document.

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
        /// Values of `<<` keys, merged in at the end (explicit keys win).
        merges: Vec<Value>,
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
            Some(Frame::Mapping {
                entries,
                key,
                merges,
                ..
            }) => match key.take() {
                None => {
                    *key = Some(match key_text {
                        Some((text, true)) if text == "<<" => Key::Merge,
                        Some((text, _)) => Key::Text(text),
                        // A collection as a key: kubectl would refuse it as JSON; keep its text.
                        None => Key::Text(value.to_string()),
                    });
                }
                Some(Key::Text(name)) => {
                    entries.insert(name, value);
                }
                Some(Key::Merge) => match value {
                    Value::Object(_) => merges.push(value),
                    Value::Array(sources) if sources.iter().all(Value::is_object) => {
                        merges.extend(sources);
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
                merges: Vec::new(),
                anchor,
            }),
            Event::SequenceEnd | Event::MappingEnd => {
                let (value, anchor) = match self.stack.pop() {
                    Some(Frame::Sequence { items, anchor }) => (Value::Array(items), anchor),
                    Some(Frame::Mapping {
                        mut entries,
                        merges,
                        anchor,
                        ..
                    }) => {
                        for source in merges {
                            if let Value::Object(source) = source {
                                for (name, value) in source {
                                    entries.entry(name).or_insert(value);
                                }
                            }
                        }
                        (Value::Object(entries), anchor)
                    }
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
    if let Some(number) = yaml11_int(text) {
        return Value::Number(number);
    }
    if let Some(number) = yaml11_float(text) {
        return Value::Number(number);
    }
    Value::String(text.to_owned())
}

fn yaml11_int(text: &str) -> Option<Number> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let cleaned: String = digits.chars().filter(|c| *c != '_').collect();
    if cleaned.is_empty() || digits.starts_with('_') {
        return None;
    }
    let (radix, body) = if let Some(binary) = cleaned.strip_prefix("0b") {
        (2, binary)
    } else if let Some(hex) = cleaned.strip_prefix("0x") {
        (16, hex)
    } else if cleaned.len() > 1 && cleaned.starts_with('0') {
        (8, &cleaned[1..])
    } else {
        (10, cleaned.as_str())
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from_str_radix(body, radix).ok()?;
    let value = if negative { -magnitude } else { magnitude };
    if let Ok(small) = i64::try_from(value) {
        Some(Number::from(small))
    } else {
        u64::try_from(value).ok().map(Number::from)
    }
}

fn yaml11_float(text: &str) -> Option<Number> {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    let bytes = digits.as_bytes();
    let starts_ok = bytes.first().is_some_and(|b| b.is_ascii_digit())
        || (bytes.first() == Some(&b'.') && bytes.get(1).is_some_and(u8::is_ascii_digit));
    let allowed = digits
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | '_' | 'e' | 'E' | '-' | '+'));
    if !starts_ok || !allowed || !digits.contains(['.', 'e', 'E']) {
        return None;
    }
    let cleaned: String = text.chars().filter(|c| *c != '_').collect();
    cleaned.parse::<f64>().ok().and_then(Number::from_f64)
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
             y: yes\nn: off\nt: true\nz: ~\nempty:\nname: main\nver: 1.2.3\noct8: 0o17\n\
             date: 2026-01-01\nq: \"0755\"\ns: 'yes'\nlit: |\n  on\n",
        );
        assert_eq!(
            value,
            json!({"mode": 493, "hex": 31, "bin": 5, "big": 1000, "neg": -12, "f": 1.5, "e": 1000.0,
                   "y": true, "n": false, "t": true, "z": null, "empty": null, "name": "main",
                   "ver": "1.2.3", "oct8": "0o17", "date": "2026-01-01", "q": "0755", "s": "yes",
                   "lit": "on\n"})
        );
    }

    #[test]
    fn anchors_aliases_and_merge_keys() {
        let value = one(
            "base: &gpu\n  limits: {nvidia.com/gpu: 1}\n  requests: {cpu: 1}\n\
             a: *gpu\nb:\n  <<: *gpu\n  requests: {cpu: 2}\nc:\n  <<: [{x: 1}, {x: 2, y: 2}]\n",
        );
        assert_eq!(value["a"], value["base"]);
        assert_eq!(value["b"]["limits"], json!({"nvidia.com/gpu": 1}));
        assert_eq!(
            value["b"]["requests"],
            json!({"cpu": 2}),
            "explicit keys win"
        );
        assert_eq!(value["c"], json!({"x": 1, "y": 2}), "earlier sources win");
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
