//! Block scalars read as libyaml reads them (kubectl's go-yaml is its port): every style at
//! the end of a file with and without a final line break, in the last document of a stream,
//! before `---` and `...`. The expected values are what PyYAML 6.0.3 with libyaml
//! (`yaml.load_all(text, Loader=yaml.CSafeLoader)`) read from the same texts.

use serde_json::Value;

/// A ConfigMap whose `data.run.sh` is the block scalar under test, its lines indented by 4.
const CONFIG_MAP: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: scripts\ndata:\n  run.sh: ";

/// The scalar's lines, by name.
const BODIES: &[(&str, &[&str])] = &[
    ("one line", &["echo hello"]),
    ("two lines", &["set -e", "echo hello"]),
    ("blank lines after", &["echo hello", "", ""]),
    ("more indented", &["a", "  b", "c"]),
];

/// What follows the scalar's last line (no line break of its own), and whether a document
/// comes before the ConfigMap; in the order of the values of [`STYLES`].
const AFTER: &[(&str, &str, bool)] = &[
    ("end of file", "", false),
    ("final newline", "\n", false),
    ("two newlines", "\n\n", false),
    ("before ---", "\n---\nkind: Next\n", false),
    ("before ...", "\n...\n", false),
    ("before ... at end of file", "\n...", false),
    ("before a dedented comment", "\n# end", false),
    ("before the next key", "\n  other: x\n", false),
    ("last document, end of file", "", true),
    ("last document, final newline", "\n", true),
];

