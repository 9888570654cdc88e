//! Decoding errors in the words of the person who wrote the input.
//!
//! serde's messages name Rust types: `invalid type: string "abc", expected i64`, `expected
//! struct RawJob`. After a decode failed, and only then, the input is decoded once more with an
//! error type of gpu-guard's own ([`Problem`], `node.rs`) that keeps what serde reports as
//! parts: the value found, typed, and the term the type expected. [`JsonError`] says it in
//! words (`expected a whole number, found the string "abc"`) with the field it is about
//! (`spec.activeDeadlineSeconds`, from `serde_path_to_error`); no message text of serde's is
//! taken apart. The happy path pays nothing.
//! [`tab_message`] names a tab that YAML refuses, where the parser says "found character that
//! cannot start any token".
//!
//! An error can also say the line of its field in the file it came from: a caller that reads
//! manifests (`gpu_guard_manifest::Document::field_lines`) says which text is being decoded for
//! as long as a [`FieldLinesScope`] lives, and an error made meanwhile looks its field up there
//! when it is shown. Nothing is looked up before an error, and nothing where no scope is set
//! (the webhook, whose request bodies are JSON no one wrote by hand).

mod node;
mod problem;

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, de::Error as _};

use node::{Node, NodeDeserializer, Source};
pub use problem::{Found, Problem};

