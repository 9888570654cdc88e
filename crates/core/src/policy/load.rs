//! Reading a policy file: YAML syntax and types first (serde, with the field path and position
//! of the first error), then every semantic rule at once, each reported with the line of the
//! field it is about.

use std::path::Path;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

use super::Policy;
use super::validate::validate;
use crate::decode;
use crate::field::{DocumentKey, FieldPath};

/// One thing wrong with a policy file, with where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyProblem {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The field, e.g. `mutation.podFailurePolicy.exitCodeRules[0].codes[1]`; empty for the
    /// whole document.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy file {file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", render(file, problems))]
    Invalid {
        file: String,
        problems: Vec<PolicyProblem>,
    },
}

impl PolicyError {
    /// The problems found, empty for a read error.
    pub fn problems(&self) -> &[PolicyProblem] {
        match self {
            Self::Read { .. } => &[],
            Self::Invalid { problems, .. } => problems,
        }
    }
}

fn render(file: &str, problems: &[PolicyProblem]) -> String {
    let lines: Vec<String> = problems
        .iter()
        .map(|problem| {
            let mut place = file.to_owned();
            if let Some(line) = problem.line {
                place.push_str(&format!(":{line}"));
                if let Some(column) = problem.column {
                    place.push_str(&format!(":{column}"));
                }
            }
            let field = if problem.field.is_empty() {
                String::new()
            } else {
                format!(" {}:", problem.field)
            };
            format!("{place}:{field} {}", problem.message)
        })
        .collect();
    let count = problems.len();
    let noun = if count == 1 { "problem" } else { "problems" };
    format!("invalid policy ({count} {noun}):\n  {}", lines.join("\n  "))
}

/// Reads and validates a policy file.
pub fn load(path: &Path) -> Result<Policy, PolicyError> {
    use std::io::Read as _;
    let file = path.display().to_string();
    let read_error = |source| PolicyError::Read {
        file: file.clone(),
        source,
    };
    // Read at most one byte past the limit: a policy is a few kilobytes, and a file that is
    // not (a wrong path, a device) must not be read whole.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|opened| opened.take(MAX_POLICY_BYTES + 1).read_to_end(&mut bytes))
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_POLICY_BYTES {
        return Err(read_error(std::io::Error::other(format!(
            "larger than {} KiB, the limit of a policy file",
            MAX_POLICY_BYTES / 1024
        ))));
    }
    let source = String::from_utf8(bytes)
        .map_err(|_| read_error(std::io::Error::other("the file is not UTF-8 text")))?;
    parse(&source, &file)
}

/// The largest policy file read: 1 MiB, far above any real policy (the embedded default is
/// about 10 KiB). YAML's other bounds are serde_norway's (0.9.42, `de.rs`): it refuses alias
/// expansion past its repetition limit and nesting past 128 levels, and the policy's typed
/// fields refuse a list where a string belongs before an alias is followed.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;

/// Parses and validates policy text; `file` names it in errors.
pub fn parse(source: &str, file: &str) -> Result<Policy, PolicyError> {
    let invalid = |problems| PolicyError::Invalid {
        file: file.to_owned(),
        problems,
    };
    if source.trim().is_empty() {
        return Err(invalid(vec![PolicyProblem {
            line: None,
            column: None,
            field: String::new(),
            message: "the file is empty; write `{}` for a policy that takes every default"
                .to_owned(),
        }]));
    }
    let mut documents = serde_norway::Deserializer::from_str(source);
    let Some(document) = documents.next() else {
        return Err(invalid(vec![PolicyProblem {
            line: None,
            column: None,
            field: String::new(),
            message: "the file holds no YAML document".to_owned(),
        }]));
    };
    let policy: Policy = serde_path_to_error::deserialize(document).map_err(|error| {
        let field = error.path().to_string();
        let field = if field == "." { String::new() } else { field };
        let inner = error.into_inner();
        let location = inner.location();
        let (line, column) = (
            location.as_ref().map(|l| l.line()),
            location.as_ref().map(|l| l.column()),
        );
        let tab = line
            .zip(column)
            .and_then(|(line, column)| decode::tab_message(source, line, column));
        let problem = match tab {
            // A syntax error: the field being read says nothing about it.
            Some(message) => PolicyProblem {
                line,
                column,
                field: String::new(),
                message,
            },
            None => PolicyProblem {
                line,
                column,
                message: serde_message(source, &inner, &field),
                field,
            },
        };
        invalid(vec![problem])
    })?;
    if documents.next().is_some() {
        return Err(invalid(vec![PolicyProblem {
            line: None,
            column: None,
            field: String::new(),
            message: "the file holds more than one YAML document; a policy is one document"
                .to_owned(),
        }]));
    }

    let violations = validate(&policy);
    if violations.is_empty() {
        return Ok(policy);
    }
    let tree = SourceTree::parse(source);
    Err(invalid(
        violations
            .into_iter()
            .map(|(path, message)| {
                let marker = tree.as_ref().and_then(|tree| tree.locate(&path));
                PolicyProblem {
                    line: marker.map(|m| m.line()),
                    column: marker.map(|m| m.col() + 1),
                    field: path.to_string(),
                    message,
                }
            })
            .collect(),
    ))
}

