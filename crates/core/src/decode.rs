//! Decoding errors in the words of the person who wrote the input.
//!
//! serde's messages name Rust types: `invalid type: string "abc", expected i64`, `integer
//! `99999999999999999999999` as u128`, `expected struct RawJob`. [`in_words`] says the same
//! thing without them (`expected a whole number, found the string "abc"`), and [`JsonError`]
//! adds the field the error is about (`spec.activeDeadlineSeconds`), found by decoding a second
//! time with the path tracked, only after the first decode failed: the happy path pays nothing.
//! [`tab_message`] names a tab that YAML refuses, where the parser says "found character that
//! cannot start any token".
//!
//! An error can also say the line of its field in the file it came from: a caller that reads
//! manifests ([`crate::manifest::Document::field_lines`]) says which text is being decoded for
//! as long as a [`FieldLinesScope`] lives, and an error made meanwhile looks its field up there
//! when it is shown. Nothing is looked up before an error, and nothing where no scope is set
//! (the webhook, whose request bodies are JSON no one wrote by hand).

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, de::Error as _};

/// A JSON decoding error: serde_json's own (for its category and position) and, for an error
/// in the data rather than the syntax, the field it is about. Its `Display` is for people:
/// `spec.activeDeadlineSeconds: expected a whole number, found the string "abc"`.
#[derive(Debug)]
pub struct JsonError {
    source: serde_json::Error,
    field: Option<String>,
    /// Where the decoded value was written, when a [`FieldLinesScope`] said so.
    lines: Option<ScopedLines>,
}

/// Where the values being decoded were written: the line of a field in their text.
pub trait FieldLines: Send + Sync {
    /// The line of `field` (`spec.parallelism`, a path from the root of an object) of the
    /// object `item` of the text (`None`: the text's one object; `Some(n)`: the n-th item of
    /// the `List` it holds).
    fn line_of(&self, item: Option<usize>, field: &str) -> Option<usize>;
}

/// A text's [`FieldLines`] and the object of it being decoded.
#[derive(Clone)]
struct ScopedLines {
    lines: Arc<dyn FieldLines>,
    item: Option<usize>,
}

impl fmt::Debug for ScopedLines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedLines")
            .field("item", &self.item)
            .finish_non_exhaustive()
    }
}

thread_local! {
    static SCOPED_LINES: RefCell<Option<ScopedLines>> = const { RefCell::new(None) };
}

/// While it lives, decode errors made on this thread name the line of their field in
/// `lines` (see [`field_lines_scope`]); dropping it restores the scope before it.
#[must_use = "the scope ends when this is dropped"]
pub struct FieldLinesScope {
    previous: Option<ScopedLines>,
}

/// Says that the values decoded on this thread until the scope is dropped come from the
/// object `item` of the text `lines` describes.
pub fn field_lines_scope(lines: Arc<dyn FieldLines>, item: Option<usize>) -> FieldLinesScope {
    let previous = SCOPED_LINES.with(|scoped| scoped.replace(Some(ScopedLines { lines, item })));
    FieldLinesScope { previous }
}

/// The scope set on this thread, if any.
fn scoped_lines() -> Option<ScopedLines> {
    SCOPED_LINES.with(|scoped| scoped.borrow().clone())
}

impl Drop for FieldLinesScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        SCOPED_LINES.with(|scoped| *scoped.borrow_mut() = previous);
    }
}

impl JsonError {
    /// An error of the decoded data that serde did not find (`found apiVersion "v1"`).
    pub fn custom(message: impl fmt::Display) -> Self {
        Self {
            source: serde_json::Error::custom(message),
            field: None,
            lines: None,
        }
    }

    /// Whether the text is not JSON at all (a syntax error or a truncated text), rather than
    /// JSON of the wrong shape.
    pub fn is_syntax(&self) -> bool {
        self.source.is_syntax() || self.source.is_eof()
    }

