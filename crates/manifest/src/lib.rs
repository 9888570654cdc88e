//! Reading and writing Kubernetes manifests: files, directories and stdin; YAML streams with
//! several documents, JSON objects and `List` objects. Documents are kept as raw JSON values in
//! input order, so nothing the engine does not own is lost or reordered.

use std::collections::VecDeque;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

mod json;
#[cfg(test)]
mod libyaml_cases;
mod lines;
mod read;
mod split;
mod unknown_fields;
mod write;

pub use unknown_fields::{UnknownField, unknown_fields};

use split::Syntax;

/// One document of one input.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// The file it came from (`-` for stdin).
    pub source: String,
    /// Its 0-based position among the documents of that file (empty documents not counted).
    pub index: usize,
    pub value: Value,
    /// Its text, for the line of a field that does not decode.
    origin: Option<Arc<Origin>>,
}

impl Document {
    /// Until the scope returned is dropped, decode errors made on this thread name the line
    /// of their field in this document's text ([`gpu_guard_core::decode::FieldLinesScope`]), for the
    /// object `item` of it (`None`: the document itself; `Some(n)`: the n-th item of its
    /// `List`, numbered as [`visit_objects_mut`] numbers them).
    pub fn field_lines(
        &self,
        item: Option<usize>,
    ) -> Option<gpu_guard_core::decode::FieldLinesScope> {
        let origin: Arc<dyn gpu_guard_core::decode::FieldLines> = self.origin.clone()?;
        Some(gpu_guard_core::decode::field_lines_scope(origin, item))
    }
}

/// Where a document was written: the text it was read from, kept for the lookup of a line
/// after an error (one document is held at a time, so this holds its text a little longer).
#[derive(Debug, PartialEq)]
struct Origin {
    text: Arc<String>,
    /// The line of the input the text starts at.
    first_line: usize,
    /// Which of the text's non-empty documents it is (a text holds several when `...` ends
    /// one and another follows).
    document: usize,
    /// For a `List`: the path of each of its objects (`items[0]`, `items[1].items[0]`), in
    /// the order [`visit_objects_mut`] numbers them.
    item_paths: Vec<String>,
}

impl gpu_guard_core::decode::FieldLines for Origin {
    fn line_of(&self, item: Option<usize>, field: &str) -> Option<usize> {
        let path = match item {
            None => field.to_owned(),
            Some(item) => {
                let prefix = self.item_paths.get(item)?;
                if field.starts_with('[') {
                    format!("{prefix}{field}")
                } else {
                    format!("{prefix}.{field}")
                }
            }
        };
        let line = lines::line_of(&self.text, self.document, &path)?;
        Some(self.first_line + line - 1)
    }
}

/// The paths of the objects of a `List` (nested lists flattened), in [`visit_objects_mut`]'s
/// order; empty for any other document.
fn item_paths(document: &Value) -> Vec<String> {
    fn walk(list: &Value, at: &str, paths: &mut Vec<String>) {
        let Some(items) = list.get("items").and_then(Value::as_array) else {
            return;
        };
        for (index, item) in items.iter().enumerate() {
            let path = format!("{at}items[{index}]");
            // An item without a kind takes its list's without `List`, as visit_items gives it.
            let implied = list
                .get("kind")
                .and_then(Value::as_str)
                .and_then(|kind| kind.strip_suffix("List"));
            let nested = item.get("items").is_some_and(Value::is_array)
                && item
                    .get("kind")
                    .and_then(Value::as_str)
                    .or(implied)
                    .is_some_and(|kind| kind.ends_with("List"));
            if nested {
                walk(item, &format!("{path}."), paths);
            } else {
                paths.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    if is_list(document) {
        walk(document, "", &mut paths);
    }
    paths
}

/// Why an input, or one document of it, could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{source_name}: cannot read: {error}")]
    Read {
        source_name: String,
        #[source]
        error: io::Error,
    },
    #[error("{source_name}: document {index}{}: {message}", line.map(|l| format!(", line {l}")).unwrap_or_default())]
    Parse {
        source_name: String,
        index: usize,
        line: Option<usize>,
        message: String,
    },
}

/// The bounds every manifest is read within, so that no input can exhaust memory or the
/// stack: see [docs/cli.md](../../docs/cli.md#limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest document, in bytes; a larger one is reported, not read.
    pub max_document_bytes: usize,
    /// The deepest nesting of mappings and lists (JSON objects and arrays).
    pub max_depth: usize,
}

/// 16 MiB: five times the API server's 3 MiB request limit, room for a `List` of many objects.
pub const DEFAULT_MAX_DOCUMENT_BYTES: usize = 16 << 20;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_document_bytes: DEFAULT_MAX_DOCUMENT_BYTES,
            max_depth: 1000,
        }
    }
}

