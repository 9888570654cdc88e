//! Reading YAML manifests the way kubectl reads them.
//!
//! kubectl (sigs.k8s.io/yaml, a go-yaml v2 fork) resolves plain scalars with YAML 1.1 rules:
//! `defaultMode: 0755` is the octal number 493, `readOnly: yes` and `hostIPC: off` are booleans,
//! `1_000` is a thousand. YAML 1.2 libraries read those as strings or other numbers, and writing
//! them back would change the manifest. This reader walks yaml-rust2's events and resolves
//! plain scalars the way go-yaml v2 does; quoted and block scalars are strings; anchors,
//! aliases and `<<` merge keys (go-yaml v2's order) are resolved; keys become strings as
//! sigs.k8s.io/yaml makes them. The result is JSON values, one per document.

use std::collections::HashMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Why a document could not be read: the 1-based line in the text given, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub line: usize,
    pub message: String,
    /// For a key defined twice, the line (in the text given) of its first definition: the
    /// message ends "already defined", for the reader of the whole input to say where.
    pub defined_at: Option<usize>,
}

/// The bounds a document is read within.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The deepest nesting of mappings and lists.
    pub max_depth: usize,
    /// The most bytes that alias expansion may copy (scalar text and a few bytes per node).
    pub max_alias_bytes: usize,
}

/// go-yaml's rule against "billion laughs" documents (`gopkg.in/yaml.v2` and `yaml.v3`
/// `decode.go`, `allowedAliasRatio`, the decoder under sigs.k8s.io/yaml and so kubectl): once
/// more than 100 nodes came from aliases and more than 1,000 were decoded, the share that
/// came from aliases may be at most 99% for up to 400,000 decoded nodes, falling linearly to
/// 10% at 4,000,000. Checked after each alias, which is where go-yaml's per-node check first
/// fails too (the share only grows while an alias expands).
fn excessive_aliasing(alias_nodes: usize, decoded_nodes: usize) -> bool {
    const LOW: f64 = 400_000.0;
    const HIGH: f64 = 4_000_000.0;
    if alias_nodes <= 100 || decoded_nodes <= 1000 {
        return false;
    }
    let decoded = decoded_nodes as f64;
    let allowed = if decoded <= LOW {
        0.99
    } else if decoded >= HIGH {
        0.10
    } else {
        0.99 - 0.89 * ((decoded - LOW) / (HIGH - LOW))
    };
    alias_nodes as f64 / decoded > allowed
}

/// Reads every document of a YAML text (usually one: the splitter cuts at `---`; several when
/// `...` ends one and another follows). Empty documents are dropped. The first error ends the
/// reading: the text is then one unreadable document.
///
/// Block scalars (`|`, `>`) are read as libyaml reads them (go-yaml, under kubectl, is its
/// port), where yaml-rust2 0.13 differs at the end of its input: it adds a line break to a last
/// line that has none (`a: |` then `  hello` at the end of a file is `"hello\n"`, libyaml says
/// `"hello"`), and reads an empty block scalar that ends the input as `"\n"`. The splitter
/// hands each document over as its own input, so both happen at the end of every document
/// that ends in a block scalar, not only at the end of a file. A text that ends in a line break
/// is therefore read with a `...` line after it: yaml-rust2 and libyaml agree on every block
/// scalar that does not run to the end of the input. A text whose last line has no break
/// (the last document of a file without a final newline) is read as if it had one; that
/// differs from libyaml only in the block scalar that holds the last line, whose value then
/// loses one line break, which [`without_final_break`] decides.
pub fn read_yaml(text: &str, bounds: Bounds) -> Result<Vec<Value>, ReadError> {
    let read = read_block_scalars_as_libyaml(text, bounds);
    // libyaml stops at such a tab; what yaml-rust2 finds wrong after it follows from it.
    match (read, tab_before_a_node(text)) {
        (Err(error), Some(tab)) if tab.line > error.line => Err(error),
        (_, Some(tab)) => Err(tab),
        (read, None) => read,
    }
}