    /// The field the error is about (`spec.template.spec.containers[0].name`), when known.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// The same error for a value found at `parent` (`spec.jobTemplate`): its field is
    /// below that one.
    #[must_use]
    pub fn under(mut self, parent: &str) -> Self {
        if !self.is_syntax() && !parent.is_empty() {
            self.field = Some(match self.field.take() {
                None => parent.to_owned(),
                Some(field) if field.starts_with('[') => format!("{parent}{field}"),
                Some(field) => format!("{parent}.{field}"),
            });
            if self.lines.is_none() {
                self.lines = scoped_lines();
            }
        }
        self
    }

    /// The line of the field in the text the value was read from, when a
    /// [`FieldLinesScope`] was set as the error was made.
    pub fn line(&self) -> Option<usize> {
        let lines = self.lines.as_ref()?;
        lines.lines.line_of(lines.item, self.field.as_deref()?)
    }

    /// The message without the field.
    pub fn message(&self) -> String {
        let text = self.source.to_string();
        if self.field.is_some() {
            // The field says where; a position in a text the user may never have seen (the
            // CLI decodes values it re-serialised) would not.
            in_words(without_position(&text))
        } else {
            in_words(&text)
        }
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.field, self.line()) {
            (Some(field), Some(line)) => write!(f, "{field} (line {line}): {}", self.message()),
            (Some(field), None) => write!(f, "{field}: {}", self.message()),
            (None, _) => f.write_str(&self.message()),
        }
    }
}

impl std::error::Error for JsonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Decodes `T` from JSON text; an error names its field.
pub fn from_json_str<'de, T: Deserialize<'de>>(json: &'de str) -> Result<T, JsonError> {
    serde_json::from_str(json).map_err(|source| {
        let mut tracked = serde_json::Deserializer::from_str(json);
        with_field(
            source,
            serde_path_to_error::deserialize::<_, T>(&mut tracked),
        )
    })
}

/// Decodes `T` from JSON bytes; an error names its field.
pub fn from_json_slice<'de, T: Deserialize<'de>>(json: &'de [u8]) -> Result<T, JsonError> {
    serde_json::from_slice(json).map_err(|source| {
        let mut tracked = serde_json::Deserializer::from_slice(json);
        with_field(
            source,
            serde_path_to_error::deserialize::<_, T>(&mut tracked),
        )
    })
}

/// Decodes `T` from a JSON value; an error names its field.
pub fn from_json_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, JsonError> {
    T::deserialize(value)
        .map_err(|source| with_field(source, serde_path_to_error::deserialize::<_, T>(value)))
}

/// The first error, with the field the tracked second decode found (none when that one
/// succeeded or failed at the root, or when the text is not JSON at all).
fn with_field<T>(
    source: serde_json::Error,
    tracked: Result<T, serde_path_to_error::Error<serde_json::Error>>,
) -> JsonError {
    let field = match tracked {
        Err(error) if !source.is_syntax() && !source.is_eof() => {
            Some(error.path().to_string()).filter(|path| path != ".")
        }
        _ => None,
    };
    // Only for an error of the data, found in a field: the text's lines have nothing to say
    // about a text that is not JSON.
    let lines = field.is_some().then(scoped_lines).flatten();
    JsonError {
        source,
        field,
        lines,
    }
}

/// serde_json's message without its ` at line L column C`.
pub fn without_position(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(at) if message[at + 9..].contains(" column ") => &message[..at],
        _ => message,
    }
}

