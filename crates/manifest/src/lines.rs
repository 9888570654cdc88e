//! The line of a field in a document's text: decode errors name a field
//! (`spec.activeDeadlineSeconds`), and the person fixing it needs the line too. Looked up only
//! after an error, by reading the text's events again.

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::TScalarStyle;

/// Where a node of the path being looked for is read.
enum Frame<'p> {
    Mapping {
        /// The path below this mapping, when the mapping is on it.
        rest: Option<&'p str>,
        /// Whether the next node is a key.
        key_turn: bool,
        /// The path below the value of the current key, when that key is on it.
        child: Option<&'p str>,
    },
    Sequence {
        rest: Option<&'p str>,
        index: usize,
    },
}

/// The 1-based line (of `text`) where the field at `path` (`spec.template.spec.containers[0]
/// .image`, as decode errors write it; keys may hold dots, `nvidia.com/gpu`) is written in
/// the `document`-th non-empty YAML document of `text` (JSON reads as YAML): the line of its
/// key, or of its list item. When the path leads through something the text does not spell
/// out (an alias, a `<<` merge, a scalar where a mapping was expected) or to a field that is
/// not there, the line of the deepest node of the path that is; `None` when not even the
/// first step is there, or the text does not read.
pub fn line_of(text: &str, document: usize, path: &str) -> Option<usize> {
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame<'_>> = Vec::new();
    let mut roots = 0;
    let mut deepest = None;
    loop {
        let (event, marker) = parser.next_token().ok()?;
        let line = marker.line();
        let is_node = matches!(
            event,
            Event::Scalar(..)
                | Event::Alias(_)
                | Event::MappingStart(..)
                | Event::SequenceStart(..)
        );
        if is_node {
            let rest = match stack.last_mut() {
                None => {
                    let empty = matches!(&event, Event::Scalar(text, TScalarStyle::Plain, ..)
                        if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"));
                    let on_path = !empty && roots == document;
                    if !empty {
                        roots += 1;
                    }
                    on_path.then_some(path)
                }
                Some(Frame::Mapping {
                    rest,
                    key_turn: true,
                    child,
                }) => {
                    *child = None;
                    if let (Some(rest), Event::Scalar(key, ..)) = (*rest, &event)
                        && let Some(after) = rest.strip_prefix(key.as_str())
                    {
                        if after.is_empty() {
                            return Some(line);
                        }
                        if let Some(below) = after.strip_prefix('.') {
                            *child = Some(below);
                            deepest = Some(line);
                        } else if after.starts_with('[') {
                            *child = Some(after);
                            deepest = Some(line);
                        }
                    }
                    // A key is not on the path itself.
                    None
                }
                Some(Frame::Mapping { child, .. }) => child.take(),
                Some(Frame::Sequence { rest, index }) => rest.and_then(|rest| {
                    let after = rest.strip_prefix(&format!("[{index}]"))?;
                    Some(after.strip_prefix('.').unwrap_or(after))
                }),
            };
            let item = matches!(stack.last(), Some(Frame::Sequence { .. }));
            if let Some(rest) = rest {
                if rest.is_empty() {
                    return Some(line);
                }
                // A key's value is found at its key's line, set above; the root is no step.
                if item {
                    deepest = Some(line);
                }
            }
            match event {
                Event::MappingStart(..) => stack.push(Frame::Mapping {
                    rest,
                    key_turn: true,
                    child: None,
                }),
                Event::SequenceStart(..) => stack.push(Frame::Sequence { rest, index: 0 }),
                // The path goes on below a scalar or an alias: not in the text.
                _ if rest.is_some() => return deepest,
                _ => node_done(&mut stack),
            }
            continue;
        }
        match event {
            Event::MappingEnd | Event::SequenceEnd => {
                let on_path = matches!(
                    stack.pop(),
                    Some(
                        Frame::Mapping { rest: Some(_), .. }
                            | Frame::Sequence { rest: Some(_), .. }
                    )
                );
                if on_path {
                    // The path's next step is not in it.
                    return deepest;
                }
                node_done(&mut stack);
            }
            Event::StreamEnd => return deepest,
            _ => {}
        }
    }
}

/// A node of the innermost mapping or list is read: a key's value comes next, or the next
/// item.
fn node_done(stack: &mut [Frame<'_>]) {
    match stack.last_mut() {
        Some(Frame::Mapping { key_turn, .. }) => *key_turn = !*key_turn,
        Some(Frame::Sequence { index, .. }) => *index += 1,
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = "\
apiVersion: batch/v1
kind: Job
metadata:
  name: train
  labels: {team: ml, tier: gpu}
spec:
  activeDeadlineSeconds: abc
  template:
    spec:
      containers:
      - name: main
        image: train:1
        resources:
          limits:
            nvidia.com/gpu: one
      - name: sidecar
        args:
        - --log
        - |
          multi
          line
";

    #[test]
    fn a_field_is_found_on_the_line_of_its_key_or_item() {
        let cases = [
            ("spec.activeDeadlineSeconds", Some(7)),
            ("spec", Some(6)),
            ("metadata.labels.tier", Some(5)),
            ("spec.template.spec.containers", Some(10)),
            ("spec.template.spec.containers[0]", Some(11)),
            ("spec.template.spec.containers[1].name", Some(16)),
            (
                "spec.template.spec.containers[0].resources.limits.nvidia.com/gpu",
                Some(15),
            ),
            // A block scalar item: the parser marks its first line of content.
            ("spec.template.spec.containers[1].args[1]", Some(20)),
            // Not all there: the deepest node that is.
            ("spec.template.spec.containers[0].ports[0]", Some(11)),
            ("spec.template.spec.containers[5].name", Some(10)),
            ("spec.activeDeadlineSeconds.x", Some(7)),
            ("status.active", None),
        ];
        for (path, line) in cases {
            assert_eq!(line_of(JOB, 0, path), line, "{path}");
        }
    }

    #[test]
    fn documents_aliases_and_json() {
        let text = "a: 1\n...\n---\nkind: Job\nspec:\n  x: &v {y: 1}\n  z: *v\n";
        assert_eq!(line_of(text, 1, "spec.x.y"), Some(6));
        assert_eq!(line_of(text, 1, "spec.z.y"), Some(7), "an alias: its line");
        assert_eq!(line_of(text, 0, "a"), Some(1));
        let json = "{\n  \"spec\": {\n    \"parallelism\": \"two\"\n  }\n}";
        assert_eq!(line_of(json, 0, "spec.parallelism"), Some(3));
        assert_eq!(
            line_of("a: [1,", 0, "a"),
            Some(1),
            "found before the text breaks"
        );
        assert_eq!(line_of("a: [1,", 0, "b"), None);
    }
}