/// [`read_yaml`] without its check of tabs.
fn read_block_scalars_as_libyaml(text: &str, bounds: Bounds) -> Result<Vec<Value>, ReadError> {
    if text.is_empty() || text.ends_with(['\n', '\r']) {
        return Ok(read_events(text, "...\n", bounds, None)?.documents);
    }
    let read = read_events(text, "\n...\n", bounds, None)?;
    match read.final_block_scalar {
        Some(last) if without_final_break(text, &read.documents, bounds) => {
            Ok(read_events(text, "\n...\n", bounds, Some(last))?.documents)
        }
        _ => Ok(read.documents),
    }
}

/// Whether the block scalar that ends `text` (no line break after its last line, `documents`
/// read as if there were one) takes its last line break from that missing one, so that libyaml
/// reads it with one line break less. It does when the last line is part of the scalar and
/// either holds content (clip chomping keeps the break after the last content line, and
/// there is none) or the scalar keeps its trailing breaks (`|+`: one break fewer). Both are
/// asked of yaml-rust2 on texts that end in a break, where it agrees with libyaml: with a
/// blank line more, a scalar that keeps breaks changes; without the last line, a scalar whose
/// content it was changes. A last line that is a comment, `...`, or blank in a clipped
/// scalar changes neither.
fn without_final_break(text: &str, documents: &[Value], bounds: Bounds) -> bool {
    let differs = |text: &str, suffix: &str| {
        read_events(text, suffix, bounds, None).is_ok_and(|read| read.documents != documents)
    };
    let before_last_line = text.rfind(['\n', '\r']).map_or(0, |at| at + 1);
    differs(text, "\n\n...\n") || differs(&text[..before_last_line], "...\n")
}

/// The events of `text` followed by `suffix`, built into documents; `trim`: the block scalar
/// (counted from 0 in the text) that loses one final line break.
fn read_events(
    text: &str,
    suffix: &str,
    bounds: Bounds,
    trim: Option<usize>,
) -> Result<Read, ReadError> {
    let mut builder = Builder {
        bounds,
        trim_block_scalar: trim,
        ..Builder::default()
    };
    let mut parser = Parser::new(text.chars().chain(suffix.chars()));
    loop {
        let (event, marker) = parser
            .next_token()
            .map_err(|error| scan_error(text, error.marker(), error.info()))?;
        if event == Event::StreamEnd {
            break;
        }
        builder.on_event(event, marker)?;
    }
    Ok(Read {
        documents: builder
            .documents
            .into_iter()
            .filter(|document| !document.is_null())
            .collect(),
        final_block_scalar: builder.final_block_scalar,
    })
}

/// The documents of a text, and the block scalar that ends it with a line break, if one does.
struct Read {
    documents: Vec<Value>,
    final_block_scalar: Option<usize>,
}

/// yaml-rust2's error, said for people: a tab at fault is named as a tab, on its own line (a
/// plain scalar broken by a tab is reported where the scalar began), and the scanner's flow
/// limit is named as a limit.
fn scan_error(text: &str, marker: &Marker, info: &str) -> ReadError {
    if info == "recursion limit exceeded" {
        // yaml-rust2 counts flow levels in a byte.
        return error(
            *marker,
            "nested deeper than 255 levels of [ ] and { } (the YAML scanner's limit)",
        );
    }
    let tab = if info.contains("tab") || info.contains("token") {
        gpu_guard_core::decode::tab_at(text, marker.line(), marker.col() + 1)
            .map(|column| (marker.line(), column))
            .or_else(|| {
                // Only an error about a tab is looked for further.
                info.contains("tab")
                    .then(|| gpu_guard_core::decode::tab_from(text, marker.line() + 1))
                    .flatten()
            })
    } else {
        None
    };
    match tab {
        Some((line, column)) => tab_error(line, column),
        None => error(*marker, info),
    }
}