/// A serde message with the Rust type names put in words: `invalid type: string "abc",
/// expected i64` becomes `expected a whole number, found the string "abc"`; an integer out
/// of its type's range gets the range; `unknown variant` becomes `unknown value`. A position
/// suffix (` at line L column C`) is kept; other messages pass through.
pub fn in_words(message: &str) -> String {
    let body = without_position(message);
    let position = &message[body.len()..];
    let worded = body
        .strip_prefix("invalid type: ")
        .or_else(|| body.strip_prefix("invalid value: "))
        .and_then(|rest| rest.rsplit_once(", expected "))
        .map(|(found, expected)| {
            let integer = found_integer(found);
            format!(
                "expected {}, found {}",
                expected_in_words(expected, integer.is_some()),
                integer.map_or_else(|| found_in_words(found), str::to_owned)
            )
        })
        .or_else(|| {
            // A derived struct also decodes from a list of its fields' values, and says so.
            let (_, expected) = body
                .strip_prefix("invalid length ")?
                .split_once(", expected ")?;
            (expected.starts_with("struct ") || expected.starts_with("tuple struct "))
                .then(|| "expected a map, found a list".to_owned())
        })
        .or_else(|| {
            body.strip_prefix("unknown variant ")
                .map(|rest| format!("unknown value {rest}"))
        })
        .unwrap_or_else(|| body.to_owned());
    format!("{worded}{position}")
}

/// The digits of an integer serde reports as found (`integer `5``, `integer `N` as u128`).
fn found_integer(found: &str) -> Option<&str> {
    let rest = found.strip_prefix("integer `")?;
    let (digits, _) = rest.split_once('`')?;
    Some(digits)
}

/// What serde says was expected, in words; `out_of_range`: an integer was found, so an
/// integer type's range is what matters.
fn expected_in_words(expected: &str, out_of_range: bool) -> String {
    let range = |min: i128, max: u128| {
        if out_of_range {
            format!("a whole number from {min} to {max}")
        } else {
            "a whole number".to_owned()
        }
    };
    match expected {
        "i8" => range(i8::MIN.into(), 127),
        "i16" => range(i16::MIN.into(), 32_767),
        "i32" => range(i32::MIN.into(), 2_147_483_647),
        "i64" | "isize" => range(i64::MIN.into(), 9_223_372_036_854_775_807),
        "i128" => range(i128::MIN, i128::MAX.unsigned_abs()),
        "u8" => range(0, u8::MAX.into()),
        "u16" => range(0, u16::MAX.into()),
        "u32" => range(0, u32::MAX.into()),
        "u64" | "usize" => range(0, u64::MAX.into()),
        "u128" => range(0, u128::MAX),
        "f32" | "f64" => "a number".to_owned(),
        "a sequence" => "a list".to_owned(),
        "unit" => "null".to_owned(),
        "option" => "a value".to_owned(),
        "field identifier" => "a field name".to_owned(),
        // serde_json's for an enum: the enums of gpu-guard's inputs are all names.
        "variant identifier" | "string or map" => "a string".to_owned(),
        "IntOrString" => "a whole number or a string".to_owned(),
        "Quantity" => "a quantity (such as \"1\", \"500m\" or \"16Gi\")".to_owned(),
        "Time" | "MicroTime" => "a time (RFC 3339, such as \"2026-01-02T15:04:05Z\")".to_owned(),
        other => {
            if other.starts_with("struct ") || other.starts_with("tuple struct ") {
                "a map".to_owned()
            } else if other.starts_with("enum ") {
                "a string".to_owned()
            } else if is_type_name(other) {
                // k8s-openapi names its types as the API does (`JobSpec`, `ObjectMeta`).
                format!("a map ({other})")
            } else {
                other.to_owned()
            }
        }
    }
}

/// A single CamelCase word: a type name rather than a description.
fn is_type_name(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_uppercase())
        && text.chars().all(|c| c.is_ascii_alphanumeric())
}

/// What serde says was found, in words.
fn found_in_words(found: &str) -> String {
    let quoted = |prefix: &str| {
        found
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('`'))
            .and_then(|rest| rest.strip_suffix('`'))
            .map(str::to_owned)
    };
    if let Some(value) = quoted("floating point ").or_else(|| quoted("boolean ")) {
        return value;
    }
    if let Some(character) = quoted("character ") {
        return format!("the character {character:?}");
    }
    if let Some(string) = found.strip_prefix("string ") {
        return format!("the string {string}");
    }
    match found {
        "map" => "a map",
        "sequence" => "a list",
        "unit value" | "null" => "null",
        "byte array" => "bytes",
        "Option value" | "newtype struct" => "a value",
        "enum" | "unit variant" | "newtype variant" | "tuple variant" | "struct variant" => {
            "a tagged value"
        }
        other => other,
    }
    .to_owned()
}