/// A document that could not be read: the error, and its text unless it was too large to keep
/// (commands that promise to pass unreadable documents through write that text).
#[derive(Debug)]
pub struct Unreadable {
    pub error: InputError,
    pub text: Option<Vec<u8>>,
}

/// The files an input names: the file itself, or the `.yaml`, `.yml` and `.json` files below a
/// directory, sorted by path.
pub fn expand(path: &Path) -> io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files = Vec::new();
    let mut pending = vec![path.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?.path();
            if entry.is_dir() {
                pending.push(entry);
            } else if entry
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
            {
                files.push(entry);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The documents of one input, read and parsed one at a time: memory holds one document, not
/// the input. A document that cannot be read is an [`Unreadable`] item; the next one is read
/// as if it were not there (documents are split before they are parsed, see [`split`]).
pub struct Documents {
    source: String,
    splitter: split::Splitter<Box<dyn BufRead>>,
    limits: Limits,
    next_index: usize,
    /// Values read and not yet given out, with where they were written.
    queue: VecDeque<(Value, Option<Arc<Origin>>)>,
    /// Set after a read error: the input ends there.
    failed: bool,
    /// When not empty, documents whose text names none of these are skipped unparsed.
    needles: Vec<Vec<u8>>,
}

impl Documents {
    /// The documents of `reader`, named `source` in messages.
    pub fn new(source: impl Into<String>, reader: Box<dyn BufRead>, limits: Limits) -> Self {
        Self {
            source: source.into(),
            splitter: split::Splitter::new(reader, limits.max_document_bytes),
            limits,
            next_index: 0,
            queue: VecDeque::new(),
            failed: false,
            needles: Vec::new(),
        }
    }

    /// Only the documents whose text contains one of `words` (a `kind`, say), the others
    /// skipped before they are parsed; unreadable documents are skipped too. For a first pass
    /// that looks for a few kinds in a large input: positions ([`Document::index`]) are not
    /// counted right after a skip.
    pub fn only_naming(mut self, words: &[&str]) -> Self {
        self.needles = words.iter().map(|word| word.as_bytes().to_vec()).collect();
        self
    }

    /// The documents of a file, or of stdin for `-`.
    pub fn open(path: &Path, limits: Limits) -> Result<Self, InputError> {
        let source = path.display().to_string();
        if source == "-" {
            return Ok(Self::new(
                source,
                Box::new(io::BufReader::with_capacity(1 << 16, io::stdin())),
                limits,
            ));
        }
        Self::open_as(path, source, limits)
    }

    /// The documents of the file at `path`, named `source` (a spooled copy of stdin is `-`).
    pub fn open_as(path: &Path, source: String, limits: Limits) -> Result<Self, InputError> {
        match std::fs::File::open(path) {
            Ok(file) => Ok(Self::new(
                source,
                Box::new(io::BufReader::with_capacity(1 << 16, file)),
                limits,
            )),
            Err(error) => Err(InputError::Read {
                source_name: source,
                error,
            }),
        }
    }

    /// The input's name in messages.
    pub fn source(&self) -> &str {
        &self.source
    }

    fn document(&mut self, value: Value, origin: Option<Arc<Origin>>) -> Document {
        let index = self.next_index;
        self.next_index += 1;
        Document {
            source: self.source.clone(),
            index,
            value,
            origin,
        }
    }

    fn unreadable(
        &mut self,
        line: Option<usize>,
        message: String,
        text: Option<Vec<u8>>,
    ) -> Unreadable {
        let index = self.next_index;
        self.next_index += 1;
        Unreadable {
            error: InputError::Parse {
                source_name: self.source.clone(),
                index,
                line,
                message,
            },
            text,
        }
    }

    /// Parses one raw document's text: its values, or the line (of the input) and the
    /// message.
    fn parse(&self, raw: &split::RawDocument, text: &str) -> Result<Vec<Value>, (usize, String)> {
        match raw.syntax {
            Syntax::Json => {
                if raw.depth > self.limits.max_depth {
                    return Err((raw.line, nested_too_deep(self.limits.max_depth)));
                }
                let value = json::read_json(text).map_err(|error| from_text(raw, text, error))?;
                Ok(vec![value])
            }
            Syntax::Yaml => {
                let bounds = read::Bounds {
                    max_depth: self.limits.max_depth,
                    max_alias_bytes: self.limits.max_document_bytes,
                };
                read::read_yaml(text, bounds).map_err(|error| from_text(raw, text, error))
            }
        }
    }

    /// Reads one raw document: its values queued, or why it is unreadable.
    fn read(&mut self, mut raw: split::RawDocument) -> Result<(), Unreadable> {
        if let Some(size) = raw.too_large {
            let message = format!(
                "the document is {size} bytes, more than the limit of {} bytes (raise it with \
                 --max-document-bytes)",
                self.limits.max_document_bytes
            );
            return Err(self.unreadable(Some(raw.line), message, None));
        }
        let text = match String::from_utf8(std::mem::take(&mut raw.text)) {
            Ok(text) => text,
            Err(error) => {
                let valid = &error.as_bytes()[..error.utf8_error().valid_up_to()];
                let line = raw.line + memchr::memchr_iter(b'\n', valid).count();
                let message = "the text is not UTF-8 (manifests are UTF-8)".to_owned();
                return Err(self.unreadable(Some(line), message, Some(error.into_bytes())));
            }
        };
        match self.parse(&raw, &text) {
            Ok(values) => {
                let text = Arc::new(text);
                // Empty documents (`---` with nothing after, comments only) are dropped, as
                // kubectl drops them.
                for (document, value) in values.into_iter().filter(|v| !v.is_null()).enumerate() {
                    let origin = Origin {
                        text: text.clone(),
                        first_line: raw.line,
                        document,
                        item_paths: item_paths(&value),
                    };
                    self.queue.push_back((value, Some(Arc::new(origin))));
                }
                Ok(())
            }
            Err((line, message)) => {
                Err(self.unreadable(Some(line), message, Some(text.into_bytes())))
            }
        }
    }
}

/// A reading error of a document's text, its lines made those of the input: the error's line
/// (one at the end of the text is on its last line, not the next) and, for a key written
/// twice, the line of its first definition.
fn from_text(raw: &split::RawDocument, text: &str, error: read::ReadError) -> (usize, String) {
    let last = raw.line + text.trim_end().lines().count().saturating_sub(1);
    let line = raw.line + error.line.saturating_sub(1);
    let message = match error.defined_at {
        Some(first) => format!("{} at line {}", error.message, raw.line + first - 1),
        None => error.message,
    };
    (line.min(last), message)
}

fn nested_too_deep(limit: usize) -> String {
    format!("nested deeper than {limit} levels of mappings and lists (the reader's limit)")
}

impl Iterator for Documents {
    type Item = Result<Document, Unreadable>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((value, origin)) = self.queue.pop_front() {
                return Some(Ok(self.document(value, origin)));
            }
            if self.failed {
                return None;
            }
            let raw = match self.splitter.next_document() {
                Ok(Some(raw)) => raw,
                Ok(None) => return None,
                Err(error) => {
                    self.failed = true;
                    return Some(Err(Unreadable {
                        error: InputError::Read {
                            source_name: self.source.clone(),
                            error,
                        },
                        text: None,
                    }));
                }
            };
            if !self.needles.is_empty()
                && (raw.too_large.is_some()
                    || !self
                        .needles
                        .iter()
                        .any(|needle| memchr::memmem::find(&raw.text, needle).is_some()))
            {
                continue;
            }
            if let Err(unreadable) = self.read(raw) {
                return Some(Err(unreadable));
            }
        }
    }
}

