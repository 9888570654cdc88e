//! Reading and writing Kubernetes manifests: files, directories and stdin; YAML streams with
//! several documents, JSON objects and `List` objects. Documents are kept as raw JSON values in
//! input order, so nothing the engine does not own is lost or reordered.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

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
    let (values, error) = crate::yaml_in::read_documents(text);
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

fn strip_location(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(position) => message[..position].to_owned(),
        None => message.to_owned(),
    }
}

/// The output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
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
    crate::yaml::to_string(value)
}

#[cfg(test)]
mod tests {
    use super::*;

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