/// When a YAML syntax error at 1-based `line` and `column` of `source` is a tab (at that
/// position, or in the indentation before it on that line), what to say instead of the
/// parser's "found character that cannot start any token": YAML indentation is spaces only.
pub fn tab_message(source: &str, line: usize, column: usize) -> Option<String> {
    let tab_column = tab_at(source, line, column)?;
    Some(format!(
        "a tab character at line {line}, column {tab_column}: YAML indentation must use spaces"
    ))
}

/// The 1-based column of the tab at `line` and `column` of `source`, or of the first tab in
/// the indentation of that line.
pub fn tab_at(source: &str, line: usize, column: usize) -> Option<usize> {
    let text = source.lines().nth(line.checked_sub(1)?)?;
    if text.chars().nth(column.checked_sub(1)?) == Some('\t') {
        return Some(column);
    }
    indentation_tab(text)
}

/// The first tab in the indentation of a line from `line` (1-based) on: where a YAML error
/// about a tab is, when the parser names the node the tab broke (a plain scalar names the
/// line it began on, the tab is on a line after it). Its line and column, 1-based.
pub fn tab_from(source: &str, line: usize) -> Option<(usize, usize)> {
    source
        .lines()
        .enumerate()
        .skip(line.checked_sub(1)?)
        .find_map(|(number, text)| indentation_tab(text).map(|column| (number + 1, column)))
}

