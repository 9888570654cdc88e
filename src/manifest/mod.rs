//! Reading and writing Kubernetes manifests: files, directories and stdin; YAML streams with
//! several documents, JSON objects and `List` objects. Documents are kept as raw JSON values in
//! input order, so nothing the engine does not own is lost or reordered.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

mod read;
mod write;

/// One document of one input.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// The file it came from (`-` for stdin).
    pub source: String,
    /// Its 0-based position among the documents of that file (empty documents not counted).
    pub index: usize,
    pub value: Value,
}

/// Why an input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{source_name}: cannot read: {error}")]
    Read {
        source_name: String,
        #[source]
        error: std::io::Error,
    },
    #[error("{source_name}: document {index}{}: {message}", line.map(|l| format!(", line {l}")).unwrap_or_default())]
    Parse {
        source_name: String,
        index: usize,
        line: Option<usize>,
        message: String,
    },
}

/// The files an input names: the file itself, or the `.yaml`, `.yml` and `.json` files below a
/// directory, sorted by path.
pub fn expand(path: &Path) -> std::io::Result<Vec<PathBuf>> {
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

/// Reads one input (`-` is stdin) into its documents. A document that fails to parse ends the
/// input (the parser cannot resynchronise); the documents before it are returned with the error.
pub fn read(input: &Path) -> (Vec<Document>, Option<InputError>) {
    let source_name = input.display().to_string();
    let text = if source_name == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    } else {
        std::fs::read_to_string(input)
    };
    match text {
        Ok(text) => parse(&text, &source_name),
        Err(error) => (Vec::new(), Some(InputError::Read { source_name, error })),
    }
}

/// Splits text into documents: a stream of JSON values when it starts with `{`, else a YAML
/// stream. Empty documents (`---` with nothing after) are dropped, as kubectl does.
pub fn parse(text: &str, source_name: &str) -> (Vec<Document>, Option<InputError>) {
    let mut documents = Vec::new();
    let parse_error = |index, line, message| InputError::Parse {
        source_name: source_name.to_owned(),
        index,
        line,
        message,
    };
    if text.trim_start().starts_with('{') {
        for value in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
            match value {
                Ok(value) => documents.push(Document {
                    source: source_name.to_owned(),
                    index: documents.len(),
                    value,
                }),
                Err(error) => {
                    let message = strip_location(&error.to_string());
                    let error = parse_error(documents.len(), Some(error.line()), message);
                    return (documents, Some(error));
                }
            }
        }
        return (documents, None);
    }
    // YAML as kubectl reads it (YAML 1.1 scalars, anchors, merge keys).
    let (values, error) = read::read_documents(text);
    for value in values {
        documents.push(Document {
            source: source_name.to_owned(),
            index: documents.len(),
            value,
        });
    }
    let error = error.map(|error| parse_error(error.document, Some(error.line), error.message));
    (documents, error)
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

fn strip_location(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(position) => message[..position].to_owned(),
        None => message.to_owned(),
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
    match format {
        Format::Yaml => values.iter().map(to_yaml).collect::<Vec<_>>().join("---\n"),
        Format::Json => {
            let value = match values {
                [single] => single.clone(),
                many => serde_json::json!({"apiVersion": "v1", "kind": "List", "items": many}),
            };
            let mut text = serde_json::to_string_pretty(&value).expect("JSON values serialize");
            text.push('\n');
            text
        }
    }
}

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
        let (documents, error) = parse("---\na: 1\n---\n---\nb: 2\n", "x.yaml");
        assert!(error.is_none());
        let values: Vec<&Value> = documents.iter().map(|d| &d.value).collect();
        assert_eq!(
            values,
            vec![&serde_json::json!({"a": 1}), &serde_json::json!({"b": 2})]
        );
        assert_eq!(documents[1].index, 1);
    }

    #[test]
    fn a_broken_document_is_reported_with_its_index_and_line() {
        let (documents, error) = parse("a: 1\n---\nb: [1,\n", "x.yaml");
        assert_eq!(documents.len(), 1);
        let text = error.unwrap().to_string();
        assert!(text.starts_with("x.yaml: document 1, line "), "{text}");
    }

    #[test]
    fn json_streams_are_read() {
        let (documents, error) = parse("{\"a\": 1}\n{\"b\": 2}", "x.json");
        assert!(error.is_none());
        assert_eq!(documents.len(), 2);
        let (_, error) = parse("{\"a\": ", "x.json");
        assert!(error.unwrap().to_string().contains("document 0, line 1"));
    }
}