/// Indicator, body, and libyaml's value of `data.run.sh` after each of [`AFTER`].
#[rustfmt::skip]
const STYLES: &[(&str, &str, [&str; 10])] = &[
    ("|", "one line", ["echo hello", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello", "echo hello\n"]),
    ("|", "two lines", ["set -e\necho hello", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello", "set -e\necho hello\n"]),
    ("|", "blank lines after", ["echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n"]),
    ("|", "more indented", ["a\n  b\nc", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc", "a\n  b\nc\n"]),
    ("|-", "one line", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    ("|-", "two lines", ["set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello"]),
    ("|-", "blank lines after", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    ("|-", "more indented", ["a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc"]),
    ("|+", "one line", ["echo hello", "echo hello\n", "echo hello\n\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello", "echo hello\n"]),
    ("|+", "two lines", ["set -e\necho hello", "set -e\necho hello\n", "set -e\necho hello\n\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello", "set -e\necho hello\n"]),
    ("|+", "blank lines after", ["echo hello\n\n", "echo hello\n\n\n", "echo hello\n\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n", "echo hello\n\n\n"]),
    ("|+", "more indented", ["a\n  b\nc", "a\n  b\nc\n", "a\n  b\nc\n\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc", "a\n  b\nc\n"]),
    (">", "one line", ["echo hello", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello", "echo hello\n"]),
    (">", "two lines", ["set -e echo hello", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello", "set -e echo hello\n"]),
    (">", "blank lines after", ["echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n"]),
    (">", "more indented", ["a\n  b\nc", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc", "a\n  b\nc\n"]),
    (">-", "one line", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    (">-", "two lines", ["set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello"]),
    (">-", "blank lines after", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    (">-", "more indented", ["a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc"]),
    (">+", "one line", ["echo hello", "echo hello\n", "echo hello\n\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello", "echo hello\n"]),
    (">+", "two lines", ["set -e echo hello", "set -e echo hello\n", "set -e echo hello\n\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello", "set -e echo hello\n"]),
    (">+", "blank lines after", ["echo hello\n\n", "echo hello\n\n\n", "echo hello\n\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n", "echo hello\n\n\n"]),
    (">+", "more indented", ["a\n  b\nc", "a\n  b\nc\n", "a\n  b\nc\n\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc", "a\n  b\nc\n"]),
    ("|2", "one line", ["echo hello", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello", "echo hello\n"]),
    ("|2", "two lines", ["set -e\necho hello", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello", "set -e\necho hello\n"]),
    ("|2", "blank lines after", ["echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n"]),
    ("|2", "more indented", ["a\n  b\nc", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc", "a\n  b\nc\n"]),
    ("|2-", "one line", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    ("|2-", "two lines", ["set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello"]),
    ("|2-", "blank lines after", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    ("|2-", "more indented", ["a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc"]),
    ("|-2", "one line", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    ("|-2", "two lines", ["set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello", "set -e\necho hello"]),
    ("|-2", "blank lines after", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    ("|-2", "more indented", ["a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc"]),
    ("|2+", "one line", ["echo hello", "echo hello\n", "echo hello\n\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello", "echo hello\n"]),
    ("|2+", "two lines", ["set -e\necho hello", "set -e\necho hello\n", "set -e\necho hello\n\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello\n", "set -e\necho hello", "set -e\necho hello\n"]),
    ("|2+", "blank lines after", ["echo hello\n\n", "echo hello\n\n\n", "echo hello\n\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n", "echo hello\n\n\n"]),
    ("|2+", "more indented", ["a\n  b\nc", "a\n  b\nc\n", "a\n  b\nc\n\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc", "a\n  b\nc\n"]),
    (">2", "one line", ["echo hello", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello", "echo hello\n"]),
    (">2", "two lines", ["set -e echo hello", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello", "set -e echo hello\n"]),
    (">2", "blank lines after", ["echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n"]),
    (">2", "more indented", ["a\n  b\nc", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc", "a\n  b\nc\n"]),
    (">+2", "one line", ["echo hello", "echo hello\n", "echo hello\n\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello\n", "echo hello", "echo hello\n"]),
    (">+2", "two lines", ["set -e echo hello", "set -e echo hello\n", "set -e echo hello\n\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello\n", "set -e echo hello", "set -e echo hello\n"]),
    (">+2", "blank lines after", ["echo hello\n\n", "echo hello\n\n\n", "echo hello\n\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n\n", "echo hello\n\n", "echo hello\n\n\n"]),
    (">+2", "more indented", ["a\n  b\nc", "a\n  b\nc\n", "a\n  b\nc\n\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc\n", "a\n  b\nc", "a\n  b\nc\n"]),
    (">2-", "one line", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    (">2-", "two lines", ["set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello", "set -e echo hello"]),
    (">2-", "blank lines after", ["echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello", "echo hello"]),
    (">2-", "more indented", ["a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc", "a\n  b\nc"]),
];

/// Other shapes: empty scalars, blank and comment last lines, sequences, top-level scalars,
/// CRLF, non-ASCII text, anchors and tags; libyaml's documents as JSON.
#[rustfmt::skip]
const SHAPES: &[(&str, &str)] = &[
    ("a: |", "[{\"a\":\"\"}]"),
    ("a: |\n", "[{\"a\":\"\"}]"),
    ("a: |\n---\nb: 1\n", "[{\"a\":\"\"},{\"b\":1}]"),
    ("a: |\nb: 1\n", "[{\"a\":\"\",\"b\":1}]"),
    ("a: |\n\n\n", "[{\"a\":\"\"}]"),
    ("a: |\n  hello\n ", "[{\"a\":\"hello\\n\"}]"),
    ("a: |\n  hello\n  ", "[{\"a\":\"hello\\n\"}]"),
    ("a: |\n  hello\n    ", "[{\"a\":\"hello\\n  \"}]"),
    ("a: |\n  hello\n\n ", "[{\"a\":\"hello\\n\"}]"),
    ("a: |\n  hello\n# done", "[{\"a\":\"hello\\n\"}]"),
    ("a: |\n  hello\n# done\n", "[{\"a\":\"hello\\n\"}]"),
    ("a: |\n  hello\n  # not a comment", "[{\"a\":\"hello\\n# not a comment\"}]"),
    ("a: | # c\n  hello", "[{\"a\":\"hello\"}]"),
    ("- |\n  hello", "[[\"hello\"]]"),
    ("- |\n  hello\n", "[[\"hello\\n\"]]"),
    ("a:\n- x\n- |\n  hello", "[{\"a\":[\"x\",\"hello\"]}]"),
    ("--- |\n  hello", "[\"hello\"]"),
    ("a: |\r\n  hello\r\n  world", "[{\"a\":\"hello\\nworld\"}]"),
    ("a: |\r\n  hello\r\n  world\r\n", "[{\"a\":\"hello\\nworld\\n\"}]"),
    ("a: |\n  héllo wörld ✓", "[{\"a\":\"héllo wörld ✓\"}]"),
    ("a: |\n  héllo wörld ✓\n# c", "[{\"a\":\"héllo wörld ✓\\n\"}]"),
    ("a: &x |\n  hello", "[{\"a\":\"hello\"}]"),
    ("a: &x |\n  hello\nb: *x", "[{\"a\":\"hello\\n\",\"b\":\"hello\\n\"}]"),
    ("a: !!str |\n  hello", "[{\"a\":\"hello\"}]"),
    ("a: |-", "[{\"a\":\"\"}]"),
    ("a: |-\n", "[{\"a\":\"\"}]"),
    ("a: |-\n---\nb: 1\n", "[{\"a\":\"\"},{\"b\":1}]"),
    ("a: |-\nb: 1\n", "[{\"a\":\"\",\"b\":1}]"),
    ("a: |-\n\n\n", "[{\"a\":\"\"}]"),
    ("a: |-\n  hello\n ", "[{\"a\":\"hello\"}]"),
    ("a: |-\n  hello\n  ", "[{\"a\":\"hello\"}]"),
    ("a: |-\n  hello\n    ", "[{\"a\":\"hello\\n  \"}]"),
    ("a: |-\n  hello\n\n ", "[{\"a\":\"hello\"}]"),
    ("a: |-\n  hello\n# done", "[{\"a\":\"hello\"}]"),
    ("a: |-\n  hello\n# done\n", "[{\"a\":\"hello\"}]"),
    ("a: |-\n  hello\n  # not a comment", "[{\"a\":\"hello\\n# not a comment\"}]"),
    ("a: |- # c\n  hello", "[{\"a\":\"hello\"}]"),
    ("- |-\n  hello", "[[\"hello\"]]"),
    ("- |-\n  hello\n", "[[\"hello\"]]"),
    ("a:\n- x\n- |-\n  hello", "[{\"a\":[\"x\",\"hello\"]}]"),
    ("--- |-\n  hello", "[\"hello\"]"),
    ("a: |-\r\n  hello\r\n  world", "[{\"a\":\"hello\\nworld\"}]"),
    ("a: |-\r\n  hello\r\n  world\r\n", "[{\"a\":\"hello\\nworld\"}]"),
    ("a: |-\n  héllo wörld ✓", "[{\"a\":\"héllo wörld ✓\"}]"),
    ("a: |-\n  héllo wörld ✓\n# c", "[{\"a\":\"héllo wörld ✓\"}]"),
    ("a: &x |-\n  hello", "[{\"a\":\"hello\"}]"),
    ("a: &x |-\n  hello\nb: *x", "[{\"a\":\"hello\",\"b\":\"hello\"}]"),
    ("a: !!str |-\n  hello", "[{\"a\":\"hello\"}]"),
    ("a: |+", "[{\"a\":\"\"}]"),
    ("a: |+\n", "[{\"a\":\"\"}]"),
    ("a: |+\n---\nb: 1\n", "[{\"a\":\"\"},{\"b\":1}]"),
    ("a: |+\nb: 1\n", "[{\"a\":\"\",\"b\":1}]"),
    ("a: |+\n\n\n", "[{\"a\":\"\\n\\n\"}]"),
    ("a: |+\n  hello\n ", "[{\"a\":\"hello\\n\"}]"),
    ("a: |+\n  hello\n  ", "[{\"a\":\"hello\\n\"}]"),
    ("a: |+\n  hello\n    ", "[{\"a\":\"hello\\n  \"}]"),
    ("a: |+\n  hello\n\n ", "[{\"a\":\"hello\\n\\n\"}]"),
    ("a: |+\n  hello\n# done", "[{\"a\":\"hello\\n\"}]"),
    ("a: |+\n  hello\n# done\n", "[{\"a\":\"hello\\n\"}]"),
    ("a: |+\n  hello\n  # not a comment", "[{\"a\":\"hello\\n# not a comment\"}]"),
    ("a: |+ # c\n  hello", "[{\"a\":\"hello\"}]"),
    ("- |+\n  hello", "[[\"hello\"]]"),
    ("- |+\n  hello\n", "[[\"hello\\n\"]]"),
    ("a:\n- x\n- |+\n  hello", "[{\"a\":[\"x\",\"hello\"]}]"),
    ("--- |+\n  hello", "[\"hello\"]"),
    ("a: |+\r\n  hello\r\n  world", "[{\"a\":\"hello\\nworld\"}]"),
    ("a: |+\r\n  hello\r\n  world\r\n", "[{\"a\":\"hello\\nworld\\n\"}]"),
    ("a: |+\n  héllo wörld ✓", "[{\"a\":\"héllo wörld ✓\"}]"),
    ("a: |+\n  héllo wörld ✓\n# c", "[{\"a\":\"héllo wörld ✓\\n\"}]"),
    ("a: &x |+\n  hello", "[{\"a\":\"hello\"}]"),
    ("a: &x |+\n  hello\nb: *x", "[{\"a\":\"hello\\n\",\"b\":\"hello\\n\"}]"),
    ("a: !!str |+\n  hello", "[{\"a\":\"hello\"}]"),
    ("a: >", "[{\"a\":\"\"}]"),
    ("a: >\n", "[{\"a\":\"\"}]"),
    ("a: >\n---\nb: 1\n", "[{\"a\":\"\"},{\"b\":1}]"),
    ("a: >\nb: 1\n", "[{\"a\":\"\",\"b\":1}]"),
    ("a: >\n\n\n", "[{\"a\":\"\"}]"),
    ("a: >\n  hello\n ", "[{\"a\":\"hello\\n\"}]"),
    ("a: >\n  hello\n  ", "[{\"a\":\"hello\\n\"}]"),
    ("a: >\n  hello\n    ", "[{\"a\":\"hello\\n  \"}]"),
    ("a: >\n  hello\n\n ", "[{\"a\":\"hello\\n\"}]"),
    ("a: >\n  hello\n# done", "[{\"a\":\"hello\\n\"}]"),
    ("a: >\n  hello\n# done\n", "[{\"a\":\"hello\\n\"}]"),
    ("a: >\n  hello\n  # not a comment", "[{\"a\":\"hello # not a comment\"}]"),
    ("a: > # c\n  hello", "[{\"a\":\"hello\"}]"),
    ("- >\n  hello", "[[\"hello\"]]"),
    ("- >\n  hello\n", "[[\"hello\\n\"]]"),
    ("a:\n- x\n- >\n  hello", "[{\"a\":[\"x\",\"hello\"]}]"),
    ("--- >\n  hello", "[\"hello\"]"),
    ("a: >\r\n  hello\r\n  world", "[{\"a\":\"hello world\"}]"),
    ("a: >\r\n  hello\r\n  world\r\n", "[{\"a\":\"hello world\\n\"}]"),
    ("a: >\n  héllo wörld ✓", "[{\"a\":\"héllo wörld ✓\"}]"),
    ("a: >\n  héllo wörld ✓\n# c", "[{\"a\":\"héllo wörld ✓\\n\"}]"),
    ("a: &x >\n  hello", "[{\"a\":\"hello\"}]"),
    ("a: &x >\n  hello\nb: *x", "[{\"a\":\"hello\\n\",\"b\":\"hello\\n\"}]"),
    ("a: !!str >\n  hello", "[{\"a\":\"hello\"}]"),
];

/// The documents of `text`, each checked to come back the same from its rendering through
/// serde_norway (libyaml's port): what `mutate` writes is what kubectl reads back.
fn read(text: &str) -> Vec<Value> {
    let (documents, errors) = super::parse(text, "in.yaml");
    assert!(errors.is_empty(), "{text:?}: {errors:?}");
    let values: Vec<Value> = documents
        .into_iter()
        .map(|document| document.value)
        .collect();
    for value in &values {
        let written = super::to_yaml(value);
        let read_back: Value = serde_norway::from_str(&written).unwrap();
        assert_eq!(&read_back, value, "{text:?} written as {written:?}");
    }
    values
}

#[test]
fn every_block_scalar_style_reads_as_libyaml_reads_it_wherever_it_ends() {
    let mut wrong = Vec::new();
    for (indicator, body, expected) in STYLES {
        let lines = BODIES.iter().find(|(name, _)| name == body).unwrap().1;
        let scalar: Vec<String> = lines
            .iter()
            .map(|line| {
                if line.is_empty() {
                    String::new()
                } else {
                    format!("    {line}")
                }
            })
            .collect();
        for ((after, suffix, second), expected) in AFTER.iter().zip(expected) {
            let first = if *second { "kind: First\n---\n" } else { "" };
            let text = format!(
                "{first}{CONFIG_MAP}{indicator}\n{}{suffix}",
                scalar.join("\n")
            );
            let documents = read(&text);
            let config_map = &documents[usize::from(*second)];
            if config_map["data"]["run.sh"] != *expected {
                wrong.push(format!(
                    "{indicator} {body}, {after}: {:?}, libyaml {expected:?}",
                    config_map["data"]["run.sh"]
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn block_scalars_in_other_shapes_read_as_libyaml_reads_them() {
    let mut wrong = Vec::new();
    for (text, expected) in SHAPES {
        let expected: Value = serde_json::from_str(expected).unwrap();
        let documents = Value::Array(read(text));
        if documents != expected {
            wrong.push(format!("{text:?}: {documents}, libyaml {expected}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