/// Reads one input (`-` is stdin) whole: its documents and the errors of those that could not
/// be read (see [`Documents`] to read one document at a time).
pub fn read(input: &Path) -> (Vec<Document>, Vec<InputError>) {
    match Documents::open(input, Limits::default()) {
        Ok(documents) => collect(documents),
        Err(error) => (Vec::new(), vec![error]),
    }
}

/// Splits text into documents (see [`read`]): a stream of JSON values when it starts with `{`,
/// else a YAML stream; empty documents are dropped, as kubectl drops them.
pub fn parse(text: &str, source_name: &str) -> (Vec<Document>, Vec<InputError>) {
    let reader: Box<dyn BufRead> = Box::new(io::Cursor::new(text.as_bytes().to_vec()));
    collect(Documents::new(source_name, reader, Limits::default()))
}

fn collect(documents: Documents) -> (Vec<Document>, Vec<InputError>) {
    let mut read = Vec::new();
    let mut errors = Vec::new();
    for document in documents {
        match document {
            Ok(document) => read.push(document),
            Err(unreadable) => errors.push(unreadable.error),
        }
    }
    (read, errors)
}

/// One object of the inputs: its document, its position among the (leaf) items of a `List`
/// (`None` for a plain document), and the object, with what it takes from its list.
#[derive(Clone, Debug)]
pub struct Object<'a> {
    pub document: &'a Document,
    pub item: Option<usize>,
    pub value: Value,
}