/// A tab where YAML wants spaces, at `line` (of the text read) and `column`.
fn tab_error(line: usize, column: usize) -> ReadError {
    ReadError {
        line,
        defined_at: None,
        message: format!("a tab character at column {column}: YAML indentation must use spaces"),
    }
}

/// A tab in the indentation before a node in block context (`\tname: x`), which libyaml and
/// so kubectl refuse ("found character that cannot start any token") and yaml-rust2 reads.
/// Tabs inside block scalars, quoted scalars and flow collections (`[`, `{`) are content or
/// allowed space there, and pass. Costs a scan only for a text with a tab in the
/// indentation of some line.
fn tab_before_a_node(text: &str) -> Option<ReadError> {
    use yaml_rust2::scanner::{Scanner, TokenType};
    let indented_by_tab = memchr::memchr_iter(b'\t', text.as_bytes()).any(|at| {
        let line_start = text[..at].rfind('\n').map_or(0, |newline| newline + 1);
        text.as_bytes()[line_start..at]
            .iter()
            .all(|byte| *byte == b' ')
    });
    if !indented_by_tab {
        return None;
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut flow_level = 0usize;
    for token in Scanner::new(text.chars()) {
        let starts_node = match token.1 {
            TokenType::FlowSequenceStart | TokenType::FlowMappingStart => {
                flow_level += 1;
                flow_level == 1
            }
            TokenType::FlowSequenceEnd | TokenType::FlowMappingEnd => {
                flow_level = flow_level.saturating_sub(1);
                false
            }
            TokenType::Scalar(..)
            | TokenType::Alias(_)
            | TokenType::Anchor(_)
            | TokenType::Tag(..)
            | TokenType::BlockEntry
            | TokenType::Key => flow_level == 0,
            _ => false,
        };
        if !starts_node {
            continue;
        }
        let marker = token.0;
        let Some(line) = marker.line().checked_sub(1).and_then(|at| lines.get(at)) else {
            continue;
        };
        let before: String = line.chars().take(marker.col()).collect();
        if before.chars().all(|c| c == ' ' || c == '\t')
            && let Some(column) = before.find('\t')
        {
            return Some(tab_error(marker.line(), column + 1));
        }
    }
    None
}

enum Frame {
    Sequence {
        items: Vec<Value>,
        anchor: usize,
        size: Size,
    },
    Mapping {
        entries: Map<String, Value>,
        /// The line of each entry's key, in the order of `entries`; `None` for an entry that
        /// came from a `<<` merge (a key written after it may override it).
        key_lines: Vec<Option<usize>>,
        /// The key waiting for its value; `None` when the next node is a key.
        key: Option<Key>,
        anchor: usize,
        size: Size,
    },
}

enum Key {
    /// A key and its line.
    Text {
        name: String,
        line: usize,
        /// The position of the merged entry it overrides, if it does.
        overrides: Option<usize>,
    },
    Merge,
}

impl Key {
    fn text(name: String, line: usize) -> Self {
        Key::Text {
            name,
            line,
            overrides: None,
        }
    }
}

/// How much a node holds, counted as go-yaml counts decoded nodes.
#[derive(Clone, Copy, Default)]
struct Size {
    nodes: usize,
    bytes: usize,
}

impl Size {
    /// An empty mapping or list.
    const COLLECTION: Size = Size {
        nodes: 1,
        bytes: NODE_BYTES,
    };

    fn add(&mut self, other: Size) {
        self.nodes += other.nodes;
        self.bytes += other.bytes;
    }
}

/// Bytes counted per node besides its text (a rough JSON value's footprint).
const NODE_BYTES: usize = 16;

#[derive(Default)]
struct Builder {
    bounds: Bounds,
    stack: Vec<Frame>,
    anchors: HashMap<usize, (Value, Size)>,
    documents: Vec<Value>,
    decoded_nodes: usize,
    alias_nodes: usize,
    alias_bytes: usize,
    /// Block scalars read so far.
    block_scalars: usize,
    /// The last node read, when it is a block scalar ending in a line break: its number.
    final_block_scalar: Option<usize>,
    /// The block scalar that loses one final line break ([`read_yaml`]).
    trim_block_scalar: Option<usize>,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_depth: 1000,
            max_alias_bytes: 16 << 20,
        }
    }
}