/// The problem at `field` in words, from a second decode that keeps it in parts
/// ([`decode::yaml_problem`]). When that one fails elsewhere (it should not), serde_norway's
/// own message, without the field it puts in front and the position it appends: both are
/// reported separately.
fn serde_message(source: &str, error: &serde_norway::Error, field: &str) -> String {
    let at = if field.is_empty() { "." } else { field };
    if let Some((found_at, problem)) = decode::yaml_problem::<Policy>(source)
        && found_at == at
    {
        return problem.to_string();
    }
    let message = error.to_string();
    let position = error
        .location()
        .map(|l| format!(" at line {} column {}", l.line(), l.column()))
        .unwrap_or_default();
    let message = message.strip_suffix(&position).unwrap_or(&message);
    let prefix = format!("{field}: ");
    message
        .strip_prefix(&prefix)
        .filter(|_| !field.is_empty())
        .unwrap_or(message)
        .to_owned()
}

// === impl SourceTree ===

/// The shape of a YAML document with the position of every key and item, to report the line
/// of a field that failed semantic validation.
enum Node {
    Scalar,
    Sequence(Vec<(Marker, Node)>),
    Mapping(Vec<(String, Marker, Node)>),
}

struct SourceTree {
    root: (Marker, Node),
}

impl SourceTree {
    fn parse(source: &str) -> Option<Self> {
        let mut builder = TreeBuilder::default();
        Parser::new_from_str(source)
            .load(&mut builder, false)
            .ok()?;
        builder.root.map(|root| Self { root })
    }

    /// The position of the deepest node on `path` that the file has (a defaulted field is
    /// reported at its parent).
    fn locate(&self, path: &FieldPath) -> Option<Marker> {
        let (mut marker, mut node) = (self.root.0, &self.root.1);
        for key in path.document_keys() {
            let next = match (node, key) {
                (Node::Mapping(entries), DocumentKey::Name(name)) => entries
                    .iter()
                    .find(|(key, _, _)| key == name)
                    .map(|(_, marker, node)| (*marker, node)),
                (Node::Sequence(items), DocumentKey::Index(index)) => {
                    items.get(index).map(|(marker, node)| (*marker, node))
                }
                _ => None,
            };
            match next {
                Some((next_marker, next_node)) => (marker, node) = (next_marker, next_node),
                None => break,
            }
        }
        Some(marker)
    }
}

/// A collection being read: its marker, the node being filled and, for a mapping, the key
/// waiting for its value.
type OpenCollection = (Marker, Node, Option<(String, Marker)>);

#[derive(Default)]
struct TreeBuilder {
    stack: Vec<OpenCollection>,
    root: Option<(Marker, Node)>,
}

impl TreeBuilder {
    fn push_value(&mut self, marker: Marker, node: Node, scalar_text: Option<String>) {
        let Some((_, parent, pending_key)) = self.stack.last_mut() else {
            self.root = Some((marker, node));
            return;
        };
        match parent {
            Node::Sequence(items) => items.push((marker, node)),
            Node::Mapping(entries) => match pending_key.take() {
                Some((key, key_marker)) => entries.push((key, key_marker, node)),
                None => *pending_key = Some((scalar_text.unwrap_or_default(), marker)),
            },
            Node::Scalar => {}
        }
    }
}