impl Object<'_> {
    /// `file (document N)` or `file (document N, item M)`.
    pub fn location(&self) -> String {
        location(self.document, self.item)
    }

    /// A warning for each field of the object the API does not know ([`unknown_fields`]),
    /// naming the object as `check` names it (`file (document N) Job train: unknown field
    /// "spec.podFailurePolicyy", ...`).
    pub fn unknown_fields(&self) -> Vec<String> {
        let unknown = unknown_fields(&self.value);
        if unknown.is_empty() {
            return Vec::new();
        }
        let kind = self
            .value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("object");
        let name = self
            .value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("<unnamed>");
        let location = self.location();
        unknown
            .iter()
            .map(|field| format!("{location} {kind} {name}: {field}"))
            .collect()
    }
}

/// `file (document N)` or `file (document N, item M)`: how `mutate` and `check` name where an
/// object is.
pub fn location(document: &Document, item: Option<usize>) -> String {
    match item {
        Some(item) => format!(
            "{} (document {}, item {item})",
            document.source, document.index
        ),
        None => format!("{} (document {})", document.source, document.index),
    }
}

/// Every object of the documents, `List` items flattened (copies; see [`visit_objects_mut`]).
pub fn objects(documents: &[Document]) -> Vec<Object<'_>> {
    let mut objects = Vec::new();
    for document in documents {
        let mut value = document.value.clone();
        visit_objects_mut(&mut value, &mut |item, object| {
            objects.push(Object {
                document,
                item,
                value: object.clone(),
            });
        });
    }
    objects
}

/// Calls `visit` on every object of a document, in place: the document itself, or each item of
/// a `List` (`JobList`, `List`, ...; nested lists flattened, items numbered in order). An item
/// without `kind` or `apiVersion` takes them from its list for the visit (the kind without its
/// `List` suffix, the list's own apiVersion), as `kubectl get -o yaml` writes them; the keys it
/// took are removed afterwards, so a list written back keeps its items as they were.
pub fn visit_objects_mut(document: &mut Value, visit: &mut dyn FnMut(Option<usize>, &mut Value)) {
    if is_list(document) {
        let mut next = 0;
        visit_items(document, &mut next, visit);
    } else {
        visit(None, document);
    }
}

fn is_list(value: &Value) -> bool {
    value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|kind| kind.ends_with("List"))
        && value.get("items").is_some_and(Value::is_array)
}