fn error(marker: Marker, message: impl Into<String>) -> ReadError {
    ReadError {
        line: marker.line(),
        message: message.into(),
        defined_at: None,
    }
}

impl Builder {
    /// Adds a finished node to its parent; `key_text` is the node's own text when it is a
    /// scalar (mapping keys are strings, taken as written).
    fn push(
        &mut self,
        value: Value,
        size: Size,
        key_text: Option<(String, bool)>,
        marker: Marker,
    ) -> Result<(), ReadError> {
        let Some(frame) = self.stack.last_mut() else {
            self.documents.push(value);
            return Ok(());
        };
        let mut defined_twice = None;
        match frame {
            Frame::Sequence {
                items, size: total, ..
            } => {
                total.add(size);
                items.push(value);
            }
            Frame::Mapping {
                entries,
                key_lines,
                key,
                size: total,
                ..
            } => {
                total.add(size);
                let line = marker.line();
                match key.take() {
                    None => {
                        // Keys resolve like values and become strings, as sigs.k8s.io/yaml
                        // makes them: `yes:` is "true", `0755:` is "493".
                        let mut new = match (key_text, value) {
                            (Some((text, true)), _) if text == "<<" => Key::Merge,
                            (_, Value::String(text)) => Key::text(text, line),
                            (_, Value::Bool(flag)) => Key::text(flag.to_string(), line),
                            (_, Value::Number(number)) => Key::text(number.to_string(), line),
                            (_, Value::Null) => return Err(error(marker, "a null mapping key")),
                            (_, _) => {
                                return Err(error(
                                    marker,
                                    "a mapping or list as a mapping key cannot be JSON",
                                ));
                            }
                        };
                        // A key written twice is refused, as kubectl's strict decoding and
                        // kustomize refuse it; a key that overrides one merged in by `<<` is
                        // what merge keys are for.
                        if let Key::Text {
                            name, overrides, ..
                        } = &mut new
                            && entries.contains_key(name.as_str())
                            && let Some(at) = entries.keys().position(|written| written == name)
                        {
                            match key_lines[at] {
                                Some(first) => defined_twice = Some((name.clone(), first)),
                                None => *overrides = Some(at),
                            }
                        }
                        *key = Some(new);
                    }
                    Some(Key::Text {
                        name,
                        line,
                        overrides,
                    }) => {
                        match overrides {
                            // A merged entry, overridden in its place.
                            Some(at) => key_lines[at] = Some(line),
                            None => key_lines.push(Some(line)),
                        }
                        entries.insert(name, value);
                    }
                    // go-yaml v2 merges where `<<` stands: it overwrites keys written before
                    // it, keys after it overwrite the merged ones, and of several sources the
                    // first wins (they are applied last to first).
                    Some(Key::Merge) => match value {
                        Value::Object(source) => merge(entries, key_lines, source),
                        Value::Array(sources) if sources.iter().all(Value::is_object) => {
                            for source in sources.into_iter().rev() {
                                if let Value::Object(source) = source {
                                    merge(entries, key_lines, source);
                                }
                            }
                        }
                        _ => {
                            return Err(error(
                                marker,
                                "a << merge key needs a mapping or a list of mappings",
                            ));
                        }
                    },
                }
            }
        }
        match defined_twice {
            Some((name, first)) => Err(ReadError {
                line: marker.line(),
                message: match self.path() {
                    path if path.is_empty() => format!("mapping key {name:?} already defined"),
                    path => format!("{path}: mapping key {name:?} already defined"),
                },
                defined_at: Some(first),
            }),
            None => Ok(()),
        }
    }

