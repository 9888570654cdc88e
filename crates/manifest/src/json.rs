//! Reading a JSON document as kubectl's strict decoding does: a key written twice in one
//! object is refused (`duplicate field`), where serde_json keeps the last value.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::read::ReadError;

/// A key found twice: where (the steps to its object, innermost first, filled in as the error
/// goes back up) and which.
#[derive(Default)]
struct Twice {
    steps: Vec<String>,
    key: String,
}

/// Reads one JSON value (the splitter measured its depth); errors as [`ReadError`], lines of
/// `text`.
pub fn read_json(text: &str) -> Result<Value, ReadError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    // The splitter measured the depth: within the limit, serde_json's own fixed limit of 128
    // need not apply.
    deserializer.disable_recursion_limit();
    let twice = RefCell::new(None);
    let read = Strict { twice: &twice }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value));
    read.map_err(|error| {
        let line = error.line().max(1);
        match twice.into_inner() {
            Some(Twice { mut steps, key }) => {
                steps.reverse();
                let path: String = steps.concat();
                let path = path.strip_prefix('.').unwrap_or(&path).to_owned();
                let full = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                ReadError {
                    line,
                    message: match path.as_str() {
                        "" => format!("mapping key {key:?} already defined"),
                        path => format!("{path}: mapping key {key:?} already defined"),
                    },
                    // The first definition: the first key of that path in the text.
                    defined_at: super::lines::line_of(text, 0, &full),
                }
            }
            None => ReadError {
                line,
                message: gpu_guard_core::decode::without_position(&error),
                defined_at: None,
            },
        }
    })
}

/// Builds a JSON value as serde_json does, refusing a key written twice in one object.
#[derive(Clone, Copy)]
struct Strict<'t> {
    twice: &'t RefCell<Option<Twice>>,
}

impl Strict<'_> {
    /// On the way back up from an error about a key written twice, notes the step taken.
    fn through<T, E>(self, result: Result<T, E>, step: impl FnOnce() -> String) -> Result<T, E> {
        if result.is_err()
            && let Some(twice) = self.twice.borrow_mut().as_mut()
        {
            twice.steps.push(step());
        }
        result
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut values = Vec::new();
        loop {
            let item = items.next_element_seed(self);
            match self.through(item, || format!("[{}]", values.len()))? {
                Some(value) => values.push(value),
                None => return Ok(Value::Array(values)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = entries.next_key::<String>()? {
            if map.contains_key(&key) {
                let message = format!("mapping key {key:?} already defined");
                *self.twice.borrow_mut() = Some(Twice {
                    steps: Vec::new(),
                    key,
                });
                return Err(de::Error::custom(message));
            }
            let value = entries.next_value_seed(self);
            let value = self.through(value, || format!(".{key}"))?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_reads_as_serde_json_reads_it() {
        let text = r#"{"a": [1, -2, 1.5, true, null, "x", {"b": {}}], "c": 18446744073709551615}"#;
        assert_eq!(
            read_json(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
    }

    #[test]
    fn a_key_written_twice_is_refused_with_both_lines() {
        let text = "{\n  \"kind\": \"Job\",\n  \"spec\": {\n    \"template\": {\"spec\": {\n      \
                    \"containers\": [{\"name\": \"a\", \"name\": \"b\"}]}},\n    \
                    \"parallelism\": 1,\n    \"parallelism\": 2\n  }\n}";
        let error = read_json(text).unwrap_err();
        assert_eq!(
            (error.line, error.message.as_str(), error.defined_at),
            (
                5,
                "spec.template.spec.containers[0]: mapping key \"name\" already defined",
                Some(5)
            )
        );
        let error = read_json("{\"spec\": {\"parallelism\": 1,\n\"parallelism\": 2}}").unwrap_err();
        assert_eq!(
            (error.line, error.message.as_str(), error.defined_at),
            (
                2,
                "spec: mapping key \"parallelism\" already defined",
                Some(1)
            )
        );
        let error = read_json("{\"kind\": 1, \"kind\": 2}").unwrap_err();
        assert_eq!(error.message, "mapping key \"kind\" already defined");
        assert_eq!(
            read_json("{\"a\": {\"x\": 1}, \"b\": {\"x\": 1}}").unwrap(),
            json!({"a": {"x": 1}, "b": {"x": 1}})
        );
    }
}