fn visit_items(
    list: &mut Value,
    next: &mut usize,
    visit: &mut dyn FnMut(Option<usize>, &mut Value),
) {
    let item_kind = list
        .get("kind")
        .and_then(Value::as_str)
        .and_then(|kind| kind.strip_suffix("List"))
        .filter(|kind| !kind.is_empty())
        .map(|kind| Value::from(kind.to_owned()));
    let api_version = list.get("apiVersion").filter(|v| !v.is_null()).cloned();
    let Some(items) = list.get_mut("items").and_then(Value::as_array_mut) else {
        return;
    };
    for item in items {
        let mut added = Vec::new();
        if let Some(fields) = item.as_object_mut() {
            for (key, implied) in [("kind", &item_kind), ("apiVersion", &api_version)] {
                if let Some(implied) = implied
                    && !fields.contains_key(key)
                {
                    fields.insert(key.to_owned(), implied.clone());
                    added.push(key);
                }
            }
        }
        if is_list(item) {
            visit_items(item, next, visit);
        } else {
            visit(Some(*next), item);
            *next += 1;
        }
        if let Some(fields) = item.as_object_mut() {
            // Inserted last and shift-removed: the item keeps its key order.
            for key in added.iter().rev() {
                fields.shift_remove(*key);
            }
        }
    }
}

/// The output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

/// Renders documents: YAML documents separated by `---`, or JSON (one object, or a `v1` `List`
/// holding several, as kubectl prints them).
pub fn render(values: &[Value], format: Format) -> String {
    let mut writer = DocumentWriter::new(Vec::new(), format);
    for value in values {
        writer.write(value).expect("writing to memory cannot fail");
    }
    let bytes = writer.finish().expect("writing to memory cannot fail");
    String::from_utf8(bytes).expect("YAML and JSON output is UTF-8")
}

/// Writes documents one at a time (what [`render`] writes all at once): memory holds one
/// document, not the output.
pub struct DocumentWriter<W: Write> {
    out: W,
    format: Format,
    written: usize,
    /// JSON: the first object, held until a second one makes the output a `List`.
    held: Option<Value>,
}

impl<W: Write> DocumentWriter<W> {
    pub fn new(out: W, format: Format) -> Self {
        Self {
            out,
            format,
            written: 0,
            held: None,
        }
    }

    /// Writes one document.
    pub fn write(&mut self, value: &Value) -> io::Result<()> {
        match self.format {
            Format::Yaml => {
                if self.written > 0 {
                    self.out.write_all(b"---\n")?;
                }
                self.out.write_all(to_yaml(value).as_bytes())?;
            }
            Format::Json => match self.written {
                0 => self.held = Some(value.clone()),
                1 => {
                    self.out.write_all(LIST_START.as_bytes())?;
                    let first = self.held.take().expect("the first object is held");
                    self.write_item(&first)?;
                    self.out.write_all(b",\n")?;
                    self.write_item(value)?;
                }
                _ => {
                    self.out.write_all(b",\n")?;
                    self.write_item(value)?;
                }
            },
        }
        self.written += 1;
        Ok(())
    }

    /// Writes a document's text as it came (YAML output only: an unreadable document cannot
    /// be part of JSON output); returns whether it was written.
    pub fn write_raw(&mut self, text: &[u8]) -> io::Result<bool> {
        if self.format == Format::Json {
            return Ok(false);
        }
        if self.written > 0 && !text.starts_with(b"---") {
            self.out.write_all(b"---\n")?;
        }
        self.out.write_all(text)?;
        if !text.ends_with(b"\n") {
            self.out.write_all(b"\n")?;
        }
        self.written += 1;
        Ok(true)
    }

    /// Ends the output (JSON: closes the `List`, or writes the one object, or an empty
    /// `List`, so JSON output is always one JSON document) and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        if self.format == Format::Json {
            match self.written {
                0 => self.out.write_all(
                    b"{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"List\",\n  \"items\": []\n}\n",
                )?,
                1 => {
                    let value = self.held.take().expect("the one object is held");
                    let mut text =
                        serde_json::to_string_pretty(&value).expect("JSON values serialize");
                    text.push('\n');
                    self.out.write_all(text.as_bytes())?;
                }
                _ => self.out.write_all(b"\n  ]\n}\n")?,
            }
        }
        self.out.flush()?;
        Ok(self.out)
    }

    fn write_item(&mut self, value: &Value) -> io::Result<()> {
        self.out.write_all(indented_json(value, 4).as_bytes())
    }
}