    /// The path of the innermost mapping or list being read (`spec.template.spec`,
    /// `items[2]`), as decode errors name fields.
    fn path(&self) -> String {
        let mut path = String::new();
        let enclosing = self.stack.len().saturating_sub(1);
        for frame in &self.stack[..enclosing] {
            match frame {
                Frame::Sequence { items, .. } => path.push_str(&format!("[{}]", items.len())),
                Frame::Mapping { key, .. } => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    match key {
                        Some(Key::Text { name, .. }) => path.push_str(name),
                        Some(Key::Merge) => path.push_str("<<"),
                        None => path.push('?'),
                    }
                }
            }
        }
        path
    }

    fn anchored(&mut self, anchor: usize, value: &Value, size: Size) {
        if anchor != 0 {
            self.anchors.insert(anchor, (value.clone(), size));
        }
    }

    fn open(&mut self, frame: Frame, marker: Marker) -> Result<(), ReadError> {
        if self.stack.len() >= self.bounds.max_depth {
            return Err(error(
                marker,
                format!(
                    "nested deeper than {} levels of mappings and lists (the reader's limit)",
                    self.bounds.max_depth
                ),
            ));
        }
        self.decoded_nodes += 1;
        self.stack.push(frame);
        Ok(())
    }

    fn on_event(&mut self, event: Event, marker: Marker) -> Result<(), ReadError> {
        match event {
            Event::Scalar(mut text, style, anchor, tag) => {
                if matches!(style, TScalarStyle::Literal | TScalarStyle::Folded) {
                    let number = self.block_scalars;
                    self.block_scalars += 1;
                    if self.trim_block_scalar == Some(number) {
                        text.pop();
                    }
                    self.final_block_scalar = text.ends_with('\n').then_some(number);
                } else {
                    self.final_block_scalar = None;
                }
                let plain = style == TScalarStyle::Plain;
                let value = resolve(&text, plain, tag.as_ref());
                let size = Size {
                    nodes: 1,
                    bytes: NODE_BYTES + text.len(),
                };
                self.decoded_nodes += 1;
                self.anchored(anchor, &value, size);
                self.push(value, size, Some((text, plain)), marker)?;
            }
            Event::Alias(anchor) => {
                self.final_block_scalar = None;
                let Some((value, size)) = self.anchors.get(&anchor) else {
                    return Err(error(marker, "an alias to an unknown anchor"));
                };
                let size = *size;
                // Counted before the copy is made, so a bomb is refused before it costs.
                self.decoded_nodes += 1 + size.nodes;
                self.alias_nodes += size.nodes;
                self.alias_bytes += size.bytes;
                if excessive_aliasing(self.alias_nodes, self.decoded_nodes) {
                    return Err(error(
                        marker,
                        format!(
                            "excessive aliasing: {} of the {} nodes read so far are copies made \
                             by aliases (the limit is kubectl's: at most 99% up to 400,000 \
                             nodes, down to 10% at 4,000,000)",
                            self.alias_nodes, self.decoded_nodes
                        ),
                    ));
                }
                if self.alias_bytes > self.bounds.max_alias_bytes {
                    return Err(error(
                        marker,
                        format!(
                            "excessive aliasing: aliases copy more than {} bytes (the limit is \
                             the document size limit)",
                            self.bounds.max_alias_bytes
                        ),
                    ));
                }
                let value = value.clone();
                self.push(value, size, None, marker)?;
            }
            Event::SequenceStart(anchor, _) => self.open(
                Frame::Sequence {
                    items: Vec::new(),
                    anchor,
                    size: Size::COLLECTION,
                },
                marker,
            )?,
            Event::MappingStart(anchor, _) => self.open(
                Frame::Mapping {
                    entries: Map::new(),
                    key_lines: Vec::new(),
                    key: None,
                    anchor,
                    size: Size::COLLECTION,
                },
                marker,
            )?,
            Event::SequenceEnd | Event::MappingEnd => {
                let (value, anchor, size) = match self.stack.pop() {
                    Some(Frame::Sequence {
                        items,
                        anchor,
                        size,
                    }) => (Value::Array(items), anchor, size),
                    Some(Frame::Mapping {
                        entries,
                        anchor,
                        size,
                        ..
                    }) => (Value::Object(entries), anchor, size),
                    None => return Ok(()),
                };
                self.anchored(anchor, &value, size);
                self.push(value, size, None, marker)?;
            }
            Event::DocumentStart => {
                self.anchors.clear();
                self.decoded_nodes = 0;
                self.alias_nodes = 0;
                self.alias_bytes = 0;
            }
            _ => {}
        }
        Ok(())
    }
}