/// The 1-based column of the first tab in a line's indentation (its leading blanks).
fn indentation_tab(line: &str) -> Option<usize> {
    line.chars()
        .take_while(|c| *c == ' ' || *c == '\t')
        .position(|c| c == '\t')
        .map(|at| at + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The words of serde's messages that are Rust, not the user's: type names and terms.
    const RUST_WORDS: &[&str] = &[
        "i8", "i16", "i32", "i64", "i128", "u8", "u16", "u32", "u64", "u128", "f32", "f64",
        "isize", "usize", "struct", "enum", "Some", "Option", "unit", "sequence", "variant",
    ];

    fn assert_no_rust_words(message: &str) {
        let words: Vec<&str> = message
            .split(|c: char| !c.is_ascii_alphanumeric())
            .collect();
        for word in RUST_WORDS {
            assert!(!words.contains(word), "{message:?} says {word:?}");
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Spec {
        active_deadline_seconds: Option<i64>,
        parallelism: Option<i32>,
        max_percent: Option<u32>,
        ratio: Option<f64>,
        name: Option<String>,
        items: Option<Vec<String>>,
        mode: Option<Mode>,
        inner: Option<Inner>,
        quantity: Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        meta: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    enum Mode {
        Enforce,
        Warn,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        flag: bool,
    }

    fn decode_error(value: serde_json::Value) -> String {
        from_json_value::<Spec>(&value).unwrap_err().to_string()
    }

    #[test]
    fn serde_type_errors_name_the_field_and_no_rust_type() {
        let cases = [
            (
                json!({"activeDeadlineSeconds": "abc"}),
                r#"activeDeadlineSeconds: expected a whole number, found the string "abc""#,
            ),
            (
                json!({"parallelism": 5_000_000_000_i64}),
                "parallelism: expected a whole number from -2147483648 to 2147483647, found \
                 5000000000",
            ),
            (
                json!({"maxPercent": -1}),
                "maxPercent: expected a whole number from 0 to 4294967295, found -1",
            ),
            (
                json!({"parallelism": 1.5}),
                "parallelism: expected a whole number, found 1.5",
            ),
            (
                json!({"ratio": "x"}),
                r#"ratio: expected a number, found the string "x""#,
            ),
            (json!({"name": 5}), "name: expected a string, found 5"),
            (json!({"items": {}}), "items: expected a list, found a map"),
            (
                json!({"items": "x"}),
                r#"items: expected a list, found the string "x""#,
            ),
            (json!({"inner": 5}), "inner: expected a map, found 5"),
            (json!({"inner": []}), "inner: expected a map, found a list"),
            (
                json!({"inner": {"flag": "yes"}}),
                r#"inner.flag: expected a boolean, found the string "yes""#,
            ),
            (
                json!({"mode": "Block"}),
                "mode: unknown value `Block`, expected `Enforce` or `Warn`",
            ),
            (json!({"mode": 5}), "mode: expected a string, found 5"),
            (
                json!({"quantity": {}}),
                r#"quantity: expected a quantity (such as "1", "500m" or "16Gi"), found a map"#,
            ),
            (
                json!({"meta": 5}),
                "meta: expected a map (ObjectMeta), found 5",
            ),
            (json!(5), "expected a map, found 5"),
        ];
        for (value, expected) in cases {
            let message = decode_error(value);
            assert_eq!(message, expected);
            assert_no_rust_words(&message);
        }
    }

    #[test]
    fn text_errors_keep_their_position_without_a_field() {
        let error = from_json_str::<Spec>("{\"name\": ").unwrap_err();
        assert!(error.is_syntax());
        assert_eq!(error.field(), None);
        assert_eq!(
            error.to_string(),
            "EOF while parsing a value at line 1 column 9"
        );
        let error = from_json_str::<Spec>(r#"{"inner": {"flag": 1}}"#).unwrap_err();
        assert!(!error.is_syntax());
        assert_eq!(error.to_string(), "inner.flag: expected a boolean, found 1");
        let error = from_json_slice::<Vec<u8>>(b"[1, 300]").unwrap_err();
        assert_eq!(
            error.to_string(),
            "[1]: expected a whole number from 0 to 255, found 300"
        );
    }

    #[test]
    fn yaml_messages_in_words() {
        // serde_norway's forms: a 128-bit integer, and the type of a struct.
        assert_eq!(
            in_words("invalid type: integer `99999999999999999999999` as u128, expected i32"),
            "expected a whole number from -2147483648 to 2147483647, found \
             99999999999999999999999"
        );
        assert_eq!(
            in_words("invalid type: integer `5`, expected struct Guard at line 1 column 8"),
            "expected a map, found 5 at line 1 column 8"
        );
        assert_eq!(in_words("missing field `name`"), "missing field `name`");
    }

    #[test]
    fn a_tab_is_named_with_its_position() {
        let source = "guard:\n\tmode: Warn\n";
        assert_eq!(
            tab_message(source, 2, 1).as_deref(),
            Some("a tab character at line 2, column 1: YAML indentation must use spaces")
        );
        assert_eq!(
            tab_message("a:\n  \t b: 1\n", 2, 4).as_deref(),
            Some("a tab character at line 2, column 3: YAML indentation must use spaces")
        );
        assert_eq!(tab_message("a: [\n", 2, 1), None);
        assert_eq!(tab_message("a: b: c\n", 1, 5), None);
        assert_eq!(tab_message("", 0, 0), None);
    }

    #[test]
    fn a_tab_is_found_on_the_line_after_the_node_it_broke() {
        let source = "metadata:\n  name: train\n  labels: {a: b}\n\tnamespace: ml\n";
        assert_eq!(tab_from(source, 2), Some((4, 1)));
        assert_eq!(tab_from("a: 1\n  \t  b: 2\n", 1), Some((2, 3)));
        assert_eq!(
            tab_from("a: 1\nb: \tx\n", 1),
            None,
            "not in the indentation"
        );
        assert_eq!(tab_from("\ta: 1\n", 2), None, "only from the line given");
    }
}