impl MarkedEventReceiver for TreeBuilder {
    fn on_event(&mut self, event: Event, marker: Marker) {
        match event {
            Event::Scalar(text, ..) => self.push_value(marker, Node::Scalar, Some(text)),
            Event::Alias(_) => self.push_value(marker, Node::Scalar, None),
            Event::SequenceStart(..) => self.stack.push((marker, Node::Sequence(Vec::new()), None)),
            Event::MappingStart(..) => self.stack.push((marker, Node::Mapping(Vec::new()), None)),
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((marker, node, _)) = self.stack.pop() {
                    self.push_value(marker, node, None);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(source: &str) -> Vec<PolicyProblem> {
        match parse(source, "test.yaml") {
            Ok(_) => panic!("expected the policy to be refused:\n{source}"),
            Err(error) => error.problems().to_vec(),
        }
    }

    #[test]
    fn the_embedded_policy_is_valid_and_equals_the_built_in_defaults() {
        assert_eq!(Policy::embedded(), Policy::default());
    }

    #[test]
    fn an_empty_mapping_takes_every_default() {
        assert_eq!(parse("{}", "x").unwrap(), Policy::default());
    }

    #[test]
    fn unknown_keys_are_refused_with_line_and_field() {
        let found = problems("mutation:\n  podFailurePolicy:\n    enabeld: false\n");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].line, Some(3));
        assert_eq!(found[0].field, "mutation.podFailurePolicy.enabeld");
        assert!(
            found[0].message.contains("unknown field `enabeld`"),
            "{found:?}"
        );
    }

    #[test]
    fn wrong_types_are_refused_with_line_and_field() {
        let found = problems("mutation:\n  terminationGracePeriod:\n    minimumSeconds: soon\n");
        assert_eq!(found[0].line, Some(3));
        assert_eq!(
            found[0].field,
            "mutation.terminationGracePeriod.minimumSeconds"
        );
    }

    #[test]
    fn type_errors_name_the_field_once_and_no_rust_type() {
        for (source, expected) in [
            (
                "guard:\n  minimumPriority:\n    withDevice: abc\n",
                "3:17: guard.minimumPriority.withDevice: expected a whole number, found the \
                 string \"abc\"",
            ),
            (
                "guard:\n  minimumPriority:\n    withDevice: 99999999999999999999999\n",
                "3:17: guard.minimumPriority.withDevice: expected a whole number from \
                 -2147483648 to 2147483647, found 99999999999999999999999",
            ),
            (
                "controller:\n  nodeHealth:\n    maxTaintedPercent: -1\n",
                "3:24: controller.nodeHealth.maxTaintedPercent: expected a whole number from 0 \
                 to 4294967295, found -1",
            ),
            ("guard: 5\n", "1:8: guard: expected a map, found 5"),
            (
                "guard:\n  mode: 5\n",
                "2:9: guard.mode: unknown value `5`, expected one of `Enforce`, `Warn`, `Audit`",
            ),
        ] {
            let text = parse(source, "p.yaml").unwrap_err().to_string();
            assert_eq!(
                text,
                format!("invalid policy (1 problem):\n  p.yaml:{expected}")
            );
        }
    }

    #[test]
    fn a_tab_is_named_as_a_tab() {
        let text = parse("guard:\n\tmode: Warn\n", "p.yaml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            text,
            "invalid policy (1 problem):\n  p.yaml:2:1: a tab character at line 2, column 1: YAML \
             indentation must use spaces"
        );
    }

    #[test]
    fn semantic_errors_are_all_reported_with_the_line_of_their_field() {
        let source = "\
mutation:
  podFailurePolicy:
    exitCodeRules:
    - action: Ignore
      codes: [74, 0, 74]
  terminationGracePeriod:
    minimumSeconds: 600
    maximumSeconds: 60
";
        let found = problems(source);
        let summary: Vec<(Option<usize>, &str)> =
            found.iter().map(|p| (p.line, p.field.as_str())).collect();
        assert_eq!(
            summary,
            vec![
                (
                    Some(5),
                    "mutation.podFailurePolicy.exitCodeRules[0].codes[1]"
                ),
                (
                    Some(5),
                    "mutation.podFailurePolicy.exitCodeRules[0].codes[2]"
                ),
                (Some(8), "mutation.terminationGracePeriod.maximumSeconds"),
            ]
        );
    }

    #[test]
    fn restart_rule_codes_that_overlap_device_codes_are_refused_with_file_line_and_field() {
        let source = "\
mutation:
  restartRules:
    enabled: true
    exitCodes:
      - 70
      - 75
";
        let error = parse(source, "in-place.yaml").unwrap_err();
        let found = error.problems();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].line, Some(6));
        assert_eq!(found[0].field, "mutation.restartRules.exitCodes[1]");
        let text = error.to_string();
        assert!(
            text.contains("in-place.yaml:6:") && text.contains("exitCodeRules[0] (Ignore)"),
            "{text}"
        );
    }

    #[test]
    fn the_error_message_names_file_line_and_field() {
        let error = parse("devices:\n  names: ['Not A Resource']\n", "p.yaml").unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("p.yaml:2:") && text.contains("devices.names[0]:"),
            "{text}"
        );
    }

    #[test]
    fn several_documents_and_empty_files_are_refused() {
        assert!(!problems("{}\n---\n{}\n").is_empty());
        assert!(!problems("  \n").is_empty());
    }
}