/// Merges `source` into a mapping at a `<<` key: its keys overwrite those written before and
/// are overridden by those written after.
fn merge(
    entries: &mut Map<String, Value>,
    key_lines: &mut Vec<Option<usize>>,
    source: Map<String, Value>,
) {
    for (name, value) in source {
        if !entries.contains_key(&name) {
            key_lines.push(None);
        }
        entries.insert(name, value);
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
    match text.as_bytes().first() {
        Some(b'0'..=b'9' | b'-' | b'+' | b'.') => {}
        _ => return Value::String(text.to_owned()),
    }
    // go-yaml v2: drop underscores, then Go's ParseInt(s, 0, 64), ParseUint, then its float
    // pattern. A float with no fraction is a whole number once sigs.k8s.io/yaml turns it into
    // JSON (Go writes float64 10 as `10`), so it is stored as one.
    let cleaned: String = text.chars().filter(|c| *c != '_').collect();
    if let Some(number) = go_int(&cleaned) {
        return Value::Number(number);
    }
    if is_go_yaml_float(&cleaned)
        && let Ok(float) = cleaned.parse::<f64>()
        && float.is_finite()
    {
        if float.fract() == 0.0 && float.abs() < 9.0e15 {
            // Exactly representable: the integer Go would print.
            return Value::Number(Number::from(float as i64));
        }
        if let Some(number) = Number::from_f64(float) {
            return Value::Number(number);
        }
    }
    Value::String(text.to_owned())
}

/// Go's `strconv.ParseInt(s, 0, 64)` and `ParseUint(s, 0, 64)`: a sign, then `0x`/`0X`,
/// `0b`/`0B`, `0o`/`0O` or a leading `0` for octal, else decimal.
fn go_int(text: &str) -> Option<Number> {
    let (negative, unsigned) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = unsigned.get(..2).map(str::to_ascii_lowercase);
    let (radix, digits) = match lower.as_deref() {
        Some("0x") => (16, &unsigned[2..]),
        Some("0b") => (2, &unsigned[2..]),
        Some("0o") => (8, &unsigned[2..]),
        _ if unsigned.len() > 1 && unsigned.starts_with('0') => (8, &unsigned[1..]),
        _ => (10, unsigned),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u128::from_str_radix(digits, radix).ok()?;
    if negative {
        let value = i64::try_from(magnitude)
            .ok()
            .map(|m| -m)
            .or_else(|| (magnitude == 1u128 << 63).then_some(i64::MIN))?;
        Some(Number::from(value))
    } else if let Ok(value) = i64::try_from(magnitude) {
        Some(Number::from(value))
    } else {
        u64::try_from(magnitude).ok().map(Number::from)
    }
}

/// go-yaml v2's float pattern: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_go_yaml_float(text: &str) -> bool {
    let bytes = text.strip_prefix(['-', '+']).unwrap_or(text).as_bytes();
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .position(|b| !b.is_ascii_digit())
            .map_or(bytes.len(), |offset| from + offset)
    };
    let mut at = digits(0);
    let integer_digits = at;
    if bytes.get(at) == Some(&b'.') {
        let after = digits(at + 1);
        if integer_digits == 0 && after == at + 1 {
            return false; // `.` alone or `.e5`
        }
        at = after;
    } else if integer_digits == 0 {
        return false;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        let mut exponent = at + 1;
        if matches!(bytes.get(exponent), Some(b'-' | b'+')) {
            exponent += 1;
        }
        let end = digits(exponent);
        if end == exponent {
            return false;
        }
        at = end;
    }
    at == bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(text: &str) -> Value {
        let documents = read_yaml(text, Bounds::default()).unwrap();
        assert_eq!(documents.len(), 1);
        documents.into_iter().next().unwrap()
    }

    #[test]
    fn plain_scalars_resolve_as_kubectl_resolves_them() {
        let value = one(
            "mode: 0755\nhex: 0x1F\nbin: 0b101\nbig: 1_000\nneg: -12\nf: 1.5\ne: 1e3\n\
             yy: yes\nnn: off\nt: true\nz: ~\nempty:\nname: main\nver: 1.2.3\noct8: 0o17\n\
             date: 2026-01-01\nq: \"0755\"\ns: 'yes'\nlit: |\n  on\n\
             whole: 1.0\nHEX: 0X1F\neight: 08\nu: 18446744073709551615\nneg_u: -_1\nhalf: .5\n",
        );
        assert_eq!(
            value,
            json!({"mode": 493, "hex": 31, "bin": 5, "big": 1000, "neg": -12, "f": 1.5, "e": 1000,
                   "yy": true, "nn": false, "t": true, "z": null, "empty": null, "name": "main",
                   "ver": "1.2.3", "oct8": 15, "date": "2026-01-01", "q": "0755", "s": "yes",
                   "lit": "on\n", "whole": 1, "HEX": 31, "eight": 8, "u": 18446744073709551615u64,
                   "neg_u": -1, "half": 0.5})
        );
    }

    #[test]
    fn anchors_aliases_and_merge_keys() {
        let value = one(
            "base: &gpu\n  limits: {nvidia.com/gpu: 1}\n  requests: {cpu: 1}\n\
             a: *gpu\nb:\n  <<: *gpu\n  requests: {cpu: 2}\nc:\n  <<: [{x: 1}, {x: 2, w: 2}]\n",
        );
        assert_eq!(value["a"], value["base"]);
        assert_eq!(value["b"]["limits"], json!({"nvidia.com/gpu": 1}));
        assert_eq!(
            value["b"]["requests"],
            json!({"cpu": 2}),
            "keys after << win"
        );
        assert_eq!(value["c"], json!({"x": 1, "w": 2}), "earlier sources win");
        let before = one("b:\n  x: 1\n  <<: {x: 2}\n");
        assert_eq!(
            before["b"]["x"], 2,
            "<< overwrites keys written before it, as go-yaml v2"
        );
    }

    #[test]
    fn keys_become_strings_as_sigs_k8s_io_yaml_makes_them() {
        let value = one("data:\n  yes: a\n  0755: b\n  1.10: c\n  'y': d\n");
        assert_eq!(
            value["data"],
            json!({"true": "a", "493": "b", "1.1": "c", "y": "d"})
        );
        let error = read_yaml("a:\n  ~: 1\n", Bounds::default()).unwrap_err();
        assert!(error.message.contains("null mapping key"));
    }

    #[test]
    fn documents_and_errors() {
        let error = read_yaml("---\na: 1\n---\n---\nb: [1\n", Bounds::default()).unwrap_err();
        assert!(error.line >= 5, "{error:?}");
        let documents = read_yaml("a: 1\n...\nb: 2\n...\n", Bounds::default()).unwrap();
        assert_eq!(documents, vec![json!({"a": 1}), json!({"b": 2})]);
    }

    #[test]
    fn a_key_defined_twice_is_refused_with_both_lines() {
        let job = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: train\nspec:\n  \
                   template:\n    spec:\n      containers:\n      - name: main\n        \
                   image: train:1\n      restartPolicy: Never\n      containers: []\n";
        let error = read_yaml(job, Bounds::default()).unwrap_err();
        assert_eq!(
            error,
            ReadError {
                line: 12,
                message: "spec.template.spec: mapping key \"containers\" already defined"
                    .to_owned(),
                defined_at: Some(8),
            }
        );
        let cases = [
            (
                "kind: Job\nkind: JobSet\n",
                2,
                "mapping key \"kind\" already defined",
                1,
            ),
            (
                "a:\n- {x: 1, x: 2}\n",
                2,
                "a[0]: mapping key \"x\" already defined",
                2,
            ),
            // Keys are compared as kubectl compares them, resolved: `yes` is "true".
            (
                "data:\n  true: a\n  yes: b\n",
                3,
                "data: mapping key \"true\" already defined",
                2,
            ),
            (
                "base: &b {cpu: 1}\nx:\n  <<: *b\n  gpu: 1\n  gpu: 2\n",
                5,
                "x: mapping key \"gpu\" already defined",
                4,
            ),
        ];
        for (text, line, message, first) in cases {
            let error = read_yaml(text, Bounds::default()).unwrap_err();
            assert_eq!(
                (error.line, error.message.as_str(), error.defined_at),
                (line, message, Some(first)),
                "{text:?}"
            );
        }
        // A key after `<<` overrides the merged one: that is what merge keys are for.
        let value = one("base: &b {cpu: 1, gpu: 1}\nx:\n  <<: *b\n  gpu: 2\n");
        assert_eq!(value["x"], json!({"cpu": 1, "gpu": 2}));
        let value = one("x:\n  <<: [{gpu: 1}, {gpu: 2, cpu: 1}]\n  cpu: 2\n");
        assert_eq!(value["x"], json!({"gpu": 1, "cpu": 2}));
    }

    #[test]
    fn a_billion_laughs_is_refused_by_go_yamls_alias_rule() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..10 {
            let previous = format!("*a{}", level - 1);
            text.push_str(&format!(
                "a{level}: &a{level} [{}]\n",
                [previous.as_str(); 10].join(", ")
            ));
        }
        let error = read_yaml(&text, Bounds::default()).unwrap_err();
        assert!(error.message.starts_with("excessive aliasing"), "{error:?}");
        // A few aliases, as real manifests use them, are fine.
        let value = one("base: &b {cpu: 1}\na: *b\nb: *b\n");
        assert_eq!(value["b"], json!({"cpu": 1}));
    }

    #[test]
    fn aliases_of_a_long_text_are_bounded_by_bytes() {
        let text = format!(
            "big: &big \"{}\"\ncopies: [{}]\n",
            "x".repeat(1 << 20),
            ["*big"; 40].join(", ")
        );
        let error = read_yaml(&text, Bounds::default()).unwrap_err();
        assert!(error.message.contains("bytes"), "{error:?}");
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused_not_overflowing_the_stack() {
        let deep = "- ".repeat(100_000) + "x\n";
        let error = read_yaml(&deep, Bounds::default()).unwrap_err();
        assert!(
            error.message.contains("nested deeper than 1000"),
            "{error:?}"
        );
        let flow = "[".repeat(100_000);
        assert!(read_yaml(&flow, Bounds::default()).is_err());
        let fine = "- ".repeat(999) + "x\n";
        assert!(read_yaml(&fine, Bounds::default()).is_ok());
    }

    #[test]
    fn a_tab_is_named_as_a_tab() {
        let error = read_yaml("a:\n\tb: 1\n", Bounds::default()).unwrap_err();
        assert_eq!(error.line, 2, "{error:?}");
        assert!(
            error.message.starts_with("a tab character at column 1:"),
            "{error:?}"
        );
    }
}