/// A JSON decoding error: serde_json's own (for its category and position) and, for an error
/// in the data rather than the syntax, the field it is about and the [`Problem`] in parts. Its
/// `Display` is for people: `spec.activeDeadlineSeconds: expected a whole number, found the
/// string "abc"`.
#[derive(Debug)]
pub struct JsonError {
    source: serde_json::Error,
    field: Option<String>,
    /// The problem in parts, when the second decode found it at the same field.
    problem: Option<Box<Problem>>,
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
        let problem = Problem::Other(message.to_string());
        Self {
            source: serde_json::Error::custom(&problem),
            field: None,
            problem: Some(Box::new(problem)),
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

    /// The problem in parts, when it is known.
    pub fn problem(&self) -> Option<&Problem> {
        self.problem.as_deref()
    }

    /// The message without the field. A field says where; a position in a text the user may
    /// never have seen (the CLI decodes values it re-serialised) would not, so the position is
    /// said only for an error without a field.
    pub fn message(&self) -> String {
        let position = match self.field {
            None => position_of(&self.source),
            Some(_) => String::new(),
        };
        match &self.problem {
            Some(problem) => format!("{problem}{position}"),
            None => format!("{}{position}", without_position(&self.source)),
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
        described::<T>(
            source,
            serde_path_to_error::deserialize::<_, T>(&mut tracked),
            || serde_json::from_str(json).ok(),
        )
    })
}

/// Decodes `T` from JSON bytes; an error names its field.
pub fn from_json_slice<'de, T: Deserialize<'de>>(json: &'de [u8]) -> Result<T, JsonError> {
    serde_json::from_slice(json).map_err(|source| {
        let mut tracked = serde_json::Deserializer::from_slice(json);
        described::<T>(
            source,
            serde_path_to_error::deserialize::<_, T>(&mut tracked),
            || serde_json::from_slice(json).ok(),
        )
    })
}

/// Decodes `T` from a JSON value; an error names its field.
pub fn from_json_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, JsonError> {
    T::deserialize(value).map_err(|source| {
        described::<T>(
            source,
            serde_path_to_error::deserialize::<_, T>(value),
            || Node::deserialize(value).ok(),
        )
    })
}

/// The first error, with the field the tracked second decode found (none when that one
/// succeeded or failed at the root, or when the text is not JSON at all), and the problem in
/// parts from a third decode of the same input read as a [`Node`], kept only when it failed
/// at the same field.
fn described<'de, T: Deserialize<'de>>(
    source: serde_json::Error,
    tracked: Result<T, serde_path_to_error::Error<serde_json::Error>>,
    node: impl FnOnce() -> Option<Node>,
) -> JsonError {
    if source.is_syntax() || source.is_eof() {
        return JsonError {
            source,
            field: None,
            problem: None,
            lines: None,
        };
    }
    let path = match tracked {
        Err(error) => Some(error.path().to_string()),
        Ok(_) => None,
    };
    let problem = path.as_deref().and_then(|path| {
        let (at, problem) = problem_in::<T>(&node()?, Source::Json)?;
        (at == path).then(|| Box::new(problem))
    });
    let field = path.filter(|path| path != ".");
    // Only for an error of the data, found in a field: the text's lines have nothing to say
    // about a text that is not JSON.
    let lines = field.is_some().then(scoped_lines).flatten();
    JsonError {
        source,
        field,
        problem,
        lines,
    }
}

/// Where decoding `T` from `node` fails (`.` at the root) and the problem, in parts.
fn problem_in<'de, T: Deserialize<'de>>(node: &Node, source: Source) -> Option<(String, Problem)> {
    match serde_path_to_error::deserialize::<_, T>(NodeDeserializer::new(node, source)) {
        Ok(_) => None,
        Err(error) => Some((error.path().to_string(), error.into_inner())),
    }
}

/// Where decoding `T` from the first YAML document of `yaml` fails (its field, `.` at the
/// root) and the problem, in parts; `None` when the text is not YAML or `T` decodes from it.
/// For the error of a decode made straight from the YAML: use the problem when the fields
/// agree.
pub fn yaml_problem<T: DeserializeOwned>(yaml: &str) -> Option<(String, Problem)> {
    let document = serde_norway::Deserializer::from_str(yaml).next()?;
    problem_in::<T>(&Node::deserialize(document).ok()?, Source::Yaml)
}

/// serde_json's message without the ` at line L column C` it appends when it knows them.
pub fn without_position(error: &serde_json::Error) -> String {
    let message = error.to_string();
    let position = position_of(error);
    match message.strip_suffix(&position) {
        Some(bare) if !position.is_empty() => bare.to_owned(),
        _ => message,
    }
}

/// The position serde_json appends to its messages (` at line L column C`), or nothing.
fn position_of(error: &serde_json::Error) -> String {
    if error.line() == 0 {
        String::new()
    } else {
        format!(" at line {} column {}", error.line(), error.column())
    }
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
    fn yaml_problems_in_words() {
        let problem = |yaml: &str| {
            yaml_problem::<Spec>(yaml).map(|(field, problem)| format!("{field}: {problem}"))
        };
        // Beyond 64 bits: serde's visitor says "integer"; the number is put back.
        assert_eq!(
            problem("parallelism: 99999999999999999999999\n").as_deref(),
            Some(
                "parallelism: expected a whole number from -2147483648 to 2147483647, found \
                 99999999999999999999999"
            )
        );
        assert_eq!(
            problem("inner: 5\n").as_deref(),
            Some("inner: expected a map, found 5")
        );
        // A YAML scalar names an enum variant whatever it looks like.
        assert_eq!(
            problem("mode: 5\n").as_deref(),
            Some("mode: unknown value `5`, expected `Enforce` or `Warn`")
        );
        assert_eq!(
            problem("inner: {}\n").as_deref(),
            Some("inner: missing field `flag`")
        );
        assert_eq!(problem("name: x\n"), None, "it decodes");
        assert_eq!(problem("a: [\n"), None, "not YAML");
    }

    #[test]
    fn the_fields_wording_is_its_own() {
        let unknown = Problem::UnknownField {
            field: "enabeld".to_owned(),
            expected: &["enabled", "codes", "action"],
        };
        assert_eq!(
            unknown.to_string(),
            "unknown field `enabeld`, expected one of `enabled`, `codes`, `action`"
        );
        let nothing = Problem::UnknownVariant {
            variant: "x".to_owned(),
            expected: &[],
        };
        assert_eq!(
            nothing.to_string(),
            "unknown value `x`, there are no variants"
        );
        assert_eq!(
            from_json_str::<Inner>(r#"{"flag": true, "flag": false}"#)
                .unwrap_err()
                .to_string(),
            "duplicate field `flag` at line 1 column 21",
            "an error at the root says where in the text"
        );
        assert_eq!(
            from_json_value::<Inner>(&json!([]))
                .unwrap_err()
                .to_string(),
            "expected a map, found a list"
        );
    }

    #[test]
    fn a_problem_the_second_decode_cannot_see_keeps_serdes_words() {
        // A borrowed RawValue cannot be decoded from a Node: that decode fails at `object`,
        // not where the first one did, so the first one's message is kept, without position.
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Envelope<'a> {
            #[serde(borrow)]
            object: &'a serde_json::value::RawValue,
            uid: String,
        }
        let error = from_json_str::<Envelope>(r#"{"object": {}, "uid": 5}"#).unwrap_err();
        assert_eq!(error.field(), Some("uid"));
        assert_eq!(error.problem(), None);
        assert_eq!(
            error.to_string(),
            "uid: invalid type: integer `5`, expected a string"
        );
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