/// A value as pretty JSON with every line indented by `indent` spaces (no line break at the
/// end): an item of a pretty-printed array, written on its own.
pub fn indented_json(value: &impl serde::Serialize, indent: usize) -> String {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    let margin = " ".repeat(indent);
    // JSON strings hold no raw line breaks, so indenting every line is exact.
    let mut indented = String::with_capacity(text.len() + text.len() / 8);
    for (number, line) in text.lines().enumerate() {
        if number > 0 {
            indented.push('\n');
        }
        indented.push_str(&margin);
        indented.push_str(line);
    }
    indented
}

const LIST_START: &str = "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"List\",\n  \"items\": [\n";

/// One value as a YAML document.
pub fn to_yaml(value: &Value) -> String {
    write::to_string(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn list_items_take_their_lists_kind_and_api_version_only_while_visited() {
        // A PodList's items are core/v1 Pods: the list's own apiVersion, never batch/v1.
        let mut pods = json!({"apiVersion": "v1", "kind": "PodList", "items": [
            {"metadata": {"name": "a"}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b"}},
        ]});
        let before = pods.clone();
        let mut seen = Vec::new();
        visit_objects_mut(&mut pods, &mut |item, object| {
            seen.push((item, object["apiVersion"].clone(), object["kind"].clone()));
        });
        assert_eq!(
            seen,
            vec![
                (Some(0), json!("v1"), json!("Pod")),
                (Some(1), json!("v1"), json!("Pod")),
            ]
        );
        assert_eq!(pods, before, "the implied keys are removed again");
        let keys: Vec<&String> = pods["items"][0].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["metadata"]);
    }

    #[test]
    fn objects_number_the_items_of_nested_lists_and_name_where_they_are() {
        let (documents, _) = parse(
            "kind: Job\nmetadata: {name: plain}\n---\napiVersion: v1\nkind: List\nitems:\n\
             - {apiVersion: batch/v1, kind: Job, metadata: {name: a}}\n\
             - {apiVersion: batch/v1, kind: JobList, items: [{metadata: {name: b}}]}\n",
            "in.yaml",
        );
        let objects = objects(&documents);
        let located: Vec<(String, &Value)> = objects
            .iter()
            .map(|o| (o.location(), &o.value["kind"]))
            .collect();
        assert_eq!(
            located,
            vec![
                ("in.yaml (document 0)".to_owned(), &json!("Job")),
                ("in.yaml (document 1, item 0)".to_owned(), &json!("Job")),
                ("in.yaml (document 1, item 1)".to_owned(), &json!("Job")),
            ]
        );
        assert_eq!(objects[2].value["apiVersion"], "batch/v1");
    }

    #[test]
    fn yaml_streams_keep_order_and_drop_empty_documents() {
        let (documents, errors) = parse("---\na: 1\n---\n---\nb: 2\n", "x.yaml");
        assert!(errors.is_empty());
        let values: Vec<&Value> = documents.iter().map(|d| &d.value).collect();
        assert_eq!(
            values,
            vec![&serde_json::json!({"a": 1}), &serde_json::json!({"b": 2})]
        );
        assert_eq!(documents[1].index, 1);
    }

    #[test]
    fn a_broken_document_is_reported_with_its_index_and_line() {
        let (documents, errors) = parse("a: 1\n---\nb: [1,\n", "x.yaml");
        assert_eq!(documents.len(), 1);
        let text = errors[0].to_string();
        assert!(text.starts_with("x.yaml: document 1, line "), "{text}");
    }

    #[test]
    fn a_tab_in_the_indentation_is_reported_on_its_own_line_of_the_file() {
        let job = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: train\nspec:\n  \
                   template:\n    spec:\n      containers:\n      - name: main\n        \
                   image: train:1\n";
        let config_map = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: scripts\ndata:\n  \
                          run.sh: |\n    echo hello\n";
        // (text, document, line of the tab, column)
        let cases = [
            (format!("\t{job}"), 0, 1, 1),
            (format!("\n\n  \t{job}"), 0, 3, 3),
            // After a plain scalar, which yaml-rust2 reports where the scalar began.
            (
                job.replace("  name: train\n", "  name: train\n\tnamespace: ml\n"),
                0,
                5,
                1,
            ),
            (format!("{job}\tbackoffLimit: 1"), 0, 11, 1),
            (format!("{job}        \tenv: []\n"), 0, 11, 9),
            (format!("{config_map}\tother: x\n"), 0, 8, 1),
            (
                format!("{job}---\n{}", job.replace("  template:", "\ttemplate:")),
                1,
                17,
                1,
            ),
            (
                format!(
                    "{config_map}---\n{job}---\n{}",
                    job.replace("      - name", "\t    - name")
                ),
                2,
                28,
                1,
            ),
        ];
        for (text, document, line, column) in cases {
            let (documents, errors) = parse(&text, "x.yaml");
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            assert_eq!(
                errors,
                [format!(
                    "x.yaml: document {document}, line {line}: a tab character at column \
                     {column}: YAML indentation must use spaces"
                )],
                "{text:?}"
            );
            assert_eq!(
                documents.len(),
                document,
                "the documents before it are read"
            );
        }
        // Tabs that are content or allowed space are not errors.
        let (documents, errors) = parse(
            "data:\n  Makefile: |\n    all:\n    \tgcc -o x x.c\n  list: [a,\n   \tb]\n",
            "x.yaml",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            documents[0].value["data"],
            json!({"Makefile": "all:\n\tgcc -o x x.c\n", "list": ["a", "b"]})
        );
    }

    #[test]
    fn blanks_before_the_first_line_are_part_of_the_yaml() {
        let (documents, errors) = parse("\n  a: 1\n  b: 2\n", "x.yaml");
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(documents[0].value, json!({"a": 1, "b": 2}));
    }

    #[test]
    fn decode_errors_name_the_line_of_their_field_in_the_file() {
        use k8s_openapi::api::batch::v1::Job;
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n---\n\
                    apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: train\nspec:\n  \
                    backoffLimit: 2\n  activeDeadlineSeconds: abc\n---\napiVersion: v1\n\
                    kind: List\nitems:\n- apiVersion: batch/v1\n  kind: Job\n  metadata: \
                    {name: a}\n- apiVersion: batch/v1\n  kind: Job\n  spec:\n    \
                    parallelism: two\n";
        let (documents, errors) = parse(text, "x.yaml");
        assert!(errors.is_empty(), "{errors:?}");
        let decode = |document: &Document, item: Option<usize>, value: &Value| {
            let _lines = document.field_lines(item);
            gpu_guard_core::decode::from_json_value::<Job>(value)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            decode(&documents[1], None, &documents[1].value),
            "spec.activeDeadlineSeconds (line 12): expected a whole number, found the string \
             \"abc\""
        );
        let list = &documents[2];
        assert_eq!(
            decode(list, Some(1), &list.value["items"][1]),
            "spec.parallelism (line 23): expected a whole number, found the string \"two\""
        );
        // Out of a scope (the webhook), and once it ended: the field alone.
        let error =
            gpu_guard_core::decode::from_json_value::<Job>(&documents[1].value).unwrap_err();
        assert_eq!(error.line(), None);
        assert!(
            error
                .to_string()
                .starts_with("spec.activeDeadlineSeconds: ")
        );
    }

    #[test]
    fn the_items_of_nested_lists_have_their_paths() {
        let list = json!({"kind": "List", "items": [
            {"kind": "Job"},
            {"kind": "JobList", "items": [{"metadata": {}}, {"kind": "Job"}]},
            {"kind": "ConfigMap"},
        ]});
        assert_eq!(
            item_paths(&list),
            [
                "items[0]",
                "items[1].items[0]",
                "items[1].items[1]",
                "items[2]"
            ]
        );
        let mut seen = 0;
        visit_objects_mut(&mut list.clone(), &mut |_, _| seen += 1);
        assert_eq!(seen, 4, "numbered as visit_objects_mut numbers them");
        assert!(item_paths(&json!({"kind": "Job", "items": []})).is_empty());
    }

    #[test]
    fn json_streams_are_read() {
        let (documents, errors) = parse("{\"a\": 1}\n{\"b\": 2}", "x.json");
        assert!(errors.is_empty());
        assert_eq!(documents.len(), 2);
        let (_, errors) = parse("{\"a\": ", "x.json");
        assert!(
            errors[0].to_string().contains("document 0, line 1"),
            "{errors:?}"
        );
    }

    #[test]
    fn a_broken_document_costs_only_itself() {
        let text = "a: 1\n---\nb: [1,\n  c: {\n---\nd: 4\n---\ne: &x 1\nf: *y\n---\ng: 7\n";
        let (documents, errors) = parse(text, "x.yaml");
        let values: Vec<&Value> = documents.iter().map(|d| &d.value).collect();
        assert_eq!(
            values,
            vec![&json!({"a": 1}), &json!({"d": 4}), &json!({"g": 7})]
        );
        let indices: Vec<usize> = documents.iter().map(|d| d.index).collect();
        assert_eq!(indices, vec![0, 2, 4]);
        let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with("x.yaml: document 1, line 4: "),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("x.yaml: document 3, line 9: ")
                && errors[1].contains("unknown anchor"),
            "{errors:?}"
        );
    }

    #[test]
    fn json_documents_are_independent_and_bounded_in_depth() {
        let deep = "[".repeat(1001) + &"]".repeat(1001);
        let text = format!(
            "{{\"a\": 1}}\n{{\"b\": 2,}}\n{deep}\n{{\"c\": {}}}\n",
            "[".repeat(500) + &"]".repeat(500)
        );
        let (documents, errors) = parse(&text, "x.json");
        assert_eq!(documents.len(), 2, "{errors:?}");
        assert_eq!(documents[1].index, 3);
        assert!(
            errors[0]
                .to_string()
                .starts_with("x.json: document 1, line 2:"),
            "{errors:?}"
        );
        assert!(
            errors[1].to_string().contains("nested deeper than 1000"),
            "{errors:?}"
        );
    }

    #[test]
    fn non_utf8_text_is_one_unreadable_document() {
        let reader: Box<dyn BufRead> =
            Box::new(io::Cursor::new(b"a: 1\n---\nb: \xff\n---\nc: 3\n".to_vec()));
        let items: Vec<_> = Documents::new("x.yaml", reader, Limits::default()).collect();
        assert_eq!(items.len(), 3);
        let Err(unreadable) = &items[1] else {
            panic!("{items:?}")
        };
        assert!(
            unreadable
                .error
                .to_string()
                .contains("line 3: the text is not UTF-8"),
            "{unreadable:?}"
        );
        assert_eq!(unreadable.text.as_deref(), Some(&b"---\nb: \xff\n"[..]));
    }

    #[test]
    fn the_streaming_writer_writes_a_yaml_stream_or_one_object_or_a_v1_list() {
        let values = [
            json!({"a": 1, "b": [1, {"c": "x\ny"}]}),
            json!({"d": 2}),
            json!({"e": 3}),
        ];
        let pretty = |value: &Value| serde_json::to_string_pretty(value).unwrap() + "\n";
        for count in 1..=values.len() {
            let written = &values[..count];
            let yaml: Vec<String> = written.iter().map(to_yaml).collect();
            assert_eq!(render(written, Format::Yaml), yaml.join("---\n"), "{count}");
            // One object alone; several in a `v1` `List`, as kubectl prints them.
            let json = match written {
                [one] => pretty(one),
                many => pretty(&json!({"apiVersion": "v1", "kind": "List", "items": many})),
            };
            assert_eq!(render(written, Format::Json), json, "{count}");
        }
        let empty = String::from_utf8(
            DocumentWriter::new(Vec::new(), Format::Json)
                .finish()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&empty).unwrap(),
            json!({"apiVersion": "v1", "kind": "List", "items": []})
        );
    }
}
